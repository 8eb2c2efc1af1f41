"""One-pass fp32-source activations that run in place (AdamW's `sqrt` of its own tile) or write a
non-fp32 destination (bf16) split their rows over the host threads (engines/rows.rs
`fused_dense_par`, engines/act_fused.rs): each row is read, computed, rounded and written by one
thread with its row-major element index, so the bits, stochastic rounding included, do not
depend on the thread count or the SIMD path. The split threshold is forced down to 1 here so
that these small tiles split. References: the documented sqrt (numpy's exact fp32 sqrt inside its
range, NaN outside: test_act_simple_bits.reference), libm's f64 exp rounded
once, the fp32 affine step `x * scale + bias` (two roundings), bf16 by ml_dtypes' nearest-even
rounding of the fp32 result, register sums in free-index order with the first-NaN rule
(test_act_simple_bits.row_sum; a thread takes whole groups of 16 rows, whose chains advance
together)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from conftest import assert_bits_equal
from test_act_simple_bits import on_every_variant, row_sum
from test_act_simple_bits import reference as simple_ref
from trn3emu import _native

F32, F64, BF16 = np.float32, np.float64, ml_dtypes.bfloat16
P, N = 128, 300  # 1200-byte fp32 rows: long enough for the in-place one-pass path
W = 2048  # register-reduce rows: long enough that the second thread takes part


@pytest.fixture(autouse=True)
def _restore():
    _native.set_min_parallel_work(1)  # split every instruction, however small, when threads > 1
    with np.errstate(all="ignore"):
        yield
    _native.set_min_parallel_work(0)
    t3.set_num_threads(0)
    _native.limit_simd(None)


def run(x: np.ndarray, s: np.ndarray, b: np.ndarray, rounding: str = "rne") -> list[np.ndarray]:
    """In place: sqrt of x's tile, exp of an affine copy's tile, copy with scale and bias of a
    third; out of place into bf16: exp and sqrt with per-row scale and bias."""
    dev = t3.Device(rounding=rounding, seed=7)
    p = t3.Program()
    tiles = []
    for a in (x, x, x, s, b):
        t = p.sbuf(a.shape, F32)
        p.dma_copy(dst=t, src=dev.hbm.put(a))
        tiles.append(t)
    sq, ex, cp, st, bt = tiles
    e_bf, s_bf = p.sbuf((P, N), BF16), p.sbuf((P, N), BF16)
    p.activation(dst=e_bf, op="exp", data=ex, scale=st, bias=bt)
    p.activation(dst=s_bf, op="sqrt", data=sq, scale=st, bias=bt)
    p.activation(dst=sq, op="sqrt", data=sq)
    p.activation(dst=ex, op="exp", data=ex, scale=st, bias=bt)
    p.activation(dst=cp, op="copy", data=cp, scale=st, bias=bt)
    outs = []
    for t in (sq, ex, cp, e_bf, s_bf):
        h = dev.hbm.alloc(t.shape, t.dtype)
        p.dma_copy(dst=h, src=t)
        outs.append(h)
    dev.run(p)
    return [dev.hbm.get(h) for h in outs]


def data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 6, (P, N)).astype(F32)
    x[5, :6] = [np.inf, 0.0, -0.0, np.nan, 1e-40, 3.4e38]
    x[9, :2] = [-1.0, -np.inf]  # outside sqrt's range: NaN
    s = rng.uniform(0.1, 1.5, (P, 1)).astype(F32)
    b = rng.uniform(-0.5, 0.5, (P, 1)).astype(F32)
    return x, s, b


def assert_bf16_of(got: np.ndarray, fp32: np.ndarray) -> None:
    nan = np.isnan(fp32)
    assert np.array_equal(np.isnan(got.astype(F32)), nan)
    assert_bits_equal(got[~nan], fp32[~nan].astype(BF16))


def test_in_place_and_bf16_activations_match_references_on_every_path_and_thread_count():
    x, s, b = data(3)
    aff = (x * s).astype(F32) + b
    want_sqrt = simple_ref("sqrt", x * F32(1) + F32(0))  # the affine step quiets NaNs
    want_exp = np.exp(aff.astype(F64)).astype(F32)
    want_sqrt_aff = simple_ref("sqrt", aff)

    def checked():
        got = run(x, s, b)
        sq, ex, cp, e_bf, s_bf = got
        assert_bits_equal(sq, want_sqrt)  # NaN payloads too
        assert_bits_equal(ex, want_exp)
        assert_bits_equal(cp, aff)
        assert_bf16_of(e_bf, want_exp)
        assert_bf16_of(s_bf, want_sqrt_aff)
        return got

    on_every_variant(checked)


def test_stochastic_rounding_to_bf16_does_not_depend_on_the_thread_count():
    x, s, b = data(4)
    want_exp = np.exp(((x * s).astype(F32) + b).astype(F64)).astype(F32)

    def checked():
        got = run(x, s, b, rounding="stochastic")
        e_bf = got[3].astype(F32)
        # each bf16 result is one of the two bf16 values around the fp32 result
        fin = np.isfinite(want_exp) & (want_exp != 0)
        lo = want_exp.view(np.uint32) & np.uint32(0xFFFF0000)
        ok = (e_bf.view(np.uint32) == lo) | (e_bf.view(np.uint32) == lo + np.uint32(0x10000))
        assert ok[fin].all()
        return got

    on_every_variant(checked)


# 8 groups of 16 rows; 120 and 40 rows end in a partial group, and the thread team's batches
# (an eighth of the rows at 2 threads: 15 and 5) do not fall on group edges
@pytest.mark.parametrize("parts", [128, 120, 40])
@pytest.mark.parametrize("dst_dtype", [F32, BF16], ids=["fp32", "bf16"])
def test_register_reduce_rows_split_by_groups_with_the_same_bits(parts, dst_dtype):
    rng = np.random.default_rng(parts)
    x = rng.uniform(-4, 4, (parts, W)).astype(F32)
    x[3, 7] = np.nan
    x[20, :2] = [np.inf, -np.inf]  # exp: inf then 0 (a number sum: inf)
    s = rng.uniform(0.5, 1.5, (parts, 1)).astype(F32)
    b = rng.uniform(-0.5, 0.5, (parts, 1)).astype(F32)
    want = np.exp(((x * s).astype(F32) + b).astype(F64)).astype(F32)
    poison = rng.uniform(-4, 4, (parts, W)).astype(F32)  # other values in every per-thread buffer first

    def checked():
        reduce_exp(poison, s, b, dst_dtype)
        got = reduce_exp(x, s, b, dst_dtype)
        if dst_dtype is F32:
            assert_bits_equal(got[0], want)
        else:
            assert_bf16_of(got[0], want)
        assert_bits_equal(got[1][:, 0], row_sum(want))  # NaN payloads too
        return got

    on_every_variant(checked)


def reduce_exp(x: np.ndarray, s: np.ndarray, b: np.ndarray, dst_dtype) -> list[np.ndarray]:
    """activation_reduce exp(x * s + b) into dst_dtype with the register sums."""
    parts = x.shape[0]
    dev = t3.Device(seed=1)
    p = t3.Program()
    tiles = []
    for a in (x, s, b):
        t = p.sbuf(a.shape, F32)
        p.dma_copy(dst=t, src=dev.hbm.put(a))
        tiles.append(t)
    xt, st, bt = tiles
    o, r = p.sbuf((parts, W), dst_dtype), p.sbuf((parts, 1), F32)
    p.activation_reduce(dst=o, op="exp", data=xt, reduce_op="add", reduce_res=r, scale=st, bias=bt)
    hs = [dev.hbm.alloc(t.shape, t.dtype) for t in (o, r)]
    for h, t in zip(hs, (o, r)):
        p.dma_copy(dst=h, src=t)
    dev.run(p)
    return [dev.hbm.get(h) for h in hs]
