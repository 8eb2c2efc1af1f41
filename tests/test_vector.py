"""VectorE (and its GpSimd/Scalar variants): tensor_tensor, tensor_scalar, tensor_copy, memset, plus
partial-partition tiles and multi-dimensional / strided free access patterns.

Reference (neuroncore-v4.md §2.0/§2.2/§2.6, numerics.md §3.3/§4.5): arithmetic converts inputs to
fp32, computes in fp32 and casts the result to dst with RNE (ml_dtypes' float32 -> T casts are RNE,
numerics.md §3.3); float -> integer casts round half to even and saturate, NaN -> 0; bitwise ops work
on raw integer bits; same-dtype copies are bit-exact.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from conftest import (
    BF16,
    FP8_E4M3,
    FP8_E4M3FN,
    FP8_E5M2,
    Out,
    assert_bits_equal,
    e8m0_reference,
    e8m0_release_dependent,
    param_id,
    random_bits,
    run_op,
)

F32 = np.float32
P, N = 128, 96

NP_OPS = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.fmax,  # the emulator's max/min return the non-NaN operand (IEEE maxNum)
    "minimum": np.fmin,
}


def cast(x: np.ndarray, dtype) -> np.ndarray:
    """fp32 -> dtype the way the engines write: RNE for floats, RNE + saturation for ints, NaN -> 0."""
    x = np.asarray(x, F32)
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        r = np.clip(np.rint(x.astype(np.float64)), info.min, info.max)
        return np.where(np.isnan(r), 0, r).astype(dt)
    return x.astype(dt)


def randn(rng, shape, dtype, scale=4.0):
    return (rng.standard_normal(shape) * scale).astype(F32).astype(dtype)


# ----------------------------------------------------------------------------- tensor_tensor
@pytest.mark.parametrize("op", list(NP_OPS))
@pytest.mark.parametrize(
    "in_dt,out_dt",
    [(F32, F32), (BF16, BF16), (F32, BF16), (np.float16, F32), (BF16, np.float16), (F32, FP8_E4M3FN)],
    ids=param_id,
)
def test_tensor_tensor_arithmetic(dev, rng, op, in_dt, out_dt):
    a, b = randn(rng, (P, N), in_dt), randn(rng, (P, N), in_dt)
    if op == "divide":
        b = np.where(np.abs(b.astype(F32)) < 0.1, F32(0.5), b.astype(F32)).astype(in_dt)

    def body(p, x, y, out):
        p.tensor_tensor(dst=out, data1=x, data2=y, op=op)

    (got,) = run_op(dev, [a, b], [(a.shape, out_dt)], body)
    want = NP_OPS[op](a.astype(F32), b.astype(F32)).astype(F32)
    assert_bits_equal(got, cast(want, out_dt))


@pytest.mark.parametrize("engine", ["vector", "gpsimd"])
def test_tensor_tensor_engines_and_int_inputs(dev, rng, engine):
    # int16 + fp32 -> fp32 on either engine; ints convert to fp32 exactly below 2^24.
    a = rng.integers(-30000, 30000, (64, 40), dtype=np.int16)
    b = randn(rng, (64, 40), F32)

    def body(p, x, y, out):
        p.tensor_tensor(dst=out, data1=x, data2=y, op="multiply", engine=engine)

    (got,) = run_op(dev, [a, b], [((64, 40), F32)], body)
    assert_bits_equal(got, (a.astype(F32) * b).astype(F32))


def test_tensor_tensor_one_input_in_psum(dev, rng):
    a, b = randn(rng, (P, N), F32), randn(rng, (P, N), BF16)

    def body(p, x, y, out):
        xp = p.psum((P, N), F32)
        p.tensor_copy(dst=xp, src=x)
        p.tensor_tensor(dst=out, data1=xp, data2=y, op="subtract")

    (got,) = run_op(dev, [a, b], [((P, N), BF16)], body)
    assert_bits_equal(got, (a - b.astype(F32)).astype(F32).astype(BF16))


def test_tensor_tensor_max_min_nan_and_specials(dev):
    nan, inf = np.nan, np.inf
    a = np.array([[nan, 1.0, -inf, inf, 3.0, -2.0, 1e-45, nan]], F32)
    b = np.array([[2.0, nan, 5.0, -1.0, 3.5, -2.5, -1e-45, nan]], F32)

    def body(p, x, y, mx, mn):
        p.tensor_tensor(dst=mx, data1=x, data2=y, op="maximum")
        p.tensor_tensor(dst=mn, data1=x, data2=y, op="minimum")

    mx, mn = run_op(dev, [a, b], [(a.shape, F32), (a.shape, F32)], body)
    # maxNum/minNum: a NaN operand is ignored unless both are NaN.
    assert_bits_equal(mx, np.array([[2.0, 1.0, 5.0, inf, 3.5, -2.0, 1e-45, nan]], F32))
    assert_bits_equal(mn, np.array([[2.0, 1.0, -inf, -1.0, 3.0, -2.5, -1e-45, nan]], F32))


CMP_OPS = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "greater_equal": np.greater_equal,
    "greater": np.greater,
    "less_equal": np.less_equal,
    "less": np.less,
}


@pytest.mark.parametrize("op", list(CMP_OPS))
def test_tensor_tensor_comparisons_give_one_or_zero(dev, rng, op):
    a = rng.integers(-3, 4, (P, N)).astype(BF16)  # small integers so that ties are common
    b = rng.integers(-3, 4, (P, N)).astype(F32)
    b[0, :4] = np.nan  # NaN compares false (and not_equal true)

    def body(p, x, y, o1, o2):
        p.tensor_tensor(dst=o1, data1=x, data2=y, op=op)
        p.tensor_tensor(dst=o2, data1=x, data2=y, op=op)

    o1, o2 = run_op(dev, [a, b], [((P, N), F32), ((P, N), np.uint8)], body)
    want = CMP_OPS[op](a.astype(F32), b)
    assert_bits_equal(o1, want.astype(F32))
    assert_bits_equal(o2, want.astype(np.uint8))


def test_int32_arithmetic_gpsimd_exact_vector_through_fp32(dev, rng):
    # GpSimd does exact (wrapping) int32 arithmetic; VectorE computes in fp32, so values beyond 2^24
    # round, and the fp32 -> int32 cast rounds half to even and saturates.
    a = rng.integers(-(2**30), 2**30, (64, 32), dtype=np.int32)
    b = rng.integers(-(2**30), 2**30, (64, 32), dtype=np.int32)
    a[0, :2], b[0, :2] = 2**31 - 1, 1  # wraps on GpSimd, saturates on VectorE

    def body(p, x, y, g_add, g_max, v_add):
        p.tensor_tensor(dst=g_add, data1=x, data2=y, op="add", engine="gpsimd")
        p.tensor_tensor(dst=g_max, data1=x, data2=y, op="maximum", engine="gpsimd")
        p.tensor_tensor(dst=v_add, data1=x, data2=y, op="add", engine="vector")

    g_add, g_max, v_add = run_op(dev, [a, b], [((64, 32), np.int32)] * 3, body)
    assert_bits_equal(g_add, (a.astype(np.int64) + b).astype(np.uint64).astype(np.uint32).view(np.int32))
    assert_bits_equal(g_max, np.maximum(a, b))
    assert_bits_equal(v_add, cast(a.astype(F32) + b.astype(F32), np.int32))


@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int16, np.uint32], ids=param_id)
def test_tensor_tensor_bitwise_raw_bits(dev, rng, op, dtype):
    a, b = random_bits(rng, (P, N), dtype), random_bits(rng, (P, N), dtype)

    def body(p, x, y, out):
        p.tensor_tensor(dst=out, data1=x, data2=y, op=op)

    (got,) = run_op(dev, [a, b], [(a.shape, dtype)], body)
    assert_bits_equal(got, getattr(np, op)(a, b))


def test_tensor_tensor_bitwise_mixed_widths(dev, rng):
    # Narrow inputs are sign-extended (signed) / zero-extended (unsigned) to 32 bits; the result is
    # truncated to the dst width.
    a = random_bits(rng, (32, 64), np.int8)
    b = random_bits(rng, (32, 64), np.int32)
    c = random_bits(rng, (32, 64), np.uint16)

    def body(p, x, y, z, o1, o2):
        p.tensor_tensor(dst=o1, data1=x, data2=y, op="bitwise_xor")
        p.tensor_tensor(dst=o2, data1=y, data2=z, op="bitwise_or")

    o1, o2 = run_op(dev, [a, b, c], [((32, 64), np.int32), ((32, 64), np.uint8)], body)
    assert_bits_equal(o1, a.astype(np.int32) ^ b)
    assert_bits_equal(o2, ((b.view(np.uint32) | c.astype(np.uint32)) & 0xFF).astype(np.uint8))


# ----------------------------------------------------------------------------- tensor_scalar
SCALAR_CASES = [
    # (op0, operand0, reverse0, op1, operand1, reverse1)
    ("add", 0.1, False, None, None, False),
    ("multiply", -3.25, False, None, None, False),
    ("subtract", 1.7, True, None, None, False),  # 1.7 - x
    ("divide", 2.5, True, None, None, False),  # 2.5 / x
    ("maximum", 0.0, False, None, None, False),
    ("multiply", 0.3, False, "add", -1.1, False),
    ("subtract", 0.7, False, "divide", 3.0, True),  # 3 / (x - 0.7)
    ("add", 1e-3, True, "minimum", 2.0, False),
    ("abs", None, False, "multiply", 0.5, False),
]


@pytest.mark.parametrize("engine", ["vector", "scalar", "gpsimd"])
@pytest.mark.parametrize("case", SCALAR_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_tensor_scalar_immediates(dev, rng, case, engine):
    op0, k0, r0, op1, k1, r1 = case
    x = randn(rng, (P, N), BF16)

    def body(p, xt, out):
        p.tensor_scalar(dst=out, data=xt, op0=op0, operand0=k0, reverse0=r0, op1=op1, operand1=k1, reverse1=r1)

    (got,) = run_op(dev, [x], [(x.shape, F32)], body)
    v = x.astype(F32)
    fn0 = np.abs if op0 == "abs" else NP_OPS[op0]
    if op0 == "abs":
        t = fn0(v)
    else:
        t = fn0(F32(k0), v) if r0 else fn0(v, F32(k0))
    t = t.astype(F32)
    if op1 is not None:
        t = (NP_OPS[op1](F32(k1), t) if r1 else NP_OPS[op1](t, F32(k1))).astype(F32)
    assert_bits_equal(got, t)


def _first_on_ties(fn):
    """maxNum / minNum where equal operands (+0 and -0) give the first one, as every VectorE path
    does (numpy's fmax/fmin pick either)."""

    def f(a, b):
        a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
        return np.where(a == b, a, fn(a, b)).astype(F32)

    return f


def _scalar_reference(v, op0, k0, r0, op1, k1, r1):
    """numpy's fp32 result of `op1(op0(v, k0), k1)` (each in its `reverse` order)."""
    ops = dict(NP_OPS, maximum=_first_on_ties(np.fmax), minimum=_first_on_ties(np.fmin))
    t = np.abs(v) if op0 == "abs" else (ops[op0](F32(k0), v) if r0 else ops[op0](v, F32(k0)))
    t = np.asarray(t, F32)
    if op1 is not None:
        t = np.asarray(ops[op1](F32(k1), t) if r1 else ops[op1](t, F32(k1)), F32)
    return t


@pytest.mark.parametrize("case", SCALAR_CASES, ids=lambda c: "-".join(str(v) for v in c))
@pytest.mark.parametrize("where", ["in_place", "sbuf_to_sbuf", "psum_to_sbuf"])
def test_tensor_scalar_fp32_columns(dev, rng, case, where):
    """[P, 1] fp32 tiles (one element per partition: the one-pass column path), with special
    values, in place, out of place and across memories."""
    op0, k0, r0, op1, k1, r1 = case
    x = randn(rng, (P, 1), F32)
    x[:6, 0] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40]
    x = np.where(np.abs(x) < 0.05, F32(0.25), x) if "divide" in (op0, op1) else x

    def body(p, xt, out):
        src = xt
        if where == "psum_to_sbuf":
            src = p.psum((P, 1), F32)
            p.tensor_copy(dst=src, src=xt)
        dst = xt if where == "in_place" else out
        p.tensor_scalar(dst=dst, data=src, op0=op0, operand0=k0, reverse0=r0, op1=op1, operand1=k1, reverse1=r1)
        if where == "in_place":
            p.tensor_copy(dst=out, src=xt)

    (got,) = run_op(dev, [x], [((P, 1), F32)], body)
    with np.errstate(all="ignore"):
        want = _scalar_reference(x, op0, k0, r0, op1, k1, r1)
    assert_bits_equal(got, want)


