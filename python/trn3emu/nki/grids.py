"""Grid views (NKI 2.34): `nl.tiles`, `nl.blocks`, `nl.alloc_tiles` and the classes `NkiGrid`,
`NkiTileGrid`, `NkiBlockGrid`.

A grid is a view of a tensor navigated in tile (or block) coordinates. It keeps, for every source
dimension, the element range its coordinates cover (`lo`..`hi`, `hi` clamped to the source), the
nominal extent of one cell (`cell`: a tile, or a block of tiles), the element step between two
selected coordinates (`step`: `cell` times a slice's step), how many coordinates are selected (`n`)
and whether the coordinate is still a grid dimension (`kept`) or was consumed by an index. An
untiled leading HBM dimension has cells of one element; indexing it drops the dimension from the
selection (one slab at a time). A run-time index (an int32 / uint32 SBUF scalar tile, an
`NkiScalar` or a `VirtualRegister`) consumes one coordinate whose start is known only on the
device: `.data` is then a view with a `scalar_offset`.

Creating and indexing a grid allocates nothing and emits nothing; `.data` is an ordinary
`NkiTensor` view of the source (docs/nki.md, "Grid views").
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import AddressError, ArgumentTypeError, DtypeError, MemorySpaceError, ShapeError
from ..tensor import Reg
from ._kernel import HBM_BUFFERS, ONCHIP, NkiTensor, as_dtype, current, not_supported

PMAX = 128


class _Dim:
    """One source dimension of a grid selection (see the module docstring)."""

    # dyn: a run-time index (its unit: one coordinate step, or one element with `elem`)
    __slots__ = ("lo", "hi", "cell", "step", "n", "kept", "tiled", "dyn", "elem")

    def __init__(self, lo, hi, cell, step, n, kept, tiled, dyn=None, elem=False) -> None:
        self.lo, self.hi, self.cell, self.step, self.n = lo, hi, cell, step, n
        self.kept, self.tiled, self.dyn, self.elem = kept, tiled, dyn, elem

    def copy(self) -> _Dim:
        return _Dim(self.lo, self.hi, self.cell, self.step, self.n, self.kept, self.tiled, self.dyn, self.elem)

    @property
    def dropped(self) -> bool:
        """An untiled dimension an index consumed: no longer part of the selection's shape."""
        return not self.kept and not self.tiled

    def extents(self) -> list[int]:
        """The element extent of each selected cell (clamped at `hi`)."""
        if self.dyn is not None:
            return [self.cell]
        return [min(self.cell, self.hi - (self.lo + j * self.step)) for j in range(self.n)]

    def extent(self) -> int:
        return sum(self.extents())

    def contiguous(self) -> bool:
        return self.n == 1 or self.step == self.cell


def _exact_shape(value, what: str, *, allow_none: bool = False) -> tuple | None:
    if value is None and allow_none:
        return None
    if type(value) is not tuple or not all(type(x) is int for x in value):
        raise ArgumentTypeError(
            f"{what} must be a tuple of Python ints, got {value!r}", operand=what, rule="nki_grid_view_shape_type"
        )
    if any(x <= 0 for x in value):
        raise ShapeError(
            f"{what} entries must be positive, got {value}", operand=what, rule="nki_grid_view_shape_value"
        )
    return value


