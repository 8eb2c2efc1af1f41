"""GpSimd instructions (reference neuroncore-v4.md §2.6-§2.7) against independent numpy references.

Covered: affine_select, tensor_partition_reduce, local_gather, nc_n_gather, sequence_bounds,
nonzero_with_count, topk, int32/uint32 tensor_tensor (exact, wrapping), power, tensor_scalar
rsqrt, the default-engine rule, and GpSimd's memory/dtype/shape rules. Everything here is exact
(bit patterns, integer math, one fp32 rounding of a float64 value) except `power`/`rsqrt`, which
are one rounding of the float64 value and are compared bit-exactly too where numpy's float64
result is the same correctly-rounded value (checked with a 1-ulp allowance, see `assert_1ulp`).
"""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, Out, assert_bits_equal, param_id, random_bits, run_op

F32 = np.float32


def assert_1ulp(got: np.ndarray, want64: np.ndarray) -> None:
    """got (fp32) is the float64 value rounded once: within 1 ulp of it (0 ulp almost always)."""
    want = want64.astype(F32)
    assert got.dtype == F32
    ulp = np.spacing(np.abs(want)).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - want64) <= ulp), np.max(np.abs(got - want))


def run_program(dev, build):
    """`build(p)` returns [(tile, hbm_handle)] to read back after the run."""
    p = t3.Program()
    outs = build(p)
    for tile, h in outs:
        p.dma_copy(dst=h, src=tile)
    dev.run(p)
    return [dev.hbm.get(h) for _, h in outs]


def load(dev, p, arr, tile=None):
    h = dev.hbm.put(np.asarray(arr))
    if tile is None:
        tile = p.sbuf(arr.shape, arr.dtype)
    p.dma_copy(dst=tile, src=h)
    return tile


# ----------------------------------------------------------------------------------- affine_select


def affine_value(P, pattern, offset, cm):
    """value[p, i...] = offset + p*cm + sum idx_k*step_k (int64 here; the inputs stay small)."""
    steps = [s for s, _ in pattern]
    nums = [n for _, n in pattern]
    grids = np.meshgrid(*[np.arange(n) for n in nums], indexing="ij")
    rel = sum(g * s for g, s in zip(grids, steps))
    return offset + np.arange(P).reshape((P,) + (1,) * len(nums)) * cm + rel[None]


CMP = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "greater_equal": np.greater_equal,
    "greater": np.greater,
    "less_equal": np.less_equal,
    "less": np.less,
}


@pytest.mark.parametrize("cmp", list(CMP))
def test_affine_select_causal_mask_every_cmp(dev, rng, cmp):
    P, F = 128, 96
    x = rng.standard_normal((P, F)).astype(F32)
    pattern = [[-1, F]]

    def body(p, xt, out):
        p.affine_select(
            dst=out, pattern=pattern, channel_multiplier=1, on_true_tile=xt, on_false_value=-9999.0, cmp_op=cmp
        )

    (got,) = run_op(dev, [x], [((P, F), F32)], body)
    val = affine_value(P, pattern, 0, 1)
    want = np.where(CMP[cmp](val, 0), x, F32(-9999.0)).astype(F32)
    assert_bits_equal(got, want)


def test_affine_select_multidim_pattern_offset_and_bit_exact_same_dtype(dev, rng):
    P = 64
    pattern = [[7, 4], [-3, 5], [1, 6]]
    x = random_bits(rng, (P, 4, 5, 6), BF16)  # every bf16 code, NaN payloads included

    def body(p, xt, out):
        p.affine_select(
            dst=out,
            pattern=pattern,
            channel_multiplier=-2,
            on_true_tile=xt,
            on_false_value=0.5,
            cmp_op="greater",
            offset=11,
        )

    (got,) = run_op(dev, [x], [((P, 4, 5, 6), BF16)], body)
    val = affine_value(P, pattern, 11, -2)
    want = np.where(val > 0, x, np.asarray(0.5, BF16)).astype(BF16)
    assert_bits_equal(got, want)


def test_affine_select_converts_through_fp32(dev, rng):
    P, F = 32, 40
    x = (rng.standard_normal((P, F)) * 100).astype(BF16)

    def body(p, xt, out):
        p.affine_select(dst=out, pattern=[[1, F]], channel_multiplier=-1, on_true_tile=xt, on_false_value=3.7)

    (got,) = run_op(dev, [x], [((P, F), np.int16)], body)
    val = affine_value(P, [[1, F]], 0, -1)
    conv = np.clip(np.rint(x.astype(F32)), -32768, 32767).astype(np.int16)  # RNE, saturating
    want = np.where(val == 0, conv, np.int16(4))
    assert_bits_equal(got, want)


