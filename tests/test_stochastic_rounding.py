"""Stochastic rounding, tested statistically (reference numerics §5.5): support on the two
neighbours, representable values unchanged, up-frequency within 5 sigma of the exact fraction,
the stagnation example, seed reproducibility, the runtime's environment switches."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from conftest import Out, assert_bits_equal, run_op

P, F = 128, 1024  # 131072 draws per point


def sr_copy(x: float, dt, seed: int = 1, rounding: str = "stochastic") -> np.ndarray:
    dev = t3.Device(rounding=rounding, seed=seed)
    a = np.full((P, F), x, np.float32)
    (got,) = run_op(dev, [a], [((P, F), dt)], lambda p, s, o: p.tensor_copy(dst=o, src=s))
    return got


def neighbours(x: float, dt) -> tuple[float, float, float]:
    """(down, up, exact fraction) of x between its two neighbours in dt, from ml_dtypes codes."""
    x32 = np.float32(x)
    tz = np.array([x32]).astype(dt)  # RNE result, one of the neighbours
    code = int(tz.view(np.uint8 if np.dtype(dt).itemsize == 1 else np.uint16)[0])
    view = np.uint8 if np.dtype(dt).itemsize == 1 else np.uint16
    c = np.array([code - 1, code, code + 1], view).view(dt).astype(np.float64)
    cands = sorted(v for v in c if np.isfinite(v))
    lo = max(v for v in cands if v <= x)
    hi = min(v for v in cands if v >= x)
    frac = (float(x32) - lo) / (hi - lo) if hi > lo else 0.0
    return lo, hi, frac


POINTS = [
    (1.0 + 0.3 * 2**-7, ml_dtypes.bfloat16),  # normal, frac 0.3
    (3.0 + 0.9 * 2**-6, ml_dtypes.bfloat16),  # frac 0.9
    (1.0e-39, ml_dtypes.bfloat16),  # bf16 subnormal
    (3.0e38, ml_dtypes.bfloat16),  # near overflow
    (1.0 + 0.25 * 2**-10, np.float16),
    (3.0e-7, np.float16),  # fp16 subnormal
    (65000.0, np.float16),  # near max
    (440.0, ml_dtypes.float8_e4m3fn),  # between 416 and 448 (the max)
    (0.0031, ml_dtypes.float8_e4m3fn),  # fp8 subnormal
    (0.7, ml_dtypes.float8_e5m2),
    (50000.0, ml_dtypes.float8_e5m2),  # between 49152 and 57344 (the max)
]


@pytest.mark.parametrize("x,dt", POINTS, ids=lambda v: str(v))
def test_sr_frequency_and_support(x, dt):
    lo, hi, p = neighbours(x, dt)
    assert lo < x < hi
    got = sr_copy(x, dt).astype(np.float64).reshape(-1)
    assert set(np.unique(got)) <= {lo, hi}, np.unique(got)
    n = got.size
    k = int(np.count_nonzero(got == hi))
    z = (k - n * p) / np.sqrt(n * p * (1 - p))
    assert abs(z) < 5, (k / n, p, z)
    # Sign symmetry: -x rounds to the negated neighbours with the same frequency law.
    neg = sr_copy(-x, dt, seed=2).astype(np.float64).reshape(-1)
    assert set(np.unique(neg)) <= {-lo, -hi}
    kn = int(np.count_nonzero(neg == -hi))
    assert abs((kn - n * p) / np.sqrt(n * p * (1 - p))) < 5


@pytest.mark.parametrize(
    "dt", [ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3]
)
def test_representable_values_unchanged(dt):
    codes = np.arange(1 << (8 * np.dtype(dt).itemsize), dtype=np.uint32)
    codes = codes.astype(np.uint8 if np.dtype(dt).itemsize == 1 else np.uint16)
    vals = codes.view(dt).astype(np.float32)
    vals = vals[np.isfinite(vals)]
    n = -(-vals.size // P) * P
    a = np.resize(vals, n).reshape(P, -1)
    dev = t3.Device(rounding="stochastic", seed=5)
    (got,) = run_op(dev, [a], [(a.shape, dt)], lambda p, s, o: p.tensor_copy(dst=o, src=s))
    assert_bits_equal(got, a.astype(dt))


def test_near_overflow_can_round_to_inf_bf16():
    # Halfway into the last bf16 binade step above max: SR rounds "up" to Inf about half the time.
    mx = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    x = np.float32(mx * (1 + 2**-9))
    got = sr_copy(float(x), ml_dtypes.bfloat16).astype(np.float32).reshape(-1)
    assert set(np.unique(got)) <= {np.float32(mx), np.inf}
    frac = np.mean(np.isinf(got))
    assert 0.45 < frac < 0.55


def test_stagnation_example():
    """bf16 256 + 4096 x 0.25: RNE stays 256; SR lands near 1280 (the exact sum)."""

    def run(rounding):
        dev = t3.Device(rounding=rounding, seed=11)
        p = t3.Program()
        acc = p.sbuf((128, 8), ml_dtypes.bfloat16)
        p.memset(dst=acc, value=256.0)
        for _ in range(4096):
            p.tensor_scalar(dst=acc, data=acc, op0="add", operand0=0.25)
        out = dev.hbm.alloc((128, 8), ml_dtypes.bfloat16)
        p.dma_copy(dst=out, src=acc)
        dev.run(p, check_races=False, trace=False)
        return dev.hbm.get(out).astype(np.float64)

    assert np.all(run("rne") == 256.0)
    sr = run("stochastic")
    assert abs(sr.mean() - 1280.0) < 40, sr.mean()


def test_bf16_psum_write_and_accumulate_use_sr():
    # Ones stationary: psum[m, n] = sum_k moving[k, n]; 1 + 0.3 ulp in every column sum.
    k = 32
    x = np.float32(1.0 + 0.3 * 2**-7) / k
    mov = np.full((k, 512), x, np.float32)
    ones = np.ones((k, 128), np.float32)
    exact = float(np.float32(np.float32(x) * k))  # the fp32 sum is exact (power-of-two k)
    lo, hi, p = neighbours(exact, ml_dtypes.bfloat16)
    dev = t3.Device(rounding="stochastic", seed=3)
    (got,) = run_op(
        dev,
        [ones, mov],
        [Out((128, 512), ml_dtypes.bfloat16, "psum")],
        lambda pr, a, b, o: pr.nc_matmul(dst=o, stationary=a, moving=b, accumulate=False),
    )
    g = got.astype(np.float64).reshape(-1)
    assert set(np.unique(g)) <= {lo, hi}
    kk = int(np.count_nonzero(g == hi))
    assert abs((kk - g.size * p) / np.sqrt(g.size * p * (1 - p))) < 5
    # RNE device: every element rounds to nearest.
    (rne,) = run_op(
        t3.Device(),
        [ones, mov],
        [Out((128, 512), ml_dtypes.bfloat16, "psum")],
        lambda pr, a, b, o: pr.nc_matmul(dst=o, stationary=a, moving=b, accumulate=False),
    )
    assert np.all(rne.astype(np.float64) == np.float64(np.float32(exact).astype(ml_dtypes.bfloat16)))


def test_same_seed_same_bits_different_seed_different_bits():
    x = 1.0 + 0.5 * 2**-7
    a = sr_copy(x, ml_dtypes.bfloat16, seed=42)
    b = sr_copy(x, ml_dtypes.bfloat16, seed=42)
    c = sr_copy(x, ml_dtypes.bfloat16, seed=43)
    assert_bits_equal(a, b)
    assert np.count_nonzero(a.view(np.uint16) != c.view(np.uint16)) > 1000


def test_sr_only_when_enabled_and_dma_casts_stay_rne():
    x = 1.0 + 0.3 * 2**-7
    rne = sr_copy(x, ml_dtypes.bfloat16, rounding="rne")
    assert np.all(rne.astype(np.float64) == 1.0)
    dev = t3.Device(rounding="stochastic", seed=9)
    h = dev.hbm.put(np.full((128, 64), x, np.float32))
    out = dev.hbm.alloc((128, 64), ml_dtypes.bfloat16)
    p = t3.Program()
    p.dma_copy(dst=out, src=h)  # DMA casts are not compute-engine output casts
    dev.run(p)
    assert np.all(dev.hbm.get(out).astype(np.float64) == 1.0)


def test_environment_switches(monkeypatch):
    monkeypatch.setenv("NEURON_RT_STOCHASTIC_ROUNDING_EN", "1")
    monkeypatch.setenv("NEURON_RT_STOCHASTIC_ROUNDING_SEED", "1234")
    dev = t3.Device()
    assert dev.numerics["rounding"] == "stochastic" and dev.numerics["seed"] == 1234
    a = np.full((128, 256), 1.0 + 0.3 * 2**-7, np.float32)
    (g1,) = run_op(dev, [a], [((128, 256), ml_dtypes.bfloat16)], lambda p, s, o: p.tensor_copy(dst=o, src=s))
    assert len(np.unique(g1.astype(np.float32))) == 2
    (g2,) = run_op(
        t3.Device(seed=1234), [a], [((128, 256), ml_dtypes.bfloat16)], lambda p, s, o: p.tensor_copy(dst=o, src=s)
    )
    assert_bits_equal(g1, g2)
    # Explicit arguments override the environment.
    assert t3.Device(rounding="rne").numerics["rounding"] == "rne"
    monkeypatch.delenv("NEURON_RT_STOCHASTIC_ROUNDING_EN")
    assert t3.Device().numerics["rounding"] == "rne"


def test_sr_bits_parameter_staircase():
    # With r random bits, P(up) = floor(frac * 2^r) / 2^r (reference numerics §5.2): r = 2, frac 0.3 -> 0.25.
    dev = t3.Device(rounding="stochastic", seed=4, sr_bits=2)
    a = np.full((P, F), 1.0 + 0.3 * 2**-7, np.float32)
    (got,) = run_op(dev, [a], [((P, F), ml_dtypes.bfloat16)], lambda p, s, o: p.tensor_copy(dst=o, src=s))
    frac = np.mean(got.astype(np.float64) > 1.0)
    n = got.size
    assert abs((frac - 0.25) * n / np.sqrt(n * 0.25 * 0.75)) < 5


def test_unbiased_on_a_grid_of_fractions():
    """E[SR(x)] = x: for frac = k/64 (k = 0..63) the up-frequency matches k/64 at every point,
    and the chi-square over the grid is consistent with the binomial model."""
    ulp = 2.0**-7
    k = np.arange(64)
    row = (1.0 + k / 64 * ulp).astype(np.float32)
    a = np.tile(row, (P, 32))  # 4096 draws per fraction
    dev = t3.Device(rounding="stochastic", seed=21)
    (got,) = run_op(dev, [a], [(a.shape, ml_dtypes.bfloat16)], lambda p, s, o: p.tensor_copy(dst=o, src=s))
    up = (got.astype(np.float64) > 1.0).reshape(P, 32, 64).sum(axis=(0, 1))
    n = P * 32
    p = k / 64
    assert up[0] == 0
    z = (up[1:] - n * p[1:]) / np.sqrt(n * p[1:] * (1 - p[1:]))
    assert np.all(np.abs(z) < 5), z
    chi2 = float(np.sum(z**2))  # 63 degrees of freedom: mean 63, sd ~11.2
    assert chi2 < 63 + 6 * 11.2, chi2
    mean_err = np.mean(got.astype(np.float64).reshape(P, 32, 64), axis=(0, 1)) - row.astype(np.float64)
    assert np.all(np.abs(mean_err) < 5 * ulp / 2 / np.sqrt(n))


def test_bf16_psum_accumulate_upcast_add_round_sr():
    """Accumulating into bf16 PSUM: upcast, fp32 add, round (SR): 256 + 0.25 -> 256 or 258 with
    P(258) = 0.125; with RNE always 256."""
    k = 32
    mov = np.full((k, 512), 0.25 / k, np.float32)
    ones = np.ones((k, 128), np.float32)

    def run(dev):
        (got,) = run_op(
            dev,
            [ones, mov],
            [Out((128, 512), ml_dtypes.bfloat16, "psum", fill=256.0)],
            lambda pr, a, b, o: pr.nc_matmul(dst=o, stationary=a, moving=b, accumulate=True),
        )
        return got.astype(np.float64).reshape(-1)

    assert np.all(run(t3.Device()) == 256.0)
    g = run(t3.Device(rounding="stochastic", seed=8))
    assert set(np.unique(g)) <= {256.0, 258.0}
    n, p = g.size, 0.125
    kk = int(np.count_nonzero(g == 258.0))
    assert abs((kk - n * p) / np.sqrt(n * p * (1 - p))) < 5
