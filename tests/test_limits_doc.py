"""Issue 18: docs/limits.md lists every limit with its default and how to change it; the
defaults quoted there are the code's."""

from pathlib import Path

import trn3emu as t3
from trn3emu import ultra
from trn3emu.nki import _kernel

DOC = (Path(__file__).resolve().parents[1] / "docs" / "limits.md").read_text()
TABLE = DOC.split("\n\n## ")[0]


def _row(limit: str) -> str:
    rows = [line for line in TABLE.splitlines() if line.startswith(f"| {limit}")]
    assert len(rows) == 1, limit
    return rows[0]


def test_every_limit_has_a_row_with_its_default_and_how_to_change_it():
    assert "2^26" in _row("instructions and transfers per run") and t3.Device().max_executed == 1 << 26
    assert "2048 bytes" in _row("instructions and transfers per run")
    assert "256" in _row("transfers waiting on one engine's DMA queue")
    assert "max_seconds" in _row("host seconds per run") and "us.run" in _row("host seconds per run")
    assert "RLIMIT_AS" in _row("host memory per run")
    assert "32 GiB" in _row("host memory per run") and "max_memory" in _row("host memory per run")
    assert "2^21" in _row("trace records per run") and "trace_limit" in _row("trace records per run")
    grid = _row("programs per NKI launch")
    assert _kernel.MAX_PROGRAMS == 1 << 14 and f"{_kernel.MAX_PROGRAMS:,}" in grid
    assert "max_programs" in grid and "TRN3EMU_NKI_MAX_PROGRAMS" in grid and "nki_grid_too_large" in grid
    cache = _row("traced launches kept per NKI kernel")
    assert f"{_kernel.CACHE_SIZE} signatures" in cache and "TRN3EMU_NKI_CACHE" in cache
    assert f"1..{ultra.MAX_CHIPS}" in _row("chips of an `UltraServer`")
    assert "host_allocation_failed" in _row("host memory of a new `Device`")
    for row in TABLE.splitlines()[2:]:
        if row.startswith("|"):
            assert row.count("|") == 5, row  # limit | default | change it | when exceeded
