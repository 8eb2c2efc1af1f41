"""Pending results: the faithful lowering of `dst[...] = op(...)` and `psum[...] += matmul(...)`.

A value-returning call whose result the kernel usually assigns straight away (`nl.load`,
`nl.matmul`, the legacy dialect's PSUM results of `nc_matmul` / PE `nc_transpose`) returns a
`Pending` tile: its last instruction is not issued yet.

- `tile[...] = nl.load(src)` issues that one DMA with `tile` as its dst (no temporary tile, no
  copy), as the compiler does; likewise `psum[...] = nl.matmul(...)` / `nisa.nc_matmul(...)`.
- `psum[...] += nisa.nc_matmul(a, b)` / `+= nl.matmul(...)` issues one accumulating matmul
  (`accumulate=True`) into `psum`, not a matmul into a temporary plus a copy and an add.
- Any other use of the result (reading its shape, passing it to an instruction), or the kernel's
  next instruction, issues it into a fresh tile first, so instructions keep their program order.
  A PSUM result never used and not followed by another instruction is not issued; a load is
  issued when the kernel body returns (its operands are checked like every instruction's).
- Pass `inplace_assign` (`toolchain.py`; legacy kernels): the legacy dialect's value-returning
  `nisa.*` / `nl.*` results are pending too, so `t[...] = nisa.tensor_tensor(a, b, op)` is one
  instruction writing `t`, as the compiler emits it, wherever that gives the same bits
  (`InPlace`): otherwise the result goes to a fresh tile and is copied, as written.
"""

from __future__ import annotations

from ..errors import EmuError
from . import _emit, indexing, load_reuse, passes, record, zero_fill
from . import isa as nisa
from ._kernel import DTYPES, END_OF_TRACE, NkiTensor, block_of, current, tracing

_new = object.__new__

#: float dtypes an fp32 result may be written to directly (one RNE rounding either way)
_NARROW_FLOATS = frozenset({"bfloat16", "float16"})


class InPlace:
    """How a pending result of an `inplace_assign` op may be written into an assignment target:
    `operands` (the op's tensor operands, for aliasing), `elementwise` (element i of the result
    reads only element i of each operand of its shape: an operand that is exactly the target's
    view may be overwritten in place), `fp32_alu` (the engine computes in fp32 and rounds once
    when writing: an fp32 result copied to a bf16 / fp16 target is the same as writing it there)."""

    __slots__ = ("operands", "elementwise", "fp32_alu")

    def __init__(self, operands, elementwise: bool, fp32_alu: bool) -> None:
        self.operands = tuple([o for o in operands if isinstance(o, NkiTensor)])
        self.elementwise, self.fp32_alu = elementwise, fp32_alu

    def dtype_ok(self, have, want) -> bool:
        if have == want:
            return True
        if str(have) != "float32" or str(want) not in _NARROW_FLOATS or not self.fp32_alu:
            return False
        if any(str(o.dtype) not in ("float32", "bfloat16", "float16", "tfloat32") for o in self.operands):
            return False  # an integer source converted twice could round twice
        return current().device.numerics["rounding"] != "stochastic"  # (SR draws differ per engine)

    def alias_ok(self, dst) -> bool:
        d = _span(dst)
        db = _own(dst._block)
        for o in self.operands:
            ob = block_of(o)
            if ob is None:
                continue  # an operand not issued yet goes to a fresh tile (reading it here would issue it)
            if o.buffer != dst.buffer or not _overlap(d, _span(o)):
                continue
            ob = _own(ob)
            if ob is not db and not getattr(ob, "placed", False) and not getattr(db, "placed", False):
                # two automatic allocations never share bytes (the allocator's rule); only the
                # liveness pass's first trace overlaps them, and must decide as the second does
                continue
            if not (self.elementwise and o.same_view(dst)):
                return False
        return True


def _own(block):
    """The allocation a view's `_block` stands for (a view with run-time operands wraps it)."""
    keep = getattr(block, "keep", None)
    return keep[0] if keep else block


def _span(t: NkiTensor):
    """(core, partitions [lo, hi), bytes [lo, hi)) an on-chip view can touch; None: anywhere."""
    v = t._t
    if v.mem == "hbm" or v.dyn is not None:
        return None
    es = v.itemsize
    lo = hi = 0
    for n, st in zip(v.shape[1:], v.strides[1:]):
        span = (n - 1) * st
        lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    step = max(1, abs(v.strides[0]))
    return v.core, (v.start, v.start + (v.shape[0] - 1) * step + 1), (v.offset + lo * es, v.offset + (hi + 1) * es)


def _overlap(a, b) -> bool:
    if a is None or b is None:
        return True
    return a[0] == b[0] and a[1][0] < b[1][1] and b[1][0] < a[1][1] and a[2][0] < b[2][1] and b[2][0] < a[2][1]


