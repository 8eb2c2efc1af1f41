"""What a race between the programs of one NKI launch means (issue 28).

The race checker (Rust) reports two unordered accesses by instruction. When both are HBM writes of
different bytes from two programs of a multi-program launch (an SPMD grid, LNC=2), the race is real
on hardware: the programs run at the same time on separate NeuronCores and nothing orders their
DMA writes, so the bytes both write hold whichever write lands last. `explain` adds that verdict,
the two kernel lines (with their source) and the fix to the checker's message.
"""

from __future__ import annotations

import linecache
import os
import re

from ..errors import RaceError

#: "core A #i `... name=FILE:LINE` and core B #j `... name=FILE:LINE` both touch hbm bytes X..Y (both writes)"
_PAIR = re.compile(
    r"core (\d+) #\d+ `[^`]*?name=([^` ]+):(\d+)` and core (\d+) #\d+ `[^`]*?name=([^` ]+):(\d+)` "
    r"both touch hbm bytes (\d+)\.\.(\d+) \(both writes\)"
)


def _source(filename: str, line: int, files: list[str]) -> str:
    """The text of `filename:line` (a base name, as instruction names carry), looked up among the
    kernel's own files."""
    for path in files:
        if os.path.basename(path) == filename:
            text = linecache.getline(path, line).strip()
            if text:
                return f"  `{text}`"
    return ""


def explain(err: RaceError, program_of: dict[tuple[int, int], str], files: list[str]) -> RaceError | None:
    """`err` with the verdict, both kernel lines and the fix, when it is a write/write race on HBM
    between two programs of the launch (`program_of`: (chip, core) -> "program 1" / "rank 3
    program 1"); None otherwise (the checker's message stands)."""
    m = _PAIR.search(str(err))
    if m is None or "the bytes written differ" not in str(err):  # (identical bytes: benign, not this)
        return None
    chip = re.search(r"chip (\d+): data race", str(err))
    chip = int(chip.group(1)) if chip else 0
    core_a, file_a, line_a, core_b, file_b, line_b, lo, hi = m.groups()
    pa, pb = program_of.get((chip, int(core_a))), program_of.get((chip, int(core_b)))
    if pa is None or pb is None or pa == pb:
        return None
    msg = (
        f"{err}\n"
        f"This race is real on hardware: {pa} and {pb} of this launch run at the same time on separate "
        f"NeuronCores and nothing orders their DMA writes, so HBM bytes {lo}..{hi} end up holding whichever "
        f"write lands last (the bytes written differ).\n"
        f"  {pa} writes them at {file_a}:{line_a}{_source(file_a, int(line_a), files)}\n"
        f"  {pb} writes them at {file_b}:{line_b}{_source(file_b, int(line_b), files)}\n"
        f"Fix: give each program its own part of the output (slice by nl.program_id so that no byte is written "
        f"by two programs), or write the shared part"
        f" from one program only; if both must write it, order the writes (a collective between "
        f"them)."
    )
    new = RaceError(msg, err.instruction_index, err.instruction, err.operand, err.rule)
    return new


def kernel_files(kernel) -> list[str]:
    """The source file of a kernel's function (where its instruction names point)."""
    code = getattr(getattr(kernel, "fn", None), "__code__", None)
    return [code.co_filename] if code is not None else []
