"""Pass `psum_forward` (docs/nki.md, "Passes"): a partition broadcast (`nl.broadcast_to` of a
[1, F] tile to [P, F]) is one TensorE instruction whose PSUM result its readers read, with no copy
to SBUF.

The front end lowers the broadcast as a matmul by a row of ones into PSUM and a `tensor_copy` to
SBUF (the `nl.broadcast_to` page: "this new tile will be in SBUF"). The fused Mamba tutorial counts
it as "a separate instruction on TensorE" ("Option 2 needs an extra TensorE instruction performing
partition dimension broadcast"), and its published VectorE profile matches the broadcast's readers
reading PSUM (docs/cost-model.md, the Mamba section). So the copy is dropped when every read of
its SBUF result can read the PSUM result instead (the core's rule, `machine/forward.rs`:
VectorE / ScalarE readers with no other PSUM operand, the PSUM bytes unchanged until the last
read); otherwise it stays. Only the broadcast's own copies are candidates
(`KernelProgram.bcast_copies`), never a copy the kernel wrote."""

from __future__ import annotations

from . import passes
from .value_reuse import dropped, renumber, segment_calls


def run(ctx, last: bool = True) -> int:
    """Drop the broadcast copies of `ctx.program` whose readers can read PSUM; the number dropped."""
    program = ctx.program
    copies = program.bcast_copies
    program.bcast_copies = []
    if not copies or not passes.enabled(ctx.launch.kernel, "psum_forward") or getattr(ctx, "segments", None):
        return 0
    gone, moved = program._native.forward_copies(copies, last)
    return dropped(ctx, "psum_forward", gone, _record, moved)


def _record(ir, gone, moved: int) -> None:
    """The decisions in the IR: a note on each call whose copy was dropped, the pass line, and
    the calls' program indices moved to the program without the copies."""
    calls, call_of = segment_calls(ir)
    lines = set()
    for i in gone:
        c = call_of(i)
        if c is not None:
            lines.add(c.line)
            n = c.notes.get("psum_forward", 0)
            c.notes["psum_forward"] = n + 1 if isinstance(n, int) else n
    for c in calls:
        n = c.notes.get("psum_forward")
        if isinstance(n, int):
            c.notes["psum_forward"] = f"{n} broadcast copies dropped (their readers read PSUM)"
    renumber(calls, gone)
    ir.passes["psum_forward"] = (
        f"{len(gone)} broadcast copies to SBUF dropped, from {len(lines)} kernel lines; {moved} reads moved to PSUM"
    )