def test_hazard_affine_select_python_float_on_false_value(dev, rng):
    """0.6 fix: a Python float on_false_value (here -FP32_MAX) is accepted and rounded to dst."""
    P, F = 16, 32
    x = rng.standard_normal((P, F)).astype(BF16)

    def body(p, xt, out):
        p.affine_select(
            dst=out,
            pattern=[[-1, F]],
            channel_multiplier=1,
            on_true_tile=xt,
            on_false_value=-3.4028234663852886e38,
            cmp_op="greater_equal",
        )

    (got,) = run_op(dev, [x], [((P, F), BF16)], body)
    fill = np.asarray(np.float32(-3.4028234663852886e38)).astype(BF16)  # ml_dtypes RNE: -inf
    want = np.where(affine_value(P, [[-1, F]], 0, 1) >= 0, x, fill).astype(BF16)
    assert_bits_equal(got, want)


def test_affine_select_partial_partitions_count_from_tile_start(dev, rng):
    F = 16
    x = rng.standard_normal((32, F)).astype(F32)

    def build(p):
        big = p.sbuf((128, F), F32)
        src = load(dev, p, x, big[32:64])
        out = p.sbuf((128, F), F32)
        p.memset(dst=out, value=5.0)
        p.affine_select(
            dst=out[64:96],
            pattern=[[-1, F]],
            channel_multiplier=1,
            on_true_tile=src,
            on_false_value=0.0,
            cmp_op="greater_equal",
        )
        return [(out, dev.hbm.alloc((128, F), F32))]

    (got,) = run_program(dev, build)
    want = np.full((128, F), 5.0, F32)
    want[64:96] = np.where(affine_value(32, [[-1, F]], 0, 1) >= 0, x, F32(0))
    assert_bits_equal(got, want)


def test_affine_select_in_place_and_over_an_overlapping_tile(dev, rng):
    """dst = on_true itself (the flash-attention mask: rows updated in memory), and dst a tile
    overlapping on_true 3 elements later in the same partitions (every element must come from
    on_true as it was before the instruction)."""
    P, F = 64, 40
    x = random_bits(rng, (P + 1, F + 3), F32)  # NaN payloads included: copied bit-exactly

    def in_place(p):
        t = load(dev, p, x[:P, :F])
        p.affine_select(
            dst=t,
            pattern=[[-1, F]],
            channel_multiplier=1,
            on_true_tile=t,
            on_false_value=-1.5,
            offset=2,
            cmp_op="greater_equal",
        )
        return [(t, dev.hbm.alloc((P, F), F32))]

    (got,) = run_program(dev, in_place)
    keep = affine_value(P, [[-1, F]], 2, 1) >= 0
    assert_bits_equal(got, np.where(keep, x[:P, :F], F32(-1.5)))

    def shifted(p):
        big = load(dev, p, x)
        src, dst = big[0:P, 0:F], big[0:P, 3 : F + 3]
        p.affine_select(
            dst=dst, pattern=[[1, F]], channel_multiplier=-1, on_true_tile=src, on_false_value=7.0, cmp_op="less"
        )
        return [(big, dev.hbm.alloc((P + 1, F + 3), F32))]

    (got,) = run_program(dev, shifted)
    want = x.copy()
    want[0:P, 3 : F + 3] = np.where(affine_value(P, [[1, F]], 0, -1) < 0, x[0:P, 0:F], F32(7.0))
    assert_bits_equal(got, want)


def test_affine_select_invalid(dev):
    p = t3.Program()
    a = p.sbuf((16, 8), F32)
    with pytest.raises(t3.OperandError, match="cmp_op"):
        p.affine_select(dst=a, pattern=[[1, 8]], channel_multiplier=0, on_true_tile=a, on_false_value=0.0, cmp_op="add")
    with pytest.raises(t3.ShapeError, match="pattern"):
        p.affine_select(dst=a, pattern=[[1, 9]], channel_multiplier=0, on_true_tile=a, on_false_value=0.0)
    ps = p.psum((16, 8), F32)
    with pytest.raises(t3.MemorySpaceError):
        p.affine_select(dst=ps, pattern=[[1, 8]], channel_multiplier=0, on_true_tile=a, on_false_value=0.0)


# ------------------------------------------------------------------------- tensor_partition_reduce


def seq_reduce(x, fn):
    acc = x[0].copy()
    for r in x[1:]:
        acc = fn(acc, r)
    return acc


@pytest.mark.parametrize("op", ["add", "average", "maximum"])
@pytest.mark.parametrize("P", [128, 48, 1])
def test_tensor_partition_reduce_arith(dev, rng, op, P):
    x = rng.standard_normal((P, 4, 8)).astype(F32)

    def body(p, xt, out):
        p.tensor_partition_reduce(dst=out, op=op, data=xt)

    (got,) = run_op(dev, [x], [((1, 4, 8), F32)], body)
    if op == "maximum":
        want = x.max(axis=0, keepdims=True)
    else:
        s = seq_reduce(x, lambda a, b: (a + b).astype(F32))  # fp32, partition order 0 -> P-1
        want = (s / F32(P)).astype(F32) if op == "average" else s
        want = want[None]
    assert_bits_equal(got, want.astype(F32))