def test_tensor_scalar_fp32_column_with_column_operands_and_partition_offsets(dev, rng):
    """[32, 1] columns at different start partitions of one tile, with (P, 1) operand tiles."""
    x = randn(rng, (P, 1), F32)
    c0 = randn(rng, (P, 1), F32)
    c1 = randn(rng, (P, 1), F32)

    def body(p, xt, k0, k1, out):
        p.tensor_scalar(
            dst=xt[0:32],
            data=xt[32:64],
            op0="multiply",
            operand0=k0[64:96],
            op1="subtract",
            operand1=k1[96:128],
            reverse1=True,
        )
        p.tensor_copy(dst=out, src=xt)

    (got,) = run_op(dev, [x, c0, c1], [((P, 1), F32)], body)
    want = x.copy()
    want[0:32] = (c1[96:128] - (x[32:64] * c0[64:96]).astype(F32)).astype(F32)
    assert_bits_equal(got, want)


@pytest.mark.parametrize("col_dt", [F32, BF16, np.int16], ids=param_id)
def test_tensor_scalar_column_operands(dev, rng, col_dt):
    x = randn(rng, (P, 3, 20), F32)
    c0 = randn(rng, (P, 1), col_dt) if col_dt != np.int16 else rng.integers(-9, 9, (P, 1), dtype=np.int16)
    c1 = randn(rng, (P, 1), F32)

    def body(p, xt, k0, k1, o1, o2):
        p.tensor_scalar(dst=o1, data=xt, op0="multiply", operand0=k0, op1="add", operand1=k1)
        p.tensor_scalar(dst=o2, data=xt, op0="subtract", operand0=k0, reverse0=True, op1="maximum", operand1=-0.5)

    o1, o2 = run_op(dev, [x, c0, c1], [(x.shape, BF16), (x.shape, F32)], body)
    k0 = c0.astype(F32)[:, :, None]
    k1 = c1.astype(F32)[:, :, None]
    assert_bits_equal(o1, ((x * k0).astype(F32) + k1).astype(F32).astype(BF16))
    assert_bits_equal(o2, np.fmax((k0 - x).astype(F32), F32(-0.5)))


