"""Recording the kernel IR (`ir.py`) while a kernel traces (docs/nki.md, "Passes").

A `Recorder` is the trace's `ctx.ir` hook: `nki.isa` calls report their operands (`call`),
on-chip allocations are numbered (`new_tile` / `placed`: allocation ordinal = `Tile.ordinal`),
`nl.affine_range` & co. report their loops (`loop`) and the device loops theirs (`site_loop`,
`enter` / `iteration` / `leave`); each call notes its first instruction's index and its segment
(a device loop's bound read starts a new program: `registers.device_value`). Two modes:

- "plan": the trace of the liveness pass (`liveness.py`). Its own placements are provisional (a
  tile that does not fit takes the range of the tiles least recently used); it keeps, per tile,
  where it placed it and the program position of its allocation, and per call the ISA operand
  names of its tiles, for the walk that lowers its program (`lowering.py`).
- "record": a literal trace asked to keep its IR (`nki.jit(ir=True)`, `TRN3EMU_NKI_IR=1`):
  tiles are placed as without it; the program is the one the kernel gets without recording.

Operands are read duck-typed (a tile view's `_block`, an HBM view's `_t.block`): this module is
a layer below the tracer and does not import it.
"""

from __future__ import annotations

import dis
import os

from .ir import Call, HbmTensor, KernelIR, Loop, Tile


def block(v):
    """`v._block` of a tile view (`_kernel.block_of`, without importing it); None for anything
    else and for a result not issued yet (the slot read directly: `Pending.__getattr__` would
    issue it)."""
    if isinstance(v, type):
        return None
    try:
        return object.__getattribute__(v, "_block")
    except AttributeError:
        return None


def blocks_named(args, kwargs) -> list:
    """The allocations every argument of one call names (`blocks_of` of each)."""
    found: list = []
    for v in args:
        blocks_of(v, found)
    for v in kwargs.values():
        blocks_of(v, found)
    return found


def blocks_of(v, out: list) -> None:
    """The allocations (`_Block`s with a `seq`) a call argument names: a tile view's own and its
    run-time operand tiles'; one level of lists / tuples."""
    b = block(v)
    if b is not None:
        keep = getattr(b, "keep", None)
        if keep is not None:
            out.extend(x for x in keep if x is not None)
        else:
            out.append(b)
    elif type(v) in (list, tuple):
        for x in v:
            if block(x) is not None:
                blocks_of(x, out)


def calls_so_far(ctx) -> int:
    """How many calls the trace's IR holds (0 when none is recorded): before a tracing-time
    pass's decision, for `decided`."""
    rec = ctx.ir
    return 0 if rec is None else len(rec.ir.calls)


def decided(ctx, name: str, what: str, since: int | None = None) -> None:
    """A pass acting while tracing (`inplace_assign`, `load_reuse`, `reduce_init`) decided `what`:
    counted in the IR's `passes` line and, when the decision issued calls (more than `since`), noted
    on the last of them (`Call.notes[name]`). Nothing when no IR is recorded."""
    rec = ctx.ir
    if rec is None:
        return
    ir = rec.ir
    if since is not None and len(ir.calls) > since:
        ir.calls[-1].notes[name] = what
    ir.count(name, what)


_SEQUENCE, _VIEW, _LAZY_VIEW = 1, 2, 3
_get = object.__getattribute__


def _kind(t: type) -> int:
    """How `Recorder.call` reads an operand of type `t`: 0 not at all, `_SEQUENCE` (a list or
    tuple of views), `_VIEW` (`_kernel.NkiTensor`: its `_block` and `_t` slots are set), or
    `_LAZY_VIEW` (a subclass whose slots may be unset: `pending.Pending`)."""
    if t is list or t is tuple:
        return _SEQUENCE
    if t is type or not (hasattr(t, "_block") and hasattr(t, "_t")):
        return 0
    return _VIEW if t.__name__ == "NkiTensor" else _LAZY_VIEW


#: operand type -> `_kind` (a few types per process)
_KIND: dict[type, int] = {}

#: type of a view's allocation -> whether it holds several (`_kernel._Blocks.keep`)
_MULTI: dict[type, bool] = {}


#: instructions after a loop's call that bind its variable (`for v in nl.affine_range(n)`)
_STORES = ("STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL")
_SKIP = ("CACHE", "EXTENDED_ARG", "NOP", "PRECALL")


