"""VectorE selection, top-8 and shuffle instructions: tensor_copy_predicated, select_reduce,
range_select, max8, nc_find_index8, nc_match_replace8, nc_stream_shuffle.

Reference: neuroncore-v4.md §2.6; hazards from nki-kernels.md §4.4 are the `test_hazard_*` tests.
Selections and shuffles move bits, so every comparison here is exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, FP8_E4M3FN, Out, assert_bits_equal, param_id, random_bits, run_op

F32 = np.float32
FP32_MIN = F32(-3.4028235e38)


# -------------------------------------------------------------------- tensor_copy_predicated
@pytest.mark.parametrize("dt", [F32, BF16, np.int32, np.uint8, FP8_E4M3FN], ids=param_id)
@pytest.mark.parametrize("pdt", [np.uint8, np.uint16, np.uint32, np.bool_], ids=param_id)
def test_tensor_copy_predicated_tile_bit_exact(dev, rng, dt, pdt):
    src = random_bits(rng, (128, 40), dt)
    old = random_bits(rng, (128, 40), dt)
    pred = (rng.integers(0, 3, (128, 40)) * rng.integers(0, 2, (128, 40))).astype(pdt)

    def body(p, st, ot, pt, out):
        p.tensor_copy(dst=out, src=ot)
        p.tensor_copy_predicated(dst=out, src=st, predicate=pt)

    (got,) = run_op(dev, [src, old, pred], [((128, 40), dt)], body)
    assert_bits_equal(got, np.where(pred != 0, src, old))


@pytest.mark.parametrize(
    "value,dt", [(2.5, BF16), (-7, np.int16), (123456789, np.int32), (0xFFFFFFFF, np.uint32)], ids=str
)
def test_tensor_copy_predicated_scalar_src_and_reverse(dev, rng, value, dt):
    pred = rng.integers(0, 2, (32, 3, 7)).astype(np.uint8)

    def body(p, pt, out):
        p.tensor_copy_predicated(dst=out, src=value, predicate=pt, reverse_pred=True)

    (got,) = run_op(dev, [pred], [Out((32, 3, 7), dt, fill=1)], body)
    fill = np.array(value).astype(np.int64).astype(dt) if np.dtype(dt).kind in "iu" else np.array(value, F32).astype(dt)
    assert_bits_equal(got, np.where(pred == 0, fill, np.ones((), dt)).astype(dt))


def test_hazard_tensor_copy_predicated_mismatched_ranks(dev, rng):
    """nki-kernels §4.4 (0.6.0): operands with different ranks but equal free sizes work."""
    src = rng.standard_normal((64, 4, 8)).astype(F32)
    pred = rng.integers(0, 2, (64, 32)).astype(np.uint16)

    def body(p, st, pt, out):
        p.tensor_copy_predicated(dst=out, src=st, predicate=pt)

    (got,) = run_op(dev, [src, pred], [Out((64, 2, 16), F32, fill=0.0)], body)
    assert_bits_equal(got, np.where(pred != 0, src.reshape(64, 32), F32(0)).reshape(64, 2, 16))


@pytest.mark.parametrize("start", [0, 32, 64, 96])
def test_tensor_copy_predicated_partial_partitions_strided(dev, rng, start):
    src = rng.standard_normal((128, 20)).astype(F32)
    pred = rng.integers(0, 2, (128, 10)).astype(np.uint8)

    def body(p, st, pt, out):
        s = slice(start, start + 32)
        p.tensor_copy_predicated(dst=out[s, 1::2], src=st[s, ::2], predicate=pt[s])

    (got,) = run_op(dev, [src, pred], [Out((128, 20), F32, fill=-1.0)], body)
    want = np.full((128, 20), -1.0, F32)
    s = slice(start, start + 32)
    want[s, 1::2] = np.where(pred[s] != 0, src[s, ::2], F32(-1))
    assert_bits_equal(got, want)


def test_tensor_copy_predicated_invalid(dev, rng):
    x = rng.standard_normal((32, 8)).astype(F32)
    pr = np.ones((32, 8), np.uint8)
    with pytest.raises(t3.DtypeError, match="same dtype"):
        run_op(
            dev, [x, pr], [((32, 8), BF16)], lambda p, xt, pt, o: p.tensor_copy_predicated(dst=o, src=xt, predicate=pt)
        )
    with pytest.raises(t3.DtypeError):
        run_op(
            dev, [x, x], [((32, 8), F32)], lambda p, xt, pt, o: p.tensor_copy_predicated(dst=o, src=xt, predicate=pt)
        )

    def both_psum(p, xt, pt, o):
        a, b = p.psum((32, 8), F32), p.psum((32, 8), np.uint32)
        p.tensor_copy_predicated(dst=o, src=a, predicate=b)

    with pytest.raises(t3.MemorySpaceError, match="PSUM"):
        run_op(dev, [x, pr], [((32, 8), F32)], both_psum)


# ------------------------------------------------------------------------------ select_reduce
@pytest.mark.parametrize("pdt", [np.int8, np.uint8, np.int16, np.uint16], ids=param_id)
@pytest.mark.parametrize("form", ["scalar", "column"])
@pytest.mark.parametrize("rev", [False, True])
def test_select_reduce(dev, rng, pdt, form, rev):
    x = rng.standard_normal((128, 24)).astype(BF16)
    pred = (
        (rng.integers(-1, 2, (128, 24))).astype(pdt)
        if np.dtype(pdt).kind == "i"
        else rng.integers(0, 2, (128, 24)).astype(pdt)
    )
    f = rng.standard_normal((128, 1)).astype(F32)

    def body(p, xt, pt, ft, out, res):
        p.select_reduce(
            dst=out, predicate=pt, on_true=xt, on_false=ft if form == "column" else -0.5,
            reduce_cmd="reset_reduce", reduce_res=res, reverse_pred=rev,
        )  # fmt: skip

    out, res = run_op(dev, [x, pred, f], [((128, 24), F32), ((128, 1), F32)], body)
    fv = f if form == "column" else F32(-0.5)
    want = np.where((pred != 0) != rev, x.astype(F32), fv).astype(F32)
    assert_bits_equal(out, want)
    assert_bits_equal(res, want.max(axis=1, keepdims=True))


def test_hazard_select_reduce_mismatched_ranks(dev, rng):
    """nki-kernels §4.4 (0.6.0): select_reduce with different ranks but equal free sizes."""
    x = rng.standard_normal((32, 2, 3, 4)).astype(F32)
    pred = rng.integers(0, 2, (32, 24)).astype(np.uint8)

    def body(p, xt, pt, out):
        p.select_reduce(dst=out, predicate=pt, on_true=xt, on_false=0.0)

    (got,) = run_op(dev, [x, pred], [((32, 6, 4), BF16)], body)
    assert_bits_equal(got, np.where(pred != 0, x.reshape(32, 24), F32(0)).astype(BF16).reshape(32, 6, 4))


def test_select_reduce_idle_leaves_accumulator_and_partial_partitions(dev, rng):
    x = rng.standard_normal((128, 16)).astype(F32)
    pred = rng.integers(0, 2, (128, 16)).astype(np.uint8)

    def body(p, xt, pt, out, r1, r2):
        s = slice(64, 96)
        p.select_reduce(dst=out[s], predicate=pt[s], on_true=xt[s], on_false=-9.0, reduce_cmd="reset_reduce")
        p.select_reduce(dst=out[s], predicate=pt[s], on_true=xt[s], on_false=100.0, reduce_res=r1[s])  # idle
        p.select_reduce(dst=out[s], predicate=pt[s], on_true=xt[s], on_false=-9.0, reduce_cmd="reset", reduce_res=r2[s])

    out, r1, r2 = run_op(
        dev,
        [x, pred],
        [Out((128, 16), F32, fill=0.0), Out((128, 1), F32, fill=0.0), Out((128, 1), F32, fill=0.0)],
        body,
    )
    s = slice(64, 96)
    first = np.where(pred[s] != 0, x[s], F32(-9))
    want = np.zeros((128, 1), F32)
    want[s] = first.max(axis=1, keepdims=True)
    assert_bits_equal(r1, want)
    want2 = np.zeros((128, 1), F32)
    want2[s] = -np.inf
    assert_bits_equal(r2, want2)
    w = np.zeros((128, 16), F32)
    w[s] = first
    assert_bits_equal(out, w)


def test_select_reduce_invalid(dev, rng):
    x = rng.standard_normal((32, 8)).astype(F32)
    pr = np.ones((32, 8), np.uint8)
    with pytest.raises(t3.OperandError, match="reduce_op must be one of maximum"):
        run_op(
            dev,
            [x, pr],
            [((32, 8), F32)],
            lambda p, xt, pt, o: p.select_reduce(dst=o, predicate=pt, on_true=xt, on_false=0.0, reduce_op="add"),
        )
    with pytest.raises(t3.OperandError, match="load_reduce"):
        run_op(
            dev,
            [x, pr],
            [((32, 8), F32)],
            lambda p, xt, pt, o: p.select_reduce(
                dst=o, predicate=pt, on_true=xt, on_false=0.0, reduce_cmd="load_reduce"
            ),
        )
    with pytest.raises(t3.DtypeError):
        xi = x.astype(np.int32)
        run_op(
            dev,
            [xi, pr],
            [((32, 8), F32)],
            lambda p, xt, pt, o: p.select_reduce(dst=o, predicate=pt, on_true=xt, on_false=0.0),
        )


# ------------------------------------------------------------------------------- range_select
CMP = {
    "equal": np.equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
}


@pytest.mark.parametrize(
    "c0,c1", [("greater_equal", "less"), ("greater", "less_equal"), ("equal", "less_equal"), ("less", "greater")]
)
@pytest.mark.parametrize("start", [0, 5])
def test_range_select(dev, rng, c0, c1, start):
    x = rng.standard_normal((128, 2, 16)).astype(F32)
    lo = rng.integers(0, 20, (128, 1)).astype(F32)
    hi = (lo + rng.integers(0, 16, (128, 1))).astype(F32)

    def body(p, xt, lt, ht, out, res):
        p.range_select(
            dst=out, on_true_tile=xt, comp_op0=c0, comp_op1=c1, bound0=lt, bound1=ht, range_start=start, reduce_res=res
        )

    out, res = run_op(dev, [x, lo, hi], [((128, 2, 16), F32), ((128, 1), F32)], body)
    idx = (start + np.arange(32, dtype=np.float64)).astype(F32)[None, :]
    mask = CMP[c0](idx, lo) & CMP[c1](idx, hi)
    want = np.where(mask, x.reshape(128, 32), FP32_MIN)
    assert_bits_equal(out, want.reshape(128, 2, 16))
    assert_bits_equal(res, np.maximum(F32(-np.inf), want.max(axis=1, keepdims=True)))


@pytest.mark.parametrize("dt", [BF16, np.float16], ids=param_id)
def test_range_select_fill_becomes_minus_inf_in_narrow_dst(dev, rng, dt):
    x = rng.standard_normal((32, 10)).astype(dt)
    lo, hi = np.full((32, 1), 2.0, F32), np.full((32, 1), 5.0, F32)

    def body(p, xt, lt, ht, out):
        p.range_select(dst=out, on_true_tile=xt, comp_op0="greater_equal", comp_op1="less", bound0=lt, bound1=ht)

    (got,) = run_op(dev, [x, lo, hi], [((32, 10), dt)], body)
    want = np.full((32, 10), -np.inf, dt)
    want[:, 2:5] = x[:, 2:5]
    assert_bits_equal(got, want)


@pytest.mark.parametrize("fill", [-3.4028235e38, float("-inf")], ids=["FP32_MIN", "-inf"])
def test_hazard_range_select_python_float_on_false_value(dev, rng, fill):
    """nki-kernels §4.4 (0.6.0): a Python float on_false_value is accepted (FP32_MIN, or the -inf
    NKI defaults to); reduce into a running maximum across two calls (reset_reduce, reduce)."""
    x = rng.standard_normal((64, 12)).astype(F32)
    lo, hi = np.zeros((64, 1), F32), np.full((64, 1), 6.0, F32)

    def body(p, xt, lt, ht, out, res):
        p.range_select(
            dst=out,
            on_true_tile=xt,
            comp_op0="greater_equal",
            comp_op1="less",
            bound0=lt,
            bound1=ht,
            on_false_value=fill,
        )
        p.range_select(
            dst=out, on_true_tile=xt, comp_op0="greater_equal", comp_op1="less", bound0=ht, bound1=ht,
            on_false_value=fill, reduce_cmd="reduce", reduce_res=res,
        )  # fmt: skip

    out, res = run_op(dev, [x, lo, hi], [((64, 12), F32), ((64, 1), F32)], body)
    assert_bits_equal(out, np.full((64, 12), fill, F32))  # second call: empty range
    assert_bits_equal(res, x[:, :6].max(axis=1, keepdims=True))


def test_range_select_partial_partitions(dev, rng):
    x = rng.standard_normal((128, 8)).astype(F32)
    b = rng.integers(0, 8, (128, 1)).astype(F32)

    def body(p, xt, bt, out):
        p.range_select(
            dst=out[96:128],
            on_true_tile=xt[96:128],
            comp_op0="equal",
            comp_op1="equal",
            bound0=bt[96:128],
            bound1=bt[96:128],
        )

    (got,) = run_op(dev, [x, b], [Out((128, 8), F32, fill=0.0)], body)
    want = np.zeros((128, 8), F32)
    want[96:] = np.where(np.arange(8)[None, :] == b[96:], x[96:], FP32_MIN)
    assert_bits_equal(got, want)


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"on_false_value": 0.0}, "on_false_value must be"),
        ({"comp_op0": "not_equal"}, "comp_op0 must be one of"),
        ({"reduce_op": "minimum"}, "reduce_op must be one of maximum"),
        ({"reduce_cmd": "load_reduce"}, "load_reduce"),
        ({"range_start": 1 << 24}, "2\\^24"),
    ],
)
def test_range_select_invalid(dev, rng, kw, msg):
    x = rng.standard_normal((32, 8)).astype(F32)
    b = np.zeros((32, 1), F32)
    args = dict(comp_op0="greater_equal", comp_op1="less") | kw
    with pytest.raises(t3.OperandError, match=msg):
        run_op(
            dev,
            [x, b],
            [((32, 8), F32)],
            lambda p, xt, bt, o: p.range_select(dst=o, on_true_tile=xt, bound0=bt, bound1=bt, **args),
        )


# ----------------------------------------------------------------------------------- max8 etc.
@pytest.mark.parametrize("dt,shape", [(F32, (128, 500)), (BF16, (64, 4, 8, 4)), (np.int16, (32, 8))], ids=str)
def test_max8(dev, rng, dt, shape):
    x = (rng.standard_normal(shape) * 50).astype(F32).astype(dt)
    x.reshape(shape[0], -1)[:, 3] = x.reshape(shape[0], -1)[:, 5]  # duplicates are kept

    def body(p, xt, out):
        p.max8(dst=out, src=xt)

    (got,) = run_op(dev, [x], [((shape[0], 8), F32)], body)
    want = -np.sort(-x.reshape(shape[0], -1).astype(F32), axis=1)[:, :8]
    assert_bits_equal(got, want)


def test_max8_partial_partitions_bf16_out(dev, rng):
    x = rng.standard_normal((128, 64)).astype(F32)

    def body(p, xt, out):
        p.max8(dst=out[32:64], src=xt[32:64, ::2])

    (got,) = run_op(dev, [x], [Out((128, 8), BF16, fill=0.0)], body)
    want = np.zeros((128, 8), BF16)
    want[32:64] = (-np.sort(-x[32:64, ::2], axis=1)[:, :8]).astype(BF16)
    assert_bits_equal(got, want)


def test_max8_then_find_index8_topk_indices(dev, rng):
    x = rng.permutation(np.arange(128 * 100, dtype=F32)).reshape(128, 100)

    def body(p, xt, m, idx):
        p.max8(dst=m, src=xt)
        p.nc_find_index8(dst=idx, data=xt, vals=m)

    m, idx = run_op(dev, [x], [((128, 8), F32), ((128, 8), np.uint32)], body)
    want_idx = np.argsort(-x, axis=1, kind="stable")[:, :8].astype(np.uint32)
    assert_bits_equal(idx, want_idx)
    assert_bits_equal(m, np.take_along_axis(x, want_idx.astype(np.int64), axis=1))


@pytest.mark.parametrize("idt,ones", [(np.uint32, 0xFFFFFFFF), (np.uint16, 0xFFFF)], ids=param_id)
def test_hazard_find_index8_unmatched_all_ones_and_duplicates_advance(dev, idt, ones):
    """nki-kernels §4.4 (0.6.0): unmatched slots return all ones; duplicate search values take
    successive occurrences in ascending order."""
    data = np.array([[5, 7, 5, 9, 5, 7, 1, 2, 3, 4]] * 32, F32)
    vals = np.array([[5, 5, 7, 42, 5, 7, 5, 7]] * 32, F32)

    def body(p, dt, vt, out):
        p.nc_find_index8(dst=out, data=dt, vals=vt)

    (got,) = run_op(dev, [data, vals], [((32, 8), idt)], body)
    want = np.array([[0, 2, 1, ones, 4, 5, ones, ones]] * 32, idt)
    assert_bits_equal(got, want)


def test_hazard_match_replace8_iterates_in_reverse(dev):
    """nki-kernels §4.4 (0.6.0) and the API doc example: values are processed i = 7 -> 0, so
    duplicates take positions in descending column order."""
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]] * 16, F32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]] * 16, F32)

    def body(p, dt, vt, out, idx):
        p.nc_match_replace8(dst=out, data=dt, vals=vt, imm=-1.0, dst_idx=idx)

    out, idx = run_op(dev, [data, vals], [((16, 11), F32), ((16, 8), np.uint32)], body)
    assert_bits_equal(idx, np.array([[2, 10, 9, 8, 7, 6, 5, 4]] * 16, np.uint32))
    assert_bits_equal(out, np.array([[1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1]] * 16, F32))


def test_match_replace8_in_place_topk_masking_and_not_found(dev, rng):
    # distinct small integers per partition (exact in bf16)
    x = np.stack([rng.permutation(48) for _ in range(64)]).astype(F32).reshape(64, 3, 16).astype(BF16)

    def body(p, xt, out, m, idx):
        p.max8(dst=m, src=xt)
        p.memset(dst=m[:, 7:8], value=12345.0)  # not present -> no replacement, index all ones
        p.nc_match_replace8(dst=xt, data=xt, vals=m, imm=-1e9, dst_idx=idx)
        p.tensor_copy(dst=out, src=xt)

    out, m, idx = run_op(dev, [x], [((64, 3, 16), BF16), ((64, 8), F32), ((64, 8), np.uint16)], body)
    flat = x.reshape(64, 48).astype(F32)
    order = np.argsort(-flat, axis=1, kind="stable")[:, :7]
    want = flat.copy()
    np.put_along_axis(want, order, F32(-1e9), axis=1)
    assert_bits_equal(out, want.astype(BF16).reshape(64, 3, 16))
    want_idx = np.full((64, 8), 0xFFFF, np.uint16)
    want_idx[:, :7] = order
    assert_bits_equal(idx, want_idx)


def test_top8_family_invalid(dev, rng):
    x = rng.standard_normal((32, 7)).astype(F32)
    with pytest.raises(t3.ShapeError, match="8..=16384"):
        run_op(dev, [x], [((32, 8), F32)], lambda p, xt, o: p.max8(dst=o, src=xt))
    x = rng.standard_normal((32, 16)).astype(F32)
    with pytest.raises(t3.ShapeError, match="dst"):
        run_op(dev, [x], [((32, 4), F32)], lambda p, xt, o: p.max8(dst=o, src=xt))
    with pytest.raises(t3.DtypeError):
        run_op(dev, [x], [((32, 8), np.int32)], lambda p, xt, o: p.nc_find_index8(dst=o, data=xt, vals=xt[:, :8]))
    with pytest.raises(t3.ShapeError, match="vals"):
        run_op(dev, [x], [((32, 8), np.uint32)], lambda p, xt, o: p.nc_find_index8(dst=o, data=xt, vals=xt[:, :4]))


# ------------------------------------------------------------------------- nc_stream_shuffle
def test_nc_stream_shuffle_all_quadrants(dev, rng):
    x = random_bits(rng, (128, 24), F32)
    mask = rng.permutation(32).tolist()

    def body(p, xt, out):
        p.nc_stream_shuffle(dst=out, src=xt, shuffle_mask=mask)

    (got,) = run_op(dev, [x], [((128, 24), F32)], body)
    src_rows = np.array([q * 32 + mask[i] for q in range(4) for i in range(32)])
    assert_bits_equal(got, x[src_rows])


def test_hazard_nc_stream_shuffle_mask_255_keeps_dst(dev, rng):
    """nki-kernels §4.4 (0.4.0): a 255 mask entry leaves that dst partition unchanged."""
    x = random_bits(rng, (64, 10), BF16)
    old = random_bits(rng, (64, 10), BF16)
    mask = [255 if i % 3 == 0 else 31 - i for i in range(32)]

    def body(p, xt, ot, out):
        p.tensor_copy(dst=out, src=ot)
        p.nc_stream_shuffle(dst=out, src=xt, shuffle_mask=mask)

    (got,) = run_op(dev, [x, old], [((64, 10), BF16)], body)
    want = old.copy()
    for d in range(64):
        if mask[d % 32] != 255:
            want[d] = x[d // 32 * 32 + mask[d % 32]]
    assert_bits_equal(got, want)


@pytest.mark.parametrize("s_start,d_start", [(32, 96), (0, 64), (96, 0)])
def test_nc_stream_shuffle_32_partitions_across_quadrants(dev, rng, s_start, d_start):
    x = random_bits(rng, (128, 2, 6), np.int16)
    mask = [(i * 7) % 32 for i in range(32)]

    def body(p, xt, out):
        p.nc_stream_shuffle(dst=out[d_start : d_start + 32], src=xt[s_start : s_start + 32], shuffle_mask=mask)

    (got,) = run_op(dev, [x], [Out((128, 2, 6), np.int16, fill=0)], body)
    want = np.zeros((128, 2, 6), np.int16)
    want[d_start : d_start + 32] = x[s_start + np.array(mask)]
    assert_bits_equal(got, want)


def test_nc_stream_shuffle_in_place_psum(dev, rng):
    x = random_bits(rng, (64, 8), F32)
    mask = list(range(31, -1, -1))

    def body(p, xt, out):
        p.tensor_copy(dst=out, src=xt)
        p.nc_stream_shuffle(dst=out, src=out, shuffle_mask=mask)

    (got,) = run_op(dev, [x], [Out((64, 8), F32, "psum")], body)
    rows = np.array([q * 32 + 31 - i for q in range(2) for i in range(32)])
    assert_bits_equal(got, x[rows])


@pytest.mark.parametrize(
    "src_rows,dst_rows,mask,exc,msg",
    [
        ((0, 64), (32, 64), list(range(32)), t3.OperandError, "start partition"),  # 64 active -> 0 or 64
        ((0, 64), (0, 64), list(range(31)), t3.OperandError, "32 entries"),
        ((0, 32), (0, 32), [40] + list(range(1, 32)), t3.OperandError, "0..=31 or 255"),
        ((0, 16), (0, 32), list(range(32)), t3.ShapeError, "src has 16 partitions"),
    ],
)
def test_nc_stream_shuffle_invalid(dev, rng, src_rows, dst_rows, mask, exc, msg):
    x = random_bits(rng, (128, 4), F32)
    with pytest.raises(exc, match=msg):
        run_op(
            dev,
            [x],
            [((128, 4), F32)],
            lambda p, xt, o: p.nc_stream_shuffle(dst=o[slice(*dst_rows)], src=xt[slice(*src_rows)], shuffle_mask=mask),
        )
    with pytest.raises(t3.ShapeError, match="same dtype"):
        run_op(
            dev,
            [x],
            [((128, 4), BF16)],
            lambda p, xt, o: p.nc_stream_shuffle(dst=o, src=xt, shuffle_mask=list(range(32))),
        )


def test_psum_operands_and_fp8_inputs(dev, rng):
    """PSUM inputs/outputs (VectorE reaches both memories) and fp8 data through several instructions."""
    x = (rng.standard_normal((64, 16)) * 4).astype(FP8_E4M3FN)
    pred = rng.integers(0, 2, (64, 16)).astype(np.uint8)

    def body(p, xt, pt, o_max, o_sel, o_pred):
        xp = p.psum((64, 16), F32)
        p.tensor_copy(dst=xp, src=xt)
        p.max8(dst=o_max, src=xp)
        p.select_reduce(dst=o_sel, predicate=pt, on_true=xp, on_false=-1.0)
        p.tensor_copy_predicated(dst=o_pred, src=xt, predicate=pt)

    o_max, o_sel, o_pred = run_op(
        dev,
        [x, pred],
        [Out((64, 8), BF16, "psum"), Out((64, 16), F32, "psum"), Out((64, 16), FP8_E4M3FN, fill=0.0)],
        body,
    )
    xf = x.astype(F32)
    assert_bits_equal(o_max, (-np.sort(-xf, axis=1)[:, :8]).astype(BF16))
    assert_bits_equal(o_sel, np.where(pred != 0, xf, F32(-1)))
    assert_bits_equal(o_pred, np.where(pred != 0, x, np.zeros((), FP8_E4M3FN)))


@pytest.mark.parametrize(
    "name", ["tensor_copy_predicated", "nc_stream_shuffle", "max8", "tensor_reduce", "select_reduce"]
)
def test_packed_mx_dtypes_rejected(name):
    """x4-packed MX words are not elementwise data for these VectorE instructions."""
    p = t3.Program(sync="manual")
    w = p.sbuf((32, 8), "float8_e4m3fn_x4")
    f = p.sbuf((32, 8), F32)
    u = p.sbuf((32, 8), np.uint8)
    calls = {
        "tensor_copy_predicated": lambda: p.tensor_copy_predicated(dst=w, src=w, predicate=u),
        "nc_stream_shuffle": lambda: p.nc_stream_shuffle(dst=w, src=w, shuffle_mask=list(range(32))),
        "max8": lambda: p.max8(dst=f, src=w),
        "tensor_reduce": lambda: p.tensor_reduce(dst=f[:, 0:1], op="add", data=w, axis=1),
        "select_reduce": lambda: p.select_reduce(dst=f, predicate=u, on_true=w, on_false=0.0),
    }
    with pytest.raises(t3.DtypeError, match="float8_e4m3fn_x4"):
        calls[name]()