@pytest.mark.parametrize(
    "dtype,op0,k0,op1,k1",
    [
        (np.int32, "bitwise_and", 0xFF0, "bitwise_or", 5),
        (np.int32, "bitwise_xor", -16, None, None),
        (np.uint8, "bitwise_and", 0x3C, "bitwise_xor", 0x81),
        (np.int16, "bitwise_or", 0x101, "bitwise_and", -2),
        (np.uint32, "left_shift", 3, "right_shift", 1),
    ],
    ids=param_id,
)
def test_tensor_scalar_bitwise(dev, rng, dtype, op0, k0, op1, k1):
    x = random_bits(rng, (P, N), dtype)

    def body(p, xt, out):
        p.tensor_scalar(dst=out, data=xt, op0=op0, operand0=k0, op1=op1, operand1=k1)

    (got,) = run_op(dev, [x], [(x.shape, dtype)], body)
    # Reference on 32-bit words: x sign/zero-extended, operands as int32 bit patterns, truncated back.
    w = x.astype(np.int64).astype(np.uint32) if np.dtype(dtype).kind == "i" else x.astype(np.uint32)
    fns = {
        "bitwise_and": np.bitwise_and,
        "bitwise_or": np.bitwise_or,
        "bitwise_xor": np.bitwise_xor,
        "left_shift": np.left_shift,
        "right_shift": np.right_shift,
    }
    r = fns[op0](w, np.uint32(k0 & 0xFFFFFFFF))
    if op1 is not None:
        r = fns[op1](r, np.uint32(k1 & 0xFFFFFFFF))
    assert_bits_equal(got, r.astype(np.uint32).astype(dtype))


