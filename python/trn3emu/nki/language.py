"""`nki.language`: tensors, buffers, dtypes, loops, SPMD ids, and the `nl.*` convenience ops.

Every `nl.*` op lowers to the `nki.isa` instructions it stands for (documented per function)
and returns a new SBUF tile (PSUM for `matmul` / `transpose`). Op functions double as op tokens
(`op=nl.add`): their `__name__` is the ISA operator or activation name.
"""

from __future__ import annotations

import builtins
import contextlib
import copy as _copy_module
import math
import sys
import warnings
from functools import partial as _partial

import numpy as np

from .. import _native, interop
from ..dtypes import numpy_dtype
from ..errors import AddressError, ArgumentTypeError, EmuError, OperandError, ShapeError
from ..tensor import MAX_FREE_DIMS, fits_access_pattern
from . import _frames, load_reuse, toolchain
from . import compiler as _compiler
from . import engine_choice as _engine_choice
from . import grids as _grids
from . import indexing as _indexing
from . import isa as nisa
from . import passes as _passes
from . import pending as _pending
from . import record as _record
from . import scalars as _scalars
from . import streams as _streams
from . import traced_once as _traced_once
from . import zero_fill as _zero_fill
from ._frames import _INTERNAL, _internal
from ._kernel import (
    DTYPES,
    HBM_BUFFERS,
    DSlice,
    Dtype,
    NkiTensor,
    _with_runtime_operands,
    as_dtype,
    current,
    missing_attribute,
    not_supported,
)
from ._kernel import tracing as _tracing_context
from ._kernel import unknown_parameter as _unknown_parameter
from ._kernel import upcalls as _upcalls
from .blocks import BlockTensor
from .indexing import ParDim, arange, mgrid, par_dim  # noqa: F401  (legacy index expressions)
from .pending import Pending

# ------------------------------------------------------------------------------------ dtypes
bool_ = DTYPES["bool"]
# NKI 0.6's 1-bit integers (one byte per element) serve kernels as predicates; carried as bool
# (0/1). int1's two's-complement range [-1, 0] is not modeled.
int1 = uint1 = bool_
int8, int16, int32 = DTYPES["int8"], DTYPES["int16"], DTYPES["int32"]
uint8, uint16, uint32 = DTYPES["uint8"], DTYPES["uint16"], DTYPES["uint32"]
float16, float32, bfloat16, tfloat32 = DTYPES["float16"], DTYPES["float32"], DTYPES["bfloat16"], DTYPES["tfloat32"]
float8_e4m3, float8_e4m3fn, float8_e5m2 = DTYPES["float8_e4m3"], DTYPES["float8_e4m3fn"], DTYPES["float8_e5m2"]
float8_e8m0fnu = DTYPES["float8_e8m0fnu"]
float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4 = (
    DTYPES["float8_e4m3fn_x4"],
    DTYPES["float8_e5m2_x4"],
    DTYPES["float4_e2m1fn_x4"],
)

# ----------------------------------------------------------------------------------- buffers
sbuf, psum, hbm, shared_hbm, private_hbm = "sbuf", "psum", "hbm", "shared_hbm", "private_hbm"


def is_sbuf(buffer) -> bool:
    return _buf(buffer) == "sbuf"


def is_psum(buffer) -> bool:
    return _buf(buffer) == "psum"


def is_hbm(buffer) -> bool:
    return _buf(buffer) in HBM_BUFFERS


def is_on_chip(buffer) -> bool:
    return _buf(buffer) in ("sbuf", "psum")


def _buf(b) -> str:
    return b.buffer if isinstance(b, NkiTensor) else str(b)


NkiTensor = NkiTensor  # annotations in kernels: `x: nl.NkiTensor`
# the NKI 2.34 grid views (`grids.py`)
NkiGrid, NkiTileGrid, NkiBlockGrid = _grids.NkiGrid, _grids.NkiTileGrid, _grids.NkiBlockGrid
tiles, blocks, alloc_tiles = _grids.tiles, _grids.blocks, _grids.alloc_tiles
alloc_blocks, grid_element_offset, GridElementOffset = (
    _grids.alloc_blocks,
    _grids.grid_element_offset,
    _grids.GridElementOffset,
)
# NKI 0.8 stream buffers (`streams.py`)
NkiStreamBuffers, alloc_stream_buffers = _streams.NkiStreamBuffers, _streams.alloc_stream_buffers
tensor = NkiTensor


class NKIObject:
    """Base class kernels subclass for helper objects; plain Python here."""


class _FloatInfo:
    """`nl.fp32.min` etc.: the finite range of a float dtype (as numpy.finfo)."""

    def __init__(self, np_dtype) -> None:
        import ml_dtypes

        fi = ml_dtypes.finfo(np_dtype)
        self.min, self.max, self.eps, self.tiny = float(fi.min), float(fi.max), float(fi.eps), float(fi.tiny)
        self.dtype = DTYPES[np.dtype(np_dtype).name]


fp32 = _FloatInfo(np.float32)
fp16 = _FloatInfo(np.float16)
bf16 = _FloatInfo(numpy_dtype("bfloat16"))


def finfo(dtype) -> _FloatInfo:
    """Legacy `nl.finfo(dtype)`: the finite range of a float dtype, as numpy.finfo (nki-samples'
    vision kernels fill with `nl.finfo(kernel_dtype).min`); host-side constants."""
    return _FloatInfo(numpy_dtype(as_dtype(dtype)))


class tile_size:
    """Tile-size constants of NeuronCore-v4 (reference §1.3), from the core's hardware constants."""

    pmax = _native.PARTITIONS
    psum_bank_fmax_bytes = _native.PSUM_BANK_BYTES
    psum_fmax = psum_bank_fmax = _native.PSUM_BANK_BYTES // 4  # fp32 elements per bank
    psum_num_banks = _native.PSUM_BANKS
    gemm_stationary_fmax = _native.PARTITIONS  # PE columns
    gemm_moving_fmax = _native.PSUM_BANK_BYTES // 4  # one fp32 PSUM bank
    bn_stats_fmax = 512
    psum_min_align = _native.PSUM_BANK_BYTES
    sbuf_min_align = 64
    sbuf_size_bytes = sbuf_fmax_bytes = total_available_sbuf_size = _native.SBUF_PARTITION_BYTES


# ------------------------------------------------------------------------------ index helpers
def ds(start, size) -> DSlice:
    return DSlice(start, size)


# ------------------------------------------------------------------------------------ loops
def _range(*args):
    return range(*(int(a) for a in args))


def _loop(kind: str, start, stop, step):
    r = _range(start) if stop is None else _range(start, stop, step)
    ctx = _tracing_context()
    if ctx is None:
        return r
    if kind != "static_range" and _legacy(ctx):  # (its body traced once by the toolchain)
        r = _traced_once.OnceRange(r, ctx)
    if ctx.ir is not None and ctx.ir.mode != "emit":  # the kernel IR's loop nest (record.py)
        return ctx.ir.loop(r, kind, sys._getframe(2))
    return r


def _legacy(ctx) -> bool:
    """Whether the launch's kernel is of the legacy dialect (`passes.legacy_dialect`), once per trace."""
    v = ctx.__dict__.get("_legacy")
    if v is None:
        v = ctx._legacy = _passes.legacy_dialect(ctx.launch.kernel)
    return v


def affine_range(start, stop=None, step=1):
    """Unrolled at trace time (every NKI iterator is unrolled at specialisation)."""
    return _loop("affine_range", start, stop, step)


def sequential_range(start, stop=None, step=1):
    """Unrolled at trace time, as `affine_range` (the dependence between iterations is kept by
    the instructions' own dependences)."""
    return _loop("sequential_range", start, stop, step)


def static_range(start, stop=None, step=1):
    """Unrolled at trace time, as `affine_range`."""
    return _loop("static_range", start, stop, step)


def _is_reg(v) -> bool:
    return isinstance(v, nisa.VirtualRegister)


def _recorder():
    """The trace's IR recorder when it keeps the loop nest (record.py), else None."""
    ctx = _tracing_context()
    if ctx is not None and ctx.ir is not None and ctx.ir.mode != "emit":
        return ctx.ir
    return None


def _loop_register(values, rec=None, loop=None, scalar=False):
    """One register for a device loop's iteration value (register_move per iteration); `loop`
    (the kernel IR's Loop when `rec` records it) is in the nest of the calls of each iteration.
    `scalar`: the value is an int32 NkiScalar (bounds that are NkiScalars, as NKI documents)."""
    entry = rec.enter(loop, len(values)) if loop is not None else None
    reg = _scalars.loop_scalar() if scalar else nisa.register_alloc()
    try:
        for k, i in enumerate(values):
            if entry is not None:
                rec.iteration(entry, k)
            nisa.register_move(reg, int(i))
            yield reg
    finally:
        if entry is not None:
            rec.leave(entry)


def dynamic_range(start, stop=None, step=1):
    """A device loop: register bounds are read on the device (registers.device_value: the kernel so
    far runs, tracing continues with the loop unrolled) and the iteration value is a register; with
    int bounds, the same iterations unrolled with int values. Deprecated in NKI 0.6.0 (the SDK's
    migration guide: use `fori_loop`): a DeprecationWarning at the kernel's line."""
    # the kernel's line: the first frame outside the package (the call reaches here through
    # `_checked`'s wrapper, so a fixed stacklevel would name language.py)
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and _frames._internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        "nl.dynamic_range is deprecated since NKI 0.6.0 and will be removed in a future release; "
        "write the loop with nl.fori_loop(lower, upper, body) (NKI 0.5 -> 0.6 migration guide)",
        DeprecationWarning,
        stacklevel=level,
    )
    return _dynamic_range(start, stop, step, "dynamic_range", sys._getframe(1))


def _dynamic_range(start, stop=None, step=1, kind: str = "dynamic_range", frame=None):
    if stop is None:
        start, stop = 0, start
    rec = _recorder() if frame is not None else None
    if _is_reg(start) or _is_reg(stop):
        from .registers import device_value

        # (the Loop now, while the kernel's frame is at the call: its for statement's variable)
        loop = rec.site_loop(kind, frame) if rec is not None else None
        if loop is not None:
            loop.device = True
        # i is an NkiScalar unless a bound is a plain VirtualRegister (register_alloc)
        scalar = not builtins.any(_is_reg(b) and not isinstance(b, nisa.NkiScalar) for b in (start, stop))
        return _loop_register(range(device_value(start), device_value(stop), int(step)), rec, loop, scalar)
    r = _range(start, stop, step)
    return r if rec is None else rec.loop(r, kind, frame)