@pytest.mark.parametrize("dt", [np.int32, np.uint16, np.uint8], ids=param_id)
@pytest.mark.parametrize("op", ["bitwise_or", "bitwise_and"])
def test_tensor_partition_reduce_bitwise_exact(dev, rng, op, dt):
    x = random_bits(rng, (32, 24), dt)
    if op == "bitwise_and":
        x = x | dt(np.iinfo(dt).max ^ 0x5)  # keep some bits set everywhere

    def body(p, xt, out):
        p.tensor_partition_reduce(dst=out, op=op, data=xt)

    (got,) = run_op(dev, [x], [((1, 24), dt)], body)
    fn = np.bitwise_or if op == "bitwise_or" else np.bitwise_and
    assert_bits_equal(got, fn.reduce(x, axis=0, keepdims=True).astype(dt))


def test_tensor_partition_reduce_bf16_out(dev, rng):
    x = rng.standard_normal((64, 33)).astype(BF16)

    def body(p, xt, out):
        p.tensor_partition_reduce(dst=out, op="add", data=xt)

    (got,) = run_op(dev, [x], [((1, 33), BF16)], body)
    s = seq_reduce(x.astype(F32), lambda a, b: (a + b).astype(F32))
    assert_bits_equal(got, s[None].astype(BF16))


def test_tensor_partition_reduce_invalid(dev):
    p = t3.Program()
    a = p.sbuf((32, 8), F32)
    two = p.sbuf((2, 8), F32)
    with pytest.raises(t3.ShapeError, match="1 partition"):
        p.tensor_partition_reduce(dst=two, op="add", data=a)
    one = p.sbuf((1, 8), F32)
    with pytest.raises(t3.OperandError, match="add, average, maximum"):
        p.tensor_partition_reduce(dst=one, op="subtract", data=a)
    with pytest.raises(t3.DtypeError, match="integer"):
        p.tensor_partition_reduce(dst=one, op="bitwise_or", data=a)
    with pytest.raises(t3.ShapeError):
        p.tensor_partition_reduce(dst=p.sbuf((1, 7), F32), op="add", data=a)
    with pytest.raises(t3.MemorySpaceError):
        p.tensor_partition_reduce(dst=one, op="add", data=p.psum((32, 8), F32))


# ------------------------------------------------------------------------------------ local_gather


