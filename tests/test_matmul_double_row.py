"""nc_matmul perf_mode=double_row (reference §1.5): FP8 [K, 2, M] x [K, 2, N] with contraction
over both K and the size-2 dim, against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from conftest import Out, run_op


@pytest.mark.parametrize(
    "sdt,mdt",
    [
        (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
        (ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3),
        (ml_dtypes.float8_e4m3, ml_dtypes.float8_e4m3),
    ],
)
def test_double_row_matches_numpy(dev, sdt, mdt):
    rng = np.random.default_rng(4)
    K, M, N = 128, 96, 256
    a = rng.integers(-8, 9, size=(K, 2, M)).astype(np.float32).astype(sdt)
    b = rng.integers(-8, 9, size=(K, 2, N)).astype(np.float32).astype(mdt)
    want = np.einsum("kli,klj->ij", a.astype(np.float64), b.astype(np.float64)).astype(np.float32)  # exact
    (got,) = run_op(
        dev,
        [a.reshape(K, 2 * M), b.reshape(K, 2 * N)],
        [Out((M, N), np.float32, "psum")],
        lambda p, x, y, o: p.nc_matmul(
            dst=o,
            stationary=x.reshape(K, 2, M),
            moving=y.reshape(K, 2, N),
            perf_mode="double_row",
        ),
    )
    assert np.array_equal(got, want)


def test_double_row_rules():
    p = t3.Program()
    a = p.sbuf((32, 2 * 16), ml_dtypes.bfloat16)
    b = p.sbuf((32, 2 * 16), ml_dtypes.bfloat16)
    o = p.psum((16, 16), np.float32)
    with pytest.raises(t3.DtypeError, match="fp8"):
        p.nc_matmul(dst=o, stationary=a.reshape((32, 2, 16)), moving=b.reshape((32, 2, 16)), perf_mode="double_row")
    a8 = p.sbuf((32, 32), ml_dtypes.float8_e4m3fn)
    with pytest.raises(t3.ShapeError, match=r"\[K, 2, F\]"):
        p.nc_matmul(dst=o, stationary=a8, moving=a8, perf_mode="double_row")
    l8 = p.sbuf((32, 32), ml_dtypes.float8_e4m3)
    with pytest.raises(t3.DtypeError, match="mixed"):
        p.nc_matmul(dst=o, stationary=a8.reshape((32, 2, 16)), moving=l8.reshape((32, 2, 16)), perf_mode="double_row")
