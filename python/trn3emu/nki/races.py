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


def explain(err: RaceError, pid_of_core: dict[int, int], files: list[str]) -> RaceError | None:
    """`err` with the verdict, both kernel lines and the fix, when it is a write/write race on HBM
    between two programs of the launch; None otherwise (the checker's message stands)."""
    m = _PAIR.search(str(err))
    if m is None:
        return None
    core_a, file_a, line_a, core_b, file_b, line_b, lo, hi = m.groups()
    pa, pb = pid_of_core.get(int(core_a)), pid_of_core.get(int(core_b))
    if pa is None or pb is None or pa == pb:
        return None
    msg = (
        f"{err}\n"
        f"This race is real on hardware: programs {pa} and {pb} of this launch run at the same time on separate "
        f"NeuronCores and nothing orders their DMA writes, so HBM bytes {lo}..{hi} end up holding whichever "
        f"write lands last (the bytes written differ).\n"
        f"  program {pa} writes them at {file_a}:{line_a}{_source(file_a, int(line_a), files)}\n"
        f"  program {pb} writes them at {file_b}:{line_b}{_source(file_b, int(line_b), files)}\n"
        f"Fix: give each program its own part of the output (slice by nl.program_id so that no byte is written "
        f"by two programs), or write the shared part"
        f" from one program only; if both must write it, order the writes (a collective between "
        f"them)."
    )
    new = RaceError(msg, err.instruction_index, err.instruction, err.operand, err.rule)
    return new
