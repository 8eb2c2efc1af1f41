"""VectorE elementwise math and statistics: scalar_tensor_tensor, exponential, reciprocal,
bn_stats, bn_aggr.

Reference: neuroncore-v4.md §2.6. scalar_tensor_tensor and reciprocal are IEEE fp32 operations
(exact against numpy fp32); exp has no documented approximation (the emulator rounds the f64 exp
once to fp32: compared within one fp32 ulp); bn_stats / bn_aggr have no documented summation order
(compared against float64 numpy with a tight relative tolerance, and exactly on values whose
statistics are exact).
"""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, FP8_E4M3FN, Out, assert_bits_equal, param_id, run_op

F32 = np.float32
NP = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.fmax,
    "minimum": np.fmin,
}


def cast(x, dt):
    x = np.asarray(x, F32)
    if np.dtype(dt).kind in "iu":
        info = np.iinfo(dt)
        return np.clip(np.rint(x.astype(np.float64)), info.min, info.max).astype(dt)
    return x.astype(dt)


# ---------------------------------------------------------------------- scalar_tensor_tensor
@pytest.mark.parametrize(
    "op0,op1", [("subtract", "multiply"), ("divide", "add"), ("maximum", "subtract"), ("multiply", "minimum")]
)
@pytest.mark.parametrize("rev0", [False, True])
@pytest.mark.parametrize("rev1", [False, True])
@pytest.mark.parametrize("form", ["scalar", "column"])
def test_scalar_tensor_tensor(dev, rng, op0, op1, rev0, rev1, form):
    x = (rng.standard_normal((128, 2, 20)) * 3).astype(F32)
    y = rng.standard_normal((128, 40)).astype(BF16)
    k = rng.uniform(0.5, 2.0, (128, 1)).astype(F32)

    def body(p, xt, yt, kt, out):
        p.scalar_tensor_tensor(
            dst=out, data=xt, op0=op0, operand0=kt if form == "column" else 1.25, op1=op1, operand1=yt,
            reverse0=rev0, reverse1=rev1,
        )  # fmt: skip

    (got,) = run_op(dev, [x, y, k], [((128, 2, 20), F32)], body)
    kk = k[:, :, None] if form == "column" else F32(1.25)
    t = (NP[op0](kk, x) if rev0 else NP[op0](x, kk)).astype(F32)
    yy = y.astype(F32).reshape(128, 2, 20)
    want = (NP[op1](yy, t) if rev1 else NP[op1](t, yy)).astype(F32)
    assert_bits_equal(got, want)


@pytest.mark.parametrize(
    "in_dt,out_dt", [(np.int16, F32), (BF16, BF16), (F32, FP8_E4M3FN), (np.uint8, np.int32)], ids=param_id
)
def test_scalar_tensor_tensor_dtypes_partial_partitions(dev, rng, in_dt, out_dt):
    x = rng.integers(0, 50, (128, 16)).astype(in_dt)
    y = rng.standard_normal((128, 16)).astype(F32)

    def body(p, xt, yt, out):
        p.scalar_tensor_tensor(
            dst=out[96:128], data=xt[96:128], op0="multiply", operand0=0.5, op1="add", operand1=yt[96:128]
        )

    (got,) = run_op(dev, [x, y], [Out((128, 16), out_dt, fill=0)], body)
    want = np.zeros((128, 16), out_dt)
    want[96:] = cast((x[96:].astype(F32) * F32(0.5)).astype(F32) + y[96:], out_dt)
    assert_bits_equal(got, want)