def local_gather_ref(src, index, e, valid):
    """NKI semantics: per 16-partition group, indices flattened partition-first, runs of e elements."""
    P = src.shape[0]
    flat = src.reshape(P, -1)
    out = np.empty((P, valid, e), src.dtype)
    for g in range(P // 16):
        idx = index[16 * g : 16 * g + 16].flatten(order="F")[:valid].astype(np.int64)
        for j, i in enumerate(idx):
            out[16 * g : 16 * g + 16, j, :] = flat[16 * g : 16 * g + 16, i : i + e]
    return out


def test_local_gather_nki_example_shape(dev, rng):
    """(128, 512, 4) fp32 source, (128, 4) uint16 element offsets, 4 elements per index, 64 valid."""
    src = (rng.random((128, 512, 4)) * 100).astype(F32)
    per_core = rng.integers(0, 512, (16, 4)).astype(np.uint16)
    index = (np.tile(per_core, (8, 1)) * 4).astype(np.uint16)

    def body(p, st, it, out):
        p.local_gather(dst=out, src_buffer=st, index=it, num_elem_per_idx=4, num_valid_indices=64)

    (got,) = run_op(dev, [src, index], [((128, 4, 16, 4), F32)], body)
    want = local_gather_ref(src, index, 4, 64).reshape(128, 4, 16, 4)
    assert_bits_equal(got, want)


@pytest.mark.parametrize("e", [1, 2, 8, 32])
@pytest.mark.parametrize("dt", [BF16, np.int8, np.uint32], ids=param_id)
def test_local_gather_runs_and_dtypes(dev, rng, e, dt):
    P, S, K = 32, 96, 3
    src = random_bits(rng, (P, S), dt)
    index = rng.integers(0, S - e + 1, (P, K)).astype(np.uint16)  # different per group
    valid = 16 * K - 5

    def body(p, st, it, out):
        p.local_gather(dst=out, src_buffer=st, index=it, num_elem_per_idx=e, num_valid_indices=valid)

    (got,) = run_op(dev, [src, index], [((P, valid * e), dt)], body)
    assert_bits_equal(got, local_gather_ref(src, index, e, valid).reshape(P, valid * e))


def test_local_gather_default_num_valid_is_all(dev, rng):
    P, S, K = 16, 40, 2
    src = rng.standard_normal((P, S)).astype(F32)
    index = rng.integers(0, S, (P, K)).astype(np.uint16)

    def body(p, st, it, out):
        p.local_gather(dst=out, src_buffer=st, index=it)

    (got,) = run_op(dev, [src, index], [((P, 16 * K), F32)], body)
    assert_bits_equal(got, local_gather_ref(src, index, 1, 16 * K).reshape(P, 16 * K))


def test_hazard_local_gather_subview_dst(dev, rng):
    """0.4 fix: local_gather into a strided sub-view of a larger tile writes exactly that view."""
    P, S = 32, 64
    src = rng.standard_normal((P, S)).astype(F32)
    index = rng.integers(0, S - 2 + 1, (P, 2)).astype(np.uint16)
    valid, e = 20, 2

    def build(p):
        st = load(dev, p, src)
        it = load(dev, p, index)
        big = p.sbuf((P, 3, 2 * valid * e), F32)
        p.memset(dst=big, value=-1.0)
        view = big[:, 1, ::2]  # middle row, every other column: strides in the free dims
        p.local_gather(dst=view, src_buffer=st, index=it, num_elem_per_idx=e, num_valid_indices=valid)
        return [(big, dev.hbm.alloc(big.shape, F32))]

    (got,) = run_program(dev, build)
    want = np.full((P, 3, 2 * valid * e), -1.0, F32)
    want[:, 1, ::2] = local_gather_ref(src, index, e, valid).reshape(P, valid * e)
    assert_bits_equal(got, want)


def test_hazard_local_gather_num_elem_per_idx_honoured(dev, rng):
    """0.6 known simulator issue: num_elem_per_idx ignored. Here every run has all its elements."""
    P, S = 16, 64
    src = np.arange(P * S, dtype=F32).reshape(P, S)
    index = np.zeros((P, 1), np.uint16)
    index[:4, 0] = [0, 16, 32, 48]

    def body(p, st, it, out):
        p.local_gather(dst=out, src_buffer=st, index=it, num_elem_per_idx=16, num_valid_indices=4)

    (got,) = run_op(dev, [src, index], [((P, 64), F32)], body)
    assert_bits_equal(got, src)  # four runs of 16 from offsets 0, 16, 32, 48 = the whole row


def test_local_gather_invalid(dev):
    p = t3.Program()
    src = p.sbuf((32, 64), F32)
    idx = p.sbuf((32, 2), np.uint16)
    with pytest.raises(t3.OperandError, match="num_elem_per_idx"):
        p.local_gather(dst=p.sbuf((32, 96), F32), src_buffer=src, index=idx, num_elem_per_idx=3)
    with pytest.raises(t3.ShapeError, match="num_valid_indices"):
        p.local_gather(dst=p.sbuf((32, 33), F32), src_buffer=src, index=idx)
    with pytest.raises(t3.DtypeError):
        p.local_gather(dst=p.sbuf((32, 32), F32), src_buffer=src, index=p.sbuf((32, 2), np.uint32))
    with pytest.raises(t3.DtypeError, match="do not convert"):
        p.local_gather(dst=p.sbuf((32, 32), BF16), src_buffer=src, index=idx)
    with pytest.raises(t3.ShapeError, match="multiple of 16"):
        p.local_gather(dst=p.sbuf((8, 16), F32), src_buffer=p.sbuf((8, 64), F32), index=p.sbuf((8, 2), np.uint16))
    with pytest.raises(t3.OperandError, match="num_valid_indices"):
        p.local_gather(dst=p.sbuf((32, 40), F32), src_buffer=src, index=idx, num_valid_indices=40)


def test_local_gather_out_of_row_index_is_an_error(dev):
    src = np.zeros((16, 8), F32)
    index = np.zeros((16, 1), np.uint16)
    index[3, 0] = 7  # run of 2 from 7 passes the 8-element row

    def body(p, st, it, out):
        p.local_gather(dst=out, src_buffer=st, index=it, num_elem_per_idx=2)

    with pytest.raises(t3.AddressError, match="index"):
        run_op(dev, [src, index], [((16, 32), F32)], body)


# ------------------------------------------------------------------------------------- nc_n_gather


@pytest.mark.parametrize("dt", [F32, BF16, np.int8, np.uint16], ids=param_id)
def test_nc_n_gather(dev, rng, dt):
    P = 96
    data = random_bits(rng, (P, 4, 16), dt)  # free dims flattened: 64 per partition
    ind = rng.integers(0, 64, (P, 2, 50)).astype(np.uint32)

    def body(p, dt_, it, out):
        p.nc_n_gather(dst=out, data=dt_, indices=it)

    (got,) = run_op(dev, [data, ind], [((P, 100), dt)], body)
    flat = data.reshape(P, 64)
    want = np.take_along_axis(flat, ind.reshape(P, 100).astype(np.int64), axis=1)
    assert_bits_equal(got, want)


def test_nc_n_gather_invalid(dev):
    p = t3.Program()
    d = p.sbuf((16, 64), F32)
    with pytest.raises(t3.DtypeError):
        p.nc_n_gather(dst=p.sbuf((16, 8), F32), data=d, indices=p.sbuf((16, 8), np.int32))
    with pytest.raises(t3.DtypeError, match="do not convert"):
        p.nc_n_gather(dst=p.sbuf((16, 8), BF16), data=d, indices=p.sbuf((16, 8), np.uint32))
    with pytest.raises(t3.ShapeError):
        p.nc_n_gather(dst=p.sbuf((16, 9), F32), data=d, indices=p.sbuf((16, 8), np.uint32))
    data = np.zeros((16, 64), F32)
    ind = np.zeros((16, 8), np.uint32)
    ind[5, 3] = 64
    with pytest.raises(t3.AddressError, match="indices"):
        run_op(dev, [data, ind], [((16, 8), F32)], lambda p, a, b, o: p.nc_n_gather(dst=o, data=a, indices=b))


# --------------------------------------------------------------------------------- sequence_bounds


def seq_bounds_ref(ids):
    n = len(ids)
    starts, ends = np.full(n, n), np.full(n, -1)
    for i, v in enumerate(ids):
        if v != 0:
            s = i
            while s > 0 and ids[s - 1] == v:
                s -= 1
            e = i
            while e < n and ids[e] == v:
                e += 1
            starts[i], ends[i] = s, e
    return np.stack([starts, ends])[None]


@pytest.mark.parametrize("dt", [np.int32, F32], ids=param_id)
def test_sequence_bounds_doc_example(dev, dt):
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], dt)

    def body(p, it, out):
        p.sequence_bounds(dst=out, segment_ids=it)

    (got,) = run_op(dev, [ids], [((1, 2, 9), dt)], body)
    want = np.array([[[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]]], dt)
    assert_bits_equal(got, want)


