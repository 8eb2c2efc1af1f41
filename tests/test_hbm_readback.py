"""The host's read-back of HBM (`Hbm.get`): the bytes land in an array numpy allocated
(`_native.Device.hbm_read_into`), whatever pages they span; the native read refuses a
non-contiguous, read-only or wrongly typed destination and addresses past HBM."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from trn3emu.errors import AddressError, ArgumentTypeError, EmuError

PAGE = 1 << 20  # (HBM's host pages, `memory/hbm.rs`: reads across them are pieced together)


def test_get_gives_back_the_bytes_put_across_pages():
    rng = np.random.default_rng(5)
    dev = t3.Device()
    dev.hbm.put(np.zeros(77, np.uint8))  # (the next tensor does not start on a page boundary)
    x = rng.integers(0, 2**32, size=(3 * PAGE // 4 + 5,), dtype=np.uint32).view(np.float32)
    t = dev.hbm.put(x)
    got = dev.hbm.get(t)
    assert got.dtype == np.float32 and got.shape == x.shape and got.flags.c_contiguous and got.flags.writeable
    np.testing.assert_array_equal(got.view(np.uint32), x.view(np.uint32))  # bits, NaN payloads too
    # a strided view's read-back: the span read, then the view copied out
    np.testing.assert_array_equal(dev.hbm.get(t[5::3]).view(np.uint32), x[5::3].view(np.uint32))


def test_read_into_refuses_a_strided_destination_and_addresses_past_hbm():
    dev = t3.Device()
    t = dev.hbm.put(np.arange(16, dtype=np.uint8))
    native = dev._native
    out = np.zeros(32, np.uint8)
    native.hbm_read_into(t.offset, out[:16])
    np.testing.assert_array_equal(out[:16], np.arange(16, dtype=np.uint8))
    with pytest.raises(EmuError) as e:
        native.hbm_read_into(t.offset, out[::2])
    assert e.value.rule == "array_not_contiguous"
    with pytest.raises(AddressError) as e:
        native.hbm_read_into(144 * 2**30 - 8, out[:16])
    assert e.value.rule == "hbm_out_of_range"


@pytest.mark.parametrize("method", ["hbm_read_into", "hbm_write", "hbm_equals"])
@pytest.mark.parametrize(
    "bad, shown",
    [
        (np.zeros(8, np.float32), "1-dimensional float32"),
        (np.zeros((2, 4), np.uint8), "2-dimensional uint8"),
        ([0] * 8, "list"),
    ],
)
def test_raw_byte_methods_name_a_wrong_array(method, bad, shown):
    """A wrong dtype, rank or type is the project's ArgumentTypeError naming the method and the
    operand, not PyO3's bare TypeError."""
    dev = t3.Device()
    t = dev.hbm.put(np.arange(8, dtype=np.uint8))
    with pytest.raises(ArgumentTypeError) as e:
        getattr(dev._native, method)(t.offset, bad)
    assert e.value.rule == "u8_array_expected"
    assert e.value.operand == ("out" if method == "hbm_read_into" else "data")
    assert method in str(e.value) and shown in str(e.value)
    np.testing.assert_array_equal(dev.hbm.get(t), np.arange(8, dtype=np.uint8))  # nothing written


def test_read_into_refuses_a_read_only_destination():
    dev = t3.Device()
    t = dev.hbm.put(np.arange(8, dtype=np.uint8))
    out = np.zeros(8, np.uint8)
    out.flags.writeable = False
    with pytest.raises(EmuError) as e:
        dev._native.hbm_read_into(t.offset, out)
    assert e.value.rule == "array_not_writeable"
    assert not out.any()