def fori_loop(lower, upper, body_fun, step=1, init_val=None):
    """`body_fun(i)` for i in range(lower, upper, step) (or body_fun(i, carry)); unrolled while
    tracing. Register bounds are read on the device first and i is then a register (`dynamic_range`)."""
    it = _dynamic_range(lower, upper, step, "fori_loop", sys._getframe(1))
    carry = init_val
    for i in it:
        carry = body_fun(i) if init_val is None else body_fun(i, carry)
    return carry


def while_loop(init, body_fun=None, *args, **kwargs):
    """`r = init; while r: r = body_fun(r)`; a register condition is read on the device before
    every iteration (`registers.device_value`); an int condition is evaluated while tracing."""
    if body_fun is None:
        raise not_supported("nl.while_loop call form", "while_loop(init, body_fun)", rule="nki_call_form")
    from .registers import device_value

    rec = _recorder()
    entry = None
    if rec is not None:  # (the kernel IR's nest: a device loop when the condition is a register)
        lp = rec.site_loop("while_loop", sys._getframe(1))
        lp.device = lp.device or _is_reg(init)
        entry = rec.enter(lp, None)
    r, k = init, 0
    try:
        while device_value(r) if _is_reg(r) else r:
            if entry is not None:
                rec.iteration(entry, k)
            r = body_fun(r)
            k += 1
    finally:
        if entry is not None:
            entry[1] = k - 1  # (the trip count `leave` fills in: k iterations)
            rec.leave(entry)


def if_else(cond, then_fn, else_fn=None):
    """NKI 0.8: `then_fn()` when `cond` is nonzero, else `else_fn()` (if given). A Python bool / int
    is decided while tracing; an NkiScalar (or a register) is read on the device
    (`registers.device_value`: the program traced so far runs, the value is read, tracing continues)
    and only the branch the device chose is traced. Single-program launches, as device loops."""
    for what, fn in (("then_fn", then_fn), ("else_fn", else_fn)):
        if fn is not None and not callable(fn):
            raise ArgumentTypeError(
                f"nl.if_else: {what} must be a function taking no arguments, got {type(fn).__name__}",
                operand=what,
                rule="nki_if_else_branch",
            )
    if then_fn is None:
        raise ArgumentTypeError(
            "nl.if_else: then_fn must be a function taking no arguments, got None",
            operand="then_fn",
            rule="nki_if_else_branch",
        )
    if _is_reg(cond):
        bound = getattr(cond, "bound", None)
        if bound is not None:
            raise OperandError(
                f"nl.if_else: the condition is a scalar bound to the {bound} sequencer (scalar_load(..., "
                "engine=)); every sequencer runs the branch, so the condition must be available on all "
                "engines: load it without engine=",
                operand="cond",
                rule="nki_if_else_bound_condition",
            )
        from .registers import device_value

        taken = device_value(cond) != 0
    elif isinstance(cond, (bool, int, np.integer, np.bool_)):
        taken = bool(cond)
    elif isinstance(cond, NkiTensor):
        raise not_supported(
            "nl.if_else with a tile as the condition",
            "the condition is a Python bool / int or an NkiScalar: read the 1x1 tile with nisa.scalar_load first",
            rule="nki_if_else_condition",
        )
    else:
        raise ArgumentTypeError(
            f"nl.if_else: cond must be a Python bool / int or an NkiScalar, got {type(cond).__name__}",
            operand="cond",
            rule="nki_if_else_condition",
        )
    fn = then_fn if taken else else_fn
    if fn is not None:
        fn()


@contextlib.contextmanager
def no_reorder():
    """Program order is already the issue order of every engine stream here; nothing to pin."""
    ctx = current()
    ctx.no_reorder_depth += 1
    try:
        yield
    finally:
        ctx.no_reorder_depth -= 1


# ------------------------------------------------------------------------------------- SPMD
def _tracing() -> bool:
    from . import _kernel

    return _kernel.tracing() is not None


# Outside a traced kernel (host-side helper code that sizes a launch) there is no launch grid:
# program_ndim() is 0, num_programs() 1 and program_id() 0 (a choice; NKI does not document it).
# Outside a traced kernel (host code building a launch config) there is no launch: program_id,
# num_programs and program_ndim return None. nki-library sizes LNC configs on the host with
# `get_program_sharding_info()` and falls back to the requested program count when the count it
# gets is falsy (`shard_info[1] or num_programs`), which its LNC=2 tests rely on.
def program_id(axis=0) -> int | None:
    if not _tracing():
        return None
    ctx = current()
    idx = np.unravel_index(ctx.pid, ctx.launch.grid)
    return int(idx[int(axis)])


def num_programs(axes=None) -> int | None:
    if not _tracing():
        return None
    grid = current().launch.grid
    if axes is None:
        return int(np.prod(grid))
    if isinstance(axes, (tuple, list)):
        return int(np.prod([grid[a] for a in axes]))
    return int(grid[int(axes)])


class _NC(int):
    """`nl.nc(n)`: n physical NeuronCores (a legacy SPMD grid annotation)."""


def nc(n) -> _NC:
    return _NC(int(n))


def spmd_dim(*dims) -> int:
    """Legacy `nl.spmd_dim(n, nl.nc(k))` grid entry: n programs on each of k cores, i.e. n * k
    programs along that grid axis (program k of the launch runs on core k mod 8 here)."""
    return math.prod(int(d) for d in dims)


def program_ndim() -> int | None:
    return len(current().launch.grid) if _tracing() else None


# ---------------------------------------------------------------------------------- tensors
def ndarray(shape, dtype, buffer=None, name="", address=None, **kwargs) -> NkiTensor:
    """A new (uninitialised) tensor; SBUF/PSUM from the allocator, or at `address`.

    A legacy shape with `nl.par_dim` after leading block dims, `(n, nl.par_dim(P), F)`, is a
    block tile: one physical [P, F] tile per block, allocated when first used and rotated as the
    kernel advances (`BlockTensor`, `blocks.py`)."""
    if (
        not kwargs
        and address is None
        and type(buffer) is str
        and type(shape) is tuple
        and ParDim not in map(type, shape)
    ):
        return current().tile(shape, dtype, buffer, name)  # the common case (what the rest does with it)
    kwargs.pop("lazy_initialization", None)  # legacy scheduling hint: no effect here
    if kwargs:
        _misspelt_keyword("ndarray", kwargs)
        raise not_supported(f"nl.ndarray({', '.join(kwargs)}=...)", rule="nki_keyword_unsupported")
    pd = [i for i, s in enumerate(shape) if isinstance(s, ParDim)] if isinstance(shape, (tuple, list)) else []
    if address is not None or isinstance(buffer, _compiler.AllocatedBuffer):
        ctx = current()
        if ctx.once is not None:  # (a legacy loop body the toolchain traced once: `traced_once.py`)
            f = sys._getframe(1)
            buffer, address = _traced_once.placement(ctx, (f.f_code, f.f_lasti), buffer, address)
    if isinstance(buffer, _compiler.AllocatedBuffer):  # legacy direct allocation (ncc.sbuf.alloc / mod_alloc)
        if pd and pd[0] > 0:  # a block tile: each block where the function places it
            dims = tuple(int(s) for s in shape)
            return BlockTensor(
                dims,
                pd[0],
                as_dtype(dtype),
                buffer.buffer,
                name,
                buffer.block_placer(dims, pd[0], as_dtype(dtype).itemsize),
            )
        address = buffer.address(tuple(int(s) for s in shape), as_dtype(dtype).itemsize)
        buffer = buffer.buffer
    buf = "sbuf" if buffer is None else _buf(buffer)
    if pd and pd[0] > 0 and buf in ("sbuf", "psum"):
        dims = tuple(int(s) for s in shape)
        placer = None if address is None else _dense_blocks(dims, pd[0], as_dtype(dtype).itemsize, address)
        return BlockTensor(dims, pd[0], as_dtype(dtype), buf, name, placer)
    return current().alloc(shape, dtype, buf, name, address)


def _dense_blocks(dims: tuple, pd: int, itemsize: int, address):
    """`address=(partition, byte)` of a block tile: the blocks one after another from there (block
    b, in row-major order of the block dims, at byte + b * bytes per partition of a block)."""
    a = tuple(address) if isinstance(address, (tuple, list)) else (address,)
    start, byte = (0, a[0]) if len(a) == 1 else a[-2:]
    row = itemsize * math.prod(dims[pd + 1 :])

    def place(b: tuple) -> tuple:
        lin = 0
        for i, n in zip(b, dims[:pd]):
            lin = lin * n + i
        return int(start), int(byte) + lin * row

    return place


def empty_like(t, dtype=None, buffer=None, name="") -> NkiTensor:
    return ndarray(t.shape, dtype or t.dtype, buffer or t.buffer, name)


def full(shape, fill_value, dtype, buffer=None, name="", address=None, lazy_initialization=None) -> NkiTensor:
    """A new tensor filled with `fill_value`: memset on chip, written at load time in HBM."""
    t = ndarray(shape, dtype, buffer, name, address)
    if isinstance(t, BlockTensor):  # each block is filled when first used
        t._init = fill_value
        return t
    if t.buffer in HBM_BUFFERS:
        ctx = current()
        ctx.device.hbm.write(t.tensor, np.full(t.shape, fill_value, numpy_dtype(t.tensor.dtype)))
        ctx.hbm_writes.append((t.tensor.offset, t.tensor.offset + t.tensor.nbytes))  # written, before the run
    elif not (fill_value == 0 and t.buffer == "psum" and address is None and _zero_fill.defer(current(), t)):
        nisa.memset(t, value=fill_value)  # (a PSUM zero fill may be deferred: pass zero_fill)
    return t


def zeros(shape, dtype, buffer=None, name="", address=None, lazy_initialization=None) -> NkiTensor:
    return full(shape, 0, dtype, buffer, name, address)


def ones(shape, dtype, buffer=None, name="", address=None, lazy_initialization=None) -> NkiTensor:
    return full(shape, 1, dtype, buffer, name, address)


