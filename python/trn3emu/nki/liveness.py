"""Allocation by liveness, with spilling: the kernel IR's allocation pass (docs/nki.md, "Passes").

The recording trace (`record.Recorder`, mode "plan") records the kernel IR (`ir.py`): every
`nki.isa` call gets an ordinal and the on-chip tiles it names (each automatic tile and each block
of a block tile has an allocation ordinal, `Tile.ordinal`, kept on the block as `seq`); its own
placements are provisional (a tile that does not fit takes the range of the tiles least recently
used). The pass (`Placer`) then decides each tile's range from what it reads in the IR: each
tile's uses (`Tile.uses`, last use = death), which tiles are pinned (`Tile.pinned`). It is driven
either by the walk over the IR (`lowering.py`, the default: its allocations and calls replayed in
trace order, the recorded instructions moved after it) or by a second trace of the kernel body
(`passes={"lowering": "retrace"}`, and the walk's fallback: the trace is deterministic, so it
makes the same tiles in the same order and its views are moved here, `Placer.call`):

- a tile's range is freed once the call that last uses it has been issued, not when Python drops
  the tile (`nl.ndarray` / `nl.zeros` in loops then rotate over the free ranges as before);
- blocks of a block tile are tiles like any other: live from first to last use, never evicted
  while still used (a whole write of a block starts a new tile, `blocks.py`);
- when an SBUF allocation does not fit, live tiles are spilled to HBM, the one whose next use is
  furthest first (Belady's rule; `spill="lru"`: the least recently used first), until it fits;
  a spilled tile is reloaded just before the call that next uses it, wherever there is room
  (spilling again if needed), and the views the calls name are moved to its new range
  (`Placer.call`). Spill and reload are `dma_copy`
  instructions named `spill` / `reload` in the program and its trace, counted in
  `Placer.stats`. Tiles read through run-time offsets are pinned (their views cannot move).

The pass also records the lowered IR (`Placer.ir`, `kernel.last_ir`): the plan's calls
with their instructions in this program and, between them, the copies the pass adds as calls
(`Call.added_by == "spill"`, their tiles and HBM slots named, `Call.notes["spill"]` saying what
moved where), which `engine_choice` then runs over.

A kernel that does not fit even so (one call naming more than SBUF, a tile over a partition)
gets the allocator's `CapacityError`.
Explicitly placed tiles (`address=`, `ncc.sbuf.alloc` / `mod_alloc`) keep their placement and
are never freed early or spilled. PSUM tiles spill into SBUF copies (`tensor_copy`: PSUM has no
DMA path), which are SBUF tiles like others.
"""

from __future__ import annotations

import copy
import heapq
from bisect import bisect_right

from ..errors import CapacityError
from ..tensor import Tensor
from .ir import Call, HbmTensor, KernelIR, Loop, Tile
from .record import Recorder, block, blocks_named


class TraceMismatch(Exception):
    """The second trace made a different tile than the first at the same ordinal (the kernel's
    Python is not deterministic): the launch is traced again with literal allocation."""


class _Live:
    __slots__ = ("seq", "key", "lo", "hi", "home", "alloc", "parts", "label", "data")

    def __init__(self, seq, key, lo, hi, alloc, parts, label) -> None:
        self.seq, self.key, self.lo, self.hi, self.alloc = seq, key, lo, hi, alloc
        self.home = lo  # where its views point (`lo` moves when a reload lands elsewhere)
        self.parts, self.label, self.data = parts, label, False


def _rebased(v, t: _Live):
    """`v`, a view of tile `t`, moved to where `t` is now (views keep the address of the tile's
    first allocation; a reload may land elsewhere)."""
    if t.lo == t.home:
        return v
    u = v._t
    w = copy.copy(v)
    w._t = u._view(u.shape, u.strides, u.offset + (t.lo - t.home), u.start)
    w._ap = None
    return w