def _loop_var(code, lasti: int) -> str:
    """The name the `for` statement whose iterable is the call at `lasti` binds ("" when the
    range is not iterated by a plain `for name in ...`)."""
    want = ("GET_ITER", "FOR_ITER")
    for ins in dis.get_instructions(code):
        if ins.offset <= lasti or ins.opname in _SKIP:
            continue
        if want:
            if ins.opname != want[0]:
                return ""
            want = want[1:]
            continue
        return ins.argval if ins.opname in _STORES else ""
    return ""


class TracedRange:
    """A loop's range as `Recorder.loop` hands it to the kernel: iterating it keeps the trace's
    loop stack (each call's nest); otherwise it behaves as the range."""

    __slots__ = ("range", "loop", "rec")

    def __init__(self, r: range, loop: Loop, rec: Recorder) -> None:
        self.range, self.loop, self.rec = r, loop, rec

    def __iter__(self):
        rec = self.rec
        entry = rec.enter(self.loop, len(self.range))
        try:
            for i, v in enumerate(self.range):
                rec.iteration(entry, i)
                yield v
        finally:  # (also on break / an exception: the generator is closed)
            rec.leave(entry)

    def __len__(self) -> int:
        return len(self.range)

    def __getitem__(self, i):
        return self.range[i]

    def __reversed__(self):
        return reversed(self.range)

    def __contains__(self, v) -> bool:
        return v in self.range

    def __getattr__(self, name):
        return getattr(self.range, name)