def zeros_like(t, dtype=None, buffer=None, name="") -> NkiTensor:
    return zeros(t.shape, dtype or t.dtype, buffer or t.buffer, name)


def ones_like(t, dtype=None, buffer=None, name="") -> NkiTensor:
    return ones(t.shape, dtype or t.dtype, buffer or t.buffer, name)


def full_like(t, fill_value, dtype=None, buffer=None, name="") -> NkiTensor:
    return full(t.shape, fill_value, dtype or t.dtype, buffer or t.buffer, name)


def shared_constant(constant, dtype=None, **kwargs) -> NkiTensor:
    """An HBM tensor holding a constant array (or the contents of an .npy path); torch / JAX /
    DLPack arrays are taken as `trn3emu.interop` converts them."""
    a = np.load(constant) if isinstance(constant, str) else interop.to_numpy(constant, "constant")
    if dtype is not None:
        a = a.astype(numpy_dtype(dtype))
    ctx = current()
    t = ctx.device.hbm.put(a if a.ndim else a.reshape(1))
    ctx.hbm_writes.append((t.offset, t.offset + t.nbytes))
    return NkiTensor(t, "shared_hbm")


def shared_identity_matrix(n, dtype=uint8, **kwargs) -> NkiTensor:
    """An n x n identity in SBUF (loaded by DMA from an HBM constant)."""
    src = shared_constant(np.eye(int(n)), dtype=dtype)
    return load(src)


# ------------------------------------------------------------------------------- data motion
#: DMA queue policy of the front end's own transfers: loads (`nl.load`, `tile[...] = hbm`) go on the
#: sync engine's queue (the ISA default), stores (`nl.store`, `hbm[...] = tile`) on the scalar
#: (Activation) engine's queue, so a kernel's output stream never waits behind its input stream.
STORE_QUEUE = "scalar"


def load(src, dtype=None, **kwargs) -> NkiTensor:
    """HBM -> a new SBUF tile (`dma_copy`; a dtype change is the DMA's cast). The DMA is pending
    (`pending.py`): `tile[...] = nl.load(src)` is one DMA straight into `tile`."""
    if kwargs:
        _no_mask("load", kwargs)
    odt = dtype or src.dtype
    if type(odt) is not Dtype:
        odt = as_dtype(odt)
    ctx = _tracing_context()
    if (ctx is None or not ctx.masks) and isinstance(src, NkiTensor):  # (not `_indexing.active()`)
        shape = tuple(src.shape)
        if len(shape) == 2 and shape[0] > tile_size.pmax:
            _check_load_rows(src, odt)  # now: the pending DMA is issued (and checked) where it is used
        spec, emit = (shape, odt, sbuf), _partial(_load_dma, src=src)
        fresh = load_reuse.Fresh(src, odt, ctx)  # (pass load_reuse: a reload may read SBUF)
        if ctx is None:
            return Pending(spec, emit, origin="nl.load", fresh=fresh)  # (raises: not tracing)
        return _pending.result(ctx, spec, emit, "nl.load", None, fresh)
    t = ndarray(src.shape, odt, sbuf)
    _load_dma(t, src)
    return t


def _load_dma(dst, src) -> None:
    """`nl.load`'s DMA, marked as such in a recording trace's IR (`value_reuse.plan_ir` reuses
    loads, as the pass `load_reuse` does while tracing, only those of `nl.load`)."""
    nisa.dma_copy(dst=dst, src=src)
    ctx = _tracing_context()
    rec = (ctx if ctx is not None else current()).ir
    if rec is not None and rec.mode == "plan":
        rec.issued_by("nl.load")


