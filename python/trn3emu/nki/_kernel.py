"""Tracing NKI kernels into trn3emu Programs, and running them.

`nki.jit(fn)` gives a `Kernel`. Calling it (or `kernel[grid](...)`) with arrays puts the
arrays into the HBM of a fresh `Device`, runs the kernel's Python body once per program of the
grid (program k traces onto core k), each `nisa.*` / `nl.*` call appending instructions to that
core's Program, then runs all Programs together and returns the kernel's HBM results. Arrays are
numpy, torch CPU tensors, JAX arrays or anything with `__dlpack__` / `__array__`
(`trn3emu.interop`); results are torch tensors when every array argument is one (likewise JAX),
else numpy.
Nothing executes while tracing: as for the NKI compiler, Python control flow sees shapes and
constants, never tensor values.
"""

from __future__ import annotations

import contextvars
import enum
import inspect
import math
import os
import re
import sys
import threading
import types
import warnings
import weakref
from typing import Any

import numpy as np

from .. import _native, interop
from .._asm import INSTRUCTION_FLAGS
from ..device import Device
from ..dtypes import SIZES, dtype_name, numpy_dtype
from ..errors import (
    AddressError,
    ArgumentTypeError,
    CapacityError,
    EmuError,
    MemorySpaceError,
    NotSupportedError,
    OperandError,
    RaceError,
    ReadOnlyInputWarning,
    ResourceError,
    ShapeError,
)
from ..program import Program
from ..progress import TraceProgress, wanted
from ..tensor import Reg, Tensor, _shape
from . import (
    _memory,
    _traceback,
    copy_forward,
    dead_code,
    engine_choice,
    liveness,
    lowering,
    passes,
    psum_forward,
    record,
    value_reuse,
)
from . import compile_config as _compile_config
from ._frames import _INTERNAL, _LOC, _internal
from .gc_pause import gc_paused

#: The program being traced by this thread (or asyncio task), None outside a trace. A context
#: variable, not a module global: threads trace kernels side by side, each into its own context,
#: and a launch made while tracing (a kernel on host arrays) runs in a context of its own.
_TRACE: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar("trn3emu_nki_trace", default=None)
#: The TraceContext being traced here, or None (one C call: cheap enough per instruction).
tracing = _TRACE.get
ONCHIP = ("sbuf", "psum")
HBM_BUFFERS = ("hbm", "shared_hbm", "private_hbm")
_new = Tensor.__new__


def _inner(x):
    """The emulator Tensor behind an NkiTensor (other values pass through)."""
    return x._t if isinstance(x, NkiTensor) else x


def not_supported(name: str, why: str = "", *, rule: str = "nki_not_supported") -> NotSupportedError:
    """The error for an NKI API, or a form of one, the front end does not support; `rule` names which."""
    msg = f"not supported: {name}" + (f" ({why})" if why else "")
    return NotSupportedError(msg, rule=rule)


class NotSupportedAttribute(NotSupportedError, AttributeError):
    """An `nki.*` module attribute the front end does not provide (also an AttributeError, so
    `hasattr` and feature probes keep working)."""


def did_you_mean(name: str, candidates) -> str | None:
    """The closest public name among `candidates` to a misspelt `name` (difflib), if any is close."""
    import difflib

    names = [c for c in candidates if isinstance(c, str) and not c.startswith("_")]
    m = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return m[0] if m else None


def unknown_parameter(func: str, key: str, candidates) -> ArgumentTypeError | None:
    """The error for keyword `key` of `func` when it misspells one of `candidates`, else None."""
    guess = did_you_mean(key, candidates)
    if guess is None:
        return None
    return ArgumentTypeError(
        f"no such parameter: {func}({key}=...); did you mean `{guess}`?", operand=key, rule="nki_unknown_parameter"
    )


def missing_attribute(name: str, candidates=None) -> NotSupportedAttribute:
    """The error for `module.name` the front end does not have: "no such function ...; did you
    mean `x`?" when a public name of `candidates` is close (a misspelling), else "not supported"."""
    if candidates is not None:
        guess = did_you_mean(name.rsplit(".", 1)[-1], candidates)
        if guess is not None:
            return NotSupportedAttribute(
                f"no such function or attribute: {name}; did you mean `{guess}`?", rule="nki_unknown_name"
            )
    return NotSupportedAttribute(f"not supported: {name}", rule="nki_unknown_name")


def tile_attribute_error(e: AttributeError) -> NotSupportedAttribute | None:
    """The front end's error for `e`, a plain AttributeError of a missing attribute of a tile
    (`t.no_such_method`), else None. NkiTensor has no `__getattr__` hook to raise it where it
    happens: with one, CPython 3.11 cannot specialise any attribute read of the class (its
    slots included), which made every read of `t._t`, `t.buffer` ... in the trace slower. The
    kernel's launch turns the plain error into this one (`_Run._trace_once`)."""
    obj, name = getattr(e, "obj", None), getattr(e, "name", None)
    if type(e) is not AttributeError or not isinstance(obj, NkiTensor) or not isinstance(name, str):
        return None
    if name.startswith("__"):
        return None
    return missing_attribute(f"NkiTensor.{name}", dir(type(obj)))


def current() -> TraceContext:
    ctx = _TRACE.get()
    if ctx is None:
        raise EmuError(
            "this NKI API can only be called inside a kernel traced by nki.jit / nki.simulate",
            rule="nki_trace_context",
        )
    return ctx


def user_frame(f: types.FrameType | None) -> types.FrameType | None:
    """The innermost frame from `f` outward whose code lies outside the trn3emu package (the
    kernel's own code), None if there is none."""
    known = _INTERNAL
    while f is not None:
        name = f.f_code.co_filename
        inside = known.get(name)
        if inside is None:
            inside = _internal(name)
        if not inside:
            return f
        f = f.f_back
    return None


def source_line(skip: int = 0) -> str:
    """file:line of the innermost caller outside the trn3emu package (the kernel's source line).
    `skip`: how many callers above the calling function are known to be inside the package (the
    walk starts there: each frame it steps through costs a frame object)."""
    f = user_frame(sys._getframe(1 + skip))
    if f is None:
        return "?"
    code = f.f_code
    key = (id(code), f.f_lasti)
    hit = _LOC.get(key)
    if hit is not None and hit[0] is code:
        return hit[1]
    loc = f"{os.path.basename(code.co_filename)}:{f.f_lineno}"
    _LOC[key] = (code, loc)
    return loc


# ------------------------------------------------------------------------------------- dtypes
class Dtype(str):
    """An NKI dtype: its name (as NKI's own stubs spell dtypes), equal to numpy spellings too."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return str.__eq__(self, other) or (other == "bool_" and str.__eq__(self, "bool"))
        try:
            return str.__eq__(self, dtype_name(other))
        except Exception:
            return False

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__

    @property
    def itemsize(self) -> int:
        return SIZES[str(self)]

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype that carries it, so `np.zeros(shape, nl.bfloat16)` works in harnesses."""
        return numpy_dtype(str(self))


DTYPES = {name: Dtype(name) for name in SIZES}


def as_dtype(dtype: Any) -> Dtype:
    if isinstance(dtype, Dtype):
        return dtype
    if isinstance(dtype, str) and dtype == "bool_":
        return DTYPES["bool"]
    if dtype is bool:
        return DTYPES["bool"]
    return DTYPES[dtype_name(dtype)]


# ------------------------------------------------------------------------------------ tensors
class _Block:
    """One allocation; every view holds it, and the range is freed when the last view dies."""

    # seq: the allocation's ordinal when the liveness pass runs (`liveness.py`; pass_: the pass
    # object that numbered it: a tile of another launch is not one of its tiles); written: set
    # once an instruction names it as dst (`nl.loop_reduce` into a fresh buffer, language.py)
    __slots__ = ("__weakref__", "parts", "row_bytes", "label", "seq", "pass_", "written", "placed")

    def __init__(self, parts: int, row_bytes: int, label: str) -> None:
        self.parts, self.row_bytes, self.label = parts, row_bytes, label


class _Blocks(_Block):
    """A view's own allocation plus the allocations it reads at run time (index / offset tiles):
    the index tile of `t.ap(vector_offset=nl.load(idx))` lives as long as the view."""

    __slots__ = ("keep", "tiles")

    def __init__(self, own: _Block | None, *others, tiles: tuple = ()) -> None:
        if own is not None:
            super().__init__(own.parts, own.row_bytes, own.label)
        else:
            super().__init__(0, 0, "")
        self.keep = (own,) + tuple(others)
        self.tiles = tiles  # the run-time operand tiles themselves (e.g. for nl.atomic_rmw's mask)


def block_of(v) -> _Block | None:
    """`v._block` of a tile view; None for anything else and for a result not issued yet (read
    from the slot itself: `Pending.__getattr__` would issue it)."""
    if not isinstance(v, NkiTensor):
        return None
    try:
        return _BLOCK_SLOT(v, NkiTensor)
    except AttributeError:
        return None


def _with_runtime_operands(view: NkiTensor, *operands) -> NkiTensor:
    tiles = tuple(o for o in operands if isinstance(o, NkiTensor))
    regs = tuple(o for o in operands if isinstance(o, Reg))  # (an NkiScalar offset lives as long as the view)
    if tiles or regs:
        view._block = _Blocks(view._block, *[o._block for o in tiles if o._block is not None], *regs, tiles=tiles)
    return view


