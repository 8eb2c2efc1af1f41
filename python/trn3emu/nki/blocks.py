"""Legacy block tiles: `nl.ndarray((B0, B1, nl.par_dim(P), F...), buffer=nl.sbuf | nl.psum)`.

As the NKI allocation documents say (direct allocation guide, block dimension migration guide),
the block dimensions are logical: they count the (P, F) tiles of the tensor, not the physical
tiles allocated, and the compiler gives each block a physical tile for as long as it is live,
rotating buffers as the loops advance. Here:

- Every block is its own physical [P, F...] tile, allocated from the core's allocator when the
  kernel first touches it (a tile declared with `nl.zeros` / `nl.full` is filled then), so a block
  tile larger than SBUF runs as long as the blocks the kernel keeps live fit.
- When an allocation (of a block or of any other tile) finds the memory full, the least recently
  used block of any block tile whose physical tile no view holds any more is evicted: its range
  is freed and reused (the automatic synchronisation orders the reuse after the block's last
  access). The allocator's policy already rotates blocks over free memory while there
  is room, so evictions happen only under pressure.
- Using an evicted block again raises `CapacityError` (`nki_block_tile_overflow`) naming the tile:
  the kernel keeps more blocks live than fit (a block is dead once the kernel writes it whole
  again: `t[b] = value` over the whole block starts a new one, with no error).
- Direct allocation (`ncc.sbuf.alloc(func)`, `ncc.sbuf.mod_alloc(...)`, PSUM likewise) places
  block b where `func(b, P, bytes per partition)` says; those blocks are never evicted (blocks
  that share an address alias, as the author asked).

A view across several blocks (a slice or index expression in a block position, or the tile as a
whole operand) is not supported: the blocks are separate physical tiles. Fewer block indices than
block dims (`t[i]` of a (B0, B1, P, F) tile) give the block tile of the remaining block dims
(`BlockSlice`), whose blocks are the tile's own.
"""

from __future__ import annotations

import builtins
import itertools
import math
import sys
import weakref

from ..errors import CapacityError
from . import isa as nisa
from . import zero_fill as _zero_fill
from ._kernel import DTYPES, NkiTensor, block_of, current, not_supported, source_line, upcalls


class BlockTensor(NkiTensor):
    """A `(blocks..., par_dim(P), free...)` tile: one physical [P, free...] tile per block, made
    when first used. Indexing takes every block index first (`t[b]`, `t[b, 0:P, 0:F]`)."""

    __slots__ = (
        "_pd",
        "_bshape",
        "_pshape",
        "_dt",
        "_label",
        "_phys",
        "_use",
        "_evicted",
        "_init",
        "_placer",
        "_most",
        "__weakref__",
    )

    def __init__(self, shape: tuple, pd: int, dtype, buffer: str, name: str, placer=None) -> None:
        self.buffer, self.name, self._block = buffer, name, None
        self._pd = pd
        self._bshape = tuple(int(s) for s in shape[:pd])
        self._pshape = (int(shape[pd]),) + tuple(int(s) for s in shape[pd + 1 :])
        self._dt = DTYPES[str(dtype)] if str(dtype) in DTYPES else dtype
        self._label = (
            f"{name or 'tile'} {tuple(int(s) for s in shape)} {self._dt} (par_dim block tile) at {source_line()}"
        )
        self._phys: dict[tuple, NkiTensor] = {}
        self._use: dict[tuple, int] = {}
        self._evicted: set = set()
        self._init = None
        self._placer = placer
        self._most = 0
        ctx = current()
        if not hasattr(ctx, "_block_tiles"):
            ctx._block_tiles = weakref.WeakSet()
            ctx._block_ticks = itertools.count()
        ctx._block_tiles.add(self)

    # the tile as a whole is not one physical tile
    @property
    def _t(self):  # type: ignore[override]
        raise not_supported(
            "a par_dim block tile as a whole operand",
            "index one block (t[b]); its blocks are separate physical tiles",
            rule="nki_block_tile_index",
        )

    @property
    def shape(self) -> tuple:
        return self._bshape + self._pshape

    @property
    def dtype(self):
        return self._dt

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"BlockTensor({self._label})"

    def _split(self, key) -> tuple[tuple, tuple]:
        key = key if isinstance(key, tuple) else (key,)
        pd = self._pd
        if builtins.any(k is Ellipsis for k in key[:pd]):
            raise not_supported(
                "... in the index of a par_dim block tile", "index the block dims first", rule="nki_block_tile_index"
            )
        if len(key) < pd:
            raise not_supported(
                "indexing a par_dim block tile without all its block indices", rule="nki_block_tile_index"
            )
        b = []
        for i, k in enumerate(key[:pd]):
            if isinstance(k, slice) and k == slice(None) and self._bshape[i] == 1:
                k = 0
            if not isinstance(k, int) and not hasattr(k, "__index__"):
                raise not_supported(
                    f"a view across several blocks of a par_dim block tile (block index {k!r})",
                    "index one block at a time: the blocks are separate physical tiles",
                    rule="nki_block_tile_index",
                )
            k = int(k)
            n = self._bshape[i]
            if not -n <= k < n:
                raise IndexError(f"block index {k} out of range for block dim {i} of size {n} ({self._label})")
            b.append(k % n)
        return tuple(b), tuple(key[pd:])

    def __getitem__(self, key):
        k = key if isinstance(key, tuple) else (key,)
        if 0 < len(k) < self._pd and all(_is_index(x) for x in k):
            return BlockSlice(self, self._split(k + (0,) * (self._pd - len(k)))[0][: len(k)])
        b, rest = self._split(key)
        phys = self._get(b, whole_write=False)
        return phys[rest] if rest else phys[...]

    def __setitem__(self, key, value) -> None:
        b, rest = self._split(key)
        whole = not rest or self._covers(rest)
        old = self._phys.get(b)
        # a value that reads the block (`t[b] = nl.loop_reduce(...)`, `t[b] += x`) keeps its tile
        renew = whole and not isinstance(value, upcalls.loop_reduce)
        if renew and old is not None and block_of(value) is old._block:
            renew = False
        phys = self._get(b, whole_write=whole, renew=renew)
        upcalls.assign(phys[rest] if rest else phys[...], value)

    def _covers(self, rest: tuple) -> bool:
        """True when the index `rest` selects the whole [P, F...] block (a plain slice per dim)."""
        if builtins.any(k is Ellipsis for k in rest):
            return all(k is Ellipsis or k == slice(None) for k in rest)
        for k, n in zip(rest, self._pshape):
            if not isinstance(k, slice) or k.step not in (None, 1):
                return False
            lo, hi, _ = k.indices(n)
            if (lo, hi) != (0, n):
                return False
        return True

    # ------------------------------------------------------------------ physical tiles
    def _get(self, b: tuple, whole_write: bool, renew: bool = False) -> NkiTensor:
        ctx = current()
        phys = self._phys.get(b)
        if phys is not None and renew and ctx.ir is not None and ctx.ir.liveness:
            # allocation by liveness: a whole write starts a new value of the block, in a new
            # tile (the old one dies at its last use, `liveness.py`)
            phys = None
        if phys is None:
            if b in self._evicted and not whole_write:
                raise CapacityError(
                    f"{self._label} keeps more blocks live than fit: block {b} was evicted (its memory was "
                    f"reused for another tile when the {self.buffer.upper()} was full) and is used again at "
                    f"{source_line()}; the blocks live at once must fit (at most {self._peak()} did here)",
                    operand="shape",
                    rule="nki_block_tile_overflow",
                )
            self._evicted.discard(b)
            phys = self._new(ctx, b)
            self._phys[b] = phys
            self._most = max(self._most, len(self._phys))
            if self._init is not None and not whole_write:
                if not (self._init == 0 and self.buffer == "psum" and _zero_fill.defer(ctx, phys)):
                    nisa.memset(phys, value=self._init)  # (a PSUM zero fill may wait: pass zero_fill)
        self._use[b] = next(ctx._block_ticks)
        return phys

    def _peak(self) -> int:
        return max(len(self._phys), self._most)

    def _new(self, ctx, b: tuple) -> NkiTensor:
        blabel = f"block {b} of {self._label}"
        if self._placer is not None:
            return ctx.alloc(self._pshape, self._dt, self.buffer, self.name, self._placer(b), label=blabel)
        return ctx.alloc(self._pshape, self._dt, self.buffer, self.name, label=blabel)


