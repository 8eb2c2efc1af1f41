"""TensorE: nc_matmul (bf16/fp16/fp8/fp32 inputs, fp32/bf16 PSUM, accumulate modes, transpose mode)
and nc_transpose (TensorE and VectorE), bit-exact against numpy references.

Reference numerics (neuroncore-v4.md §1.5/§2.4, numerics.md §6): every product is exact, each
matmul sums its K partitions in fp32 (RNE) in order 0..K-1 starting from +0, then PSUM gets
fl32(psum + sum) (accumulate) or the sum (overwrite); a bf16 PSUM rounds RNE after the add.
For fp32 inputs each step is a fused multiply-add.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, FP8_E4M3, FP8_E4M3FN, FP8_E5M2, Out, assert_bits_equal, param_id, random_bits, run_op

F32, F64 = np.float32, np.float64


# --------------------------------------------------------------------------------- references
def ref_tile_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One matmul's column sums for 16-bit / 8-bit inputs: exact f32 products, f32 RNE adds in k order."""
    a32, b32 = a.astype(F32), b.astype(F32)
    acc = np.zeros((a.shape[1], b.shape[1]), F32)
    for k in range(a.shape[0]):
        acc = acc + np.outer(a32[k], b32[k])  # products of <= 11-bit significands are exact in f32
    return acc


