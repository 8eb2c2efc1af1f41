"""activation abs, relu, square, sqrt, reciprocal, rsqrt and log run in vectorised loops (engines/act_simple.rs)
that must give the bits of their documented f64 formulas rounded once (docs/numerics.md) on every SIMD path
and thread count, NaN payloads and signed zeros included. abs, relu, square, sqrt and reciprocal are exact
operations, so numpy's own fp32 calls are the reference; rsqrt is numpy's f64 1 / sqrt rounded once, log the
host libm's f64 log (Python's math.log) rounded once. Out of a function's documented range the result is the
canonical quiet NaN; a NaN input keeps its (quieted) payload. The fp32 affine step `x * scale + bias` comes first (two roundings, as numpy computes it here)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from conftest import assert_bits_equal, random_bits, run_op
from trn3emu import _native

F32, F64 = np.float32, np.float64
P = 128
NAN = np.uint32(0x7FC00000).view(F32)
RANGES = {
    "log": (2.0**-64, 2.0**64),
    "sqrt": (2.0**-116, 2.0**118),
    "rsqrt": (2.0**-87, 2.0**97),
    "reciprocal": (2.0**-42, 2.0**42),
}


@pytest.fixture(autouse=True)
def _restore():
    _native.set_min_parallel_work(1)  # split every instruction, however small, when threads > 1
    with np.errstate(all="ignore"):  # inf and NaN inputs on purpose
        yield
    _native.set_min_parallel_work(0)
    t3.set_num_threads(0)
    _native.limit_simd(None)


def variants() -> list[tuple[int, str | None]]:
    """(threads, SIMD path) pairs: 1 and 2 threads on the host's best path and every narrower one."""
    paths: list[str | None] = [None] + [p for p in ("avx2+fma", "portable") if p != t3.simd_path()]
    paths = [p for p in paths if p is None or _native.limit_simd(p)]
    _native.limit_simd(None)
    return [(t, p) for p in paths for t in (1, 2)]


def on_every_variant(run) -> None:
    """Calls `run()` (which checks its results against the references and returns them, a list of
    arrays) once per (threads, SIMD path) of `variants()`, with those set; every call's results
    must equal the first call's bits, NaN payloads too."""
    first = None
    for threads, path in variants():
        t3.set_num_threads(threads)
        _native.limit_simd(path)
        got = run()
        if first is None:
            first = got
        for g, w in zip(got, first):
            assert_bits_equal(g, w)


def reference(op: str, t: np.ndarray) -> np.ndarray:
    """The documented result for the fp32 pre-step values t."""
    t = np.asarray(t, F32)
    if op == "abs":
        return np.abs(t)
    if op == "relu":
        return np.where((t > 0) | np.isnan(t), t, F32(0))
    if op == "square":
        return np.square(t)
    lo, hi = (F32(v) for v in RANGES[op])
    v = np.abs(t) if op == "reciprocal" else t
    inside = ~((v < lo) | (v > hi))  # NaN is "inside": it propagates
    if op == "sqrt":
        got = np.sqrt(t)
    elif op == "reciprocal":
        got = np.reciprocal(t)
    elif op == "log":  # the host libm's f64 log (math.log), rounded once
        got = np.vectorize(math.log, otypes=[F64])(np.where(inside, t, F32(1)).astype(F64)).astype(F32)
    else:
        got = (1.0 / np.sqrt(t.astype(F64))).astype(F32)
    return np.where(inside, got, NAN)


