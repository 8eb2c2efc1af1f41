"""Tensor views: HBM tensors and SBUF/PSUM tiles, sliceable without copying.

A view is storage + shape + element strides + byte offset. On-chip views keep dim 0 as the
partition dim (slices of it move the start partition; an integer index keeps size 1) and stay at
least 2-D; HBM views index like numpy (an integer drops the dim). `to_ap()` gives the access
pattern the native assembler takes.
"""

from __future__ import annotations

from typing import Any

from .dtypes import SIZES, dtype_name
from .errors import OperandError, ShapeError

MAX_FREE_DIMS = 4


class Reg:
    """A sequencer register r0..r63. Each engine has its own 64 registers: an instruction reads
    and writes the registers of the engine that executes it (`Program.register_alloc`)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        if not 0 <= int(index) < 64:
            raise OperandError(f"register r{index} out of range (0..64)", operand="register")
        self.index = int(index)

    def __repr__(self) -> str:
        return f"r{self.index}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reg) and other.index == self.index

    def __hash__(self) -> int:
        return hash(("reg", self.index))


class Tensor:
    __slots__ = ("mem", "dtype", "shape", "strides", "offset", "start", "name", "core", "dyn")

    def __init__(
        self, mem: str, dtype: Any, shape, strides=None, offset: int = 0, start: int = 0, name: str = "", core=None
    ):
        self.mem = mem
        self.dtype = dtype_name(dtype)
        self.shape = tuple(int(s) for s in shape)
        if any(s <= 0 for s in self.shape):
            raise ShapeError(f"tensor shape {self.shape} has an empty dimension")
        if strides is None:
            dims = self.shape[1:] if mem != "hbm" else self.shape
            st, acc = [], 1
            for s in reversed(dims):
                st.append(acc)
                acc *= s
            strides = tuple(reversed(st))
            if mem != "hbm":
                strides = (0,) + strides
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        self.start = int(start)
        self.name = name
        self.core = core
        self.dyn = None

    # ------------------------------------------------------------------------------------ info
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return SIZES[self.dtype]

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def address(self) -> int:
        """Byte address (HBM) or byte offset within each partition (SBUF/PSUM)."""
        return self.offset

    def __repr__(self) -> str:
        where = (
            f"{self.mem}@{self.offset:#x}"
            if self.mem == "hbm"
            else f"{self.mem}[{self.start}:{self.start + self.shape[0]}]+{self.offset}"
        )
        label = f" {self.name!r}" if self.name else ""
        return f"<Tensor{label} {where} {self.shape} {self.dtype}>"

    # ---------------------------------------------------------------------------------- views
    def _view(self, shape, strides, offset, start) -> Tensor:
        t = Tensor.__new__(Tensor)
        t.mem, t.dtype, t.name, t.core = self.mem, self.dtype, self.name, self.core
        t.shape, t.strides, t.offset, t.start = tuple(shape), tuple(strides), offset, start
        t.dyn = None
        return t

    def _static(self, what: str) -> None:
        if self.dyn is not None:
            raise ShapeError(f"{what} of a dynamic (scalar_offset / vector_offset) view is not supported")

    def __getitem__(self, key) -> Tensor:
        self._static("slicing")
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = key.index(Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key = key[:i] + (slice(None),) * fill + key[i + 1 :]
        if len(key) > self.ndim:
            raise ShapeError(f"too many indices ({len(key)}) for a {self.ndim}-D tensor")
        key = key + (slice(None),) * (self.ndim - len(key))
        shape, strides = [], []
        offset, start = self.offset, self.start
        onchip = self.mem != "hbm"
        for d, (k, n, st) in enumerate(zip(key, self.shape, self.strides)):
            if isinstance(k, slice):
                a, b, step = k.indices(n)
                cnt = len(range(a, b, step))
                if cnt == 0:
                    raise ShapeError(f"empty slice {k} of dim {d} (size {n})")
                if d == 0 and onchip:
                    if step != 1:
                        raise ShapeError("partition slices must have step 1 (partitions are contiguous)")
                    start += a
                else:
                    offset += a * st * self.itemsize
                shape.append(cnt)
                strides.append(st * step)
            else:
                i = int(k)
                if i < 0:
                    i += n
                if not 0 <= i < n:
                    raise ShapeError(f"index {k} out of range for dim {d} of size {n}")
                if d == 0 and onchip:
                    start += i
                    shape.append(1)
                    strides.append(st)
                else:
                    offset += i * st * self.itemsize
        if onchip and len(shape) < 2:
            shape.append(1)
            strides.append(1)
        if not shape:
            shape, strides = [1], [1]
        return self._view(shape, strides, offset, start)

    def reshape(self, *shape) -> Tensor:
        """A view with a new shape; the view must be contiguous (partition dim kept on-chip)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        self._static("reshape")
        n = 1
        for s in shape:
            n *= s
        if n != self.size:
            raise ShapeError(f"cannot reshape {self.shape} ({self.size} elements) to {shape}")
        if not self.is_contiguous():
            raise ShapeError(f"reshape needs a contiguous view, {self!r} has strides {self.strides}")
        if self.mem != "hbm":
            if shape[0] != self.shape[0]:
                raise ShapeError("on-chip reshape must keep the partition dim")
            return Tensor(self.mem, self.dtype, shape, None, self.offset, self.start, self.name, self.core)
        return Tensor("hbm", self.dtype, shape, None, self.offset, 0, self.name, self.core)

    def is_contiguous(self) -> bool:
        dims = list(zip(self.shape, self.strides))
        if self.mem != "hbm":
            dims = dims[1:]
        acc = 1
        for n, st in reversed(dims):
            if n > 1 and st != acc:
                return False
            acc *= n
        return True

    # ----------------------------------------------------------------------- dynamic addressing
    def ap(
        self, pattern=None, offset: int = 0, scalar_offset=None, vector_offset=None, indirect_dim: int = 0
    ) -> Tensor:
        """NKI's `.ap`: a view `pattern` = [[step, num], ...] (outer to inner, in elements) over
        this tensor's storage from element `offset`, optionally moved at run time.

        HBM: the first pair is the row dim. On-chip: the first pair is the partition dim (its step
        is implied; partitions are contiguous). `pattern=None` keeps this view's own pattern.

        `scalar_offset` (a `Reg` of the issuing engine, or a 1x1 int32/uint32 tile) adds
        `value * prod(self.shape[indirect_dim+1:])` elements; valid values are
        `0..self.shape[indirect_dim]`. `vector_offset` (an int32/uint32 SBUF index tile, (P, 1) for
        copies) makes row r start at row `index[r]` of this HBM tensor (indirect_dim 0) —
        gather on a DMA source, scatter on a destination. Out-of-range values follow the
        instruction's `oob_mode`. This tensor must be contiguous (it is the base the offsets index).
        """
        self._static(".ap")
        if scalar_offset is not None and vector_offset is not None:
            raise OperandError("give scalar_offset or vector_offset, not both", operand="vector_offset")
        if not self.is_contiguous():
            raise ShapeError(f".ap needs a contiguous base tensor, {self!r} has strides {self.strides}")
        es = self.itemsize
        if pattern is None:
            v = self._view(self.shape, self.strides, self.offset + offset * es, self.start)
        else:
            pairs = [(int(st), int(n)) for st, n in pattern]
            if len(pairs) < 2:
                raise ShapeError("pattern needs the row/partition pair and at least one free pair")
            if self.mem == "hbm":
                v = self._view([n for _, n in pairs], [st for st, _ in pairs], self.offset + offset * es, 0)
            else:
                v = self._view(
                    [n for _, n in pairs], [0] + [st for st, _ in pairs[1:]], self.offset + offset * es, self.start
                )
        d = int(indirect_dim)
        if not 0 <= d < self.ndim:
            raise ShapeError(f"indirect_dim {d} outside 0..{self.ndim}")
        step = 1
        for n in self.shape[d + 1 :]:
            step *= n
        if scalar_offset is not None:
            if self.mem != "hbm" and d == 0:
                raise ShapeError("an on-chip scalar_offset moves along a free dim (indirect_dim >= 1)")
            src = scalar_offset.index if isinstance(scalar_offset, Reg) else _index_tile(scalar_offset, "scalar_offset")
            v.dyn = ("s", src, step, self.shape[d])
        elif vector_offset is not None:
            if self.mem != "hbm" or d != 0:
                raise ShapeError("vector_offset indexes the rows (indirect_dim 0) of an HBM tensor")
            v.dyn = ("v", _index_tile(vector_offset, "vector_offset"), step, self.shape[0])
        return v

    def indirect(self, index: Tensor, num_elem: int | None = None) -> Tensor:
        """v4 tensor indirection: a (P, num_elem) view whose element i of every partition is
        free element `index_i` of this tile (free dims flattened), `index_i = index[i % G, i // G]`
        read when the instruction runs (G = 16 on Vector/Scalar/GpSimd, 32 on Tensor). `index`
        is an int32/uint32 SBUF tile starting on a quadrant boundary; `num_elem` defaults to
        index.size. Values outside 0..free size raise AddressError at run time.
        """
        self._static(".indirect")
        if self.mem == "hbm":
            raise ShapeError("tensor indirection addresses SBUF/PSUM tiles; HBM uses .ap(vector_offset=...)")
        if not self.is_contiguous():
            raise ShapeError(f".indirect needs a tile with contiguous free dims, {self!r} has strides {self.strides}")
        n = index.size if num_elem is None else int(num_elem)
        free = self.size // self.shape[0]
        v = self._view((self.shape[0], n), (0, 1), self.offset, self.start)
        v.dyn = ("i", _index_tile(index, "index"), 1, free)
        return v

    def is_indirect(self) -> bool:
        return self.dyn is not None and self.dyn[0] == "i"

    # ------------------------------------------------------------------------- access pattern
    def to_ap(self) -> tuple:
        """(mem, dtype, start, parts, row_step, offset, [(step, num), ...][, dynamic]) for the assembler."""
        base = self._static_ap()
        return base if self.dyn is None else base + (self.dyn,)

    def _static_ap(self) -> tuple:
        if self.mem == "hbm":
            dims = list(zip(self.strides, self.shape))
            if len(dims) == 1:
                dims = [(0, 1)] + dims
            rows = dims[0]
            free = _merge(dims[1:])
            return ("hbm", self.dtype, 0, rows[1], rows[0], self.offset, free)
        free = _merge(list(zip(self.strides[1:], self.shape[1:]))) or [(1, 1)]
        return (self.mem, self.dtype, self.start, self.shape[0], 0, self.offset, free)


def _index_tile(t: Any, what: str) -> tuple:
    if not isinstance(t, Tensor):
        raise OperandError(f"{what} must be a Reg or an int32/uint32 tile, got {t!r}", operand=what)
    if t.dyn is not None:
        raise OperandError(f"{what} tile cannot itself be dynamic", operand=what)
    return t._static_ap()


def _merge(dims: list) -> list:
    """Drop unit dims and merge contiguous neighbours until at most 4 free dims remain."""
    if len(dims) <= MAX_FREE_DIMS:
        return [(s, n) for s, n in dims]
    d = [(s, n) for s, n in dims if n != 1] or [(1, 1)]
    i = len(d) - 1
    while len(d) > MAX_FREE_DIMS and i > 0:
        (so, no), (si, ni) = d[i - 1], d[i]
        if so == si * ni:
            d[i - 1 : i + 1] = [(si, no * ni)]
        i -= 1
    if len(d) > MAX_FREE_DIMS:
        raise ShapeError(f"view needs {len(d)} free dims after merging; the ISA allows {MAX_FREE_DIMS}")
    return d
