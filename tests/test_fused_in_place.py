"""fp32 tensor_tensor / tensor_scalar whose destination is one of its inputs (the fused pass runs
in place on the destination row, reading each element before writing it), and ScalarE copy from
fp32 with the affine step folded into the decode: same bits as numpy's fp32 arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BF16, assert_bits_equal, run_op
from test_vector import NP_OPS, SCALAR_CASES, _scalar_reference, randn

F32 = np.float32
P, N = 128, 96
SPECIAL = [np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-40]


def _with_specials(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x[:6, 0] = SPECIAL
    x[0, : len(SPECIAL)] = SPECIAL
    return x


@pytest.mark.parametrize("op", list(NP_OPS))
@pytest.mark.parametrize("which", ["data1", "data2", "both"])
def test_tensor_tensor_fp32_in_place(dev, rng, op, which):
    a, b = _with_specials(randn(rng, (P, N), F32)), randn(rng, (P, N), F32)
    if op == "divide":
        b = np.where(np.abs(b) < 0.1, F32(0.5), b)

    def body(p, x, y, out):
        if which == "data1":
            p.tensor_tensor(dst=x, data1=x, data2=y, op=op)
        elif which == "data2":
            p.tensor_tensor(dst=y, data1=x, data2=y, op=op)
            x = y
        else:
            p.tensor_tensor(dst=x, data1=x, data2=x, op=op)
        p.tensor_copy(dst=out, src=x)

    (got,) = run_op(dev, [a, b], [((P, N), F32)], body)
    y = a if which == "both" else b
    with np.errstate(all="ignore"):
        want = NP_OPS[op](a, y).astype(F32)
    if op in ("maximum", "minimum"):  # signed zeros: compare values only
        np.testing.assert_array_equal(got, want)
    else:
        assert_bits_equal(got, want)


@pytest.mark.parametrize("case", SCALAR_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_tensor_scalar_fp32_in_place(dev, rng, case):
    op0, k0, r0, op1, k1, r1 = case
    x = _with_specials(randn(rng, (P, N), F32))
    x = np.where(np.abs(x) < 0.05, F32(0.25), x) if "divide" in (op0, op1) else x

    def body(p, xt, out):
        p.tensor_scalar(dst=xt, data=xt, op0=op0, operand0=k0, reverse0=r0, op1=op1, operand1=k1, reverse1=r1)
        p.tensor_copy(dst=out, src=xt)

    (got,) = run_op(dev, [x], [((P, N), F32)], body)
    with np.errstate(all="ignore"):
        want = _scalar_reference(x, op0, k0, r0, op1, k1, r1)
    assert_bits_equal(got, want)


def test_tensor_scalar_fp32_in_place_column_operand(dev, rng):
    """A (P, 1) operand tile: each row scaled by its own value, in place (flash attention's update)."""
    x = _with_specials(randn(rng, (P, N), F32))
    c = randn(rng, (P, 1), F32)

    def body(p, xt, ct, out):
        p.tensor_scalar(dst=xt, data=xt, op0="multiply", operand0=ct, op1="add", operand1=1.5)
        p.tensor_copy(dst=out, src=xt)

    (got,) = run_op(dev, [x, c], [((P, N), F32)], body)
    assert_bits_equal(got, (x * c + F32(1.5)).astype(F32))


@pytest.mark.parametrize("op", ["copy", "bypass"])
@pytest.mark.parametrize("scale,bias", [(1.0, None), (0.125, None), (1.0, 0.0), (2.0, -0.75)])
@pytest.mark.parametrize("out_dt", [BF16, F32], ids=["bf16", "f32"])
def test_activation_copy_from_fp32_affine(dev, rng, op, scale, bias, out_dt):
    """dst = fl32(fl32(x * scale) + bias) cast to dst: -0.0 comes out as +0.0 even with scale 1 and
    no bias (the bias 0 is added), NaN stays NaN."""
    x = _with_specials(randn(rng, (P, 64), F32))
    x[7, 0] = np.nan

    def body(p, xt, out):
        kw = {} if bias is None else {"bias": bias}
        p.activation(dst=out, op=op, data=xt, scale=scale, **kw)

    (got,) = run_op(dev, [x], [((P, 64), out_dt)], body)
    with np.errstate(all="ignore"):
        want = (x * F32(scale) + F32(0.0 if bias is None else bias)).astype(F32).astype(out_dt)
    assert np.isnan(got[7, 0].astype(F32))
    got, want = got.copy(), want.copy()
    got[7, 0] = want[7, 0] = 0
    assert_bits_equal(got, want)
