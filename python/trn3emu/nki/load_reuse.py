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

Which idle tiles are kept: the compiler hoisted a load whose HBM view does not change with a
loop's iteration; it kept no other load's result past its last use. So each load site (the call
of `nl.load` in the kernel's source, with its occurrence in the iteration) is classified by the
views it loads in the legacy `affine_range` / `sequential_range` loops around it (`ctx.loop_iters`):
while unclassified, its tiles are kept idle; a site that loads the same view in two consecutive
iterations of one of its loops (the same iteration of the others) is loop-invariant, and its
tiles are kept idle from then on; a site whose view changed with every one of its loops is
iteration-varying, and keeps at most the tiles it loaded in the current iteration (another load
of the same view in that iteration still reads them), or none once classified if no load ever
read one of its tiles (the kernel has no such second load). A load outside such loops is not
classified. Without this, the tiles of a kernel that never reloads (RoPE's per-head loads) filled
SBUF until memory was full: nothing reused, a slower trace, and the allocator reusing each freed
range at once, which serialised the loads behind the previous iteration's readers (RoPE 64 x 4096
x 128: modelled 12.4 ms instead of the 7.2 ms of the program without the pass).

The assignment form `tile[...] = nl.load(src)` writes the tile the kernel named: it is served
only when that same view of that same tile already holds the load (an earlier `tile[...] =
nl.load(src)` of the same HBM view and dtype, no write to the tile or to the HBM range since,
same cross-core rule): the DMA would rewrite the bytes the tile holds, so it is dropped (the
pattern of a tile allocated outside a loop and reloaded inside it). Such an entry does not keep
the kernel's tile alive and never serves a value-form load.
"""

from __future__ import annotations

import sys
import weakref

from . import toolchain
from ._kernel import END_OF_TRACE, ON_FULL, NkiTensor, TraceContext, _Blocks, _hbm_span, tracing, user_frame
from .value_reuse import CROSS_CORE  # (instructions that order this core against others)


class _Entry:
    __slots__ = ("own", "tensor", "handle", "span", "seen", "site", "hid")

    def __init__(self, own, tensor, handle, span, seen, site=None) -> None:
        self.own, self.tensor, self.handle, self.span, self.seen = own, tensor, handle, span, seen
        self.site = site  # (the `_Site` whose load it holds, if known)
        self.hid = id(handle())  # (its key in `LoadCache.handles`, also once the handle is gone)


#: a load site's classes: not known yet, loop-invariant (its tiles kept idle), iteration-varying
UNKNOWN, INVARIANT, VARYING = 0, 1, 2


class _Site:
    """What one load site (code object, instruction offset) loaded: `views` ((iterations,
    occurrence) -> key) until it is classified; `varying` a bit per loop level found to change
    its view; `kept` the keys of its cached tiles with the iterations they were loaded in;
    `served` whether a load was ever read from one of its tiles."""

    __slots__ = ("state", "views", "varying", "counts", "kept", "served")

    def __init__(self) -> None:
        self.state, self.varying, self.served = UNKNOWN, 0, False
        self.views: dict | None = {}
        self.counts: dict = {}
        self.kept: list = []

    def occurrence(self, at: tuple) -> int:
        """This load's occurrence among the site's loads in iteration `at` (0 for the first)."""
        counts = self.counts
        if counts and at not in counts:
            counts.clear()  # (a new iteration: the earlier ones are not counted again)
        n = counts.get(at, 0)
        counts[at] = n + 1
        return n

    def classify(self, at: tuple, n: int, key) -> None:
        """Compare the view `key` loaded at (`at`, `n`) with the one loaded one iteration earlier
        of each loop level (same iteration of the others, same occurrence)."""
        views = self.views
        views[(at, n)] = key
        for j, i in enumerate(at):
            if i and not (self.varying >> j) & 1:
                prev = views.get((at[:j] + (i - 1,) + at[j + 1 :], n))
                if prev is None:
                    continue
                if prev == key:
                    self.state, self.views = INVARIANT, None
                    return
                self.varying |= 1 << j
        if self.varying == (1 << len(at)) - 1:
            self.state, self.views = VARYING, None


class LoadCache:
    """One program's reusable loads: key -> `_Entry`, least recently used first."""

    def __init__(self, ctx: TraceContext) -> None:
        self.program = ctx.program
        grid = ctx.launch.grid
        #: more than one program in the launch (`_cross_core` may hold; the grid is the launch's)
        self.multi = (len(grid) != 1 or grid[0] > 1) and any(g > 1 for g in grid)
        self.entries: dict = {}
        #: id(handle) -> key, for the write watch
        self.handles: dict[int, tuple] = {}
        #: load site -> `_Site`
        self.sites: dict = {}

    def keep(self, site: _Site, key, at: tuple | None) -> None:
        """A tile of `site` loaded in iteration `at` is cached (`key` None: none): an
        iteration-varying site keeps only those of the current iteration."""
        kept = site.kept
        if site.state == VARYING and kept:
            entries = self.entries
            stay = []
            for k, a in kept:
                if a == at:
                    stay.append((k, a))
                elif k in entries and entries[k].own is not None:
                    self.drop(k)
            kept[:] = stay
        if key is not None and site.state != INVARIANT:  # (an invariant site's: the LRU release alone)
            kept.append((key, at))

    def drop(self, key) -> None:
        e = self.entries.pop(key, None)
        if e is not None and self.handles.get(e.hid) == key:
            del self.handles[e.hid]

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
    t = src._t if type(src) is NkiTensor else src.tensor  # (a subclass's view may check bounds)
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
    """Whether this program issued a cross-core synchronisation (in a launch of many programs:
    `LoadCache.multi`, asked first)."""
    return not CROSS_CORE.isdisjoint(ctx.program.opcodes)


class Fresh:
    """The `Pending(fresh=)` of `nl.load(src)`: `tile(spec)` is (the cached tile, True) when the
    load can be served from SBUF, else (a new tile for the DMA, False), or (None, False) when the
    pass does not apply; `issued(tile)` caches the tile once its DMA is issued."""

    __slots__ = ("src", "odt", "key", "site", "at")

    def __init__(self, src: NkiTensor, odt, ctx: TraceContext | None = None) -> None:
        self.src, self.odt, self.key = src, odt, None
        if ctx is None:
            ctx = tracing()
        iters = ctx.loop_iters if ctx is not None else None
        if iters:  # (the load's site and iteration, in legacy loops: `_Site`)
            f = ctx.user_f  # (the kernel's frame that called nl.load: `language._checked`)
            if f is None:
                f = user_frame(sys._getframe(1))
            self.site = (f.f_code, f.f_lasti) if f is not None else None
            self.at = tuple(iters)
        else:
            self.site = self.at = None

    def tile(self, spec):
        ctx = tracing()
        if ctx is None or (ctx.ir is not None and ctx.ir.liveness) or not toolchain.enabled("load_reuse", ctx):
            return None, False  # (not with the liveness allocation pass: it places tiles itself)
        key = _key(self.src, self.odt)
        if key is None:
            return None, False
        cache = ctx._load_cache
        if cache is None or cache.program is not ctx.program:
            cache = _cache(ctx)
        if cache.multi and _cross_core(ctx):
            cache.entries.clear()
            cache.handles.clear()
            return None, False
        e = cache.entries.get(key)
        if e is not None:
            if e.own is not None and e.handle() is None and not _written(ctx, e):
                handle = _Blocks(e.own)
                handle.written = True  # (the DMA wrote it: not a fresh buffer for nl.loop_reduce)
                if cache.handles.get(e.hid) == key:
                    del cache.handles[e.hid]
                e.handle, e.hid = weakref.ref(handle), id(handle)
                cache.handles[e.hid] = key
                cache.entries[key] = cache.entries.pop(key)  # most recently used last
                ctx.program.loads_reused += 1
                if e.site is not None:
                    e.site.served = True
                return NkiTensor(e.tensor, "sbuf", handle, ""), True
            cache.drop(key)  # stale, or still held by the kernel: a new load replaces it
        shape, dtype, buf = spec
        if self.site is not None:
            site = cache.sites.get(self.site)
            if site is None:
                site = cache.sites[self.site] = _Site()
            if site.state == UNKNOWN:  # (once classified, its loads are not counted: `classify` only reads counts)
                site.classify(self.at, site.occurrence(self.at), key)
            if site.state == VARYING and not site.served:  # (nothing of it was ever read again)
                if site.kept:
                    cache.keep(site, None, None)
                self.site = None
                return ctx.tile(shape, dtype, buf, ""), False
            self.site = site
        self.key = key
        return ctx.tile(shape, dtype, buf, ""), False  # (`nl.ndarray(shape, dtype=, buffer=)`'s own path)

    def issued(self, tile: NkiTensor) -> None:
        if self.key is None:
            return
        ctx = tracing()
        if ctx is None:
            return
        cache = _cache(ctx)
        own = tile._block
        handle = _Blocks(own)
        handle.written = True
        tile._block = handle
        span = _hbm_span(self.src.tensor)
        site = self.site if isinstance(self.site, _Site) else None
        cache.entries[self.key] = _Entry(own, tile._t, weakref.ref(handle), span, len(ctx.hbm_writes), site)
        cache.handles[id(handle)] = self.key
        if site is not None:
            cache.keep(site, self.key, self.at)
        self.src = self.site = None


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
    if cache.multi and _cross_core(ctx):
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
    old = cache.handles.get(id(dst._block))  # one entry per tile: its last assignment load
    if old is not None:
        cache.drop(old)
    cache.drop(fresh.key)  # (another tile's entry for this view: replaced)
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