def _flush_pending() -> None:
    """Issue the trace's pending results (before any other instruction, so program order is kept)."""
    ctx = tracing()
    pending = (ctx if ctx is not None else current()).pending
    while pending:
        pending[0]._issue(None)


class Pending(NkiTensor):
    """A result whose last instruction is not issued yet (`emit(dst)` issues it into dst;
    `accumulate(dst)`, when given, issues it adding into dst). After a fused assignment the
    result is a view of the tile it was written into."""

    # `_done`: issued (`_t` / `_block` set); read instead of the unset slot, whose failed lookup
    # raises and catches an AttributeError on every use of a pending result; `_ip` the `inplace`
    # argument (not `_inplace`: that is `NkiTensor`'s method behind `t += u`, which the slot hid)
    __slots__ = ("_spec", "_emit", "_ctx", "_acc", "_origin", "_ip", "_fresh", "_site", "_done", "_part")

    def __init__(self, spec, emit, accumulate=None, origin: str = "", inplace=None, fresh=None, partial=False) -> None:
        # `_t` / `_block` stay unset until issued; `origin` names the call that made the result;
        # `inplace` (an `InPlace`, or the tuple of its arguments: most results are never assigned,
        # so it is built when an assignment asks): a result the `inplace_assign` pass made pending, which fuses
        # into a target of another dtype or aliasing an operand only where that is exact;
        # `fresh.tile(spec)`: (the tile a use other than an assignment issues into, whether it
        # holds the result already), or (None, False): a new tile; `fresh.issued(tile)` after
        result(current(), spec, emit, origin, inplace, fresh, accumulate, partial, self)

    @property
    def shape(self) -> tuple:
        if not self._done:
            self._issue(None)
        return self._t.shape

    @property
    def dtype(self):
        if not self._done:
            self._issue(None)
        return DTYPES[self._t.dtype]

    def __getattr__(self, name: str):
        if name in ("_t", "_block"):
            self._issue(None)
            return object.__getattribute__(self, name)
        # (as a missing slot reads: `_kernel.tile_attribute_error` words it at the launch)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)

    def _pending(self) -> bool:
        return not self._done

    def _unlist(self) -> list:
        """Issue the results made before this one (program order), take this one off the list,
        and return the results made after it: they stay pending, but not while this one's own
        instructions are issued (one of them may read this result: it must exist by then)."""
        pending = self._ctx.pending
        while pending and pending[0] is not self:
            pending[0]._issue(None)
        if pending and pending[0] is self:
            del pending[0]
        later = pending[:]
        pending.clear()
        return later

    def _issue(self, dst, accumulate: bool = False) -> None:
        pending = self._ctx.pending
        if len(pending) == 1 and pending[0] is self:  # (the usual case: `_unlist`'s answer is [])
            pending.clear()
            self._issue_now(dst, accumulate)
            return
        later = self._unlist()
        try:
            self._issue_now(dst, accumulate)
        finally:
            self._ctx.pending[:0] = later

    def _issue_now(self, dst, accumulate: bool) -> None:
        fresh = self._fresh if dst is None else None
        if fresh is not None:
            dst, reused = fresh.tile(self._spec)
            if reused:  # (`load_reuse`: the tile already holds the result; no instruction)
                if self._ctx.ir is not None:  # (the kernel IR counts it)
                    record.decided(self._ctx, "load_reuse", "loads served from an SBUF tile (no DMA)")
                self._t, self._block, self._done = dst._t, dst._block, True
                self._emit = self._acc = self._fresh = self._ip = None
                return
        ctx = tracing()
        if ctx is None:
            ctx = current()  # (raises: not tracing)
        if dst is None:
            shape, dtype, buf = self._spec
            dst = ctx.tile(shape, dtype, buf, "")  # (`nl.ndarray(shape, dtype=, buffer=)`'s own path)

        active_masks = ctx.masks
        masks = active_masks[:] if active_masks else None  # issued as written: outside any mask= of its user
        if masks:
            active_masks.clear()
        site, ctx.site = ctx.site, self._site
        try:
            (self._acc if accumulate else self._emit)(dst)
        except EmuError as e:  # name the call that made the result, not the one that used it
            notes = getattr(e, "__notes__", ())
            if self._origin and not any("issued by " in n for n in notes):
                e.add_note(f"  issued by {self._origin} (part of its lowering)")
            raise
        finally:
            if masks or active_masks:
                active_masks[:] = masks or ()
            ctx.site = site
        if fresh is not None and dst is not None:
            fresh.issued(dst)
        self._t, self._block, self._done = dst._t, dst._block, True
        self._ap = dst._ap if type(dst) is NkiTensor else None  # (a tile subclass may not know it)
        # issued: drop the operands the closures hold, so their tiles die when the kernel drops them
        self._emit = self._acc = self._fresh = self._ip = None

    def _matches(self, dst) -> bool:
        shape, dtype, buf = self._spec
        if not self._pending() or indexing.active() or not isinstance(dst, NkiTensor) or isinstance(dst, Pending):
            return False
        if dst.buffer != buf or tuple(dst.shape) != tuple(shape):
            return False
        ip = self._ip
        if ip is None:
            return dst.dtype == dtype
        if type(ip) is tuple:  # (its arguments: built when an assignment first asks)
            ip = self._ip = InPlace(*ip)
        return ip.dtype_ok(dtype, dst.dtype) and ip.alias_ok(dst)

    def _fuse_into(self, dst) -> bool:
        """`dst[...] = self`: issue into dst when it is the same kind of tile; else False."""
        if not self._matches(dst) or not self._pending():  # (issued meanwhile: the caller copies)
            return False
        fresh = self._fresh
        if fresh is not None and load_reuse.into(fresh, dst):  # (pass load_reuse: dst holds it)
            self._ctx.pending[:0] = self._unlist()  # (earlier pending results issue first, as in _issue)
            if self._ctx.ir is not None:  # (the kernel IR counts it)
                record.decided(self._ctx, "load_reuse", "assignment loads dropped (the tile holds them)")
            self._t, self._block, self._done = dst._t, dst._block, True
            self._emit = self._acc = self._fresh = self._ip = None
            return True
        if self._ip is not None and self._ctx.ir is not None:  # (the kernel IR notes it)
            n = record.calls_so_far(self._ctx)
            self._issue(dst)
            record.decided(self._ctx, "inplace_assign", "written into the assignment target", n)
            return True
        self._issue(dst)
        if fresh is not None:
            load_reuse.issued_into(fresh, dst)
        return True

    def _accumulate_into(self, dst) -> bool:
        """`dst[...] += self`: one accumulating instruction into dst when possible; else False.
        Pass `reduce_init` (legacy kernels): into a buffer no instruction wrote yet the
        accumulation starts from its first value, a matmul that overwrites, as nki-samples'
        hardware-checked allocated kernels need (`res_psum[0] += nc_matmul(...)` into an
        `nl.ndarray` PSUM tile; docs/nki.md)."""
        if self._acc is None or not self._matches(dst):
            return False
        blk, ctx = dst._block, self._ctx
        if ctx.fills:  # (pass zero_fill: `nl.zeros` then `+=`, the group's first matmul)
            later = self._unlist()  # (the results made before this one first: one may read the zeros)
            try:
                if zero_fill.take(ctx, dst, whole=not self._part):
                    n = record.calls_so_far(ctx)
                    self._issue_now(dst, False)
                    record.decided(ctx, "zero_fill", "PSUM zero fills dropped: the first matmul overwrites", n)
                    return True
                later.insert(0, self)  # (not taken: issued below, as without the pass)
            finally:
                ctx.pending[:0] = later
        if (
            blk is not None
            and not getattr(blk, "written", False)
            and ctx.launch.kernel.options.get("dialect") == "legacy"
            and passes.enabled(ctx.launch.kernel, "reduce_init")
        ):
            n = record.calls_so_far(ctx)
            self._issue(dst)
            record.decided(ctx, "reduce_init", "accumulations into unwritten PSUM started from their first value", n)
            return True
        self._issue(dst, accumulate=True)
        return True


