"""Seeded smoke of the Python API fuzz (fuzz/python/fuzz_api.py; coverage-guided with atheris,
docs/fuzzing.md): a fixed set of pseudo-random inputs, the same every run, plus the inputs the
campaign found (fuzz/regressions/api/). A call that raises outside the `EmuError` hierarchy, or
a device left unusable by a failed call, fails the test."""

from __future__ import annotations

import gc
import importlib.util
import random
import weakref
from pathlib import Path

import numpy as np
import pytest
import trn3emu as t3

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fuzz_api", ROOT / "fuzz" / "python" / "fuzz_api.py")
fuzz_api = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_api)

REGRESSIONS = sorted((ROOT / "fuzz" / "regressions" / "api").glob("*"))


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.name for p in REGRESSIONS])
def test_api_fuzz_regressions(path):
    fuzz_api.one_input(path.read_bytes())


@pytest.mark.parametrize("seed", range(3))
def test_api_fuzz_smoke(seed):
    rng = random.Random(seed)
    for _ in range(40):
        fuzz_api.one_input(bytes(rng.randrange(256) for _ in range(rng.randrange(400))))


# ----------------------------------------------------------- findings of the API fuzz, one each
@pytest.mark.parametrize(
    "kw, rule",
    [
        ({"engine": 1.5}, "str_expected"),
        ({"name": b"x"}, "str_expected"),
        ({"wait": 5}, "sync_list_malformed"),
        ({"signal": 1.5}, "sync_list_malformed"),
    ],
)
def test_wrong_types_of_engine_name_wait_signal(kw, rule):
    p = t3.Program()
    s = p.sbuf((1, 4), np.float32)
    with pytest.raises(t3.EmuError) as e:
        p.memset(dst=s, value=0.0, **kw)
    assert e.value.rule == rule
    assert len(p) == 0


def test_a_tensor_as_wait_or_signal_is_malformed_not_iterated():
    # Found by the API fuzz (timeout): list(tensor) indexed a Tensor 0, 1, 2, ... (it has
    # __getitem__ but no __iter__), view by view; a broadcast of 2**33 rows never finished, and a
    # small tensor ended in a ShapeError about an index instead of the sync-list rule.
    p = t3.Program()
    s = p.sbuf((4, 4), np.float32)
    rows = t3.Device().hbm.alloc((1, 4), np.float32).broadcast(0, 1 << 20)
    for bad in (s, rows):
        for kw in ("wait", "signal"):
            with pytest.raises(t3.SemaphoreError) as e:
                p.memset(dst=s, value=0.0, **{kw: bad})
            assert e.value.rule == "sync_list_malformed"
    assert len(p) == 0


def test_a_tensor_is_not_iterable_wherever_a_sequence_is_expected():
    # The same class as the wait= finding, probed by hand: a Tensor passed as a sequence was
    # indexed row by row (permute, Device.run: a hang on 2**24 rows), or raised a bare TypeError.
    dev = t3.Device()
    rows = dev.hbm.alloc((1, 4), np.float32).broadcast(0, 1 << 24)
    s = t3.Program().sbuf((4, 4), np.float32)
    with pytest.raises(t3.ArgumentTypeError) as e:
        list(s)
    assert e.value.rule == "tensor_not_iterable" and isinstance(e.value, TypeError)
    for call in (lambda: s.permute(rows), lambda: dev.run(rows), lambda: dev.programs(cores=rows)):
        with pytest.raises(t3.EmuError):
            call()
    assert s[1].shape == (1, 4)  # indexing and slicing are unchanged


@pytest.mark.parametrize("data", [1 << 40, -1, 3, "abc", None])
def test_program_decode_takes_bytes(data):
    # bytes(n) made n zero bytes: 2**40 a MemoryError, -1 a ValueError, 3 a program decoded
    # from zeros.
    with pytest.raises(t3.ArgumentTypeError) as e:
        t3.Program.decode(data)
    assert e.value.rule == "bytes_expected"


def test_reshape_to_a_zero_dim_shape_holds_one_element():
    # Found by the API fuzz (fuzz/regressions/api/reshape-zero-dim): reshape(()) of a one-element
    # on-chip tile raised IndexError (shape[0] of ()), and of an HBM tensor made a 0-d tensor.
    s = t3.Program().sbuf((1, 1), np.float32)
    h = t3.Device().hbm.alloc((1,), np.float32)
    for t in (s, h):
        assert t.reshape(()).shape == (1,) == t.reshape().shape


def test_get_of_a_view_below_the_tensor_raises():
    dev = t3.Device()
    t = dev.hbm.put(np.arange(8, dtype=np.float32))
    with pytest.raises(t3.AddressError):
        dev.hbm.get(t.ap([[1, 4]], offset=-4))
    np.testing.assert_array_equal(dev.hbm.get(t), np.arange(8, dtype=np.float32))


def test_device_memory_is_freed_without_the_cycle_collector():
    # HBM blocks referred to their Hbm strongly: Hbm -> live blocks -> Hbm, a cycle that kept the
    # device's ~280 MiB until the cycle collector ran.
    gc.disable()
    try:
        dev = t3.Device()
        hbm = weakref.ref(dev.hbm)
        t = dev.hbm.put(np.ones(4, np.float32))
        del dev
        assert hbm() is None
        with t:  # its device is gone: leaving the block does nothing
            pass
    finally:
        gc.enable()


def test_zero_dim_hbm_alloc_holds_one_element_like_put_and_sbuf():
    dev = t3.Device()
    t = dev.hbm.alloc((), np.float32)
    assert t.shape == (1,) == dev.hbm.put(np.float32(3)).shape == t3.Program().sbuf((), np.float32).shape
    assert t.view_as(np.int32).shape == (1,)  # used to raise IndexError on the 0-d shape


def test_shared_device_is_reset_between_inputs():
    # The inputs share one device (a new one per input was most of the fuzz's time): between them
    # HBM placement and bytes are as on a new device, and a device whose RNG ran or that holds HBM
    # pages outside the input's tensors is replaced.
    pool = fuzz_api.Pool()
    dev = pool.dev
    t = dev.hbm.put(np.arange(1000, dtype=np.float32))
    dev.max_executed = 7
    pool.reset(t.block.hi, rng_used=False)
    assert pool.dev is dev and dev.max_executed == fuzz_api.MAX_EXECUTED
    u = dev.hbm.alloc((1000,), np.float32)
    assert u.offset == t.offset == 0
    np.testing.assert_array_equal(dev.hbm.get(u), np.zeros(1000, np.float32))
    pool.reset(u.block.hi, rng_used=True)
    assert pool.dev is not dev
    dev = pool.dev
    dev.hbm._native.hbm_write(1 << 30, np.ones(4, np.uint8))  # a page no tensor of the input covers
    pool.reset(0, rng_used=False)
    assert pool.dev is not dev
