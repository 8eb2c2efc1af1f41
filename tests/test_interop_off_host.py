"""Torch tensors held on another device (torch_xla's `xla`, where the vendor's PyTorch path runs
NKI kernels): the kernel runs on a host copy, results come back on the inputs' device and an input
the kernel writes is written on that device too (`interop.send_home`).

torch_xla is not a test dependency, so `XlaStandIn` plays its part: a tensor whose device is
`xla:0` and whose values live in a CPU tensor, plus a dispatch mode that moves CPU tensors there.
Needs torch (skipped without it); results are checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from trn3emu.errors import MemorySpaceError

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from trn3emu import nki  # noqa: E402
from trn3emu.nki import language as nl  # noqa: E402

XLA = torch.device("xla", 0)


class OnXla(torch.Tensor):
    """A tensor on device xla:0 whose values are the CPU tensor `inner`."""

    @staticmethod
    def __new__(cls, inner):
        t = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=XLA)
        t.inner = inner
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


#: the xla tensors a host copy was written into (each `copy_` onto the device)
WRITTEN_BACK: list = []


def _dispatch(func, args, kwargs):
    aten = torch.ops.aten
    if func is aten._to_copy.default:
        (x,) = args
        inner = x.inner if isinstance(x, OnXla) else x
        dev = kwargs.pop("device", None)
        out = func(inner, **kwargs)
        return OnXla(out) if dev is not None and torch.device(dev).type == "xla" else out
    if func is aten.copy_.default:
        dst, src = args
        WRITTEN_BACK.append(dst)
        dst.inner.copy_(src.inner if isinstance(src, OnXla) else src)
        return dst
    if func is aten.detach.default and isinstance(args[0], OnXla):
        return OnXla(args[0].inner.detach())
    if any(isinstance(a, OnXla) for a in args):
        raise NotImplementedError(f"the stand-in has no {func}")
    return func(*args, **kwargs)


class XlaStandIn(TorchDispatchMode):
    """Inside it, `.to("xla")` of a CPU tensor makes an `OnXla` tensor."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


@nki.jit
def add_and_bump(a, b):
    """a + b, and b += 1 in place (an input the kernel writes)."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    tb = nl.load(b)
    nl.store(out, nl.add(nl.load(a), tb))
    nl.store(b, nl.add(tb, 1.0))
    return out


def test_xla_tensors_in_results_on_xla_and_written_input_written_back():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal((64, 48)).astype(np.float32)
    with XlaStandIn():
        ta, tb = torch.from_numpy(a.copy()).to(XLA), torch.from_numpy(b.copy()).to(XLA)
        assert ta.device == XLA
        WRITTEN_BACK.clear()
        out = add_and_bump(ta, tb)
    # only the input the kernel wrote goes back to the device: the read-only one costs no transfer
    assert len(WRITTEN_BACK) == 1 and WRITTEN_BACK[0] is tb
    assert isinstance(out, OnXla) and out.device == XLA and out.dtype == torch.float32
    np.testing.assert_array_equal(out.inner.numpy(), a + b)
    np.testing.assert_array_equal(tb.inner.numpy(), b + np.float32(1))  # written on its device
    np.testing.assert_array_equal(ta.inner.numpy(), a)  # read only: unchanged


def test_bf16_xla_tensor_bit_exact():
    rng = np.random.default_rng(8)
    words = rng.integers(0, 1 << 16, (32, 64), dtype=np.uint16)
    words[(words & 0x7F80) == 0x7F80] = 0x3F80  # no NaN / inf: a + 0 + ... keeps every other bit pattern
    with XlaStandIn():
        t = torch.from_numpy(words.view(np.int16).copy()).view(torch.bfloat16).to(XLA)
        z = torch.zeros((32, 64), dtype=torch.bfloat16).to(XLA)
        out = add_and_bump(t, z)
    assert out.device == XLA and out.dtype == torch.bfloat16
    got = out.inner.view(torch.int16).numpy().view(np.uint16)
    neg_zero = words == 0x8000  # -0 + +0 = +0
    np.testing.assert_array_equal(got[~neg_zero], words[~neg_zero])
    assert (got[neg_zero] == 0).all()


def test_meta_tensor_still_refused():
    with pytest.raises(MemorySpaceError) as e:
        add_and_bump(torch.empty((4, 4), device="meta"), torch.empty((4, 4), device="meta"))
    assert e.value.rule == "array_not_on_cpu" and e.value.operand == "a"


def test_spmd_ranks_with_xla_tensors():
    """`nki.spmd`: each rank's results on the device, each rank's written input written back."""
    rng = np.random.default_rng(9)
    host = [(rng.standard_normal((32, 16)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32))]
    host.append((host[0][1] * 3, host[0][0] - 1))
    with XlaStandIn():
        dev = [(torch.from_numpy(a.copy()).to(XLA), torch.from_numpy(b.copy()).to(XLA)) for a, b in host]
        outs = nki.spmd(add_and_bump, world_size=2)(dev)
    for (a, b), (ta, tb), out in zip(host, dev, outs, strict=True):
        assert isinstance(out, OnXla)
        np.testing.assert_array_equal(out.inner.numpy(), a + b)
        np.testing.assert_array_equal(tb.inner.numpy(), b + np.float32(1))
        np.testing.assert_array_equal(ta.inner.numpy(), a)
