"""`activation` / `activation_reduce` with the add reduction into the ScalarE registers stream
block by block on one thread (engines/act_stream.rs) and batch short rows (a [P, 1] column is one
kernel call): same bits as the materialising path (taken when the rows are split across host
threads) and as an independent numpy reference — the f64 formula rounded once, the registers
summing the fp32 results of each row in free-index order."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from conftest import assert_bits_equal, random_bits
from trn3emu import _native

F32, F64 = np.float32, np.float64
BF16 = ml_dtypes.bfloat16


@pytest.fixture(autouse=True)
def _restore_threads():
    yield
    _native.set_min_parallel_work(0)
    t3.set_num_threads(0)


def exp_ref(t: np.ndarray) -> np.ndarray:
    return np.exp(t.astype(F64)).astype(F32)


def tanh_ref(t: np.ndarray) -> np.ndarray:
    return np.tanh(t.astype(F64)).astype(F32)


def row_sums(v: np.ndarray, init: np.ndarray) -> np.ndarray:
    acc = init.astype(F32).copy()
    for j in range(v.shape[1]):
        acc = (acc + v[:, j]).astype(F32)
    return acc


def run(x, scale, bias, start, dst_dtype, op):
    """Two instructions on partitions start..start+P: reset_reduce, then reduce onto the same
    registers; reduce_res after each. Returns (dst1, res1, dst2, res2)."""
    parts, n = x.shape
    dev = t3.Device()
    p = t3.Program()
    xt = p.sbuf((start + parts, n), F32)
    st = p.sbuf((start + parts, 1), F32)
    p.dma_copy(dst=xt[start:, :], src=dev.hbm.put(x))
    p.dma_copy(dst=st[start:, :], src=dev.hbm.put(scale))
    o1 = p.sbuf((start + parts, n), dst_dtype)
    o2 = p.sbuf((start + parts, n), dst_dtype)
    r1 = p.sbuf((start + parts, 1), F32)
    r2 = p.sbuf((start + parts, 1), F32)
    sl = slice(start, None)
    p.activation(
        dst=o1[sl, :],
        op=op,
        data=xt[sl, :],
        scale=st[sl, :],
        bias=bias,
        reduce_op="add",
        reduce_res=r1[sl, :],
        reduce_cmd="reset_reduce",
    )
    p.activation(dst=o2[sl, :], op=op, data=xt[sl, :], reduce_op="add", reduce_res=r2[sl, :], reduce_cmd="reduce")
    hs = [dev.hbm.alloc((parts, n), dst_dtype), dev.hbm.alloc((parts, 1), F32)]
    hs += [dev.hbm.alloc((parts, n), dst_dtype), dev.hbm.alloc((parts, 1), F32)]
    for h, t in zip(hs, (o1, r1, o2, r2)):
        p.dma_copy(dst=h, src=t[sl, :])
    dev.run(p)
    return [dev.hbm.get(h) for h in hs]


@pytest.mark.parametrize("n", [1, 5, 16, 512, 3000])
@pytest.mark.parametrize("dst_dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("op,ref", [("exp", exp_ref), ("tanh", tanh_ref)])
def test_streamed_reduce_matches_reference_and_threaded_path(n, dst_dtype, op, ref):
    rng = np.random.default_rng(n)
    parts, start = 29, 32  # not a multiple of the 8-row groups, not at partition 0
    x = rng.uniform(-4, 4, (parts, n)).astype(F32)
    scale = rng.uniform(-1.5, 1.5, (parts, 1)).astype(F32)
    bias = -0.25
    t = ((x * scale).astype(F32) + F32(bias)).astype(F32)
    want1 = ref(t)
    want_r1 = row_sums(want1, np.zeros(parts, F32))
    want2 = ref(x + F32(0))
    want_r2 = row_sums(want2, want_r1)
    results = []
    for threads in (1, 2):
        t3.set_num_threads(threads)
        _native.set_min_parallel_work(1 if threads > 1 else 0)  # 2: the materialising path
        d1, r1, d2, r2 = run(x, scale, bias, start, dst_dtype, op)
        assert_bits_equal(d1, want1.astype(dst_dtype))
        assert_bits_equal(d2, want2.astype(dst_dtype))
        assert_bits_equal(r1[:, 0], want_r1)
        assert_bits_equal(r2[:, 0], want_r2)
        results.append((d1, r1, d2, r2))
    for got, first in zip(results[1], results[0]):
        assert_bits_equal(got, first)


@pytest.mark.parametrize("op,ref", [("exp", exp_ref), ("tanh", tanh_ref), ("copy", lambda t: t)])
def test_column_activation_batches_rows(op, ref):
    """[P, 1] and [P, 3] fp32 columns with per-row scale and bias (the rows are batched into
    one call of the function); also copy from PSUM fp32 (one fused pass)."""
    rng = np.random.default_rng(7)
    for n in (1, 3, 40):
        x = rng.uniform(-3, 3, (128, n)).astype(F32)
        x[0, 0], x[1, 0] = -0.0, np.nan
        scale = rng.uniform(-2, 2, (128, 1)).astype(F32)
        bias = rng.uniform(-1, 1, (128, 1)).astype(F32)
        dev = t3.Device()
        p = t3.Program()
        xt, st, bt = p.sbuf((128, n), F32), p.sbuf((128, 1), F32), p.sbuf((128, 1), F32)
        for t, a in ((xt, x), (st, scale), (bt, bias)):
            p.dma_copy(dst=t, src=dev.hbm.put(a))
        ps = p.psum((128, n), F32)
        p.tensor_copy(dst=ps, src=xt)
        o = p.sbuf((128, n), F32)
        o_ps = p.sbuf((128, n), F32)
        p.activation(dst=o, op=op, data=xt, scale=st, bias=bt)
        p.activation(dst=o_ps, op=op, data=ps, scale=st, bias=bt)
        h, h_ps = dev.hbm.alloc((128, n), F32), dev.hbm.alloc((128, n), F32)
        p.dma_copy(dst=h, src=o)
        p.dma_copy(dst=h_ps, src=o_ps)
        dev.run(p)
        with np.errstate(invalid="ignore"):
            want = ref(((x * scale).astype(F32) + bias).astype(F32))
        for got in (dev.hbm.get(h), dev.hbm.get(h_ps)):
            assert np.array_equal(np.isnan(got), np.isnan(want))
            nan = np.isnan(want)
            assert_bits_equal(np.where(nan, F32(0), got), np.where(nan, F32(0), want))


def _act_once(x, op, dst_dtype, rounding, strided, reduce):
    """One activation of x (fp32, [128, n]) with per-row scale and bias into dst_dtype, from a
    dense source (one fused pass per row, engines/act_fused.rs) or from every other column of a
    wider tile (not row-contiguous: the block path). Fresh device with a fixed seed each time,
    the same instruction sequence, so stochastic rounding draws the same bits."""
    parts, n = x.shape
    dev = t3.Device(rounding=rounding, seed=5)
    p = t3.Program()
    wide = np.zeros((parts, 2 * n), F32)
    wide[:, ::2] = x
    xt = p.sbuf((parts, 2 * n) if strided else (parts, n), F32)
    p.dma_copy(dst=xt, src=dev.hbm.put(wide if strided else x))
    src = xt[:, ::2] if strided else xt
    o, r = p.sbuf((parts, n), dst_dtype), p.sbuf((parts, 1), F32)
    scale = np.linspace(-1.5, 1.5, parts, dtype=F32).reshape(parts, 1)
    st = p.sbuf((parts, 1), F32)
    p.dma_copy(dst=st, src=dev.hbm.put(scale))
    kw = dict(reduce_op="add", reduce_res=r, reduce_cmd="reset_reduce") if reduce else {}
    p.activation(dst=o, op=op, data=src, scale=st, bias=0.375, **kw)
    ho, hr = dev.hbm.alloc((parts, n), dst_dtype), dev.hbm.alloc((parts, 1), F32)
    p.dma_copy(dst=ho, src=o)
    p.dma_copy(dst=hr, src=r)
    dev.run(p)
    return dev.hbm.get(ho), dev.hbm.get(hr)


@pytest.mark.parametrize("op", ["copy", "exp", "silu", "gelu", "relu"])
@pytest.mark.parametrize("dst_dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
@pytest.mark.parametrize("reduce", [False, True], ids=["plain", "reduce"])
def test_fused_rows_match_the_block_path(op, dst_dtype, rounding, reduce):
    """fp32 source rows straight into the destination (any dtype, both rounding modes, with and
    without the register sums over 128 rows = 8 groups of 16) give the block path's bits; the
    sums also equal the in-order fp32 sums of the fp32 results (exp: against numpy)."""
    rng = np.random.default_rng(11)
    x = rng.uniform(-4, 4, (128, 200)).astype(F32)
    x[3, :5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    fused = _act_once(x, op, dst_dtype, rounding, strided=False, reduce=reduce)
    block = _act_once(x, op, dst_dtype, rounding, strided=True, reduce=reduce)
    assert_bits_equal(fused[0], block[0])
    if reduce:
        assert_bits_equal(fused[1], block[1])
    if op == "exp" and reduce:
        scale = np.linspace(-1.5, 1.5, 128, dtype=F32).reshape(128, 1)
        y = exp_ref(((x * scale).astype(F32) + F32(0.375)).astype(F32))
        assert_bits_equal(fused[1][:, 0], row_sums(y, np.zeros(128, F32)))


@pytest.mark.parametrize("path", [None, "avx2+fma", "portable"])
def test_scaled_copy_gives_the_two_rounding_bits_on_every_simd_path(path):
    """`copy` with a per-partition scale and bias from fp32 PSUM rows into fp32 SBUF rows (a
    matmul result scaled out, act_stream.rs `copy_fused`) is x * scale rounded, then + bias
    rounded, never fused, on every SIMD path: numpy's fp32 multiply and add, bit for bit, over
    every fp32 bit pattern (NaN payloads included) and a row length that is no whole number of
    vectors."""
    if path is not None and not _native.limit_simd(path):
        pytest.skip(f"host has no {path} path")
    try:
        rng = np.random.default_rng(5)
        parts, n = 128, 515
        x = random_bits(rng, (parts, n), F32)
        scale = rng.uniform(-3, 3, (parts, 1)).astype(F32)
        scale[:2, 0] = [np.float32(1e-30), np.float32(3e38)]
        bias = rng.uniform(-1, 1, (parts, 1)).astype(F32)
        dev = t3.Device()
        p = t3.Program()
        xs, ss, bs = p.sbuf((parts, n), F32), p.sbuf((parts, 1), F32), p.sbuf((parts, 1), F32)
        for t, a in ((xs, x), (ss, scale), (bs, bias)):
            p.dma_copy(dst=t, src=dev.hbm.put(a))
        ps, out = p.psum((parts, n), F32), p.sbuf((parts, n), F32)
        p.tensor_copy(dst=ps, src=xs)
        p.activation(dst=out, op="copy", data=ps, scale=ss, bias=bs)
        h = dev.hbm.alloc((parts, n), F32)
        p.dma_copy(dst=h, src=out)
        dev.run(p)
        with np.errstate(all="ignore"):
            want = (x * scale).astype(F32) + bias
        assert_bits_equal(dev.hbm.get(h), want)
    finally:
        _native.limit_simd(None)