class NkiTensor:
    """An NKI tensor: a trn3emu `Tensor` view plus its NKI buffer kind and its allocation."""

    __slots__ = ("_t", "buffer", "_block", "name", "_ap")

    def __init__(self, t: Tensor, buffer: str, block: _Block | None = None, name: str = "") -> None:
        self._t, self.buffer, self._block, self.name = t, buffer, block, name
        #: the access pattern of an on-chip view `_t`, once known (`nki/_emit.py`; views never move)
        self._ap: Any = None

    def _wrap(self, t: Tensor) -> NkiTensor:
        nt = _new(NkiTensor)  # `NkiTensor(t, self.buffer, self._block, self.name)`, inlined
        nt._t, nt.buffer, nt._block, nt.name, nt._ap = t, self.buffer, self._block, self.name, None
        return nt

    # info
    @property
    def shape(self) -> tuple:
        return self._t.shape

    @property
    def dtype(self) -> Dtype:
        return DTYPES[self._t.dtype]

    @property
    def ndim(self) -> int:
        return self._t.ndim

    @property
    def size(self) -> int:
        return self._t.size

    @property
    def strides(self) -> tuple:
        return self._t.strides

    @property
    def offset(self) -> int:
        return self._t.offset // self._t.itemsize

    @property
    def tensor(self) -> Tensor:
        """The underlying trn3emu view."""
        return self._t

    @property
    def data(self) -> NkiTensor:
        """The tensor itself: the operand of an instruction, as `NkiGrid.data` is a grid's (the
        NKI 2.34 grid examples write `tile.data` of what `nl.ndarray` returns)."""
        return self

    def __repr__(self) -> str:
        return f"<NkiTensor {self.buffer} {self.shape} {self._t.dtype} {self._t!r}>"

    def __len__(self) -> int:
        return self.shape[0]

    def __bool__(self) -> bool:
        # An HBM tensor (a kernel argument, `if bias:`) is an object that exists: true, as for any
        # Python object. On-chip tiles hold computed values (`if x > 0:`), unknown while tracing.
        if self.buffer in HBM_BUFFERS:
            return True
        raise not_supported(
            "truth value of an on-chip tile", "tile values are not known while tracing", rule="nki_tile_truth_value"
        )

    def is_contiguous(self) -> bool:
        return self._t.is_contiguous()

    # views
    def __getitem__(self, key) -> NkiTensor:
        tk = type(key)
        if tk is tuple:
            for k in key:
                tk = type(k)
                if tk is not slice and tk is not int:
                    break
            else:  # plain slices and ints (the common case): what the general path does with them
                return self._wrap(v) if (v := self._t._plain(key)) else self._checked_view(key)
        elif tk is slice or tk is int:
            key = (key,)
            return self._wrap(v) if (v := self._t._plain(key)) else self._checked_view(key)
        if upcalls.has_expr(key) or upcalls.ds_past_end(self, key) or upcalls.has_tile(key):  # (nki.indexing's)
            return upcalls.index_view(self, key)  # legacy index expressions, index tiles
        key = _norm_key(key)
        _check_slice_bounds(key, self._t.shape)
        return self._wrap(self._t[key])

    def _checked_view(self, key: tuple) -> NkiTensor:
        """`self[key]` of slices and ints that `Tensor._plain` did not take, after the slice-bounds
        check. In a legacy kernel a slice running past the end is a view a mask= must bring in
        bounds before an instruction uses it (nki-samples' vision kernels slice a last partial
        tile so, under `mask=(i_p < N)`), as an index expression past the end is."""
        try:
            _check_slice_bounds(key, self._t.shape)
        except ShapeError:
            ctx = tracing()
            if ctx is None or ctx.launch.kernel.options.get("dialect") != "legacy" or Ellipsis in key:
                raise
            return upcalls.index_view(self, key)
        return self._wrap(self._t._indexed(key))

    def __setitem__(self, key, value) -> None:
        upcalls.assign(self[key], value)

    def reshape(self, *shape, **kwargs) -> NkiTensor:
        if "shape" in kwargs and not shape:  # t.reshape(shape=(...)): legacy kernels name it
            shape = (kwargs.pop("shape"),)
        if kwargs:
            key = next(iter(kwargs))
            raise unknown_parameter("NkiTensor.reshape", key, ["shape"]) or ArgumentTypeError(
                f"NkiTensor.reshape() takes no keyword {key!r} (only shape=)", operand=key, rule="nki_unknown_parameter"
            )
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return self._wrap(self._t.reshape(tuple(int(s) for s in shape)))

    def view(self, dtype) -> NkiTensor:
        return self._wrap(self._t.view_as(dtype_name(dtype)))

    reinterpret_cast = view

    def permute(self, *dims) -> NkiTensor:
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        return self._wrap(self._t.permute(tuple(int(d) for d in dims)))

    def broadcast(self, dim: int, size: int) -> NkiTensor:
        return self._wrap(self._t.broadcast(int(dim), int(size)))

    def flatten_dims(self, start_dim: int = 0, end_dim: int = -1) -> NkiTensor:
        """Merge dims start_dim..end_dim (inclusive) into one; they must be mergeable without a
        copy (each dim's stride = the next one's stride x size). On chip, dim 0 stays alone."""
        t = self._t
        a, b = int(start_dim) % t.ndim, int(end_dim) % t.ndim
        if a > b:
            raise ShapeError(
                f"flatten_dims({start_dim}, {end_dim}) of a {t.ndim}-D tensor", rule="nki_flatten_dims_order"
            )
        if a == b:
            return self
        if t.mem != "hbm" and a == 0:
            raise ShapeError(
                "flatten_dims cannot merge the partition dim of an on-chip tile", rule="nki_flatten_partition_dim"
            )
        for d in range(a, b):
            if t.strides[d] != t.strides[d + 1] * t.shape[d + 1]:
                raise ShapeError(
                    f"flatten_dims: dims {a}..{b} of {t!r} are not contiguous with each other",
                    rule="nki_flatten_not_contiguous",
                )
        n = 1
        for d in range(a, b + 1):
            n *= t.shape[d]
        shape = t.shape[:a] + (n,) + t.shape[b + 1 :]
        strides = t.strides[:a] + (t.strides[b],) + t.strides[b + 1 :]
        return self._wrap(t._view(shape, strides, t.offset, t.start))

    def reshape_dim(self, dim: int, shape) -> NkiTensor:
        """Split dim into dims of `shape` (their product must be its size; one may be -1, inferred);
        on chip not dim 0."""
        t = self._t
        d = int(dim) % t.ndim
        sizes = [int(x) for x in shape]
        if sizes.count(-1) == 1:
            known = -math.prod(sizes)
            if known > 0 and t.shape[d] % known == 0:
                sizes[sizes.index(-1)] = t.shape[d] // known
        if math.prod(sizes) != t.shape[d]:
            raise ShapeError(
                f"reshape_dim({dim}, {tuple(sizes)}): dim {d} has size {t.shape[d]}", rule="nki_reshape_dim_size"
            )
        if t.mem != "hbm" and d == 0 and len(sizes) > 1:
            raise ShapeError(
                "reshape_dim cannot split the partition dim of an on-chip tile", rule="nki_reshape_partition_dim"
            )
        st, strides = t.strides[d], []
        for n in reversed(sizes):
            strides.insert(0, st)
            st *= n
        return self._wrap(
            t._view(
                t.shape[:d] + tuple(sizes) + t.shape[d + 1 :],
                t.strides[:d] + tuple(strides) + t.strides[d + 1 :],
                t.offset,
                t.start,
            )
        )

    def is_indirect(self) -> bool:
        """Whether the view is addressed at run time: a dynamic `select`, `vector_select`, `ap(...)`
        with `scalar_offset` / `vector_offset`, or `indirect` (the NKI 0.6 API reference)."""
        return bool(self._t.is_indirect() or getattr(self._t, "dyn", None) is not None)

    def expand_dim(self, dim: int) -> NkiTensor:
        return self._wrap(self._t.expand_dim(int(dim)))

    def squeeze_dim(self, dim: int) -> NkiTensor:
        return self._wrap(self._t.squeeze_dim(int(dim)))

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        key = [slice(None)] * self.ndim
        key[int(dim)] = slice(int(start), int(end), int(step))
        return self[tuple(key)]

    def select(self, dim: int, index) -> NkiTensor:
        if isinstance(index, NkiTensor):  # dynamic: a run-time offset from a 1x1 int tile
            d = int(dim)
            pattern = [[st, n] for k, (st, n) in enumerate(zip(self._t.strides, self._t.shape)) if k != d]
            if self.buffer in ONCHIP:
                pattern[0][0] = self._block.row_bytes // self._t.itemsize if self._block is not None else 1
            return self.ap(pattern or [[1, 1]], 0, scalar_offset=index, indirect_dim=d)
        key = [slice(None)] * self.ndim
        key[int(dim)] = int(index)
        return self[tuple(key)]

    def ap(self, pattern=None, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
        """Raw access pattern over the tensor's storage: element = flat[offset + sum idx_k * step_k],
        optionally moved at run time by `scalar_offset` (a 1x1 int tile) or `vector_offset` (an index
        tile: per-row gather/scatter on HBM)."""
        if scalar_offset is not None or vector_offset is not None:
            row_bytes = self._block.row_bytes if self._block is not None else None
            pat = None if pattern is None else [tuple(int(x) for x in p) for p in pattern]
            view = self._wrap(
                self._t.ap(
                    pat,
                    int(offset),
                    dtype,
                    row_bytes,
                    scalar_offset=_inner(scalar_offset),
                    vector_offset=_inner(vector_offset),
                    indirect_dim=int(indirect_dim),
                )
            )
            return _with_runtime_operands(view, scalar_offset, vector_offset)
        if pattern is None:
            raise ShapeError("ap() needs pattern=[[step, num], ...]", rule="nki_ap_needs_pattern")
        row_bytes = self._block.row_bytes if self._block is not None else None
        return self._wrap(self._t.ap([tuple(int(x) for x in p) for p in pattern], int(offset), dtype, row_bytes))

    def indirect(self, index, num_elem=None):
        """v4 tensor indirection: free-dim columns at run-time offsets from `index`."""
        view = self._wrap(self._t.indirect(_inner(index), None if num_elem is None else int(num_elem)))
        return _with_runtime_operands(view, index)

    def vector_select(self, dim, offsets):
        """HBM rows selected at run time by an index tile (a DMA gather/scatter): one row per
        index partition."""
        if int(dim) != 0:
            raise not_supported(
                f"NkiTensor.vector_select(dim={dim})", "only dim 0 (rows)", rule="nki_vector_select_dim"
            )
        rows = int(_inner(offsets).shape[0])
        pattern = [[self._t.strides[0], rows]] + [[st, n] for st, n in zip(self._t.strides[1:], self._t.shape[1:])]
        return self.ap(pattern, vector_offset=offsets, indirect_dim=0)

    def rearrange(self, src_pattern, dst_pattern=None, fixed_sizes=None, **sizes) -> NkiTensor:
        """einops-style view: `rearrange("p (h w) -> p w h", h=4)`, or the NKI 0.6 reference's
        tuple form `rearrange(("p", ("h", "w")), ("p", "w", "h"), {"h": 4})`."""
        if dst_pattern is None:
            return self._wrap(self._t.rearrange(src_pattern, **sizes, **(fixed_sizes or {})))

        def text(pattern) -> str:
            if isinstance(pattern, str):
                return pattern
            return " ".join(a if isinstance(a, str) else "(" + " ".join(map(str, a)) + ")" for a in pattern)

        known = {k: v for k, v in dict(fixed_sizes or {}, **sizes).items() if int(v) != -1}
        return self._wrap(self._t.rearrange(f"{text(src_pattern)} -> {text(dst_pattern)}", **known))

    def get_pattern(self) -> list:
        return [[int(s), int(n)] for s, n in zip(self._t.strides, self._t.shape)]

    # arithmetic sugar -> nl ops
    def __add__(self, o):
        if isinstance(o, upcalls.index_types):  # legacy run-time index
            return upcalls.dyn_index(self) + o
        return upcalls.add(self, o)

    def __radd__(self, o):
        if isinstance(o, upcalls.index_types):
            return upcalls.dyn_index(self) + o
        return upcalls.add(o, self)

    def __sub__(self, o):
        return upcalls.subtract(self, o)

    def __rsub__(self, o):
        return upcalls.subtract(o, self)

    def __mul__(self, o):
        return upcalls.multiply(self, o)

    def __rmul__(self, o):
        return upcalls.multiply(o, self)

    def __truediv__(self, o):
        return upcalls.divide(self, o)

    def __neg__(self):
        return upcalls.negative(self)

    # comparisons, logic and the rest of numpy's operator set -> nl ops (tile results; a
    # comparison with anything but a number or a tensor keeps Python's identity semantics)
    def _op(self, name, o, reverse=False):
        if not isinstance(o, (NkiTensor, int, float, np.number)):
            return NotImplemented
        f = getattr(upcalls, name)
        return f(o, self) if reverse else f(self, o)

    def __lt__(self, o):
        return self._op("less", o)

    def __le__(self, o):
        return self._op("less_equal", o)

    def __gt__(self, o):
        return self._op("greater", o)

    def __ge__(self, o):
        return self._op("greater_equal", o)

    # == / != with a number are elementwise; between tensors they stay identity comparisons, so
    # lists of tiles (`t in tiles`, `tiles.remove(t)`) keep working (use nl.equal for tiles).
    def __eq__(self, o):  # type: ignore[override]
        return self is o if isinstance(o, NkiTensor) else self._op("equal", o)

    def __ne__(self, o):  # type: ignore[override]
        return self is not o if isinstance(o, NkiTensor) else self._op("not_equal", o)

    __hash__ = object.__hash__

    def __and__(self, o):  # integer tiles: bitwise; float / bool (comparison results): logical
        return self._op("bitwise_and" if "int" in str(self.dtype) else "logical_and", o)

    def __or__(self, o):
        return self._op("bitwise_or" if "int" in str(self.dtype) else "logical_or", o)

    def __xor__(self, o):
        return self._op("bitwise_xor", o)

    def __pow__(self, o):
        return self._op("power", o)

    def __rpow__(self, o):
        return self._op("power", o, reverse=True)

    def __mod__(self, o):
        return self._op("mod", o)

    def __rtruediv__(self, o):
        return self._op("divide", o, reverse=True)

    def __abs__(self):
        return upcalls.abs(self)

    def __invert__(self):
        return upcalls.invert(self)

    def astype(self, dtype):
        """A new SBUF copy cast to dtype (`tensor_copy`)."""
        return upcalls.copy(self, dtype=dtype)

    # in-place arithmetic: `t[...] += u` updates the tile (tensor_tensor / tensor_scalar into itself)
    def _inplace(self, op, o):
        upcalls.inplace(self, op, o)
        return self

    def __iadd__(self, o):
        return self._inplace("add", o)

    def __isub__(self, o):
        return self._inplace("subtract", o)

    def __imul__(self, o):
        return self._inplace("multiply", o)

    def __itruediv__(self, o):
        return self._inplace("divide", o)

    def broadcast_to(self, shape) -> NkiTensor:
        return upcalls.broadcast_to(self, shape)

    def same_view(self, other) -> bool:
        """True when `other` is exactly this view (same storage, place, shape and strides)."""
        a, b = self._t, getattr(other, "_t", None)
        key = (a.mem, a.core, a.dtype, a.shape, a.strides, a.offset, a.start, a.dyn)
        return b is not None and key == (b.mem, b.core, b.dtype, b.shape, b.strides, b.offset, b.start, b.dyn)


_BLOCK_SLOT = NkiTensor._block.__get__  # type: ignore[attr-defined]


class DSlice:
    """`nl.ds(start, size)`: the slice start:start+size (here, not in nki.language: NkiTensor's
    indexing reads it)."""

    __slots__ = ("start", "size")

    def __init__(self, start, size) -> None:
        self.start, self.size = int(start), int(size)

    def __repr__(self) -> str:
        return f"ds({self.start}, {self.size})"


def _norm_key(key):
    if not isinstance(key, tuple):
        key = (key,)
    out = []
    for k in key:
        if isinstance(k, DSlice):
            out.append(slice(k.start, k.start + k.size))
        elif isinstance(k, NkiTensor):
            raise not_supported("indexing with a tensor", "use .indirect / .ap", rule="nki_index_with_tensor")
        elif k is None:
            raise not_supported("indexing with None (newaxis)", "use expand_dim", rule="nki_index_with_none")
        elif isinstance(k, (slice, type(Ellipsis))):
            out.append(k)
        else:
            try:
                out.append(int(k))
            except TypeError:
                raise not_supported(
                    f"index {k!r}", "legacy arange/mgrid index expressions", rule="nki_index_unsupported"
                ) from None
    return tuple(out)


def _check_slice_bounds(key: tuple, shape: tuple) -> None:
    """A slice past a dim's end is an error at the slicing line (NKI refuses it; numpy would
    clip it into a smaller view that fails later, or silently reads less)."""
    d = 0
    for k in key:
        if k is Ellipsis:
            d += len(shape) - (len(key) - 1)  # the dims the ellipsis stands for
            continue
        if d >= len(shape):
            return
        n = shape[d]
        if isinstance(k, slice) and (k.step is None or k.step > 0):
            start = 0 if k.start is None else k.start + (n if k.start < 0 else 0)
            stop = n if k.stop is None else k.stop + (n if k.stop < 0 else 0)
            if start < 0 or stop > n or start > n:
                raise ShapeError(
                    f"slice {k.start if k.start is not None else ''}:{k.stop if k.stop is not None else ''} of dim {d} "
                    f"runs past the end of a tensor of shape {tuple(shape)} (dim {d} has {n} elements), "
                    f"at {source_line()}",
                    rule="nki_slice_out_of_bounds",
                )
        d += 1


def unwrap(v: Any) -> Any:
    return v._t if isinstance(v, NkiTensor) else v


# -------------------------------------------------------------------------------------- trace
_LABEL = re.compile(r"[^A-Za-z0-9_.:/+\-\[\]]")
_LABELS: dict = {}  # (source line, name) -> instruction label


class KernelProgram(Program):
    """A Program whose instructions are named after the kernel source line that issued them."""

    #: the timing generation whose costs the pass `engine_choice` decides the unpinned engines
    #: with after tracing (a trace that records the kernel IR: `engine_choice.run`); None: the
    #: assembler decides while appending, or the pass is off
    engine_pass: str | None = None
    #: instructions the pass `value_reuse` dropped from it (exact repeats)
    value_reuse: int = 0
    #: repeats the pass kept because the earlier result's bytes had gone to another tile (its
    #: inputs unchanged): the launch then finds them on the kernel IR (`Launch._trace`)
    reuse_missed: int = 0
    #: loads the pass `load_reuse` served from SBUF while tracing it
    loads_reused: int = 0
    #: copies the pass `psum_forward` dropped from it
    psum_forward: int = 0
    #: instructions the pass `dead_code` removed from it (results never read)
    dead_code: int = 0
    #: copies the pass `copy_forward` dropped from it (their readers read the source)
    copy_forward: int = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: opcodes appended so far (the trace cache asks whether the RNG is used)
        self.opcodes: set[str] = set()
        #: indices of the PSUM -> SBUF copies of partition broadcasts (`language._bcast_partitions`),
        #: the pass `psum_forward`'s candidates
        self.bcast_copies: list[int] = []

    def _emit(self, opcode, engine, name, wait, signal, args):
        self.opcodes.add(opcode)
        ctx = _TRACE.get()
        if ctx is not None:
            if _DST_POSITIONS.get(opcode, True):  # compute instructions never write HBM
                _record_hbm_writes(ctx, opcode, args)
            bar = ctx.launch.trace_progress
            if bar is not None:
                bar.tick()
        site = ctx.site if ctx is not None else None
        loc = site or source_line(2)  # called by the nki.isa wrapper or an assembler method: both inside
        key = (loc, None if name is None else str(name))
        label = _LABELS.get(key)
        if label is None:
            label = _LABELS[key] = _LABEL.sub("_", loc if name is None else f"{name}/{loc}")[-255:]
        try:
            return Program._emit(self, opcode, engine, label, wait, signal, args)
        except EmuError as e:
            if hasattr(e, "add_note"):
                e.add_note(f"  in kernel at {loc} ({opcode})")
            raise


#: opcode -> positions of its written operands (dst, dst_*), for the HBM write record
_DST_POSITIONS: dict[str, tuple[int, ...]] = {}


def _record_hbm_writes(ctx, opcode: str, args) -> None:
    """Note the HBM byte ranges the instruction writes (any part written counts)."""
    pos = _DST_POSITIONS.get(opcode)
    if pos is None:
        from .._asm import INSTRUCTIONS

        params = INSTRUCTIONS[opcode][2]
        pos = tuple(i for i, p in enumerate(params) if p[0].startswith("dst"))
        if INSTRUCTION_FLAGS[opcode][1] == "compute":  # engines write SBUF/PSUM only
            pos = ()
        _DST_POSITIONS[opcode] = pos
    for i in pos:
        t = args[i] if i < len(args) else None
        if isinstance(t, Tensor) and t.mem == "hbm":
            ctx.hbm_writes.append(_hbm_span(t))


def _hbm_span(t: Tensor) -> tuple[int, int]:
    """[lo, hi) bytes of HBM a view can touch (a gather/scatter view: at any index)."""
    es = t.itemsize
    lo = hi = 0
    for n, st in zip(t.shape, t.strides):
        span = (n - 1) * st
        if span < 0:
            lo += span
        else:
            hi += span
    dyn = getattr(t, "dyn", None)
    if dyn is not None:
        hi += max(0, int(dyn[3]) - 1) * int(dyn[2])
    return t.offset + lo * es, t.offset + (hi + 1) * es


def _check_outputs_written(result, inputs: list, contexts) -> None:
    """Every HBM tensor a kernel returns that is not an input must be written by some program
    (else its bytes are whatever HBM held: zeros, or the fill pattern)."""
    given = {(t.offset, t.nbytes) for t in inputs}
    writes = [w for c in contexts for w in c.hbm_writes]
    labels = {a: lab for c in contexts for a, lab in c.hbm_labels.items()}

    def walk(r, where):
        if isinstance(r, NkiTensor):
            t = r.tensor
            if (t.offset, t.nbytes) in given or t.mem != "hbm":
                return
            lo, hi = _hbm_span(t)
            if not any(a < hi and lo < b for a, b in writes):
                what = labels.get(t.offset) or f"{t.shape} {t.dtype}"
                raise OperandError(
                    f"the kernel returns {where} ({what}) but never writes it: its values would be "
                    "whatever HBM held (store a result into it, or do not return it)",
                    operand=where,
                    rule="nki_output_never_written",
                )
        elif isinstance(r, (tuple, list)):
            for i, x in enumerate(r):
                walk(x, f"{where}[{i}]")
        elif isinstance(r, dict):
            for k, x in r.items():
                walk(x, f"{where}[{k!r}]")

    walk(result, "its result")


#: The functions of the modules built on this one that it, and the modules between, call back:
#: NkiTensor's operators are nki.language's ops (`a + b` is `nl.add(a, b)`, `t[k] = v` its
#: assignment), a tile a lower module needs comes from `nl.ndarray`, legacy index expressions in keys
#: and sums are nki.indexing's, a full memory evicts block tiles' blocks (nki.blocks). Each of those
#: modules sets its entries when imported (see their ends); importing any nki module runs nki/__init__
#: first, which imports them all. So imports point one way (issue 27: one layer per stage), and a
#: missing entry is an AttributeError naming it.
upcalls = types.SimpleNamespace()
#: callables(ctx) run when a program's kernel body has returned
END_OF_TRACE: list = []
#: callables(ctx) -> bool run when an on-chip allocation does not fit, before block tiles' blocks
#: are evicted: each may free memory it holds only as an optimisation (`load_reuse.py`)
ON_FULL: list = []


class TraceContext:
    """The state of one program of a kernel launch while its body is traced."""

    #: the program's reusable loads (`load_reuse.LoadCache`), once pass `load_reuse` cached one
    _load_cache = None
    #: "file:line" instructions issued now are named after, when not the executing kernel line: a
    #: pending result is issued with the line of the call that made it (`pending.py`)
    site: str | None = None
    #: the kernel's frame that called the `nl` op being traced (`language._checked`), None outside
    #: one: the innermost frame outside the package for the package's frames below it, so the
    #: source-line lookups inside the op need not walk (and materialise) the frames in between
    user_f: types.FrameType | None = None

    def __init__(self, launch: _Run, pid: int) -> None:
        self.launch, self.pid = launch, pid
        # (the class defaults set on the instance too: an attribute found in the instance's own
        # dict is a specialised load per nki.isa call, a class attribute a generic lookup)
        self._load_cache, self.site, self.user_f = None, None, None
        #: id of a kernel code object that issued nki.isa calls -> (the code object, {instruction
        #: offset: ("file:line", label)}) (`_emit.kernel_site`); `site_code` / `site_hits`: the
        #: entry of the code object that called last (one identity check per call)
        self.call_sites: dict[int, tuple] = {}
        self.site_code: types.CodeType | None = None
        self.site_hits: dict[int, tuple[str, str]] = {}
        #: as `call_sites` for `tile`: {instruction offset: (shape, dtype, buffer, name, the
        #: `_sites` entry)} per code object (`_tile_site`), `tile_code` / `tile_hits` the last one's
        self.tile_sites: dict[int, tuple] = {}
        self.tile_code: types.CodeType | None = None
        self.tile_hits: dict[int, tuple] = {}
        # An SPMD launch across chips (nki/spmd.py) places a rank's programs from `core_base`.
        self.core = (getattr(launch, "core_base", 0) + pid) % Device.NUM_CORES
        self.program = KernelProgram(core=self.core)
        self.sbuf = self.program._sbuf  # the program's allocators: one allocator per memory
        self.psum = self.program._psum
        # a retrace after an explicit placement landed on an automatic tile (`_Run.__call__`):
        # the kernel's explicit ranges are held from the start, automatic tiles go around them
        for mem, ranges in launch.reserved.get(pid, {}).items():
            alloc = self.sbuf if mem == "SBUF" else self.psum
            for (lo, hi), label in ranges.items():
                alloc.reserve(lo, hi, label)
        self.shared_index = 0
        self.prints: list[tuple[str, NkiTensor]] = []
        #: a legacy `affine_range` / `sequential_range` loop under way (`traced_once.py`), else None
        self.once = None
        #: the iteration of each legacy `affine_range` / `sequential_range` loop under way, outermost
        #: first (`traced_once.OnceRange`; pass `load_reuse` tells loop-invariant loads by it)
        self.loop_iters: list[int] = []
        #: id(block) -> (weakref to the block, its tile view, name): PSUM tiles whose `nl.zeros`
        #: fill is deferred (`zero_fill.py`)
        self.fills: dict = {}
        self.no_reorder_depth = 0
        self.pending: list = []  # results not issued yet, oldest first (pending.py)
        #: active legacy mask ranges, innermost last: {var: (lo, hi)} (indexing.py)
        self.masks: list[dict] = []
        #: left operands of a mask's `and` waiting for its right operand (indexing.Predicate.__bool__)
        self.and_pending: list = []
        #: virtual registers (registers.py), once the kernel makes one
        self.vregs: dict | None = None
        #: byte ranges of HBM this program's instructions write (outputs never written are errors)
        self.hbm_writes: list[tuple[int, int]] = []
        #: HBM tensors allocated here: address -> label (for the errors naming them)
        self.hbm_labels: dict[int, str] = {}
        #: (buffer, dtype, shape, name) -> (a tile of that kind, its bytes per partition)
        self._tiles: dict[tuple, tuple[Tensor, int]] = {}
        #: (name, shape, dtype, source line) -> the label of tiles allocated there
        self._labels: dict[tuple, str] = {}
        #: (id of a kernel code object, offset, shape, dtype, buffer, name) -> (the code object,
        #: a tile allocated there, its bytes per partition, its label): `tile`
        self._sites: dict[tuple, tuple] = {}
        #: nki.isa name -> whether the program's method is the assembler's own (`nki/_emit.py` may append)
        self.direct_ops: dict[str, bool] = {}
        #: the IR recorder / allocation pass of this trace (`record.Recorder` in mode "plan" or
        #: "record", `liveness.Placer`), None: literal allocation, nothing recorded
        self.ir = launch.ir_for(pid)
        if self.ir is not None and self.ir.mode == "emit":
            self.ir.sbuf = self.sbuf
        elif launch.walking:  # (the walk lowers this trace's instructions again: `lowering.py`)
            self.program._native.keep_unresolved()
        engine_choice.configure(self)  # (the pass over the IR when one is recorded)

    @property
    def device(self) -> Device:
        return self.launch.device

    def alloc(self, shape, dtype, buffer: str, name: str = "", address=None, label: str = "") -> NkiTensor:
        shape = tuple(map(int, _shape(shape)))  # (a float or bool entry is refused, not truncated)
        # an nl dtype is its name (a plain copy: comparing the subclass runs its __eq__)
        dt = str.__str__(dtype) if type(dtype) is Dtype else dtype_name(dtype)
        if not label:
            loc = source_line(2)  # the caller is inside the package (kernels reach here through it)
            where = (name, shape, dt, loc) if type(name) is str else None
            label = self._labels.get(where)
            if label is None:
                label = f"{name or 'tile'} {shape} {dt} at {loc}"
                if where is not None:
                    self._labels[where] = label
        if buffer in HBM_BUFFERS:
            return self._alloc_hbm(shape, dt, buffer, name, address, label)
        if buffer not in ONCHIP:
            raise MemorySpaceError(
                f"unknown buffer {buffer!r} (sbuf, psum, hbm, shared_hbm, private_hbm)", rule="nki_unknown_buffer"
            )
        if len(shape) < 2:
            shape = shape + (1,) if shape else (1, 1)
        t, row = self._new_tile(buffer, dt, shape, name)
        alloc = self.sbuf if buffer == "sbuf" else self.psum
        block = _Block(shape[0], row, label)
        ir = self.ir
        if address is None:
            if shape[0] > _memory.PARTITIONS:
                _memory.check_partitions(0, shape[0], label)
            if ir is not None:
                key, t.offset = ir.new_tile(self, alloc, row, label, block, (buffer, shape, dt))
            else:
                key, t.offset = self._alloc_evicting(alloc, row, label)
        else:
            if isinstance(address, (tuple, list)):
                start, off = (0, address[0]) if len(address) == 1 else (int(address[0]), int(address[1]))
            else:
                start, off = 0, int(address)
            _memory.check_partitions(start, shape[0], label)
            if buffer == "psum" and off % _memory.PSUM_BANK:
                raise AddressError(
                    f"{label}: PSUM tiles start on a 2 KiB bank boundary; address {off} is not",
                    operand="address",
                    rule="nki_psum_tile_unaligned",
                )
            key = alloc.place(off, row, label)
            t.offset, t.start = off, start
            block.placed = True  # (may share bytes with any tile: `pending.InPlace.alias_ok`)
            if ir is not None:
                ir.placed(block, (buffer, shape, dt), (len(self.program), start, off))
        if buffer == "psum":
            self.program._native.psum_fresh(t.start, shape[0], t.offset, row)
        alloc.track(block, key)
        return NkiTensor(t, buffer, block, name)

    def tile(self, shape: tuple, dtype, buffer: str, name) -> NkiTensor:
        """`alloc(shape, dtype, buffer, name)` for a kernel's `nl.ndarray` (its caller). A line
        that allocated an on-chip tile of this kind before gets what that allocation worked out
        (the tile view, bytes per partition, label) again."""
        # the caller of nl.ndarray (or of its wrapper: inside, walked past)
        f = sys._getframe(2)
        code = f.f_code
        if code is not self.tile_code:
            uf = self.user_f  # (a package frame, e.g. a pending result issued: the kernel line of
            if uf is not None and _INTERNAL.get(code.co_filename) is not False:  # the nl op, as `_tile_site`)
                f, code = uf, uf.f_code
        ir = self.ir
        hit = None
        if code is self.tile_code and (ir is None or not ir.liveness):
            last = self.tile_hits.get(f.f_lasti)  # (the kernel line's last tile kind: `_tile_site`)
            if last is not None and last[1] is dtype and last[2] is buffer and last[3] is name:
                try:
                    if last[0] == shape:
                        hit = last[4]
                except Exception:  # (a shape entry that does not compare: the lookup below says what it is)
                    pass
        if hit is None:
            hit = self._tile_site(f, shape, dtype, buffer, name)
            if type(hit) is not tuple:
                return hit  # (a tile allocated the general way)
        _, known, row, label, ap, alloc, parts = hit
        block = _new(_Block)  # `_Block(parts, row, label)`, inlined
        block.parts = parts
        block.row_bytes = row
        block.label = label
        off = alloc.alloc_owned(row, label, block)
        # full: memory held only to save work gives way first (`_alloc_evicting`'s first step,
        # retried here in one native call), then block tiles' blocks, or the error says what holds it
        while off is None and any(release(self) for release in ON_FULL):
            off = alloc.alloc_owned(row, label, block)
        if off is None:
            key, off = self._alloc_evicting(alloc, row, label)
            alloc.track(block, key)
        t = _new(Tensor)  # the line's first tile `._view(shape, strides, off, 0)`, inlined (a static tile)
        t.mem, t.dtype, t.name, t.core, t.shape, t.strides, t.framework, t.block = known
        t.offset = off
        t.start = 0
        t.dyn = None
        if buffer == "psum":
            self.program._native.psum_fresh(0, parts, off, row)
        nt = _new(NkiTensor)  # `NkiTensor(t, buffer, block, name)`, inlined
        nt._t = t
        nt.buffer = buffer
        nt._block = block
        nt.name = name
        nt._ap = ap.at(off)
        if ir is not None:  # (recording the kernel IR: `record.Recorder`, mode "record")
            ir.number(block, (buffer, known[4], known[1]), False)
        return nt

    def _tile_site(self, f, shape: tuple, dtype, buffer: str, name):
        """`tile`'s lookup of what the line of frame `f` (the caller of nl.ndarray) worked out for
        a tile of this kind, as (code, tile fields, bytes per partition, label, access pattern,
        allocator, partitions); or the tile itself, allocated the general way (the line's first
        tile of the kind, or one the cache does not take). A kernel frame's answer is also kept
        in `tile_sites` under its code object and instruction offset, for `tile`'s one lookup."""
        kernel_f = _INTERNAL.get(f.f_code.co_filename) is False  # (a kernel's own frame)
        if not kernel_f:
            f = self.user_f if self.user_f is not None else user_frame(f)
        ir = self.ir
        if f is None or type(name) is not str or (ir is not None and ir.liveness):
            return self.alloc(shape, dtype, buffer, name)
        code = f.f_code
        key = (id(code), f.f_lasti, shape, dtype, buffer, name)
        try:
            hit = self._sites.get(key)
        except TypeError:  # an unhashable dtype or shape entry: the general path says what it is
            return self.alloc(shape, dtype, buffer, name)
        if hit is None or hit[0] is not code:
            t = self.alloc(shape, dtype, buffer, name)
            b = t._block
            if buffer in ONCHIP and type(b) is _Block:
                ap = _native.access_pattern(t._t.to_ap())  # (moved to each tile's offset)
                if type(ap) is _native.AccessPattern:
                    alloc = self.sbuf if buffer == "sbuf" else self.psum
                    kt = t._t  # (the fields every tile of the line shares)
                    kt = (kt.mem, kt.dtype, kt.name, kt.core, kt.shape, kt.strides, kt.framework, kt.block)
                    self._sites[key] = (code, kt, b.row_bytes, b.label, ap, alloc, b.parts)
            return t
        if kernel_f:
            hits = self.tile_sites.get(id(code))
            if hits is None or hits[0] is not code:
                hits = self.tile_sites[id(code)] = (code, {})  # (the code object held: its id is not reused)
            hits[1][f.f_lasti] = (shape, dtype, buffer, name, hit)
            self.tile_code, self.tile_hits = code, hits[1]
        return hit

    def _new_tile(self, buffer: str, dt: str, shape: tuple, name) -> tuple[Tensor, int]:
        """A new tile view at offset 0 and its bytes per partition: a copy of the first tile of
        that kind (`Tensor` checked the shape and name once; kernels allocate the same few kinds
        in their loops)."""
        key = (buffer, dt, shape, name) if type(name) is str else None
        known = self._tiles.get(key)
        if known is None:
            t = Tensor(buffer, dt, shape, name=name, core=self.core)
            known = (t, t.nbytes // shape[0])
            if key is not None:
                self._tiles[key] = known
        t, row = known
        return t._view(t.shape, t.strides, 0, 0), row

    def _alloc_evicting(self, alloc, row: int, label: str) -> tuple[int, int]:
        """`alloc.alloc`, making room when full by evicting the least recently used blocks of
        par_dim block tiles (`blocks.py`): blocks do not hold memory the kernel needs elsewhere."""
        while True:
            got = alloc.try_alloc(row, label)
            if got is not None:
                return got
            if any(release(self) for release in ON_FULL):
                continue  # (memory held only to save work gives way first)
            if not upcalls.evict_one(self, alloc):  # (nki.blocks')
                return alloc.alloc(row, label)  # nothing left to give way: the precise error

    def _alloc_hbm(self, shape, dt, buffer, name, address, label) -> NkiTensor:
        addr = None
        if address is not None:
            addr = int(address[0] if isinstance(address, (tuple, list)) else address)
        if buffer == "shared_hbm":
            # Programs of one launch see the same shared tensor: the k-th shared allocation of
            # every program is one HBM tensor (NKI links them by name; order is equivalent
            # when every program runs the same code).
            i, self.shared_index = self.shared_index, self.shared_index + 1
            shared = self.launch.shared
            if i < len(shared):
                t = shared[i]
                if t.shape != shape or t.dtype != dt:
                    raise ShapeError(
                        f"shared_hbm allocation #{i} is {shape} {dt} here but {t.shape} {t.dtype} in program 0",
                        rule="nki_shared_hbm_mismatch",
                    )
                return NkiTensor(t, buffer, None, name)
            t = self.device.hbm.alloc(shape, dt, address=addr, name=name, alias=True)
            self._fill_new_hbm(t, label)
            shared.append(t)
            return NkiTensor(t, buffer, None, name)
        t = self.device.hbm.alloc(shape, dt, address=addr, name=name, alias=True)
        self._fill_new_hbm(t, label)
        return NkiTensor(t, buffer, None, name)

    def _fill_new_hbm(self, t: Tensor, label: str) -> None:
        """A new HBM tensor starts as the launch's fill byte (`fill_uninitialized`), as on-chip
        memory does: a kernel output it never writes reads as NaN. Zeros otherwise."""
        self.hbm_labels[t.offset] = label
        ir = self.ir
        if ir is not None and ir.mode != "emit" and t.block is not None:  # (the kernel IR: record.py)
            ir.hbm_tensor(t.block.lo, t.block.hi, t.shape, t.dtype, t.name or label)
        fill = self.launch.fill
        if fill is not None and t.nbytes:
            self.device.hbm._native.hbm_write(t.offset, np.full(t.nbytes, fill, np.uint8))


# -------------------------------------------------------------------------------------- targets
KNOWN_TARGETS = {"trn3": "gen4", "gen4": "gen4", "trn2": "gen3", "gen3": "gen3", "trn1": "gen2", "inf2": "gen2"}
KNOWN_TARGETS["gen2"] = "gen2"
_warned: set = set()


def resolve_target(target: str | None) -> str:
    """The target to emulate: always trn3; older known targets run as trn3 with one warning."""
    t = target or os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or "trn3"
    key = str(t).strip().lower()
    if key not in KNOWN_TARGETS:
        raise not_supported(
            f"platform target {t!r}",
            f"known targets: {', '.join(sorted(KNOWN_TARGETS))}; trn3emu emulates trn3",
            rule="nki_unknown_platform_target",
        )
    if KNOWN_TARGETS[key] != "gen4" and key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"trn3emu emulates Trainium3 (NeuronCore-v4); target {t!r} runs as trn3", RuntimeWarning, stacklevel=3
        )
    return "trn3"


# ------------------------------------------------------------------------------------ launches
class _RetiredTile:
    """Stands in for `Tensor.block` of an on-chip tile kept past the trace that allocated it
    (in a global, a closure, a default argument): its memory was that trace's, so a later
    kernel using it would read whatever the range holds. Not live, so every instruction
    operand path refuses it (`tensor._check_live`: `nki_tile_from_earlier_trace`)."""

    __slots__ = ("stale",)
    live = False
    label = "a tile of an earlier trace"
    owner = None

    def __init__(self, stale: str) -> None:
        self.stale = stale

    @staticmethod
    def _owner() -> None:  # (as `HbmBlock._owner`, a dead weak reference)
        return None


def _retire_tiles(contexts, kernel: str) -> None:
    """Tiles of a finished trace that something outside it still holds are retired: their
    views forget their access pattern and get a `_RetiredTile` block. Usually no tile is left
    when a kernel returns (its frames are gone), and this is one pass over the allocators; the
    views of a kept tile are found by the cycle collector's referrer scan (once per such trace)."""
    alive: list = []
    pid_of: dict[int, int] = {}
    for c in contexts:
        for alloc in (c.sbuf, c.psum):
            for ref in list(alloc._owners):
                b = ref()
                if b is not None:
                    alive.append(b)
                    pid_of[id(b)] = c.pid
    if not alive:
        return
    import gc

    blocks = {id(b): b for b in alive}
    frontier = alive
    for _ in range(4):  # views of the blocks; then views of the `_Blocks` that keep them, ...
        holders = []  # `_Blocks.keep` tuples naming a block of the frontier
        for r in gc.get_referrers(*frontier):
            if isinstance(r, NkiTensor) and id(r._block) in blocks:
                pid = pid_of.get(id(r._block), 0)
                r._ap = None
                t = r._t
                if isinstance(t, Tensor) and t.mem != "hbm":
                    t.block = _RetiredTile(
                        f"is a tile of an earlier trace (kernel {kernel}, program {pid}): its on-chip memory "
                        f"was that trace's and now holds whatever this kernel puts there; allocate it in "
                        f"the kernel that uses it"
                    )
            elif type(r) is tuple:
                holders.append(r)
        if not holders:
            break
        frontier = [o for o in gc.get_referrers(*holders) if isinstance(o, _Blocks) and id(o) not in blocks]
        if not frontier:
            break
        for o in frontier:
            blocks[id(o)] = o
            pid_of[id(o)] = pid_of.get(id(o.keep[0]), 0) if o.keep else 0


class _HbmRecorder:
    """Stands in for the native device under `Device.hbm` while a kernel traces, recording the
    HBM writes tracing makes (`nl.full` in HBM, `nl.shared_constant`) so a cached launch can
    replay them on the next call's fresh device."""

    def __init__(self, native) -> None:
        self._native = native
        self.writes: list[tuple[int, np.ndarray]] = []

    def hbm_write(self, addr, data) -> None:
        self._native.hbm_write(addr, data)
        self.writes.append((int(addr), np.array(data, copy=True)))

    def __getattr__(self, name: str):
        return getattr(self._native, name)


class _Synced:
    """A traced program with its automatic semaphores resolved once (what `Device.run` runs)."""

    __slots__ = ("_synced",)

    def __init__(self, program: Program) -> None:
        self._synced = program.native()

    def native(self):
        return self._synced


class _Traced:
    """What one trace of a kernel leaves for reuse, like a compiled NEFF: the programs (already
    synchronised), where each input array lives in HBM, the HBM writes made while tracing, the
    returned structure (HBM tensors to read back) and the `device_print` snapshots."""

    def __init__(self, contexts, inputs, preload, result, hbm_ranges) -> None:
        self.programs = [c.program for c in contexts]
        #: (address, bytes) of every HBM tensor of the launch: what to zero before reusing a device
        self.hbm_ranges: set[tuple[int, int]] = hbm_ranges
        self.input_ranges = {(t.offset, t.nbytes) for t in inputs}
        # The only device state that outlives a run besides memory is the RNG (and the run
        # count that seeds stochastic rounding): launches that use it get a fresh device.
        # A trace that read device values (device loops ran earlier segments while tracing,
        # `registers.device_value`) depends on data: never replayed, and its device not kept.
        self.device_dependent = any(getattr(c, "segments", None) for c in contexts)
        self.reusable = not self.device_dependent and not any(
            getattr(p, "opcodes", set()) & _RNG_OPS for p in self.programs
        )
        self.groups = [
            [_Synced(p) for p in self.programs[lo : lo + Device.NUM_CORES]]
            for lo in range(0, len(self.programs), Device.NUM_CORES)
        ]
        self.inputs: list[Tensor] = inputs
        self.preload: list[tuple[int, np.ndarray]] = preload
        self.written_inputs = _written_inputs(inputs, contexts, preload, self.device_dependent)
        self.result = result
        self.prints = [(c.pid, prefix, t) for c in contexts for prefix, t in c.prints]
        #: what the spill pass added (`liveness.Placer.stats`, summed over programs); empty when it did not run
        self.spills: dict = {}
        #: the kernel IR of each program (`ir.KernelIR`) when recorded: `kernel.last_irs`
        self.irs: list = []


def _written_inputs(inputs: list[Tensor], contexts, preload, device_dependent: bool) -> list[int]:
    """Positions of the inputs a launch may write (the ones whose write-back is checked after a
    run): those whose HBM bytes meet a range an instruction or a tracing-time write records
    (`TraceContext.hbm_writes`, the preloads). Every input when the trace read device values."""
    if device_dependent:
        return list(range(len(inputs)))
    spans = [w for c in contexts for w in c.hbm_writes]
    spans += [(addr, addr + np.asarray(data).nbytes) for addr, data in preload]
    out = []
    for i, t in enumerate(inputs):
        a, b = t.offset, t.offset + t.nbytes  # (once per input, not per span)
        if any(lo < b and a < hi for lo, hi in spans):
            out.append(i)
    return out


#: instructions that draw from or set a random generator (their results depend on the run: not reusable)
_RNG_OPS = frozenset(name for name, (_cost, _path, rng, _maskable) in INSTRUCTION_FLAGS.items() if rng)
#: Environment variables read when a Device is made (its numerics configuration).
_DEVICE_ENV = ("NEURON_RT_STOCHASTIC_ROUNDING_EN", "NEURON_RT_STOCHASTIC_ROUNDING_SEED", "TRN3EMU_TIMING")


class _Spare:
    """The device of the last launch, kept to run the next one (of any kernel): making a Device
    zero-fills 8 cores of SBUF/PSUM (slow when the pages are fresh); resetting a used one refills
    only the cores the last launch touched and zeroes the HBM tensors it used. Only devices
    whose RNG never ran and that round by RNE are kept, so a spare is as good as a new one."""

    def __init__(self, device: Device, env: tuple, dirty: set) -> None:
        self.device, self.env, self.dirty = device, env, dirty


#: At most one spare device for the whole process (each holds ~272 MiB of on-chip memory).
_SPARE: list[_Spare] = []
#: Guards the spare device and the kernels' trace caches, which launches in several threads share
#: (taken a few times per launch, never while tracing or running).
_SHARED = threading.Lock()


class _Uncacheable(Exception):
    """An argument whose value the cache cannot key on (the launch is traced every call)."""


_FUNCS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, np.ufunc, type, np.dtype)


