"""bf16 and mixed-dtype element-wise instructions, on-chip copies (`tensor_copy`, `dma_copy`) and
bf16-source activations split their rows over the host threads when large, as the fp32 ones do
(engines/rows.rs `map_f32_rows_par` and `fused_dense_par`, engines/act_fused.rs): each row is
decoded into fp32, computed, rounded and written by one thread with its row-major element index,
so the bits, stochastic rounding included, do not depend on the thread count or the SIMD path.
The split threshold is forced down to 1 here so that these tiles split. References: the fp32
operation on the exactly widened operands (numpy fp32 arithmetic), libm's f64 exp rounded once to
fp32 after the fp32 affine step, bf16 by ml_dtypes' nearest-even rounding of the fp32 result,
register sums in free-index order with the first-NaN rule (test_act_simple_bits.row_sum)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from conftest import assert_bits_equal
from test_act_simple_bits import on_every_variant, row_sum
from trn3emu import _native

F32, F64, BF16 = np.float32, np.float64, ml_dtypes.bfloat16
P, N = 128, 600  # 1200-byte bf16 rows: long enough for the in-place split


@pytest.fixture(autouse=True)
def _restore():
    _native.set_min_parallel_work(1)  # split every instruction, however small, when threads > 1
    with np.errstate(all="ignore"):
        yield
    _native.set_min_parallel_work(0)
    t3.set_num_threads(0)
    _native.limit_simd(None)


def data(seed: int, parts: int = P) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """bf16 x and y with specials (NaN with a payload, infinities, signed zeros, subnormals) and
    an fp32 per-row column."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, (parts, N)).astype(BF16)
    y = rng.uniform(-3, 3, (parts, N)).astype(BF16)
    nan = np.array([0x7FC1, 0xFFA5], np.uint16).view(BF16)  # quiet NaNs with payloads
    x[5, :8] = [nan[0], np.inf, -np.inf, 0.0, -0.0, 1e-39, 3e38, nan[1]]
    y[5, :8] = [1.0, -np.inf, 2.0, 0.5, -0.0, 1e-39, 3e38, 1.0]
    c = rng.uniform(0.25, 2.0, (parts, 1)).astype(F32)
    return x, y, c


def f32(a: np.ndarray) -> np.ndarray:
    return a.astype(F32)


def assert_bf16_of(got: np.ndarray, fp32: np.ndarray) -> None:
    """got is fp32's nearest-even bf16 (NaN where fp32 is NaN; payloads compared across runs)."""
    nan = np.isnan(fp32)
    assert np.array_equal(np.isnan(got.astype(F32)), nan)
    assert_bits_equal(got[~nan], fp32[~nan].astype(BF16))


def elementwise(x, y, c, rounding: str = "rne") -> list[np.ndarray]:
    """bf16 tensor_tensor (out of place, in place, on GpSimd), mixed fp32/bf16 tensor_tensor into
    fp32 and bf16, bf16 tensor_scalar (column and immediate, in place too) and copies: bf16 SBUF
    to SBUF, SBUF to PSUM and back, fp32 PSUM to bf16 SBUF, on-chip DMAs (bf16, fp32 to bf16)."""
    dev = t3.Device(rounding=rounding, seed=5)
    p = t3.Program()

    def load(a, dtype=None):
        t = p.sbuf(a.shape, dtype or a.dtype)
        p.dma_copy(dst=t, src=dev.hbm.put(a))
        return t

    xt, yt, ct, x32 = load(x), load(y), load(c), load(f32(x))
    xin, xin2 = load(x), load(x)
    add, mx = p.sbuf((P, N), BF16), p.sbuf((P, N), BF16)
    p.tensor_tensor(dst=add, data1=xt, data2=yt, op="add")
    p.tensor_tensor(dst=mx, data1=xt, data2=yt, op="maximum", engine="gpsimd")
    p.tensor_tensor(dst=xin, data1=xin, data2=yt, op="multiply")  # in place
    mix_f, mix_b = p.sbuf((P, N), F32), p.sbuf((P, N), BF16)
    p.tensor_tensor(dst=mix_f, data1=x32, data2=yt, op="subtract")
    p.tensor_tensor(dst=mix_b, data1=x32, data2=yt, op="multiply")
    ts, ts_f = p.sbuf((P, N), BF16), p.sbuf((P, N), F32)
    p.tensor_scalar(dst=ts, data=xt, op0="multiply", operand0=ct, op1="add", operand1=0.375)
    p.tensor_scalar(dst=ts_f, data=xt, op0="subtract", operand0=1.5, reverse0=True, engine="gpsimd")
    p.tensor_scalar(dst=xin2, data=xin2, op0="multiply", operand0=ct)  # in place
    cp, ps = p.sbuf((P, N), BF16), p.psum((P, 512), BF16)
    p.tensor_copy(dst=cp, src=xt)
    p.tensor_copy(dst=ps, src=yt[:, :512])
    ps_sb = p.sbuf((P, 512), BF16)
    p.tensor_copy(dst=ps_sb, src=ps)  # (DMA does not read PSUM)
    ps32, back = p.psum((P, 512), F32), p.sbuf((P, 512), BF16)
    p.tensor_copy(dst=ps32, src=mix_f[:, :512])
    p.tensor_copy(dst=back, src=ps32)  # fp32 PSUM -> bf16 SBUF (a cast)
    dcp, dcast = p.sbuf((P, N), BF16), p.sbuf((P, N), BF16)
    p.dma_copy(dst=dcp, src=xt)  # on-chip DMAs: a byte copy and an fp32 -> bf16 cast
    p.dma_copy(dst=dcast, src=mix_f)
    outs = []
    for t in (add, mx, xin, mix_f, mix_b, ts, ts_f, xin2, cp, ps_sb, back, dcp, dcast):
        h = dev.hbm.alloc(t.shape, t.dtype)
        p.dma_copy(dst=h, src=t)
        outs.append(h)
    dev.run(p)
    return [dev.hbm.get(h) for h in outs]


