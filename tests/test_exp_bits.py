"""exp on ScalarE (activation, activation_reduce, activate2) and VectorE (exponential) is defined as
libm's float64 exp rounded once to fp32 (docs/numerics.md); the emulator computes it with a fast
vectorised kernel that must give exactly those bits on every SIMD path. Reference here:
np.exp(t.astype(float64)).astype(float32) of the fp32 pre-step t, compared bitwise (NaN positions
compared as NaN; NaN payloads compared across paths). Sigmoid, silu and tanh share the kernel; their
references are the documented float64 formulas on np.exp, rounded once, and libm's float64 tanh
(Python's math.tanh, the same host libm) rounded once."""

from __future__ import annotations

import math

import numpy as np
import pytest
import trn3emu as t3
from conftest import assert_bits_equal, random_bits, run_op
from trn3emu import _native

F32, F64 = np.float32, np.float64
P, N = 128, 515  # N not a multiple of the kernel's chunk: exercises the remainder


@pytest.fixture(autouse=True)
def _restore_simd():
    yield
    _native.limit_simd(None)


def paths() -> list[str | None]:
    """None (the host's best) and every narrower SIMD path this host can run."""
    out: list[str | None] = [None]
    best = t3.simd_path()
    for p in ("avx2+fma", "portable"):
        if p != best and _native.limit_simd(p):
            out.append(p)
    _native.limit_simd(None)
    return out


def exp_ref(t: np.ndarray) -> np.ndarray:
    return np.exp(np.asarray(t, F32).astype(F64)).astype(F32)


def sigmoid64(v: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below (the documented f64 formula)."""
    e = np.exp(-np.abs(v))
    return np.where(v >= 0, 1.0, e) / (1.0 + e)


def sigmoid_ref(t: np.ndarray) -> np.ndarray:
    return sigmoid64(t.astype(F64)).astype(F32)


def silu_ref(t: np.ndarray) -> np.ndarray:
    v = t.astype(F64)
    return np.where(v == -np.inf, 0.0, v * sigmoid64(v)).astype(F32)  # silu(-inf) = its limit +0


def tanh_ref(t: np.ndarray) -> np.ndarray:
    """libm's float64 tanh rounded once (math.tanh: +-1 at +-inf, NaN stays NaN)."""
    return np.vectorize(math.tanh, otypes=[F64])(t.astype(F64)).astype(F32)


def inputs(seed: int) -> np.ndarray:
    """[P, N] fp32: dense over the finite-output range, random bit patterns, near the overflow /
    subnormal / underflow thresholds, and the specials."""
    rng = np.random.default_rng(seed)
    thresholds = np.array([88.72283, 88.7228, -87.33655, -103.27893, -103.97208, 0.0, 1.0], F32)
    near = (thresholds.view(np.int32)[:, None] + np.arange(-200, 200, dtype=np.int32)).view(F32).ravel()
    specials = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38, 88.0, 89.0, -104.0, -150.0, 100.0],
        F32,
    )
    parts = [
        rng.uniform(-104, 89, 30000).astype(F32),
        random_bits(rng, (10000,), F32),
        (rng.standard_normal(10000) * 10).astype(F32),
        near,
        specials,
    ]
    x = np.concatenate(parts)
    x = np.concatenate([x, rng.uniform(-30, 30, P * N - x.size).astype(F32)])
    return rng.permutation(x).reshape(P, N)


def assert_exp_bits(got: np.ndarray, t: np.ndarray, ref=exp_ref) -> None:
    want = ref(t)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert_bits_equal(np.where(nan, F32(0), got), np.where(nan, F32(0), want))


def run_all(x: np.ndarray, m: np.ndarray, s: np.ndarray, b: np.ndarray, dev) -> list[np.ndarray]:
    def body(p, xt, mt, st, bt, o_act, o_aff, o_red, r_red, o_a2, o_ex, r_ex):
        p.activation(dst=o_act, op="exp", data=xt)
        p.activation(dst=o_aff, op="exp", data=xt, scale=st, bias=bt)
        p.activation_reduce(dst=o_red, op="exp", data=xt, reduce_op="add", reduce_res=r_red, scale=0.5)
        p.activate2(dst=o_a2, op="exp", data=xt, imm0=st, imm1=bt, op0="multiply", op1="add")
        p.exponential(dst=o_ex, src=xt, max_value=mt, reduce_cmd="reset_reduce", reduce_res=r_ex)

    outs = [((P, N), F32)] * 3 + [((P, 1), F32)] + [((P, N), F32)] * 2 + [((P, 1), F32)]
    return run_op(dev, [x, m, s, b], outs, body)