def _arg_key(a, in_list: bool = False):
    """Cache key of one kernel argument: arrays by shape and dtype (values and strides are not
    seen while tracing), other values by type and value (they steer tracing)."""
    if isinstance(a, np.ndarray):
        if in_list:
            raise _Uncacheable
        return ("array", a.shape, a.dtype)
    if isinstance(a, np.generic):
        a = a.item()
    if a is None or isinstance(a, (bool, int, str, bytes)):
        return (type(a), a)
    if isinstance(a, (float, complex)):
        return (type(a), repr(a))  # -0.0 and nan keyed apart / by spelling
    if isinstance(a, tuple):
        return ("tuple", tuple(_arg_key(x, in_list) for x in a))
    if isinstance(a, list):
        return ("list", tuple(_arg_key(x, True) for x in a))
    if isinstance(a, enum.Enum):
        return (type(a), a.name)
    if isinstance(a, _FUNCS):
        return ("object", a)  # held by the key: identity cannot be reused while cached
    raise _Uncacheable


#: Environment variables that change what tracing produces.
_TRACE_ENV = (
    "NEURON_PLATFORM_TARGET_OVERRIDE",
    "TRN3EMU_NKI_PASSES",
    "TRN3EMU_TIMING",
    "TRN3EMU_NKI_IR",
    "NEURON_RT_STOCHASTIC_ROUNDING_EN",  # (the pass value_reuse does nothing under stochastic rounding)
)
CACHE_SIZE = 16


