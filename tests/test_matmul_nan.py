"""nc_matmul NaN bits (issue 31, item 6): every NaN a matmul writes to PSUM is the positive quiet NaN
0x7FC00000 (bf16 PSUM: 0x7FC0), whichever operand's NaN (payload, sign) or Inf x 0 caused it, on every
SIMD path (docs/numerics.md). Before the rule the portable and AVX2+FMA paths returned different NaN
payloads and signs (e.g. 0x7fc10000 vs 0xffc30000) for the same inputs. Non-NaN outputs are checked
against an independent fp32 fma-chain reference (numpy float64 arithmetic, test_matmul.fma32)."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from test_matmul import ref_tile_sum_fp32
from trn3emu import _native

F32, U32 = np.float32, np.uint32
CANON = 0x7FC00000


@pytest.fixture(autouse=True)
def _restore_simd():
    yield
    _native.limit_simd(None)


def paths() -> list[str]:
    """Every SIMD path this host can run (the portable one always)."""
    out = []
    for p in ("avx512", "avx2+fma", "portable"):
        if _native.limit_simd(p):
            out.append(p)
    _native.limit_simd(None)
    return out


def nan_operands(rng, k: int, m: int, n: int):
    """fp32 operands with NaNs of random sign and payload, infinities and zeros (Inf x 0)."""
    a = rng.standard_normal((k, m)).astype(F32)
    b = rng.standard_normal((k, n)).astype(F32)
    for x in (a, b):
        bits = x.view(U32)
        sel = rng.random(x.shape) < 0.02
        payload = rng.integers(1, 1 << 22, size=x.shape, dtype=np.uint32)
        sign = rng.integers(0, 2, size=x.shape, dtype=np.uint32) << 31
        quiet = rng.integers(0, 2, size=x.shape, dtype=np.uint32) << 22
        bits[sel] = (sign | 0x7F800000 | quiet | payload)[sel]
        x[rng.random(x.shape) < 0.01] = np.inf
        x[rng.random(x.shape) < 0.01] = -np.inf
        x[rng.random(x.shape) < 0.03] = 0.0
    return a, b


def run_matmul(a, b, old, *, psum_dtype=F32, strided=False):
    """One matmul accumulating into a PSUM tile that first holds `old` (raw bits copied in)."""
    dev = t3.Device()
    k, m = a.shape
    n = b.shape[1]
    p = t3.Program()
    at, bt = p.sbuf((k, m), F32), p.sbuf((k, n), F32)
    p.dma_copy(dst=at, src=dev.hbm.put(a))
    p.dma_copy(dst=bt, src=dev.hbm.put(b))
    width = 2 * n if strided else n
    acc = p.psum((m, width), psum_dtype)
    seed = p.sbuf((m, width), psum_dtype)
    p.dma_copy(dst=seed, src=dev.hbm.put(old))
    p.tensor_copy(dst=acc, src=seed)  # same dtype: raw bits, NaN payloads kept
    dst = acc[:, ::2] if strided else acc
    p.nc_matmul(dst=dst, stationary=at, moving=bt, accumulate=True)
    res = p.sbuf((m, width), psum_dtype)
    p.tensor_copy(dst=res, src=acc)
    out = dev.hbm.alloc((m, width), psum_dtype)
    p.dma_copy(dst=out, src=res)
    dev.run(p)
    got = dev.hbm.get(out)
    return got[:, ::2] if strided else got


def old_psum(rng, m: int, n: int) -> np.ndarray:
    """PSUM contents with NaN payloads of both signs in a tenth of the elements."""
    old = rng.standard_normal((m, n)).astype(F32)
    bits = old.view(U32)
    sel = rng.random(old.shape) < 0.1
    bits[sel] = (0xFFC00000 | rng.integers(1, 1 << 22, size=old.shape, dtype=np.uint32))[sel]
    return old


def reference(a, b, old) -> np.ndarray:
    """fl32(old + fma-chain) with numpy; NaN positions are where any NaN arises."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (old + ref_tile_sum_fp32(a, b)).astype(F32)


@pytest.mark.parametrize(
    "shape",
    [(64, 40, 50), (128, 128, 512)],  # small (in place into PSUM), large (staged, threads)
    ids=["in_place", "staged"],
)
def test_matmul_nan_bits_are_canonical_on_every_simd_path(shape):
    k, m, n = shape
    rng = np.random.default_rng(31)
    a, b = nan_operands(rng, k, m, n)
    old = old_psum(rng, m, n)
    want = reference(a, b, old)
    nan = np.isnan(want)
    assert 0 < nan.sum() < nan.size  # the case has NaN and non-NaN outputs
    by_path = {}
    for path in paths():
        _native.limit_simd(path)
        got = run_matmul(a, b, old.copy())
        bits = got.view(U32)
        assert np.array_equal(np.isnan(got), nan), path
        bad = bits[nan] != CANON
        assert not bad.any(), f"{path}: {bad.sum()} NaN outputs not 0x7fc00000, e.g. {bits[nan][bad][:4]}"
        assert np.array_equal(bits[~nan], want.view(U32)[~nan]), path
        by_path[path] = bits
    first = next(iter(by_path.values()))
    assert all(np.array_equal(first, v) for v in by_path.values())


@pytest.mark.parametrize("layout", ["bf16", "strided"])
def test_matmul_nan_bits_in_staged_psum_layouts(layout):
    k, m, n = 32, 16, 24
    rng = np.random.default_rng(7)
    a, b = nan_operands(rng, k, m, n)
    if layout == "bf16":
        from ml_dtypes import bfloat16

        old = old_psum(rng, m, n).astype(bfloat16)
        old.view(np.uint16)[::3, ::5] = 0xFFC1  # bf16 NaN payloads
        got = None
        for path in paths():
            _native.limit_simd(path)
            g = run_matmul(a, b, old.copy(), psum_dtype=bfloat16).view(np.uint16)
            want_nan = np.isnan(reference(a, b, old.astype(F32)))
            assert np.array_equal(np.isnan(g.view(bfloat16).astype(F32)), want_nan), path
            assert (g[want_nan] == 0x7FC0).all(), path
            assert got is None or np.array_equal(got, g), path
            got = g
    else:
        old = old_psum(rng, m, 2 * n)
        want = reference(a, b, old[:, ::2])
        nan = np.isnan(want)
        for path in paths():
            _native.limit_simd(path)
            g = run_matmul(a, b, old.copy(), strided=True).view(U32)
            assert (g[nan] == CANON).all(), path
            assert np.array_equal(g[~nan], want.view(U32)[~nan]), path
