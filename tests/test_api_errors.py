"""Issue 31 item 7, the Python API: arguments that used to raise a bare ValueError /
OverflowError / TypeError raise an `EmuError` subclass with a rule id (docs/errors.md)."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from trn3emu.errors import ArgumentTypeError, DtypeError, EmuError, OperandError


def _rule(exc_info) -> str:
    assert isinstance(exc_info.value, EmuError)
    return exc_info.value.rule


@pytest.mark.parametrize("array", [np.array(["a", "b", "c", "d"]), np.array([1, 2, 3, 4], dtype=object)])
def test_hbm_write_of_a_non_numeric_array(array):
    dev = t3.Device()
    t = dev.hbm.put(np.arange(4, dtype=np.float32))
    with pytest.raises(DtypeError) as e:
        dev.hbm.write(t, array)
    assert _rule(e) == "dtype_unknown" and str(array.dtype) in str(e.value)
    np.testing.assert_array_equal(dev.hbm.get(t), np.arange(4, dtype=np.float32))  # untouched
    dev.hbm.write(t, np.array([4, 3, 2, 1], dtype=np.int64))  # numbers of another dtype: cast
    np.testing.assert_array_equal(dev.hbm.get(t), np.array([4, 3, 2, 1], np.float32))


@pytest.mark.parametrize(
    ("kwargs", "cls", "rule"),
    [
        ({"max_memory": 2**64}, OperandError, "int_out_of_range"),
        ({"max_memory": -1}, OperandError, "int_out_of_range"),
        ({"trace_limit": -1}, OperandError, "int_out_of_range"),
        ({"trace_limit": 2**64}, OperandError, "int_out_of_range"),
        ({"trace_limit": "x"}, ArgumentTypeError, "int_expected"),
        ({"trace_limit": 1.5}, ArgumentTypeError, "int_expected"),
    ],
)
def test_run_limits_out_of_range(kwargs, cls, rule):
    dev = t3.Device()
    with pytest.raises(cls) as e:
        dev.run(t3.Program(), **kwargs)
    assert _rule(e) == rule and next(iter(kwargs)) in str(e.value)


def test_run_limits_at_the_edges_are_taken():
    dev = t3.Device()
    assert dev.run(t3.Program(), max_memory=2**64 - 1, trace_limit=0).executed == 0


def test_ultraserver_unknown_option_and_chip_index():
    with pytest.raises(OperandError) as e:
        t3.UltraServer(bogus=1)
    assert _rule(e) == "unknown_numerics_option" and "bogus" in str(e.value)
    us = t3.UltraServer(chips=1, rounding="rne")  # a real Device option still passes through
    with pytest.raises(ArgumentTypeError) as e:
        us.chip(None)
    assert _rule(e) == "int_expected"
    with pytest.raises(ArgumentTypeError):
        us.chip(0.0)  # never truncated
    assert us.chip(np.int64(0)) is us.chips[0]