class _Run:
    """One launch of a kernel over a grid, on a device in the state of a new one."""

    def __init__(self, kernel: Kernel, grid: tuple) -> None:
        self.kernel, self.grid = kernel, grid
        self.device: Device
        self.shared: list[Tensor] = []
        self.contexts: list[TraceContext] = []
        #: pid -> memory name -> the explicit ranges held from the start of the trace ((lo, hi) -> label)
        self.reserved: dict[int, dict[str, dict]] = {}
        #: the byte fresh memory starts as (None: zeros); also fills new HBM tensors
        self.fill: int | None = None
        #: the tracing progress bar (shown once tracing lasts 2 s), while tracing
        self.trace_progress: TraceProgress | None = None
        #: the allocation pass of the trace under way: None (literal), "plan" or "emit"
        self.ir_mode: str | None = None
        #: (address, bytes) of every HBM tensor any trace of the launch made
        self.hbm_ranges: set[tuple[int, int]] = set()
        self.plans: list = []
        self.spill = False
        self.record_ir = False
        #: the recording trace under way is lowered by the walk (`lowering.py`), not traced again
        self.walking = False

    def _key(self, args, kwargs):
        """The launch's cache key, or None when caching is off or an argument is not keyable."""
        if not self.kernel.options.get("cache", True) or os.environ.get("TRN3EMU_NKI_CACHE", "1") == "0":
            return None
        try:
            key = (
                self.grid,
                tuple(_arg_key(a) for a in args),
                tuple((k, _arg_key(v)) for k, v in kwargs.items()),
                tuple(os.environ.get(v) for v in _TRACE_ENV),
            )
            hash(key)
        except (_Uncacheable, TypeError):
            return None
        return key

    def __call__(self, args, kwargs):
        from .. import testing

        originals: list = []
        copies: list = []  # (tensor off the host, its host copy, snapshot): written back if changed
        args, kwargs = _host_arrays(self.kernel, args, kwargs, originals, copies)
        self.input_names = _input_names(self.kernel, args, kwargs)
        fill = self.fill = self.kernel.options.get("fill", testing.default_fill())
        key = self._key(args, kwargs)
        if key is not None:
            key = key + (fill,)  # new HBM tensors start filled with it (written while tracing)
        cache = self.kernel._cache
        with _SHARED:
            traced = cache.get(key) if key is not None else None
            if traced is not None:
                cache[key] = cache.pop(key)  # most recently used last
        if traced is None:
            self.device = self._fresh_device(fill, set())
            with gc_paused():  # (a trace keeps what it allocates: collections find nothing)
                try:
                    arrays, traced = self._trace(args, kwargs)
                except _PlacementConflict as c:  # traced again with the explicit ranges held first
                    self.reserved, self.contexts = c.reserved, []
                    self.device = self._fresh_device(fill, set())
                    try:
                        arrays, traced = self._trace(args, kwargs)
                    except (_PlacementConflict, CapacityError) as e:
                        raise c.error(e) from None
            if key is not None and not traced.device_dependent:
                with _SHARED:
                    cache[key] = traced
                    while len(cache) > CACHE_SIZE:
                        cache.pop(next(iter(cache)))
        else:
            self.device = self._fresh_device(fill, traced.input_ranges)
            arrays = list(zip(_input_arrays(args, kwargs), traced.inputs))
            for a, t in arrays:
                self.device.hbm.write(t, a if a.ndim else a.reshape(1))
            for addr, data in traced.preload:
                self.device.hbm._native.hbm_write(addr, data)
        out = interop.send_home(self._run(traced, arrays, interop.common(originals)), copies)
        if traced.reusable and self.device.numerics["rounding"] != "stochastic":
            with _SHARED:
                _SPARE[:] = [_Spare(self.device, _device_env(), traced.hbm_ranges)]
        return out

    def _fresh_device(self, fill, rewritten: set) -> Device:
        """A device in the state a new one has (on-chip bytes = fill, HBM zero, RNG at power-on):
        the spare device reset, or a new one. `rewritten`: HBM ranges the caller overwrites anyway."""
        with _SHARED:
            spare = _SPARE.pop() if _SPARE else None
        if spare is None or spare.env != _device_env():
            dev = Device()
            if fill is not None:
                dev.fill_onchip(fill)
            return dev
        dev = spare.device
        dev.fill_onchip(0 if fill is None else fill)
        for addr, n in spare.dirty - rewritten:
            dev.hbm._native.hbm_zero(addr, n)
        dev.hbm._reset()  # HBM placement as on a new device
        return dev

    def ir_for(self, pid: int):
        """The IR recorder or allocation pass of program `pid`'s trace (None: literal
        allocation, no IR recorded)."""
        if self.ir_mode is None:
            if not self.record_ir:
                return None
            return record.Recorder("record", self.kernel.__name__, pid, source_line, user_frame)
        if self.ir_mode == "plan":
            return record.Recorder("plan", self.kernel.__name__, pid, source_line, user_frame)
        return liveness.Placer(self.plans[pid], spill=self.spill, sbuf=None)

    def _trace(self, args, kwargs):
        """Trace every program of the grid into `_Traced` (inputs placed in this run's HBM), with
        the allocation passes `passes.allocation` selects: literal allocation, or (first, or
        when literal allocation does not fit) a recording trace then the trace that lowers with
        tiles freed at their last use and SBUF spilled when full (`liveness.py`)."""
        mode, self.spill = passes.allocation(self.kernel)
        self.record_ir = wants_ir(self.kernel)
        walk = passes.lowering(self.kernel) == "walk"
        self.for_reuse = False
        if mode == "auto":
            try:
                out = self._trace_once(args, kwargs)
                if not (walk and self._reuse_missed()):
                    return out
                self.for_reuse = True  # (it fits: lowered only if that drops repeats)
            except CapacityError:
                if any(getattr(c, "segments", None) for c in self.contexts):
                    raise  # traced from device values: no second trace
            self._restart()
        elif mode == "literal":
            return self._trace_once(args, kwargs)
        self.ir_mode = "plan"
        why = "pass setting lowering=retrace"
        self.walking = walk
        try:
            out = self._trace_once(args, kwargs, check=walk)  # (walk: lowered by `_walk`)
        except lowering.Unwalkable as e:
            out, why = None, f"the walk could not lower it: {e}"
        finally:
            self.walking = False
        if self.for_reuse and (out is None or not any(c.ir.reuse_dropped for c in self.contexts)):
            # lowered for repeats the IR does not have (or could not be walked): literal again
            self.ir_mode = None
            self._restart()
            return self._trace_once(args, kwargs)
        if out is not None:
            out[1].spills = _sum_stats(c.ir.stats for c in self.contexts)
            out[1].irs = [c.ir.ir for c in self.contexts]
            return out
        if any(getattr(c, "segments", None) for c in self.contexts):  # traced from device values
            self.ir_mode = None
            self._restart()
            return self._trace_once(args, kwargs)
        self.plans = [c.ir for c in self.contexts]
        self._restart()
        self.ir_mode = "emit"
        try:
            out = self._trace_once(args, kwargs)
        except liveness.TraceMismatch:  # the kernel traced differently the second time: literal allocation
            self.ir_mode = None
            self._restart()
            return self._trace_once(args, kwargs)
        out[1].spills = _sum_stats(c.ir.stats for c in self.contexts)
        out[1].irs = [c.ir.ir for c in self.contexts]  # (the lowered IR: with the spill / reload calls)
        for c in self.contexts:
            c.ir.ir.passes["lowering"] = f"retrace (the kernel body traced again: {why})"
        return out

    def _reuse_missed(self) -> bool:
        """After a literal trace that fits: whether the pass `value_reuse` ("on") kept repeats
        only because the literal allocation gave their earlier results' bytes to other tiles,
        so recording and lowering the kernel (as `liveness` "on") finds them before allocation
        (`value_reuse.plan_ir`). Not when the trace served loads from SBUF (`load_reuse`: the
        walk reuses loads by its own rule, which may keep tiles alive longer) or read device
        values."""
        for c in self.contexts:
            p = c.program
            if getattr(c, "segments", None) or p.loads_reused or self.reserved.get(c.pid):
                return False
        return any(c.program.reuse_missed for c in self.contexts)

    def _walk(self, arrays) -> None:
        """Lower every program of the recording trace just made by the walk (`lowering.py`):
        each context's `ir` becomes its allocation pass, its program the lowered one.
        `lowering.Unwalkable` when any program cannot be (nothing kept: traced again)."""
        names = getattr(self, "input_names", None) or [""] * len(arrays)
        named = [(t.block.lo, t.block.hi, t.shape, n) for (_, t), n in zip(arrays, names) if t.block]
        for c in self.contexts:
            c.ir.name_inputs(named)
        if any(getattr(c, "segments", None) for c in self.contexts):
            raise lowering.Unwalkable("traced from device values")
        timing = None
        if passes.enabled(self.kernel, "engine_choice"):
            timing = os.environ.get("TRN3EMU_TIMING") or "trn3"
        done = []
        for c in self.contexts:
            token = _TRACE.set(c)
            try:
                done.append(lowering.walk(c, self.spill, timing))
            except CapacityError as e:  # (the second trace raises it where the kernel allocates)
                raise lowering.Unwalkable(f"it does not fit: {e}") from None
            finally:
                _TRACE.reset(token)
        for c, (placer, _) in zip(self.contexts, done):
            c.ir = placer
            n = len(placer.ir.calls) - placer.calls
            placer.ir.passes["lowering"] = (
                f"walk (the kernel body traced once; {len(c.program)} instructions, {n} calls added)"
            )

    def _restart(self) -> None:
        """Forget a trace (its programs and HBM placement) before tracing again."""
        self.contexts = []
        self.shared = []
        self.device.hbm._reset()

    def _trace_once(self, args, kwargs, check: bool = True):
        """Trace every program of the grid once into `_Traced`."""
        arrays: list[tuple[np.ndarray, Tensor]] = []

        def conv(a):
            if isinstance(a, np.ndarray):
                t = self.device.hbm.put(a if a.ndim else a.reshape(1))
                arrays.append((a, t))
                return NkiTensor(t, "hbm")
            if isinstance(a, (np.generic,)):
                return a.item()
            if isinstance(a, tuple):
                return tuple(conv(x) for x in a)
            return a

        wargs = [conv(a) for a in args]
        wkw = {k: conv(v) for k, v in kwargs.items()}
        hbm = self.device.hbm
        recorder = hbm._native = _HbmRecorder(hbm._native)
        ranges = self.hbm_ranges  # (every trace's: a spare device is cleaned of all of them)
        ranges.update((t.offset, t.nbytes) for _, t in arrays)
        alloc = hbm.alloc

        def recording_alloc(*a, **k):
            t = alloc(*a, **k)
            ranges.add((t.offset, t.nbytes))
            return t

        hbm.alloc = recording_alloc
        n = int(np.prod(self.grid))
        results = []
        if wanted(self.kernel.options.get("progress")):
            self.trace_progress = TraceProgress(f"tracing {self.kernel.__name__}")
        try:
            for pid in range(n):
                ctx = TraceContext(self, pid)
                self.contexts.append(ctx)
                token = _TRACE.set(ctx)
                try:
                    try:
                        r = self.kernel.fn(*wargs, **wkw)
                    except AttributeError as e:
                        better = tile_attribute_error(e)
                        if better is None:
                            raise
                        raise better.with_traceback(e.__traceback__) from None
                    for hook in END_OF_TRACE:  # e.g. pending loads: issued, so their errors show
                        hook(ctx)
                    results.append(_to_hbm(r))
                    r = None  # (a returned tile is not kept by the launch: `_retire_tiles`)
                finally:
                    _TRACE.reset(token)
            if self.walking:
                self._walk(arrays)
        finally:
            hbm._native = recorder._native
            del hbm.alloc
            if self.trace_progress is not None:
                self.trace_progress.finish()
                self.trace_progress = None
        if self.ir_mode == "emit":
            for c in self.contexts:
                c.ir.check_end()
        elif self.contexts and isinstance(self.contexts[0].ir, record.Recorder):
            names = getattr(self, "input_names", None) or [""] * len(arrays)  # (an SPMD rank's run: none)
            named = [(t.block.lo, t.block.hi, t.shape, n) for (_, t), n in zip(arrays, names) if t.block]
            for c in self.contexts:
                c.ir.name_inputs(named)
        for c in self.contexts:  # passes over the finished IR, lowered into the program
            engine_choice.run(c)
        if not check:
            return None
        for c in self.contexts:  # passes over the finished program (before its synchronisation)
            psum_forward.run(c)
            copy_forward.run(c)
            value_reuse.run(c)
            dead_code.run(c)
        if not self.walking:  # (a walk places automatic tiles around the explicit ones: `lowering.py`)
            _check_placements(self.contexts)  # (before retiring: a conflict traces again)
        _retire_tiles(self.contexts, self.kernel.__name__)  # (the trace that is kept only)
        _check_result(results[0])
        _check_outputs_written(results[0], [t for _, t in arrays], self.contexts)
        traced = _Traced(self.contexts, [t for _, t in arrays], recorder.writes, results[0], ranges)
        if self.ir_mode is None and self.record_ir:
            traced.irs = [c.ir.ir for c in self.contexts]
        return arrays, traced

    def _run(self, traced: _Traced, arrays, framework: str):
        dev = self.device
        trace = self.kernel.options.get("trace", True)
        progress = self.kernel.options.get("progress")
        benign = len(traced.programs) > 1 and _identical_writes_mode(self.kernel) == "warn"
        self.kernel.last_programs = traced.programs  # (also when the run fails: for debugging)
        try:
            runs = [
                dev._run(group, check_races=True, trace=trace, progress=progress, identical_writes=benign)
                for group in traced.groups
            ]
        except RaceError as e:  # two programs writing the same HBM bytes: say whether it is real
            from . import races

            programs = {(0, p.core): f"program {pid}" for pid, p in enumerate(traced.programs)}
            new = races.explain(e, programs)
            if new is None:
                raise
            raise new from None
        self.kernel.last_result = runs[-1] if len(runs) == 1 else runs
        self.kernel.last_spills = dict(traced.spills)
        self.kernel.last_irs = traced.irs
        self.kernel.last_ir = traced.irs[0] if traced.irs else None
        found = [w for r in runs for w in r.identical_writes]
        if found:  # warned at the kernel's store line, not here
            _traceback.warn_identical(found, self.kernel)
        for pid, prefix, t in traced.prints:
            print(f"{prefix} (program {pid}):\n{dev.hbm.get(t.tensor)}")
        for i in traced.written_inputs:  # inputs the kernel wrote to: copied back, as on the device
            a, t = arrays[i]
            if not dev.hbm.holds(t, a):
                if a.flags.writeable:
                    a[...] = dev.hbm.get(t).reshape(a.shape)
                else:
                    _warn_read_only(self.kernel, self.input_names[i], a)
        return self._out(traced.result, framework)

    def _out(self, r, framework: str):
        """The kernel's results: its HBM tensors read back as arrays of `framework`."""
        if isinstance(r, NkiTensor):
            return interop.from_numpy(self.device.hbm.get(r.tensor), framework)
        if isinstance(r, tuple):
            return tuple(self._out(x, framework) for x in r)
        if isinstance(r, list):
            return [self._out(x, framework) for x in r]
        if isinstance(r, dict):
            return {k: self._out(v, framework) for k, v in r.items()}
        return r


