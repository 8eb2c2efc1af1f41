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

When the `liveness` lowering walks the kernel IR (`lowering.py`), the repeats into another tile
are found there first (`plan_ir`), before tiles are placed: the allocation then keeps the
earlier result alive until the last read of each result it stands for, where the pass over the
finished program finds that result's bytes already given to another tile.

Never while the device rounds stochastically: each rounding draws its own bits (on the emulator
from the instruction's index, which the removal would shift for every later instruction)."""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right

from . import passes

#: instructions that order this core against others: after one, another core's HBM writes may be
#: visible, so a load's bytes are no longer known unchanged (`load_reuse` too)
CROSS_CORE = frozenset(
    "core_barrier sendrecv all_reduce all_gather reduce_scatter all_to_all all_to_all_v collective_permute".split()
)


def _stochastic() -> bool:
    v = os.environ.get("NEURON_RT_STOCHASTIC_ROUNDING_EN", "").strip().lower()
    return v in ("1", "true", "yes")


class IrReuse:
    """The repeats `plan_ir` found: `drops` (recorded instruction indices), `alias` (a
    repeat's result tile -> the earlier result's tile), `calls` (the dropped call -> the call it
    repeats, plan ordinals), `uses` (each earlier result's call ordinals with those of the
    results it stands for)."""

    __slots__ = ("drops", "alias", "calls", "uses", "loads")

    def __init__(self) -> None:
        self.drops: set[int] = set()
        self.alias: dict[int, int] = {}
        self.calls: dict[int, int] = {}
        self.uses: dict[int, list[int]] = {}
        self.loads: set[int] = set()  # the dropped calls that are `nl.load`s

    def __bool__(self) -> bool:
        return bool(self.drops)


def ir_mode(ctx) -> bool:
    """Whether the walk looks for repeats on the IR (`value_reuse` "on" or `load_reuse` on, no
    stochastic rounding)."""
    k = ctx.launch.kernel
    return (passes.value_reuse(k) == "on" or passes.enabled(k, "load_reuse")) and not _stochastic()


def plan_ir(ctx, rec, ops: list, owner: list) -> IrReuse:
    """The repeats into another tile on the recorded IR of `rec` (a plan `Recorder`), before
    allocation. `ops[p]`: instruction p's on-chip operands with their tiles (`lowering._resolve`),
    `owner[p]` its call. A call of one instruction is dropped when that instruction is a compute
    instruction of the core's rule (`Program.relative_key`: deterministic, no HBM operand, one
    result) whose encoding, with every on-chip operand counted from its tile's start, equals an
    earlier call's, reading the same tiles with nothing written to them in between, and writing
    the whole of a tile nothing else writes or read before, where the earlier one did the same
    to a tile of the same geometry that nothing writes again. The result's reads then read the
    earlier result, which lives until the last of them."""
    prog = ctx.program._native
    ir = rec.ir
    tiles, calls, off = ir.tiles, ir.calls, rec.plan_off
    out = IrReuse()
    writers: dict[int, list[int]] = {}
    for c in calls:
        for s in c.writes:
            writers.setdefault(s, []).append(c.ordinal)
    # `nl.load`s too, as the pass `load_reuse` (its rules: the tile's bytes unchanged, no write
    # to the HBM tensor in between, no cross-core instruction in a multi-program launch)
    launch = ctx.launch
    compute = passes.value_reuse(launch.kernel) == "on"
    loads = passes.enabled(launch.kernel, "load_reuse") and not (
        any(g > 1 for g in launch.grid) and not CROSS_CORE.isdisjoint(ctx.program.opcodes)
    )
    dma_loads = loads and passes.dma_copy_loads(launch.kernel)  # (`nisa.dma_copy` loads too)
    hver: dict[int, int] = {}  # HBM tensor ordinal -> writes so far
    size = [0] * (len(calls) + 1)
    for k in owner:
        if k is not None:
            size[k] += 1
    version: dict[int, int] = {}
    seen: dict = {}
    alias = out.alias
    for p, row in enumerate(ops):
        k = owner[p]
        hit = None
        c = calls[k] if k is not None else None
        if c is not None and size[k] == 1 and row:
            hit = _candidate(row, k, tiles, off, writers, alias)
        if hit is not None:
            s2, shifts = hit
            load = loads and (c.origin == "nl.load" or (dma_loads and c.op == "dma_copy"))
            h = prog.relative_key(p, shifts, load) if load or compute else None
            if h is not None:
                reads = tuple((a, alias.get(s, s), version.get(alias.get(s, s), 0)) for a, s, w, *_ in row if not w)
                key = (h, reads, tuple((i, hver.get(i, 0)) for i in c.hbm_reads) if load else ())
                e = seen.get(key)
                if e is not None:
                    j, s1, kj, sj = e
                    t1, t2 = tiles[s1], tiles[s2]
                    if (t1.buffer, t1.shape, t1.dtype, t1.row_bytes) == (
                        t2.buffer,
                        t2.shape,
                        t2.dtype,
                        t2.row_bytes,
                    ) and prog.same_relative(p, shifts, j, sj):
                        out.drops.add(p)
                        alias[s2] = s1
                        out.calls[k] = kj
                        if load:
                            out.loads.add(k)
                        continue  # (writes nothing)
                else:
                    seen[key] = (p, s2, k, shifts)
        for _, s, w, *_ in row:
            if w:
                r = alias.get(s, s)
                version[r] = version.get(r, 0) + 1
        if c is not None and c.hbm_writes and (p + 1 == len(ops) or owner[p + 1] != k):
            for i in c.hbm_writes:  # (after the call's last instruction)
                hver[i] = hver.get(i, 0) + 1
    if out:
        gone = set(out.calls)  # (a dropped call uses nothing)
        for s2, s1 in alias.items():
            u = out.uses.get(s1, tiles[s1].uses)
            out.uses[s1] = sorted(set(u).union(tiles[s2].uses) - gone)
    return out


def _candidate(row, k: int, tiles, off, writers, alias):
    """(result tile, shifts into the tiles' frames) when the one instruction of call `k` may be
    a repeat into another tile or the earlier instance of one; else None."""
    s2 = None
    shifts = []
    for a, s, w, start, parts, lo, hi in row:
        t = tiles[s]
        o = off[s]
        if a >= 1000 or o is None or t.pinned or t.placed:  # (run-time offsets, placed tiles)
            return None
        if w:
            if s2 is not None or t.buffer != "sbuf" or s in alias:
                return None
            n = t.shape[0] if t.shape else 1
            if (start, parts, lo - o, hi - o) != (0, n, 0, t.row_bytes):
                return None  # (not the whole tile)
            s2 = s
        shifts.append((a, -o))
    if s2 is None or writers.get(s2) != [k] or tiles[s2].uses[:1] != [k]:
        return None
    if any(s == s2 and not w for _, s, w, *_ in row):
        return None
    return s2, shifts


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
    pairs, moves, missed = native.exact_repeats(rename=mode == "on", last=last)
    program.reuse_missed = missed
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


def renumber(calls, gone) -> None:
    """Move the program indices the IR's `calls` hold (`Call.instr`, the engine choice's notes)
    to the program without the instructions `gone` (ascending)."""
    dropped = set(gone)

    def new(i: int) -> int:
        return i - bisect_left(gone, i)

    for c in calls:
        c.instr = new(c.instr)
        ec = c.notes.get("engine_choice")
        if ec:
            c.notes["engine_choice"] = tuple((new(i), e) for i, e in ec if i not in dropped)


def dropped(ctx, name: str, gone, record, *details) -> int:
    """After a pass dropped instructions `gone` of `ctx.program`: the program's synchronised copy
    is stale, its count `program.<name>` grows, and `record(ir, gone, *details)` notes the
    decisions in the kernel IR when one is recorded; the number dropped."""
    if not gone:
        return 0
    program = ctx.program
    program._synced = None
    setattr(program, name, getattr(program, name, 0) + len(gone))
    if ctx.ir is not None:
        record(ctx.ir.ir, gone, *details)
    return len(gone)


def segment_calls(ir, segment: int = 0):
    """The kernel IR's calls of program `segment` that emitted instructions, and `call_of(i)`:
    the call whose instructions include program index `i` (None before the first): what the
    passes that remove instructions note their decisions on."""
    calls = [c for c in ir.calls if c.segment == segment and c.instr >= 0]
    starts = [c.instr for c in calls]

    def call_of(i: int):
        k = bisect_right(starts, i) - 1
        return calls[k] if k >= 0 else None

    return calls, call_of


def _record(ir, segment: int, pairs, gone, moved: int = 0) -> None:
    """Write the decisions into the IR: a note on each call whose instructions were dropped (the
    call whose instruction it repeats), its `passes` line, and every index of the segment's calls
    (`Call.instr`, the engine choice's notes) moved to the program without them."""
    calls, call_of = segment_calls(ir, segment)

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
    renumber(calls, gone)
    seg = f" (segment {segment})" if segment else ""
    line = f"{len(gone)} repeated instructions dropped{seg}, from {len(lines)} kernel lines"
    if moved:
        line += f"; {moved} reads moved to the earlier result"
    prev = ir.passes.get("value_reuse")
    ir.passes["value_reuse"] = line if prev is None else f"{prev}; {line}"
