"""Pass `zero_fill` (`passes.py`; legacy kernels): `nl.zeros` of a PSUM tile that an accumulating
matmul then writes whole opens the accumulation group: no memset, the first matmul overwrites.

The legacy tutorials zero a PSUM tile and accumulate into it (`res = nl.zeros(..., buffer=nl.psum)`
then `res[...] += nisa.nc_matmul(...)` / `nl.matmul`), yet a matmul accumulating onto PSUM that a
non-matmul instruction wrote is undefined on NeuronCore-v2/v3 (the `nc_matmul` reference: the
first matmul of a group must overwrite): what ran on trn1 was the matmul group alone, started by
an overwrite. A literal memset also costs VectorE time and, issued in program order on VectorE
after the previous tile's evacuation, keeps TensorE waiting for it at every tile (the published
fully optimised matmul tutorial, run unchanged: modelled 1.62x its measured time with the memsets,
1.01x without). The bits are the same either way: a column sum starts from +0.0, so it is never
-0.0, and `+0.0 + s == s`.

The fill is deferred: it is issued (a memset, as written) right before the first instruction
that names the tile otherwise (a read, another write, an accumulation into part of it); an
accumulating matmul into the whole tile drops it and overwrites. A tile that is never used gets
no fill. Switched off, or in NKI 0.6 kernels (whose compiler keeps the developer's
instructions), `nl.zeros` issues its memset at once.
"""

from __future__ import annotations

import weakref

from . import isa as nisa
from . import toolchain
from ._kernel import END_OF_TRACE, NkiTensor, TraceContext, _Block, block_of


def defer(ctx: TraceContext, t: NkiTensor) -> bool:
    """`nl.zeros` of PSUM tile `t`: True when its fill is deferred (pass on, a plain tile)."""
    blk = t._block
    if type(blk) is not _Block or not toolchain.enabled("zero_fill"):
        return False
    ctx.fills[id(blk)] = (weakref.ref(blk), t._t, t.name)
    return True


def _block_of(v):
    b = block_of(v)  # (not `v._block`: that would issue a pending result)
    while b is not None and type(b) is not _Block:  # (wrappers keep the view's own block)
        keep = getattr(b, "keep", None)
        b = keep[0] if keep else None
    return b


def _issue(ctx: TraceContext, key: int) -> None:
    ref, t, name = ctx.fills.pop(key)
    blk = ref()
    if blk is not None:
        nisa.memset(NkiTensor(t, "psum", blk, name), value=0.0)


def _before(ctx: TraceContext, args: tuple, kwargs: dict) -> None:
    """Before an instruction: issue the deferred fill of every tile it names."""
    fills = ctx.fills
    for v in (*args, *kwargs.values()) if kwargs else args:
        b = _block_of(v)
        if b is not None and id(b) in fills and fills[id(b)][0]() is b:
            _issue(ctx, id(b))
            if not fills:
                return


def take(ctx: TraceContext, dst: NkiTensor, whole: bool = True) -> bool:
    """`dst[...] += matmul`: True when dst is a whole tile whose fill is deferred (dropped now:
    the matmul overwrites); the deferred fill of a tile the matmul covers only part of (a view of
    it, or `whole` False: a masked matmul) is issued."""
    fills = ctx.fills
    b = _block_of(dst)
    if b is None or id(b) not in fills or fills[id(b)][0]() is not b:
        return False
    t, v = fills[id(b)][1], dst._t
    if whole and (v.offset, v.start, v.shape, v.strides) == (t.offset, t.start, t.shape, t.strides):
        del fills[id(b)]
        return True
    _issue(ctx, id(b))
    return False


def _finish(ctx: TraceContext) -> None:
    ctx.fills.clear()  # (tiles never used: no fill)


nisa._before_operands.append(_before)
END_OF_TRACE.append(_finish)
