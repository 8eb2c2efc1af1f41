"""ScalarE activation (with scale, bias and the reduce registers), GpSimd iota, and dma_copy.

Activation reference (neuroncore-v4.md §2.3/§2.5): out = f(data * scale + bias) in fp32. The
pre-activation is computed in fp32 (multiply, then add, each rounded RNE) exactly as here; the
function itself is evaluated in float64 by the reference. Hardware uses unpublished piecewise
polynomials, and the emulator documents "f64 evaluation, one rounding to fp32", so transcendental
results are compared with rtol = 1e-6 (about 8 fp32 ulps; a correct emulator is within 1 ulp, any
wrong formula is off by far more). copy, relu and square are exact and compared bit for bit.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, FP8_E4M3FN, Out, assert_bits_equal, param_id, random_bits, run_op

F32, F64 = np.float32, np.float64
RTOL = 1e-6

_erf = np.frompyfunc(math.erf, 1, 1)


def _sigmoid(t):
    return 1.0 / (1.0 + np.exp(-t))


ACT_REF = {
    "copy": lambda t: t,
    "relu": lambda t: np.maximum(t, 0.0),
    "square": lambda t: t * t,
    "exp": np.exp,
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "gelu": lambda t: 0.5 * t * (1.0 + _erf(t / math.sqrt(2.0)).astype(F64)),
    "silu": lambda t: t * _sigmoid(t),
    "rsqrt": lambda t: 1.0 / np.sqrt(t),
}
EXACT = {"copy", "relu", "square"}


def pre_activation(x, scale, bias):
    """fp32 data * scale + bias, each step rounded to fp32 (scale/bias scalars or (P,1) columns)."""
    return ((x.astype(F32) * np.asarray(scale, F32)).astype(F32) + np.asarray(bias, F32)).astype(F32)


@pytest.mark.parametrize("variant", ["scale_imm-bias_col", "scale_col-bias_imm", "scale_col-bias_col"])
@pytest.mark.parametrize("fn", list(ACT_REF))
def test_activation_functions(dev, rng, fn, variant):
    P, N = 128, 64
    x = (rng.standard_normal((P, N)) * 1.5).astype(BF16)
    if fn == "rsqrt":
        x = (np.abs(x.astype(F32)) + 0.05).astype(BF16)
    scale_col = rng.uniform(0.5, 1.5, (P, 1)).astype(BF16)  # any dtype: bf16 here
    bias_col = (rng.standard_normal((P, 1)) * 0.5).astype(F32)
    if fn == "rsqrt":
        bias_col = np.abs(bias_col)
    scale_imm, bias_imm = 0.75, 0.125

    s_is_col, b_is_col = variant.startswith("scale_col"), variant.endswith("bias_col")

    def body(p, xt, st, bt, out):
        p.activation(dst=out, op=fn, data=xt, scale=st if s_is_col else scale_imm, bias=bt if b_is_col else bias_imm)

    (got,) = run_op(dev, [x, scale_col, bias_col], [((P, N), F32)], body)
    t = pre_activation(
        x, scale_col.astype(F32) if s_is_col else F32(scale_imm), bias_col if b_is_col else F32(bias_imm)
    )
    want = ACT_REF[fn](t.astype(F64)).astype(F64)
    if fn in EXACT:
        assert_bits_equal(got, want.astype(F32))
    else:
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=0)


def test_activation_no_bias_default_scale_bf16_out(dev, rng):
    x = (rng.standard_normal((64, 40)) * 3).astype(F32)

    def body(p, xt, out):
        p.activation(dst=out, op="relu", data=xt)

    (got,) = run_op(dev, [x], [((64, 40), BF16)], body)
    assert_bits_equal(got, np.maximum(x, F32(0)).astype(BF16))


def test_activation_reduce_registers(dev, rng):
    P, N = 128, 50
    x1 = rng.standard_normal((P, N)).astype(F32)
    x2 = rng.standard_normal((P, N)).astype(F32)

    def body(p, a, b, o1, o2, r1, r2, r3, r4):
        p.activation(dst=o1, op="exp", data=a, reduce_op="add", reduce_cmd="reset_reduce", reduce_res=r1)
        p.activation(dst=o2, op="tanh", data=b, scale=2.0, reduce_op="add", reduce_cmd="reduce", reduce_res=r2)
        p.activation(dst=o2, op="tanh", data=b, scale=2.0, reduce_cmd="idle", reduce_res=r3)
        p.activation(dst=o2, op="tanh", data=b, scale=2.0, reduce_cmd="reset", reduce_res=r4)

    col = ((P, 1), F32)
    o1, o2, r1, r2, r3, r4 = run_op(dev, [x1, x2], [((P, N), F32), ((P, N), F32), col, col, col, col], body)
    e = np.exp(x1.astype(F64))
    th = np.tanh((x2 * F32(2)).astype(F64))
    np.testing.assert_allclose(o1, e, rtol=RTOL)
    np.testing.assert_allclose(o2, th, rtol=RTOL)
    # fp32 sums in an unspecified order: compare with the float64 sum, tolerance scaled by sum |v|.
    s1 = e.sum(axis=1, keepdims=True)
    s12 = s1 + th.sum(axis=1, keepdims=True)
    mag = np.abs(e).sum(axis=1, keepdims=True) + np.abs(th).sum(axis=1, keepdims=True)
    assert np.all(np.abs(r1 - s1) <= 1e-6 * mag)
    assert np.all(np.abs(r2 - s12) <= 1e-6 * mag)
    assert_bits_equal(r3, r2)  # idle leaves the registers alone
    assert_bits_equal(r4, np.zeros((P, 1), F32))  # reset clears them


def test_activation_partial_partitions_with_reduce(dev, rng):
    x = rng.standard_normal((128, 16)).astype(F32)
    bias = rng.standard_normal((128, 1)).astype(F32)

    def body(p, xt, bt, out, red):
        p.activation(
            dst=out[32:64],
            op="sigmoid",
            data=xt[32:64],
            bias=bt[32:64],
            reduce_op="add",
            reduce_cmd="reset_reduce",
            reduce_res=red[32:64],
        )

    out, red = run_op(dev, [x, bias], [Out((128, 16), F32, fill=-1.0), Out((128, 1), F32, fill=-1.0)], body)
    want = _sigmoid((x[32:64] + bias[32:64]).astype(F32).astype(F64))
    np.testing.assert_allclose(out[32:64], want, rtol=RTOL)
    assert np.all(out[:32] == -1) and np.all(out[64:] == -1) and np.all(red[:32] == -1) and np.all(red[64:] == -1)
    np.testing.assert_allclose(red[32:64], want.sum(axis=1, keepdims=True), rtol=1e-6)


# ---------------------------------------------------------------------------------------- iota
@pytest.mark.parametrize(
    "pattern,offset,cm,shape",
    [
        ([[1, 64]], 0, 0, (128, 64)),
        ([[64, 4], [1, 16]], 5, 1000, (100, 4, 16)),
        ([[-3, 5], [7, 3], [1, 2]], -11, -64, (32, 30)),
        ([[1, 20]], 2**31 - 10, 0, (2, 20)),  # wraps around in int32
    ],
    ids=param_id,
)
def test_iota_int32(dev, pattern, offset, cm, shape):
    def body(p, out):
        p.iota(dst=out, pattern=pattern, offset=offset, channel_multiplier=cm)

    (got,) = run_op(dev, [], [(shape, np.int32)], body)
    assert_bits_equal(got, _iota_ref(pattern, offset, cm, shape[0]).reshape(shape).astype(np.int32))


def _iota_ref(pattern, offset, cm, parts):
    v = np.zeros(1, np.int64)
    for step, num in pattern:
        v = (v[:, None] + step * np.arange(num, dtype=np.int64)[None, :]).reshape(-1)
    full = offset + cm * np.arange(parts, dtype=np.int64)[:, None] + v[None, :]
    return ((full + 2**31) % 2**32 - 2**31).astype(np.int64)  # int32 wrap-around


def test_iota_float32_rounds_from_int(dev):
    pattern, offset, cm = [[1, 8], [3, 4]], 2**24 - 7, 3
    shape = (64, 32)

    def body(p, o1, o2):
        p.iota(dst=o1, pattern=pattern, offset=offset, channel_multiplier=cm)
        p.iota(dst=o2, pattern=[[1, 32]], offset=-16, channel_multiplier=-1)

    o1, o2 = run_op(dev, [], [(shape, F32), (shape, F32)], body)
    ref = _iota_ref(pattern, offset, cm, 64)
    assert np.any(ref > 2**24)  # values above 2^24 need rounding (int -> fp32 is RNE)
    assert_bits_equal(o1, ref.astype(F32))
    assert_bits_equal(o2, _iota_ref([[1, 32]], -16, -1, 64).astype(F32))


def _round_int(v: int, p: int) -> int:
    """v rounded to p significant bits, ties to even (exact integer arithmetic)."""
    a = abs(v)
    drop = a.bit_length() - p
    if drop <= 0:
        return v
    q, r = divmod(a, 1 << drop)
    half = 1 << (drop - 1)
    q += r > half or (r == half and q % 2 == 1)
    return (q << drop) * (1 if v >= 0 else -1)


def test_iota_bf16_rounds_once_from_the_integer(dev):
    """Integers above 2^24 round straight to bf16 (8 significant bits); through fp32 first,
    2^24 + 2^16 + 1 would land on a bf16 tie and round down."""
    import ml_dtypes

    pattern, offset, cm = [[1, 64]], (1 << 24) + (1 << 16) - 31, 4093
    shape = (128, 64)

    def body(p, out):
        p.iota(dst=out, pattern=pattern, offset=offset, channel_multiplier=cm)

    (got,) = run_op(dev, [], [(shape, ml_dtypes.bfloat16)], body)
    ref = _iota_ref(pattern, offset, cm, 128)
    assert (1 << 24) + (1 << 16) + 1 in ref
    want = np.array([_round_int(int(v), 8) for v in ref.reshape(-1)], np.float64).reshape(shape)
    assert_bits_equal(got, want.astype(np.float32).astype(ml_dtypes.bfloat16))  # exact: representable


# ------------------------------------------------------------------------------------ dma_copy
ROUND_TRIP = [n for n in t3.dtypes.NUMPY if n not in ("float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4")]


@pytest.mark.parametrize("name", ROUND_TRIP + ["float8_e4m3fn_x4", "float4_e2m1fn_x4"])
def test_dma_round_trip_bit_exact(dev, rng, name):
    carrier = t3.numpy_dtype(name)
    if name == "bool":
        x = rng.integers(0, 2, (128, 40)).astype(np.bool_)
    else:
        x = random_bits(rng, (128, 40), carrier)  # every code, NaN payloads included
    h = dev.hbm.put(x, dtype=name)
    out = dev.hbm.alloc(x.shape, name)
    p = t3.Program()
    t = p.sbuf(x.shape, name)
    p.dma_copy(dst=t, src=h)
    p.dma_copy(dst=out, src=t)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), x)


@pytest.mark.parametrize(
    "src_dt,dst_dt",
    [(F32, BF16), (F32, np.float16), (F32, FP8_E4M3FN), (BF16, F32), (F32, np.int8), (np.int16, F32)],
    ids=param_id,
)
def test_dma_cast_rne(dev, rng, src_dt, dst_dt):
    if np.dtype(src_dt).kind == "i":
        x = rng.integers(-(2**15), 2**15, (128, 64)).astype(src_dt)
    else:
        x = random_bits(rng, (128, 64), np.uint32).view(F32)
        x = np.where(np.isnan(x), F32(1.0), x)  # NaN payloads after a cast are unspecified
        x[:, :16] = (rng.standard_normal((128, 16)) * 100).astype(F32)  # in-range values for narrow dsts
        x = x.astype(src_dt)
    h = dev.hbm.put(x)
    out = dev.hbm.alloc(x.shape, dst_dt)
    p = t3.Program()
    t = p.sbuf(x.shape, dst_dt)
    p.dma_copy(dst=t, src=h)  # the cast happens here (src -> fp32 -> dst, RNE)
    p.dma_copy(dst=out, src=t)
    dev.run(p)
    x32 = x.astype(F32)
    if np.dtype(dst_dt).kind == "i":
        info = np.iinfo(dst_dt)
        want = np.clip(np.rint(x32.astype(F64)), info.min, info.max).astype(dst_dt)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            want = x32.astype(dst_dt)
    assert_bits_equal(dev.hbm.get(out), want)


def test_dma_strided_hbm_views(dev, rng):
    X = rng.standard_normal((64, 90)).astype(F32)
    Y = rng.standard_normal((4, 10, 12)).astype(BF16)
    hx, hy = dev.hbm.put(X), dev.hbm.put(Y)
    o1 = dev.hbm.alloc((32, 30), F32)
    o2 = dev.hbm.alloc((64, 90), F32)
    o3 = dev.hbm.alloc((10, 4, 6), BF16)
    p = t3.Program()
    a = p.sbuf((32, 30), F32)
    p.dma_copy(dst=a, src=hx[1::2, ::3])  # every other row, every third column
    p.dma_copy(dst=o1, src=a)
    b = p.sbuf((64, 45), F32)
    p.dma_copy(dst=b, src=hx[:, ::-2])  # reversed columns
    p.dma_copy(dst=o2[:, 1::2], src=b)  # strided destination; even columns stay zero
    c = p.sbuf((10, 4, 6), BF16)
    p.dma_copy(dst=c, src=hy.reshape(4, 10, 12)[:, :, ::2])  # 3-D: 24 elements per partition, row-major
    p.dma_copy(dst=o3, src=c)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(o1), X[1::2, ::3])
    want2 = np.zeros((64, 90), F32)
    want2[:, 1::2] = X[:, ::-2]
    assert_bits_equal(dev.hbm.get(o2), want2)
    assert_bits_equal(dev.hbm.get(o3), np.ascontiguousarray(Y[:, :, ::2]).reshape(10, 4, 6))


def test_dma_flat_hbm_to_tile_row_major(dev, rng):
    v = rng.integers(-100, 100, 32 * 128).astype(np.int16)
    hv = dev.hbm.put(v)
    out = dev.hbm.alloc((32 * 128,), np.int16)
    p = t3.Program()
    t = p.sbuf((32, 128), np.int16)
    p.dma_copy(dst=t, src=hv)
    q = p.sbuf((32, 128), np.int16)
    p.tensor_scalar(dst=q, data=t, op0="add", operand0=1.0)
    p.dma_copy(dst=out, src=q)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), v + np.int16(1))


def test_dma_hbm_to_hbm(dev, rng):
    X = rng.integers(0, 1000, (16, 30)).astype(np.uint16)
    h = dev.hbm.put(X)
    out = dev.hbm.alloc((30, 8), np.uint16)
    p = t3.Program()
    p.dma_copy(dst=out, src=h[::2, :])  # 240 elements in row-major order into a (30, 8) tensor
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), X[::2].reshape(30, 8))


def test_dma_sbuf_to_sbuf(dev, rng):
    X = random_bits(rng, (64, 24), np.uint16).view(BF16)

    def body(p, x, out, out2):
        p.dma_copy(dst=out[64:128], src=x)  # moves partitions 0..63 to 64..127
        p.dma_copy(dst=out2[:, ::2], src=x[:, 12:])  # strided within partitions
        p.dma_copy(dst=out2[:, 1::2], src=x[:, :12])

    out, out2 = run_op(dev, [X], [Out((128, 24), BF16, fill=0.0), ((64, 24), BF16)], body)
    want = np.zeros((128, 24), BF16)
    want[64:] = X
    assert_bits_equal(out, want)
    want2 = np.empty((64, 24), BF16)
    want2[:, ::2], want2[:, 1::2] = X[:, 12:], X[:, :12]
    assert_bits_equal(out2, want2)


def test_hbm_far_address_is_sparse(dev, rng):
    X = rng.standard_normal((128, 8192)).astype(F32)  # 4 MiB
    h = dev.hbm.put(X, address=100 << 30)
    out = dev.hbm.alloc(X.shape, F32, address=(100 << 30) + (64 << 20))
    p = t3.Program()
    t = p.sbuf(X.shape, F32)
    p.dma_copy(dst=t, src=h)
    p.dma_copy(dst=out, src=t)
    dev.run(p)
    assert h.address == 100 << 30
    assert_bits_equal(dev.hbm.get(h), X)
    assert_bits_equal(dev.hbm.get(out), X)
    assert dev.hbm.resident_bytes < 64 << 20


def test_dma_packed_dtype_cast_refused(dev):
    h = dev.hbm.put(np.zeros((4, 4), np.uint32), dtype="float8_e4m3fn_x4")
    p = t3.Program()
    t = p.sbuf((4, 4), ml_dtypes.bfloat16)
    with pytest.raises(t3.DtypeError):
        p.dma_copy(dst=t, src=h)