def _sum_stats(stats) -> dict:
    out: dict = {}
    for st in stats:
        for k, v in st.items():
            out[k] = out.get(k, 0) + v
    return out


class _PlacementConflict(Exception):
    """A kernel's explicit placement landed on a live automatic tile while tracing: the launch
    traces again with `reserved` (every explicit range of every program) held from the start."""

    def __init__(self, reserved: dict, first: tuple) -> None:
        super().__init__()
        self.reserved, self.first = reserved, first

    def error(self, cause: Exception | None = None, why: str = "") -> AddressError:
        """The error when the automatic tiles cannot go around the explicit ranges."""
        mem, (lo, hi, label), (alo, ahi, alabel) = self.first
        if not why:
            why = "the emulator's tiles do not fit around the kernel's explicit placements"
            why += f" ({cause})" if isinstance(cause, CapacityError) else ""
        return AddressError(
            f"{label} is placed explicitly at {mem} bytes [{lo}, {hi}) per partition, over {alabel} "
            f"(bytes [{alo}, {ahi}), a tile the emulator placed itself while it was live), and "
            f"{why}; place that tile explicitly too, or move the explicit placement",
            operand="address",
            rule="nki_placement_over_automatic_tile",
        )


def _check_placements(contexts: list) -> None:
    """Raise `_PlacementConflict` when an explicit placement landed on a live automatic tile in
    any program (a silent overwrite otherwise: allocator.py)."""
    first = None
    for ctx in contexts:
        for alloc in (ctx.sbuf, ctx.psum):
            if alloc.conflicts and first is None:
                first = (alloc.what,) + alloc.conflicts[0]
    if first is None:
        return
    reserved: dict = {}
    for ctx in contexts:
        for alloc in (ctx.sbuf, ctx.psum):
            if alloc.placements:
                reserved.setdefault(ctx.pid, {})[alloc.what] = dict(alloc.placements)
    raise _PlacementConflict(reserved, first)


