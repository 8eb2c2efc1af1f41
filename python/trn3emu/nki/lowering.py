"""Lowering by a walk over the kernel IR (docs/nki.md, "Passes"): the allocation passes'
program without tracing the kernel a second time.

The recording trace (`record.Recorder`, mode "plan") keeps its program, with each
`nc_matmul`'s `accumulate` operand as given (`_native.Program.keep_unresolved`), and per tile
where it placed it and at which program position it was allocated. `decide` then goes over the
IR's calls and allocations in trace order and runs the allocation pass over them
(`liveness.Placer`: the same rules, errors and lowered IR as the second trace), appending
nothing: each allocation gets its range, and the result is a list of steps, the spill / reload
copies where that trace would append them and each recorded instruction with its SBUF / PSUM
operands' moves, from where the recording trace placed their tiles to where the pass placed
them. `emit` replays the steps into a fresh program (`_native.Program.append_moved`: the engine
left to the rule and `accumulate=None` are decided again, as when first appended).

Which tile an operand addresses is told by address: among the tiles its call names, the one
whose recorded range holds the operand's bytes (when two do, the ones the call writes for a
destination, reads for a source; when two still do, the one the call passed as the operand of
that name, for an instruction of the call's own opcode). An operand with a run-time offset moves
with its tile (the offset, a register or an index tile's value, counts from its base) and its
index tile with its own (`Program.onchip_operands` lists it as argument `1000 + k`, also for an
HBM operand). An instruction the walk cannot place that way raises
`Unwalkable` before anything is kept, and the launch falls back to the second trace (reason in
`KernelIR.passes["lowering"]`): an operand no tile of its call holds or that two hold alike,
ranges reserved before the trace (`_PlacementConflict`). Never a program with an operand left
pointing at the wrong tile. Explicitly placed tiles stay where the kernel put them, their ranges
held for the whole program (the IR does not say when Python drops them): the automatic tiles
are placed around them.
"""

from __future__ import annotations

from .. import _native
from .._asm import INSTRUCTIONS
from ..allocator import Allocator
from ..errors import CapacityError, EmuError
from . import value_reuse
from .liveness import Placer


class Unwalkable(Exception):
    """The walk cannot lower this trace (the message says why): the kernel is traced again."""


class _Alloc:
    """Stands for the allocation the second trace would make (`Placer.new_tile` numbers it)."""

    __slots__ = ("parts", "row_bytes", "label", "seq", "pass_")

    def __init__(self, parts: int, row: int, label: str) -> None:
        self.parts, self.row_bytes, self.label = parts, row, label


class _Plan:
    """Stands for the program and the trace while the pass decides (`decide`): counts the
    instructions the lowered program will have, and keeps in order the steps that make it."""

    def __init__(self, ctx) -> None:
        self.core, self.device, self.site = ctx.core, ctx.device, ctx.site
        self.program = self  # (the pass appends its copies to `ctx.program`: here)
        self.n = 0
        #: ("moved", recorded instruction, moves) / ("copy", opcode, operands, site) /
        #: ("fresh", partitions, byte offset, bytes): `emit` replays them
        self.steps: list[tuple] = []

    def __len__(self) -> int:
        return self.n

    def dma_copy(self, **kw) -> None:
        self.steps.append(("copy", "dma_copy", kw, self.site))
        self.n += 1

    def tensor_copy(self, **kw) -> None:
        self.steps.append(("copy", "tensor_copy", kw, self.site))
        self.n += 1


def decide(ctx, spill: str | None) -> tuple[Placer, list]:
    """The allocation pass over the recorded trace of `ctx` (its `ir`, a plan `Recorder`),
    appending nothing: returns the pass (its `ir` is the lowered IR, `stats` the spill counts)
    and the steps that lower it (`emit`). `Unwalkable` when an instruction cannot be moved.

    With the pass `value_reuse` at "on", its repeats into another tile are found on the IR first
    (`value_reuse.plan_ir`: before allocation, so the earlier result is kept alive for them);
    when keeping it alive spills more bytes than not, or does not fit, the walk is made without
    them (the pass never adds a spill)."""
    rec = ctx.ir
    if rec.unwalkable:
        raise Unwalkable(rec.unwalkable)
    if ctx.launch.reserved.get(ctx.pid):
        raise Unwalkable("explicit ranges held from the start of the trace")
    ops, owner = _resolve(rec, ctx.program._native)
    reuse = value_reuse.plan_ir(ctx, rec, ops, owner) if value_reuse.ir_mode(ctx) else None
    if not reuse:
        return _decide(ctx, spill, ops, None)
    why = None
    try:
        got = _decide(ctx, spill, ops, reuse)
        if got[0].spilled_bytes():
            why = "spilled more"
    except CapacityError:
        got, why = None, "did not fit"
    if why is not None:
        plain = _decide(ctx, spill, ops, None)
        if got is None or plain[0].spilled_bytes() < got[0].spilled_bytes():
            plain[0].ir.passes["value_reuse"] = (
                f"{len(reuse.drops)} repeats found before allocation not dropped: keeping their "
                f"earlier results alive {why}"
            )
            return plain
    return got