def test_bf16_elementwise_and_copies_match_references_on_every_path_and_thread_count():
    x, y, c = data(1)
    xf, yf = f32(x), f32(y)
    sub = xf - yf

    def checked():
        got = elementwise(x, y, c)
        add, mx, xin, mix_f, mix_b, ts, ts_f, xin2, cp, ps, back, dcp, dcast = got
        assert_bf16_of(add, xf + yf)
        assert_bf16_of(mx, np.fmax(xf, yf))  # the non-NaN operand (docs/numerics.md)
        assert_bf16_of(xin, xf * yf)
        assert_bits_equal(mix_f[~np.isnan(sub)], sub[~np.isnan(sub)])
        assert np.array_equal(np.isnan(mix_f), np.isnan(sub))
        assert_bf16_of(mix_b, xf * yf)
        assert_bf16_of(ts, xf * c + F32(0.375))
        want_ts_f = F32(1.5) - xf
        assert_bits_equal(ts_f[~np.isnan(want_ts_f)], want_ts_f[~np.isnan(want_ts_f)])
        assert_bf16_of(xin2, xf * c)
        assert_bits_equal(cp, x)  # a copy keeps every bit, NaN payloads too
        assert_bits_equal(ps, y[:, :512])
        assert_bf16_of(back, sub[:, :512])
        assert_bits_equal(dcp, x)
        assert_bf16_of(dcast, sub)
        return got

    on_every_variant(checked)


def test_stochastic_rounding_of_split_elementwise_rows_does_not_depend_on_the_thread_count():
    x, y, c = data(2)
    xf, yf = f32(x), f32(y)

    def checked():
        got = elementwise(x, y, c, rounding="stochastic")
        for out, want in ((got[0], xf + yf), (got[5], xf * c + F32(0.375))):
            # each bf16 result is one of the two bf16 values around the fp32 result
            fin = np.isfinite(want) & (want != 0)
            lo = want.view(np.uint32) & np.uint32(0xFFFF0000)
            bits = out.astype(F32).view(np.uint32)
            assert ((bits == lo) | (bits == lo + np.uint32(0x10000)))[fin].all()
        return got

    on_every_variant(checked)


def bf16_activations(x, c, b, parts: int) -> list[np.ndarray]:
    """exp(x * c + b) of a bf16 source into bf16 and fp32, copy with scale in place, and
    activation_reduce exp into bf16 with the register sums."""
    dev = t3.Device(seed=3)
    p = t3.Program()
    tiles = []
    for a in (x, x, x, c, b):
        t = p.sbuf(a.shape, a.dtype)
        p.dma_copy(dst=t, src=dev.hbm.put(a))
        tiles.append(t)
    xt, xin, xr, ct, bt = tiles
    e_bf, e_f = p.sbuf((parts, N), BF16), p.sbuf((parts, N), F32)
    p.activation(dst=e_bf, op="exp", data=xt, scale=ct, bias=bt)
    p.activation(dst=e_f, op="exp", data=xt, scale=ct, bias=bt)
    p.activation(dst=xin, op="copy", data=xin, scale=ct, bias=bt)  # in place
    r_bf, sums = p.sbuf((parts, N), BF16), p.sbuf((parts, 1), F32)
    p.activation_reduce(dst=r_bf, op="exp", data=xr, reduce_op="add", reduce_res=sums, scale=ct, bias=bt)
    outs = []
    for t in (e_bf, e_f, xin, r_bf, sums):
        h = dev.hbm.alloc(t.shape, t.dtype)
        p.dma_copy(dst=h, src=t)
        outs.append(h)
    dev.run(p)
    return [dev.hbm.get(h) for h in outs]


# 120 and 40 rows end in a partial group of 16 register rows
@pytest.mark.parametrize("parts", [128, 120, 40])
def test_bf16_source_activations_split_with_the_same_bits(parts):
    x, _, c = data(parts, parts)
    b = np.random.default_rng(parts + 1).uniform(-0.5, 0.5, (parts, 1)).astype(F32)
    aff = (f32(x) * c).astype(F32) + b
    want = np.exp(aff.astype(F64)).astype(F32)

    def checked():
        got = bf16_activations(x, c, b, parts)
        e_bf, e_f, xin, r_bf, sums = got
        assert_bf16_of(e_bf, want)
        assert_bits_equal(e_f, want)  # NaN payloads too: the affine step quiets them alike
        assert_bf16_of(xin, aff)
        assert_bf16_of(r_bf, want)
        assert_bits_equal(sums[:, 0], row_sum(want))
        return got

    on_every_variant(checked)