@pytest.mark.parametrize("kdt", [np.int32, np.uint32, np.int8], ids=param_id)
def test_tensor_scalar_bitwise_column_operands_are_raw_bits(dev, rng, kdt):
    # (P,1) integer tiles feed bitwise ops as bit patterns (all 32 bits), not through fp32.
    x = random_bits(rng, (32, 16), np.uint32)
    k0 = random_bits(rng, (32, 1), kdt)
    k1 = random_bits(rng, (32, 1), np.uint32)

    def body(p, xt, kt0, kt1, out):
        p.tensor_scalar(dst=out, data=xt, op0="bitwise_xor", operand0=kt0, op1="bitwise_and", operand1=kt1)

    (got,) = run_op(dev, [x, k0, k1], [(x.shape, np.uint32)], body)
    k0w = k0.astype(np.int64).astype(np.uint32) if np.dtype(kdt).kind == "i" else k0
    assert_bits_equal(got, (x ^ k0w) & k1)


def test_tensor_scalar_shift_column_operand_and_reverse(dev, rng):
    x = rng.integers(0, 8, (32, 16), dtype=np.uint32)
    k = rng.integers(0, 1 << 20, (32, 1), dtype=np.int32)

    def body(p, xt, kt, out):
        p.tensor_scalar(dst=out, data=xt, op0="left_shift", operand0=kt, reverse0=True)  # k << x

    (got,) = run_op(dev, [x, k], [(x.shape, np.uint32)], body)
    assert_bits_equal(got, (k.astype(np.uint32) << x).astype(np.uint32))


