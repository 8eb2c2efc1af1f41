"""Host threads and SIMD paths change speed, never bits: every result here is computed with 1 and 2
threads (and on every SIMD path the host can run: AVX-512, AVX2+FMA, portable) and compared bitwise, plus against an independent
numpy reference where one is cheap. Also: the thread-count API, TRN3EMU_NUM_THREADS, fork safety."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, FP8_E4M3FN, FP8_E5M2, assert_bits_equal
from test_matmul import fma32, matmul_kernel
from trn3emu import _native

F32 = np.float32


@pytest.fixture(autouse=True)
def _restore_settings():
    _native.set_min_parallel_work(1)  # split every instruction, however small, when threads > 1
    yield
    _native.set_min_parallel_work(0)
    t3.set_num_threads(0)
    _native.limit_simd(None)


# SIMD paths this host can run besides its best (each compared bitwise with the best).
NARROWER = [p for p in ("avx2+fma", "portable") if p != t3.simd_path() and _native.limit_simd(p)]
_native.limit_simd(None)


def variants(fn):
    """fn() with 1 thread, with 2 threads, and with 1 and 2 threads on every narrower SIMD path
    (1 thread: the unsplit kernels, e.g. a matmul written straight into PSUM)."""
    out = []
    for threads, path in [(1, None), (2, None)] + [(t, p) for p in NARROWER for t in (1, 2)]:
        t3.set_num_threads(threads)
        _native.limit_simd(path)
        out.append(fn())
    t3.set_num_threads(0)
    _native.limit_simd(None)
    return out


def assert_all_same(results):
    for r in results[1:]:
        for x, y in zip(results[0], r) if isinstance(r, tuple) else [(results[0], r)]:
            assert_bits_equal(x, y)


def tiled_matmul(a, b, kt, psum_dtype, out_dtype, core=0, dev=None):
    """test_matmul's tiled kernel on `dev` (a new device by default): (device, program, output)."""
    dev = dev or t3.Device()
    p, out = matmul_kernel(dev, a, b, kt, psum_dtype, out_dtype, core=core)
    return dev, p, out


def run_tiled(a, b, kt, psum_dtype, out_dtype):
    dev, p, out = tiled_matmul(a, b, kt, psum_dtype, out_dtype)
    dev.run(p)
    return dev.hbm.get(out)