def _is_index(k) -> bool:
    return not isinstance(k, (slice, bool)) and k is not Ellipsis and hasattr(k, "__index__")


class BlockSlice(BlockTensor):
    """`t[i]` of a block tile with more block dims than indices given (nki-samples' flash
    attention backward hands `dy_o_sum[i_q_head]` of a (heads, tiles, par_dim(P), 1) tile to a
    helper that indexes `[i, :, 0]`): the block tile of the remaining block dims, whose blocks
    are `t`'s own physical tiles (nothing is allocated or copied)."""

    __slots__ = ("_base", "_prefix")

    def __init__(self, base: BlockTensor, prefix: tuple) -> None:  # (not registered: t's blocks)
        self._base, self._prefix = base, prefix
        self.buffer, self.name, self._block = base.buffer, base.name, None
        self._pd = base._pd - len(prefix)
        self._bshape = base._bshape[len(prefix) :]
        self._pshape, self._dt, self._placer = base._pshape, base._dt, base._placer
        self._label = f"{base._label}, blocks {prefix}"

    def __getitem__(self, key):
        return self._base[self._prefix + (key if isinstance(key, tuple) else (key,))]

    def __setitem__(self, key, value) -> None:
        self._base[self._prefix + (key if isinstance(key, tuple) else (key,))] = value


def evict_one(ctx, alloc) -> bool:
    """Free the least recently used unheld block of a block tile in `alloc`'s memory; False when
    there is none."""
    tiles = getattr(ctx, "_block_tiles", None)
    if not tiles:
        return False
    buffer = "sbuf" if alloc is ctx.sbuf else "psum"
    cands = sorted(
        (
            (t._use.get(b, -1), id(t), t, b)
            for t in list(tiles)
            if t.buffer == buffer and t._placer is None
            for b in t._phys
        ),
        key=lambda c: (c[0], c[1]),
    )
    for _, _, t, b in cands:
        # held only by t._phys and getrefcount's argument: no view of the block is alive
        if sys.getrefcount(t._phys[b]._block) <= 2:
            t._evicted.add(b)
            t._phys.pop(b)
            return True
    return False


# What _kernel calls back (`_kernel.upcalls`): a full on-chip memory evicts a block.
upcalls.evict_one = evict_one
