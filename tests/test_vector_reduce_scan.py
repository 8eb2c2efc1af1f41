"""VectorE reductions, scans and the VectorE accumulator registers: tensor_reduce,
tensor_scalar_reduce, tensor_tensor_scan, tensor_scalar_cumulative.

Reference (neuroncore-v4.md §1.7, §2.1, §2.6): arithmetic in fp32 with an RNE cast on write; the
accumulators are one fp32 per lane, driven by reduce_cmd (idle / reset / reduce / reset_reduce /
load_reduce). Hardware fold order is not public: the emulator folds left to right in free order,
so references below fold the same way (numpy fp32 ops, which are IEEE like the engines) or use
values whose sums are exact in any order.
"""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, Out, assert_bits_equal, param_id, random_bits, run_op
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

F32 = np.float32

NP = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.fmax,
    "minimum": np.fmin,
}
IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}


def ints_f32(rng, shape, lo=-8, hi=9, dtype=F32):
    """Small integer values: sums and products of a few stay exact in fp32 whatever the order."""
    return rng.integers(lo, hi, shape).astype(F32).astype(dtype)


def fold(x: np.ndarray, op: str) -> np.ndarray:
    """Left fold along the last axis in fp32, starting from the first element."""
    x = np.asarray(x, F32)
    acc = x[..., 0].copy()
    for j in range(1, x.shape[-1]):
        acc = NP[op](acc, x[..., j]).astype(F32)
    return acc


# ----------------------------------------------------------------------------- tensor_reduce
@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "maximum", "minimum"])
@pytest.mark.parametrize("dt", [F32, BF16, np.int16], ids=param_id)
def test_tensor_reduce_last_axis(dev, rng, op, dt):
    x = ints_f32(rng, (128, 12), -3, 4, dt) if op == "multiply" else ints_f32(rng, (128, 40), dtype=dt)

    def body(p, xt, out):
        p.tensor_reduce(dst=out, op=op, data=xt, axis=1)

    (got,) = run_op(dev, [x], [((128, 1), F32)], body)
    assert_bits_equal(got, fold(x.astype(F32), op)[:, None])


def test_tensor_reduce_random_add_is_a_left_fold(dev, rng):
    x = (rng.standard_normal((128, 300)) * 100).astype(F32)

    def body(p, xt, out):
        p.tensor_reduce(dst=out, op="add", data=xt, axis=[1])

    (got,) = run_op(dev, [x], [((128, 1), F32)], body)
    # np.cumsum accumulates sequentially in the array's dtype: its last column is the left fold.
    assert_bits_equal(got, np.cumsum(x, axis=1, dtype=F32)[:, -1:])


@pytest.mark.parametrize(
    "axis,kept_shape",
    [((3,), (32, 2, 3)), ((2, 3), (32, 2)), ((3, 2), (32, 2)), ((1, 2, 3), (32, 1))],
    ids=str,
)
def test_tensor_reduce_4d_axes(dev, rng, axis, kept_shape):
    x = ints_f32(rng, (32, 2, 3, 5))

    def body(p, xt, out):
        p.tensor_reduce(dst=out, op="add", data=xt, axis=axis)

    (got,) = run_op(dev, [x], [(kept_shape, F32)], body)
    want = x.sum(axis=tuple(sorted(axis))).astype(F32).reshape(kept_shape)
    assert_bits_equal(got, want)


def test_tensor_reduce_keepdims_and_negate(dev, rng):
    x = ints_f32(rng, (64, 4, 6))

    def body(p, xt, o1, o2):
        p.tensor_reduce(dst=o1, op="maximum", data=xt, axis=(2,), keepdims=True, negate=True)
        p.tensor_reduce(dst=o2, op="add", data=xt, axis=(1, 2), keepdims=True, negate=True)

    o1, o2 = run_op(dev, [x], [((64, 4, 1), F32), ((64, 1, 1), BF16)], body)
    assert_bits_equal(o1, -x.max(axis=2, keepdims=True))
    assert_bits_equal(o2, (-x.sum(axis=(1, 2), keepdims=True)).astype(F32).astype(BF16))