#: Default most programs one launch may trace (`nki.jit(max_programs=)`, TRN3EMU_NKI_MAX_PROGRAMS):
#: each traced program holds its instruction list in host memory (~0.37 MiB for a small kernel),
#: so 2^14 programs take ~6 GiB, under the 32 GiB a run may take (docs/limits.md).
MAX_PROGRAMS = 1 << 14


def _check_grid_size(kernel: Kernel, grid: tuple) -> None:
    """A launch of more programs than the limit fails before anything is traced."""
    limit = kernel.options.get("max_programs") or int(os.environ.get("TRN3EMU_NKI_MAX_PROGRAMS") or MAX_PROGRAMS)
    n = math.prod(grid)
    if n > limit:
        raise ResourceError(
            f"launch grid {grid} has {n} programs, over the limit of {limit} programs per launch "
            f"(each traced program takes host memory; raise it with nki.jit(max_programs=n) or "
            f"TRN3EMU_NKI_MAX_PROGRAMS)",
            rule="nki_grid_too_large",
        )


def _identical_writes_mode(kernel: Kernel) -> str:
    """How an SPMD launch treats cores writing identical bytes to the same HBM unordered:
    "warn" (default: `IdenticalWritesWarning`) or "error" (a race), from
    `nki.jit(identical_writes=)` or else `TRN3EMU_NKI_IDENTICAL_WRITES`."""
    mode = kernel.options.get("identical_writes") or os.environ.get("TRN3EMU_NKI_IDENTICAL_WRITES") or "warn"
    if mode not in ("warn", "error"):
        raise OperandError(
            f"identical_writes must be 'warn' or 'error', got {mode!r}", rule="nki_identical_writes_mode"
        )
    return mode