class Placer:
    """The second trace: frees tiles after their last use and spills / reloads SBUF tiles."""

    mode = "emit"
    liveness = True

    def __init__(self, plan: Recorder, spill: str | None, sbuf) -> None:
        self.sbuf = sbuf  # the program's SBUF allocator (PSUM spills land there)
        # what the pass reads from the kernel IR: each tile's uses (call ordinals) and, to check
        # that this trace is the first one again, the calls and tiles it holds
        ir = plan.ir
        self.planned_calls = len(ir.calls)
        self.uses = [t.uses for t in ir.tiles]
        self.tiles = [(t.row_bytes, t.label) for t in ir.tiles]
        self.pinned = {t.ordinal for t in ir.tiles if t.pinned}
        self.spill_on = spill
        self.calls = 0
        self.seq = 0
        self.live: dict[int, _Live] = {}  # seq -> resident automatic tile
        self.out: dict[int, _Live] = {}  # seq -> spilled tile
        self.moved = 0  # resident tiles not at their first address (views need rebasing)
        self.fixed: set[int] = set()  # ordinals of explicitly placed tiles
        self.deaths: list[tuple[int, int]] = []  # heap of (last use, seq)
        self.reload_at: dict[int, list[int]] = {}  # call ordinal -> spilled seqs it reads
        self.scratch: dict[int, Tensor] = {}  # seq -> its HBM spill slot
        # the lowered IR (`kernel.last_ir`): the plan's calls as this trace makes them (their
        # instructions in this program) with the spill / reload copies the pass adds between them
        self.plan_calls = ir.calls
        self.ir = KernelIR(ir.kernel, ir.program)
        self.ir.loops = [Loop(lp.id, lp.kind, lp.var, lp.line, lp.device) for lp in ir.loops]
        self.ir.tiles = [
            Tile(t.ordinal, t.buffer, t.shape, t.dtype, t.row_bytes, t.placed, t.label, t.born, [], t.pinned)
            for t in ir.tiles
        ]
        self.ir.tensors = [HbmTensor(h.ordinal, h.name, h.shape, h.dtype, h.nbytes, []) for h in ir.tensors]
        self.new_of: list[int] = []  # plan call ordinal -> its ordinal in the lowered IR
        self.slot_of: dict[int, int] = {}  # seq -> the IR tensor of its HBM spill slot
        self.copy_of: dict[int, int] = {}  # PSUM seq -> the IR tile of its latest SBUF copy
        self.since: dict[int, int] = {}  # spilled seq -> the first lowered-IR call it is out for
        self.notes_due: list[str] = []  # spills that copied nothing: noted on the next kernel call
        # the pass `value_reuse` on the IR (`value_reuse.plan_ir`, walk only): repeat's result
        # tile -> the earlier result's tile, dropped call -> the call it repeats
        self.alias: dict[int, int] = {}
        self.repeats: dict[int, int] = {}
        self.loads: set[int] = set()
        self.reuse_dropped = 0
        self.stats = {
            "spills": 0,
            "spilled_bytes": 0,
            "reloads": 0,
            "reloaded_bytes": 0,
            "psum_spills": 0,
            "psum_spilled_bytes": 0,
        }

    def drop_repeats(self, reuse) -> None:
        """Take the repeats `value_reuse.plan_ir` found: each earlier result lives on to the
        last use of the results it stands for, which are never placed."""
        self.alias, self.repeats, self.loads = reuse.alias, reuse.calls, reuse.loads
        self.reuse_dropped = len(reuse.drops)
        self.uses = list(self.uses)
        for s, u in reuse.uses.items():
            self.uses[s] = u

    def spilled_bytes(self) -> int:
        st = self.stats
        return st["spilled_bytes"] + st["reloaded_bytes"] + st["psum_spilled_bytes"]

    # ------------------------------------------------------------------ uses
    def _next_use(self, seq: int, after: int) -> int | None:
        if seq < 0:  # the SBUF copy of spilled PSUM tile -seq - 1: needed when that tile is
            seq = -seq - 1
        u = self.uses[seq] if seq < len(self.uses) else ()
        i = bisect_right(u, after - 1) if u else 0
        return u[i] if u and i < len(u) else None

    def check_end(self) -> None:
        """At the end of the trace: the same number of calls and tiles as the first trace made.
        Then the lowered IR's uses are those of its calls (kernel and added), its passes said."""
        if self.calls != self.planned_calls or self.seq != len(self.tiles):
            raise TraceMismatch(
                f"{self.calls} calls and {self.seq} tiles, first trace: {self.planned_calls} and {len(self.tiles)}"
            )
        ir = self.ir
        end = len(ir.calls)
        for t in ir.tiles:
            if t.ordinal < len(self.tiles):  # (a plan tile: born before plan call `born`)
                t.born = self.new_of[t.born] if t.born < len(self.new_of) else end
        for c in ir.calls:
            for i in dict.fromkeys(c.reads + c.writes):
                ir.tiles[i].uses.append(c.ordinal)
            for i in dict.fromkeys(c.hbm_reads + c.hbm_writes):
                ir.tensors[i].uses.append(c.ordinal)
        sb, _ = ir.peak("sbuf")
        ir.passes["liveness"] = f"each tile freed after its last use (peak live SBUF {sb} B/partition)"
        st = self.stats
        if self.spill_on:
            ir.passes["spill"] = (
                f"rule {self.spill_on}: {st['spills']} spills ({st['spilled_bytes']} B), {st['reloads']} reloads "
                f"({st['reloaded_bytes']} B), {st['psum_spills']} PSUM spills ({st['psum_spilled_bytes']} B)"
            )

    def _added(self, ctx, op: str, what: str, reads=(), writes=(), hbm_reads=(), hbm_writes=()) -> None:
        """A copy the pass adds (its instruction is appended next): a call of the lowered IR,
        in the loop nest and at the line of the kernel call it comes before."""
        k = self.calls
        nxt = self.plan_calls[k] if k < len(self.plan_calls) else None
        c = Call(
            len(self.ir.calls),
            op,
            None,
            nxt.line if nxt is not None else "?",
            nxt.nest if nxt is not None else (),
            tuple(reads),
            tuple(writes),
            tuple(hbm_reads),
            tuple(hbm_writes),
            len(ctx.program),
            0,
            "spill",
            {"spill": what},
        )
        self.ir.calls.append(c)

    def _ir_tile(self, s: int) -> int:
        """The lowered IR's tile of seq `s` (the SBUF copy of spilled PSUM tile -s - 1: its latest)."""
        return self.copy_of[-s - 1] if s < 0 else s

    def _slot(self, s: int, parts: int, n: int) -> int:
        """The lowered IR's HBM tensor of seq `s`'s spill slot."""
        i = self.slot_of.get(s)
        if i is None:
            i = self.slot_of[s] = len(self.ir.tensors)
            t = self._ir_tile(s)
            self.ir.tensors.append(HbmTensor(i, f"spill slot of t{t}", (parts, n), "uint8", parts * n))
        return i

    def _last_use(self, seq: int, before: int) -> int:
        """The latest call before `before` that used `seq` (-1: none yet)."""
        if seq < 0:
            seq = -seq - 1
        u = self.uses[seq] if seq < len(self.uses) else ()
        i = bisect_right(u, before - 1) if u else 0
        return u[i - 1] if i else -1

    def call(self, ctx, args, kwargs, *_):
        """Call `k`: the spilled tiles it reads come back first; its tile arguments are moved to
        where their tiles are now. Returns (args, kwargs)."""
        k = self.calls
        due = self.reload_at.pop(k, None)
        if due:
            self._release_dead(k)
            for s in due:
                if s in self.out:
                    self._reload(ctx, s, k)
        self.calls = k + 1
        if k < len(self.plan_calls):
            p = self.plan_calls[k]
            reads, writes = p.reads, p.writes
            if self.alias:
                alias = self.alias
                reads = tuple(dict.fromkeys(alias.get(s, s) for s in reads))
                writes = tuple(dict.fromkeys(alias.get(s, s) for s in writes))
            c = Call(
                len(self.ir.calls),
                p.op,
                p.engine,
                p.line,
                p.nest,
                reads,
                writes,
                p.hbm_reads,
                p.hbm_writes,
                len(ctx.program),
                p.segment,
                p.added_by,
            )
            c.origin = p.origin
            j = self.repeats.get(k)
            if j is not None:  # (its instruction dropped: it reads and writes nothing)
                c.reads = c.writes = ()
                c.hbm_reads = ()
                name = "load_reuse" if k in self.loads else "value_reuse"
                c.notes[name] = (
                    f"dropped before allocation, repeating call {self.new_of[j]} (its result's reads read that call's)"
                )
            if self.notes_due:
                c.notes["spill"] = "; ".join(self.notes_due)
                self.notes_due = []
            self.new_of.append(c.ordinal)
            self.ir.calls.append(c)
        found = blocks_named(args, kwargs)
        live = self.live
        for b in found:
            s = getattr(b, "seq", None)
            if s is not None and getattr(b, "pass_", None) is self and s not in live and s not in self.fixed:
                # a tile this call names is not resident: the second trace is not the first one
                raise TraceMismatch(b.label)
        if not self.moved:
            return args, kwargs
        return tuple(self._move(v) for v in args), {n: self._move(v) for n, v in kwargs.items()}

    def _move(self, v):
        if type(v) in (list, tuple):
            return type(v)(self._move(x) for x in v)
        b = block(v)
        s = getattr(b, "seq", None)
        if s is None or getattr(b, "keep", None) is not None or getattr(b, "pass_", None) is not self:
            return v
        t = self.live.get(s)
        return v if t is None else _rebased(v, t)

    # ------------------------------------------------------------------ allocation
    def _number(self, block) -> int:
        block.pass_ = self
        s = block.seq = self.seq
        self.seq = s + 1
        if s >= len(self.tiles) or self.tiles[s] != (block.row_bytes, block.label):
            raise TraceMismatch(block.label)
        return s

    def placed(self, block, kind=None, at=None) -> None:
        self.fixed.add(self._number(block))

    def skip_tile(self, block) -> None:
        """A repeat's result tile (`drop_repeats`): numbered, never placed."""
        self._number(block)

    def new_tile(self, ctx, alloc, row: int, label: str, block, kind=None) -> tuple[int, int]:
        s = self._number(block)
        now = self.calls
        self._release_dead(now)
        due = self.reload_at.pop(now, None)  # tiles the very next call reads: back first
        if due:
            for r in due:
                if r in self.out:
                    self._reload(ctx, r, now)
        key, off = self._place(ctx, alloc, row, label, now)
        self.ir.tiles[s].at.append((len(self.ir.calls), off))
        u = self.uses[s] if s < len(self.uses) else []
        self.live[s] = _Live(s, key, off, off + row, alloc, block.parts, label)
        heapq.heappush(self.deaths, (u[-1] if u else -1, s))
        return key, off

    def _release_dead(self, now: int) -> None:
        d = self.deaths
        while d and d[0][0] < now:
            _, s = heapq.heappop(d)
            t = self.live.pop(s, None)
            if t is not None:
                t.alloc.free(t.key)
                self.moved -= t.lo != t.home
            self.out.pop(s, None)
            c = self.live.pop(-s - 1, None)  # died spilled from PSUM: its SBUF copy goes too
            if c is not None:
                c.alloc.free(c.key)
            self.out.pop(-s - 1, None)

    def _place(self, ctx, alloc, row: int, label: str, now: int) -> tuple[int, int]:
        """A range for `row` bytes per partition, spilling SBUF tiles not used by call `now`
        (furthest next use first) when none is free."""
        got = alloc.try_alloc(row, label)
        if got is not None:
            return got
        if not self.spill_on:
            return alloc.alloc(row, label)  # the precise error
        while True:
            lru = self.spill_on == "lru"
            victims = [
                (-self._last_use(t.seq, now) if lru else nu, t.seq)
                for t in self.live.values()
                if t.alloc is alloc
                and t.seq not in self.pinned
                and (nu := self._next_use(t.seq, now)) is not None
                and nu > now
            ]
            if not victims:
                try:
                    return alloc.alloc(row, label)  # (fails: builds the overflow message once)
                except CapacityError as err:
                    raise CapacityError(
                        f"{err} {self._why_unspillable(alloc, now)}", operand="shape", rule="onchip_capacity"
                    ) from None
            self._spill(ctx, max(victims)[1], now)
            got = alloc.try_alloc(row, label)
            if got is not None:
                return got

    def _why_unspillable(self, alloc, now: int) -> str:
        """Why no live tile could be spilled: bytes per partition held by tiles this instruction
        uses and by tiles read through run-time offsets (their views cannot move, so the pass
        never spills them); the rest is placed explicitly."""
        mine = pinned = 0
        for t in self.live.values():
            if t.alloc is not alloc:
                continue
            if t.seq in self.pinned:
                pinned += t.hi - t.lo
            else:
                mine += t.hi - t.lo
        parts = []
        if mine:
            parts.append(f"{mine} B per partition are tiles this instruction uses")
        if pinned:
            parts.append(
                f"{pinned} B per partition are tiles read through run-time offsets (index tiles, "
                "scalar_offset / vector_offset views), which are never spilled: keep fewer of them "
                "live at once, or DMA the rows the index selects into a tile of their own"
            )
        parts.append("the rest is placed explicitly")
        return "(even with spills: " + "; ".join(parts) + ")"

    # ------------------------------------------------------------------ spill / reload
    def _view(self, mem: str, parts: int, lo: int, n: int, core: int) -> Tensor:
        """`parts` x `n` bytes at byte `lo` of each partition, as 4-byte words when they divide
        (an engine copies a dtype to itself bit-exactly)."""
        dt, w = ("float32", 4) if n % 4 == 0 and lo % 4 == 0 else ("uint8", 1)
        v = Tensor(mem, dt, (parts, n // w), name="spill", core=core)
        return v._view(v.shape, v.strides, lo, 0)

    def _spill(self, ctx, s: int, now: int) -> None:
        t = self.live.pop(s)
        n = t.hi - t.lo
        if s >= 0:
            u = self.uses[s]
            t.data = bool(u) and u[0] < now  # written before (else nothing to keep)
            self.moved -= t.lo != t.home
        if t.data and t.alloc is not self.sbuf:
            # PSUM has no DMA path: the tile goes to an SBUF copy (seq -s - 1), itself spilled to
            # HBM by the same rule when SBUF is full
            key, off = self._place(ctx, self.sbuf, n, f"PSUM spill of {t.label}", now)
            c = self.live[-s - 1] = _Live(-s - 1, key, off, off + n, self.sbuf, t.parts, f"PSUM spill of {t.label}")
            c.data = True
            src = self._view("psum", t.parts, t.lo, n, ctx.core)
            ci = self.copy_of[s] = len(self.ir.tiles)
            self.ir.tiles.append(
                Tile(ci, "sbuf", (t.parts, n), "uint8", n, False, f"PSUM spill of {t.label}", len(self.ir.calls))
            )
            self.ir.tiles[ci].at.append((len(self.ir.calls), off))
            self._added(ctx, "tensor_copy", f"t{s} (PSUM) -> t{ci} (SBUF), {t.parts * n} B", reads=(s,), writes=(ci,))
            ctx.program.tensor_copy(dst=self._view("sbuf", t.parts, off, n, ctx.core), src=src, name="psum_spill")
            self.stats["psum_spills"] += 1
            self.stats["psum_spilled_bytes"] += t.parts * n
        elif t.data:
            hbm = self.scratch.get(s)
            if hbm is None:
                hbm = self.scratch[s] = ctx.device.hbm.alloc((t.parts, n), "uint8", name="spill")
            src = self._view("sbuf", t.parts, t.lo, n, ctx.core)
            ti, h = self._ir_tile(s), self._slot(s, t.parts, n)
            self._added(ctx, "dma_copy", f"t{ti} -> h{h}, {t.parts * n} B", reads=(ti,), hbm_writes=(h,))
            ctx.program.dma_copy(dst=hbm.view_as(src.dtype) if src.dtype != "uint8" else hbm, src=src, name="spill")
            self.stats["spills"] += 1
            self.stats["spilled_bytes"] += t.parts * n
        else:
            self.notes_due.append(f"t{self._ir_tile(s)} spilled, never written: nothing copied")
        self.since[s] = len(self.ir.calls)
        t.alloc.free(t.key)
        self.out[s] = t
        nu = self._next_use(s, now)
        if nu is not None:
            self.reload_at.setdefault(nu, []).append(s)

    def _reload(self, ctx, s: int, now: int) -> None:
        t = self.out.pop(s)
        n = t.hi - t.lo
        c = None
        if t.data and t.alloc is not self.sbuf:
            if -s - 1 in self.out:  # its SBUF copy went to HBM: back first
                self._reload(ctx, -s - 1, now)
            c = self.live.pop(-s - 1)
        t.key, t.lo = self._place(ctx, t.alloc, n, t.label, now)
        t.hi = t.lo + n
        self.live[s] = t
        if s >= 0:
            self.moved += t.lo != t.home
        a, b = self.since.pop(s, None), len(self.ir.calls)  # (back with the reload copy, call b)
        tile = self.ir.tiles[self._ir_tile(s)]
        if a is not None and a < b:
            tile.out.append((a, b))
        tile.at.append((b, t.lo))
        if not t.data:
            return
        mem = "sbuf" if t.alloc is self.sbuf else "psum"
        dst = self._view(mem, t.parts, t.lo, n, ctx.core)
        if c is not None:
            ci = self.copy_of[s]
            self._added(ctx, "tensor_copy", f"reload t{ci} (SBUF) -> t{s} (PSUM), {t.parts * n} B", (ci,), (s,))
            ctx.program.tensor_copy(dst=dst, src=self._view("sbuf", c.parts, c.lo, n, ctx.core), name="psum_reload")
            c.alloc.free(c.key)
        else:
            src = self.scratch[s]
            ti, h = self._ir_tile(s), self.slot_of[s]
            self._added(ctx, "dma_copy", f"reload h{h} -> t{ti}, {t.parts * n} B", writes=(ti,), hbm_reads=(h,))
            ctx.program.dma_copy(dst=dst, src=src.view_as(dst.dtype) if dst.dtype != "uint8" else src, name="reload")
            self.stats["reloads"] += 1
            self.stats["reloaded_bytes"] += t.parts * n