def _resolve(rec, old) -> tuple[list, list]:
    """Each recorded instruction's on-chip operands as `(argument, tile, writes, first partition,
    partitions, first byte, end byte)` (the tile the walk moves it with: module doc), and the
    call each belongs to (the latest call issued before it; None before the first)."""
    calls, tiles, off, p0 = rec.ir.calls, rec.ir.tiles, rec.plan_off, rec.plan_p0
    n = len(old)
    owner: list = [None] * n
    p, cur = 0, None
    for k, c in enumerate(calls):
        while p < c.instr:
            owner[p] = cur
            p += 1
        cur = k
    while p < n:
        owner[p] = cur
        p += 1
    operands = old.onchip_operands
    ops = []
    for p in range(n):
        k = owner[p]
        c = calls[k] if k is not None else None
        row = []
        for arg, mem, start, parts, lo, hi, writes, _ in operands(p):
            s = _tile_of(c, tiles, off, p0, mem, start, parts, lo, hi, writes, p)
            if type(s) is list:  # several tiles alike: the one the call passed as that operand
                s = _by_name(c, rec.call_names, old, p, arg, s)
            row.append((arg, s, writes, start, parts, lo, hi))
        ops.append(row)
    return ops, owner


def _decide(ctx, spill: str | None, ops: list, reuse) -> tuple[Placer, list]:
    """`decide` with the repeats `reuse` (`value_reuse.IrReuse`) dropped, or none."""
    rec = ctx.ir
    ir = rec.ir
    tiles, calls = ir.tiles, ir.calls
    sbuf, psum = Allocator.sbuf(), Allocator.psum()
    placer = Placer(rec, spill, sbuf)
    alias, drops = {}, ()
    if reuse:
        alias, drops = reuse.alias, reuse.drops
        placer.drop_repeats(reuse)
    plan = _Plan(ctx)
    steps = plan.steps
    old = ctx.program._native
    pos, off = rec.plan_pos, rec.plan_off
    # explicitly placed tiles keep their ranges, held for the whole program (the IR does not
    # know when Python drops them): automatic tiles are placed around them
    fixed = set()
    for s, t in enumerate(tiles):
        if t.placed:
            fixed.add(s)
            alloc = sbuf if t.buffer == "sbuf" else psum
            alloc.reserve(off[s], off[s] + t.row_bytes, t.label)
    live = placer.live
    state = [0]  # next instruction of the recorded program

    def upto(stop: int) -> None:
        p = state[0]
        kept = 0
        while p < stop:
            if p in drops:
                p += 1
                continue
            moves = []
            for arg, s0, *_ in ops[p]:
                if s0 in fixed:
                    continue  # (where the kernel placed it)
                s = alias.get(s0, s0)
                t = live.get(s)
                if t is None:
                    raise Unwalkable(f"instruction {p}: tile t{s} it names is not resident")
                if t.lo != off[s0]:
                    moves.append((arg, t.lo - off[s0]))
            steps.append(("moved", p, moves))
            kept += 1
            p += 1
        plan.n += kept
        state[0] = max(p, state[0])

    s = 0
    for k in range(len(calls) + 1):
        while s < len(tiles) and tiles[s].born <= k:
            t = tiles[s]
            upto(pos[s])
            b = _Alloc(t.shape[0] if t.shape else 1, t.row_bytes, t.label)
            if s in alias:  # (a repeat's result: its reads read the earlier one)
                placer.skip_tile(b)
                s += 1
                continue
            if s in fixed:
                placer.placed(b)
                if t.buffer == "psum":
                    steps.append(("fresh", b.parts, off[s], t.row_bytes, rec.plan_p0.get(s, 0)))
                s += 1
                continue
            plan.site = rec.plan_site[s]  # (the copies it adds: named after the line allocating)
            alloc = sbuf if t.buffer == "sbuf" else psum
            _, at = placer.new_tile(plan, alloc, t.row_bytes, t.label, b)
            if t.buffer == "psum":
                steps.append(("fresh", b.parts, at, t.row_bytes, 0))
            s += 1
        if k == len(calls):
            break
        c = calls[k]
        upto(c.instr)
        plan.site = c.line
        placer.call(plan, (), {})
        placer.ir.calls[-1].notes.update(c.notes)  # (the passes that acted while tracing)
    upto(len(old))
    lowered = placer.ir
    for name, what in ir.passes.items():  # (the passes that acted while tracing)
        lowered.passes.setdefault(name, what)
    placer.check_end()
    if reuse:
        n = len(reuse.calls) - len(reuse.loads)
        lines = len({calls[k].line for k in reuse.calls if k not in reuse.loads})
        if n:
            lowered.passes["value_reuse"] = (
                f"{n} repeats into other tiles dropped before allocation, from {lines} kernel lines "
                "(their results' reads read the earlier results)"
            )
        if reuse.loads:
            lines = len({calls[k].line for k in reuse.loads})
            lowered.passes["load_reuse"] = (
                f"{len(reuse.loads)} loads read from SBUF, found before allocation, from {lines} kernel lines "
                "(their tiles' reads read the earlier load's tile)"
            )
    return placer, steps