def ref_exact_products(a, b):
    """Column sums, one correctly rounded fl32(acc + a*b) per step (exact f64 product), k in order."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    acc = np.zeros((a.shape[1], b.shape[1]), F32)
    for k in range(a.shape[0]):
        acc = fma32(a64[k][:, None], b64[k][None, :], acc)
    return acc


@pytest.mark.parametrize("dtype", [BF16, FP8_E4M3FN, FP8_E5M2, np.float16], ids=lambda d: np.dtype(d).name)
def test_matmul_tile_same_bits_any_threads_or_path(dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((128, 128)).astype(dtype)
    b = rng.standard_normal((128, 512)).astype(dtype)
    res = variants(lambda: run_tiled(a, b, 128, F32, F32))
    assert_all_same(res)
    assert_bits_equal(res[0], ref_exact_products(a, b))


def test_matmul_fp32_same_bits_any_threads_or_path():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((128, 96)).astype(F32)
    b = rng.standard_normal((128, 300)).astype(F32)
    assert_all_same(variants(lambda: run_tiled(a, b, 128, F32, F32)))


def test_tiled_bf16_kernel_same_bits_any_threads_or_path():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((512, 128)).astype(BF16)
    b = rng.standard_normal((512, 512)).astype(BF16)
    res = variants(lambda: run_tiled(a, b, 128, F32, BF16))
    assert_all_same(res)
    ps = np.zeros((128, 512), F32)
    for i in range(4):
        ps = (ps + ref_exact_products(a[i * 128 : (i + 1) * 128], b[i * 128 : (i + 1) * 128])).astype(F32)
    assert_bits_equal(res[0], ps.astype(BF16))


def test_bf16_psum_and_double_row_same_bits():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((256, 64)).astype(BF16)
    b = rng.standard_normal((256, 700)).astype(BF16)
    assert_all_same(variants(lambda: run_tiled(a, b, 128, BF16, BF16)))

    a8 = rng.standard_normal((64, 2, 128)).astype(FP8_E4M3FN)
    b8 = rng.standard_normal((64, 2, 512)).astype(FP8_E4M3FN)

    def double_row():
        dev = t3.Device()
        p = t3.Program()
        st, mv = p.sbuf(a8.shape, a8.dtype), p.sbuf(b8.shape, b8.dtype)
        p.dma_copy(dst=st, src=dev.hbm.put(a8))
        p.dma_copy(dst=mv, src=dev.hbm.put(b8))
        acc = p.psum((128, 512), F32)
        p.nc_matmul(dst=acc, stationary=st, moving=mv, perf_mode="double_row")
        res = p.sbuf((128, 512), F32)
        p.tensor_copy(dst=res, src=acc)
        out = dev.hbm.alloc((128, 512), F32)
        p.dma_copy(dst=out, src=res)
        dev.run(p)
        return dev.hbm.get(out)

    res = variants(double_row)
    assert_all_same(res)
    # Logical contraction row 2k + l.
    assert_bits_equal(res[0], ref_exact_products(a8.reshape(128, 128), b8.reshape(128, 512)))


def test_bf16_underflowing_products_are_fused():
    """docs/numerics.md: each step is fl32(acc + a*b) with the exact product. Row 0 gives 2^-74 * 2^-75 =
    2^-149 (the smallest subnormal); row 1 adds 2^-150: the exact sum 1.5 * 2^-149 ties to even, 2^-148.
    (Rounding the product first would give 2^-150 -> 0 and leave 2^-149.)"""
    a = np.zeros((2, 1), F32)
    b = np.zeros((2, 16), F32)
    a[:, 0] = [2.0**-74, 2.0**-75]
    b[:, :] = 2.0**-75
    for r in variants(lambda: run_tiled(a.astype(BF16), b.astype(BF16), 2, F32, F32)):
        assert_bits_equal(r, np.full((1, 16), 2.0**-148, F32))


def random_mx_words(rng, shape, dtype="float8_e4m3fn_x4"):
    """x4 words from random finite codes (e4m3fn NaN 0x7F/0xFF, e5m2 Inf/NaN 0x7C..0x7F replaced)."""
    b = rng.integers(0, 256, size=(*shape, 4)).astype(np.uint32)
    special = (b & 0x7F) == 0x7F if dtype == "float8_e4m3fn_x4" else (b & 0x7C) == 0x7C
    b[special] = 0x3C
    return b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24


@pytest.mark.parametrize("dt", ["float8_e4m3fn_x4", "float8_e5m2_x4"])
def test_matmul_mx_same_bits_any_threads_or_path(dt):
    """e4m3fn x e4m3fn takes the exact-f64 fast path, e5m2 x e5m2 the integer formula."""
    sdt = mdt = dt
    rng = np.random.default_rng(5)
    parts, m, n = 128, 128, 512
    sw = random_mx_words(rng, (parts, m), sdt)
    mw = random_mx_words(rng, (parts, n), mdt)
    sw[3, 5] = (sw[3, 5] & ~np.uint32(0xFF)) | 0x7F  # a NaN element: the IEEE reference term path
    scale_rows = np.zeros((parts, m + n), np.uint8)
    for r in range(parts // 8):
        scale_rows[32 * (r // 4) + r % 4] = rng.integers(100, 150, size=m + n)
    scale_rows[32 * (1 // 4) + 1, m + 7] = 0xFF  # a NaN scale

    def once():
        dev = t3.Device()
        p = t3.Program()
        st = p.sbuf((parts, m), sdt)
        mv = p.sbuf((parts, n), mdt)
        sc = p.sbuf((parts, m + n), np.uint8)
        p.dma_copy(dst=st, src=dev.hbm.put(sw, dtype=sdt))
        p.dma_copy(dst=mv, src=dev.hbm.put(mw, dtype=mdt))
        p.dma_copy(dst=sc, src=dev.hbm.put(scale_rows))
        acc = p.psum((m, n), F32)
        p.nc_matmul_mx(dst=acc, stationary=st, moving=mv, stationary_scale=sc[:, :m], moving_scale=sc[:, m:])
        res = p.sbuf((m, n), F32)
        p.tensor_copy(dst=res, src=acc)
        out = dev.hbm.alloc((m, n), F32)
        p.dma_copy(dst=out, src=res)
        dev.run(p)
        return dev.hbm.get(out)

    res = variants(once)
    assert_all_same(res)
    assert np.isnan(res[0][5]).all() and np.isnan(res[0][:, 7]).all()
    assert np.isfinite(res[0][:5]).any()


@pytest.mark.parametrize("dtype", [BF16, np.uint8, F32], ids=lambda d: np.dtype(d).name)
def test_transposes_same_bits_and_exact(dtype):
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, size=(128, 128 * np.dtype(dtype).itemsize), dtype=np.uint8).view(dtype)

    def once():
        dev = t3.Device()
        p = t3.Program()
        s = p.sbuf(x.shape, x.dtype)
        p.dma_copy(dst=s, src=dev.hbm.put(x))
        t = p.psum(x.shape[::-1], x.dtype)
        p.nc_transpose(dst=t, data=s)
        res = p.sbuf(t.shape, x.dtype)
        p.tensor_copy(dst=res, src=t)
        out = dev.hbm.alloc(t.shape, x.dtype)
        p.dma_copy(dst=out, src=res)
        dev.run(p)
        return dev.hbm.get(out)

    res = variants(once)
    assert_all_same(res)
    assert_bits_equal(res[0], x.T)


def test_multicore_program_same_bits():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((256, 128)).astype(BF16)
    b = rng.standard_normal((256, 512)).astype(BF16)

    def once():
        dev = t3.Device()
        _, p0, o0 = tiled_matmul(a, b, 128, F32, BF16, core=0, dev=dev)
        _, p1, o1 = tiled_matmul(b[:, :128], a, 128, F32, F32, core=1, dev=dev)
        dev.run([p0, p1])
        return dev.hbm.get(o0), dev.hbm.get(o1)

    res = variants(once)
    assert_all_same(res)


def test_elementwise_same_bits():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((128, 2048)).astype(F32)
    y = rng.standard_normal((128, 2048)).astype(F32)

    def once():
        dev = t3.Device()
        p = t3.Program()
        a, b = p.sbuf(x.shape, F32), p.sbuf(y.shape, F32)
        p.dma_copy(dst=a, src=dev.hbm.put(x))
        p.dma_copy(dst=b, src=dev.hbm.put(y))
        c = p.sbuf(x.shape, BF16)
        p.tensor_tensor(dst=c, data1=a, data2=b, op="add")
        out = dev.hbm.alloc(x.shape, BF16)
        p.dma_copy(dst=out, src=c)
        dev.run(p)
        return dev.hbm.get(out)

    res = variants(once)
    assert_all_same(res)
    assert_bits_equal(res[0], (x + y).astype(ml_dtypes.bfloat16))


def test_dma_copies_rows_same_bits():
    """HBM <-> on-chip copies with the rows on threads (memory/par_copy.rs): rows crossing 1 MiB HBM
    pages, a source range never written (zeros), partitions not starting at 0, PSUM, and an HBM
    destination whose rows overlap (kept on one thread in row order: the later row's bytes win)."""
    rng = np.random.default_rng(21)
    w = 3000  # 12000-byte rows: the 1.5 MB tensor crosses page boundaries mid-row
    x = rng.standard_normal((128, w)).astype(F32)
    y = rng.standard_normal((64, 500)).astype(F32)

    def once():
        dev = t3.Device()
        p = t3.Program()
        hx, hz = dev.hbm.put(x), dev.hbm.alloc((96, w), F32)  # hz: never written
        a, z = p.sbuf((128, w), F32), p.sbuf((128, w), F32)
        ps = p.sbuf((128, 500), F32)
        p.dma_copy(dst=a, src=hx)
        p.dma_copy(dst=z[32:128, :], src=hz)
        p.dma_copy(dst=ps[64:128, :], src=dev.hbm.put(y))
        o1, o2 = dev.hbm.alloc((128, w), F32), dev.hbm.alloc((64, 500), F32)
        p.dma_copy(dst=o1, src=a)
        p.dma_copy(dst=o2, src=ps[64:128, :])
        ov = dev.hbm.alloc((127 * w // 2 + w,), F32)
        p.dma_copy(dst=ov.ap([[w // 2, 128], [1, w]]), src=a)  # row r at r * w/2: halves overlap
        dev.run(p)
        return dev.hbm.get(o1), dev.hbm.get(o2), dev.read(z)[32:], dev.hbm.get(ov)

    res = variants(once)
    assert_all_same(res)
    assert_bits_equal(res[0][0], x)
    assert_bits_equal(res[0][1], y)
    assert_bits_equal(res[0][2], np.zeros((96, w), F32))
    want = np.zeros(127 * w // 2 + w, F32)
    for r in range(128):  # row order: each row overwrites the first half of the one before
        want[r * w // 2 : r * w // 2 + w] = x[r]
    assert_bits_equal(res[0][3], want)


def test_fp32_elementwise_rows_same_bits():
    """fp32 tensor_tensor / tensor_scalar with the rows on threads (rows::fused_dense_any_par): out of
    place, in place (dst is data1 / data), per-partition operands, and a destination in other
    partitions than its source; each op rounded once in fp32 like numpy's."""
    rng = np.random.default_rng(22)
    x = rng.standard_normal((128, 700)).astype(F32)
    y = (rng.standard_normal((128, 700)) + 3).astype(F32)
    col = rng.standard_normal((128, 1)).astype(F32)

    def once():
        dev = t3.Device()
        p = t3.Program()
        a, b, c = p.sbuf(x.shape, F32), p.sbuf(y.shape, F32), p.sbuf((128, 1), F32)
        p.dma_copy(dst=a, src=dev.hbm.put(x))
        p.dma_copy(dst=b, src=dev.hbm.put(y))
        p.dma_copy(dst=c, src=dev.hbm.put(col))
        d, e = p.sbuf(x.shape, F32), p.sbuf(x.shape, F32)
        p.tensor_tensor(dst=d, data1=a, data2=b, op="divide")
        p.tensor_tensor(dst=d, data1=d, data2=b, op="subtract")  # in place
        p.tensor_scalar(dst=e, data=a, op0="multiply", operand0=c, op1="add", operand1=0.25)
        p.tensor_scalar(dst=e, data=e, op0="add", operand0=1.5)  # in place
        p.tensor_scalar(dst=b[64:128, :], data=a[0:64, :], op0="multiply", operand0=3.0)  # other partitions
        outs = []
        for t in (d, e, b):
            h = dev.hbm.alloc(t.shape, F32)
            p.dma_copy(dst=h, src=t)
            outs.append(h)
        dev.run(p)
        return tuple(dev.hbm.get(h) for h in outs)

    res = variants(once)
    assert_all_same(res)
    assert_bits_equal(res[0][0], x / y - y)
    assert_bits_equal(res[0][1], (x * col + F32(0.25)) + F32(1.5))
    assert_bits_equal(res[0][2], np.concatenate([y[:64], x[:64] * F32(3)]))


def test_host_hbm_moves_same_bytes():
    """Large host writes / reads / zeroing of HBM go one 1 MiB page per task on the threads: a range
    not page-aligned, partly over pages never written (read as zeros), and a zeroed middle."""
    rng = np.random.default_rng(23)
    data = rng.integers(0, 256, 3 * 2**20 + 12345, dtype=np.uint8)
    addr = 5 * 2**20 + 777  # starts mid-page

    def once():
        dev = t3.Device()
        n = dev.hbm._native
        n.hbm_write(addr, data)
        n.hbm_zero(addr + 2**20, 2**20 + 99)
        return n.hbm_read(addr - 2**20, data.size + 2 * 2**20)  # a page before, a page after: zeros

    res = variants(once)
    assert_all_same(res)
    want = np.zeros(data.size + 2 * 2**20, np.uint8)
    want[2**20 : 2**20 + data.size] = data
    want[2 * 2**20 : 3 * 2**20 + 99] = 0
    assert_bits_equal(res[0], want)


def test_activation_rows_same_bits():
    """Activation with a register reduction (rows split across threads) on exp and sigmoid."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((128, 777)).astype(F32) * 4
    bias = np.linspace(-1, 1, 128, dtype=F32).reshape(128, 1)  # per partition: rows must not mix

    def once():
        dev = t3.Device()
        p = t3.Program()
        a, b = p.sbuf(x.shape, F32), p.sbuf((128, 1), F32)
        p.dma_copy(dst=a, src=dev.hbm.put(x))
        p.dma_copy(dst=b, src=dev.hbm.put(bias))
        outs = []
        for op in ("exp", "sigmoid"):
            d, s = p.sbuf(x.shape, F32), p.sbuf((128, 1), F32)
            p.activation(dst=d, op=op, data=a, bias=b, reduce_op="add", reduce_res=s, reduce_cmd="reset_reduce")
            for t in (d, s):
                h = dev.hbm.alloc(t.shape, F32)
                p.dma_copy(dst=h, src=t)
                outs.append(h)
        dev.run(p)
        return tuple(dev.hbm.get(h) for h in outs)

    res = variants(once)
    assert_all_same(res)
    x64 = (x + bias).astype(np.float64)  # fl32(x * 1 + bias), then the f64 function
    assert_bits_equal(res[0][0], np.exp(x64).astype(F32))
    e = np.exp(-np.abs(x64))  # the documented f64 formula: 1/(1+e^-x) for x >= 0, e^x/(1+e^x) below
    assert_bits_equal(res[0][2], np.where(x64 >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(F32))


def test_fused_activation_and_quantize_mx_same_bits():
    """The single-pass activation (exp / sigmoid / silu with a bias column, no register traffic)
    and quantize_mx's RNE fast path, on every path, against numpy for the activations."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((128, 1000)).astype(F32) * 6
    x[5, :4] = [np.inf, -np.inf, np.nan, -200.0]
    bias = np.linspace(-2, 2, 128, dtype=F32).reshape(128, 1)
    q = (rng.standard_normal((128, 512)) * np.exp2(rng.integers(-20, 20, (128, 1)))).astype(BF16)
    q[9, 3] = np.inf  # an Inf block: scale 0xFF

    def once():
        dev = t3.Device()
        p = t3.Program()
        a, b = p.sbuf(x.shape, F32), p.sbuf((128, 1), F32)
        p.dma_copy(dst=a, src=dev.hbm.put(x))
        p.dma_copy(dst=b, src=dev.hbm.put(bias))
        outs = []
        for op in ("exp", "sigmoid", "silu", "tanh"):
            d = p.sbuf(x.shape, F32)
            p.activation(dst=d, op=op, data=a, bias=b)
            outs.append(d)
        src = p.sbuf(q.shape, BF16)
        p.dma_copy(dst=src, src=dev.hbm.put(q))
        words, sc = p.sbuf((128, 128), "float8_e4m3fn_x4"), p.sbuf((128, 128), np.uint8)
        p.memset(dst=sc, value=0)
        p.quantize_mx(dst=words, src=src, dst_scale=sc)
        dev.run(p)
        return tuple(dev.read(t) for t in outs) + (dev.read(words), dev.read(sc))

    res = variants(once)
    assert_all_same(res)
    v = (x + bias).astype(np.float64)
    e = np.exp(-np.abs(v))
    s = np.where(v >= 0, 1.0, e) / (1.0 + e)
    with np.errstate(over="ignore", invalid="ignore"):
        assert_bits_equal(res[0][0], np.exp(v).astype(F32))
        assert_bits_equal(res[0][1], np.where(np.isnan(v), v, np.where(v == np.inf, 1.0, s)).astype(F32))
        silu = np.where(v == -np.inf, 0.0, np.where(v == np.inf, np.inf, v * s))
        assert_bits_equal(res[0][2], silu.astype(F32))
        assert_bits_equal(res[0][3], np.vectorize(math.tanh, otypes=[np.float64])(v).astype(F32))


def test_fused_activation_rows_split_or_kept_in_order():
    """The one-pass fp32 activation splits its rows over threads only when no source row shares
    a byte with a destination row: here one in place (exp of a tile into itself: kept on the
    serial path, which copies each row first) and one between column ranges of the same
    partitions (disjoint bytes: split). Both equal to the f64 functions rounded once, with every
    thread count and SIMD path."""
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((128, 700)) * 5).astype(F32)

    def once():
        dev = t3.Device()
        p = t3.Program()
        a, c = p.sbuf(x.shape, F32), p.sbuf(x.shape, F32)
        p.dma_copy(dst=a, src=dev.hbm.put(x))
        p.dma_copy(dst=c, src=dev.hbm.put(x))
        p.activation(dst=a, op="exp", data=a)
        p.activation(dst=c[:, 0:300], op="tanh", data=c[:, 350:650])
        dev.run(p)
        return dev.read(a), dev.read(c)

    res = variants(once)
    assert_all_same(res)
    assert_bits_equal(res[0][0], np.exp(x.astype(np.float64)).astype(F32))
    want = x.copy()
    want[:, 0:300] = np.vectorize(math.tanh, otypes=[np.float64])(x[:, 350:650].astype(np.float64))
    assert_bits_equal(res[0][1], want)


def test_thread_count_api():
    t3.set_num_threads(3)
    assert t3.get_num_threads() == 3
    t3.set_num_threads(0)
    assert t3.get_num_threads() >= 1
    with pytest.raises(t3.errors.ValidationError):
        t3.set_num_threads(-1)
    assert t3.simd_path() in ("avx512", "avx2+fma", "portable")
    assert _native.limit_simd("portable")
    assert t3.simd_path() == "portable"
    with pytest.raises(t3.errors.ValidationError):
        _native.limit_simd("sse9")


def test_env_vars_set_defaults():
    code = "import trn3emu as t3; print(t3.get_num_threads(), t3.simd_path())"
    env = dict(os.environ, TRN3EMU_NUM_THREADS="3", TRN3EMU_PORTABLE_KERNELS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["3", "portable"], out.stderr
    env = {k: v for k, v in os.environ.items() if k != "TRN3EMU_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[0] == "1", out.stderr  # threads are opt-in


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
# JAX (imported by tests/test_interop.py in the same process) warns on any fork; the child here
# never calls JAX.
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_fork_child_can_run_parallel_kernels():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((128, 128)).astype(BF16)
    b = rng.standard_normal((128, 512)).astype(BF16)
    t3.set_num_threads(2)
    want = run_tiled(a, b, 128, F32, F32)  # builds the pool in the parent
    pid = os.fork()
    if pid == 0:  # child: the parent's pool threads do not exist here
        code = 1
        try:
            got = run_tiled(a, b, 128, F32, F32)
            code = 0 if np.array_equal(got.view(np.uint32), want.view(np.uint32)) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("child process hung in a parallel kernel after fork")
        time.sleep(0.02)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    # The parent's pool still works after the fork.
    assert_bits_equal(run_tiled(a, b, 128, F32, F32), want)


def test_simd_env_narrows_at_import():
    """TRN3EMU_SIMD narrows the path in a fresh interpreter; an unknown name fails the import."""
    code = "import trn3emu; print(trn3emu.simd_path())"
    for path in NARROWER:
        env = dict(os.environ, TRN3EMU_SIMD=path)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == path
    env = dict(os.environ, TRN3EMU_SIMD="sse9")
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "sse9" in bad.stderr
