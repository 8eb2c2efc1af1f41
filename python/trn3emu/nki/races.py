"""What a race between the programs of one NKI launch means (issue 28).

The race checker (Rust) reports two unordered accesses by instruction. When both are HBM writes of
different bytes from two programs of a multi-program launch (an SPMD grid, LNC=2), the race is real
on hardware: the programs run at the same time on separate NeuronCores and nothing orders their
DMA writes, so the bytes both write hold whichever write lands last. `explain` adds that verdict
to the checker's message; the two kernel lines (with their source) and the fix are added where every
run-time error of a launch is presented (`_traceback.present`).
"""

from __future__ import annotations

import re

from ..errors import RaceError

#: "core A #i `... name=FILE:LINE` and core B #j `... name=FILE:LINE` both touch hbm bytes X..Y (both writes)"
_PAIR = re.compile(
    r"core (\d+) #\d+ `[^`]*?name=([^` ]+):(\d+)` and core (\d+) #\d+ `[^`]*?name=([^` ]+):(\d+)` "
    r"both touch hbm bytes (\d+)\.\.(\d+) \(both writes\)"
)


def explain(err: RaceError, program_of: dict[tuple[int, int], str]) -> RaceError | None:
    """`err` with the verdict when it is a write/write race on HBM between two programs of the
    launch (`program_of`: (chip, core) -> "program 1" / "rank 3
    program 1"); None otherwise (the checker's message stands)."""
    m = _PAIR.search(str(err))
    if m is None or "the bytes written differ" not in str(err):  # (identical bytes: benign, not this)
        return None
    chip = re.search(r"chip (\d+): data race", str(err))
    chip = int(chip.group(1)) if chip else 0
    core_a, core_b = m.group(1), m.group(4)
    pa, pb = program_of.get((chip, int(core_a))), program_of.get((chip, int(core_b)))
    if pa is None or pb is None or pa == pb:
        return None
    # The kernel lines (with their source) and the fix are added where every run-time error of a
    # launch is presented (_traceback.present); this adds only the verdict.
    msg = (
        f"{err}\n"
        f"This race is real on hardware: {pa} and {pb} run at once on separate NeuronCores and nothing "
        f"orders their DMA writes; these bytes end with whichever lands last."
    )
    return RaceError(msg, err.instruction_index, err.instruction, err.operand, err.rule)