def test_scalar_tensor_tensor_invalid(dev, rng):
    x = rng.standard_normal((32, 8)).astype(F32)

    def both_psum(p, xt, o):
        a, b = p.psum((32, 8), F32), p.psum((32, 8), F32)
        p.scalar_tensor_tensor(dst=o, data=a, op0="add", operand0=1.0, op1="add", operand1=b)

    with pytest.raises(t3.MemorySpaceError, match="PSUM"):
        run_op(dev, [x], [((32, 8), F32)], both_psum)
    with pytest.raises(t3.OperandError, match="arithmetic"):
        run_op(
            dev,
            [x],
            [((32, 8), F32)],
            lambda p, xt, o: p.scalar_tensor_tensor(
                dst=o, data=xt, op0="bitwise_and", operand0=1, op1="add", operand1=xt
            ),
        )
    with pytest.raises(t3.ShapeError, match="operand0"):
        run_op(
            dev,
            [x],
            [((32, 8), F32)],
            lambda p, xt, o: p.scalar_tensor_tensor(
                dst=o, data=xt, op0="add", operand0=xt[:, 0:2], op1="add", operand1=xt
            ),
        )


# -------------------------------------------------------------------------------- exponential
def exp_ref(x, m):
    """exp(x - m): the subtraction in fp32, then exp (float64) rounded to fp32."""
    d = (np.asarray(x, F32) - np.asarray(m, F32)).astype(F32)
    return np.exp(d.astype(np.float64)).astype(F32)


def assert_within_ulp(got, want, ulps=1):
    g = got.astype(F32).view(np.int32).astype(np.int64)
    w = want.astype(F32).view(np.int32).astype(np.int64)
    assert np.abs(g - w).max() <= ulps, np.abs(g - w).max()


@pytest.mark.parametrize("form", ["scalar", "column"])
def test_exponential_with_running_sum(dev, rng, form):
    x = rng.uniform(-10, 3, (128, 2, 32)).astype(F32)
    m = x.reshape(128, -1).max(axis=1, keepdims=True)

    def body(p, xt, mt, out, res):
        p.exponential(
            dst=out, src=xt, max_value=mt if form == "column" else 1.5, reduce_cmd="reset_reduce", reduce_res=res
        )

    out, res = run_op(dev, [x, m], [((128, 2, 32), F32), ((128, 1), F32)], body)
    mm = m[:, :, None] if form == "column" else F32(1.5)
    want = exp_ref(x, mm)
    assert_within_ulp(out, want)
    np.testing.assert_allclose(res[:, 0], want.reshape(128, -1).astype(np.float64).sum(axis=1), rtol=2e-6)


def test_exponential_exact_points_and_idle_default(dev):
    x = np.tile(np.array([0.0, 1.0, -1.0, -np.inf, 88.0, -104.0, 2.0, 0.5], F32), (32, 1))

    def body(p, xt, out, res):
        p.exponential(dst=out, src=xt, reduce_cmd="reset_reduce")
        p.exponential(dst=out, src=xt, max_value=2.0, reduce_res=res)  # idle: read-out only

    out, res = run_op(dev, [x], [((32, 8), F32), ((32, 1), F32)], body)
    want = exp_ref(x, 2.0)
    assert want[0, 3] == 0.0 and want[0, 6] == 1.0
    assert_within_ulp(out, want)
    first = exp_ref(x, 0.0).astype(np.float64)
    np.testing.assert_allclose(res[:, 0], first.sum(axis=1), rtol=2e-6)


@pytest.mark.parametrize(
    "src_dt,dst_dt", [(BF16, BF16), (np.int8, F32), (F32, np.float16), (np.uint32, F32)], ids=param_id
)
def test_exponential_dtypes_load_reduce(dev, rng, src_dt, dst_dt):
    x = rng.integers(0, 4, (64, 12)).astype(src_dt)

    def body(p, xt, out, res):
        p.exponential(
            dst=out[32:64],
            src=xt[32:64],
            max_value=3.0,
            reduce_cmd="load_reduce",
            reduce_init=10.0,
            reduce_res=res[32:64],
        )

    out, res = run_op(dev, [x], [Out((64, 12), dst_dt, fill=0), Out((64, 1), F32, fill=0)], body)
    e = exp_ref(x[32:64].astype(F32), 3.0)
    assert_within_ulp(out[32:64].astype(F32), e.astype(dst_dt).astype(F32))
    assert not out[:32].astype(F32).any()
    np.testing.assert_allclose(res[32:, 0], 10.0 + e.astype(np.float64).sum(axis=1), rtol=2e-6)
    assert not res[:32].any()