def test_hazard_tensor_reduce_axis_numbering(dev, rng):
    """nki-kernels §4.4 (0.3.0 fix): axis numbers count from the partition dim, so on (P, 4, 5)
    axis=2 is the last dim (5 elements), axis=(1, 2) both free dims; axis=1 alone is not a
    trailing axis (0.2 wrongly treated it as the last dim) and is rejected."""
    x = ints_f32(rng, (32, 4, 5))

    def body(p, xt, o1, o2):
        p.tensor_reduce(dst=o1, op="add", data=xt, axis=2)
        p.tensor_reduce(dst=o2, op="add", data=xt, axis=(1, 2))

    o1, o2 = run_op(dev, [x], [((32, 4), F32), ((32, 1), F32)], body)
    assert_bits_equal(o1, x.sum(axis=2))
    assert_bits_equal(o2, x.sum(axis=(1, 2))[:, None])
    with pytest.raises(t3.OperandError, match="trailing free axes"):
        run_op(dev, [x], [((32, 5), F32)], lambda p, xt, o: p.tensor_reduce(dst=o, op="add", data=xt, axis=1))


@pytest.mark.parametrize(
    "op,fn", [("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or), ("bitwise_xor", np.bitwise_xor)]
)
@pytest.mark.parametrize("dt", [np.int32, np.uint32, np.uint8, np.int16], ids=param_id)
def test_tensor_reduce_bitwise_raw_bits(dev, rng, op, fn, dt):
    x = random_bits(rng, (64, 2, 17), dt)

    def body(p, xt, out):
        p.tensor_reduce(dst=out, op=op, data=xt, axis=2)

    (got,) = run_op(dev, [x], [((64, 2), dt)], body)
    assert_bits_equal(got, fn.reduce(x, axis=2).astype(dt))


def test_tensor_reduce_logical_ops(dev, rng):
    x = rng.integers(0, 2, (32, 9)).astype(F32) * rng.choice([-2.0, 3.0], (32, 9)).astype(F32)

    def body(p, xt, a, o, xo):
        p.tensor_reduce(dst=a, op="logical_and", data=xt, axis=1)
        p.tensor_reduce(dst=o, op="logical_or", data=xt, axis=1)
        p.tensor_reduce(dst=xo, op="logical_xor", data=xt, axis=1)

    a, o, xo = run_op(dev, [x], [((32, 1), F32)] * 3, body)
    nz = x != 0
    assert_bits_equal(a, nz.all(axis=1, keepdims=True).astype(F32))
    assert_bits_equal(o, nz.any(axis=1, keepdims=True).astype(F32))
    assert_bits_equal(xo, (nz.sum(axis=1, keepdims=True) % 2).astype(F32))


@pytest.mark.parametrize("start", [0, 32, 64, 96])
def test_tensor_reduce_partial_partitions_and_psum(dev, rng, start):
    x = ints_f32(rng, (128, 2, 30))

    def body(p, xt, out):
        ps = p.psum((128, 2, 30), F32)
        p.tensor_copy(dst=ps[start : start + 32], src=xt[start : start + 32])
        p.tensor_reduce(dst=out[start : start + 32, 1:3], op="minimum", data=ps[start : start + 32], axis=2)

    (got,) = run_op(dev, [x], [Out((128, 4), F32, "psum", fill=99.0)], body)
    want = np.full((128, 4), 99.0, F32)
    want[start : start + 32, 1:3] = x[start : start + 32].min(axis=2)
    assert_bits_equal(got, want)


def test_tensor_reduce_strided_input(dev, rng):
    x = ints_f32(rng, (16, 8, 10))

    def body(p, xt, out):
        p.tensor_reduce(dst=out, op="add", data=xt[:, ::2, 1::3], axis=2)

    (got,) = run_op(dev, [x], [((16, 4), F32)], body)
    assert_bits_equal(got, x[:, ::2, 1::3].sum(axis=2))


@pytest.mark.parametrize(
    "kw,dst_shape,exc,msg",
    [
        ({"op": "add", "axis": 0}, (32, 1), t3.OperandError, "partition dim"),
        ({"op": "add", "axis": (1,)}, (32, 5), t3.OperandError, "trailing"),
        ({"op": "add", "axis": (1, 3)}, (32, 1), t3.OperandError, "trailing"),
        ({"op": "add", "axis": 2}, (32, 5), t3.ShapeError, "kept dims"),
        ({"op": "abs_max", "axis": 2}, (32, 4), t3.OperandError, "op must be one of"),
        ({"op": "divide", "axis": 2}, (32, 4), t3.OperandError, "op must be one of"),
        ({"op": "bitwise_or", "axis": 2}, (32, 4), t3.DtypeError, "integer dtypes"),
    ],
)
def test_tensor_reduce_invalid(dev, rng, kw, dst_shape, exc, msg):
    x = ints_f32(rng, (32, 4, 5))
    with pytest.raises(exc, match=msg):
        run_op(dev, [x], [(dst_shape, F32)], lambda p, xt, o: p.tensor_reduce(dst=o, data=xt, **kw))


def test_tensor_reduce_negate_bitwise_rejected(dev, rng):
    x = random_bits(rng, (32, 8), np.int32)
    with pytest.raises(t3.OperandError, match="negate"):
        run_op(
            dev,
            [x],
            [((32, 1), np.int32)],
            lambda p, xt, o: p.tensor_reduce(dst=o, op="bitwise_and", data=xt, axis=1, negate=True),
        )


# ---------------------------------------------------------------------- tensor_tensor_scan
def scan_ref(a, b, init, op0, op1, rev0=False, rev1=False):
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    r = np.broadcast_to(np.asarray(init, F32).reshape(-1), (a.shape[0],)).astype(F32)
    out = np.empty_like(a)
    for j in range(a.shape[1]):
        t = (NP[op0](r, a[:, j]) if rev0 else NP[op0](a[:, j], r)).astype(F32)
        r = (NP[op1](b[:, j], t) if rev1 else NP[op1](t, b[:, j])).astype(F32)
        out[:, j] = r
    return out


@pytest.mark.parametrize("init_form", ["scalar", "column"])
def test_tensor_tensor_scan_mamba_recurrence(dev, rng, init_form):
    a = rng.uniform(0.5, 1.0, (128, 64)).astype(F32)
    b = rng.standard_normal((128, 64)).astype(F32)
    init = rng.standard_normal((128, 1)).astype(F32)

    def body(p, at, bt, it, out):
        p.tensor_tensor_scan(
            dst=out, data0=at, data1=bt, initial=it if init_form == "column" else 0.75, op0="multiply", op1="add"
        )

    (got,) = run_op(dev, [a, b, init], [((128, 64), F32)], body)
    assert_bits_equal(got, scan_ref(a, b, init if init_form == "column" else 0.75, "multiply", "add"))


@pytest.mark.parametrize("rev0", [False, True])
@pytest.mark.parametrize("rev1", [False, True])
def test_tensor_tensor_scan_reverse_flags(dev, rng, rev0, rev1):
    a = rng.standard_normal((32, 20)).astype(BF16)
    b = rng.standard_normal((32, 20)).astype(F32)

    def body(p, at, bt, out):
        p.tensor_tensor_scan(
            dst=out, data0=at, data1=bt, initial=0.5, op0="subtract", op1="divide", reverse0=rev0, reverse1=rev1
        )

    (got,) = run_op(dev, [a, b], [((32, 20), F32)], body)
    assert_bits_equal(got, scan_ref(a.astype(F32), b, 0.5, "subtract", "divide", rev0, rev1))


def test_tensor_tensor_scan_multidim_bf16_out_partial_partitions(dev, rng):
    a = rng.uniform(-1, 1, (128, 3, 8)).astype(F32)
    b = rng.uniform(-1, 1, (128, 24)).astype(F32)

    def body(p, at, bt, out):
        p.tensor_tensor_scan(dst=out[64:96], data0=at[64:96], data1=bt[64:96], initial=0.0, op0="add", op1="maximum")

    (got,) = run_op(dev, [a, b], [Out((128, 3, 8), BF16, fill=0.0)], body)
    want = np.zeros((128, 3, 8), BF16)
    want[64:96] = scan_ref(a[64:96].reshape(32, 24), b[64:96], 0.0, "add", "maximum").reshape(32, 3, 8).astype(BF16)
    assert_bits_equal(got, want)


def test_tensor_tensor_scan_invalid(dev, rng):
    a = rng.standard_normal((32, 8)).astype(F32)
    with pytest.raises(t3.MemorySpaceError, match="PSUM"):

        def body(p, at, out):
            x, y = p.psum((32, 8), F32), p.psum((32, 8), F32)
            p.tensor_tensor_scan(dst=out, data0=x, data1=y, initial=0.0, op0="add", op1="add")

        run_op(dev, [a], [((32, 8), F32)], body)
    with pytest.raises(t3.OperandError, match="arithmetic"):
        run_op(
            dev,
            [a],
            [((32, 8), F32)],
            lambda p, at, o: p.tensor_tensor_scan(dst=o, data0=at, data1=at, initial=0.0, op0="bitwise_and", op1="add"),
        )
    with pytest.raises(t3.ShapeError):
        run_op(
            dev,
            [a],
            [((32, 9), F32)],
            lambda p, at, o: p.tensor_tensor_scan(dst=o, data0=at, data1=at, initial=0.0, op0="add", op1="add"),
        )


# ---------------------------------------------------------------- tensor_scalar_reduce
@pytest.mark.parametrize("rop", ["add", "multiply", "maximum", "minimum"])
@pytest.mark.parametrize("form", ["scalar", "column"])
def test_tensor_scalar_reduce_reset_reduce(dev, rng, rop, form):
    x = ints_f32(rng, (128, 3, 4), -2, 3)
    k = ints_f32(rng, (128, 1), 1, 3)

    def body(p, xt, kt, out, res):
        p.tensor_scalar_reduce(
            dst=out, data=xt, op0="multiply", operand0=kt if form == "column" else 2.0, reduce_op=rop, reduce_res=res
        )

    out, res = run_op(dev, [x, k], [((128, 3, 4), BF16), ((128, 1), F32)], body)
    kk = k[:, :, None] if form == "column" else F32(2.0)
    y = (x * kk).astype(F32)
    assert_bits_equal(out, y.astype(BF16))
    assert_bits_equal(res, fold(y.reshape(128, 12), rop)[:, None])


def test_tensor_scalar_reduce_commands_and_negate(dev, rng):
    x1, x2 = ints_f32(rng, (64, 10)), ints_f32(rng, (64, 10))
    init = ints_f32(rng, (64, 1))

    def body(p, a, b, it, o, r1, r2, r3, r4):
        # reset_reduce, then reduce continues without reading out, then a negated read-out.
        p.tensor_scalar_reduce(dst=o, data=a, op0="add", operand0=1.0, reduce_op="add", reduce_res=r1)
        p.tensor_scalar_reduce(dst=o, data=b, op0="add", operand0=0.0, reduce_op="add", reduce_cmd="reduce")
        p.tensor_scalar_reduce(
            dst=o,
            data=a,
            op0="abs",
            operand0=0.0,
            reduce_op="add",
            reduce_cmd="reduce",
            reduce_res=r2,
            reduce_res_negate=True,
        )
        # load_reduce from a (P,1) tile, and from a scalar; reset leaves the identity and no fold.
        p.tensor_scalar_reduce(
            dst=o,
            data=b,
            op0="maximum",
            operand0=0.0,
            reduce_op="maximum",
            reduce_cmd="load_reduce",
            reduce_init=it,
            reduce_res=r3,
        )
        p.tensor_scalar_reduce(
            dst=o, data=b, op0="add", operand0=0.0, reduce_op="minimum", reduce_cmd="reset", reduce_res=r4
        )

    o, r1, r2, r3, r4 = run_op(dev, [x1, x2, init], [((64, 10), F32)] + [((64, 1), F32)] * 4, body)
    s1 = (x1 + 1).sum(axis=1, keepdims=True)
    assert_bits_equal(r1, s1)
    assert_bits_equal(r2, -(s1 + x2.sum(axis=1, keepdims=True) + np.abs(x1).sum(axis=1, keepdims=True)))
    assert_bits_equal(r3, np.maximum(init, np.maximum(x2, 0).max(axis=1, keepdims=True)))
    assert_bits_equal(r4, np.full((64, 1), np.inf, F32))
    assert_bits_equal(o, x2)


def test_vector_accumulators_are_per_lane(dev, rng):
    """Each partition has its own register: reductions on partitions 32..63 leave 0..31 alone."""
    x = ints_f32(rng, (128, 8))

    def body(p, xt, o, res):
        p.tensor_scalar_reduce(dst=o[0:32], data=xt[0:32], op0="add", operand0=0.0, reduce_op="add")
        p.tensor_scalar_reduce(dst=o[32:64], data=xt[32:64], op0="add", operand0=100.0, reduce_op="add")
        p.tensor_scalar_reduce(
            dst=o[0:64],
            data=xt[0:64],
            op0="multiply",
            operand0=0.0,
            reduce_op="add",
            reduce_cmd="reduce",
            reduce_res=res[0:64],
        )

    _, res = run_op(dev, [x], [((128, 8), F32), Out((128, 1), F32, fill=-1.0)], body)
    want = np.full((128, 1), -1.0, F32)
    want[0:32] = x[0:32].sum(axis=1, keepdims=True)
    want[32:64] = (x[32:64] + 100).sum(axis=1, keepdims=True)
    assert_bits_equal(res, want)


def test_vector_accumulator_shared_across_instructions(dev, rng):
    """exponential, tensor_scalar_reduce, tensor_scalar_cumulative, select_reduce and range_select
    share one register per lane (reference §1.7)."""
    x = ints_f32(rng, (32, 6), -3, 4)
    pred = rng.integers(0, 2, (32, 6)).astype(np.uint8)
    b0, b1 = np.full((32, 1), 1.0, F32), np.full((32, 1), 4.0, F32)

    def body(p, xt, pt, bt0, bt1, o, r1, r2, r3, r4):
        p.exponential(dst=o, src=xt, reduce_cmd="reset_reduce")  # acc = sum exp(x)
        p.tensor_scalar_reduce(
            dst=o, data=xt, op0="add", operand0=0.0, reduce_op="add", reduce_cmd="reduce", reduce_res=r1
        )
        p.tensor_scalar_cumulative(dst=o, src=xt, op0="add", op1="add", imm0=0.0, reduce_cmd="reduce")
        p.tensor_scalar_reduce(
            dst=o, data=xt, op0="multiply", operand0=0.0, reduce_op="add", reduce_cmd="reduce", reduce_res=r2
        )
        p.select_reduce(dst=o, predicate=pt, on_true=xt, on_false=-100.0, reduce_cmd="reduce", reduce_res=r3)
        p.range_select(
            dst=o,
            on_true_tile=xt,
            comp_op0="greater_equal",
            comp_op1="less",
            bound0=bt0,
            bound1=bt1,
            reduce_cmd="reduce",
            reduce_res=r4,
        )

    out = run_op(dev, [x, pred, b0, b1], [((32, 6), F32)] + [((32, 1), F32)] * 4, body)
    _, r1, r2, r3, r4 = out
    # exp is not exact: compare the first read-out loosely, then follow the chain from it exactly.
    want1 = (np.exp(x.astype(np.float64)).sum(axis=1) + x.sum(axis=1))[:, None]
    np.testing.assert_allclose(r1, want1, rtol=1e-6)
    want2 = r1.copy()
    for j in range(6):
        want2 = (want2 + x[:, j : j + 1]).astype(F32)  # the cumulative scan adds every x onto acc
    assert_bits_equal(r2, want2)
    sel = np.where(pred != 0, x, F32(-100.0))
    want3 = np.maximum(want2, sel.max(axis=1, keepdims=True))
    assert_bits_equal(r3, want3)
    assert_bits_equal(r4, np.maximum(want3, x[:, 1:4].max(axis=1, keepdims=True)))


def test_tensor_scalar_reduce_invalid(dev, rng):
    x = ints_f32(rng, (32, 8))
    cases = [
        (dict(op0="add", operand0=1.0, reduce_op="subtract"), t3.OperandError, "reduce_op must be one of"),
        (dict(op0="bitwise_and", operand0=1.0, reduce_op="add"), t3.OperandError, "arithmetic"),
        (dict(op0="subtract", operand0=1.0, reduce_op="add", reverse0=True), t3.OperandError, "reverse0"),
    ]
    for kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            run_op(dev, [x], [((32, 8), F32)], lambda p, xt, o, kw=kw: p.tensor_scalar_reduce(dst=o, data=xt, **kw))
    with pytest.raises(t3.ShapeError, match="reduce_res"):
        run_op(
            dev,
            [x],
            [((32, 8), F32), ((32, 2), F32)],
            lambda p, xt, o, r: p.tensor_scalar_reduce(
                dst=o, data=xt, op0="add", operand0=0.0, reduce_op="add", reduce_res=r
            ),
        )


# ------------------------------------------------------------ tensor_scalar_cumulative
def cumulative_ref(x, op0, imm0, op1, start):
    x = np.asarray(x, F32)
    reg = np.broadcast_to(np.asarray(start, F32).reshape(-1), (x.shape[0],)).astype(F32)
    imm0 = np.asarray(imm0, F32).reshape(-1, 1) if np.ndim(imm0) else F32(imm0)
    y = NP[op0](x, imm0).astype(F32)
    out = np.empty_like(x)
    for j in range(x.shape[1]):
        reg = NP[op1](y[:, j], reg).astype(F32)
        out[:, j] = reg
    return out


@pytest.mark.parametrize("op1", ["add", "subtract", "multiply", "maximum", "minimum"])
@pytest.mark.parametrize("dt", [F32, BF16, np.int16, np.uint8], ids=param_id)
def test_tensor_scalar_cumulative_reset_reduce(dev, rng, op1, dt):
    lo, hi = (0, 4) if dt == np.uint8 else (-3, 4)
    x = ints_f32(rng, (128, 10), lo, hi, dt)

    def body(p, xt, out):
        p.tensor_scalar_cumulative(dst=out, src=xt, op0="add", op1=op1, imm0=1.0)

    (got,) = run_op(dev, [x], [((128, 10), F32)], body)
    assert_bits_equal(got, cumulative_ref(x.astype(F32), "add", 1.0, op1, IDENTITY[op1]))


def test_tensor_scalar_cumulative_load_and_continue(dev, rng):
    x = rng.standard_normal((32, 2, 8)).astype(F32)
    k = rng.standard_normal((32, 1)).astype(F32)
    init = rng.standard_normal((32, 1)).astype(F32)

    def body(p, xt, kt, it, o1, o2, o3):
        p.tensor_scalar_cumulative(
            dst=o1, src=xt, op0="multiply", op1="add", imm0=kt, imm1=it, reduce_cmd="load_reduce"
        )
        p.tensor_scalar_cumulative(dst=o2, src=xt, op0="subtract", op1="maximum", imm0=0.5, reduce_cmd="reduce")
        p.tensor_scalar_cumulative(dst=o3, src=xt, op0="add", op1="add", imm0=0.0, imm1=2.5, reduce_cmd="load_reduce")

    o1, o2, o3 = run_op(dev, [x, k, init], [((32, 2, 8), F32), ((32, 16), F32), ((32, 16), BF16)], body)
    flat = x.reshape(32, 16)
    w1 = cumulative_ref(flat, "multiply", k, "add", init)
    assert_bits_equal(o1, w1.reshape(32, 2, 8))
    w2 = cumulative_ref(flat, "subtract", 0.5, "maximum", w1[:, -1])
    assert_bits_equal(o2, w2)
    assert_bits_equal(o3, cumulative_ref(flat, "add", 0.0, "add", 2.5).astype(BF16))


@pytest.mark.parametrize("start", [32, 96])
def test_tensor_scalar_cumulative_partial_partitions(dev, rng, start):
    x = ints_f32(rng, (128, 12))

    def body(p, xt, out):
        p.tensor_scalar_cumulative(
            dst=out[start : start + 32, ::2], src=xt[start : start + 32, ::2], op0="add", op1="add", imm0=0.0
        )

    (got,) = run_op(dev, [x], [Out((128, 12), F32, fill=0.0)], body)
    want = np.zeros((128, 12), F32)
    want[start : start + 32, ::2] = np.cumsum(x[start : start + 32, ::2], axis=1)
    assert_bits_equal(got, want)


def test_tensor_scalar_cumulative_invalid(dev, rng):
    x = ints_f32(rng, (32, 8))
    cases = [
        (dict(op0="add", op1="divide", imm0=1.0), t3.OperandError, "op1 must be one of"),
        (dict(op0="add", op1="add", imm0=1.0, reduce_cmd="idle"), t3.OperandError, "reduce_cmd must be"),
        (dict(op0="add", op1="add", imm0=1.0, reduce_cmd="load_reduce"), t3.OperandError, "imm1"),
    ]
    for kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            run_op(dev, [x], [((32, 8), F32)], lambda p, xt, o, kw=kw: p.tensor_scalar_cumulative(dst=o, src=xt, **kw))
    with pytest.raises(t3.DtypeError):
        xi = x.astype(np.int32)
        run_op(
            dev,
            [xi],
            [((32, 8), np.int32)],
            lambda p, xt, o: p.tensor_scalar_cumulative(dst=o, src=xt, op0="add", op1="add", imm0=0.0),
        )


# ------------------------------------------------------------------ random shapes (property)
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    parts=st.sampled_from([1, 8, 32, 64, 128]),
    k=st.integers(0, 3),
    op=st.sampled_from(["add", "maximum", "minimum"]),
    seed=st.integers(0, 2**16),
)
def test_tensor_reduce_random_shapes_and_axes(dev, shape, parts, k, op, seed):
    rng = np.random.default_rng(seed)
    nd = len(shape)
    first = 1 + min(k, nd - 1)  # reduce axes first..nd
    x = ints_f32(rng, (parts, *shape))
    axes = list(range(first, nd + 1))
    kept = (parts, *shape[: first - 1]) if first > 1 else (parts, 1)

    def body(p, xt, out):
        p.tensor_reduce(dst=out, op=op, data=xt, axis=axes)

    (got,) = run_op(dev, [x], [(kept, F32)], body)
    fn = {"add": np.sum, "maximum": np.max, "minimum": np.min}[op]
    assert_bits_equal(got, fn(x, axis=tuple(axes)).astype(F32).reshape(kept))


def test_reduce_res_aliasing_dst_gets_the_accumulator(dev, rng):
    """reduce_res may alias dst (cf. the activation hazard, nki-kernels §4.4 0.6.0): the read-out is
    written after dst, so the aliased element holds the accumulator."""
    x = ints_f32(rng, (32, 8))

    def body(p, xt, out):
        p.tensor_scalar_reduce(dst=out, data=xt, op0="add", operand0=1.0, reduce_op="add", reduce_res=out[:, 7:8])

    (got,) = run_op(dev, [x], [((32, 8), F32)], body)
    want = x + F32(1)
    want[:, 7] = (x + 1).sum(axis=1)
    assert_bits_equal(got, want)
