"""Pass `copy_forward` (docs/nki.md, "Passes"): a same-dtype `nisa.tensor_copy` whose readers can
read its source directly is not emitted, its readers reading the source, as
`nki.compiler.CompileConfig(tensor_copy_elim=True)` asks (and `dead_code_elim`, whose second half
it is: "nisa.tensor_copy instructions whose readers can read the source directly").

The rule lives in the core (`machine/forward.rs`, `Copies::Any`; `psum_forward` is its partition
broadcast case): a copy of one pattern to another place of the same dtype is the identity on the
bits, so every read of its destination, up to the write that replaces the destination whole (or
the program's end), reads the source instead when each such read lies within the destination,
is valid moved (a read moved to PSUM: a VectorE / ScalarE instruction with no other PSUM operand)
and nothing writes the source before it; otherwise the copy stays. This module runs it over a
finished kernel program (after `psum_forward`, before `value_reuse` and `dead_code`), and records
what it did in the kernel IR when one is recorded. Not over a device loop's segments (the next
one may read a destination a segment leaves), nor while the device rounds stochastically (the
removal shifts the instruction indices the rounding draws from)."""

from __future__ import annotations

from . import passes
from .value_reuse import _stochastic, dropped, renumber, segment_calls


def run(ctx) -> int:
    """Drop the copies of `ctx.program` whose readers can read their sources; the number
    dropped. The kernel IR's calls follow the new instruction indices."""
    program = ctx.program
    if not passes.enabled(ctx.launch.kernel, "copy_forward") or getattr(ctx, "segments", None) or _stochastic():
        return 0
    gone, moved = program._native.forward_copies(None, True, any=True)
    return dropped(ctx, "copy_forward", gone, _record, moved)


def _record(ir, gone, moved: int) -> None:
    """The decisions in the IR: a note on each call whose copy was dropped, the pass line, and
    the calls' program indices moved to the program without the copies."""
    calls, call_of = segment_calls(ir)
    lines = set()
    for i in gone:
        c = call_of(i)
        if c is not None:
            lines.add(c.line)
            c.notes["copy_forward"] = "dropped (its readers read the source)"
    renumber(calls, gone)
    ir.passes["copy_forward"] = (
        f"{len(gone)} copies dropped, from {len(lines)} kernel lines; {moved} reads moved to the source"
    )
