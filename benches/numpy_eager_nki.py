"""A numpy-eager NKI: the baseline the flash-attention benchmark races against.

This is how the vendor's NKI simulator runs a kernel (reference nki-kernels.md §4.2): the kernel's
Python body runs as ordinary Python and every `nki.isa` / `nki.language` call executes at once in
NumPy, one numpy call (or a few) per instruction; tensors are numpy arrays in their declared dtype
(bf16 via ml_dtypes, as with NKI_PRECISE_FP=1); no scheduling, no engine model, no checks.

Only the subset the flash-attention example uses is provided. Straightforward on purpose: neither
deliberately slow nor clever (no fusion, no caching across calls).

`rebind(kernel)` gives the same kernel code object with `nki`, `nisa`, `nl` bound to these modules
(the equivalent of swapping them into sys.modules before importing the kernel's source).
"""

from __future__ import annotations

import types

import ml_dtypes
import numpy as np

F32 = np.float32

# ------------------------------------------------------------------------------ nki.language
language = types.ModuleType("numpy_eager_nki.language")
nl = language
nl.float32 = np.float32
nl.bfloat16 = ml_dtypes.bfloat16
nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm = "sbuf", "psum", "hbm", "shared_hbm"
# op tokens are the numpy functions themselves
nl.add, nl.multiply, nl.maximum, nl.exp = np.add, np.multiply, np.maximum, np.exp
nl.greater_equal = np.greater_equal


def _identity(x):
    return x


nl.copy = _identity

#: PSUM tiles not yet written: with accumulate=None the first matmul into them overwrites.
_fresh_psum: set[int] = set()


def _ndarray(shape, dtype, buffer=None, **kwargs):
    a = np.empty(shape, dtype)
    if buffer == "psum":
        _fresh_psum.add(id(a))
    return a


def _full(shape, fill_value, dtype, buffer=None, **kwargs):
    return np.full(shape, fill_value, dtype)


def _zeros(shape, dtype, buffer=None, **kwargs):
    return np.zeros(shape, dtype)


nl.ndarray, nl.full, nl.zeros = _ndarray, _full, _zeros
nl.affine_range = nl.sequential_range = nl.static_range = range

# ----------------------------------------------------------------------------------- nki.isa
isa = types.ModuleType("numpy_eager_nki.isa")
nisa = isa
nisa.reduce_cmd = types.SimpleNamespace(idle="idle", reset="reset", reduce="reduce", reset_reduce="reset_reduce")


def _store(dst, value):
    dst[...] = value.astype(dst.dtype, copy=False)


def _dma_copy(dst, src, **kwargs):
    _store(dst, src)


def _tensor_copy(dst, src, **kwargs):
    _store(dst, src)


def _nc_matmul(dst, stationary, moving, accumulate=None, **kwargs):
    prod = stationary.astype(F32).T @ moving.astype(F32)
    owner = dst if dst.base is None else dst.base
    if accumulate is None:
        accumulate = id(owner) not in _fresh_psum
    _fresh_psum.discard(id(owner))
    _store(dst, dst.astype(F32) + prod if accumulate else prod)


def _nc_transpose(dst, data, **kwargs):
    _store(dst, data.T)


def _operand(v):
    return v.astype(F32) if isinstance(v, np.ndarray) else F32(v)


def _activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd="idle", **kwargs):
    x = data.astype(F32) * _operand(scale)
    if bias is not None:
        x = x + _operand(bias)
    out = op(x).astype(F32, copy=False)
    _store(dst, out)
    if reduce_res is not None:
        _store(reduce_res, out.sum(axis=1, keepdims=True))


def _affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op, offset=0, **kwargs):
    ((step, num),) = pattern
    value = offset + channel_multiplier * np.arange(dst.shape[0])[:, None] + step * np.arange(num)[None, :]
    _store(dst, np.where(cmp_op(value, 0), on_true_tile.astype(F32), F32(on_false_value)))


def _tensor_reduce(dst, op, data, axis, keepdims=False, negate=False, **kwargs):
    r = op.reduce(data.astype(F32), axis=tuple(axis), keepdims=keepdims)
    _store(dst, -r if negate else r)


def _tensor_tensor(dst, data1, data2, op, **kwargs):
    _store(dst, op(data1.astype(F32), data2.astype(F32)))


def _tensor_scalar(dst, data, op0, operand0, **kwargs):
    _store(dst, op0(data.astype(F32), _operand(operand0)))


def _reciprocal(dst, data, **kwargs):
    _store(dst, np.reciprocal(data.astype(F32)))


nisa.dma_copy, nisa.tensor_copy, nisa.nc_matmul, nisa.nc_transpose = _dma_copy, _tensor_copy, _nc_matmul, _nc_transpose
nisa.activation, nisa.affine_select, nisa.tensor_reduce = _activation, _affine_select, _tensor_reduce
nisa.tensor_tensor, nisa.tensor_scalar, nisa.reciprocal = _tensor_tensor, _tensor_scalar, _reciprocal

# ---------------------------------------------------------------------------------------- nki
nki = types.ModuleType("numpy_eager_nki")
nki.isa, nki.language = isa, language
nki.jit = _identity  # eager: the kernel is an ordinary function of numpy arrays


def rebind(kernel):
    """The kernel's own function (its code object) with nki / nisa / nl bound to this eager NKI."""
    import trn3emu.nki as front

    swap = {id(front): nki, id(front.isa): isa, id(front.language): language}
    fn = getattr(kernel, "__wrapped__", kernel)
    g = {k: swap.get(id(v), v) for k, v in fn.__globals__.items()}
    return types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