def test_exponential_invalid(dev, rng):
    x = rng.standard_normal((32, 8)).astype(F32)
    with pytest.raises(t3.OperandError, match="reduce_init"):
        run_op(dev, [x], [((32, 8), F32)], lambda p, xt, o: p.exponential(dst=o, src=xt, reduce_init=1.0))
    with pytest.raises(t3.DtypeError):
        run_op(dev, [x], [((32, 8), np.uint32)], lambda p, xt, o: p.exponential(dst=o, src=xt))
    with pytest.raises(t3.ShapeError, match="max_value"):
        run_op(dev, [x], [((32, 8), F32)], lambda p, xt, o: p.exponential(dst=o, src=xt, max_value=xt[0:16, 0:1]))


# --------------------------------------------------------------------------------- reciprocal
@pytest.mark.parametrize("in_dt,out_dt", [(F32, F32), (BF16, F32), (F32, BF16), (np.int16, F32)], ids=param_id)
def test_reciprocal_ieee_exact(dev, rng, in_dt, out_dt):
    x = (rng.standard_normal((128, 3, 11)) * 10).astype(F32).astype(in_dt)
    x.reshape(-1)[:4] = np.array([0, -0.0, np.inf, 1e-40], F32).astype(in_dt) if in_dt != np.int16 else [0, 1, -1, 7]

    def body(p, xt, out):
        p.reciprocal(dst=out, data=xt)

    with np.errstate(divide="ignore", over="ignore"):
        want = cast(F32(1) / x.astype(F32), out_dt)
    (got,) = run_op(dev, [x], [((128, 3, 11), out_dt)], body)
    assert_bits_equal(got, want)


def test_reciprocal_partial_partitions_strided_psum(dev, rng):
    x = rng.uniform(1, 4, (128, 20)).astype(F32)

    def body(p, xt, out):
        p.reciprocal(dst=out[32:64, ::2], data=xt[32:64, 1::2])

    (got,) = run_op(dev, [x], [Out((128, 20), F32, "psum", fill=0.0)], body)
    want = np.zeros((128, 20), F32)
    want[32:64, ::2] = F32(1) / x[32:64, 1::2]
    assert_bits_equal(got, want)


# ----------------------------------------------------------------------------- bn_stats / aggr
def stats_ref(x):
    x = x.astype(np.float64)
    out = []
    for part in (x[:, 0::2], x[:, 1::2]):
        n = part.shape[1]
        mean = part.mean(axis=1) if n else np.zeros(len(x))
        m2 = ((part - mean[:, None]) ** 2).sum(axis=1) if n else np.zeros(len(x))
        out += [np.full(len(x), n, np.float64), mean, m2]
    return np.stack(out, axis=1)


@pytest.mark.parametrize("n", [1, 2, 7, 100, 512])
def test_bn_stats(dev, rng, n):
    x = (rng.standard_normal((128, n)) * 3 + 1).astype(F32)

    def body(p, xt, out):
        p.bn_stats(dst=out, data=xt)

    (got,) = run_op(dev, [x], [((128, 6), F32)], body)
    np.testing.assert_allclose(got, stats_ref(x), rtol=1e-6, atol=1e-6)


def test_bn_stats_exact_values_bf16_partial_partitions(dev):
    x = np.tile(np.array([1, 10, 3, 20, 5, 30, 7, 40], F32), (128, 1)).astype(BF16)

    def body(p, xt, out):
        p.bn_stats(dst=out[64:96], data=xt[64:96])

    (got,) = run_op(dev, [x], [Out((128, 6), F32, fill=0.0)], body)
    want = np.zeros((128, 6), F32)
    # even: 1,3,5,7 -> mean 4, M2 = 9+1+1+9 = 20; odd: 10,20,30,40 -> mean 25, M2 = 225+25+25+225 = 500
    want[64:96] = [4, 4, 20, 4, 25, 500]
    assert_bits_equal(got, want)