def inputs(n: int, seed: int) -> np.ndarray:
    """[P, n] fp32: random bit patterns (NaN payloads, subnormals, infinities), normal values, both edges of
    every range densely, and the specials."""
    rng = np.random.default_rng(seed)
    edges = np.array([2.0**-116, 2.0**118, 2.0**-87, 2.0**97, 2.0**-42, 2.0**42, 2.0**-64, 2.0**64, 1.0], F32)
    edges = edges.view(np.int32)
    near = (edges[:, None] + np.arange(-40, 40, dtype=np.int32)).view(F32).ravel()
    specials = np.array(
        [0x7FA00001, 0xFFA00001, 0x7FC00001, 0xFFC12345, 0x7F800001, 1, 0x80000001, 0x007FFFFF, 0, 0x80000000]
        + [0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x3F800000],
        np.uint32,
    ).view(F32)
    parts = [
        random_bits(rng, (P * n // 2,), F32),
        (rng.standard_normal(P * n // 4) * 10).astype(F32),
        near,
        -near,
        specials,
    ]
    x = np.concatenate(parts)[: P * n]
    x = np.concatenate([x, rng.uniform(0, 4, P * n - x.size).astype(F32)])
    return rng.permutation(x).reshape(P, n)


def run(op: str, x, s, b):
    def body(p, xt, st, bt, o, o_aff, o_red, r_red, o_bf):
        p.activation(dst=o, op=op, data=xt)
        p.activation(dst=o_aff, op=op, data=xt, scale=st, bias=bt)
        p.activation_reduce(dst=o_red, op=op, data=xt, reduce_op="add", reduce_res=r_red, scale=0.5)
        p.activation(dst=o_bf, op=op, data=xt, scale=st, bias=bt)

    n = x.shape[1]
    outs = [((P, n), F32)] * 3 + [((P, 1), F32), ((P, n), ml_dtypes.bfloat16)]
    return run_op(t3.Device(), [x, s, b], outs, body)


def row_sum(v: np.ndarray) -> np.ndarray:
    """fp32 sum of each row in free-index order (the documented register order); a NaN sum is
    the first NaN its chain held (the documented rule: a row's first NaN input, quieted, or the
    NaN an inf - inf made), whichever payload the adder would return for two NaNs."""
    acc = np.zeros(v.shape[0], F32)
    with np.errstate(invalid="ignore"):
        for j in range(v.shape[1]):
            acc = np.where(np.isnan(acc), acc, (acc + v[:, j]).astype(F32))
    return acc


@pytest.mark.parametrize("op", ["abs", "relu", "square", "sqrt", "reciprocal", "rsqrt", "log"])
@pytest.mark.parametrize("n", [515, 7])  # dense rows (one pass per row) and short rows (batched)
def test_simple_functions_are_exact_on_every_path_and_thread_count(op, n):
    x = inputs(n, n)
    rng = np.random.default_rng(n + 1)
    s = rng.uniform(-2, 2, (P, 1)).astype(F32)
    b = rng.uniform(-3, 3, (P, 1)).astype(F32)
    plain = x * F32(1) + F32(0)  # the affine step quiets signalling NaNs
    affine = (x * s).astype(F32) + b
    half = x * F32(0.5) + F32(0)
    want_red = reference(op, half)
    first = None
    for threads, path in variants():
        t3.set_num_threads(threads)
        _native.limit_simd(path)
        o, o_aff, o_red, r_red, o_bf = run(op, x, s, b)
        assert_bits_equal(o, reference(op, plain))
        assert_bits_equal(o_aff, reference(op, affine))
        assert_bits_equal(o_red, want_red)
        assert_bits_equal(r_red[:, 0], row_sum(want_red))  # NaN payloads too (one rule, every path)
        bf = o_aff.astype(ml_dtypes.bfloat16)  # the fp32 results rounded to bf16 (nearest-even)
        nan = np.isnan(o_aff)
        assert np.array_equal(np.isnan(o_bf), nan)
        assert_bits_equal(o_bf[~nan], bf[~nan])
        if first is None:
            first = (o, o_aff, o_red, o_bf)
        for got, want in zip((o, o_aff, o_red, o_bf), first):
            assert_bits_equal(got, want)  # NaN payloads too


@pytest.mark.parametrize(
    "op,engine", [("rsqrt", "gpsimd"), ("rsqrt", "scalar"), ("reciprocal", "vector"), ("reciprocal", "scalar")]
)
@pytest.mark.parametrize("n", [515, 7])
def test_tensor_scalar_rsqrt_and_reciprocal_are_exact_on_every_path(op, engine, n):
    """tensor_scalar's unary rsqrt / reciprocal (no valid range: 1 / sqrt in f64 rounded once, fp32 1 / x on
    every input; the operand ignored), alone and followed by a multiply, in place too, against numpy's
    formulas bit for bit on every path and thread count (NaN payloads, zeros, negatives, subnormals)."""
    x = inputs(n, 10 + n)
    with np.errstate(all="ignore"):
        if op == "rsqrt":
            want = (1.0 / np.sqrt(x.astype(F64))).astype(F32)
        else:
            want = np.reciprocal(x)
    quiet = x.view(np.uint32) | np.where(np.isnan(x), np.uint32(0x400000), np.uint32(0))
    want = np.where(np.isnan(x), quiet.view(F32), want)  # a NaN input: its own payload, quieted

    def body(p, xt, o, o2, o3):
        p.tensor_scalar(dst=o, data=xt, op0=op, operand0=0.0, engine=engine)
        p.tensor_scalar(dst=o2, data=xt, op0=op, operand0=0.0, op1="multiply", operand1=2.0, engine=engine)
        p.tensor_copy(dst=o3, src=xt)
        p.tensor_scalar(dst=o3, data=o3, op0=op, operand0=0.0, engine=engine)

    for threads, path in variants():
        t3.set_num_threads(threads)
        _native.limit_simd(path)
        o, o2, o3 = run_op(t3.Device(), [x], [((P, n), F32)] * 3, body)
        assert_bits_equal(o, want)
        assert_bits_equal(o3, want)
        with np.errstate(all="ignore"):
            assert_bits_equal(o2[~np.isnan(o2)], (want * F32(2))[~np.isnan(o2)])
