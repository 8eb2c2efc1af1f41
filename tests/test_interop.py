"""Framework tensors in and out (trn3emu.interop): real JAX on the CPU, a DLPack-only object, and
torch when it is installed. Results are checked bit for bit against numpy references."""

from __future__ import annotations

import os

os.environ["JAX_PLATFORMS"] = "cpu"  # before jax is imported: no accelerator probing

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import trn3emu as t3  # noqa: E402
from nki_util import load_example  # noqa: E402
from trn3emu import interop, testing  # noqa: E402
from trn3emu.errors import MemorySpaceError, OperandError  # noqa: E402

BF16 = ml_dtypes.bfloat16
SHAPE = (128, 512)  # one tile of examples/nki_tensor_add.py


class DLPackOnly:
    """An array that speaks only DLPack (no __array__, no framework type), wrapping another array."""

    def __init__(self, inner, device=(1, 0)) -> None:
        self._inner, self._device = inner, device

    def __dlpack__(self, *args, **kwargs):
        return self._inner.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._device


def _bits(a) -> np.ndarray:
    """Raw bits of a numpy / JAX array, via numpy's own conversion (independent of interop)."""
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _values(dtype, seed: int, shape=SHAPE) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return (rng.standard_normal(shape) * 4).astype(dtype)


def _patterns(dtype, seed: int) -> np.ndarray:
    """Every bit pattern of a 1- or 2-byte float dtype (NaN payloads, -0, subnormals, Inf), shuffled
    into a 2-D array; random values for the others."""
    dt = np.dtype(dtype)
    if dt.kind in "iu" or dt.itemsize == 4:
        return _values(dt, seed, (64, 96))
    words = np.arange(1 << (8 * dt.itemsize), dtype={1: np.uint8, 2: np.uint16}[dt.itemsize])
    np.random.default_rng(seed).shuffle(words)
    return words.reshape(16, -1).view(dt)


def _add_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The Vector engine's add: fp32 arithmetic, one RNE cast to the output dtype."""
    return (a.astype(np.float32) + b.astype(np.float32)).astype(a.dtype)


@pytest.fixture(scope="module")
def tensor_add():
    return load_example("nki_tensor_add").tensor_add


# ------------------------------------------------------------------------------------- JAX
def test_jax_runs_on_cpu():
    assert {d.platform for d in jax.devices()} == {"cpu"}


@pytest.mark.parametrize(
    "dtype", [np.float32, BF16, np.int32, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2], ids=lambda d: d.__name__
)
def test_jax_hbm_round_trip_bit_exact(dtype):
    host = _patterns(dtype, 1)
    x = jnp.asarray(host)
    assert x.dtype == host.dtype
    dev = t3.Device()
    t = dev.hbm.put(x)
    assert t.dtype == t3.dtypes.dtype_name(host.dtype)
    # the bytes in HBM are the array's (checked through numpy, not through the conversion)
    assert dev.hbm.holds(t, host)
    y = dev.hbm.get(t)
    assert isinstance(y, jax.Array) and y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(_bits(y), _bits(host))
    # views of the tensor answer in JAX too; `like=` picks the framework explicitly
    assert isinstance(dev.hbm.get(t[3:7, ::2]), jax.Array)
    np.testing.assert_array_equal(_bits(dev.hbm.get(t[3:7, ::2])), _bits(host[3:7, ::2]))
    assert type(dev.hbm.get(t, like=host)) is np.ndarray


def test_jax_hbm_write_and_numpy_tensor_get_like_jax():
    host = _values(BF16, 2, (8, 16))
    dev = t3.Device()
    t = dev.hbm.alloc(host.shape, BF16)
    dev.hbm.write(t, jnp.asarray(host))
    assert type(dev.hbm.get(t)) is np.ndarray  # allocated, never put: numpy
    y = dev.hbm.get(t, like=jnp.zeros(1))
    assert isinstance(y, jax.Array)
    np.testing.assert_array_equal(_bits(y), _bits(host))


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32], ids=lambda d: d.__name__)
def test_jax_nki_kernel_in_jax_out_bit_exact(tensor_add, dtype):
    a, b = _values(dtype, 3), _values(dtype, 4)
    out = tensor_add(jnp.asarray(a), jnp.asarray(b))
    assert isinstance(out, jax.Array) and out.dtype == a.dtype and out.shape == SHAPE
    np.testing.assert_array_equal(_bits(out), _bits(_add_reference(a, b)))
    # a second call is served by the trace cache and converts the same way
    again = tensor_add(jnp.asarray(b), jnp.asarray(a))
    assert isinstance(again, jax.Array)
    np.testing.assert_array_equal(_bits(again), _bits(_add_reference(b, a)))


def test_jax_kernel_keyword_arguments(tensor_add):
    a, b = _values(BF16, 5), _values(BF16, 6)
    out = tensor_add(a=jnp.asarray(a), b=jnp.asarray(b))
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(_bits(out), _bits(_add_reference(a, b)))


def test_mixed_frameworks_give_numpy(tensor_add):
    a, b = _values(BF16, 7), _values(BF16, 8)
    for x, y in ((jnp.asarray(a), b), (a, jnp.asarray(b)), (jnp.asarray(a), DLPackOnly(jnp.asarray(b)))):
        out = tensor_add(x, y)
        assert type(out) is np.ndarray and out.dtype == BF16
        np.testing.assert_array_equal(_bits(out), _bits(_add_reference(a, b)))
    assert type(tensor_add(a, b)) is np.ndarray


