"""Framework arrays in and out: torch CPU tensors, JAX arrays, anything with `__dlpack__` or `__array__`.

`to_numpy(x, operand)` gives the numpy array behind an input (no copy where the framework shares
its memory: torch CPU tensors and DLPack producers; JAX arrays come back read-only). bf16 and fp8
travel as their raw bits (numpy's DLPack import knows neither): a torch tensor is viewed as an
integer tensor of the same width, a DLPack capsule's dtype is relabelled as unsigned integers
before numpy imports it, and the bits are then viewed as the ml_dtypes type. Nothing is rounded.

`framework(x)` names an input's framework ("numpy", "torch", "jax", or the module of another
producer), `common(xs)` the framework outputs take (the one all array inputs share, else "numpy"),
and `from_numpy(a, fw)` builds that framework's array from a result (bit-exact; numpy when the
framework has no such dtype, e.g. torch and `float8_e4m3`).

A torch tensor on another device (torch_xla's `xla`, where the vendor's PyTorch path runs NKI
kernels) is copied to the host; `send_home(result, copies)` then moves torch results to the
inputs' device and copies the host copies back into the device tensors, so a kernel that writes
an input writes the caller's tensor, as it would on a Neuron device.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import ml_dtypes
import numpy as np

from .errors import MemorySpaceError, NotSupportedError, OperandError

#: DLPack `DLDataTypeCode`s (dlpack.h) of the float formats numpy cannot import, as ml_dtypes types.
_DL_BITS = {
    4: ml_dtypes.bfloat16,  # kDLBfloat
    8: ml_dtypes.float8_e4m3,
    10: ml_dtypes.float8_e4m3fn,
    12: ml_dtypes.float8_e5m2,
    14: ml_dtypes.float8_e8m0fnu,
}
_DL_UINT, _DL_CPU = 1, 1  # kDLUInt, kDLCPU
#: Byte offset of `DLTensor.dtype` in a legacy `DLManagedTensor` (data ptr, DLDevice, int32 ndim).
_DTYPE_OFFSET = 20
#: torch dtype name -> ml_dtypes type, for the float formats torch.Tensor.numpy() refuses.
_TORCH_BITS = {
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
}
_INT_OF_SIZE = {1: np.uint8, 2: np.int16}


def _module_class(x: Any, module: str, cls: str) -> bool:
    mod = sys.modules.get(module)  # an instance exists only if its module was imported
    return mod is not None and isinstance(x, getattr(mod, cls, ()))


def is_array(x: Any) -> bool:
    """Whether `x` is an array input (numpy, or anything with `__dlpack__` / `__array__`)."""
    return isinstance(x, np.ndarray) or (
        not isinstance(x, (type, np.generic)) and (hasattr(x, "__dlpack__") or hasattr(x, "__array__"))
    )


def framework(x: Any) -> str:
    """The framework of an array input: "numpy", "torch", "jax", or the root module of its type."""
    if isinstance(x, np.ndarray):
        return "numpy"
    if _module_class(x, "torch", "Tensor"):
        return "torch"
    if _module_class(x, "jax", "Array"):
        return "jax"
    return type(x).__module__.split(".")[0]


def common(arrays) -> str:
    """The framework outputs take: the one every array input shares, else "numpy"."""
    names = {framework(a) for a in arrays}
    return names.pop() if len(names) == 1 and names <= {"torch", "jax"} else "numpy"


def _not_cpu(operand: str, where: str) -> MemorySpaceError:
    return MemorySpaceError(
        f"{operand}: arrays must be on the CPU (trn3emu copies host memory into its HBM); this one is on {where}",
        operand=operand,
        rule="array_not_on_cpu",
    )


def to_numpy(x: Any, operand: str = "array") -> np.ndarray:
    """The numpy array behind an array input (see the module docstring); `operand` names it in errors."""
    if isinstance(x, np.ndarray):
        return x
    if _module_class(x, "torch", "Tensor"):
        return _from_torch(x, operand)
    if _module_class(x, "jax", "Array"):
        if any(c.__name__.endswith("Tracer") for c in type(x).__mro__):
            raise NotSupportedError(
                f"{operand}: a JAX tracer (the call is inside jax.jit, grad or vmap), which has a shape but "
                "no values yet. fix: call an NKI kernel there as trn3emu.nki.jax_call(kernel, *args) (a "
                "jax.pure_callback with the kernel's output shapes), or call it outside the jitted function",
                operand=operand,
                rule="jax_tracer_input",
            )
        platforms = {d.platform for d in x.devices()}
        if platforms != {"cpu"}:
            raise _not_cpu(operand, "/".join(sorted(platforms)))
        return np.asarray(x)
    if hasattr(x, "__dlpack__") and not isinstance(x, type):
        return _from_dlpack(x, operand)
    if isinstance(x, (list, tuple, int, float, np.generic)) or (hasattr(x, "__array__") and not isinstance(x, type)):
        try:
            a = np.asarray(x)  # array-likes numpy takes itself (also nested lists and scalars)
        except (ValueError, TypeError) as e:  # e.g. an __array__ that returns something else
            raise OperandError(
                f"{operand}: {type(x).__name__} is not a usable array: {e}",
                operand=operand,
                rule="array_not_array_like",
            ) from None
        if a.dtype != object:
            return a
    raise OperandError(
        f"{operand}: expected an array (numpy, or an object with __dlpack__ or __array__), got {type(x).__name__}",
        operand=operand,
        rule="array_not_array_like",
    )


def off_host(x: Any) -> bool:
    """Whether `x` is a torch tensor on a device other than the CPU (copied in and back)."""
    return _module_class(x, "torch", "Tensor") and x.device.type != "cpu"


def _from_torch(x: Any, operand: str) -> np.ndarray:
    if x.device.type == "meta":  # shapes only, no values to copy
        raise _not_cpu(operand, str(x.device))
    x = x.detach()
    if x.device.type != "cpu":  # e.g. torch_xla's device: the kernel runs on a host copy
        x = x.cpu()
    x = x.resolve_conj().resolve_neg()
    name = str(x.dtype).removeprefix("torch.")
    bits = _TORCH_BITS.get(name)
    if bits is None:
        return x.numpy()
    size = np.dtype(bits).itemsize
    torch = sys.modules["torch"]
    carrier = torch.uint8 if size == 1 else torch.int16
    return x.view(carrier).numpy().view(bits)


class _Capsule:
    """Hands numpy a DLPack capsule we already took from the producer."""

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DL_CPU, 0)


def _capsule_pointer(capsule: Any) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return int(get(capsule, b"dltensor"))


def _from_dlpack(x: Any, operand: str) -> np.ndarray:
    dev = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else (_DL_CPU, 0)
    if int(dev[0]) != _DL_CPU:
        raise _not_cpu(operand, f"DLPack device type {int(dev[0])}")
    capsule = x.__dlpack__()  # the legacy (unversioned) capsule every producer supports
    dtype = (ctypes.c_uint8 * 4).from_address(_capsule_pointer(capsule) + _DTYPE_OFFSET)
    code, nbits, lanes = dtype[0], dtype[1], dtype[2] | dtype[3] << 8
    bits = _DL_BITS.get(code) if lanes == 1 else None
    if bits is not None and nbits == 8 * np.dtype(bits).itemsize:
        dtype[0] = _DL_UINT  # same bytes, labelled as unsigned words numpy can import
        return np.from_dlpack(_Capsule(capsule)).view(bits)
    return np.from_dlpack(_Capsule(capsule))


def from_numpy(a: np.ndarray, fw: str) -> Any:
    """`a` as an array of framework `fw` ("torch", "jax"; anything else: `a` itself), bit-exact."""
    if fw == "torch":
        return _to_torch(a)
    if fw == "jax":
        jnp = sys.modules["jax"].numpy
        try:
            return jnp.asarray(a)
        except TypeError:  # a dtype JAX lacks
            return a
    return a


def send_home(result: Any, copies: list) -> Any:
    """After a launch whose inputs include tensors held off the host (`copies`: (tensor, its host
    copy, the host copy as it was before the run)): a host copy the kernel wrote (its bytes differ
    from the snapshot) is written back into its tensor, read-only inputs cost no transfer back;
    torch tensors in `result` (also inside tuples, lists, dicts) move to the device the off-host
    inputs share (left on the host when they are on several)."""
    if not copies:
        return result
    torch = sys.modules["torch"]
    with torch.no_grad():  # the kernel's writes are not part of an autograd graph
        for x, host, before in copies:
            if host.tobytes() == before.tobytes():
                continue
            # (the dispatcher's copy_, what Tensor.copy_ calls after its device guard)
            torch.ops.aten.copy_.default(x, _to_torch(host).reshape(x.shape))
    devices = {x.device for x, *_ in copies}
    if len(devices) != 1:
        return result
    (device,) = devices

    def move(r: Any) -> Any:
        if isinstance(r, torch.Tensor):
            return r.to(device)
        if isinstance(r, (tuple, list)):
            return type(r)(move(x) for x in r)
        if isinstance(r, dict):
            return {k: move(v) for k, v in r.items()}
        return r

    return move(result)


def _to_torch(a: np.ndarray) -> Any:
    torch = sys.modules["torch"]
    a = np.ascontiguousarray(a)
    if not a.flags.writeable:
        a = a.copy()
    name = a.dtype.name
    if name in _TORCH_BITS:
        target = getattr(torch, name, None)
        if target is None:
            return a
        return torch.from_numpy(a.view(_INT_OF_SIZE[a.dtype.itemsize])).view(target)
    try:
        return torch.from_numpy(a)
    except TypeError:  # a dtype torch lacks (e.g. float8_e4m3)
        return a