def row_sum(v: np.ndarray) -> np.ndarray:
    """fp32 sum of each row in free-index order (the documented register order)."""
    acc = np.zeros(v.shape[0], F32)
    for j in range(v.shape[1]):
        acc = (acc + v[:, j]).astype(F32)
    return acc


@pytest.fixture(autouse=True)
def _quiet_numpy():
    with np.errstate(all="ignore"):  # the inputs hold inf and NaN on purpose
        yield


@pytest.mark.parametrize("seed", [0, 1])
def test_exp_is_libm_f64_rounded_once_on_every_simd_path(seed):
    rng = np.random.default_rng(100 + seed)
    x = inputs(seed)
    m = rng.uniform(-5, 5, (P, 1)).astype(F32)
    s = rng.uniform(-2, 2, (P, 1)).astype(F32)
    b = rng.uniform(-3, 3, (P, 1)).astype(F32)
    affine = ((x * s).astype(F32) + b).astype(F32)
    results = []
    for path in paths():
        _native.limit_simd(path)
        o_act, o_aff, o_red, r_red, o_a2, o_ex, r_ex = run_all(x, m, s, b, t3.Device())
        assert_exp_bits(o_act, x)
        assert_exp_bits(o_aff, affine)
        half = (x * F32(0.5)).astype(F32)
        assert_exp_bits(o_red, half)
        np.testing.assert_array_equal(r_red[:, 0], row_sum(exp_ref(half)))
        assert_exp_bits(o_a2, affine)
        assert_exp_bits(o_ex, (x - m).astype(F32))
        np.testing.assert_array_equal(r_ex[:, 0], row_sum(exp_ref((x - m).astype(F32))))
        results.append((o_act, o_aff, o_red, o_a2, o_ex))
    for r in results[1:]:  # NaN payloads too
        for got, first in zip(r, results[0]):
            assert_bits_equal(got, first)


def test_exp_limits_and_signed_zero():
    """exp(-inf) = +0, exp(+inf) = +inf, exp(+-0) = 1, underflow to +0, overflow to +inf."""
    x = np.tile(np.array([-np.inf, np.inf, 0.0, -0.0, -200.0, 200.0, 88.72283, 88.72284], F32), (4, 4))

    def body(p, xt, o):
        p.activation(dst=o, op="exp", data=xt)

    for path in paths():
        _native.limit_simd(path)
        (got,) = run_op(t3.Device(), [x], [((4, 32), F32)], body)
        want = np.tile(np.array([0.0, np.inf, 1.0, 1.0, 0.0, np.inf, 3.4028e38, np.inf], F32), (4, 4))
        assert_bits_equal(got[:, :6], want[:, :6])
        assert np.isfinite(got[0, 6]) and got[0, 6] > 3.4e38 and got[0, 7] == np.inf


@pytest.mark.parametrize("op,ref", [("sigmoid", sigmoid_ref), ("silu", silu_ref), ("tanh", tanh_ref)])
def test_sigmoid_silu_tanh_are_f64_formulas_rounded_once_on_every_simd_path(op, ref):
    x = inputs(2)
    tiny = np.array([1e-45, -3e-45, 2.5e-38, -1e-40, 7e-39], F32)  # silu ~ x/2: subnormal midpoints
    x[0, : tiny.size] = tiny
    # tanh's branch point 1/8 and where it reaches 1.0 (|x| ~ 9.01), densely, both signs
    near = np.array([0.125, 9.010913, 1e-3], F32).view(np.int32)[:, None] + np.arange(-500, 500, dtype=np.int32)
    near = near.view(F32).ravel()
    flat = x.reshape(-1).copy()
    flat[N : N + 2 * near.size] = np.concatenate([near, -near])
    x = flat.reshape(P, N)
    s, b = F32(0.75), F32(-0.5)

    def body(p, xt, o, o_aff, o_a2):
        p.activation(dst=o, op=op, data=xt)
        p.activation(dst=o_aff, op=op, data=xt, scale=float(s), bias=float(b))
        p.activate2(dst=o_a2, op=op, data=xt, imm0=float(s), imm1=float(b), op0="multiply", op1="add")

    affine = ((x * s).astype(F32) + b).astype(F32)
    results = []
    for path in paths():
        _native.limit_simd(path)
        got = run_op(t3.Device(), [x], [((P, N), F32)] * 3, body)
        assert_exp_bits(got[0], x + F32(0), ref)  # the default bias 0 turns -0 into +0
        assert_exp_bits(got[1], affine, ref)
        assert_exp_bits(got[2], affine, ref)
        results.append(got)
    for r in results[1:]:
        for got, first in zip(r, results[0]):
            assert_bits_equal(got, first)