def fma32(x: np.ndarray, y: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded fl32(x*y + c) for float32 arrays.

    The float64 product is exact (2 x 24 bits); the float64 sum s can be inexact, so rounding s to f32
    could double-round. That only matters when s lands exactly on an f32 midpoint while the exact sum
    is not there; the TwoSum error term tells which way the exact value lies, and we step to the
    neighbour in that direction. The result equals a hardware fused multiply-add.
    """
    p = x.astype(F64) * y.astype(F64)
    c64 = c.astype(F64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)  # exact: p + c == s + err
    r = s.astype(F32)
    r64 = r.astype(F64)
    toward = np.where(s > r64, np.inf, -np.inf).astype(F32)
    o = np.nextafter(r, toward)
    mid = (r64 + o.astype(F64)) / 2
    fix = (s == mid) & (err != 0) & (np.sign(err) == np.sign(s - r64))
    return np.where(fix, o, r)


def ref_tile_sum_fp32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = np.zeros((a.shape[1], b.shape[1]), F32)
    for k in range(a.shape[0]):
        acc = fma32(a[k][:, None], b[k][None, :], acc)
    return acc


def matmul_kernel(dev, a, b, kt: int, psum_dtype, out_dtype, accumulate=None, core: int = 0):
    """Tiled matmul as in a kernel: K tiles of `kt` partitions accumulate in one PSUM tile, the
    PSUM evacuation casts, DMA out. Returns (program, output tensor)."""
    k, m = a.shape
    n = b.shape[1]
    ha, hb = dev.hbm.put(a), dev.hbm.put(b)
    out = dev.hbm.alloc((m, n), out_dtype)
    p = t3.Program(core=core)
    acc = p.psum((m, n), psum_dtype)
    for i in range(k // kt):
        at = p.sbuf((kt, m), a.dtype)
        bt = p.sbuf((kt, n), b.dtype)
        p.dma_copy(dst=at, src=ha[i * kt : (i + 1) * kt, :])
        p.dma_copy(dst=bt, src=hb[i * kt : (i + 1) * kt, :])
        p.nc_matmul(dst=acc, stationary=at, moving=bt, accumulate=accumulate)
    res = p.sbuf((m, n), out_dtype)
    p.tensor_copy(dst=res, src=acc)
    p.dma_copy(dst=out, src=res)
    return p, out


def matmul_program(dev, a, b, kt: int, psum_dtype, out_dtype, accumulate=None):
    """`matmul_kernel` run; the result read back."""
    p, out = matmul_kernel(dev, a, b, kt, psum_dtype, out_dtype, accumulate)
    dev.run(p)
    return dev.hbm.get(out)


# ------------------------------------------------------------------------------- plain matmul
def test_tiled_bf16_matmul_bit_exact(dev, rng):
    K, M, N, KT = 384, 128, 512, 128
    A = rng.standard_normal((K, M)).astype(BF16)
    B = rng.standard_normal((K, N)).astype(BF16)
    got = matmul_program(dev, A, B, KT, F32, BF16)

    ps = np.zeros((M, N), F32)
    for i in range(K // KT):
        ps = (ps + ref_tile_sum(A[i * KT : (i + 1) * KT], B[i * KT : (i + 1) * KT])).astype(F32)
    assert_bits_equal(got, ps.astype(BF16))


@pytest.mark.parametrize("dtype", [np.float16, BF16, FP8_E4M3, FP8_E4M3FN, FP8_E5M2], ids=param_id)
def test_matmul_low_precision_inputs_fp32_psum(dev, rng, dtype):
    K, M, N, KT = 256, 96, 200, 128
    A = (rng.standard_normal((K, M)) * 2).astype(dtype)
    B = (rng.standard_normal((K, N)) * 2).astype(dtype)
    got = matmul_program(dev, A, B, KT, F32, F32)
    ps = np.zeros((M, N), F32)
    for i in range(K // KT):
        ps = (ps + ref_tile_sum(A[i * KT : (i + 1) * KT], B[i * KT : (i + 1) * KT])).astype(F32)
    assert_bits_equal(got, ps)


def test_matmul_fp16_subnormal_products_exact(dev, rng):
    # Products of fp16 subnormals (down to 2^-48) are exact normal fp32 numbers.
    K, M, N = 64, 16, 32
    A = (rng.standard_normal((K, M)) * 2.0**-16).astype(np.float16)
    B = (rng.standard_normal((K, N)) * 2.0**-16).astype(np.float16)
    assert np.any(np.abs(A) < np.finfo(np.float16).tiny)
    got = matmul_program(dev, A, B, K, F32, F32)
    assert_bits_equal(got, ref_tile_sum(A, B))


def test_matmul_fp32_is_fused_multiply_add(dev, rng):
    K, M, N, KT = 256, 64, 128, 128
    A = rng.standard_normal((K, M)).astype(F32)
    B = rng.standard_normal((K, N)).astype(F32)
    got = matmul_program(dev, A, B, KT, F32, F32)
    ps = np.zeros((M, N), F32)
    for i in range(K // KT):
        ps = (ps + ref_tile_sum_fp32(A[i * KT : (i + 1) * KT], B[i * KT : (i + 1) * KT])).astype(F32)
    assert_bits_equal(got, ps)
    # The fused reference must really differ from product-then-add, or this test proves nothing.
    unfused = np.zeros((M, N), F32)
    for k in range(KT):
        unfused = (unfused + np.outer(A[k], B[k]).astype(F32)).astype(F32)
    assert not np.array_equal(unfused, ref_tile_sum_fp32(A[:KT], B[:KT]))


def test_fma32_reference_double_rounding_case():
    # 577 * y = 2^-24 * (1 + ~2^-31.4): float64 rounds 1 + 577*y to the f32 midpoint 1 + 2^-24, which RNE
    # would take down to 1.0, but the exact value lies above the midpoint, so fma gives 1 + 2^-23.
    x = np.array([577.0], F32)
    y = np.array([float.fromhex("0x1.c652860000000p-34")], F32)
    c = np.array([1.0], F32)
    exact = Fraction(1) + Fraction(577) * Fraction(float(y[0]))
    assert Fraction(1) + Fraction(1, 2**24) < exact < Fraction(1) + Fraction(1, 2**24) + Fraction(1, 2**53)
    assert (x.astype(F64) * y.astype(F64) + 1.0).astype(F32)[0] == F32(1.0)  # naive double rounding
    assert fma32(x, y, c)[0] == F32(1 + 2.0**-23)
    assert fma32(-x, y, -c)[0] == F32(-(1 + 2.0**-23))


def test_bf16_psum_accumulation(dev, rng):
    K, M, N, KT = 384, 64, 256, 128
    A = rng.standard_normal((K, M)).astype(BF16)
    B = rng.standard_normal((K, N)).astype(BF16)
    got = matmul_program(dev, A, B, KT, BF16, BF16)
    ps = None
    for i in range(K // KT):
        s = ref_tile_sum(A[i * KT : (i + 1) * KT], B[i * KT : (i + 1) * KT])
        ps = s.astype(BF16) if ps is None else (ps.astype(F32) + s).astype(BF16)
    assert_bits_equal(got, ps)


def test_matmul_strided_and_partial_operands(dev, rng):
    # K = 48 partitions starting at 0, stationary from a strided SBUF view, moving a 3-D tile.
    K, M, N = 48, 20, 6 * 10
    A = rng.standard_normal((K, 2 * M)).astype(BF16)
    B = rng.standard_normal((K, 6, 10)).astype(BF16)

    def body(p, a, b, out):
        p.nc_matmul(dst=out, stationary=a[:, ::2], moving=b, accumulate=False)

    (got,) = run_op(dev, [A, B], [Out((M, N), F32, "psum")], body)
    assert_bits_equal(got, ref_tile_sum(A[:, ::2], B.reshape(K, N)))


def test_matmul_partition_offsets(dev, rng):
    # K = 32 partitions starting at partition 32; the result lands in PSUM partitions 64..95.
    M, N = 32, 40
    A = rng.standard_normal((128, M)).astype(BF16)
    B = rng.standard_normal((128, N)).astype(BF16)

    def body(p, a, b, out):
        p.nc_matmul(dst=out[64:96], stationary=a[32:64], moving=b[32:64])

    (got,) = run_op(dev, [A, B], [Out((128, N), F32, "psum", fill=-3.0)], body)
    want = np.full((128, N), -3.0, F32)
    want[64:96] = ref_tile_sum(A[32:64], B[32:64])
    assert_bits_equal(got, want)


def test_matmul_tfloat32(dev, rng):
    # tf32 operands (10-bit mantissas in fp32 containers): products are exact in fp32.
    K, M, N = 128, 48, 64

    def tf32(x):
        u = x.astype(F32).view(np.uint32).astype(np.uint64)
        return ((u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000).astype(np.uint32).view(F32)

    A, B = tf32(rng.standard_normal((K, M))), tf32(rng.standard_normal((K, N)))

    def body(p, a, b, out):
        at, bt = p.sbuf((K, M), "tfloat32"), p.sbuf((K, N), "tfloat32")
        p.tensor_copy(dst=at, src=a)
        p.tensor_copy(dst=bt, src=b)
        p.nc_matmul(dst=out, stationary=at, moving=bt)

    (got,) = run_op(dev, [A, B], [Out((M, N), F32, "psum")], body)
    assert_bits_equal(got, ref_tile_sum(A, B))


# ------------------------------------------------------------------------- accumulate modes
def test_accumulate_true_false_none(dev, rng):
    K, M, N = 128, 32, 64
    A = [rng.standard_normal((K, M)).astype(BF16) for _ in range(2)]
    B = [rng.standard_normal((K, N)).astype(BF16) for _ in range(2)]
    s0, s1 = ref_tile_sum(A[0], B[0]), ref_tile_sum(A[1], B[1])
    base = F32(1.5)

    def body(p, a0, a1, b0, b1, o_false, o_true, o_none, o_mixed):
        # o_false: explicit False overwrites what memset put there, twice.
        p.nc_matmul(dst=o_false, stationary=a0, moving=b0, accumulate=False)
        p.nc_matmul(dst=o_false, stationary=a1, moving=b1, accumulate=False)
        # o_true: explicit True adds onto the memset value.
        p.nc_matmul(dst=o_true, stationary=a0, moving=b0, accumulate=True)
        p.nc_matmul(dst=o_true, stationary=a1, moving=b1, accumulate=True)
        # o_none: first matmul into the fresh tile overwrites, the second adds.
        p.nc_matmul(dst=o_none, stationary=a0, moving=b0)
        p.nc_matmul(dst=o_none, stationary=a1, moving=b1)
        # o_mixed: the first matmul writes columns 0..N/2 only; the second (None) adds there and
        # overwrites the columns no matmul has written yet (hardware cannot: the emulator warns).
        p.nc_matmul(dst=o_mixed[:, : N // 2], stationary=a0, moving=b0[:, : N // 2])
        with pytest.warns(t3.AccumulateWarning):
            p.nc_matmul(dst=o_mixed, stationary=a1, moving=b1)

    outs = [Out((M, N), F32, "psum", fill=float(base)) for _ in range(4)]
    o_false, o_true, o_none, o_mixed = run_op(dev, [A[0], A[1], B[0], B[1]], outs, body)
    assert_bits_equal(o_false, s1)
    assert_bits_equal(o_true, ((base + s0).astype(F32) + s1).astype(F32))
    assert_bits_equal(o_none, (s0 + s1).astype(F32))
    mixed = s1.copy()
    mixed[:, : N // 2] = (s0[:, : N // 2] + s1[:, : N // 2]).astype(F32)
    assert_bits_equal(o_mixed, mixed)


def test_accumulate_true_onto_bf16_psum(dev, rng):
    K, M, N = 128, 16, 48
    A = rng.standard_normal((K, M)).astype(BF16)
    B = rng.standard_normal((K, N)).astype(BF16)

    def body(p, a, b, out):
        p.nc_matmul(dst=out, stationary=a, moving=b, accumulate=True)

    (got,) = run_op(dev, [A, B], [Out((M, N), BF16, "psum", fill=0.3)], body)
    start = F32(0.3).astype(BF16).astype(F32)
    assert_bits_equal(got, (start + ref_tile_sum(A, B)).astype(BF16))


# --------------------------------------------------------------------------- transposes
def _special_bits(rng, shape, dtype):
    """Random bit patterns with NaN payloads, infinities and signed zeros sprinkled in."""
    x = random_bits(rng, shape, dtype)
    flat = x.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize])
    if np.dtype(dtype).itemsize == 4:
        specials = [0x7F800001, 0xFFC01234, 0x7FBFFFFF, 0x7F800000, 0x80000000, 0x00000001]
    elif np.dtype(dtype).itemsize == 2:
        specials = [0x7F81, 0xFFC1, 0x7C01, 0xFE55, 0x8000, 0x0001]
    else:
        specials = [0x7F, 0xFF, 0x79, 0x80, 0x01]
    flat[: len(specials)] = specials
    return x


@pytest.mark.parametrize(
    "dtype",
    [F32, BF16, np.float16, FP8_E4M3],
    ids=param_id,
)
def test_matmul_transpose_mode_bit_exact(dev, rng, dtype):
    K, M = 128, 64
    S = _special_bits(rng, (K, M), dtype)
    eye = np.eye(K, dtype=F32).astype(dtype)

    def body(p, s, i, out):
        p.nc_matmul(dst=out, stationary=s, moving=i, is_transpose=True)

    (got,) = run_op(dev, [S, eye], [Out((M, K), dtype, "psum")], body)
    assert_bits_equal(got, np.ascontiguousarray(S.T))


@pytest.mark.parametrize(
    "dtype,shape", [(F32, (128, 128)), (BF16, (100, 72)), (np.int8, (40, 3, 8)), (FP8_E5M2, (7, 90))], ids=param_id
)
def test_nc_transpose_tensor_engine(dev, rng, dtype, shape):
    X = _special_bits(rng, shape, dtype)
    P, F = shape[0], int(np.prod(shape[1:]))

    def body(p, x, out):
        p.nc_transpose(dst=out, data=x)

    (got,) = run_op(dev, [X], [Out((F, P), dtype, "psum")], body)
    assert_bits_equal(got, np.ascontiguousarray(X.reshape(P, F).T))


@pytest.mark.parametrize("src_mem", ["sbuf", "psum"])
@pytest.mark.parametrize("dtype,shape", [(F32, (32, 32)), (BF16, (20, 12)), (np.uint8, (32, 5))], ids=param_id)
def test_nc_transpose_vector_engine(dev, rng, dtype, shape, src_mem):
    X = _special_bits(rng, shape, dtype)
    P, F = shape

    def body(p, x, out):
        src = x
        if src_mem == "psum":
            src = p.psum(shape, dtype)
            p.tensor_copy(dst=src, src=x)
        p.nc_transpose(dst=out, data=src, engine="vector")

    (got,) = run_op(dev, [X], [Out((F, P), dtype)], body)
    assert_bits_equal(got, np.ascontiguousarray(X.T))