class NkiGrid:
    """Base of `NkiTileGrid` and `NkiBlockGrid`: a tensor view in tile or block coordinates."""

    __slots__ = ("_src", "_dims", "_tile", "_rank2")

    def __init__(self, *_, **__) -> None:
        raise ArgumentTypeError(
            "grids come from nl.tiles(), nl.blocks() or nl.alloc_tiles(), not a constructor",
            rule="nki_grid_view_constructor",
        )

    @classmethod
    def _make(cls, src: NkiTensor, dims: list, tile: tuple, rank2=None, block: tuple | None = None):
        g = object.__new__(cls)
        g._src, g._dims, g._tile, g._rank2 = src, dims, tile, rank2
        if block is not None:
            g._block_shape = block
        return g

    # ------------------------------------------------------------------------------ attributes
    @property
    def shape(self) -> tuple:
        """Selected coordinates per remaining grid dimension (tiles, blocks or untiled slabs)."""
        return tuple(d.n for d in self._dims if d.kept)

    @property
    def tile_shape(self) -> tuple:
        """The nominal source-element shape of one tile."""
        return self._tile

    @property
    def element_shape(self) -> tuple:
        """The selected elements along each remaining source dimension (boundary cells clamped)."""
        return tuple(d.extent() for d in self._dims if not d.dropped)

    @property
    def index_step_elements(self) -> tuple:
        """Source elements between two neighbouring coordinates of each grid dimension."""
        return tuple(d.step for d in self._dims if d.kept)

    @property
    def is_remainder(self) -> bool:
        """Whether some selected tile or block is clamped at the source's boundary."""
        return any(e < d.cell for d in self._dims if not d.dropped for e in d.extents())

    @property
    def is_data_representable(self) -> bool:
        """Whether `data` can be one view: along each dimension the selected cells are adjacent
        (one coordinate, or a step-1 range), and an on-chip `alloc_tiles` selection stays in one
        row of partition tiles."""
        if not all(d.contiguous() for d in self._dims):
            return False
        if self._rank2 is not None:
            d0 = self._dims[0]
            tp = self._rank2[0]
            return d0.lo // tp == (d0.lo + d0.extent() - 1) // tp
        return True

    @property
    def buffer(self) -> str:
        return self._src.buffer

    @property
    def dtype(self):
        return self._src.dtype

    @property
    def data(self) -> NkiTensor:
        """The whole selection as one `NkiTensor` operand."""
        if not self.is_data_representable:
            raise ShapeError(
                f"{type(self).__name__}.data: the selection (element_shape {self.element_shape}) is not one "
                "access pattern: "
                + (
                    "its cells are not adjacent (a slice step > 1 over several cells)"
                    if not all(d.contiguous() for d in self._dims)
                    else "it spans rows of partition tiles of an on-chip alloc_tiles grid"
                )
                + "; index the cells one at a time",
                rule="nki_grid_view_data_not_representable",
            )
        dyn = [k for k, d in enumerate(self._dims) if d.dyn is not None]
        if dyn:
            return self._dynamic_data(dyn[0])
        if self._rank2 is not None:
            tp, storage = self._rank2
            d0 = self._dims[0]
            row = d0.lo // tp
            key = (slice(d0.lo - row * tp, d0.lo - row * tp + d0.extent()), row) + tuple(
                slice(d.lo, d.lo + d.extent()) for d in self._dims[1:]
            )
            return storage[key]
        key = tuple(d.lo if d.dropped else slice(d.lo, d.lo + d.extent()) for d in self._dims)
        return self._src[key]

    def _dynamic_data(self, k: int) -> NkiTensor:
        """The selection with the run-time start along source dim `k`: an `.ap` over the source
        with `scalar_offset` = the index, moving by one coordinate step per unit."""
        src, d = self._src, self._dims[k]
        if src.buffer in ONCHIP and k == 0:
            raise not_supported(
                "a run-time grid index along the partition dimension",
                "on-chip run-time offsets move along a free dimension",
                rule="nki_grid_view_runtime_index",
            )
        size = src.shape[k]
        if size % d.step:
            raise not_supported(
                f"a run-time grid index along dim {k} of {src.shape}",
                f"the dimension ({size}) is not a whole number of coordinate steps ({d.step}), so the last "
                "cell's extent is not known while tracing",
                rule="nki_grid_view_runtime_index",
            )
        strides = list(src.strides)
        if src.buffer in ONCHIP:
            blk = src._block
            strides[0] = blk.row_bytes // src.tensor.itemsize if blk is not None else 1
        pattern = [[strides[j], dj.extent()] for j, dj in enumerate(self._dims) if not dj.dropped]
        offset = sum(dj.lo * strides[j] for j, dj in enumerate(self._dims))
        base = src if d.elem else src.reshape_dim(k, (size // d.step, d.step))
        return base.ap(pattern or [[1, 1]], offset, scalar_offset=d.dyn, indirect_dim=k)

    # ------------------------------------------------------------------------------ indexing
    def __getitem__(self, key):
        keys = key if type(key) is tuple else (key,)
        kept = [k for k, d in enumerate(self._dims) if d.kept]
        if len(keys) > len(kept):
            raise AddressError(
                f"{len(keys)} indices for a grid of shape {self.shape}",
                operand="key",
                rule="nki_grid_view_too_many_indices",
            )
        dims = [d.copy() for d in self._dims]
        for pos, kk in zip(kept, keys):
            d = dims[pos]
            if type(kk) is slice:
                for part in (kk.start, kk.stop, kk.step):
                    if part is not None and type(part) is not int:
                        raise ArgumentTypeError(
                            f"grid slice bounds are static Python ints, got {kk!r}",
                            operand="key",
                            rule="nki_grid_view_index_type",
                        )
                if kk.step is not None and kk.step <= 0:
                    raise ShapeError(
                        f"grid slices take a positive step, got {kk.step}",
                        operand="key",
                        rule="nki_grid_view_slice_step",
                    )
                r = range(d.n)[kk]
                if not len(r):
                    raise ShapeError(
                        f"grid slice {kk.start}:{kk.stop} selects nothing of {d.n} coordinates",
                        operand="key",
                        rule="nki_grid_view_empty_selection",
                    )
                d.lo, d.step, d.n = d.lo + r.start * d.step, d.step * r.step, len(r)
            elif type(kk) is int:
                i = kk + d.n if kk < 0 else kk
                if not 0 <= i < d.n:
                    raise AddressError(
                        f"grid index {kk} is out of range for a grid dimension of {d.n} coordinates",
                        operand="key",
                        rule="nki_grid_view_index_out_of_range",
                    )
                d.lo, d.n, d.kept = d.lo + i * d.step, 1, False
            elif isinstance(kk, GridElementOffset) and type(kk.offset) is int:
                off = kk.offset
                if off % d.step or off >= d.extent():
                    raise ShapeError(
                        f"grid_element_offset({off}) is not a multiple of the coordinate step {d.step} inside the "
                        f"selected {d.extent()} elements",
                        operand="key",
                        rule="nki_grid_view_element_offset",
                    )
                d.lo, d.n, d.kept = d.lo + off, 1, False
            elif isinstance(kk, (Reg, NkiTensor, GridElementOffset)):
                if any(x.dyn is not None for x in dims):
                    raise not_supported(
                        "two run-time indices in one grid selection",
                        "one access pattern takes one scalar offset",
                        rule="nki_grid_view_runtime_index",
                    )
                if self._rank2 is not None:
                    raise not_supported(
                        "a run-time index into an on-chip alloc_tiles grid of more than 128 partitions",
                        rule="nki_grid_view_runtime_index",
                    )
                elem = isinstance(kk, GridElementOffset)
                if elem:
                    kk = kk.offset
                    if isinstance(kk, Reg) and getattr(kk, "dtype", "int32") != "int32" and self.buffer in ONCHIP:
                        raise DtypeError(
                            f"a run-time grid_element_offset into an on-chip grid is an int32 scalar, got {kk.dtype}",
                            operand="key",
                            rule="nki_grid_view_offset_dtype",
                        )
                d.dyn, d.n, d.kept, d.elem = _runtime_index(kk), 1, False, elem
            else:
                raise ArgumentTypeError(
                    f"a grid index is an int, a static slice, an int32 / uint32 SBUF scalar tile, an NkiScalar "
                    f"or a VirtualRegister, got {type(kk).__name__}",
                    operand="key",
                    rule="nki_grid_view_index_type",
                )
        out = type(self)._make(self._src, dims, self._tile, self._rank2, getattr(self, "_block_shape", None))
        return out

    def _region(self, tile: tuple, what: str) -> list:
        """The dims of a fresh grid over this selection (all tiled coordinates kept again)."""
        if any(d.dyn is not None for d in self._dims):
            raise not_supported(f"{what} of a grid selected at a run-time index", rule="nki_grid_view_runtime_index")
        if not all(d.contiguous() for d in self._dims):
            raise ShapeError(
                f"{what}: the selection's cells are not adjacent (a slice step > 1), so it is no region",
                rule="nki_grid_view_data_not_representable",
            )
        boxes = [(d.lo, d.lo + d.extent(), d.dropped) for d in self._dims]
        if len(tile) != sum(d.tiled for d in self._dims):
            raise ShapeError(
                f"{what}: tile_shape {tile} must have the rank of the grid's tiled dims {self._tile}",
                rule="nki_grid_view_tile_rank",
            )
        return _fresh_dims(boxes, tile, None)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} shape={self.shape} tile_shape={self._tile} "
            f"element_shape={self.element_shape} {self.buffer} {self.dtype}>"
        )