def test_sequence_bounds_random_segments(dev, rng):
    lens = rng.integers(1, 9, 40)
    ids = np.concatenate([np.full(n, (k % 5)) for k, n in enumerate(lens)]).astype(np.int32)[None]

    def body(p, it, out):
        p.sequence_bounds(dst=out, segment_ids=it)

    n = ids.shape[1]
    (got,) = run_op(dev, [ids], [((1, 2, n), np.int32)], body)
    assert_bits_equal(got, seq_bounds_ref(ids[0]).astype(np.int32))


def test_sequence_bounds_invalid(dev):
    p = t3.Program()
    with pytest.raises(t3.ShapeError, match="one partition"):
        p.sequence_bounds(dst=p.sbuf((2, 2, 8), F32), segment_ids=p.sbuf((2, 8), F32))
    with pytest.raises(t3.ShapeError, match=r"\(1, 2, n\)"):
        p.sequence_bounds(dst=p.sbuf((1, 2, 7), F32), segment_ids=p.sbuf((1, 8), F32))
    with pytest.raises(t3.DtypeError):
        p.sequence_bounds(dst=p.sbuf((1, 2, 8), BF16), segment_ids=p.sbuf((1, 8), BF16))


# ------------------------------------------------------------------------------ nonzero_with_count


@pytest.mark.parametrize("dt", [F32, np.int32], ids=param_id)
def test_nonzero_with_count(dev, rng, dt):
    P, T = 128, 50
    x = rng.integers(-3, 4, (P, T)).astype(dt) * (rng.random((P, T)) < 0.4)
    x = x.astype(dt)
    if dt == F32:
        x[0, :3] = [-0.0, np.nan, 0.0]  # -0.0 is zero, NaN is nonzero
    off, pad = 1000, -7

    def body(p, xt, out):
        p.nonzero_with_count(dst=out, src=xt, index_offset=off, padding_val=pad)

    (got,) = run_op(dev, [x], [Out((P, T + 1), np.int32, fill=42)], body)
    want = np.full((P, T + 1), 42, np.int32)  # partitions other than 0, 16, ... untouched
    for q in range(0, P, 16):
        nzp = np.flatnonzero(x[q] != 0)
        want[q, : len(nzp)] = nzp + off
        want[q, len(nzp) : T] = pad
        want[q, T] = len(nzp)
    assert_bits_equal(got, want)


def test_nonzero_with_count_invalid(dev):
    p = t3.Program()
    with pytest.raises(t3.ShapeError, match="T \\+ 1"):
        p.nonzero_with_count(dst=p.sbuf((16, 8), np.int32), src=p.sbuf((16, 8), F32))
    with pytest.raises(t3.DtypeError):
        p.nonzero_with_count(dst=p.sbuf((16, 9), F32), src=p.sbuf((16, 8), F32))
    with pytest.raises(t3.DtypeError):
        p.nonzero_with_count(dst=p.sbuf((16, 9), np.int32), src=p.sbuf((16, 8), BF16))


# -------------------------------------------------------------------------------------------- topk


