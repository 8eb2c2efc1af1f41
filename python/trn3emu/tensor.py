"""Tensor views: HBM tensors and SBUF/PSUM tiles, sliceable without copying.

A view is storage + shape + element strides + byte offset. On-chip views keep dim 0 as the
partition dim (slices of it move the start partition; an integer index keeps size 1) and stay at
least 2-D; HBM views index like numpy (an integer drops the dim). `to_ap()` gives the access
pattern the native assembler takes.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any

from . import _native
from .dtypes import SIZES, dtype_name
from .errors import AddressError, ArgumentTypeError, OperandError, ShapeError

MAX_FREE_DIMS: int = _native.MAX_FREE_DIMS
NUM_REGISTERS: int = _native.NUM_REGISTERS

_new = object.__new__
_view_geometry = _native.view_geometry


class Reg:
    """A sequencer register r0..r63. Each engine has its own `NUM_REGISTERS` (64) registers: an instruction reads
    and writes the registers of the engine that executes it (`Program.register_alloc`)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        if not 0 <= int(index) < NUM_REGISTERS:
            raise OperandError(
                f"register r{index} out of range (0..{NUM_REGISTERS})", operand="register", rule="register_out_of_range"
            )
        self.index = int(index)

    def __repr__(self) -> str:
        return f"r{self.index}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reg) and other.index == self.index

    def __hash__(self) -> int:
        return hash(("reg", self.index))


class HbmBlock:
    """One HBM allocation of `Hbm.alloc`: its byte range and whether it is still live (shared by
    every view of the tensor, so a freed tensor's views are refused too). It refers to its `Hbm`
    weakly: the `Hbm` lists its live blocks, and a strong reference back would make a cycle that
    keeps the device's memory (~280 MiB) until the cycle collector runs."""

    __slots__ = ("_owner", "lo", "hi", "live", "label")

    def __init__(self, owner: Any, lo: int, hi: int) -> None:
        self._owner, self.lo, self.hi, self.live, self.label = weakref.ref(owner), lo, hi, True, ""

    @property
    def owner(self) -> Any:
        """The `Hbm` that allocated the block (None once its device is gone)."""
        return self._owner()


def _check_live(t: Tensor) -> None:
    b = t.block
    if b is not None and not b.live:
        stale = getattr(b, "stale", None)  # an NKI tile kept past its trace (nki/_kernel.py)
        if stale is not None:
            raise AddressError(f"{t!r} {stale}", operand="tensor", rule="nki_tile_from_earlier_trace")
        raise AddressError(
            f"{t!r} belongs to {b.label}, which was freed (hbm.free)", operand="tensor", rule="hbm_use_after_free"
        )


def _int(v: Any, what: str, cls: type = ShapeError, rule: str = "shape_not_integer") -> int:
    """`v` as an int: Python and numpy integers pass; a float, a bool or anything else raises `cls`
    (never truncated: `int(1.9)` would silently give 1)."""
    if type(v) is int:
        return v
    if not isinstance(v, bool):
        try:
            return operator.index(v)
        except TypeError:
            pass
    raise cls(
        f"{what} must be an integer, got {v!r} ({type(v).__name__})", operand=what, rule=rule or "shape_not_integer"
    )


def _shape(shape: Any) -> tuple:
    """A shape argument (an int or a sequence of ints) as a tuple of ints; non-integers raise ShapeError."""
    return tuple(
        _int(s, "shape", rule="shape_not_integer") for s in (shape if isinstance(shape, (tuple, list)) else (shape,))
    )


def _index(v: Any, what: str) -> int:
    """An integer argument (an address, an offset, a core); non-integers raise ArgumentTypeError."""
    return _int(v, what, ArgumentTypeError, rule="int_expected")


def _name(name: Any) -> str:
    if not isinstance(name, str):
        raise ArgumentTypeError(
            f"name must be a string, got {name!r} ({type(name).__name__})", operand="name", rule="str_expected"
        )
    return name


