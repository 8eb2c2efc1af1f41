"""trn3emu.testing: closeness rules, default tolerances, worst-element reports, run_kernel."""

import ml_dtypes
import numpy as np
import pytest
from trn3emu import testing

BF16 = ml_dtypes.bfloat16


def test_allclose_mode_matches_numpy_allclose():
    rng = np.random.default_rng(30)
    b = rng.standard_normal(1000)
    a = b + rng.standard_normal(1000) * 1e-3
    for rtol, atol in ((1e-2, 1e-4), (1e-3, 1e-5), (0.0, 1e-3)):
        ok, bad, _, _ = testing.compare(a, b, rtol=rtol, atol=atol)
        assert ok == np.allclose(a, b, rtol=rtol, atol=atol)
        np.testing.assert_array_equal(~bad, np.isclose(a, b, rtol=rtol, atol=atol))


def test_max_mode_is_range_relative():
    b = np.array([100.0, 1.0, 0.01])
    a = b + np.array([0.0, 0.5, 0.5])
    # |a-b| = 0.5 <= 0 + 0.01 * max|b| = 1.0 passes range-relative, fails elementwise
    assert testing.compare(a, b, rtol=0.01, atol=0.0, mode="max")[0]
    assert not testing.compare(a, b, rtol=0.01, atol=0.0, mode="allclose")[0]
    assert not testing.compare(a, b, rtol=0.004, atol=0.0, mode="max")[0]


def test_default_tolerances_per_dtype_and_exact_ints():
    assert testing.tolerances(np.int32) == (0.0, 0.0)
    assert testing.tolerances(BF16) == testing.DEFAULT_TOLERANCES["bfloat16"]
    with pytest.raises(AssertionError):
        testing.assert_close(np.array([1, 2, 4], np.int32), np.array([1, 2, 3]))
    # one bf16 ulp at 1.0 is 2^-7 < rtol 1e-2: passes with the bf16 default
    testing.assert_close(np.array([1.0078125], BF16), np.array([1.0]))


def test_nan_and_inf_handling():
    testing.assert_close(np.array([np.nan, np.inf, -np.inf]), np.array([np.nan, np.inf, -np.inf]))
    with pytest.raises(AssertionError):
        testing.assert_close(np.array([np.inf]), np.array([-np.inf]))
    with pytest.raises(AssertionError):
        testing.assert_close(np.array([np.nan]), np.array([np.nan]), equal_nan=False)


def test_ulp_distance_bf16_and_fp32_across_zero():
    one = np.array([1.0], BF16)
    nxt = np.array([1.0078125], BF16)  # next bf16 after 1.0
    assert testing.ulp_distance(nxt, one)[0] == 1
    a = np.array([np.float32(1.4e-45)], np.float32)  # smallest subnormal
    assert testing.ulp_distance(a, np.array([-1.4e-45]))[0] == 2
    assert testing.ulp_distance(np.array([0.0], np.float32), np.array([-0.0]))[0] == 0


def test_report_names_worst_element_with_index_values_ulp_bits():
    exp = np.zeros((3, 4), np.float32)
    act = exp.copy()
    act[1, 2] = 1.0
    act[2, 3] = 0.25
    with pytest.raises(AssertionError) as ei:
        testing.assert_close(act, exp, rtol=0, atol=1e-3)
    msg = str(ei.value)
    assert "2 of 12 elements differ" in msg
    first = msg.splitlines()[2]
    assert "(1, 2)" in first and "actual=1.0" in first and "expected=0.0" in first
    assert "bits actual=0x3f800000 expected=0x0" in first
    assert f"ulp={0x3F800000}" in first


def test_run_kernel_compares_each_output():
    import trn3emu.nki as tn

    tn.install()
    import nki
    import nki.language as nl

    @nki.jit
    def double(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(a), 2.0))
        return out

    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    testing.run_kernel(double, lambda x: x * 2, a)
    with pytest.raises(AssertionError):
        testing.run_kernel(double, lambda x: x * 3, a)
