"""ScalarE instructions (reference neuroncore-v4.md §2.3, §2.5) against independent numpy references.

activation / activation_reduce / activate2 compute the pre-activation in fp32 exactly as the
reference below does (each multiply/add rounded to fp32). The function itself is unpublished
(piecewise polynomials on silicon); the emulator documents "float64 formula, one rounding to
fp32". The references here are the standard float64 formulas written independently, so
transcendental results are compared with TOL = rtol 1e-6 (about 8 fp32 ulps: a correct emulator
is within 1 ulp, any wrong formula is off by far more). copy, bypass, relu, square, abs, sign and
prelu are exact and compared bit for bit, as are register sums (their order is documented: free
index order, fp32) and every tensor_scalar / tensor_copy result.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, Out, assert_bits_equal, param_id, random_bits, run_op

F32, F64 = np.float32, np.float64
RTOL = 1e-6
ATOL = 1e-37  # only matters for results that underflow to (almost) zero

_erf = np.vectorize(math.erf, otypes=[F64])
SQ2, SQPI2 = math.sqrt(2.0), math.sqrt(2.0 / math.pi)


def sig(t):
    return 0.5 * (1.0 + np.tanh(0.5 * t))  # an independent way to write the logistic function


def softplus(t):
    return np.logaddexp(0.0, t)


def phi(t):  # standard normal pdf
    return np.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)


# name -> (float64 reference, input sampler or None for "standard normal * 1.5", exact?)
FUNCS = {
    "copy": (lambda t: t, None, True),
    "bypass": (lambda t: t, None, True),
    "square": (lambda t: t * t, None, True),
    "relu": (lambda t: np.maximum(t, 0.0), None, True),
    "abs": (np.abs, None, True),
    "sign": (np.sign, None, True),
    "sigmoid": (sig, None, False),
    "gelu": (lambda t: 0.5 * t * (1.0 + _erf(t / SQ2)), None, False),
    "gelu_dx": (lambda t: 0.5 * (1.0 + _erf(t / SQ2)) + t * phi(t), None, False),
    "gelu_apprx_tanh": (lambda t: 0.5 * t * (1.0 + np.tanh(SQPI2 * (t + 0.044715 * t**3))), None, False),
    "gelu_apprx_sigmoid": (lambda t: t * sig(1.702 * t), None, False),
    "gelu_apprx_sigmoid_dx": (lambda t: sig(1.702 * t) * (1.0 + 1.702 * t * (1.0 - sig(1.702 * t))), None, False),
    "silu": (lambda t: t * sig(t), None, False),
    "silu_dx": (lambda t: sig(t) * (1.0 + t * (1.0 - sig(t))), None, False),
    "tanh": (np.tanh, None, False),
    "softplus": (softplus, None, False),
    "mish": (lambda t: t * np.tanh(softplus(t)), None, False),
    "erf": (_erf, None, False),
    "erf_dx": (lambda t: 2.0 / math.sqrt(math.pi) * np.exp(-t * t), None, False),
    "exp": (np.exp, None, False),
    # restricted-range functions, sampled inside their documented ranges
    "log": (np.log, lambda r, s: 2.0 ** r.uniform(-60, 60, s), False),
    "sin": (np.sin, lambda r, s: r.uniform(-3.1, 3.1, s), False),
    "arctan": (np.arctan, lambda r, s: r.uniform(-1.5, 1.5, s), False),
    "sqrt": (np.sqrt, lambda r, s: 2.0 ** r.uniform(-110, 110, s), False),
    "rsqrt": (lambda t: 1.0 / np.sqrt(t), lambda r, s: 2.0 ** r.uniform(-80, 90, s), False),
    "reciprocal": (lambda t: 1.0 / t, lambda r, s: r.choice([-1, 1], s) * 2.0 ** r.uniform(-40, 40, s), False),
}


def pre(x, scale, bias):
    """fp32 data * scale + bias, each step rounded to fp32 (scalars or (P,1) columns)."""
    return ((x.astype(F32) * np.asarray(scale, F32)).astype(F32) + np.asarray(bias, F32)).astype(F32)


def check(got, want64, exact):
    if exact:
        assert_bits_equal(got, want64.astype(got.dtype))
    else:
        np.testing.assert_allclose(got.astype(F64), want64, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("form", ["imm", "col", "none"])
@pytest.mark.parametrize("fn", list(FUNCS))
def test_activation_every_function(dev, rng, fn, form):
    ref, sampler, exact = FUNCS[fn]
    P, N = 128, 64
    x = (sampler(rng, (P, N)) if sampler else rng.standard_normal((P, N)) * 1.5).astype(F32)
    if form == "none":  # defaults: scale 1.0, no bias
        scale, bias = F32(1.0), F32(0.0)
    elif form == "imm":  # restricted inputs: a bias could leave the range, so none there
        scale, bias = F32(0.5), F32(0.0) if sampler else F32(0.25)
    else:  # (P,1) tiles; positive scales keep restricted inputs in range
        scale = rng.uniform(0.5, 1.0, (P, 1)).astype(F32)
        bias = np.zeros((P, 1), F32) if sampler else (rng.standard_normal((P, 1)) * 0.5).astype(F32)

    def body(p, xt, st, bt, out):
        if form == "none":
            p.activation(dst=out, op=fn, data=xt)
        elif form == "imm":
            p.activation(dst=out, op=fn, data=xt, scale=float(scale), bias=float(bias))
        else:
            p.activation(dst=out, op=fn, data=xt, scale=st, bias=bt)

    s_in = scale if form == "col" else np.full((P, 1), scale, F32)
    b_in = bias if form == "col" else np.full((P, 1), bias, F32)
    (got,) = run_op(dev, [x, s_in, b_in], [((P, N), F32)], body)
    check(got, ref(pre(x, scale, bias).astype(F64)), exact)


@pytest.mark.parametrize(
    ("fn", "bad"),
    [
        ("log", [0.0, -1.0, 2.0**-65, 2.0**65, np.inf]),
        ("sin", [9.0, -4.0, 3.15, np.inf]),
        ("arctan", [2.0, -1.6, np.inf]),
        ("sqrt", [0.0, -4.0, 2.0**-117, 2.0**119]),
        ("rsqrt", [0.0, -1.0, 2.0**-88, 2.0**98]),
        ("reciprocal", [0.0, 2.0**-43, -(2.0**-43), 2.0**43, -np.inf]),
    ],
)
def test_activation_restricted_range_out_of_range_gives_nan(dev, fn, bad):
    """Reference §2.3: out-of-range inputs give invalid output; the emulator's invalid is NaN.
    The fp32 value of each bound itself is in range (fp32(pi) for sin, fp32(pi/2) for arctan)."""
    lo_hi = {
        "log": [2.0**-64, 2.0**64],
        "sin": [F32(math.pi), -F32(math.pi)],
        "arctan": [F32(math.pi / 2), -F32(math.pi / 2)],
        "sqrt": [2.0**-116, 2.0**118],
        "rsqrt": [2.0**-87, 2.0**97],
        "reciprocal": [2.0**-42, -(2.0**42)],
    }[fn]
    x = np.array([bad + lo_hi + [np.nan]], F32)

    def body(p, xt, out):
        p.activation(dst=out, op=fn, data=xt)

    (got,) = run_op(dev, [x], [(x.shape, F32)], body)
    nb = len(bad)
    assert np.all(np.isnan(got[0, :nb])), got
    assert np.all(np.isfinite(got[0, nb : nb + 2])), got
    assert np.isnan(got[0, -1])


def test_activation_infinite_inputs_give_limits(dev):
    x = np.array([[np.inf, -np.inf]], F32)
    limits = {
        "sigmoid": [1, 0], "gelu": [np.inf, 0], "gelu_dx": [1, 0], "gelu_apprx_tanh": [np.inf, 0],
        "gelu_apprx_sigmoid": [np.inf, 0], "gelu_apprx_sigmoid_dx": [1, 0], "silu": [np.inf, 0],
        "silu_dx": [1, 0], "tanh": [1, -1], "softplus": [np.inf, 0], "mish": [np.inf, 0], "erf": [1, -1],
        "erf_dx": [0, 0], "exp": [np.inf, 0], "sign": [1, -1], "abs": [np.inf, np.inf], "relu": [np.inf, 0],
        "square": [np.inf, np.inf],
    }  # fmt: skip

    def body(p, xt, *outs):
        for fn, o in zip(limits, outs):
            p.activation(dst=o, op=fn, data=xt)

    got = run_op(dev, [x], [((1, 2), F32)] * len(limits), body)
    for want, g in zip(limits.values(), got):
        assert_bits_equal(g, np.array([want], F32))


@pytest.mark.parametrize(
    ("in_dt", "out_dt"), [(BF16, F32), (F32, BF16), (np.int8, F32), (np.int16, BF16), (BF16, np.int32)], ids=param_id
)
def test_activation_dtype_classes(dev, rng, in_dt, out_dt):
    P, N = 64, 40
    x = (rng.standard_normal((P, N)) * 20).astype(in_dt)

    def body(p, xt, out):
        p.activation(dst=out, op="tanh", data=xt, scale=0.05)

    (got,) = run_op(dev, [x], [((P, N), out_dt)], body)
    want = np.tanh(pre(x, 0.05, 0.0).astype(F64)).astype(F32)
    if np.dtype(out_dt).kind == "i":
        want = np.clip(np.rint(want), np.iinfo(out_dt).min, np.iinfo(out_dt).max).astype(out_dt)
        assert_bits_equal(got, want)
    else:
        np.testing.assert_allclose(
            got.astype(F64), want.astype(out_dt).astype(F64), rtol=1e-2 if out_dt == BF16 else RTOL
        )


def test_hazard_fp32_to_int_rne_saturate(dev):
    """0.6 fix: fp32 -> int casts round to nearest even and saturate (not numpy truncation)."""
    x = np.array([[2.5, 3.5, -2.5, -0.5, 1.7, 300.0, -300.0, 127.5, np.nan]], F32)

    def body(p, xt, out):
        p.activation(dst=out, op="copy", data=xt)

    (got,) = run_op(dev, [x], [((1, 9), np.int8)], body)
    assert_bits_equal(got, np.array([[2, 4, -2, 0, 2, 127, -128, 127, 0]], np.int8))


def test_hazard_activation_copy_int32_is_fp32_lossy(dev):
    """nl.copy goes through the ScalarE fp32 path: int32 above 2^24 loses its low bits."""
    x = np.array([[2**24 + 1, 2**31 - 1, -(2**24) - 3, 123]], np.int32)

    def body(p, xt, out):
        p.activation(dst=out, op="copy", data=xt)

    (got,) = run_op(dev, [x], [((1, 4), np.int32)], body)
    via_f32 = x.astype(F32).astype(F64)  # RNE to fp32, then saturate back to int32
    want = np.clip(via_f32, -(2**31), 2**31 - 1).astype(np.int64).astype(np.int32)
    assert_bits_equal(got, want)
    assert got[0, 0] != x[0, 0]


def test_activation_partial_partitions_multidim_free(dev, rng):
    x = rng.standard_normal((32, 4, 6)).astype(F32)

    def build(p):
        big = p.sbuf((128, 4, 12), F32)
        h = dev.hbm.put(x)
        src = big[32:64, :, ::2]  # strided free access, partitions 32..63
        p.dma_copy(dst=src, src=h)
        out = p.sbuf((128, 4, 6), F32)
        p.memset(dst=out, value=-5.0)
        p.activation(dst=out[96:128], op="exp", data=src, scale=0.5, bias=-1.0)
        ho = dev.hbm.alloc((128, 4, 6), F32)
        p.dma_copy(dst=ho, src=out)
        return ho

    p = t3.Program()
    ho = build(p)
    dev.run(p)
    got = dev.hbm.get(ho)
    assert_bits_equal(got[:96], np.full((96, 4, 6), -5.0, F32))
    np.testing.assert_allclose(got[96:].astype(F64), np.exp(pre(x, 0.5, -1.0).astype(F64)), rtol=RTOL)


# --------------------------------------------------------------------------------- reduce registers


def row_sum(v):
    """fp32 sum of each row in free-index order (the documented register order)."""
    acc = np.zeros(v.shape[0], F32)
    for j in range(v.shape[1]):
        acc = (acc + v[:, j]).astype(F32)
    return acc


def test_activation_every_reduce_cmd(dev, rng):
    P, N = 64, 16
    xs = [rng.standard_normal((P, N)).astype(F32) for _ in range(3)]

    def body(p, a, b, c, da, db, dc, r_rr, r_idle, r_red, r_reset):
        p.activation(dst=da, op="square", data=a, reduce_cmd="reset_reduce", reduce_res=r_rr)
        p.activation(dst=db, op="square", data=b, reduce_cmd="idle", reduce_res=r_idle)  # untouched
        p.activation(dst=dc, op="square", data=c, reduce_op="add", reduce_cmd="reduce", reduce_res=r_red)
        p.activation(dst=dc, op="square", data=c, reduce_cmd="reset", reduce_res=r_reset)

    outs = [((P, N), F32)] * 3 + [((P, 1), F32)] * 4
    got = run_op(dev, xs, outs, body)
    sq = [(x * x).astype(F32) for x in xs]
    s_a = row_sum(sq[0])
    assert_bits_equal(got[3][:, 0], s_a)
    assert_bits_equal(got[4][:, 0], s_a)
    acc = s_a.copy()
    for j in range(N):
        acc = (acc + sq[2][:, j]).astype(F32)
    assert_bits_equal(got[5][:, 0], acc)
    assert_bits_equal(got[6][:, 0], np.zeros(P, F32))


def test_hazard_activation_reduce_res_aliases_dst(dev, rng):
    """0.6 fix: reduce_res may alias dst; dst is written first, then the register read-out."""
    P, N = 32, 8
    x = rng.standard_normal((P, N)).astype(F32)

    def body(p, xt, out):
        p.activation(dst=out, op="exp", data=xt, reduce_cmd="reset_reduce", reduce_res=out[:, 0:1])

    (got,) = run_op(dev, [x], [((P, N), F32)], body)
    e = np.exp(x.astype(F64))
    np.testing.assert_allclose(got[:, 1:].astype(F64), e[:, 1:], rtol=RTOL)
    np.testing.assert_allclose(got[:, 0].astype(F64), e.sum(axis=1), rtol=RTOL)


def test_hazard_activation_reduce_cmd_default_is_idle(dev, rng):
    """The activation reduce_cmd default is idle: an activation without it leaves the registers."""
    x = rng.standard_normal((16, 8)).astype(F32)

    def body(p, xt, d, r):
        p.activation(dst=d, op="copy", data=xt, reduce_cmd="reset_reduce")
        p.activation(dst=d, op="exp", data=xt)  # no reduce_cmd
        p.activation(dst=d, op="exp", data=xt, reduce_cmd="idle", reduce_res=r)

    _, r = run_op(dev, [x], [((16, 8), F32), ((16, 1), F32)], body)
    assert_bits_equal(r[:, 0], row_sum(x))


def test_activation_registers_per_lane_follow_partitions(dev, rng):
    """Registers are per lane: an instruction on partitions 32..63 leaves lanes 0..31 alone."""
    x = rng.standard_normal((64, 8)).astype(F32)

    def body(p, xt, d, r_all):
        p.activation(dst=d, op="copy", data=xt, reduce_cmd="reset_reduce")
        p.activation(dst=d[32:64], op="copy", data=xt[32:64], reduce_cmd="reduce")
        p.activation(dst=d, op="copy", data=xt, reduce_cmd="idle", reduce_res=r_all)

    _, r = run_op(dev, [x], [((64, 8), F32), ((64, 1), F32)], body)
    s = row_sum(x)
    want = s.copy()
    acc = s[32:].copy()
    for j in range(8):
        acc = (acc + x[32:, j]).astype(F32)
    want[32:] = acc
    assert_bits_equal(r[:, 0], want)


def test_activation_reduce_legacy_equals_reset_reduce(dev, rng):
    P, N = 128, 24
    x = rng.standard_normal((P, 3, 8)).astype(BF16)
    bias = rng.standard_normal((P, 1)).astype(F32)

    def body(p, xt, bt, d, r):
        p.activation(dst=d, op="relu", data=xt, reduce_cmd="reset_reduce")  # garbage in the registers
        p.activation_reduce(dst=d, op="relu", data=xt, reduce_op="add", reduce_res=r, bias=bt, scale=2.0)

    d, r = run_op(dev, [x, bias], [((P, 3, 8), F32), ((P, 1), BF16)], body)
    t = np.maximum(pre(x.reshape(P, N), 2.0, bias), F32(0))
    assert_bits_equal(d.reshape(P, N), t)
    assert_bits_equal(r[:, 0], row_sum(t).astype(BF16))


# ---------------------------------------------------------------------------------------- activate2

PAIRS = [
    ("multiply", "add"),
    ("multiply", "subtract"),
    ("multiply", "bypass"),
    ("add", "bypass"),
    ("subtract", "bypass"),
    ("bypass", "bypass"),
]
NP = {"multiply": np.multiply, "add": np.add, "subtract": np.subtract}


def stage(op, rev, v, k):
    if op == "bypass":
        return v
    return (NP[op](k, v) if rev else NP[op](v, k)).astype(F32)


@pytest.mark.parametrize("form", ["imm", "col"])
@pytest.mark.parametrize("rev", [(False, False), (True, False), (False, True), (True, True)], ids=str)
@pytest.mark.parametrize(("op0", "op1"), PAIRS)
def test_activate2_pairs_reverse_forms(dev, rng, op0, op1, rev, form):
    P, N = 64, 24
    x = rng.standard_normal((P, 2, 12)).astype(BF16)
    i0 = rng.uniform(-2, 2, (P, 1)).astype(F32)
    i1 = rng.uniform(-2, 2, (P, 1)).astype(F32)
    if form == "imm":
        i0[:], i1[:] = F32(1.5), F32(-0.625)

    def body(p, xt, t0, t1, out):
        k0 = t0 if form == "col" else 1.5
        k1 = t1 if form == "col" else -0.625
        p.activate2(dst=out, op="relu", data=xt, imm0=k0, imm1=k1, op0=op0, op1=op1, reverse0=rev[0], reverse1=rev[1])

    (got,) = run_op(dev, [x, i0, i1], [((P, 2, 12), F32)], body)
    v = stage(op0, rev[0], x.reshape(P, N).astype(F32), i0)
    v = stage(op1, rev[1], v, i1)
    assert_bits_equal(got.reshape(P, N), np.where(v > 0, v, F32(0)))


@pytest.mark.parametrize("form", ["imm", "col"])
def test_activate2_prelu_relu_param(dev, rng, form):
    P, N = 32, 16
    x = rng.standard_normal((P, N)).astype(F32)
    alpha = rng.uniform(0.01, 0.3, (P, 1)).astype(F32)
    if form == "imm":
        alpha[:] = F32(0.125)

    def body(p, xt, at, out):
        rp = at if form == "col" else 0.125
        p.activate2(dst=out, op="prelu", data=xt, imm0=2.0, imm1=0.5, op0="multiply", op1="subtract", relu_param=rp)

    (got,) = run_op(dev, [x, alpha], [((P, N), F32)], body)
    v = ((x * F32(2.0)).astype(F32) - F32(0.5)).astype(F32)
    assert_bits_equal(got, np.where(v > 0, v, (v * alpha).astype(F32)))


REDUCE = {
    "add": (F32(0), lambda a, b: (a + b).astype(F32)),
    "maximum": (F32(-np.inf), np.maximum),
    "minimum": (F32(np.inf), np.minimum),
    "abs_max": (F32(0), lambda a, b: np.where(np.abs(a) > np.abs(b), a, b)),
    "abs_min": (F32(np.inf), lambda a, b: np.where(np.abs(a) < np.abs(b), a, b)),
}


@pytest.mark.parametrize("rop", list(REDUCE))
def test_activate2_reduce_ops_reset_reduce_then_reduce(dev, rng, rop):
    P, N = 128, 20
    a = rng.standard_normal((P, N)).astype(F32)
    b = rng.standard_normal((P, N)).astype(F32)
    ident, fn = REDUCE[rop]

    def body(p, at, bt, da, db, r1, r2):
        p.activate2(dst=da, op="copy", data=at, imm0=0.0, imm1=0.0, op0="bypass", op1="bypass",
                    reduce_op=rop, reduce_cmd="reset_reduce", reduce_res=r1)  # fmt: skip
        p.activate2(dst=db, op="copy", data=bt, imm0=-1.0, imm1=0.0, op0="multiply", op1="bypass",
                    reduce_op=rop, reduce_cmd="reduce", reduce_res=r2)  # fmt: skip

    _, _, r1, r2 = run_op(dev, [a, b], [((P, N), F32)] * 2 + [((P, 1), F32)] * 2, body)
    acc = np.full(P, ident, F32)
    for j in range(N):
        acc = fn(acc, a[:, j]).astype(F32)
    assert_bits_equal(r1[:, 0], acc)
    nb = (-b).astype(F32)
    for j in range(N):
        acc = fn(acc, nb[:, j]).astype(F32)
    assert_bits_equal(r2[:, 0], acc)


def test_activate2_reset_loads_identity_and_registers_are_shared_with_activation(dev, rng):
    P, N = 32, 8
    x = -np.abs(rng.standard_normal((P, N))).astype(F32) - 1  # all negative

    def body(p, xt, d, r_max, r_sum):
        p.activate2(dst=d, op="copy", data=xt, imm0=0.0, imm1=0.0, op0="bypass", op1="bypass",
                    reduce_op="maximum", reduce_cmd="reset")  # fmt: skip
        p.activate2(dst=d, op="copy", data=xt, imm0=0.0, imm1=0.0, op0="bypass", op1="bypass",
                    reduce_op="maximum", reduce_cmd="reduce", reduce_res=r_max)  # fmt: skip
        # activation's add continues from the same registers
        p.activation(dst=d, op="copy", data=xt, reduce_cmd="reduce", reduce_res=r_sum)

    _, r_max, r_sum = run_op(dev, [x], [((P, N), F32), ((P, 1), F32), ((P, 1), F32)], body)
    m = x.max(axis=1)
    assert_bits_equal(r_max[:, 0], m)  # -inf identity: the maximum of all-negative rows
    acc = m.copy()
    for j in range(N):
        acc = (acc + x[:, j]).astype(F32)
    assert_bits_equal(r_sum[:, 0], acc)


def test_activate2_invalid(dev):
    p = t3.Program()
    a = p.sbuf((32, 8), F32)
    kw = dict(dst=a, op="copy", data=a, imm0=1.0, imm1=1.0)
    with pytest.raises(t3.OperandError, match=r"\(add, add\)"):
        p.activate2(**kw, op0="add", op1="add")
    with pytest.raises(t3.OperandError, match=r"\(bypass, add\)"):
        p.activate2(**kw, op0="bypass", op1="add")
    with pytest.raises(t3.OperandError, match="reduce_op must be"):
        p.activate2(**kw, op0="bypass", op1="bypass", reduce_op="multiply", reduce_cmd="reset_reduce")
    with pytest.raises(t3.OperandError, match="needs a reduce_op"):
        p.activate2(**kw, op0="bypass", op1="bypass", reduce_cmd="reduce")
    with pytest.raises(t3.OperandError, match="load_reduce"):
        p.activate2(**kw, op0="bypass", op1="bypass", reduce_op="add", reduce_cmd="load_reduce")
    with pytest.raises(t3.DtypeError, match="same dtype"):
        p.activate2(dst=a, op="copy", data=a, imm0=p.sbuf((32, 1), F32), imm1=p.sbuf((32, 1), BF16),
                    op0="multiply", op1="add")  # fmt: skip
    with pytest.raises(t3.ShapeError, match="relu_param"):
        p.activate2(**kw, op0="bypass", op1="bypass", relu_param=p.sbuf((32, 2), F32))


# ---------------------------------------------------------------------------------- activation: invalid


def test_activation_invalid(dev):
    p = t3.Program()
    a = p.sbuf((32, 8), F32)
    with pytest.raises(t3.OperandError, match="add only"):
        p.activation(dst=a, op="exp", data=a, reduce_op="maximum", reduce_cmd="reset_reduce")
    with pytest.raises(t3.OperandError, match="add only"):
        p.activation_reduce(dst=a, op="exp", data=a, reduce_op="maximum", reduce_res=p.sbuf((32, 1), F32))
    with pytest.raises(t3.OperandError, match="load_reduce"):
        p.activation(dst=a, op="exp", data=a, reduce_cmd="load_reduce")
    with pytest.raises(t3.OperandError, match="relu_param"):
        p.activation(dst=a, op="prelu", data=a)
    with pytest.raises(t3.DtypeError, match="tfloat32"):
        p.activation(dst=a, op="exp", data=a, bias=p.sbuf((32, 1), "tfloat32"))
    with pytest.raises(t3.ShapeError, match="reduce_res"):
        p.activation(dst=a, op="exp", data=a, reduce_res=p.sbuf((32, 2), F32))
    with pytest.raises(t3.ShapeError, match="scale"):
        p.activation(dst=a, op="exp", data=a, scale=p.sbuf((16, 1), F32))
    with pytest.raises(t3.ShapeError):
        p.activation(dst=p.sbuf((32, 9), F32), op="exp", data=a)
    with pytest.raises(t3.OperandError, match="engine"):
        p._emit("activation", "vector", None, (), (), (a, "exp", a, None, None, None, None, None))
    with pytest.raises(t3.DtypeError, match="float8_e4m3fn_x4"):
        p.activation(dst=p.sbuf((32, 8), "float8_e4m3fn_x4"), op="exp", data=a)


# -------------------------------------------------------------------- ScalarE tensor_scalar / copy


@pytest.mark.parametrize("rev", [(False, False), (True, True)], ids=str)
@pytest.mark.parametrize("ops", [("multiply", "add"), ("multiply", None), ("add", None), ("subtract", "maximum")])
def test_scalar_engine_tensor_scalar(dev, rng, ops, rev):
    P = 64
    x = rng.standard_normal((P, 2, 16)).astype(BF16)
    c0 = rng.standard_normal((P, 1)).astype(F32)

    def body(p, xt, ct, out):
        p.tensor_scalar(dst=out, data=xt, op0=ops[0], operand0=ct, reverse0=rev[0], op1=ops[1],
                        operand1=None if ops[1] is None else 0.375, reverse1=rev[1], engine="scalar")  # fmt: skip

    (got,) = run_op(dev, [x, c0], [((P, 2, 16), F32)], body)
    f = {"multiply": np.multiply, "add": np.add, "subtract": np.subtract, "maximum": np.maximum}
    xv = x.astype(F32)
    k0 = c0[:, :, None]
    t = (f[ops[0]](k0, xv) if rev[0] else f[ops[0]](xv, k0)).astype(F32)
    if ops[1]:
        k1 = F32(0.375)
        t = (f[ops[1]](k1, t) if rev[1] else f[ops[1]](t, k1)).astype(F32)
    assert_bits_equal(got, t)


def test_scalar_engine_tensor_scalar_psum_and_rsqrt(dev, rng):
    P, N = 32, 16
    x = rng.uniform(0.5, 8.0, (P, N)).astype(F32)

    def body(p, xt, out):
        ps = p.psum((P, N), F32)
        p.tensor_scalar(dst=ps, data=xt, op0="rsqrt", engine="scalar")
        p.tensor_scalar(dst=out, data=ps, op0="multiply", operand0=2.0, engine="scalar")

    (got,) = run_op(dev, [x], [((P, N), F32)], body)
    r = (1.0 / np.sqrt(x.astype(F64))).astype(F32)
    assert_bits_equal(got, (r * F32(2.0)).astype(F32))


@pytest.mark.parametrize("dt", [F32, BF16, np.int32, np.uint8], ids=param_id)
def test_scalar_engine_tensor_copy_same_dtype_bit_exact_psum(dev, rng, dt):
    P, N = 48, 24
    x = random_bits(rng, (P, N), dt)

    def body(p, xt, out):
        ps = p.psum((P, N), dt)
        p.tensor_copy(dst=ps, src=xt, engine="scalar")
        p.tensor_copy(dst=out, src=ps, engine="scalar")

    (got,) = run_op(dev, [x], [Out((P, N), dt)], body)
    assert_bits_equal(got, x)


def test_scalar_engine_tensor_copy_converts_through_fp32(dev, rng):
    x = (rng.standard_normal((16, 32)) * 1000).astype(F32)

    def body(p, xt, o1, o2):
        p.tensor_copy(dst=o1, src=xt, engine="scalar")
        p.tensor_copy(dst=o2, src=xt, engine="scalar")

    b, i = run_op(dev, [x], [((16, 32), BF16), ((16, 32), np.int16)], body)
    assert_bits_equal(b, x.astype(BF16))
    assert_bits_equal(i, np.clip(np.rint(x), -32768, 32767).astype(np.int16))


def test_scalar_engine_tensor_scalar_bitwise_refused():
    p = t3.Program()
    a = p.sbuf((16, 4), np.int32)
    with pytest.raises(t3.OperandError, match="VectorE"):
        p.tensor_scalar(dst=a, data=a, op0="bitwise_and", operand0=3.0, engine="scalar")


def test_activation_on_gpsimd_same_math_no_registers(dev, rng):
    """NKI 0.7: activation(engine=gpsimd) on v4 - same function, SBUF only, no accumulator."""
    x = rng.standard_normal((32, 16)).astype(F32)

    def body(p, xt, out):
        p.activation(dst=out, op="silu", data=xt, scale=0.5, bias=0.25, engine="gpsimd")

    (got,) = run_op(dev, [x], [((32, 16), F32)], body)
    t = pre(x, 0.5, 0.25).astype(F64)
    np.testing.assert_allclose(got.astype(F64), FUNCS["silu"][0](t), rtol=RTOL, atol=ATOL)
    p = t3.Program()
    a = p.sbuf((32, 16), F32)
    with pytest.raises(t3.OperandError, match="only on ScalarE"):
        p.activation(dst=a, op="exp", data=a, reduce_cmd="reset_reduce", engine="gpsimd")
    with pytest.raises(t3.MemorySpaceError):
        p.activation(dst=p.psum((32, 16), F32), op="exp", data=a, engine="gpsimd")


@pytest.mark.parametrize(("in_dt", "out_dt"), [(np.int16, F32), (F32, BF16), (BF16, np.int8)], ids=param_id)
def test_activate2_dtype_classes_partial_partitions(dev, rng, in_dt, out_dt):
    """activate2 on partitions 64..95 with a 3-D free pattern, integer and narrow float dtypes."""
    x = (rng.standard_normal((32, 2, 5)) * 30).astype(in_dt)
    i0 = rng.uniform(-1, 1, (32, 1)).astype(BF16)

    def build(p):
        big = p.sbuf((128, 2, 5), in_dt)
        src = big[64:96]
        p.dma_copy(dst=src, src=dev.hbm.put(x))
        col = p.sbuf((128, 1), BF16)[64:96]
        p.dma_copy(dst=col, src=dev.hbm.put(i0))
        out = p.sbuf((128, 2, 5), out_dt)[64:96]
        r = p.sbuf((128, 1), F32)[64:96]
        p.activate2(dst=out, op="abs", data=src, imm0=col, imm1=3.0, op0="multiply", op1="subtract",
                    reduce_op="abs_max", reduce_cmd="reset_reduce", reduce_res=r)  # fmt: skip
        ho, hr = dev.hbm.alloc((32, 2, 5), out_dt), dev.hbm.alloc((32, 1), F32)
        p.dma_copy(dst=ho, src=out)
        p.dma_copy(dst=hr, src=r)
        return ho, hr

    p = t3.Program()
    ho, hr = build(p)
    dev.run(p)
    v = np.abs((((x.astype(F32) * i0.astype(F32)[:, :, None]).astype(F32)) - F32(3.0)).astype(F32))
    got = dev.hbm.get(ho)
    if np.dtype(out_dt).kind == "i":
        assert_bits_equal(got, np.clip(np.rint(v), -128, 127).astype(out_dt))
    else:
        assert_bits_equal(got, v.astype(out_dt))
    assert_bits_equal(dev.hbm.get(hr)[:, 0], v.reshape(32, 10).max(axis=1))  # abs values: abs_max = max