# ------------------------------------------------------------------------------- tensor_copy
ALL_DTYPES = [
    F32,
    BF16,
    np.float16,
    FP8_E4M3,
    FP8_E4M3FN,
    FP8_E5M2,
    ml_dtypes.float8_e8m0fnu,
    np.int8,
    np.int16,
    np.int32,
    np.uint8,
    np.uint16,
    np.uint32,
]


@pytest.mark.parametrize("engine", ["vector", "scalar", "gpsimd"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=param_id)
def test_tensor_copy_same_dtype_bit_exact(dev, rng, dtype, engine):
    x = random_bits(rng, (P, 40), dtype)  # every code, NaN payloads included

    def body(p, xt, out):
        p.tensor_copy(dst=out, src=xt, engine=engine)

    (got,) = run_op(dev, [x], [(x.shape, dtype)], body)
    assert_bits_equal(got, x)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=param_id)
def test_tensor_copy_through_psum_and_back_bit_exact(dev, rng, dtype):
    """SBUF -> PSUM -> SBUF (the row-by-row path between the two memories), on partitions
    64..127 of a PSUM tile: every code, NaN payloads included, comes back unchanged."""
    x = random_bits(rng, (64, 24), dtype)

    def body(p, xt, out):
        ps = p.psum((128, 24), dtype)
        p.tensor_copy(dst=ps[64:128], src=xt)
        p.tensor_copy(dst=out, src=ps[64:128])

    (got,) = run_op(dev, [x], [(x.shape, dtype)], body)
    assert_bits_equal(got, x)


def _cast_inputs(rng) -> np.ndarray:
    """fp32 values that stress RNE: random bits, bf16/fp16/fp8 ties and near-ties, overflow, specials."""
    r = random_bits(rng, (2048,), np.uint32)
    ties = []
    for mbits in (7, 10, 3, 2):  # bf16, fp16, e4m3, e5m2 mantissa widths
        m = rng.integers(0, 1 << mbits, 64).astype(np.uint32) << (23 - mbits)
        e = rng.integers(100, 140, 64).astype(np.uint32) << 23
        half = np.uint32(1 << (22 - mbits))
        for d in (half, half - 1, half + 1):
            ties.append(e | m | d)
    specials = np.array(
        [0x0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC12345, 0x7F800001, 0x00000001, 0x00400000],
        np.uint32,
    )
    vals = np.array([448, 464, 465, 240, 248, 57344, 61440, 65504, 65520, 3.4e38, -1e-8, 2.0**-10, 2.0**-25], F32)
    allv = np.concatenate([r, np.concatenate(ties), specials, vals.view(np.uint32)])
    allv = np.concatenate([allv, allv ^ np.uint32(0x80000000)])
    pad = (-allv.size) % 128
    return np.concatenate([allv, np.zeros(pad, np.uint32)]).view(F32).reshape(128, -1)


