"""Pass `dead_code` (docs/nki.md, "Passes"): an instruction whose on-chip result no later
instruction reads is not emitted, as `nki.compiler.CompileConfig(dead_code_elim=True)` asks
("remove instructions whose output is never read"; its parts `remove_unused_instructions` and
`remove_overwritten_writes`).

The rule lives in the core (`machine/dead.rs`: `Program.dead_instructions`), which knows every
instruction's read and write bytes: a result is dead when later writes replace it whole before
anything reads it ("overwritten"), or when the program ends with nothing having read or
overwritten it ("unused"; "both": partly overwritten, the rest unread). Only instructions whose
whole effect is their SBUF / PSUM result go: never a DMA or anything writing HBM, nothing using
random numbers, accumulator registers, registers, semaphores or run-time offsets, never the start
of a PSUM accumulation group a later matmul accumulates onto; a program with a branch or a
cross-core instruction is left alone. This module runs it over a finished kernel program (after
`value_reuse`, before automatic synchronisation), removes the dead instructions and records what
it did in the kernel IR when one is recorded. Not over a device loop's segments (the next one may
read what a segment leaves), nor while the device rounds stochastically (each rounding draws its
bits from the instruction's index, which the removal shifts)."""

from __future__ import annotations

from . import passes
from .value_reuse import _stochastic, dropped, renumber, segment_calls

#: the reasons each mode removes (`Program.dead_instructions`' second item)
REASONS = {
    "on": ("unused", "overwritten", "both"),
    "unused": ("unused",),
    "overwritten": ("overwritten",),
}


def run(ctx) -> int:
    """Remove the dead instructions of `ctx.program` when the pass is on for the kernel; the
    number removed. The kernel IR's calls follow the new instruction indices."""
    program = ctx.program
    mode = passes.settings(ctx.launch.kernel)["dead_code"]
    if mode == "off" or getattr(ctx, "segments", None) or _stochastic():
        return 0
    keep = REASONS[mode]
    found = [(i, why) for i, why in program._native.dead_instructions(last=True) if why in keep]
    if not found:
        return 0
    gone = [i for i, _ in found]
    program._native.remove(gone)
    return dropped(ctx, "dead_code", gone, _record, found)


def _record(ir, gone, found) -> None:
    """The decisions in the IR: a note on each call whose instructions were removed (how many,
    why), the pass line, and the calls' program indices moved to the program without them."""
    calls, call_of = segment_calls(ir)
    per: dict = {}  # call -> the reasons of its removed instructions
    for i, why in found:
        c = call_of(i)
        if c is not None:
            per.setdefault(id(c), (c, []))[1].append(why)
    for c, whys in per.values():
        counts = ", ".join(f"{whys.count(w)} {w}" for w in REASONS["on"] if w in whys)
        c.notes["dead_code"] = f"{len(whys)} removed ({counts})"
    renumber(calls, gone)
    lines = {c.line for c, _ in per.values()}
    ir.passes["dead_code"] = f"{len(gone)} dead instructions removed, from {len(lines)} kernel lines"