def emit(ctx, steps: list, engine_pass: str | None):
    """The lowered program of `ctx` from `decide`'s steps: each recorded instruction appended
    again with its operands moved, the pass's copies appended through `ctx.program` (named after
    their lines) between them. `ctx.program` appends into the new program (returned); the
    caller restores the old one when this raises."""
    program = ctx.program
    old = program._native
    new = program._native = _native.Program(ctx.core)
    program.engine_pass = engine_pass
    append = new.append_moved
    site = ctx.site
    try:
        for step in steps:
            kind = step[0]
            if kind == "moved":
                try:
                    append(old, step[1], step[2])
                except EmuError as e:
                    raise Unwalkable(f"instruction {step[1]} did not assemble moved: {e}") from None
            elif kind == "copy":
                ctx.site = step[3]
                getattr(program, step[1])(**step[2])
            else:
                new.psum_fresh(step[4], step[1], step[2], step[3])
    finally:
        ctx.site = site
    return new


def walk(ctx, spill: str | None, engine_pass: str | None) -> tuple[Placer, object]:
    """`decide` then `emit`: (the pass, the new native program)."""
    placer, steps = decide(ctx, spill)
    new = emit(ctx, steps, engine_pass)
    if placer.reuse_dropped:
        ctx.program.value_reuse = getattr(ctx.program, "value_reuse", 0) + placer.reuse_dropped
    return placer, new


def _tile_of(c, tiles, off, p0, mem, start, parts, lo, hi, writes, p) -> int | list:
    """The tile of call `c` whose recorded range holds operand bytes [lo, hi) of partitions
    start..start + parts of `mem` (`p0`: first partitions of tiles not at 0); the tiles when
    several do alike; `Unwalkable` when none does."""
    if c is None:
        raise Unwalkable(f"instruction {p}: an on-chip operand before the first call")
    found = []
    for group in (c.writes, c.reads):
        for s in group:
            t = tiles[s]
            o = off[s]
            q = p0.get(s, 0) if p0 else 0
            if (
                t.buffer == mem
                and o is not None
                and o <= lo
                and hi <= o + t.row_bytes
                and q <= start
                and start + parts <= q + (t.shape[0] if t.shape else 1)
                and s not in found
            ):
                found.append(s)
    if len(found) > 1:
        mine = c.writes if writes else c.reads
        found = [s for s in found if s in mine]
    if not found:
        raise Unwalkable(f"instruction {p} ({c.op} at {c.line}): no tile of its call holds its {mem} operand")
    return found[0] if len(found) == 1 else found


def _by_name(c, call_names, prog, p: int, arg: int, found: list) -> int:
    """Of the tiles `found` alike for operand `arg` of instruction `p`, the one call `c` passed
    as the ISA operand of that name (an instruction of the call's own opcode: its operands are
    the call's, by name); `Unwalkable` otherwise."""
    op = prog.instruction_text(p).split(" ", 1)[0].split(".", 1)[0]
    params = INSTRUCTIONS[op][2] if op == c.op and op in INSTRUCTIONS else ()
    s = call_names[c.ordinal].get(params[arg][0]) if arg < len(params) else None
    if s not in found:
        alike = ", ".join(f"t{s}" for s in found)
        raise Unwalkable(f"instruction {p} ({c.op} at {c.line}): tiles {alike} of its call hold its operand alike")
    return s
