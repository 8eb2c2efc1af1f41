"""`nki.tensor`: trace-time tensors, constant arrays built while a kernel is traced and turned
into device data by `nl.shared_constant(t, dtype)`.

They are plain numpy arrays here, so the arithmetic the docs show (`zeros(...) + 1`) is numpy's.
The module also keeps `NkiTensor` / `tensor` (the on-device tensor type) for annotations.
"""

from __future__ import annotations

import sys
import types

import numpy as np

from ..dtypes import numpy_dtype
from ._kernel import NkiTensor, missing_attribute

#: the type `nl.shared_constant` takes
TraceTimeTensor = np.ndarray
tensor = NkiTensor


def _np(dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype is None else numpy_dtype(dtype)


def _shape(shape) -> tuple:
    return (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)


def zeros(shape, dtype=None) -> np.ndarray:
    return np.zeros(_shape(shape), _np(dtype))


def ones(shape, dtype=None) -> np.ndarray:
    return np.ones(_shape(shape), _np(dtype))


def full(shape, fill_value, dtype=None) -> np.ndarray:
    return np.full(_shape(shape), fill_value, _np(dtype))


def identity(n, dtype=None) -> np.ndarray:
    return np.eye(int(n), dtype=_np(dtype))


def arange(start, stop=None, step=1, dtype=None) -> np.ndarray:
    """Values start, start+step, ... below stop (numpy's arange; one argument = stop)."""
    if stop is None:
        start, stop = 0, start
    return np.arange(start, stop, step).astype(_np(dtype))


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing_attribute(f"nki.tensor.{name}", list(globals()))


class _TensorModule(types.ModuleType):
    """Code that used the name `nki.tensor` as the tensor type keeps working:
    `isinstance(t, nki.tensor)` and `nki.tensor[P, F]` annotations."""

    def __instancecheck__(self, obj) -> bool:
        return isinstance(obj, NkiTensor)

    def __getitem__(self, key):
        return NkiTensor


sys.modules[__name__].__class__ = _TensorModule

__all__ = ["TraceTimeTensor", "NkiTensor", "tensor", "zeros", "ones", "full", "identity", "arange"]
