"""NeuronCore dtypes and their numpy / ml_dtypes spellings, plus MX x4 packing helpers.

Every API that takes a dtype accepts a numpy dtype or scalar type (including ml_dtypes types such
as `ml_dtypes.bfloat16`) or the NKI name as a string (`"bfloat16"`, `"float8_e4m3fn_x4"`).
Packed MX dtypes travel as raw unsigned words: `float8_*_x4` as uint32, `float4_e2m1fn_x4` as
uint16; `tfloat32` as float32 (its 32-bit container).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ._isa_tables import DTYPES
from .errors import DtypeError

#: NKI dtype name -> numpy dtype used to carry its values on the host.
NUMPY: dict[str, np.dtype] = {}
for _name, (_code, _bits, _kind, _np) in DTYPES.items():
    if _name == "tfloat32":
        NUMPY[_name] = np.dtype(np.float32)
    elif hasattr(ml_dtypes, _np):
        NUMPY[_name] = np.dtype(getattr(ml_dtypes, _np))
    else:
        NUMPY[_name] = np.dtype(_np)

_BY_NUMPY = {}
for _name, _dt in NUMPY.items():
    if _name in ("tfloat32", "float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4"):
        continue
    _BY_NUMPY.setdefault(_dt, _name)

SIZES = {name: bits // 8 for name, (_c, bits, _k, _n) in DTYPES.items()}


def dtype_name(dtype: Any) -> str:
    """The NKI name of a dtype given as a name, numpy dtype or scalar type."""
    if isinstance(dtype, str):
        if dtype in DTYPES:
            return dtype
        if dtype == "bool_":
            return "bool"
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise DtypeError(f"unknown dtype {dtype!r}", rule="dtype_unknown") from None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise DtypeError(f"unknown dtype {dtype!r}", rule="dtype_unknown") from None
    name = _BY_NUMPY.get(dt)
    if name is None:
        raise DtypeError(f"dtype {dt} has no NeuronCore equivalent (known: {', '.join(DTYPES)})", rule="dtype_unknown")
    return name


def numpy_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype that carries values of `dtype` on the host."""
    return NUMPY[dtype_name(dtype)]


def itemsize(dtype: Any) -> int:
    return SIZES[dtype_name(dtype)]


_FP8 = {"float8_e4m3fn_x4": ml_dtypes.float8_e4m3fn, "float8_e5m2_x4": ml_dtypes.float8_e5m2}


def pack_x4(values: np.ndarray, dtype: str) -> np.ndarray:
    """Pack the last axis (a multiple of 4) of fp8 or fp4 values into x4 words.

    fp8 element i of a word sits in bits 8i..8i+7 (uint32); fp4 element i in bits 4i..4i+3 (uint16).
    `values` are cast to the element type with ml_dtypes (RNE) unless already of that type.
    """
    name = dtype_name(dtype)
    v = np.asarray(values)
    if v.shape[-1] % 4:
        raise DtypeError(f"pack_x4: last axis {v.shape[-1]} is not a multiple of 4", rule="x4_last_axis")
    if name in _FP8:
        codes = v.astype(np.float32).astype(_FP8[name]).view(np.uint8) if v.dtype != _FP8[name] else v.view(np.uint8)
        return np.ascontiguousarray(codes).view(np.uint32) if codes.shape[-1] else codes.astype(np.uint32)
    if name == "float4_e2m1fn_x4":
        codes = v.astype(np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
        c = codes.reshape(*codes.shape[:-1], -1, 4).astype(np.uint16)
        return c[..., 0] | (c[..., 1] << 4) | (c[..., 2] << 8) | (c[..., 3] << 12)
    raise DtypeError(f"pack_x4: {name} is not an x4 dtype", rule="x4_dtype_required")


def unpack_x4(words: np.ndarray, dtype: str) -> np.ndarray:
    """Inverse of `pack_x4`: x4 words -> element values (ml_dtypes fp8 / fp4), last axis x4."""
    name = dtype_name(dtype)
    w = np.ascontiguousarray(words)
    if name in _FP8:
        return w.astype(np.uint32).view(np.uint8).view(_FP8[name])
    if name == "float4_e2m1fn_x4":
        w = w.astype(np.uint16)
        parts = [(w >> (4 * i)) & 0xF for i in range(4)]
        codes = np.stack(parts, axis=-1).reshape(*w.shape[:-1], -1).astype(np.uint8)
        return codes.view(ml_dtypes.float4_e2m1fn)
    raise DtypeError(f"unpack_x4: {name} is not an x4 dtype", rule="x4_dtype_required")