def topk_ref(vals, k):
    """K largest (ties: lower index first), emitted ascending by value then index."""
    order = sorted(range(len(vals)), key=lambda i: (-float(vals[i]), i))[:k]
    order = sorted(order, key=lambda i: (float(vals[i]), i))
    return np.array([vals[i] for i in order], vals.dtype), np.array(order, np.uint32)


@pytest.mark.parametrize(("P", "n", "k"), [(16, 100, 10), (32, 8, 8), (16, 1000, 1), (48, 333, 77)])
def test_topk_snake(dev, rng, P, n, k):
    cols = -(-n // 16) + 2
    src = rng.permutation(np.arange(P * cols)).reshape(P, cols).astype(F32).astype(BF16)  # distinct
    src = (src.astype(F32) - 200).astype(BF16)

    def body(p, st, vo, io):
        p.topk(val_dst=vo, idx_dst=io, src=st, n=n)

    got_v, got_i = run_op(dev, [src], [((P, k), BF16), ((P, k), np.uint32)], body)
    for g in range(P // 16):
        snake = np.array([src[16 * g + e % 16, e // 16] for e in range(n)], BF16)
        wv, wi = topk_ref(snake, k)
        for q in range(16 * g, 16 * g + 16):
            assert_bits_equal(got_v[q], wv)
            assert_bits_equal(got_i[q], wi)


def test_topk_ties_prefer_lower_index(dev):
    src = np.zeros((16, 2), BF16)
    src[:, 0] = 1.0  # elements 0..15 all 1.0; 16..31 all 0
    src[3, 1] = 2.0  # element 19

    def body(p, st, vo, io):
        p.topk(val_dst=vo, idx_dst=io, src=st, n=32)

    got_v, got_i = run_op(dev, [src], [((16, 4), BF16), ((16, 4), np.uint32)], body)
    assert_bits_equal(got_v[0], np.array([1, 1, 1, 2], BF16))
    assert_bits_equal(got_i[0], np.array([0, 1, 2, 19], np.uint32))


def test_topk_invalid(dev):
    p = t3.Program()
    src = p.sbuf((16, 8), BF16)
    with pytest.raises(t3.OperandError, match="n must be"):
        p.topk(val_dst=p.sbuf((16, 4), BF16), idx_dst=p.sbuf((16, 4), np.uint32), src=src, n=7)
    with pytest.raises(t3.ShapeError, match="<= n"):
        p.topk(val_dst=p.sbuf((16, 20), BF16), idx_dst=p.sbuf((16, 20), np.uint32), src=src, n=16)
    with pytest.raises(t3.ShapeError, match="ceil"):
        p.topk(val_dst=p.sbuf((16, 4), BF16), idx_dst=p.sbuf((16, 4), np.uint32), src=src, n=200)
    with pytest.raises(t3.ShapeError, match="multiple of 16"):
        p.topk(val_dst=p.sbuf((8, 4), BF16), idx_dst=p.sbuf((8, 4), np.uint32), src=p.sbuf((8, 8), BF16), n=64)
    with pytest.raises(t3.DtypeError):
        p.topk(val_dst=p.sbuf((16, 4), F32), idx_dst=p.sbuf((16, 4), np.uint32), src=src, n=64)


# --------------------------------------------------------------- int32 tensor_tensor, default engine

INT_OPS = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": lambda a, b: a == b,
    "not_equal": lambda a, b: a != b,
    "greater": lambda a, b: a > b,
    "greater_equal": lambda a, b: a >= b,
    "less": lambda a, b: a < b,
    "less_equal": lambda a, b: a <= b,
    "logical_and": lambda a, b: (a != 0) & (b != 0),
    "logical_or": lambda a, b: (a != 0) | (b != 0),
    "logical_xor": lambda a, b: (a != 0) ^ (b != 0),
}


@pytest.mark.parametrize("dt", [np.int32, np.uint32], ids=param_id)
@pytest.mark.parametrize("op", list(INT_OPS))
def test_int32_tensor_tensor_default_engine_is_exact_gpsimd(dev, rng, op, dt):
    P, F = 64, 48
    a = random_bits(rng, (P, F), dt)
    b = random_bits(rng, (P, F), dt)
    a[0, :4] = b[0, :4]  # some equal pairs
    b[1, :4] = 0
    prog = {}

    def body(p, at, bt, out):
        prog["i"] = p.tensor_tensor(dst=out, data1=at, data2=bt, op=op)  # engine not given
        prog["p"] = p

    (got,) = run_op(dev, [a, b], [((P, F), dt)], body)
    assert prog["p"].instruction(prog["i"]).startswith("tensor_tensor.gpsimd ")
    with np.errstate(over="ignore"):
        want = INT_OPS[op](a, b).astype(dt)  # numpy integer math wraps like the hardware
    assert_bits_equal(got, want)


def test_int32_abs_max_abs_min_exact(dev):
    a = np.array([[5, -7, 2**31 - 1, -(2**31), 3, -3]], np.int32)
    b = np.array([[-6, 7, -(2**31) + 1, 5, -3, 3]], np.int32)

    def body(p, at, bt, o1, o2):
        p.tensor_tensor(dst=o1, data1=at, data2=bt, op="abs_max")
        p.tensor_tensor(dst=o2, data1=at, data2=bt, op="abs_min")

    mx, mn = run_op(dev, [a, b], [((1, 6), np.int32), ((1, 6), np.int32)], body)
    # signed operand of larger / smaller magnitude, ties -> data2
    assert_bits_equal(mx, np.array([[-6, 7, -(2**31) + 1, -(2**31), -3, 3]], np.int32))
    assert_bits_equal(mn, np.array([[5, 7, -(2**31) + 1, 5, -3, 3]], np.int32))


def test_int32_tensor_tensor_with_psum_operand_defaults_to_vector_fp32(dev):
    """A PSUM operand forces VectorE, whose fp32 math is inexact above 2^24."""
    a = np.full((16, 4), 2**24 + 1, np.int32)
    b = np.ones((16, 4), np.int32)
    p = t3.Program()
    at = load(dev, p, a)
    bt = load(dev, p, b)
    ps = p.psum((16, 4), np.int32)
    p.tensor_copy(dst=ps, src=bt)
    out = p.sbuf((16, 4), np.int32)
    i = p.tensor_tensor(dst=out, data1=at, data2=ps, op="add")
    assert p.instruction(i).startswith("tensor_tensor.vector ")
    h = dev.hbm.alloc((16, 4), np.int32)
    p.dma_copy(dst=h, src=out)
    dev.run(p)
    # fp32: 2^24 + 1 -> 2^24 (RNE), + 1 -> 2^24 again
    assert_bits_equal(dev.hbm.get(h), np.full((16, 4), 2**24, np.int32))


def test_mixed_dtype_tensor_tensor_defaults_to_vector():
    p = t3.Program()
    i = p.tensor_tensor(
        dst=p.sbuf((16, 4), np.int32), data1=p.sbuf((16, 4), np.int32), data2=p.sbuf((16, 4), F32), op="add"
    )
    assert p.instruction(i).startswith("tensor_tensor.vector ")


def test_text_without_engine_uses_default_engine_rule():
    p = t3.Program()
    a = p.sbuf((16, 4), np.int32)
    i = p.tensor_tensor(dst=a, data1=a, data2=a, op="add", engine="vector")
    text = p.to_text().replace("tensor_tensor.vector", "tensor_tensor")
    q = t3.Program.from_text(text)
    assert q.instruction(i).startswith("tensor_tensor.gpsimd ")


def test_gpsimd_tensor_tensor_psum_refused():
    p = t3.Program()
    a = p.sbuf((16, 4), np.int32)
    with pytest.raises(t3.MemorySpaceError, match="gpsimd"):
        p.tensor_tensor(dst=a, data1=a, data2=p.psum((16, 4), np.int32), op="add", engine="gpsimd")


# ----------------------------------------------------------------------------------- power, rsqrt


def test_power_runs_on_gpsimd_by_default(dev, rng):
    P, F = 32, 64
    x = rng.uniform(0.1, 4.0, (P, F)).astype(F32)
    y = rng.uniform(-3.0, 3.0, (P, F)).astype(F32)
    seen = {}

    def body(p, xt, yt, out):
        seen["i"], seen["p"] = p.tensor_tensor(dst=out, data1=xt, data2=yt, op="power"), p

    (got,) = run_op(dev, [x, y], [((P, F), F32)], body)
    assert seen["p"].instruction(seen["i"]).startswith("tensor_tensor.gpsimd ")
    assert_1ulp(got, np.power(x.astype(np.float64), y.astype(np.float64)))


def test_power_on_vector_refused():
    p = t3.Program()
    a = p.sbuf((16, 4), F32)
    with pytest.raises(t3.OperandError, match="GpSimd"):
        p.tensor_tensor(dst=a, data1=a, data2=a, op="power", engine="vector")


@pytest.mark.parametrize("form", ["none", "column"])
def test_rsqrt_tensor_scalar_on_gpsimd(dev, rng, form):
    P = 64
    x = rng.uniform(1e-3, 1e3, (P, 3, 16)).astype(F32)
    col = rng.uniform(0.5, 2.0, (P, 1)).astype(F32)
    seen = {}

    def body(p, xt, ct, out):
        if form == "none":
            seen["i"] = p.tensor_scalar(dst=out, data=xt, op0="rsqrt")
        else:  # rsqrt then multiply by a (P,1) column
            seen["i"] = p.tensor_scalar(dst=out, data=xt, op0="rsqrt", op1="multiply", operand1=ct)
        seen["p"] = p

    (got,) = run_op(dev, [x, col], [((P, 3, 16), F32)], body)
    assert seen["p"].instruction(seen["i"]).startswith("tensor_scalar.gpsimd ")
    r = (1.0 / np.sqrt(x.astype(np.float64))).astype(F32)  # one rounding of the exact value
    want = r if form == "none" else (r * col[:, :, None]).astype(F32)
    assert_bits_equal(got, want)


def test_rsqrt_engine_rules(dev):
    p = t3.Program()
    a = p.sbuf((16, 4), F32)
    with pytest.raises(t3.OperandError, match="rsqrt runs on gpsimd / scalar"):
        p.tensor_scalar(dst=a, data=a, op0="rsqrt", engine="vector")
    with pytest.raises(t3.OperandError, match="reciprocal runs on vector / scalar"):
        p.tensor_scalar(dst=a, data=a, op0="reciprocal", engine="gpsimd")
    ps = p.psum((16, 4), F32)
    with pytest.raises(t3.MemorySpaceError):
        p.tensor_scalar(dst=ps, data=a, op0="rsqrt", engine="gpsimd")
    i = p.tensor_scalar(dst=ps, data=a, op0="rsqrt")  # PSUM operand: default goes to ScalarE
    assert p.instruction(i).startswith("tensor_scalar.scalar ")


# ------------------------------------------------------------------------- GpSimd never touches PSUM


@pytest.mark.parametrize(
    "case",
    ["iota", "memset", "tensor_copy", "affine_select", "tensor_partition_reduce", "nc_n_gather", "local_gather"],
)
def test_gpsimd_touching_psum_is_refused(case):
    p = t3.Program()
    ps = p.psum((16, 16), F32)
    sb = p.sbuf((16, 16), F32)
    calls = {
        "iota": lambda: p.iota(dst=ps, pattern=[[1, 16]]),
        "memset": lambda: p.memset(dst=ps, value=0.0, engine="gpsimd"),
        "tensor_copy": lambda: p.tensor_copy(dst=sb, src=ps, engine="gpsimd"),
        "affine_select": lambda: p.affine_select(
            dst=sb, pattern=[[1, 16]], channel_multiplier=0, on_true_tile=ps, on_false_value=0.0
        ),
        "tensor_partition_reduce": lambda: p.tensor_partition_reduce(dst=p.sbuf((1, 16), F32), op="add", data=ps),
        "nc_n_gather": lambda: p.nc_n_gather(dst=ps, data=sb, indices=p.sbuf((16, 16), np.uint32)),
        "local_gather": lambda: p.local_gather(dst=ps, src_buffer=sb, index=p.sbuf((16, 1), np.uint16)),
    }
    with pytest.raises(t3.MemorySpaceError, match="(?i)psum"):
        calls[case]()


def test_nonzero_with_count_partial_partitions_counted_from_tile_start(dev, rng):
    """A 64-partition tile at partition 64: its partitions 0, 16, 32, 48 (= 64, 80, 96, 112)."""
    T = 12
    x = (rng.random((64, T)) < 0.5).astype(F32) * rng.standard_normal((64, T)).astype(F32)

    def build(p):
        src = p.sbuf((128, T), F32)[64:128]
        p.dma_copy(dst=src, src=dev.hbm.put(x))
        out = p.sbuf((128, T + 1), np.int32)
        p.memset(dst=out, value=9)
        p.nonzero_with_count(dst=out[64:128], src=src)
        return [(out, dev.hbm.alloc((128, T + 1), np.int32))]

    (got,) = run_program(dev, build)
    want = np.full((128, T + 1), 9, np.int32)
    for q in range(0, 64, 16):
        nzp = np.flatnonzero(x[q] != 0)
        want[64 + q, : len(nzp)] = nzp
        want[64 + q, len(nzp) : T] = -1
        want[64 + q, T] = len(nzp)
    assert_bits_equal(got, want)


def test_int32_tensor_tensor_partial_partitions_strided(dev, rng):
    a = rng.integers(-(2**31), 2**31, (32, 4, 8), dtype=np.int64).astype(np.int32)
    b = rng.integers(-(2**31), 2**31, (32, 4, 8), dtype=np.int64).astype(np.int32)

    def build(p):
        at = p.sbuf((128, 4, 16), np.int32)[32:64, :, ::2]
        p.dma_copy(dst=at, src=dev.hbm.put(a))
        bt = p.sbuf((128, 4, 8), np.int32)[96:128]
        p.dma_copy(dst=bt, src=dev.hbm.put(b))
        out = p.sbuf((32, 4, 8), np.int32)
        p.tensor_tensor(dst=out, data1=at, data2=bt, op="multiply", engine="gpsimd")
        return [(out, dev.hbm.alloc((32, 4, 8), np.int32))]

    (got,) = run_program(dev, build)
    with np.errstate(over="ignore"):
        assert_bits_equal(got, (a * b).astype(np.int32))