def result(ctx, spec, emit, origin: str, inplace=None, fresh=None, accumulate=None, partial=False, p=None) -> Pending:
    """`Pending(spec, emit, accumulate, origin, inplace, fresh, partial)` in trace `ctx` (the
    current one), without the class call's keyword binding (nl ops make one per call); `p`: the
    instance to fill (`Pending.__init__`'s)."""
    if p is None:
        p = _new(Pending)
    p.buffer, p.name, p._ap = spec[2], "", None  # (`_ap`: the view's pattern once issued)
    p._spec, p._emit, p._ctx, p._acc, p._origin = spec, emit, ctx, accumulate, origin
    p._ip, p._fresh, p._done = inplace, fresh, False
    p._part = partial  # (its instruction may write part of the tile only: a legacy mask=)
    uf = ctx.user_f  # its instructions are named after this call's line (`_emit.site`)
    if uf is None:
        p._site = _emit.site(0, None)[0]
    else:  # (the kernel frame's sites, as `nki.isa` finds them: `_emit.kernel_site`)
        hit = ctx.site_hits.get(uf.f_lasti) if uf.f_code is ctx.site_code else None
        p._site = (hit if hit is not None else _emit.kernel_site(ctx, uf))[0]
    ctx.pending.append(p)
    return p


nisa._before_issue.append(_flush_pending)
nisa._issued_kind.append(Pending)


def _finish(ctx) -> None:
    """End of a program's trace: issue its pending loads (SBUF results), forget the rest."""
    for p in [p for p in ctx.pending if p._spec[2] == "sbuf"]:
        if p._pending():
            p._issue(None)
    ctx.pending.clear()  # unused PSUM results: never issued


END_OF_TRACE.append(_finish)
