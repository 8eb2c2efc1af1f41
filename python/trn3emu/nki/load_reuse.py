"""Pass `load_reuse` (`toolchain.py`; legacy kernels): a load of HBM bytes that an earlier load of
this program already brought into SBUF, unchanged since, reads that tile instead of HBM.

The legacy compiler hoisted loop-invariant loads out of `affine_range` loops (a weight loaded in a
row loop was loaded once while it fitted in SBUF). Tracing unrolls loops, so the same effect is a
per-program cache of the tiles `nl.load(src)` returned, keyed by the exact HBM view and the
result's dtype. A load is served from the cache only when all of these hold, so results never
change:

- the earlier tile is no longer referenced by the kernel (its Python references, and every view's,
  are gone): the reused tile cannot be written through another name the kernel still holds;
- no instruction wrote the tile since (a write through the kernel's references drops the entry:
  `watch`);
- no instruction of this program wrote any byte of the HBM range since (`TraceContext.hbm_writes`:
  DMAs from any engine's queue); in a multi-program launch, no cross-core synchronisation
  (barrier, send/receive, collective) was issued since the trace began: another core's writes are
  ordered by those, and a reuse after one could miss them;
- the tile fits: the cache never makes an allocation fail or a block tile's block be evicted.
  When memory is full, idle cached tiles are released first (least recently used first). A trace
  that runs the liveness allocation pass (`liveness.py`, which places and spills tiles itself)
  does not reuse loads here: its walk finds them on the IR (`value_reuse.plan_ir`).

The assignment form `tile[...] = nl.load(src)` writes the tile the kernel named: it is served
only when that same view of that same tile already holds the load (an earlier `tile[...] =
nl.load(src)` of the same HBM view and dtype, no write to the tile or to the HBM range since,
same cross-core rule): the DMA would rewrite the bytes the tile holds, so it is dropped (the
pattern of a tile allocated outside a loop and reloaded inside it). Such an entry does not keep
the kernel's tile alive and never serves a value-form load.
"""

from __future__ import annotations

import weakref

from . import toolchain
from ._kernel import END_OF_TRACE, ON_FULL, NkiTensor, TraceContext, _Blocks, _hbm_span, tracing
from .value_reuse import CROSS_CORE  # (instructions that order this core against others)


class _Entry:
    __slots__ = ("own", "tensor", "handle", "span", "seen")

    def __init__(self, own, tensor, handle, span, seen) -> None:
        self.own, self.tensor, self.handle, self.span, self.seen = own, tensor, handle, span, seen


class LoadCache:
    """One program's reusable loads: key -> `_Entry`, least recently used first."""

    def __init__(self, ctx: TraceContext) -> None:
        self.program = ctx.program
        self.entries: dict = {}
        #: id(handle) -> key, for the write watch
        self.handles: dict[int, tuple] = {}

    def drop(self, key) -> None:
        e = self.entries.pop(key, None)
        if e is not None:
            self.handles.pop(id(e.handle()), None) if e.handle() is not None else None

    def release_idle(self) -> bool:
        """Free the least recently used cached tile the kernel no longer holds; False if none."""
        for key, e in self.entries.items():
            if e.handle() is None:
                self.drop(key)
                return True
        return False


def _cache(ctx: TraceContext) -> LoadCache:
    c = ctx._load_cache
    if c is None or c.program is not ctx.program:  # (a device loop's next segment: a new program)
        c = ctx._load_cache = LoadCache(ctx)
    return c


def _key(src: NkiTensor, odt) -> tuple | None:
    t = src.tensor
    if t.mem != "hbm" or t.dyn is not None:
        return None
    blk = t.block
    return (t.offset, t.shape, t.strides, t.dtype, str(odt), id(blk) if blk is not None else None)


def _written(ctx: TraceContext, e: _Entry) -> bool:
    lo, hi = e.span
    writes = ctx.hbm_writes
    hit = any(a < hi and lo < b for a, b in writes[e.seen :])
    e.seen = len(writes)
    return hit


def _cross_core(ctx: TraceContext) -> bool:
    grid = ctx.launch.grid
    return (
        (len(grid) != 1 or grid[0] > 1) and any(g > 1 for g in grid) and not CROSS_CORE.isdisjoint(ctx.program.opcodes)
    )