class NkiTileGrid(NkiGrid):
    """A grid navigated in tile coordinates (`nl.tiles`, `nl.alloc_tiles`, a block-to-tile step)."""

    __slots__ = ()


class NkiBlockGrid(NkiGrid):
    """A grid navigated in block coordinates: each block groups `block_shape` tiles (`nl.blocks`)."""

    __slots__ = ("_block_shape",)

    @property
    def block_shape(self) -> tuple:
        """Tiles per block along each tiled dimension."""
        return self._block_shape


class GridElementOffset:
    """`nl.grid_element_offset(v)`: a grid key in source elements (relative to the current view),
    not scaled by the coordinate step."""

    __slots__ = ("offset",)

    def __repr__(self) -> str:
        return f"grid_element_offset({self.offset!r})"


def grid_element_offset(offset) -> GridElementOffset:
    """`nl.grid_element_offset(offset)`: a static nonnegative int, an int32 / uint32 SBUF scalar
    tile, an NkiScalar or a VirtualRegister, as an element offset along the key's grid dim."""
    if type(offset) is bool or not isinstance(offset, (int, Reg, NkiTensor)):
        raise ArgumentTypeError(
            f"grid_element_offset takes an int, an SBUF scalar tile, an NkiScalar or a VirtualRegister, "
            f"got {type(offset).__name__}",
            operand="offset",
            rule="nki_grid_view_index_type",
        )
    if isinstance(offset, int):
        offset = int(offset)
        if offset < 0:
            raise ShapeError(
                f"grid_element_offset({offset}): a static offset is nonnegative",
                operand="offset",
                rule="nki_grid_view_element_offset",
            )
    elif isinstance(offset, NkiTensor):
        _runtime_index(offset)
    g = object.__new__(GridElementOffset)
    g.offset = offset
    return g


