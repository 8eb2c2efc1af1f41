"""Pass `value_reuse` (docs/nki.md, "Passes"): an instruction that repeats an earlier one exactly
(the same encoding: opcode, engine, every operand and immediate) is not emitted again when nothing
either touches was written in between, since the earlier result is still in place.

Tracing unrolls the kernel's loops, as the Neuron compiler does ("the loop instances will be
unrolled by Neuron Compiler", the fused Mamba tutorial); a loop-invariant instruction on
loop-invariant tiles then appears once per iteration with the same operands, and the compiler's
redundancy elimination leaves one. The rule lives in the core (`machine/repeats.rs`:
`Program.exact_repeats`), which knows every instruction's read and write bytes; this module runs
it over a finished program (a kernel program, or a device loop's segment before it runs), after
the engine choice and before automatic synchronisation (added when the program runs), removes the
repeats and records what it did in the kernel IR when one is recorded. With "on" (the default
where the pass runs), a repeat whose one SBUF result goes to another tile (a fresh `nl.ndarray`
per iteration) is dropped too when every later read of its result can be moved to the earlier
result (`machine/repeats.rs`, `rename_plan`); "exact" keeps those.

Never while the device rounds stochastically: each rounding draws its own bits (on the emulator
from the instruction's index, which the removal would shift for every later instruction)."""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right

from . import passes


def _stochastic() -> bool:
    v = os.environ.get("NEURON_RT_STOCHASTIC_ROUNDING_EN", "").strip().lower()
    return v in ("1", "true", "yes")


def run(ctx, last: bool = True) -> int:
    """Drop the exact repeats of `ctx.program` when the pass is on for the kernel; the number
    dropped. `last`: nothing runs on the core after this program (False for a device loop's
    segment: the next segment may read what it leaves in SBUF). The kernel IR's calls of the
    program's segment follow the new instruction indices."""
    program = ctx.program
    mode = passes.value_reuse(ctx.launch.kernel)
    if mode == "off" or _stochastic():
        return 0
    native = program._native
    pairs, moves = native.exact_repeats(rename=mode == "on", last=last)
    if not pairs:
        return 0
    gone = [i for i, _ in pairs]
    native.move_operands(moves)
    native.remove(gone)
    program._synced = None
    program.value_reuse = getattr(program, "value_reuse", 0) + len(gone)
    rec = ctx.ir
    if rec is not None:
        _record(rec.ir, getattr(rec, "segment", 0), pairs, gone, len(moves))
    return len(gone)


def _record(ir, segment: int, pairs, gone, moved: int = 0) -> None:
    """Write the decisions into the IR: a note on each call whose instructions were dropped (the
    call whose instruction it repeats), its `passes` line, and every index of the segment's calls
    (`Call.instr`, the engine choice's notes) moved to the program without them."""
    calls = [c for c in ir.calls if c.segment == segment and c.instr >= 0]
    starts = [c.instr for c in calls]

    def call_of(i: int):
        k = bisect_right(starts, i) - 1
        return calls[k] if k >= 0 else None

    lines = set()
    for i, j in pairs:
        c, e = call_of(i), call_of(j)
        if c is None:
            continue
        lines.add(c.line)
        n, _ = c.notes.get("value_reuse", (0, None))
        c.notes["value_reuse"] = (n + 1, None if e is None else e.ordinal)
    for c in calls:
        v = c.notes.get("value_reuse")
        if isinstance(v, tuple):
            n, e = v
            c.notes["value_reuse"] = f"{n} dropped, repeating call {e}" if e is not None else f"{n} dropped"
    dropped = set(gone)

    def new(i: int) -> int:
        return i - bisect_left(gone, i)

    for c in calls:
        c.instr = new(c.instr)
        ec = c.notes.get("engine_choice")
        if ec:
            c.notes["engine_choice"] = tuple((new(i), e) for i, e in ec if i not in dropped)
    seg = f" (segment {segment})" if segment else ""
    line = f"{len(gone)} repeated instructions dropped{seg}, from {len(lines)} kernel lines"
    if moved:
        line += f"; {moved} reads moved to the earlier result"
    prev = ir.passes.get("value_reuse")
    ir.passes["value_reuse"] = line if prev is None else f"{prev}; {line}"