class Fresh:
    """The `Pending(fresh=)` of `nl.load(src)`: `tile(spec)` is (the cached tile, True) when the
    load can be served from SBUF, else (a new tile for the DMA, False), or (None, False) when the
    pass does not apply; `issued(tile)` caches the tile once its DMA is issued."""

    __slots__ = ("src", "odt", "key")

    def __init__(self, src: NkiTensor, odt) -> None:
        self.src, self.odt, self.key = src, odt, None

    def tile(self, spec):
        ctx = tracing()
        if ctx is None or (ctx.ir is not None and ctx.ir.liveness) or not toolchain.enabled("load_reuse"):
            return None, False  # (not with the liveness allocation pass: it places tiles itself)
        key = _key(self.src, self.odt)
        if key is None:
            return None, False
        cache = _cache(ctx)
        if _cross_core(ctx):
            cache.entries.clear()
            cache.handles.clear()
            return None, False
        e = cache.entries.get(key)
        if e is not None:
            if e.own is not None and e.handle() is None and not _written(ctx, e):
                handle = _Blocks(e.own)
                handle.written = True  # (the DMA wrote it: not a fresh buffer for nl.loop_reduce)
                e.handle = weakref.ref(handle)
                cache.handles[id(handle)] = key
                cache.entries[key] = cache.entries.pop(key)  # most recently used last
                ctx.program.loads_reused += 1
                return NkiTensor(e.tensor, "sbuf", handle, ""), True
            cache.drop(key)  # stale, or still held by the kernel: a new load replaces it
        shape, dtype, buf = spec
        self.key = key
        return ctx.tile(shape, dtype, buf, ""), False  # (`nl.ndarray(shape, dtype=, buffer=)`'s own path)

    def issued(self, tile: NkiTensor) -> None:
        ctx = tracing()
        if self.key is None or ctx is None:
            return
        cache = _cache(ctx)
        own = tile._block
        handle = _Blocks(own)
        handle.written = True
        tile._block = handle
        span = _hbm_span(self.src.tensor)
        cache.entries[self.key] = _Entry(own, tile._t, weakref.ref(handle), span, len(ctx.hbm_writes))
        cache.handles[id(handle)] = self.key
        self.src = None


def _view_key(t) -> tuple:
    return (t.offset, t.shape, t.strides, t.dtype)


def into(fresh: Fresh, dst: NkiTensor) -> bool:
    """`dst[...] = nl.load(src)`: True when dst (this view of this tile) already holds the load, so
    no DMA is needed; else False, and `fresh.key` is set for `issued_into`."""
    fresh.key = None
    ctx = tracing()
    if (
        ctx is None
        or (ctx.ir is not None and ctx.ir.liveness)
        or not toolchain.enabled("load_reuse")
        or dst._block is None
    ):
        return False
    key = _key(fresh.src, fresh.odt)
    if key is None:
        return False
    cache = _cache(ctx)
    if _cross_core(ctx):
        cache.entries.clear()
        cache.handles.clear()
        return False
    e = cache.entries.get(key)
    if e is not None and e.own is None and e.handle() is dst._block and _view_key(e.tensor) == _view_key(dst._t):
        if not _written(ctx, e):
            cache.entries[key] = cache.entries.pop(key)  # most recently used last
            ctx.program.loads_reused += 1
            return True
    if e is not None:
        cache.drop(key)
    fresh.key = key
    return False


def issued_into(fresh: Fresh, dst: NkiTensor) -> None:
    """Remember that dst holds the load just issued into it (a weak reference: the kernel's tile
    dies when the kernel drops it)."""
    ctx = tracing()
    if fresh.key is None or ctx is None:
        return
    cache = _cache(ctx)
    old = cache.handles.pop(id(dst._block), None)  # one entry per tile: its last assignment load
    if old is not None:
        cache.entries.pop(old, None)
    span = _hbm_span(fresh.src.tensor)
    cache.entries[fresh.key] = _Entry(None, dst._t, weakref.ref(dst._block), span, len(ctx.hbm_writes))
    cache.handles[id(dst._block)] = fresh.key


def watch(ctx: TraceContext, writes: frozenset, positions: tuple, args: tuple, kwargs: dict) -> None:
    """An instruction with operands `args` / `kwargs` writes the ones named in `writes` (at
    `positions` when passed positionally): a cached tile among them is stale."""
    cache = ctx._load_cache
    handles = cache.handles
    if not handles:
        return  # (nothing cached to make stale)
    if kwargs:
        for k in writes:  # (one or two names: dst, reduce_res)
            v = kwargs.get(k)
            if v is not None:
                _stale(cache, v)
    n = len(args)
    for i in positions:
        if i < n:
            v = args[i]
            b = getattr(v, "_block", None)  # (`_stale`'s first step inlined: a tile no entry names)
            if b is not None and (id(b) in handles or isinstance(b, _Blocks)):
                _stale(cache, v)


def _stale(cache: LoadCache, v) -> None:
    """`v` is written: drop the cache entry of its tile, if any."""
    b = getattr(v, "_block", None)
    while b is not None:
        key = cache.handles.get(id(b))
        if key is not None:
            e = cache.entries.get(key)
            if e is not None and e.handle() is b:
                cache.drop(key)
            break
        keep = b.keep if isinstance(b, _Blocks) else None  # views with run-time operands wrap the view's own block
        b = keep[0] if keep else None


def _release(ctx: TraceContext) -> bool:
    c = ctx._load_cache
    return c is not None and c.release_idle()


def _finish(ctx: TraceContext) -> None:
    ctx._load_cache = None


ON_FULL.append(_release)
END_OF_TRACE.append(_finish)