def _warn_read_only(kernel: Kernel, name: str, a: np.ndarray) -> None:
    """The kernel wrote an input the caller's array cannot take back (a JAX array, a read-only
    numpy array): `ReadOnlyInputWarning` naming the input (`warnings.simplefilter("error", ...)`
    makes it an error)."""
    warnings.warn(
        f"kernel {kernel.__name__} wrote input {name} {a.shape} {a.dtype}, but the "
        f"caller's array is read-only: the write is not copied back",
        ReadOnlyInputWarning,
        stacklevel=4,
    )


def _device_env() -> tuple:
    return tuple(os.environ.get(v) for v in _DEVICE_ENV)


def _check_result(r) -> None:
    """A kernel returns HBM tensors (possibly nested in tuples / lists / dicts)."""
    if isinstance(r, NkiTensor):
        if r.buffer not in HBM_BUFFERS:
            raise MemorySpaceError(
                f"a kernel returns HBM tensors (nl.shared_hbm); it returned a {r.buffer} tile {r.shape}",
                rule="nki_return_not_hbm",
            )
    elif isinstance(r, (tuple, list)):
        for x in r:
            _check_result(x)
    elif isinstance(r, dict):
        for x in r.values():
            _check_result(x)


def _host_arrays(kernel: Kernel, args, kwargs, originals: list, copies: list | None = None):
    """The launch's arguments with every array (also inside tuples) as numpy (`interop.to_numpy`,
    sharing memory where the framework allows, so inputs the kernel writes are written back);
    the original arrays are appended to `originals` (their frameworks pick the results'), and
    (tensor, host copy, snapshot of it) of each tensor held off the host to `copies`
    (`interop.send_home`)."""

    def conv(a, name: str):
        if isinstance(a, tuple):
            return tuple(conv(x, f"{name}[{i}]") for i, x in enumerate(a))
        if not interop.is_array(a):
            return a
        originals.append(a)
        if isinstance(a, np.ndarray):
            return a
        host = interop.to_numpy(a, name)
        if copies is not None and interop.off_host(a):
            copies.append((a, host, host.copy()))  # (the snapshot: only inputs the kernel wrote go back)
        return host

    names = kernel.parameter_names()
    wargs = tuple(conv(a, names[i] if i < len(names) else f"argument {i}") for i, a in enumerate(args))
    return wargs, {k: conv(v, k) for k, v in kwargs.items()}