class Tensor:
    __slots__ = ("mem", "dtype", "shape", "strides", "offset", "start", "name", "core", "dyn", "framework", "block")

    def __init__(
        self, mem: str, dtype: Any, shape, strides=None, offset: int = 0, start: int = 0, name: str = "", core=None
    ):
        self.mem = mem
        self.dtype = dtype_name(dtype)
        self.shape = _shape(shape)
        if any(s <= 0 for s in self.shape):
            raise ShapeError(f"tensor shape {self.shape} has an empty dimension", rule="tensor_empty_dimension")
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
        self.name = _name(name)
        self.core = core
        self.dyn = None
        #: the framework ("torch", "jax") of the array `Hbm.put` copied in: `Hbm.get` answers in it
        self.framework: str | None = None
        #: the `Hbm.alloc` allocation this HBM tensor (or view) lies in; None for tiles
        self.block: HbmBlock | None = None

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
        if self.dyn is not None:
            self._static("a view")  # views of a dynamic view would silently drop its offset
        t = _new(Tensor)
        t.mem, t.dtype, t.name, t.core = self.mem, self.dtype, self.name, self.core
        if type(shape) is not tuple or type(strides) is not tuple:
            shape, strides = tuple(shape), tuple(strides)
        t.shape, t.strides, t.offset, t.start = shape, strides, offset, start
        t.dyn = None
        t.framework = self.framework
        t.block = self.block
        return t

    def __enter__(self) -> Tensor:
        """`with dev.hbm.alloc(...) as t:` frees the HBM tensor when the block ends."""
        if self.block is None:
            raise ShapeError(
                f"only an HBM tensor from hbm.alloc/put is a context manager, got {self!r}", rule="hbm_tensor_expected"
            )
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.block is not None and self.block.live and self.block.owner is not None:
            self.block.owner.free(self)

    def _static(self, what: str) -> None:
        if self.dyn is not None:
            raise ShapeError(
                f"{what} of a dynamic (scalar_offset / vector_offset / indirect) view is not supported",
                rule="dynamic_view_not_viewable",
            )

    def __iter__(self):
        """Not iterable (index or slice it). Without this, Python would iterate through
        `__getitem__` (0, 1, 2, ... until an IndexError that never comes): `list(t)` of a
        broadcast of 2**33 rows, passed where a sequence is expected, would never finish."""
        raise ArgumentTypeError(
            f"{self!r} is not iterable: index or slice it (t[i], t[a:b])", operand="tensor", rule="tensor_not_iterable"
        )

    def __getitem__(self, key) -> Tensor:
        v = self._plain(key if type(key) is tuple else (key,))
        return self._indexed(key) if v is None else v

    def _plain(self, key: tuple) -> Tensor | None:
        """`self[key]` when every entry is an int index or a step-less slice within its dim (the
        views kernels take in their loops), else None (`_indexed` handles and refuses the rest).
        The geometry is `_native.view_geometry` (`memory/view.rs`)."""
        if self.dyn is not None:
            return None
        try:
            g = _view_geometry(
                self.shape, self.strides, self.offset, self.start, self.mem != "hbm", SIZES[self.dtype], key
            )
        except (TypeError, OverflowError):  # (geometry beyond 64-bit integers: `_indexed`)
            return None
        if g is None:
            return None
        t = _new(Tensor)  # `self._view(*g)`, inlined (a static view: `dyn` is None)
        t.mem = self.mem
        t.dtype = self.dtype
        t.name = self.name
        t.core = self.core
        t.dyn = None
        t.framework = self.framework
        t.block = self.block
        t.shape, t.strides, t.offset, t.start = g
        return t

    def _indexed(self, key) -> Tensor:
        """`self[key]` for any key: ellipsis, steps, slices clipped to their dim, errors."""
        if self.dyn is not None and self.dyn[0] == "v":
            return self._gather_rows(key if isinstance(key, tuple) else (key,))
        self._static("slicing")
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = key.index(Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key = key[:i] + (slice(None),) * fill + key[i + 1 :]
        if len(key) > self.ndim:
            raise ShapeError(f"too many indices ({len(key)}) for a {self.ndim}-D tensor", rule="too_many_indices")
        key = key + (slice(None),) * (self.ndim - len(key))
        shape, strides = [], []
        offset, start = self.offset, self.start
        onchip = self.mem != "hbm"
        for d, (k, n, st) in enumerate(zip(key, self.shape, self.strides)):
            if isinstance(k, slice):
                a, b, step = k.indices(n)
                cnt = len(range(a, b, step))
                if cnt == 0:
                    raise ShapeError(f"empty slice {k} of dim {d} (size {n})", rule="empty_slice")
                if d == 0 and onchip:
                    if step != 1:
                        raise ShapeError(
                            "partition slices must have step 1 (partitions are contiguous)", rule="partition_slice_step"
                        )
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
                    raise ShapeError(f"index {k} out of range for dim {d} of size {n}", rule="index_out_of_range")
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

    def _gather_rows(self, key: tuple) -> Tensor:
        """A slice of a `vector_offset` gather / scatter view: rows lo:hi keep their own index-tile
        rows (row r still starts at row index[r]), the free dims slice as a static view does. A
        legacy mask on the rows of a gather (`nl.load(t[b, idx, i_f], mask=i_p < n)`) takes this."""
        kind, idx, step, bound = self.dyn
        key = key + (slice(None),) * (self.ndim - len(key))
        k0 = key[0]
        if not isinstance(k0, slice) or k0.step not in (None, 1) or any(k is Ellipsis for k in key):
            self._static("indexing the rows (other than a step-1 slice)")
        lo, hi, _ = k0.indices(self.shape[0])
        if hi <= lo:
            raise ShapeError(f"empty slice {k0} of the gathered rows ({self.shape[0]})", rule="empty_slice")
        static = _new(Tensor)
        for name in Tensor.__slots__:
            setattr(static, name, getattr(self, name))
        static.dyn = None
        v = static._indexed((slice(None),) + tuple(key[1:]))
        v = v._view((hi - lo,) + tuple(v.shape[1:]), v.strides, v.offset, v.start)
        mem, dt, start, parts, row_step, off, free = idx  # (the index tile's encoded pattern)
        if mem == "hbm" or hi > parts:
            self._static("slicing")
        v.dyn = (kind, (mem, dt, start + lo, hi - lo, row_step, off, free), step, bound)
        return v

    def reshape(self, *shape) -> Tensor:
        """A view with a new shape; the view must be contiguous (partition dim kept on-chip)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = _shape(shape) or (1,)  # a 0-d shape holds one element, as in alloc(), put() and sbuf()
        self._static("reshape")
        n = 1
        for s in shape:
            n *= s
        if n != self.size:
            raise ShapeError(
                f"cannot reshape {self.shape} ({self.size} elements) to {shape}", rule="reshape_size_mismatch"
            )
        if not self.is_contiguous():
            raise ShapeError(
                f"reshape needs a contiguous view, {self!r} has strides {self.strides}", rule="view_not_contiguous"
            )
        if self.mem != "hbm":
            if shape[0] != self.shape[0]:
                raise ShapeError("on-chip reshape must keep the partition dim", rule="view_keeps_partition_dim")
            return Tensor(self.mem, self.dtype, shape, None, self.offset, self.start, self.name, self.core)
        t = Tensor("hbm", self.dtype, shape, None, self.offset, 0, self.name, self.core)
        t.block = self.block
        return t

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

    def view_as(self, dtype: Any) -> Tensor:
        """Reinterpret the bytes as another dtype; the last dim (contiguous) is rescaled by the size ratio."""
        new = dtype_name(dtype)
        old_es, new_es = self.itemsize, SIZES[new]
        shape, strides = list(self.shape), list(self.strides)
        if shape[-1] > 1 and strides[-1] != 1:
            raise ShapeError(
                f"view({new}) needs a contiguous last dim, {self!r} has strides {self.strides}",
                rule="view_not_contiguous",
            )
        if (shape[-1] * old_es) % new_es:
            raise ShapeError(
                f"view({new}): last dim of {shape[-1]} x {old_es} bytes is not a multiple of {new_es}",
                rule="view_dtype_size_mismatch",
            )
        shape[-1] = shape[-1] * old_es // new_es
        strides[-1] = 1
        for i in range(1 if self.mem != "hbm" else 0, len(shape) - 1):
            if (strides[i] * old_es) % new_es:
                raise ShapeError(
                    f"view({new}): stride {strides[i]} of dim {i} is not a whole number of {new}",
                    rule="view_dtype_size_mismatch",
                )
            strides[i] = strides[i] * old_es // new_es
        t = self._view(shape, strides, self.offset, self.start)
        t.dtype = new
        return t

    def permute(self, dims: tuple) -> Tensor:
        """Reorder dims (a view); on-chip the partition dim stays first."""
        if sorted(dims) != list(range(self.ndim)):
            raise ShapeError(
                f"permute{tuple(dims)} is not a permutation of {self.ndim} dims", rule="permute_not_permutation"
            )
        if self.mem != "hbm" and dims[0] != 0:
            raise ShapeError("on-chip permute keeps the partition dim (dim 0) first", rule="view_keeps_partition_dim")
        return self._view([self.shape[d] for d in dims], [self.strides[d] for d in dims], self.offset, self.start)

    def broadcast(self, dim: int, size: int) -> Tensor:
        """Repeat a size-1 dim `size` times (stride 0). Not the partition dim of an on-chip tile."""
        dim = dim % self.ndim
        if self.shape[dim] != 1:
            raise ShapeError(f"broadcast: dim {dim} has size {self.shape[dim]}, not 1", rule="broadcast_dim_not_one")
        if self.mem != "hbm" and dim == 0:
            raise ShapeError(
                "broadcast along partitions is not a view (use nl.broadcast_to, which copies)",
                rule="broadcast_partition_dim",
            )
        shape, strides = list(self.shape), list(self.strides)
        shape[dim], strides[dim] = _int(size, "size", rule="shape_not_integer"), 0
        return self._view(shape, strides, self.offset, self.start)

    def expand_dim(self, dim: int) -> Tensor:
        """Insert a size-1 dim at `dim`."""
        if dim < 0:
            dim += self.ndim + 1
        if self.mem != "hbm" and dim == 0:
            raise ShapeError("expand_dim cannot insert before the partition dim", rule="view_keeps_partition_dim")
        shape, strides = list(self.shape), list(self.strides)
        shape.insert(dim, 1)
        strides.insert(dim, 0)
        return self._view(shape, strides, self.offset, self.start)

    def squeeze_dim(self, dim: int) -> Tensor:
        """Drop a size-1 dim (on-chip views stay at least 2-D)."""
        dim = dim % self.ndim
        if self.shape[dim] != 1:
            raise ShapeError(f"squeeze_dim: dim {dim} has size {self.shape[dim]}, not 1", rule="squeeze_dim_not_one")
        if self.mem != "hbm" and (dim == 0 or self.ndim <= 2):
            raise ShapeError(
                "on-chip views keep the partition dim and at least 2 dims", rule="view_keeps_partition_dim"
            )
        shape, strides = list(self.shape), list(self.strides)
        del shape[dim], strides[dim]
        return self._view(shape, strides, self.offset, self.start)

    def ap(
        self,
        pattern: list | None = None,
        offset: int = 0,
        dtype: Any = None,
        row_bytes: int | None = None,
        *,
        scalar_offset: Any = None,
        vector_offset: Any = None,
        indirect_dim: int = 0,
    ) -> Tensor:
        """NKI's `.ap`: a raw access pattern over the storage from this view's first element,
        optionally moved at run time.

        `pattern` = [[step, num], ...] outer to inner, steps and `offset` in elements of `dtype`
        (default: this view's dtype; `None` keeps this view's own pattern). HBM: the first pair is
        the row dim. On-chip, the first pair is the partition dim and its step must be the
        storage's elements per partition (`row_bytes` / itemsize).

        Dynamic offsets (DMA operands; this view is the base they index and must be contiguous):
        `scalar_offset` (a `Reg` of the issuing engine, or a 1x1 int32/uint32 tile) adds
        `value * prod(self.shape[indirect_dim+1:])` elements, valid values
        `0..self.shape[indirect_dim]`; `vector_offset` (an int32/uint32 SBUF index tile, (P, 1) for
        copies) makes row r start at row `index[r]` of this HBM tensor (indirect_dim 0): a gather
        on a DMA source, a scatter on a destination. Out-of-range values follow `oob_mode`.
        """
        self._static(".ap")
        dynamic = scalar_offset is not None or vector_offset is not None
        if scalar_offset is not None and vector_offset is not None:
            raise OperandError(
                "give scalar_offset or vector_offset, not both", operand="vector_offset", rule="dynamic_offset_conflict"
            )
        if dynamic and dtype is not None and dtype_name(dtype) != self.dtype:
            raise ShapeError("a dynamic .ap cannot also reinterpret the dtype", rule="dynamic_ap_dtype")
        if dynamic and not self.is_contiguous():
            raise ShapeError(
                f".ap needs a contiguous base tensor, {self!r} has strides {self.strides}", rule="view_not_contiguous"
            )
        if pattern is None:
            off = _int(offset, "offset", OperandError, rule="ap_entry_not_integer")
            v = self._view(self.shape, self.strides, self.offset + off * self.itemsize, self.start)
        else:
            v = self._static_pattern(pattern, offset, dtype, row_bytes)
        if not dynamic:
            return v
        d = int(indirect_dim)
        if not 0 <= d < self.ndim:
            raise ShapeError(f"indirect_dim {d} outside 0..{self.ndim}", rule="indirect_dim_out_of_range")
        step = 1
        for n in self.shape[d + 1 :]:
            step *= n
        if scalar_offset is not None:
            if self.mem != "hbm" and d == 0:
                raise ShapeError(
                    "an on-chip scalar_offset moves along a free dim (indirect_dim >= 1)",
                    rule="indirect_dim_out_of_range",
                )
            src = scalar_offset.index if isinstance(scalar_offset, Reg) else _index_tile(scalar_offset, "scalar_offset")
            v.dyn = ("s", src, step, self.shape[d])
        else:
            if self.mem != "hbm" or d != 0:
                raise ShapeError(
                    "vector_offset indexes the rows (indirect_dim 0) of an HBM tensor", rule="indirect_dim_out_of_range"
                )
            v.dyn = ("v", _index_tile(vector_offset, "vector_offset"), step, self.shape[0])
        return v

    def _static_pattern(self, pattern: list, offset: int, dtype: Any, row_bytes: int | None) -> Tensor:
        """A raw access pattern over the storage from this view's first element.

        `pattern` = [[step, num], ...] outer to inner, steps and `offset` in elements of `dtype`
        (default: this view's dtype). On-chip, the first pair is the partition dim and its step must
        be the storage's elements per partition (`row_bytes` / itemsize).
        """
        new = dtype_name(dtype) if dtype is not None else self.dtype
        es = SIZES[new]
        if not pattern:
            raise ShapeError("ap pattern is empty", rule="ap_pattern_empty")
        steps = [_int(p[0], "pattern", OperandError, rule="ap_entry_not_integer") for p in pattern]
        nums = [_int(p[1], "pattern", OperandError, rule="ap_entry_not_integer") for p in pattern]
        if any(n <= 0 for n in nums):
            raise ShapeError(f"ap pattern {pattern} has an empty dimension", rule="tensor_empty_dimension")
        offset = _int(offset, "offset", OperandError, rule="ap_entry_not_integer")
        if self.mem == "hbm":
            t = self._view(nums, steps, self.offset + int(offset) * es, 0)
            t.dtype = new
            return t
        row = row_bytes if row_bytes is not None else (self.size // self.shape[0]) * self.itemsize
        if row % es:
            raise ShapeError(
                f"ap: {row} bytes per partition is not a whole number of {new} elements",
                rule="view_dtype_size_mismatch",
            )
        row_elems = row // es
        dp, df = divmod(int(offset), row_elems)
        if nums[0] > 1 and steps[0] != row_elems:
            raise ShapeError(
                f"ap: the partition step must be the storage's {row_elems} elements per partition, got {steps[0]}",
                rule="ap_partition_step",
            )
        t = self._view(
            nums if len(nums) > 1 else nums + [1],
            [0] + steps[1:] + ([] if len(nums) > 1 else [1]),
            self.offset + df * es,
            self.start + dp,
        )
        t.dtype = new
        return t

    def indirect(self, index: Tensor, num_elem: int | None = None) -> Tensor:
        """v4 tensor indirection: a (P, num_elem) view whose element i of every partition is
        free element `index_i` of this tile (free dims flattened), `index_i = index[i % G, i // G]`
        read when the instruction runs (G = 16 on Vector/Scalar/GpSimd, 32 on Tensor). `index`
        is an int32/uint32 SBUF tile starting on a quadrant boundary; `num_elem` defaults to
        index.size. Values outside 0..free size raise AddressError at run time.
        """
        self._static(".indirect")
        if self.mem == "hbm":
            raise ShapeError(
                "tensor indirection addresses SBUF/PSUM tiles; HBM uses .ap(vector_offset=...)",
                rule="indirect_needs_tile",
            )
        if not self.is_contiguous():
            raise ShapeError(
                f".indirect needs a tile with contiguous free dims, {self!r} has strides {self.strides}",
                rule="view_not_contiguous",
            )
        n = index.size if num_elem is None else _int(num_elem, "num_elem", rule="shape_not_integer")
        if n <= 0:
            raise ShapeError(f".indirect num_elem {n} is not positive", rule="tensor_empty_dimension")
        free = self.size // self.shape[0]
        v = self._view((self.shape[0], n), (0, 1), self.offset, self.start)
        v.dyn = ("i", _index_tile(index, "index"), 1, free)
        return v

    def is_indirect(self) -> bool:
        return self.dyn is not None and self.dyn[0] == "i"

    def rearrange(self, pattern: str, **sizes) -> Tensor:
        """einops-style view, e.g. "p (a b) -> p a b" (a=4) or "p a b -> p b a"; no copies."""
        try:
            lhs, rhs = (side.strip() for side in pattern.split("->"))
        except ValueError:
            raise ShapeError(
                f"rearrange pattern {pattern!r} needs one '->'", rule="rearrange_pattern_malformed"
            ) from None
        lgroups, rgroups = _groups(lhs), _groups(rhs)
        if len(lgroups) != self.ndim:
            raise ShapeError(
                f"rearrange: {lhs!r} names {len(lgroups)} dims, the tensor has {self.ndim}",
                rule="rearrange_pattern_malformed",
            )
        axes: dict[str, tuple[int, int]] = {}
        for names, n, st in zip(lgroups, self.shape, self.strides):
            known = 1
            unknown = [a for a in names if a not in sizes]
            for a in names:
                if a in sizes:
                    known *= int(sizes[a])
            if len(unknown) > 1:
                raise ShapeError(f"rearrange: sizes of {unknown} are not given", rule="rearrange_size_unknown")
            if unknown:
                if n % known:
                    raise ShapeError(f"rearrange: dim of {n} does not split by {known}", rule="rearrange_size_mismatch")
                sizes = dict(sizes, **{unknown[0]: n // known})
            elif known != n:
                raise ShapeError(
                    f"rearrange: group {names} has {known} elements, dim has {n}", rule="rearrange_size_mismatch"
                )
            inner = st
            for a in reversed(names):
                axes[a] = (int(sizes[a]), inner)
                inner *= int(sizes[a])
        if sorted(a for g in rgroups for a in g) != sorted(axes):
            raise ShapeError(
                f"rearrange: {rhs!r} must use exactly the axes of {lhs!r}", rule="rearrange_pattern_malformed"
            )
        shape, strides = [], []
        for names in rgroups:
            n, st = 1, 1
            for i, a in enumerate(reversed(names)):
                an, ast = axes[a]
                if i == 0:
                    st = ast
                elif an > 1 and ast != st * n:
                    raise ShapeError(f"rearrange: axes {names} cannot merge without a copy", rule="view_not_contiguous")
                n *= an
            shape.append(n)
            strides.append(st)
        if self.mem != "hbm" and rgroups[0] != lgroups[0]:
            raise ShapeError(
                "rearrange keeps the partition dim of an on-chip tile first and whole", rule="view_keeps_partition_dim"
            )
        return self._view(shape, strides, self.offset, self.start)

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
        raise OperandError(
            f"{what} must be a Reg or an int32/uint32 tile, got {t!r}", operand=what, rule="dynamic_index_type"
        )
    if t.dyn is not None:
        raise OperandError(f"{what} tile cannot itself be dynamic", operand=what, rule="dynamic_index_type")
    return t._static_ap()


def _groups(side: str) -> list:
    out, cur = [], None
    for tok in side.replace("(", " ( ").replace(")", " ) ").split():
        if tok == "(":
            cur = []
        elif tok == ")":
            out.append(cur)
            cur = None
        elif cur is not None:
            cur.append(tok)
        else:
            out.append([tok])
    return out


def fits_access_pattern(t: Tensor) -> bool:
    """Whether on-chip view `t`'s free dims merge into the at most MAX_FREE_DIMS an access pattern has."""
    if len(t.shape) <= MAX_FREE_DIMS + 1:
        return True
    try:
        _merge(list(zip(t.strides[1:], t.shape[1:])))
    except ShapeError:
        return False
    return True


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
        raise ShapeError(
            f"view needs {len(d)} free dims after merging; the ISA allows {MAX_FREE_DIMS}", rule="too_many_free_dims"
        )
    return d
