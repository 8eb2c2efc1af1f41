"""Runaway loops that issue DMAs stay within host memory and stop in seconds (issue 31, item 2).
Each case runs in a fresh interpreter under an address-space cap (`RLIMIT_AS`): an abort
(SIGABRT on a failed allocation) fails the case.

Before: `dma_copy (128 x 1 KiB); branch` grew ~85 MiB/s of DMA-queue backlog (the sync engine
ran ahead of its transfers) and aborted in 9-26 s under a 2-3 GiB cap even with
`max_memory=256 MiB`; with the defaults its step limit was 23-32 minutes away. A loop writing
64 MiB of fresh HBM per iteration aborted in `Ap::row_offsets` under a 3 GiB cap."""

import time

import pytest
from test_hardening_core import run_case

pytest.importorskip("resource")

GIB = 1 << 30

# The sync engine copies a [128, 256] fp32 HBM tensor (128 rows of 1 KiB) to SBUF, forever.
DMA_LOOP = """
src = dev.hbm.put(np.ones((128, 256), np.float32))
p = t3.Program(sync="manual")
t = p.sbuf((128, 256), np.float32)
p.dma_copy(dst=t, src=src, engine="sync")
p.branch(target=0, engine="sync")
"""


def _timed(setup: str, body: str, cap: int) -> tuple[dict, float]:
    t0 = time.monotonic()
    out = run_case(setup, body, cap_bytes=cap, timeout=240)
    return out, time.monotonic() - t0


@pytest.mark.parametrize("cap", [2 * GIB, 3 * GIB], ids=["2GiB", "3GiB"])
def test_runaway_dma_loop_without_trace_or_races_stops_in_seconds_within_memory(cap):
    out, secs = _timed(DMA_LOOP, "dev.run(p, trace=False, check_races=False, max_memory=256 << 20)", cap)
    assert out["error"] == "RunawayError" and out["rule"] == "runaway_loop", out
    assert "units of work" in out["message"]
    assert out["growth_mib"] < 64, out  # the queue backlog is bounded (was ~85 MiB/s)
    assert secs < 60, secs  # ~5 s on an idle 2-core host (was 23-32 minutes)


def test_runaway_dma_loop_with_the_defaults_stops_in_seconds_within_memory():
    out, secs = _timed(DMA_LOOP, "dev.run(p)", 3 * GIB)
    assert out["error"] == "RunawayError" and out["rule"] == "runaway_loop", out
    assert out["growth_mib"] < 512, out  # trace and race log of ~800k items
    assert secs < 60, secs


# Each iteration copies a 64 MiB HBM tensor (strided rows: the gather/scatter path with its
# row offsets: even then odd elements) to a fresh 64 MiB range of a 64 GiB HBM tensor: 64 MiB of new host pages per
# iteration, 3 GiB after 48 iterations.
FRESH_HBM_LOOP = """
MIB = 1 << 20
src = dev.hbm.put(np.ones((64, MIB // 4), np.float32))
big = dev.hbm.alloc((1024, 64, MIB // 4), np.float32)
p = t3.Program(sync="manual")
r = p.register_alloc(0, engine="sync")
top = len(p)  # after the register's initialisation
p.dma_copy(
    dst=big.ap([[MIB // 4, 64], [1, 2], [2, MIB // 8]], scalar_offset=r),
    src=src.ap([[MIB // 4, 64], [1, 2], [2, MIB // 8]]),
    engine="sync",
)
p.register_op(dst=r, src=r, op="add", imm=1, engine="sync")
p.branch(target=top, engine="sync")
"""


def test_loop_writing_fresh_hbm_under_an_address_space_cap_is_an_error_not_an_abort():
    out, secs = _timed(FRESH_HBM_LOOP, "dev.run(p, trace=False)", 3 * GIB)
    # The run's memory limit is lowered to what the cap leaves (3/4 of the remaining address
    # space): it stops with run_memory_limit, naming the cap, before any allocation fails.
    assert out["error"] == "ResourceError" and out["rule"] == "run_memory_limit", out
    assert "RLIMIT_AS" in out["message"], out
    assert out["growth_mib"] < 3 * 1024, out
    assert secs < 120, secs  # ~22 s on the loaded 2-core host