def _check_load_rows(src, odt) -> None:
    """A load's SBUF result holds src's first dim on partitions: more than 128 rows fail at the
    load's own line (its DMA is pending, so the tile is made where the result is first used)."""
    shape = tuple(src.shape)
    if len(shape) == 2 and shape[0] > tile_size.pmax:  # (3-d: block tiles may take more)
        n = -(-shape[0] // tile_size.pmax)
        raise AddressError(
            f"nl.load of a {list(shape)} tensor: the SBUF result ({shape[0]}, ...) {odt} would span "
            f"{shape[0]} partitions, beyond the {tile_size.pmax} partitions. fix: load at most "
            f"{tile_size.pmax} rows per tile: `for i in range({n}): t = nl.load(src[i * 128:(i + 1) * 128])`",
            operand="src",
            rule="partitions_out_of_range",
        )


def store(dst, value, **kwargs) -> None:
    """A tile -> HBM (`dma_copy` on the scalar queue, `STORE_QUEUE`; PSUM goes through an SBUF
    `tensor_copy` first: DMA cannot read PSUM).
    A scalar value fills dst (`memset` of an SBUF tile, then `dma_copy` per 128 rows)."""
    if kwargs:
        _no_mask("store", kwargs)
    if not isinstance(value, NkiTensor):
        rows = dst.shape[0] if dst.ndim > 1 else 1
        flat = dst if dst.ndim > 1 else dst.reshape((1, dst.size))
        chunk = builtins.min(rows, tile_size.pmax)
        t = full((chunk,) + tuple(flat.shape[1:]), value, dst.dtype, sbuf)
        for r0 in range(0, rows, chunk):
            n = builtins.min(chunk, rows - r0)
            nisa.dma_copy(dst=flat[r0 : r0 + n], src=t[0:n])
        return
    if value.buffer == "psum":
        value = _sbuf_operand(value)
    ctx = _tracing_context()
    program = (ctx if ctx is not None else current()).program
    nisa.dma_copy(dst=dst, src=value, engine=_engine_choice.store_engine(program, STORE_QUEUE))


def static_cast(x, dtype):
    """A numpy array (host code) cast with numpy; a tile cast on chip (`tensor_copy`)."""
    if isinstance(x, np.ndarray) or np.isscalar(x):
        return np.asarray(x).astype(numpy_dtype(as_dtype(dtype)))
    return copy(x, dtype=dtype)


def all_reduce(x, op, program_axes, dtype=None, parallel_reduce=True, asynchronous=False, **kwargs) -> NkiTensor:
    """Legacy: reduce a tile over the SPMD programs that differ only along `program_axes` (the
    device `all_reduce` on their cores; launches of at most 8 programs)."""
    _no_mask("all_reduce", kwargs)
    ctx = current()
    grid = ctx.launch.grid
    n = math.prod(grid)
    if n > 8:
        raise not_supported(
            "nl.all_reduce in a launch of more than 8 programs",
            "programs 8.. run separately",
            rule="nki_all_reduce_programs",
        )
    axes = {int(a) for a in (program_axes if isinstance(program_axes, (list, tuple)) else (program_axes,))}
    me = np.unravel_index(ctx.pid, grid)
    group = [
        p
        for p in range(n)
        if builtins.all(c == m for d, (c, m) in enumerate(zip(np.unravel_index(p, grid), me)) if d not in axes)
    ]
    x = _sbuf_operand(_onchip(x))
    out = ndarray(x.shape, dtype or x.dtype, sbuf)
    nisa.all_reduce(dst=out, src=x, cores=group, reduce_op=nisa.op_name(op))
    return out


def atomic_rmw(dst, value, op, mask=None, **kwargs) -> None:
    """dst = op(dst, value) on HBM, atomically per element: `dma_compute` read-add-write (op add only;
    a dst indexed by an index tile, `t[idx_tile, i_f]`, is a scatter-add, indices unique).

    A tile `mask` ((P, 1), nonzero = update) on a scatter-add skips the rows it clears: their
    indices are replaced by an out-of-range one (`tensor_copy_predicated`) and the DMA runs with
    oob_mode=skip."""
    _no_mask("atomic_rmw", kwargs)
    if nisa.op_name(op) != "add":
        raise not_supported(
            f"nl.atomic_rmw(op={nisa.op_name(op)})", "the DMA read-modify-write adds", rule="nki_atomic_rmw_op"
        )
    value = _sbuf_operand(_onchip(value)) if isinstance(value, NkiTensor) else value
    if not isinstance(value, NkiTensor):
        raise not_supported("nl.atomic_rmw with a scalar value", "pass a tile", rule="nki_atomic_rmw_scalar")
    if mask is None:
        nisa.dma_compute(dst, [dst, value], reduce_op="add")
        return
    dyn = getattr(dst.tensor, "dyn", None)
    if not isinstance(mask, NkiTensor) or dyn is None or dyn[0] != "v":
        raise not_supported(
            "nl.atomic_rmw(mask=...)", "a tile mask on a dst indexed by an index tile", rule="nki_atomic_rmw_mask"
        )
    index = getattr(dst._block, "tiles", ())
    index = next((o for o in index if isinstance(o, NkiTensor) and o.tensor._static_ap() == dyn[1]), None)
    if index is None:
        raise not_supported("nl.atomic_rmw(mask=...)", "a dst indexed by an index tile", rule="nki_atomic_rmw_mask")
    _, _, step, bound = dyn
    kept = full(index.shape, bound, index.dtype, sbuf)  # `bound` is one past the last row: skipped
    nisa.tensor_copy_predicated(dst=kept, src=index, predicate=_onchip(mask))
    view = _copy_module.copy(dst.tensor)
    view.dyn = ("v", kept.tensor._static_ap(), step, bound)
    target = NkiTensor(view, dst.buffer, dst._block, dst.name)
    target = _with_runtime_operands(target, kept)
    nisa.dma_compute(target, [target, value], reduce_op="add", oob_mode="skip")


class _LoopReduce:
    """`dst[...] = nl.loop_reduce(x, op, loop_indices)`: dst = op(dst, x) (the destination is the
    other operand, per the API docs), issued at the assignment. Other uses are not supported: the
    destination is unknown until then."""

    def __init__(self, x, op, masks) -> None:
        self.x, self.op, self.masks = x, op, masks

    def _fuse_into(self, dst) -> bool:
        active_masks = current().masks
        n = len(active_masks)
        active_masks.extend(self.masks)  # the call's mask= applies to the reduction
        try:
            if _indexing._current_ranges() is not None:
                blk = dst._block
                fresh = blk is not None and not getattr(blk, "written", False)
                if fresh and _passes.enabled(current().launch.kernel, "reduce_init"):
                    # a fresh buffer no instruction wrote yet: the reduction starts from x (the
                    # op's identity as the start value, never stale bytes; docs/nki.md)
                    ctx = current()
                    n = _record.calls_so_far(ctx)
                    nisa.tensor_copy(dst=dst, src=_onchip(self.x))
                    _record.decided(ctx, "reduce_init", "reductions started from their first value", n)
                else:
                    nisa.tensor_tensor(dst=dst, data1=dst, data2=_onchip(self.x), op=self.op)
        finally:
            del active_masks[n:]
        return True

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise not_supported(
            "nl.loop_reduce result used other than as `dst[...] = nl.loop_reduce(...)`",
            "the reduction's destination is the assignment target",
            rule="nki_loop_reduce_use",
        )


def loop_reduce(x, op, loop_indices, dtype=None, **kwargs) -> _LoopReduce:
    """Reduce `x` into the assignment target across loop iterations (`dst = op(dst, x)`); the
    target's dtype is the result dtype. `loop_indices` is a compiler hint (no effect here)."""
    _no_mask("loop_reduce", kwargs)
    return _LoopReduce(x, op, list(_indexing.masks()))


def load_transpose2d(src, dtype=None, **kwargs) -> NkiTensor:
    """HBM [A, B] -> SBUF [B, A] via `dma_transpose`; with a `dtype` other than the source's
    ("data type to cast the output type to", the API page) the transposed tile is then converted
    by a `tensor_copy`: the DMA transpose moves raw elements."""
    _no_mask("load_transpose2d", kwargs)
    shape = (src.shape[1], src.shape[0])
    t = ndarray(shape, src.dtype, sbuf)
    if src.buffer in HBM_BUFFERS and src.dtype.itemsize == 1 and src.ndim == 2:
        # dma_transpose moves 2- and 4-byte elements; 1-byte data is read through a transposed
        # HBM view (element-wise descriptors), bit-exactly.
        nisa.dma_copy(dst=t, src=src.permute(1, 0))
    else:
        nisa.dma_transpose(dst=t, src=src)
    if dtype is None or numpy_dtype(dtype) == numpy_dtype(src.dtype):
        return t
    out = ndarray(shape, dtype, sbuf)
    nisa.tensor_copy(dst=out, src=t)
    return out


def copy(x, dtype=None, **kwargs) -> NkiTensor:
    """A new SBUF copy (`tensor_copy`; cast to `dtype`)."""
    _no_mask("copy", kwargs)
    x = _onchip(x)

    def emit(o):
        _split_wide(lambda o, x: nisa.tensor_copy(dst=o, src=x), o, x)

    return _result(x.shape, dtype or x.dtype, emit, (x,), "nl.copy", alu=False)


def _assign(dst: NkiTensor, value) -> None:
    """`dst[...] = value`: DMA when HBM is involved, else tensor_copy; scalars memset."""
    fuse = getattr(type(value), "_fuse_into", None)  # a legacy result not issued yet: write it here
    if fuse is not None and fuse(value, dst):
        return
    if isinstance(value, NkiTensor) and dst.same_view(value) and _own(dst._block) is _own(value._block):
        # `t[k] += u` ends by assigning the updated view to itself (the same allocation too: the
        # liveness pass's first trace may overlap tiles, and must decide as the second does)
        return
    if isinstance(value, _indexing.MaskedResult):  # only the masked part was computed
        pred, value = value._pred, NkiTensor(value._t, value.buffer, value._block, value.name)
        with _indexing.masked(pred):
            return _assign(dst, value)
    if isinstance(value, NkiTensor):
        if dst.buffer in HBM_BUFFERS or value.buffer in HBM_BUFFERS:
            if dst.buffer in HBM_BUFFERS:  # a store: the scalar queue (DMA queue policy, docs/nki.md)
                nisa.dma_copy(
                    dst=dst,
                    src=_sbuf_operand(value),
                    engine=_engine_choice.store_engine(current().program, STORE_QUEUE),
                )
            else:
                nisa.dma_copy(dst=dst, src=value)
        else:
            src = value
            if src.size != dst.size and src.shape[0] == dst.shape[0]:
                src = _bcast_free(src, dst.shape)
            _split_wide(lambda o, x: nisa.tensor_copy(dst=o, src=x), dst, src)
    else:
        if dst.buffer in HBM_BUFFERS:
            raise not_supported(
                "assigning a scalar to an HBM tensor", "memset an SBUF tile and store it", rule="nki_hbm_scalar_assign"
            )
        exact = isinstance(value, (int, np.integer)) and not isinstance(value, bool)  # int words fill exactly
        value = int(value) if exact else float(value)
        t = dst.tensor
        if dst.buffer == sbuf and len(t.shape) and not _start_partition_ok(t.start, t.shape[0]):
            # `t[1, j] = v`: an engine cannot start at partition 1; memset a tile at partition 0
            # and move it with a DMA, which reaches any partition (as the compiler lowers it)
            tmp = ndarray(dst.shape, dst.dtype, sbuf)
            nisa.memset(tmp, value=value)
            nisa.dma_copy(dst=dst, src=tmp)
            return
        nisa.memset(dst, value=value)


def _start_partition_ok(start: int, parts: int) -> bool:
    """The engines' start-partition rule (ISA reference: >64 partitions start at 0, 33..64 at 0 or
    64, <=32 at 0/32/64/96)."""
    if parts > 64:
        return start == 0
    if parts > 32:
        return start in (0, 64)
    return start % 32 == 0


def _own(block):
    """The allocation a view's `_block` stands for (a view with run-time operands wraps it)."""
    keep = getattr(block, "keep", None)
    return keep[0] if keep else block


def _no_mask(name, kwargs):
    if kwargs:
        _misspelt_keyword(name, kwargs)
        raise not_supported(f"nl.{name}({', '.join(kwargs)}=...)", rule="nki_keyword_unsupported")


def _misspelt_keyword(name, kwargs) -> None:
    """A keyword of `nl.<name>` that misspells one of its parameters: "did you mean" (difflib)."""
    import inspect

    f = globals().get(name)
    try:
        params = list(inspect.signature(f).parameters) if f is not None else []
    except (TypeError, ValueError):
        params = []
    for k in kwargs:
        if k not in params:
            e = _unknown_parameter(f"nl.{name}", k, params + ["mask"])
            if e is not None:
                raise e


def _sbuf_operand(v: NkiTensor) -> NkiTensor:
    if v.buffer == "psum":
        t = ndarray(v.shape, v.dtype, sbuf)
        nisa.tensor_copy(dst=t, src=v)
        return t
    return v


def _onchip(v):
    """HBM operands of nl ops are loaded into SBUF first (a convenience of this front end)."""
    if isinstance(v, NkiTensor) and v.buffer in HBM_BUFFERS:
        return load(v)
    return v


# --------------------------------------------------------------------------------- promotion
_FLOAT_RANK = ["float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float16", "bfloat16", "tfloat32", "float32"]
_INT_BITS = {"bool": 1, "uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "uint32": 32, "int32": 32}


def promote(a, b) -> Dtype:
    """NKI's documented promotion (reference §3.3): float+int -> the float; wider float wins
    (fp16+bf16 -> fp32, mixed fp8 -> bf16); int+int -> wider, signed when mixed."""
    if a is b and type(a) is Dtype:  # (the usual case: tiles of one dtype; an nl dtype is its DTYPES entry)
        return DTYPES[str.__str__(a)]
    a, b = str(as_dtype(a)), str(as_dtype(b))
    if a == b:
        return DTYPES[a]
    fa, fb = a in _FLOAT_RANK, b in _FLOAT_RANK
    if fa and fb:
        if {a, b} == {"float16", "bfloat16"}:
            return float32
        if a.startswith("float8") and b.startswith("float8"):
            return bfloat16
        return DTYPES[builtins.max(a, b, key=_FLOAT_RANK.index)]
    if fa or fb:
        return DTYPES[a if fa else b]
    if a == "bool" or b == "bool":
        return DTYPES[b if a == "bool" else a]
    bits = builtins.max(_INT_BITS[a], _INT_BITS[b])
    signed = a.startswith("int") or b.startswith("int")
    if signed and (
        a.startswith("uint") and _INT_BITS[a] >= _INT_BITS[b] or b.startswith("uint") and _INT_BITS[b] >= _INT_BITS[a]
    ):
        bits *= 2
    if bits > 32:
        return float32
    return DTYPES[("int" if signed else "uint") + str(bits)]


# ------------------------------------------------------------------------- broadcast helpers
def _bcast_free(t: NkiTensor, shape) -> NkiTensor:
    """Stride-0 view of a [P, 1...] tile over the free dims of `shape`."""
    v = t
    if v.shape == shape:
        return v  # (nothing to broadcast: the loop below would leave it as it is)
    if v.ndim != len(shape):
        if v.size // v.shape[0] == 1:
            v = v.reshape((v.shape[0],) + (1,) * (len(shape) - 1))
        else:
            raise ShapeError(f"cannot broadcast {t.shape} to {tuple(shape)}", rule="nki_broadcast_shape")
    for d in range(1, len(shape)):
        if v.shape[d] != shape[d]:
            if v.shape[d] != 1:
                raise ShapeError(f"cannot broadcast {t.shape} to {tuple(shape)}", rule="nki_broadcast_shape")
            v = v.broadcast(d, shape[d])
    return v


#: dtypes the PE multiplies (the ones-row broadcast); others broadcast by DMA (`_bcast_partitions_dma`)
_PE_DTYPES = frozenset(("float32", "tfloat32", "bfloat16", "float16", "float8_e4m3", "float8_e4m3fn", "float8_e5m2"))


def _ones_row(parts: int, dtype) -> NkiTensor:
    """The program's [1, parts] row of ones of `dtype` for PE broadcasts: filled once (one memset,
    at the first broadcast) and kept for the rest of the program, as a compiler keeps a constant.
    The tutorial counts a partition broadcast as one TensorE instruction (fused Mamba, step 1: "a
    separate instruction on TensorE"); a memset per broadcast would put a VectorE instruction in
    front of every one of them (VectorE's in-order stream then chains the loop iterations)."""
    ctx = current()
    rows = ctx.__dict__.setdefault("_ones_rows", {})
    key = (parts, str(dtype))
    row = rows.get(key)
    if row is None:
        row = rows[key] = full((1, parts), 1.0, dtype)
    return row


def _bcast_partitions(t: NkiTensor, parts: int) -> NkiTensor:
    """[1, F] -> a new [parts, F] tile: ones[1, parts]^T @ t on the PE (exact: x * 1 summed once),
    one matmul per 512 columns into PSUM and a copy to SBUF (`nl.broadcast_to`: "this new tile will
    be in SBUF"); integer / bool tiles, which the PE does not multiply, by DMA (`_bcast_partitions_dma`)."""
    if t.shape[0] != 1:
        raise ShapeError(f"partition broadcast needs 1 partition, got {t.shape}", rule="nki_broadcast_partitions")
    if str(t.dtype) not in _PE_DTYPES:
        return _bcast_partitions_dma(t, parts)
    free = t.size
    flat = t.reshape((1, free)) if t.is_contiguous() else copy(t).reshape((1, free))
    ones_t = _ones_row(parts, float32 if t.dtype in ("float32", "tfloat32") else t.dtype)
    out = ndarray((parts,) + tuple(t.shape[1:]), t.dtype, sbuf)
    out_flat = out.reshape((parts, free))
    for f0 in range(0, free, 512):
        n = builtins.min(512, free - f0)
        acc = ndarray((parts, n), float32, psum)
        nisa.nc_matmul(acc, stationary=ones_t, moving=flat[:, f0 : f0 + n], accumulate=False)
        nisa.tensor_copy(dst=out_flat[:, f0 : f0 + n], src=acc)
        if t.dtype in ("float32", "tfloat32"):  # (same dtype: the pass `psum_forward` may drop it)
            program = current().program
            program.bcast_copies.append(len(program) - 1)
    return out


def _bcast_partitions_dma(t: NkiTensor, parts: int) -> NkiTensor:
    """[1, F] -> [parts, F] bit-exactly for any dtype: the row goes to a private HBM scratch row
    (`dma_copy`), which a second `dma_copy` reads `parts` times (a stride-0 HBM view). SBUF access
    patterns have no partition stride of 0, so the repeated read goes through HBM."""
    free = t.size
    row = ndarray((1, free), t.dtype, private_hbm)
    nisa.dma_copy(dst=row, src=t.reshape((1, free)) if t.is_contiguous() else copy(t).reshape((1, free)))
    out = ndarray((parts,) + tuple(t.shape[1:]), t.dtype, sbuf)
    nisa.dma_copy(dst=out.reshape((parts, free)), src=row.broadcast(0, parts))
    return out


def broadcast_to(x, shape, **kwargs) -> NkiTensor:
    """Broadcast a tile: free dims by a stride-0 view; the partition dim by a PE broadcast."""
    x = _onchip(x)
    shape = tuple(int(s) for s in shape)
    if x.shape[0] != shape[0]:
        x = _bcast_partitions(x, shape[0])
    return _bcast_free(x, shape) if x.shape != shape else x


def expand_dims(x, axis) -> NkiTensor:
    return x.expand_dim(int(axis))


# ------------------------------------------------------------------------------- elementwise
def _is_tile(v) -> bool:
    return isinstance(v, NkiTensor)


def _inplace(dst: NkiTensor, op: str, value) -> None:
    """`dst op= value` (`t[...] += u`): the op's instruction writes dst itself."""
    if dst.buffer in HBM_BUFFERS:
        raise not_supported(
            f"in-place {op} on an HBM tensor", "load it, update the tile, store it", rule="nki_hbm_inplace"
        )
    if op == "add" and isinstance(value, Pending) and value._accumulate_into(dst):
        return  # `psum[...] += matmul(...)`: one accumulating matmul into dst
    if dst.buffer == "psum" and isinstance(value, NkiTensor) and value.buffer == "psum":
        value = _sbuf_operand(value)  # an engine reads at most one PSUM input (`psum += matmul(...)`)
    _binary(op, dst, value, None, out=dst)


_MAX_DIMS = MAX_FREE_DIMS + 1  # (the partition dim and the free dims an access pattern has)


def _split_wide(issue, o, *tiles) -> None:
    """`issue(o, *tiles)` for an element-wise instruction whose tiles all have o's shape; when one
    of their views needs more free dims than an access pattern has (4: "up to four-dimensional
    arrays", the NKI Access Patterns deep dive) - a legacy index expression over many grid axes,
    `t[i_p, a + x, b + y, c + z]` - one instruction per index of the leading free dim, as many
    times as needed. Values are the same either way: every element is computed as before."""
    if len(o.shape) <= _MAX_DIMS:
        for t in tiles:
            if len(t.shape) > _MAX_DIMS:
                break
        else:
            issue(o, *tiles)  # (the usual case: at most 4 free dims, nothing to check)
            return
    views = (o, *tiles)
    if builtins.all(fits_access_pattern(v._t) for v in views) or builtins.any(v.shape != o.shape for v in tiles):
        issue(o, *tiles)
        return
    for k in range(o.shape[1]):
        _split_wide(issue, o[:, k], *(t[:, k] for t in tiles))


def _result(shape, dtype, emit, operands, origin: str, elementwise: bool = True, alu: bool = True):
    """The SBUF tile an nl op's last instruction `emit(dst)` writes: with pass `inplace_assign`
    (legacy kernels, `toolchain.py`) a pending result, so `t[...] = nl.op(...)` writes t itself
    where that is exact (`pending.InPlace`); else a new tile, written now."""
    ctx = _tracing_context()  # (`_indexing.active()`: its masks)
    if ctx is not None and not ctx.masks and toolchain.enabled("inplace_assign", ctx):
        if type(shape) is not tuple or len(shape) < 2:
            shape = tuple(shape) if len(shape) >= 2 else tuple(shape) + (1,)  # (as `ndarray` pads it)
        if type(dtype) is not Dtype:
            dtype = as_dtype(dtype)
        ip = (operands, elementwise, alu)  # (`InPlace`'s arguments: built if the result is assigned)
        return _pending.result(ctx, (shape, dtype, sbuf), emit, origin, ip)
    out = ndarray(shape, dtype, sbuf)
    emit(out)
    return out


def _binary(op: str, x, y, dtype, out=None) -> NkiTensor:
    xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)  # (`_is_tile`, `_onchip` inlined)
    if not xt and not yt:
        raise not_supported(f"nl.{op} of two scalars", "compute it in Python", rule="nki_scalar_operands")
    if xt and x.buffer in HBM_BUFFERS:
        x = load(x)
    if yt and y.buffer in HBM_BUFFERS:
        y = load(y)
    if not (xt and yt):
        tile, scalar, rev = (x, y, False) if _is_tile(x) else (y, x, True)

        def emit_scalar(o):
            _split_wide(lambda o, t: nisa.tensor_scalar(o, t, op0=op, operand0=float(scalar), reverse0=rev), o, tile)

        if out is None:
            return _result(tile.shape, dtype or tile.dtype, emit_scalar, (tile,), f"nl.{op}")
        emit_scalar(out)
        return out
    odt = dtype or promote(x.dtype, y.dtype)
    if out is None and x.shape == y.shape:
        shape, bx, by = x.shape, x, y  # (tiles of one shape: what the steps below give them)
    else:
        if x.shape[0] != y.shape[0]:
            if x.shape[0] == 1:
                x = _bcast_partitions(x, y.shape[0])
            elif y.shape[0] == 1:
                y = _bcast_partitions(y, x.shape[0])
            else:
                raise ShapeError(
                    f"nl.{op}: partition dims {x.shape[0]} and {y.shape[0]} do not broadcast",
                    rule="nki_broadcast_partitions",
                )
        xf, yf = x.size // x.shape[0], y.size // y.shape[0]
        if xf != yf and (xf == 1 or yf == 1):
            tile, col, rev = (x, y, False) if yf == 1 else (y, x, True)
            col = col.reshape((col.shape[0], 1)) if col.ndim != 2 else col

            def emit_col(o):
                nisa.tensor_scalar(o, tile, op0=op, operand0=col, reverse0=rev)

            if out is None:
                return _result(tile.shape, odt, emit_col, (tile, col), f"nl.{op}")
            emit_col(out)
            return out
        try:
            if out is not None:
                shape = out.shape
            elif x.shape == y.shape:
                shape = x.shape  # (what broadcast_shapes gives, without building its arrays)
            else:
                shape = tuple(np.broadcast_shapes(x.shape, y.shape))
        except ValueError:
            # numpy's own message names neither the call nor the rule; say both, once (no chained traceback)
            raise ShapeError(
                f"nl.{op}: free dims of {tuple(x.shape)} and {tuple(y.shape)} do not broadcast "
                "(each free dim must match or be 1)\nfix: slice both tiles to the same free size, or reduce one to "
                "[P, 1] (e.g. `nl.sum(t, axis=1, keepdims=True)`) to apply it per partition",
                rule="nki_broadcast_free",
            ) from None
        bx, by = _bcast_free(x, shape), _bcast_free(y, shape)

    def emit_tt(o):
        if len(o.shape) <= _MAX_DIMS and len(bx.shape) <= _MAX_DIMS and len(by.shape) <= _MAX_DIMS:
            nisa.tensor_tensor(o, bx, by, op=op)  # (`_split_wide`'s usual case, inlined)
            return
        _split_wide(lambda o, x, y: nisa.tensor_tensor(o, x, y, op=op), o, bx, by)

    if out is None:
        return _result(shape, odt, emit_tt, (bx, by), f"nl.{op}")
    emit_tt(out)
    return out


def _binary_tiles(op: str, x, y, dtype, origin: str):
    """`_binary`'s usual case: two on-chip tiles of one shape (plain views or pending results) and
    no `out`, in the general path's steps (operands issued x first, the same promotion, the same
    `_result`) without re-reading the operands' properties; None when it is not that case (the
    general path goes on from the start: the operands it reads again are issued already)."""
    if x.buffer in HBM_BUFFERS or y.buffer in HBM_BUFFERS:
        return None
    if type(x) is Pending and not x._done:  # (what reading its dtype or shape does)
        x._issue(None)
    if type(y) is Pending and not y._done:
        y._issue(None)
    xt, yt = x._t, y._t
    shape = xt.shape
    if shape != yt.shape or len(shape) > _MAX_DIMS:
        return None
    if not dtype:
        dtype = DTYPES[xt.dtype] if xt.dtype == yt.dtype else promote(DTYPES[xt.dtype], DTYPES[yt.dtype])

    def emit_tt(o):  # (o has the operands' shape, at most `_MAX_DIMS` dims: no `_split_wide`)
        nisa.tensor_tensor(o, x, y, op)

    return _result(shape, dtype, emit_tt, (x, y), origin)


def _make_binary(op: str):
    origin = f"nl.{op}"

    def fn(x, y, dtype=None, **kwargs):
        if kwargs:
            _no_mask(op, kwargs)
        tx, ty = type(x), type(y)
        if (tx is Pending or tx is NkiTensor) and (ty is Pending or ty is NkiTensor):
            r = _binary_tiles(op, x, y, dtype, origin)
            if r is not None:
                return r
        return _binary(op, x, y, dtype)

    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"Elementwise {op} (tensor_tensor; tensor_scalar with a scalar or [P,1] operand)."
    return fn


add = _make_binary("add")
subtract = _make_binary("subtract")
multiply = _make_binary("multiply")
divide = _make_binary("divide")
maximum = _make_binary("maximum")
minimum = _make_binary("minimum")
power = _make_binary("power")
abs_max = _make_binary("abs_max")
abs_min = _make_binary("abs_min")
equal = _make_binary("equal")
not_equal = _make_binary("not_equal")
greater = _make_binary("greater")
greater_equal = _make_binary("greater_equal")
less = _make_binary("less")
less_equal = _make_binary("less_equal")
logical_and = _make_binary("logical_and")
logical_or = _make_binary("logical_or")
logical_xor = _make_binary("logical_xor")
bitwise_and = _make_binary("bitwise_and")
bitwise_or = _make_binary("bitwise_or")
bitwise_xor = _make_binary("bitwise_xor")
left_shift = _make_binary("left_shift")
right_shift = _make_binary("right_shift")


def _act(fn: str, x, dtype=None, bias=None, scale=1.0) -> NkiTensor:
    x = _onchip(x)

    def emit(o):  # (bias and a tile scale are [P, 1]: the same for every split)
        _split_wide(lambda o, x: nisa.activation(o, op=fn, data=x, bias=bias, scale=scale), o, x)

    return _result(x.shape, dtype or x.dtype, emit, (x, bias), f"nl.{fn}")


def _make_act(fn: str):
    def f(x, dtype=None, **kwargs):
        _no_mask(fn, kwargs)
        return _act(fn, x, dtype)

    f.__name__ = f.__qualname__ = fn
    f.__doc__ = f"Elementwise {fn} on the Scalar engine (`activation(op={fn})`)."
    return f


for _fn in (
    "exp log sqrt rsqrt reciprocal tanh sigmoid relu gelu gelu_dx gelu_apprx_tanh gelu_apprx_sigmoid "
    "gelu_apprx_sigmoid_dx silu silu_dx softplus mish erf erf_dx sign abs square arctan"
).split():
    globals()[_fn] = _make_act(_fn)

bypass = "bypass"
prelu = "prelu"
average = "average"


def _round_even(x: NkiTensor) -> NkiTensor:
    """fp32 -> int32 (RNE, saturating) -> fp32: x rounded to the nearest integer (|x| < 2^31)."""
    i = ndarray(x.shape, int32, sbuf)
    nisa.tensor_copy(dst=i, src=x)
    r = ndarray(x.shape, float32, sbuf)
    nisa.tensor_copy(dst=r, src=i)
    return r


def _floor_f32(x: NkiTensor) -> NkiTensor:
    """floor(x) = n - (n > x) with n = round(x); fp32 result."""
    n = _round_even(x)
    gt = ndarray(x.shape, float32, sbuf)
    nisa.tensor_tensor(dst=gt, data1=n, data2=x, op="greater")
    nisa.tensor_tensor(dst=n, data1=n, data2=gt, op="subtract")
    return n


def _as_f32(x) -> NkiTensor:
    x = _onchip(x)
    return x if x.dtype == float32 else copy(x, dtype=float32)


def floor(x, dtype=None) -> NkiTensor:
    """floor: fp32 -> int32 (RNE) -> fp32, minus 1 where that rounded up (`tensor_copy` x2,
    `tensor_tensor` greater / subtract). Valid for |x| < 2^31."""
    x = _as_f32(x)
    return copy(_floor_f32(x), dtype=dtype or x.dtype)


def ceil(x, dtype=None) -> NkiTensor:
    """ceil(x) = -floor(-x)."""
    x = _as_f32(x)
    return negative(floor(negative(x)), dtype=dtype or x.dtype)


def trunc(x, dtype=None) -> NkiTensor:
    """trunc(x) = sign(x) * floor(|x|)."""
    x = _as_f32(x)
    f = _floor_f32(_act("abs", x, float32))
    out = ndarray(x.shape, dtype or x.dtype, sbuf)
    nisa.tensor_tensor(dst=out, data1=f, data2=_act("sign", x, float32), op="multiply")
    return out


def _rem(x, y, dtype, rounding) -> NkiTensor:
    x = _as_f32(x)
    q = divide(x, y, dtype=float32)
    n = _floor_f32(q) if rounding == "floor" else trunc(q, dtype=float32)
    ny = multiply(n, y, dtype=float32)
    return subtract(x, ny, dtype=dtype or x.dtype)


def mod(x, y, dtype=None) -> NkiTensor:
    """x - floor(x / y) * y (sign of y, as numpy.mod)."""
    return _rem(x, y, dtype, "floor")


def fmod(x, y, dtype=None) -> NkiTensor:
    """x - trunc(x / y) * y (sign of x, as numpy.fmod)."""
    return _rem(x, y, dtype, "trunc")


def tan(x, dtype=None) -> NkiTensor:
    """sin(x) / cos(x), both range-reduced (`tensor_tensor` divide)."""
    x = _as_f32(x)
    return divide(sin(x, dtype=float32), cos(x, dtype=float32), dtype=dtype or x.dtype)


def _reduce_angle(x: NkiTensor, shift: float) -> NkiTensor:
    """x + shift reduced to [-pi, pi]: r = (x + shift) - round((x + shift) / 2pi) * 2pi, clamped."""
    two_pi = 2.0 * math.pi
    xs = ndarray(x.shape, float32, sbuf)
    nisa.tensor_scalar(dst=xs, data=x, op0="add", operand0=shift)
    q = ndarray(x.shape, float32, sbuf)
    nisa.tensor_scalar(dst=q, data=xs, op0="multiply", operand0=1.0 / two_pi)
    n = _round_even(q)
    nisa.tensor_scalar(dst=n, data=n, op0="multiply", operand0=two_pi)
    nisa.tensor_tensor(dst=xs, data1=xs, data2=n, op="subtract")
    # fp32 rounding can leave |r| a hair above pi; ScalarE's sin is invalid outside [-pi, pi].
    pi32 = float(np.float32(math.pi))
    nisa.tensor_scalar(dst=xs, data=xs, op0="minimum", operand0=pi32, op1="maximum", operand1=-pi32)
    return xs


def sin(x, dtype=None) -> NkiTensor:
    """sin with range reduction to [-pi, pi] (ScalarE's sin is only valid there), then `activation(sin)`."""
    x = _as_f32(x)
    return _act("sin", _reduce_angle(x, 0.0), dtype or x.dtype)


def cos(x, dtype=None) -> NkiTensor:
    """cos(x) = sin(x + pi/2), range-reduced."""
    x = _as_f32(x)
    return _act("sin", _reduce_angle(x, math.pi / 2), dtype or x.dtype)


def negative(x, dtype=None, **kwargs) -> NkiTensor:
    """-x (`tensor_scalar(multiply, -1)`)."""
    _no_mask("negative", kwargs)
    return _binary("multiply", x, -1.0, dtype)


def logical_not(x, dtype=None, **kwargs) -> NkiTensor:
    """x == 0 (`tensor_scalar(equal, 0)`)."""
    _no_mask("logical_not", kwargs)
    return _binary("equal", x, 0.0, dtype)


def invert(x, dtype=None, **kwargs) -> NkiTensor:
    """Bitwise NOT (`tensor_scalar(invert)`)."""
    _no_mask("invert", kwargs)
    x = _onchip(x)
    out = ndarray(x.shape, dtype or x.dtype, sbuf)
    nisa.tensor_scalar(out, x, op0="invert", operand0=0.0)
    return out


def _unsupported(name, why):
    def f(*args, **kwargs):
        raise not_supported(f"nl.{name}", why, rule="nki_not_supported")

    f.__name__ = name
    return f


def gather_flattened(data, indices, axis=0, dtype=None, **kwargs) -> NkiTensor:
    """Per partition, out[p, i...] = data[p].flatten()[indices[p].flatten()[i]] (`nc_n_gather`;
    uint32 indices, result shaped like indices; a `dtype` other than data's casts with `tensor_copy`).
    An index outside the row raises AddressError at run time (NKI returns garbage there)."""
    _no_mask("gather_flattened", kwargs)
    if int(axis) != 0:
        raise not_supported(
            f"nl.gather_flattened(axis={axis})", "the gather runs per partition (axis 0)", rule="nki_gather_axis"
        )
    data, indices = _onchip(data), _onchip(indices)
    if str(indices.dtype) != "uint32":
        indices = copy(indices, dtype=uint32)
    out = ndarray(indices.shape, data.dtype, sbuf)
    nisa.nc_n_gather(dst=out, data=data, indices=indices)
    return out if dtype is None or as_dtype(dtype) == out.dtype else copy(out, dtype=dtype)


def random_seed(seed, **kwargs) -> None:
    """Seed the random number generator used by `nl.rand` / `nl.dropout` (`set_rng_seed` from a
    [1, 1] 32-bit tile; a Python int is memset into one first, an HBM tensor loaded)."""
    _no_mask("random_seed", kwargs)
    if isinstance(seed, NkiTensor):
        t = _onchip(seed)
        if t.size != 1:
            raise ShapeError(
                f"nl.random_seed takes a single 32-bit value, got a {t.shape} tensor", rule="nki_random_seed_shape"
            )
        t = t.reshape((1, 1)) if t.shape != (1, 1) else t
        if str(t.dtype) not in ("uint32", "int32"):
            t = copy(t, dtype=uint32)
    else:
        t = ndarray((1, 1), uint32, sbuf)
        nisa.memset(t, value=int(seed))
    nisa.set_rng_seed(src_seeds=t)


# -------------------------------------------------------------------------------- reductions
def _axes(x, axis) -> tuple:
    if axis is None:
        axes = tuple(range(1, x.ndim))
    elif isinstance(axis, (tuple, list)):
        axes = tuple(int(a) % x.ndim for a in axis)
    else:
        axes = (int(axis) % x.ndim,)
    if 0 in axes and axes != (0,):
        raise not_supported(
            "reducing the partition dim together with free dims",
            "reduce them in two steps",
            rule="nki_partition_reduce_axes",
        )
    return tuple(sorted(axes))


_PARTITION_OPS = {"add": "add", "maximum": "maximum", "logical_or": "bitwise_or", "logical_and": "bitwise_and"}


def _reduce(op: str, x, axis, dtype, keepdims, negate=False) -> NkiTensor:
    x = _onchip(x)
    axes = _axes(x, axis)
    if axes == (0,):
        # Across partitions: GpSimd's tensor_partition_reduce into one partition (keeps the dim).
        if op not in _PARTITION_OPS or negate:
            raise not_supported(f"nl reduction {op} over the partition dim", rule="nki_partition_reduce_op")
        out = ndarray((1,) + tuple(x.shape[1:]), dtype or x.dtype, sbuf)
        nisa.tensor_partition_reduce(out, op=_PARTITION_OPS[op], data=x)
        return out
    if axes != tuple(range(x.ndim - len(axes), x.ndim)):
        # tensor_reduce reduces trailing axes: move the reduced axes last (a strided view).
        kept = [d for d in range(x.ndim) if d not in axes]
        flat = _reduce(op, x.permute(kept + list(axes)), tuple(range(len(kept), x.ndim)), dtype, False, negate)
        if not keepdims:
            return flat
        return flat.reshape(tuple(1 if d in axes else n for d, n in enumerate(x.shape)))
    shape = (
        [1 if d in axes else n for d, n in enumerate(x.shape)]
        if keepdims
        else [n for d, n in enumerate(x.shape) if d not in axes]
    )

    def emit(o):
        nisa.tensor_reduce(o, op=op, data=x, axis=axes, negate=negate, keepdims=keepdims)

    return _result(tuple(shape), dtype or x.dtype, emit, (x,), "nl.reduce", elementwise=False)


def _make_reduce(name: str, op: str):
    def f(x, axis=None, dtype=None, keepdims=False, **kwargs):
        _no_mask(name, kwargs)
        return _reduce(op, x, axis, dtype, keepdims)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Reduce with {op} over free axes (`tensor_reduce(op={op})`)."
    return f


sum = _make_reduce("sum", "add")  # noqa: A001
max = _make_reduce("max", "maximum")  # noqa: A001
min = _make_reduce("min", "minimum")  # noqa: A001
prod = _make_reduce("prod", "multiply")
all = _make_reduce("all", "logical_and")  # noqa: A001
any = _make_reduce("any", "logical_or")  # noqa: A001


def mean(x, axis=None, dtype=None, keepdims=False, **kwargs) -> NkiTensor:
    """sum over the axes (`tensor_reduce(add)`), then `tensor_scalar(divide, n)`."""
    _no_mask("mean", kwargs)
    x = _onchip(x)
    axes = _axes(x, axis)
    n = math.prod(x.shape[d] for d in axes)
    s = _reduce("add", x, axes, float32, keepdims)
    out = ndarray(s.shape, dtype or x.dtype, sbuf)
    nisa.tensor_scalar(out, s, op0="divide", operand0=float(n))
    return out


def var(x, axis=None, dtype=None, keepdims=False) -> NkiTensor:
    """Population variance over all free axes: `bn_stats` per 512-element chunk, one `bn_aggr`."""
    x = _onchip(x)
    if _axes(x, axis) != tuple(range(1, x.ndim)):
        raise not_supported("nl.var over a subset of the free axes or the partition dim", rule="nki_reduce_axes")
    x2 = _free_2d(x)
    p, f = x2.shape
    fmax = tile_size.bn_stats_fmax
    chunks = -(-f // fmax)
    stats = ndarray((p, 6 * chunks), float32, sbuf)
    for c in range(chunks):
        nisa.bn_stats(dst=stats[:, 6 * c : 6 * c + 6], data=x2[:, c * fmax : builtins.min(f, (c + 1) * fmax)])
    mv = ndarray((p, 2), float32, sbuf)
    nisa.bn_aggr(dst=mv, data=stats)
    shape = (p,) + (1,) * (x.ndim - 1) if keepdims else (p, 1)
    out = ndarray(shape, dtype or x.dtype, sbuf)
    nisa.tensor_copy(dst=out.reshape((p, 1)), src=mv[:, 1:2])
    return out


# ---------------------------------------------------------------------------- composite ops
def _free_2d(x: NkiTensor) -> NkiTensor:
    return x if x.ndim == 2 else x.reshape((x.shape[0], x.size // x.shape[0]))


def softmax(x, axis=-1, dtype=None, compute_dtype=None, **kwargs) -> NkiTensor:
    """exp(x - max) / sum: tensor_reduce(max, negate) -> activation(exp, bias, reduce add) ->
    reciprocal -> tensor_scalar(multiply)."""
    _no_mask("softmax", kwargs)
    x = _free_2d(_onchip(x))
    if int(axis) % 2 != 1:
        raise not_supported("nl.softmax over the partition dim", rule="nki_reduce_axes")
    p = x.shape[0]
    negmax = ndarray((p, 1), float32, sbuf)
    nisa.tensor_reduce(negmax, op="maximum", data=x, axis=(1,), negate=True, keepdims=True)
    e = ndarray(x.shape, float32, sbuf)
    s = ndarray((p, 1), float32, sbuf)
    nisa.activation(e, op="exp", data=x, bias=negmax, reduce_op="add", reduce_res=s, reduce_cmd="reset_reduce")
    r = ndarray((p, 1), float32, sbuf)
    nisa.reciprocal(r, s)
    out = ndarray(x.shape, dtype or x.dtype, sbuf)
    nisa.tensor_scalar(out, e, op0="multiply", operand0=r)
    return out


def rms_norm(x, w, axis, n, epsilon=1e-6, dtype=None, compute_dtype=None, **kwargs) -> NkiTensor:
    """x / sqrt(sum(x^2)/n + eps) * w: activation(square, reduce add) -> tensor_scalar(divide n,
    add eps) -> activation(rsqrt) -> tensor_scalar(multiply) -> tensor_tensor(multiply w)."""
    _no_mask("rms_norm", kwargs)
    x = _onchip(x)
    if _axes(x, axis) != tuple(range(1, x.ndim)):
        raise not_supported("nl.rms_norm over a subset of the free axes", rule="nki_reduce_axes")
    x2 = _free_2d(x)
    p = x2.shape[0]
    sq = ndarray(x2.shape, float32, sbuf)
    ss = ndarray((p, 1), float32, sbuf)
    nisa.activation(sq, op="square", data=x2, reduce_op="add", reduce_res=ss, reduce_cmd="reset_reduce")
    ms = ndarray((p, 1), float32, sbuf)
    nisa.tensor_scalar(ms, ss, op0="divide", operand0=float(n), op1="add", operand1=float(epsilon))
    rs = ndarray((p, 1), float32, sbuf)
    nisa.activation(rs, op="rsqrt", data=ms)
    normed = ndarray(x.shape, float32, sbuf)
    nisa.tensor_scalar(normed, x, op0="multiply", operand0=rs)
    return _binary("multiply", normed, w, dtype or x.dtype)


def where(condition, x, y, dtype=None, **kwargs) -> NkiTensor:
    """condition ? x : y: copy y (or memset a scalar y), then `tensor_copy_predicated` x where true."""
    _no_mask("where", kwargs)
    condition = _onchip(condition)
    x, y = _onchip(x), _onchip(y)
    ref = x if _is_tile(x) else y if _is_tile(y) else condition
    # free-dim broadcasting (a [P, 1] operand, numpy's rule along the free dims): stride-0 views
    tiles = [t for t in (condition, x, y) if _is_tile(t)]
    shape = builtins.max((tuple(t.shape) for t in tiles), key=lambda sh: math.prod(sh[1:]))
    condition, x, y = (
        _bcast_free(t, shape) if _is_tile(t) and tuple(t.shape) != shape else t for t in (condition, x, y)
    )
    out = ndarray(shape, dtype or (ref.dtype if _is_tile(ref) else float32), sbuf)
    if _is_tile(y):
        nisa.tensor_copy(dst=out, src=y)
    else:
        nisa.memset(out, value=float(y))
    if str(condition.dtype) not in ("uint8", "uint16", "uint32", "bool"):
        condition = copy(condition, dtype=uint8)  # the predicate operand is integer (1.0 -> 1)
    nisa.tensor_copy_predicated(dst=out, src=x if _is_tile(x) else float(x), predicate=condition)
    return out


def matmul(x, y, transpose_x=False, **kwargs) -> NkiTensor:
    """x @ y (x.T @ y with transpose_x) into a new fp32 PSUM tile: `nc_matmul`, preceded by a PE
    transpose of x (`nc_transpose` -> PSUM -> SBUF) when transpose_x is False. An fp32 operand
    paired with a narrower one promotes it to fp32 first (`tensor_copy`): the PE cannot mix them."""
    _no_mask("matmul", kwargs)
    x, y = _onchip(x), _onchip(y)
    _check_matmul_shapes(x, y, transpose_x)
    # a legacy mask= (the active masks, `_checked`): issued under it whenever the result is
    # issued (`indexing._masked_matmul`: the kept [M, N] block of the target)
    masks = list(current().masks) if _indexing.active() else []
    if masks and not transpose_x:
        raise not_supported(
            "nl.matmul(mask=...) without transpose_x=True", "pass x transposed", rule="nki_mask_unsupported"
        )
    if not transpose_x:
        xt = transpose(x)
        x = _sbuf_operand(xt)
    # the PE reads its operands from SBUF: a PSUM operand (an `nl.transpose` result) is copied out
    # first, as the compiler evacuates it
    x, y = (_sbuf_operand(v) if isinstance(v, NkiTensor) else v for v in (x, y))
    # The PE pairs fp32 only with fp32: a mixed call promotes the other operand (a tensor_copy).
    wide = ("float32", "tfloat32")
    if (str(x.dtype) in wide) != (str(y.dtype) in wide):
        x, y = (x, copy(y, dtype=float32)) if str(x.dtype) in wide else (copy(x, dtype=float32), y)

    # pending (`pending.py`): `psum[...] = nl.matmul(..)` writes psum, `psum[...] += ..` accumulates
    def mm(dst, accumulate: bool):
        active = current().masks
        n = len(active)
        active.extend(masks)
        try:
            nisa.nc_matmul(dst, stationary=x, moving=y, accumulate=accumulate)
        finally:
            del active[n:]

    return Pending(
        ((x.shape[1], y.shape[1]), as_dtype(float32), psum),
        lambda dst: mm(dst, False),
        lambda dst: mm(dst, True),
        origin="nl.matmul",
        partial=bool(masks),
    )


def _check_matmul_shapes(x, y, transpose_x) -> None:
    """nl.matmul's contraction dim K must match and fit the PE's 128 rows (M too): said in the
    call's own terms, not as the internal transpose's tile it would otherwise fail in."""
    if not (isinstance(x, NkiTensor) and isinstance(y, NkiTensor)) or x.ndim != 2 or y.ndim != 2:
        return
    pmax = tile_size.pmax
    (k, m) = tuple(x.shape) if transpose_x else tuple(x.shape)[::-1]
    ky, n = tuple(y.shape)
    if k == ky and k <= pmax and m <= pmax:
        return
    form = "[K, M] (transpose_x=True)" if transpose_x else "[M, K] (transpose_x=False)"
    problems = []
    if k != ky:
        problems.append(f"K must match ({k} vs {ky})")
    if builtins.max(k, ky) > pmax:
        problems.append(f"K must be <= {pmax}")
    if m > pmax:
        problems.append(f"M must be <= {pmax}")
    if k != ky and not transpose_x and x.shape[0] == ky:
        fix = "x is stored [K, M]: pass transpose_x=True"
        if x.shape[1] > pmax:
            fix += f", one matmul per {pmax} columns of x (`x[:, m0:m0 + {pmax}]`)"
    elif k != ky:
        fix = "x's K and y's K are the same dim of the product: check the shapes and the operand order"
    elif k > pmax:
        step = f"x[:, k0:k0 + {pmax}]" if not transpose_x else f"x[k0:k0 + {pmax}]"
        fix = (
            f"loop over K in chunks of {pmax} and accumulate into one PSUM tile "
            f"(`acc += nl.matmul({step}, y[k0:k0 + {pmax}]{', transpose_x=True' if transpose_x else ''})`)"
        )
    else:
        part = f"x[m0:m0 + {pmax}]" if not transpose_x else f"x[:, m0:m0 + {pmax}]"
        fix = f"one matmul per {pmax} rows of the result (`nl.matmul({part}, y)`)"
    raise ShapeError(
        f"nl.matmul(x, y): x is {form} = {list(x.shape)} and y is [K, N] = {list(y.shape)}: "
        + ", ".join(problems)
        + f". fix: {fix}",
        operand="x",
        rule="nl_matmul_shapes",
    )


def transpose(x, dtype=None, **kwargs) -> NkiTensor:
    """Swap partition and free dims on the PE (`nc_transpose`), result in PSUM."""
    _no_mask("transpose", kwargs)
    x = _free_2d(_onchip(x))
    out = ndarray((x.shape[1], x.shape[0]), dtype or x.dtype, psum)
    nisa.nc_transpose(out, x)
    return out


def dropout(x, rate, dtype=None, **kwargs) -> NkiTensor:
    """Zero elements with probability `rate` (`nisa.dropout`)."""
    _no_mask("dropout", kwargs)
    x = _onchip(x)
    out = ndarray(x.shape, dtype or x.dtype, sbuf)
    nisa.dropout(out, x, prob=rate)
    return out


def rand(shape, dtype=float32, buffer=None, **kwargs) -> NkiTensor:
    """Uniform [0, 1) values (`nisa.rand2(min=0, max=1)`)."""
    out = ndarray(shape, dtype, buffer)
    nisa.rand2(out, min=0.0, max=1.0)
    return out


def device_print(prefix, tensor) -> None:
    """Print a tensor's value at this point of the kernel, after the run (copied to HBM now)."""
    ctx = current()
    t = tensor
    if t.buffer == "psum":
        t = _sbuf_operand(t)
    snap = ndarray(t.shape, t.dtype, "private_hbm")
    nisa.dma_copy(dst=snap, src=t)
    ctx.prints.append((str(prefix), snap))


def _note_lowering(e: EmuError, name: str) -> None:
    """An instruction an `nl.<name>` op issued refused its operands: say which op issued it (the
    innermost nl op), so the error points at what the kernel wrote."""
    notes = getattr(e, "__notes__", ())
    if builtins.any("in kernel at" in n for n in notes) and not builtins.any("issued by " in n for n in notes):
        e.add_note(f"  issued by nl.{name} (part of its lowering)")


def _checked(f):
    """Calls whose arguments do not fit the signature raise "not supported: nl.<name>(...)"."""
    import functools
    import inspect

    sig = inspect.signature(f)

    @functools.wraps(f)
    def g(*args, **kwargs):
        mask = kwargs.pop("mask", None) if kwargs else None  # legacy mask=: every instruction of the op is restricted
        if mask is not None and isinstance(mask, NkiTensor) and "mask" in sig.parameters:
            kwargs["mask"], mask = mask, None  # a tile mask the op handles itself
        # Called from the kernel: its frame is the source line of everything the op issues
        # (`TraceContext.user_f`; an op called by another op keeps the outer one's).
        ctx = _tracing_context()
        hinted = False
        if ctx is not None:
            caller = sys._getframe(1)
            inside = _INTERNAL.get(caller.f_code.co_filename)
            if inside is None:
                inside = _internal(caller.f_code.co_filename)
            if not inside:
                outer, ctx.user_f, hinted = ctx.user_f, caller, True
        try:
            if mask is None:
                return f(*args, **kwargs) if kwargs else f(*args)
            with _indexing.masked(mask):
                r = f(*args, **kwargs)
                return r if isinstance(r, Pending) else _indexing.tag(r, mask)  # (pending: masks kept)
        except EmuError as e:
            _note_lowering(e, f.__name__)
            raise
        except TypeError:
            # Python binds the arguments before running the body, so a bad call form fails with
            # nothing done; binding only here keeps inspect off the hot path.
            try:
                sig.bind(*args, **kwargs)
            except TypeError as e:
                _misspelt_keyword(f.__name__, kwargs)
                raise not_supported(f"nl.{f.__name__} call form ({e})", rule="nki_call_form") from None
            raise
        except AttributeError as e:
            _not_a_tensor(f.__name__, sig, args, kwargs, e)
            raise
        finally:
            if hinted:
                ctx.user_f = outer

    return g


def _not_a_tensor(name: str, sig, args, kwargs, e: AttributeError) -> None:
    """An nl op read a tensor attribute (`.shape`, `.dtype`) of an argument that is not a tensor
    (a number, None): raise `OperandError` naming the op and the parameter instead."""
    if not hasattr(e, "obj") or isinstance(e.obj, NkiTensor):
        return
    bad = e.obj
    try:
        bound = sig.bind(*args, **kwargs).arguments
    except TypeError:
        return
    for param, value in bound.items():
        if value is bad:
            raise OperandError(
                f"nl.{name}: operand {param} must be a tensor (an HBM tensor or an on-chip tile), got "
                f"{bad!r} ({type(bad).__name__})",
                operand=param,
                rule="operand_not_tensor",
            ) from None


for _n, _f in list(globals().items()):
    if (
        callable(_f)
        and not isinstance(_f, type)
        and not _n.startswith("_")
        and getattr(_f, "__module__", None) == __name__
        and _n not in ("no_reorder", "promote")
    ):
        globals()[_n] = _checked(_f)


_UNSET = object()  # (a keyword not given)


def _ndarray_entry(checked):
    """`nl.ndarray` as kernels call it in their loops, `nl.ndarray(shape, dtype=..., buffer=...)`
    (a tuple shape, a buffer name, no other keyword), straight to the trace context's tile
    allocation; any other call through `checked` (the `_checked` wrapper) as before."""
    import functools

    tracing = _tracing_context

    @functools.wraps(checked)
    def ndarray(*args, dtype=_UNSET, buffer=_UNSET, **kwargs):
        ctx = tracing() if len(args) == 1 and not kwargs else None
        if ctx is not None and dtype is not _UNSET and type(buffer) is str:
            shape = args[0]
            if type(shape) is tuple and (
                len(shape) == 2
                and type(shape[0]) is not ParDim
                and type(shape[1]) is not ParDim
                or ParDim not in map(type, shape)
            ):
                try:
                    return ctx.tile(shape, dtype, buffer, "")
                except EmuError as e:
                    _note_lowering(e, "ndarray")
                    raise
        if dtype is not _UNSET:
            kwargs["dtype"] = dtype
        if buffer is not _UNSET:
            kwargs["buffer"] = buffer
        return checked(*args, **kwargs)

    return ndarray


ndarray = _ndarray_entry(ndarray)  # noqa: F811 (the checked one, with its common case first)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "int64":  # (NKI's 64-bit scalars: docs/nki.md, "NKI scalars")
        from ._kernel import NotSupportedAttribute

        raise NotSupportedAttribute(
            "not supported: nki.language.int64 (the emulated core has no int64 dtype and its sequencer "
            "registers are 32-bit: 64-bit NkiScalars are not modeled; use nl.int32 or nl.uint32)",
            rule="nki_scalar_int64",
        )
    raise missing_attribute(f"nki.language.{name}", list(globals()))


# What the modules below call back (`_kernel.upcalls`): NkiTensor's operators (`a + b`, `a < 0`, `t[k] = v`,
# `t += u`, `abs(t)`, `t.astype`), and the tiles they allocate or store (the public ops as wrapped above).
for _n in (
    "add subtract multiply divide negative abs invert copy broadcast_to ndarray store mod power equal not_equal "
    "greater greater_equal less less_equal logical_and logical_or bitwise_and bitwise_or bitwise_xor"
).split():
    setattr(_upcalls, _n, globals()[_n])
_upcalls.assign, _upcalls.inplace, _upcalls.loop_reduce = _assign, _inplace, _LoopReduce