@pytest.mark.parametrize("dtype", [BF16, np.float16, FP8_E4M3, FP8_E4M3FN, FP8_E5M2], ids=param_id)
def test_tensor_copy_fp32_to_narrow_float_rne(dev, rng, dtype):
    x = _cast_inputs(rng)

    def body(p, xt, out):
        p.tensor_copy(dst=out, src=xt)

    (got,) = run_op(dev, [x], [(x.shape, dtype)], body)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dtype)
    if dtype is np.float16:
        # numpy's fp16 cast keeps the top NaN payload bits; the emulator writes the canonical quiet
        # NaN (sign kept) as ml_dtypes does for bf16/fp8. NaN payloads after a cast are unspecified.
        nan = np.isnan(x)
        assert np.all(np.isnan(got[nan])) and np.array_equal(np.signbit(got[nan]), np.signbit(x[nan]))
        assert np.all((got[nan].view(np.uint16) & 0x7FFF) == 0x7E00)
        got, want = got[~nan], want[~nan]
    assert_bits_equal(got, want)


def test_tensor_copy_fp32_to_e8m0_matches_ml_dtypes(dev, rng):
    # float8_e8m0fnu (MX scale): nearest power of two, ties up, 0 / negatives / Inf / NaN to NaN
    # (numerics.md); compared with ml_dtypes where its releases agree, with the formula everywhere.
    x = np.abs(_cast_inputs(rng))
    ties = (rng.integers(1, 254, 64).astype(np.uint32) << 23) | np.uint32(0x400000)
    low = np.array([0x400000, 0x400001, 0x5FFFFF, 0x600000, 0x600001, 0x200000, 1], np.uint32)
    extra = np.concatenate([ties, low, np.full(128 - (ties.size + low.size) % 128, 0x3F800000, np.uint32)])
    x = np.concatenate([x, extra.view(F32).reshape(128, -1)], axis=1)

    def body(p, xt, out):
        p.tensor_copy(dst=out, src=xt)

    (got,) = run_op(dev, [x], [(x.shape, ml_dtypes.float8_e8m0fnu)], body)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(ml_dtypes.float8_e8m0fnu)
    u = x.view(np.uint32)
    assert_bits_equal(got.view(np.uint8), e8m0_reference(u).astype(np.uint8))
    same = ~e8m0_release_dependent(u)
    assert_bits_equal(got[same], want[same])


def tf32_rne(x: np.ndarray) -> np.ndarray:
    """fp32 -> tfloat32 (10 mantissa bits, fp32 container) with RNE (numerics.md §5.1 bit trick)."""
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000).astype(np.uint32)
    return r.view(F32)


def test_tensor_copy_and_memset_tfloat32(dev, rng):
    x = _cast_inputs(rng)
    x = np.where(np.isnan(x), F32(2.0), x)  # NaN codes after a cast are unspecified

    def body(p, xt, out, out2):
        p.tensor_copy(dst=out, src=xt)
        p.memset(dst=out2, value=0.1)

    got, got2 = run_op(dev, [x], [(x.shape, "tfloat32"), ((8, 8), "tfloat32")], body)
    assert_bits_equal(got, tf32_rne(x))
    assert_bits_equal(got2, tf32_rne(np.full((8, 8), 0.1, F32)))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32], ids=param_id)
def test_tensor_copy_fp32_to_int_rne_saturating(dev, rng, dtype):
    info = np.iinfo(dtype)
    halves = np.arange(-6, 6) + 0.5  # ties go to even
    edges = np.array([info.min, info.max, info.min - 1.0, info.max + 1.0, info.min - 0.5, info.max + 0.5])
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 3e9, -3e9, 1e30, -0.0])
    rnd = rng.standard_normal(128 * 8 - len(halves) - len(edges) - len(special)) * float(info.max) * 0.8
    x = np.concatenate([halves, edges, special, rnd]).astype(F32).reshape(128, 8)

    def body(p, xt, out):
        p.tensor_copy(dst=out, src=xt)

    (got,) = run_op(dev, [x], [(x.shape, dtype)], body)
    assert_bits_equal(got, cast(x, dtype))