def near_ties(ref64, windows: list[tuple[float, int]]) -> np.ndarray:
    """The fp32 inputs (from runs of `count` consecutive fp32 values starting at `start`) whose
    f64 reference value `ref64(v)` lies within 2^14 f64 ulps (~2^-39 relative) of an fp32
    rounding midpoint: the inputs the fast kernels cannot decide from their approximation, which
    exercise every kernel's re-evaluation and scalar fallback. Found from numpy's f64 values
    alone (an independent reference), not from the kernels."""
    found = []
    for start, count in windows:
        b = np.array([start], F32).view(np.int32)[0] + np.arange(count, dtype=np.int64)
        x = b.astype(np.uint32).view(F32)
        y = ref64(x.astype(F64))
        low = np.abs(y).view(np.uint64) & np.uint64((1 << 29) - 1)
        normal = np.abs(y) >= 2.0**-126
        found.append(x[normal & (np.abs(low.astype(np.int64) - (1 << 28)) < (1 << 14))])
    return np.concatenate(found)


def hard_inputs() -> np.ndarray:
    """Signed zeros, subnormals, the exp overflow / subnormal / underflow thresholds with their
    neighbours, every fp32 of [-104, -87] (exp's subnormal results, a third of them), NaNs with
    payloads (quiet and signalling, both signs), infinities, and near-tie inputs of each function."""
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38, 3e-39], F32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7FA00001, 0xFFA00123, 0x7F800001, 0xFFFFFFFF, 0x7FC0BEEF], np.uint32)
    thresholds = np.array([88.72283, 88.7228, -87.33655, -103.27893, -103.97208, -150.0, 100.0, 0.125, 9.010913], F32)
    near = (thresholds.view(np.int32)[:, None] + np.arange(-300, 300, dtype=np.int32)).view(F32).ravel()
    lo, hi = np.array([-87.0, -104.0], F32).view(np.int32)
    sub = np.arange(lo, hi + 1, 3, dtype=np.int32).view(F32)
    windows = [(0.5, 1 << 20), (-2.0, 1 << 20), (3.0, 1 << 20), (-20.0, 1 << 20), (60.0, 1 << 20), (-60.0, 1 << 20)]
    ties = [
        near_ties(np.exp, windows),
        near_ties(sigmoid64, windows),
        near_ties(lambda v: v * sigmoid64(v), windows),
        near_ties(np.tanh, windows[:4]),
    ]
    return np.concatenate([specials, nans.view(F32), near, -near, sub, *ties])


@pytest.mark.parametrize("op", ["exp", "sigmoid", "silu", "tanh"])
def test_hard_inputs_give_the_same_bits_on_every_simd_path(op):
    """The inputs at the edges of the fast kernels (hard_inputs) through activation, plain and
    with an affine step, on every SIMD path: equal to the f64 formula rounded once, and equal
    across paths bit for bit (NaN payloads included)."""
    flat = hard_inputs()
    ties = flat.size
    w = -(-flat.size // P)
    flat = np.concatenate([flat, np.zeros(P * w - flat.size, F32)])
    assert ties > 3 * 10**5  # the sweep of [-104, -87] alone is ~7e5 values
    x = flat.reshape(P, w)
    ref = {"exp": exp_ref, "sigmoid": sigmoid_ref, "silu": silu_ref, "tanh": tanh_ref}[op]
    s, b = F32(1.0), F32(-0.0)  # the identity affine step the kernels skip, and a real one below
    s2, b2 = F32(0.5), F32(0.25)

    def body(p, xt, o, o_aff):
        p.activation(dst=o, op=op, data=xt, scale=float(s), bias=float(b))
        p.activation(dst=o_aff, op=op, data=xt, scale=float(s2), bias=float(b2))

    results = []
    for path in paths():
        _native.limit_simd(path)
        got = run_op(t3.Device(), [x], [((P, w), F32)] * 2, body)
        assert_exp_bits(got[0], x, ref)
        assert_exp_bits(got[1], ((x * s2).astype(F32) + b2).astype(F32), ref)
        results.append(got)
    assert len(results) >= 2 or t3.simd_path() == "portable"
    for r in results[1:]:
        for got, first in zip(r, results[0]):
            assert_bits_equal(got, first)