class Recorder:
    """Fills `self.ir` (a `KernelIR`) from one trace; see the module doc for the two modes."""

    def __init__(self, mode: str = "plan", kernel: str = "", program: int = 0, where=None, frame_of=None) -> None:
        self.mode = mode
        #: True when the trace allocates by liveness (blocks renew on whole writes, no load reuse)
        self.liveness = mode != "record"
        self.ir = KernelIR(kernel, program)
        self.calls = 0
        self.seq = 0
        #: the loops around the current call: [loop id, iteration, trip count], outermost first
        self.loops: list[list] = []
        self.nest: tuple = ()  # the same as tuples (what the next call records)
        self._where = where  # () -> "file:line" of the kernel's current line (`_kernel.source_line`)
        self._frame_of = frame_of  # frame -> the kernel's own frame (`_kernel.user_frame`)
        self._loop_sites: dict[tuple, tuple] = {}  # (id(code), offset) -> (code, Loop)
        self._hbm: dict[tuple, int] = {}  # (lo, hi) byte range -> HBM tensor ordinal
        #: the program calls go into: a device loop's bound read on the device starts a new one
        #: (`registers.device_value`)
        self.segment = 0
        #: mode "plan": per tile ordinal, the program position of its allocation and the byte
        #: offset this trace placed it at (None: placed explicitly), for the walk lowering
        #: (`lowering.py`), which moves the instructions naming it to where the pass places it
        self.plan_pos: list[int] = []
        self.plan_off: list[int | None] = []
        self.plan_site: list[str] = []  # and the kernel's line then
        self.plan_p0: dict[int, int] = {}  # first partition of a tile placed from another than 0
        #: mode "plan": per call, its operands that name one tile (ISA operand name -> ordinal)
        self.call_names: list[dict] = []
        #: mode "plan": why the walk cannot lower this trace ("": it can)
        self.unwalkable = ""
        #: mode "plan": id of an allocator -> {ordinal: key} of the tiles this trace placed there
        self._resident: dict[int, dict[int, int]] = {}

    # ------------------------------------------------------------------ calls
    def call(self, ctx, args, kwargs, op: str = "?", names=(), writes=frozenset()):
        """Call `self.calls` (its ordinal) names these operands. Returns (args, kwargs)."""
        k = self.calls
        self.calls = k + 1
        ir = self.ir
        tiles = ir.tiles
        reads: list[int] = []
        wrote: list[int] = []
        hreads: list[int] = []
        hwrote: list[int] = []
        named = {} if self.mode == "plan" else None  # ISA operand name -> tile, for the walk
        for name, v in (*zip(names, args), *kwargs.items()) if args else kwargs.items():
            tv = type(v)
            kind = _KIND.get(tv)
            if kind is None:
                kind = _KIND[tv] = _kind(tv)
            if not kind:
                continue
            if kind == _SEQUENCE:
                found: list = []
                blocks_of(v, found)
                for b in found:
                    s = getattr(b, "seq", None)
                    if s is not None and getattr(b, "pass_", None) is self:
                        u = tiles[s].uses
                        if not u or u[-1] != k:
                            u.append(k)
                        reads.append(s)
                continue
            if kind == _VIEW:
                own, t = v._block, v._t
            else:  # (a result not issued yet has neither: its attribute access would issue it)
                try:
                    own, t = _get(v, "_block"), _get(v, "_t")
                except AttributeError:
                    continue
            is_dst = name in writes
            if own is None:
                h = t.block if getattr(t, "mem", None) == "hbm" else None
                if h is not None:
                    i = self._tensor(h, v)
                    u = ir.tensors[i].uses
                    if not u or u[-1] != k:
                        u.append(k)
                    (hwrote if is_dst else hreads).append(i)
                continue
            tb = type(own)
            multi = _MULTI.get(tb)
            if multi is None:
                multi = _MULTI[tb] = hasattr(tb, "keep")
            if not multi:  # (the usual case: one tile)
                s = getattr(own, "seq", None)
                if s is not None and own.pass_ is self:
                    u = tiles[s].uses
                    if not u or u[-1] != k:
                        u.append(k)
                    (wrote if is_dst else reads).append(s)
                    if getattr(t, "dyn", None) is not None:
                        tiles[s].pinned = True
                    if named is not None:
                        named[name] = s
                continue
            keep = own.keep
            # (run-time operand tiles: `_with_runtime_operands`; a `load_reuse` handle has none)
            dyn = bool(own.tiles) or getattr(t, "dyn", None) is not None
            dst_block = keep[0]
            for b in keep:
                s = getattr(b, "seq", None)
                if s is None or getattr(b, "pass_", None) is not self:
                    continue
                u = tiles[s].uses
                if not u or u[-1] != k:
                    u.append(k)
                # a view's run-time operand tiles (index / offset tiles) are read even for a dst
                (wrote if is_dst and b is dst_block else reads).append(s)
                if dyn:
                    tiles[s].pinned = True
        if named is not None:
            self.call_names.append(named)
        engine = kwargs.get("engine") if kwargs else None
        if engine is not None:
            engine = str(getattr(engine, "name", engine))
        site = ctx.site
        ir.calls.append(
            Call(
                k,
                op,
                engine,
                site if site is not None else (self._where(1) if self._where else "?"),
                self.nest,
                tuple(reads) if len(reads) < 2 else tuple(dict.fromkeys(reads)),
                tuple(wrote) if len(wrote) < 2 else tuple(dict.fromkeys(wrote)),
                tuple(hreads) if len(hreads) < 2 else tuple(dict.fromkeys(hreads)),
                tuple(hwrote) if len(hwrote) < 2 else tuple(dict.fromkeys(hwrote)),
                len(ctx.program),
                self.segment,
            )
        )
        return args, kwargs

    def issued_by(self, origin: str) -> None:
        """The call just recorded was issued by the lowering of `origin` (`Call.origin`)."""
        if self.ir.calls:
            self.ir.calls[-1].origin = origin

    def _tensor(self, h, v) -> int:
        key = (h.lo, h.hi)
        i = self._hbm.get(key)
        if i is None:
            t = object.__getattribute__(v, "_t")
            name = getattr(t, "name", "") or getattr(h, "label", "") or ""
            i = self._hbm[key] = len(self.ir.tensors)
            self.ir.tensors.append(HbmTensor(i, str(name), (), str(t.dtype), h.hi - h.lo))
        return i

    def hbm_tensor(self, lo: int, hi: int, shape, dtype, name: str) -> None:
        """An HBM tensor the kernel allocates (`nl.ndarray(..., buffer=nl.shared_hbm)`)."""
        self._hbm[(lo, hi)] = i = len(self.ir.tensors)
        self.ir.tensors.append(HbmTensor(i, name, tuple(shape), str(dtype), hi - lo))

    def name_inputs(self, named) -> None:
        """Name the HBM tensors that are kernel inputs: `named` is ((lo, hi, shape, name), ...)."""
        for lo, hi, shape, name in named:
            i = self._hbm.get((lo, hi))
            if i is not None:
                t = self.ir.tensors[i]
                t.name, t.shape = name, tuple(shape)

    # ------------------------------------------------------------------ loops
    def loop(self, r: range, kind: str, frame) -> TracedRange:
        """`r`, the range of an `nl.affine_range` (`kind`) called from `frame`, as a range that
        keeps the loop stack while iterated."""
        return TracedRange(r, self.site_loop(kind, frame), self)

    def enter(self, loop: Loop, trips: int | None) -> list:
        """Loop `loop` starts (`trips` iterations; None: a `while_loop`, counted when it ends):
        the calls from now on are inside it. Returns its entry for `iteration` / `leave`."""
        entry = [loop.id, 0, trips, len(self.ir.calls)]
        self.loops.append(entry)
        return entry

    def iteration(self, entry: list, i: int) -> None:
        entry[1] = i
        self.nest = tuple((e[0], e[1], e[2]) for e in self.loops)

    def leave(self, entry: list) -> None:
        stack = self.loops
        for j in range(len(stack) - 1, -1, -1):
            if stack[j] is entry:
                del stack[j]
                break
        self.nest = tuple((e[0], e[1], e[2]) for e in stack)
        if entry[2] is None:  # a while_loop: its trip count is known now
            n, lid = entry[1] + 1, entry[0]
            for c in self.ir.calls[entry[3] :]:
                if any(x[0] == lid for x in c.nest):
                    c.nest = tuple((a, b, n if a == lid else t) for a, b, t in c.nest)

    def site_loop(self, kind: str, frame) -> Loop:
        """The Loop of the statement at `frame`'s current instruction (one per statement)."""
        if self._frame_of is not None:
            frame = self._frame_of(frame)
        if frame is None:
            key, code = ("?", kind), None
        else:
            code = frame.f_code
            key = (id(code), frame.f_lasti)
        hit = self._loop_sites.get(key)
        if hit is None or hit[0] is not code:
            if code is None:
                var, line = "", "?"
            else:
                var, line = _loop_var(code, frame.f_lasti), f"{os.path.basename(code.co_filename)}:{frame.f_lineno}"
            lp = Loop(len(self.ir.loops), kind, var, line)
            self.ir.loops.append(lp)
            hit = self._loop_sites[key] = (code, lp)
        return hit[1]

    # ------------------------------------------------------------------ allocations
    def number(self, block, kind, placed: bool) -> int:
        block.pass_ = self
        s = block.seq = self.seq
        self.seq = s + 1
        buffer, shape, dtype = kind if kind is not None else ("?", (), "?")
        self.ir.tiles.append(
            Tile(s, buffer, tuple(shape), str(dtype), block.row_bytes, placed, block.label, self.calls)
        )
        return s

    def new_tile(self, ctx, alloc, row: int, label: str, block, kind=None) -> tuple[int, int]:
        s = self.number(block, kind, False)
        if self.mode == "record":
            return ctx._alloc_evicting(alloc, row, label)
        got = alloc.try_alloc(row, label)
        if got is None:
            if row > alloc.capacity:
                return alloc.alloc(row, label)  # (the precise error)
            # this trace's program is lowered again (`lowering.py`, `liveness.Placer`): a range
            # of the tiles least recently used keeps it going; only tiles one instruction names
            # at once must not share bytes here (the walk tells them apart by address)
            got = self._evict_lru(alloc, row, label)
        self.plan_pos.append(len(ctx.program))
        self.plan_off.append(got[1])
        site = ctx.site  # (the line the copies a placement adds are named after)
        self.plan_site.append(site if site is not None else (self._where(1) if self._where else "?"))
        res = self._resident.get(id(alloc))
        if res is None:
            res = self._resident[id(alloc)] = {}
        res[s] = got[0]
        return got

    def _evict_lru(self, alloc, row: int, label: str) -> tuple[int, int]:
        live = alloc.live
        tiles = self.ir.tiles
        res = self._resident.setdefault(id(alloc), {})
        for s in [s for s, key in res.items() if key not in live]:
            del res[s]  # (freed when the kernel dropped it)
        order = sorted((tiles[s].uses[-1] if tiles[s].uses else tiles[s].born - 1, s) for s in res)
        for _, s in order:
            alloc.free(res.pop(s))
            got = alloc.try_alloc(row, label)
            if got is not None:
                return got
        return alloc.place(0, row, label), 0

    def placed(self, block, kind=None, at=None) -> None:
        """An explicitly placed tile; `at`: (program position, first partition, byte offset)."""
        self.number(block, kind, True)
        if self.mode == "plan":
            pos, start, off = at if at is not None else (-1, 0, None)
            self.plan_pos.append(pos)
            self.plan_off.append(off)
            self.plan_site.append("?")
            if start:
                self.plan_p0[len(self.plan_off) - 1] = start
            if at is None:
                self.unwalkable = self.unwalkable or f"an explicitly placed tile ({block.label})"