def test_bn_stats_chunks_then_bn_aggr(dev, rng):
    """Rows longer than bn_stats_fmax: bn_stats per 512-chunk at offsets 6*i, then one bn_aggr."""
    x = (rng.standard_normal((128, 1300)) * 2 - 0.5).astype(F32)
    chunks = [(0, 512), (512, 1024), (1024, 1300)]

    def body(p, xt, mv):
        st = p.sbuf((128, 18), F32)
        for i, (a, b) in enumerate(chunks):
            p.bn_stats(dst=st[:, 6 * i : 6 * i + 6], data=xt[:, a:b])
        p.bn_aggr(dst=mv, data=st)

    (mv,) = run_op(dev, [x], [((128, 2), F32)], body)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(mv[:, 0], x64.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mv[:, 1], x64.var(axis=1), rtol=1e-6)


def test_bn_aggr_exact_triples(dev):
    # (count, mean, M2) triples: {2, 1.0, 2.0} and {2, 3.0, 2.0} -> mean 2, M2 = 4 + 2*1 + 2*1 = 8, var 2
    t = np.tile(np.array([2, 1, 2, 2, 3, 2, 0, 0, 0], F32), (16, 1))

    def body(p, tt, out):
        p.bn_aggr(dst=out, data=tt)

    (got,) = run_op(dev, [t], [((16, 2), BF16)], body)
    assert_bits_equal(got, np.tile(np.array([2, 2], BF16), (16, 1)))


def test_bn_stats_aggr_invalid(dev, rng):
    x = rng.standard_normal((32, 513)).astype(F32)
    with pytest.raises(t3.ShapeError, match="1..=512"):
        run_op(dev, [x], [((32, 6), F32)], lambda p, xt, o: p.bn_stats(dst=o, data=xt))
    with pytest.raises(t3.ShapeError, match="dst"):
        run_op(dev, [x[:, :10]], [((32, 5), F32)], lambda p, xt, o: p.bn_stats(dst=o, data=xt))
    with pytest.raises(t3.ShapeError, match="divisible by 3"):
        run_op(dev, [x[:, :10]], [((32, 2), F32)], lambda p, xt, o: p.bn_aggr(dst=o, data=xt))


@pytest.mark.parametrize("dt", [np.int8, np.int32, np.uint8, np.uint16], ids=param_id)
def test_hazard_fp32_to_int_is_rne_with_saturation(dev, dt):
    """nki-kernels §4.4 (0.6.0): fp32 -> int results round half to even and saturate (not numpy's
    truncation / wrap-around); here on scalar_tensor_tensor and tensor_scalar_cumulative outputs."""
    x = np.tile(np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3e9, -3e9, 300.0, -300.0, 70000.0, 2.4999998], F32), (32, 1))
    zero = np.zeros_like(x)

    def body(p, xt, zt, o1, o2):
        p.scalar_tensor_tensor(dst=o1, data=xt, op0="multiply", operand0=1.0, op1="add", operand1=zt)
        p.tensor_copy(dst=o2, src=xt)

    o1, o2 = run_op(dev, [x, zero], [((32, 12), dt), ((32, 12), dt)], body)
    info = np.iinfo(dt)
    want = np.clip(np.rint(x.astype(np.float64)), info.min, info.max).astype(dt)
    assert_bits_equal(o1, want)
    assert_bits_equal(o2, want)


def test_rank_limits_of_exponential_and_tensor_scalar_reduce(dev, rng):
    """Both take tiles of rank <= 4 (at most three free dims)."""
    x = rng.standard_normal((16, 2, 2, 2, 3)).astype(F32)
    with pytest.raises(t3.ShapeError, match="at most 3 free dims"):
        run_op(dev, [x], [((16, 24), F32)], lambda p, xt, o: p.exponential(dst=o, src=xt))
    with pytest.raises(t3.ShapeError, match="at most 3 free dims"):
        run_op(
            dev,
            [x],
            [((16, 24), F32)],
            lambda p, xt, o: p.tensor_scalar_reduce(dst=o, data=xt, op0="add", operand0=0.0, reduce_op="add"),
        )