def _input_arrays(args, kwargs) -> list:
    """The numpy arrays of a launch's arguments, in the order tracing placed them in HBM."""
    out: list = []

    def walk(a):
        if isinstance(a, np.ndarray):
            out.append(a)
        elif isinstance(a, tuple):
            for x in a:
                walk(x)

    for a in args:
        walk(a)
    for v in kwargs.values():
        walk(v)
    return out


def _input_names(kernel: Kernel, args, kwargs) -> list[str]:
    """The names of a launch's arrays (`x`, `pair[1]`), in the order of `_input_arrays`."""
    out: list[str] = []

    def walk(a, name: str):
        if isinstance(a, np.ndarray):
            out.append(name)
        elif isinstance(a, tuple):
            for i, x in enumerate(a):
                walk(x, f"{name}[{i}]")

    names = kernel.parameter_names()
    for i, a in enumerate(args):
        walk(a, names[i] if i < len(names) else f"argument {i}")
    for k, v in kwargs.items():
        walk(v, k)
    return out


def _to_hbm(r):
    """Returned SBUF/PSUM tiles are copied to new HBM tensors (as the legacy simulator returns
    their values); HBM tensors and other values pass through."""
    if isinstance(r, NkiTensor) and r.buffer in ONCHIP:
        out = upcalls.ndarray(r.shape, r.dtype, buffer="hbm")
        upcalls.store(out, value=r)
        return out
    if isinstance(r, (tuple, list)):
        return type(r)(_to_hbm(x) for x in r)
    if isinstance(r, dict):
        return {k: _to_hbm(v) for k, v in r.items()}
    return r


class Kernel:
    """A traced NKI kernel: `kernel(*arrays)` or `kernel[grid](*arrays)` runs it on trn3emu.

    Like a jit that caches compiled NEFFs, each traced launch is kept per call signature (grid,
    array shapes and dtypes, values of the other arguments, target): a repeated call only loads
    the inputs into a fresh device, runs and reads the outputs. `nki.jit(cache=False)` or
    TRN3EMU_NKI_CACHE=0 traces every call."""

    #: pytest collects callables named test_* that wrap a function (`__wrapped__`): a kernel named
    #: so (the SDK's `test_nl_broadcast(in_tensor)`) is not a test, as with the vendor's jit object
    __test__ = False

    def __init__(self, fn, **options) -> None:
        _check_kernel_function(fn)
        self.fn = fn
        self.options = options
        self.last_result = None
        self.last_programs: list = []
        #: the last launch's spill counts: spills, spilled_bytes, reloads, reloaded_bytes ({} when
        #: the allocation passes did not run)
        self.last_spills: dict = {}
        #: the kernel IR (`ir.KernelIR`) of the last launch's program 0 / of every program; None /
        #: [] when it was not recorded (`nki.jit(ir=True)`, TRN3EMU_NKI_IR=1, or the liveness pass ran)
        self.last_ir = None
        self.last_irs: list = []
        self.device_dependent = False  # set when a trace read device values (device loops)
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn
        #: traced launches by call signature (`_Run._key`), least recently used first
        self._cache: dict = {}
        resolve_target(options.get("platform_target"))
        _compile_config.check(options.get("compile_config"))

    def parameter_names(self) -> list[str]:
        """The names of the kernel function's positional parameters (for error messages)."""
        names = self.__dict__.get("_parameter_names")
        if names is None:
            try:
                params = inspect.signature(self.fn).parameters.values()
            except (TypeError, ValueError):
                params = []  # type: ignore[assignment]
            kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            names = self._parameter_names = [p.name for p in params if p.kind in kinds]
        return names

    def cache_clear(self) -> None:
        """Forget every traced launch: the next call traces again."""
        self._cache.clear()

    def __getitem__(self, grid) -> _Launcher:
        grid = _grid(grid)
        if not grid or any(g < 1 for g in grid):
            raise ShapeError(f"launch grid {grid} must be positive", rule="nki_grid_not_positive")
        _check_grid_size(self, grid)
        return _Launcher(self, grid)

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True  # noqa: F841 (pytest: the launch frame is not the kernel's)
        outer = _TRACE.get()
        if outer is not None and not _host_launch(args, kwargs):
            return self.fn(*args, **kwargs)  # a kernel called on tiles inside another is a function
        try:
            return _launch(self, (1,), args, kwargs, outer)
        except Exception as e:
            # the same error: kernel frames only, printed once (`_traceback.present`)
            raise _traceback.present(e, self)  # noqa: B904


def _check_kernel_function(fn) -> None:
    """A kernel is a plain function: a generator or coroutine function would trace nothing (its
    call returns a generator / coroutine without running the body)."""
    if not callable(fn):
        raise ArgumentTypeError(
            f"nki.jit takes a kernel function, got {fn!r} ({type(fn).__name__})",
            operand="fn",
            rule="nki_kernel_not_callable",
        )
    what = (
        "an async generator function"
        if inspect.isasyncgenfunction(fn)
        else "a generator function"
        if inspect.isgeneratorfunction(fn)
        else "a coroutine function (async def)"
        if inspect.iscoroutinefunction(fn)
        else None
    )
    if what is not None:
        raise not_supported(
            f"kernel {getattr(fn, '__name__', fn)!r} is {what}",
            "calling it returns without running its body, so nothing would be traced; "
            "a kernel is a plain def that returns its outputs",
            rule="nki_kernel_generator",
        )


def _grid(grid) -> tuple:
    """A launch grid (an int or a tuple / list of ints) as a tuple of ints; anything else (a
    string, a float, a nested list) raises instead of being converted."""
    dims = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
    out = []
    for g in dims:
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
            raise ArgumentTypeError(
                f"launch grid {grid!r}: every dimension must be an integer, got {g!r} ({type(g).__name__})",
                operand="grid",
                rule="nki_grid_not_integer",
            )
        out.append(int(g))
    return tuple(out)


class _Launcher:
    def __init__(self, kernel: Kernel, grid: tuple) -> None:
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True  # noqa: F841
        outer = _TRACE.get()
        if outer is not None and not _host_launch(args, kwargs):
            raise not_supported(
                f"launching {self.kernel.__name__}[{', '.join(map(str, self.grid))}] on tiles while "
                f"kernel {outer.launch.kernel.__name__} traces",
                "a launch takes host arrays (it runs on a device of its own); call the kernel "
                "without a grid to inline it",
                rule="nki_nested_launch",
            )
        try:
            return _launch(self.kernel, self.grid, args, kwargs, outer)
        except Exception as e:
            # the same error: kernel frames only, printed once (`_traceback.present`)
            raise _traceback.present(e, self.kernel)  # noqa: B904


def _host_launch(args, kwargs) -> bool:
    """Whether a kernel call made while another kernel traces is a launch of its own: it passes
    host arrays and no tile or HBM tensor of the trace."""
    host = False
    for a in (*args, *kwargs.values()):
        for x in a if isinstance(a, tuple) else (a,):
            if isinstance(x, NkiTensor):
                return False
            host = host or interop.is_array(x)
    return host


def _launch(kernel: Kernel, grid: tuple, args, kwargs, outer: TraceContext | None):
    """Trace (or reuse) and run one launch. Made while `outer` traces (a kernel on host arrays
    called from inside a kernel), it traces in a context of its own and the outer trace goes on
    unchanged after it. (The caller re-raises errors with the kernel's frames only.)"""
    __tracebackhide__ = True  # noqa: F841
    if outer is None:
        return _Run(kernel, grid)(args, kwargs)
    token = _TRACE.set(None)
    try:
        return _Run(kernel, grid)(args, kwargs)
    except Exception as e:
        if hasattr(e, "add_note"):
            e.add_note(
                f"  in launch {kernel.__name__}{list(grid)} made while kernel {outer.launch.kernel.__name__} traces"
            )
        raise
    finally:
        _TRACE.reset(token)


def wants_ir(kernel) -> bool:
    """Whether a literal trace of `kernel` records its IR: `nki.jit(ir=True)`, else
    TRN3EMU_NKI_IR=1 (recording costs tracing time; the liveness pass records it anyway)."""
    v = kernel.options.get("ir")
    if v is None:
        v = os.environ.get("TRN3EMU_NKI_IR", "0") not in ("", "0")
    return bool(v)


def jit(fn=None, **options):
    """`@nki.jit`, `@nki.jit(...)` or `nki.jit(fn, ...)`; options are accepted (platform_target is checked;
    the emulator's own: `passes=` (passes.py), `ir=True` to keep the kernel IR as `kernel.last_ir`,
    `cache=`, `fill=`, `trace=`, `progress=`)."""
    options.setdefault("dialect", "nki")  # (the legacy dialect's jit says "legacy": passes.py)
    if fn is None:
        return lambda f: Kernel(f, **options)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, **options)


#: `nki.simulate(plain_function)` gives the same Kernel (and so the same trace cache) every time.
_SIMULATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def simulate(kernel, **options):
    """`nki.simulate(kernel)(*arrays)` (also `nki.simulate(kernel[2])`): run on trn3emu."""
    if isinstance(kernel, _Launcher):
        return kernel
    if not isinstance(kernel, Kernel):
        if options:
            return Kernel(kernel, **options)
        try:
            k = _SIMULATED.get(kernel)
            if k is None:
                k = _SIMULATED[kernel] = Kernel(kernel)
            return k
        except TypeError:  # not weak-referenceable
            return Kernel(kernel)
    return kernel