def test_testing_helpers_take_jax_arrays(tensor_add):
    a, b = _values(BF16, 9), _values(BF16, 10)
    out = testing.run_kernel(
        tensor_add,
        lambda x, y: _add_reference(np.asarray(x), np.asarray(y)),
        jnp.asarray(a),
        jnp.asarray(b),
        rtol=0,
        atol=0,
    )
    assert isinstance(out, jax.Array)
    testing.assert_close(out, jnp.asarray(_add_reference(a, b)), rtol=0, atol=0)
    with pytest.raises(AssertionError, match="bits actual"):
        testing.assert_close(out, jnp.asarray(_add_reference(a, b)) + 1, rtol=0, atol=0)


# --------------------------------------------------------------------------------- DLPack
def test_dlpack_only_object_wrapping_numpy(tensor_add):
    a, b = _values(np.float32, 11), _values(np.float32, 12)
    wa = DLPackOnly(a)
    assert not hasattr(wa, "__array__")
    dev = t3.Device()
    t = dev.hbm.put(wa)
    assert dev.hbm.holds(t, a)
    assert type(dev.hbm.get(t)) is np.ndarray  # an unknown framework: numpy out
    out = tensor_add(wa, DLPackOnly(b))
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(_bits(out), _bits(_add_reference(a, b)))


@pytest.mark.parametrize("dtype", [BF16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2], ids=lambda d: d.__name__)
def test_dlpack_only_bf16_fp8_bit_exact(dtype):
    """numpy cannot import bf16 / fp8 DLPack tensors: the bits must still arrive unchanged."""
    host = _patterns(dtype, 13)
    a = interop.to_numpy(DLPackOnly(jnp.asarray(host)), "x")
    assert a.dtype == host.dtype
    np.testing.assert_array_equal(_bits(a), _bits(host))
    dev = t3.Device()
    t = dev.hbm.put(DLPackOnly(jnp.asarray(host)))
    assert t.dtype == t3.dtypes.dtype_name(host.dtype) and dev.hbm.holds(t, host)


# ----------------------------------------------------------------------------- bad inputs
def test_not_array_like_is_refused_naming_the_argument():
    dev = t3.Device()
    with pytest.raises(OperandError) as e:
        dev.hbm.put(object())
    assert e.value.rule == "array_not_array_like" and e.value.operand == "array"
    with pytest.raises(OperandError) as e:
        interop.to_numpy(object(), "weights")
    assert e.value.rule == "array_not_array_like" and "weights" in str(e.value)


def test_non_cpu_device_is_refused_naming_the_argument(tensor_add):
    a = _values(np.float32, 14)
    on_gpu = DLPackOnly(a, device=(2, 0))  # kDLCUDA
    dev = t3.Device()
    with pytest.raises(MemorySpaceError) as e:
        dev.hbm.put(on_gpu)
    assert e.value.rule == "array_not_on_cpu" and e.value.operand == "array"
    with pytest.raises(MemorySpaceError) as e:
        tensor_add(a, on_gpu)
    assert e.value.rule == "array_not_on_cpu" and e.value.operand == "b" and "b:" in str(e.value)
    with pytest.raises(MemorySpaceError) as e:
        tensor_add(a, b=on_gpu)
    assert e.value.operand == "b"


# ---------------------------------------------------------------------------------- torch
@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _torch_bits(x) -> np.ndarray:
    """Raw bits of a torch tensor through torch's own integer view (independent of interop)."""
    import torch

    carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
    return x.view(carrier).numpy().view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.element_size()])


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int32", "float8_e4m3fn", "float8_e5m2"])
def test_torch_hbm_round_trip_bit_exact(torch, name):
    dt = getattr(torch, name, None)
    if dt is None:
        pytest.skip(f"this torch has no {name}")
    host = _values(np.float32 if name != "int32" else np.int32, 15, (64, 96))
    x = torch.from_numpy(host).to(dt)
    size = x.element_size()
    if size < 4:  # every bit pattern (NaN payloads, -0, subnormals), through torch's integer view
        words = np.arange(1 << (8 * size)).astype({1: np.uint8, 2: np.int16}[size])  # int16 wraps
        np.random.default_rng(15).shuffle(words)
        x = torch.from_numpy(words.reshape(16, -1)).view(dt)
    dev = t3.Device()
    t = dev.hbm.put(x)
    assert t.dtype == name
    y = dev.hbm.get(t)
    assert isinstance(y, torch.Tensor) and y.dtype == dt and y.shape == x.shape
    np.testing.assert_array_equal(_torch_bits(y), _torch_bits(x))
    # the HBM bytes are torch's own bits
    assert dev.hbm.holds(t, _torch_bits(x))


def test_torch_kernel_in_torch_out_bf16_bit_exact(torch, tensor_add):
    a, b = _values(BF16, 16), _values(BF16, 17)
    ta = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    tb = torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)
    out = tensor_add(ta, tb)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    np.testing.assert_array_equal(_torch_bits(out), _bits(_add_reference(a, b)))
    # torch and JAX together: numpy
    mixed = tensor_add(ta, jnp.asarray(b))
    assert type(mixed) is np.ndarray
    np.testing.assert_array_equal(_bits(mixed), _bits(_add_reference(a, b)))


def test_torch_requires_grad_and_views(torch, tensor_add):
    a, b = _values(np.float32, 18), _values(np.float32, 19)
    ta = torch.from_numpy(a).requires_grad_(True)
    tb = torch.from_numpy(np.ascontiguousarray(b.T)).T  # a transposed (non-contiguous) view
    out = tensor_add(ta, tb)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), _add_reference(a, b))


def test_torch_non_cpu_device_is_refused(torch):
    x = torch.empty((4, 4), device="meta")
    with pytest.raises(MemorySpaceError) as e:
        t3.Device().hbm.put(x)
    assert e.value.rule == "array_not_on_cpu" and e.value.operand == "array"