@pytest.mark.parametrize(
    "src_dt,dst_dt",
    [(BF16, F32), (FP8_E4M3, BF16), (FP8_E5M2, np.float16), (np.int32, F32), (np.int32, BF16), (np.float16, np.int8)],
    ids=param_id,
)
def test_tensor_copy_other_casts(dev, rng, src_dt, dst_dt):
    # Through fp32: decode exactly (int32 -> fp32 rounds RNE above 2^24), then one RNE cast.
    if np.dtype(src_dt).kind == "i":
        x = rng.integers(-(2**31), 2**31 - 1, (P, 32), dtype=np.int32)
    else:
        x = randn(rng, (P, 32), src_dt, scale=30.0)

    def body(p, xt, out):
        p.tensor_copy(dst=out, src=xt)

    (got,) = run_op(dev, [x], [(x.shape, dst_dt)], body)
    assert_bits_equal(got, cast(x.astype(F32), dst_dt))


# ------------------------------------------------------------------------------------ memset
@pytest.mark.parametrize(
    "dtype,value",
    [
        (F32, 0.1),
        (F32, -np.inf),
        (BF16, 0.1),
        (BF16, 1e-40),
        (np.float16, 70000.0),  # overflows to +inf
        (FP8_E4M3FN, 0.3),
        (FP8_E5M2, -3.0),
        (np.int8, -128),
        (np.int16, 32767),
        (np.int32, -(2**31)),
        (np.int32, 16777216),
        (np.uint8, 255),
        (np.uint16, 40000),
        (np.uint32, 123456),
    ],
    ids=param_id,
)
@pytest.mark.parametrize("engine", ["vector", "gpsimd"])
def test_memset(dev, dtype, value, engine):
    def body(p, out):
        p.memset(dst=out, value=value, engine=engine)

    (got,) = run_op(dev, [], [((P, 33), dtype)], body)
    if np.dtype(dtype).kind in "iu":
        want = np.full((P, 33), value, dtype)  # integer values are exact
    else:
        with np.errstate(over="ignore"):
            want = np.full((P, 33), F32(value)).astype(dtype)  # the immediate is fp32, then RNE to dst
    assert_bits_equal(got, want)


def test_memset_psum_and_bool(dev):
    def body(p, o1, o2):
        p.memset(dst=o1, value=-2.5)
        p.memset(dst=o2, value=1)

    o1, o2 = run_op(dev, [], [Out((64, 100), F32, "psum"), ((16, 8), np.bool_)], body)
    assert_bits_equal(o1, np.full((64, 100), -2.5, F32))
    assert_bits_equal(o2, np.ones((16, 8), np.bool_))


# ------------------------------------------------- partial partitions, multi-dim access patterns
def test_partial_partitions_at_32(dev, rng):
    a, b = randn(rng, (128, 50), F32), randn(rng, (128, 50), F32)

    def body(p, x, y, out):
        p.tensor_tensor(dst=out[32:64], data1=x[32:64], data2=y[32:64], op="add")
        p.tensor_scalar(dst=out[96:128, 10:20], data=x[96:128, 0:10], op0="multiply", operand0=2.0)

    (got,) = run_op(dev, [a, b], [Out((128, 50), F32, fill=7.0)], body)
    want = np.full((128, 50), 7.0, F32)
    want[32:64] = a[32:64] + b[32:64]
    want[96:128, 10:20] = a[96:128, 0:10] * F32(2)
    assert_bits_equal(got, want)


def test_partial_partition_tile_allocated_at_32(dev, rng):
    x = randn(rng, (32, 24), BF16)

    def body(p, xt, out):
        t = p.sbuf((32, 24), BF16, address=(32, 4096))
        p.tensor_copy(dst=t, src=xt)
        p.tensor_scalar(dst=out, data=t, op0="add", operand0=1.0)

    (got,) = run_op(dev, [x], [((32, 24), F32)], body)
    assert_bits_equal(got, (x.astype(F32) + F32(1)).astype(F32))