def _runtime_index(k) -> Any:
    """A run-time grid index: a Reg (NkiScalar / VirtualRegister) or a 1x1 int32/uint32 SBUF tile."""
    if isinstance(k, Reg):
        return k
    if k.buffer != "sbuf" or str(k.dtype) not in ("int32", "uint32"):
        raise ArgumentTypeError(
            f"a run-time grid index tile is an int32 / uint32 SBUF scalar, got {k.buffer} {k.dtype}",
            operand="key",
            rule="nki_grid_view_index_type",
        )
    if math.prod(k.shape) != 1:
        raise ShapeError(
            f"a run-time grid index tile holds one value, got shape {k.shape}",
            operand="key",
            rule="nki_grid_view_index_shape",
        )
    return k


def _fresh_dims(boxes: list, tile: tuple, block: tuple | None) -> list:
    """Grid dims over per-source-dim element boxes (lo, hi, dropped); `tile` covers the trailing dims."""
    lead = len(boxes) - len(tile)
    dims = []
    for k, (lo, hi, dropped) in enumerate(boxes):
        if k < lead:
            dims.append(_Dim(lo, hi, 1, 1, 1 if dropped else hi - lo, not dropped, False))
            continue
        cell = tile[k - lead] * (block[k - lead] if block else 1)
        dims.append(_Dim(lo, hi, cell, cell, -(-(hi - lo) // cell), True, True))
    return dims


def _tile_rank_check(src_shape: tuple, tile: tuple, onchip: bool, what: str) -> None:
    if len(tile) > len(src_shape):
        raise ShapeError(
            f"{what}: tile_shape {tile} has more dims than the source {src_shape}", rule="nki_grid_view_tile_rank"
        )
    if onchip and len(tile) != len(src_shape):
        raise ShapeError(
            f"{what}: an on-chip source {src_shape} is tiled in every dim (only HBM has untiled leading dims), "
            f"tile_shape {tile}",
            rule="nki_grid_view_tile_rank",
        )


def _grid_source(source, tile_shape, what: str):
    """(src, rank2, dims before blocking, tile) for a tensor or grid source."""
    if isinstance(source, NkiGrid):
        tile = source._tile if tile_shape is None else _exact_shape(tile_shape, "tile_shape")
        return source._src, source._rank2, source._region(tile, what), tile
    if not isinstance(source, NkiTensor):
        raise ArgumentTypeError(
            f"{what} takes an NkiTensor, NkiTileGrid or NkiBlockGrid, got {type(source).__name__}",
            operand="source",
            rule="nki_grid_view_source_type",
        )
    if tile_shape is None:
        raise ArgumentTypeError(
            f"{what} of a tensor needs tile_shape=", operand="tile_shape", rule="nki_grid_view_shape_type"
        )
    tile = _exact_shape(tile_shape, "tile_shape")
    _tile_rank_check(source.shape, tile, source.buffer in ONCHIP, what)
    return source, None, _fresh_dims([(0, n, False) for n in source.shape], tile, None), tile


def tiles(source, *, tile_shape=None) -> NkiTileGrid:
    """`nl.tiles(source, tile_shape=None)`: a tile-coordinate view of a tensor, or the tiles of a
    grid's selection (a block-to-tile transition keeps the grid's tile_shape when none is given)."""
    src, rank2, dims, tile = _grid_source(source, tile_shape, "nl.tiles")
    return NkiTileGrid._make(src, dims, tile, rank2)


def blocks(source, *, tile_shape=None, block_shape) -> NkiBlockGrid:
    """`nl.blocks(source, tile_shape=None, block_shape=...)`: a block-coordinate view, each block
    `block_shape` tiles."""
    block = _exact_shape(block_shape, "block_shape")
    src, rank2, dims, tile = _grid_source(source, tile_shape, "nl.blocks")
    if len(block) != len(tile):
        raise ShapeError(
            f"nl.blocks: block_shape {block} must have the rank of tile_shape {tile}", rule="nki_grid_view_block_rank"
        )
    boxes = [(d.lo, d.hi, d.dropped) for d in dims]
    return NkiBlockGrid._make(src, _fresh_dims(boxes, tile, block), tile, rank2, block)


def alloc_tiles(*, tile_shape, element_shape, buffer, dtype, address=None, name="") -> NkiTileGrid:
    """`nl.alloc_tiles(...)`: new uninitialised storage as a tile grid. HBM holds the compact
    logical extent; on chip, up to 128 partitions are the tensor itself, more are laid out as rows
    of partition tiles side by side along the free dim (tile_shape[0] partitions)."""
    tile = _exact_shape(tile_shape, "tile_shape")
    shape = _exact_shape(element_shape, "element_shape")
    if type(buffer) is not str:
        raise ArgumentTypeError(
            f"buffer must be an NKI memory region (nl.sbuf, nl.psum, nl.shared_hbm, ...), got {buffer!r}",
            operand="buffer",
            rule="nki_grid_view_buffer_type",
        )
    if buffer not in ONCHIP and buffer not in HBM_BUFFERS:
        raise MemorySpaceError(
            f"unknown buffer {buffer!r} (sbuf, psum, hbm, shared_hbm, private_hbm)",
            operand="buffer",
            rule="nki_unknown_buffer",
        )
    if len(tile) < 2 or len(tile) > len(shape):
        raise ShapeError(
            f"nl.alloc_tiles: tile_shape {tile} needs at least two dims and at most those of element_shape {shape}",
            operand="tile_shape",
            rule="nki_grid_view_tile_rank",
        )
    onchip = buffer in ONCHIP
    _tile_rank_check(shape, tile, onchip, "nl.alloc_tiles")
    ctx = current()
    dims = _fresh_dims([(0, n, False) for n in shape], tile, None)
    if onchip and shape[0] > PMAX:
        tp = tile[0]
        rows = -(-shape[0] // tp)
        storage = ctx.alloc((tp, rows) + shape[1:], as_dtype(dtype), buffer, name, address)
        return NkiTileGrid._make(storage, dims, tile, (tp, storage))
    t = ctx.alloc(shape, as_dtype(dtype), buffer, name, address)
    return NkiTileGrid._make(t, dims, tile)


def alloc_blocks(*, tile_shape, block_shape, element_shape, buffer, dtype, address=None, name="") -> NkiBlockGrid:
    """`nl.alloc_blocks(...)`: `alloc_tiles`' storage and tile geometry with a block level above
    it (one allocation; blocks add no storage)."""
    tile = _exact_shape(tile_shape, "tile_shape")
    block = _exact_shape(block_shape, "block_shape")
    if len(block) != len(tile):
        raise ShapeError(
            f"nl.alloc_blocks: block_shape {block} must have the rank of tile_shape {tile}",
            rule="nki_grid_view_block_rank",
        )
    grid = alloc_tiles(
        tile_shape=tile, element_shape=element_shape, buffer=buffer, dtype=dtype, address=address, name=name
    )
    return blocks(grid, block_shape=block)