def test_strided_free_access_patterns(dev, rng):
    a = randn(rng, (64, 2 * 40), F32)
    b = randn(rng, (64, 40), BF16)

    def body(p, x, y, o1, o2):
        # even columns of x times y, written to the odd columns of o1; odd columns of x -> o2
        p.tensor_tensor(dst=o1[:, 1::2], data1=x[:, ::2], data2=y, op="multiply")
        p.tensor_copy(dst=o2, src=x[:, 1::2])

    o1, o2 = run_op(dev, [a, b], [Out((64, 80), F32, fill=0.0), ((64, 40), BF16)], body)
    want = np.zeros((64, 80), F32)
    want[:, 1::2] = a[:, ::2] * b.astype(F32)
    assert_bits_equal(o1, want)
    assert_bits_equal(o2, a[:, 1::2].astype(BF16))


def test_three_and_four_dim_tiles(dev, rng):
    a = randn(rng, (32, 4, 6, 10), F32)
    b = randn(rng, (32, 4, 60), F32)  # same elements per partition, different shape

    def body(p, x, y, o1, o2):
        p.tensor_tensor(dst=o1, data1=x, data2=y, op="subtract")
        # a sub-box of a 4-D tile: [:, 1:3, ::2, 3:8] -> (32, 2, 3, 5)
        p.tensor_scalar(dst=o2, data=x[:, 1:3, ::2, 3:8], op0="multiply", operand0=-1.5, op1="add", operand1=0.25)

    o1, o2 = run_op(dev, [a, b], [((32, 4, 6, 10), F32), ((32, 2, 3, 5), BF16)], body)
    assert_bits_equal(o1, (a - b.reshape(a.shape)).astype(F32))
    sub = a[:, 1:3, ::2, 3:8]
    assert_bits_equal(o2, ((sub * F32(-1.5)).astype(F32) + F32(0.25)).astype(F32).astype(BF16))


@pytest.mark.parametrize("seed", range(6))
def test_column_instructions_match_numpy_at_random_partitions_and_offsets(seed):
    """[n, 1] fp32 tensor_scalar / tensor_tensor (the column fast path, `engines/column.rs`) at a
    random first partition, byte offset and memory (SBUF / PSUM source), also in place: bit-exact
    against numpy's fp32 arithmetic on the same values."""
    rng = np.random.default_rng(seed)
    dev = t3.Device()
    start = int(rng.choice([0, 32, 64, 96]))  # (the start-partition rule)
    n = int(rng.integers(1, {0: 129, 32: 33, 64: 65, 96: 33}[start]))
    x = rng.standard_normal((n, 1)).astype(np.float32)
    y = rng.standard_normal((n, 1)).astype(np.float32)
    k = np.float32(rng.standard_normal())
    load = t3.Program()
    mem = "psum" if seed % 2 else "sbuf"
    a_off = 2048 * int(rng.integers(0, 8)) if mem == "psum" else 4 * int(rng.integers(0, 500))  # (PSUM: a bank)
    a = getattr(load, mem)((n, 1), np.float32, address=(start, a_off))
    b = load.sbuf((n, 1), np.float32, address=(start, 4096 + 4 * int(rng.integers(0, 500))))
    if mem == "psum":  # (DMA does not write PSUM: through an SBUF tile and a copy)
        xs = load.sbuf((n, 1), np.float32, address=(start, 12288))
        load.dma_copy(dst=xs, src=dev.hbm.put(x))
        load.tensor_copy(dst=a, src=xs)
    else:
        load.dma_copy(dst=a, src=dev.hbm.put(x))
    load.dma_copy(dst=b, src=dev.hbm.put(y))
    dev.run(load)
    p = t3.Program()
    c = p.sbuf((n, 1), np.float32, address=(start, 8192 + 4 * int(rng.integers(0, 500))))
    p.tensor_scalar(dst=c, data=a, op0="multiply", operand0=float(k), op1="add", operand1=1.0, engine="vector")
    p.tensor_tensor(dst=b, data1=b, data2=a, op="subtract")  # in place on b
    dev.run(p)
    np.testing.assert_array_equal(dev.read(c).view(np.uint32), (x * k + np.float32(1.0)).view(np.uint32))
    np.testing.assert_array_equal(dev.read(b).view(np.uint32), (y - x).view(np.uint32))
