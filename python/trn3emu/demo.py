"""The demo kernel: a tiled bf16 matmul followed by a GELU, assembled from Python, checked bit
for bit against numpy, with the trace summary. Run with `trn3emu demo`."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .device import Device
from .program import Program

BF16 = ml_dtypes.bfloat16


def build(dev: Device, a_t, b_t, out, m: int, k: int, n: int) -> Program:
    """out[m, n] = gelu(A @ B) with A given transposed (a_t = A^T, [K, M]) and B [K, N]."""
    p = Program()
    tk, tm, tn = 128, 128, 512
    for mi in range(m // tm):
        for ni in range(n // tn):
            acc = p.psum((tm, tn), np.float32, name=f"acc{mi}_{ni}")
            for ki in range(k // tk):
                at = p.sbuf((tk, tm), BF16, name="a")
                bt = p.sbuf((tk, tn), BF16, name="b")
                p.dma_copy(dst=at, src=a_t[ki * tk : (ki + 1) * tk, mi * tm : (mi + 1) * tm])
                p.dma_copy(dst=bt, src=b_t[ki * tk : (ki + 1) * tk, ni * tn : (ni + 1) * tn])
                p.nc_matmul(dst=acc, stationary=at, moving=bt)
                p.free(at)
                p.free(bt)
            res = p.sbuf((tm, tn), BF16, name="res")
            p.activation(dst=res, op="gelu", data=acc)
            p.dma_copy(dst=out[mi * tm : (mi + 1) * tm, ni * tn : (ni + 1) * tn], src=res)
            p.free(res)
            p.free(acc)
    return p


def reference(a_t: np.ndarray, b: np.ndarray) -> np.ndarray:
    """fp32 accumulation over K in partition order per 128-row tile, PSUM += per tile, exact GELU."""
    from math import erf, sqrt

    k = a_t.shape[0]
    ps = np.zeros((a_t.shape[1], b.shape[1]), np.float32)
    for k0 in range(0, k, 128):
        part = np.zeros_like(ps)
        for kk in range(k0, k0 + 128):
            part = (part + np.outer(a_t[kk].astype(np.float32), b[kk].astype(np.float32))).astype(np.float32)
        ps = (ps + part).astype(np.float32)
    x = ps.astype(np.float64)
    g = 0.5 * x * (1.0 + np.vectorize(erf)(x / sqrt(2.0)))
    return g.astype(np.float32).astype(BF16)


def main(m: int = 256, k: int = 512, n: int = 1024, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    a_t = (rng.standard_normal((k, m)) / 8).astype(BF16)
    b = (rng.standard_normal((k, n)) / 8).astype(BF16)
    dev = Device()
    at_h, b_h = dev.hbm.put(a_t, name="A^T"), dev.hbm.put(b, name="B")
    out = dev.hbm.alloc((m, n), BF16, name="out")
    p = build(dev, at_h, b_h, out, m, k, n)
    result = dev.run(p)
    y = dev.hbm.get(out)
    ref = reference(a_t, b)
    diff = y.astype(np.float32) - ref.astype(np.float32)
    ulps = np.abs(y.view(np.int16).astype(np.int32) - ref.view(np.int16).astype(np.int32))
    print(f"trn3emu demo: gelu(A @ B), A {m}x{k}, B {k}x{n}, bf16 in, fp32 PSUM, bf16 out")
    print(f"  {len(p)} instructions assembled; {result.executed} executed")
    print(f"  result[0, :6]    = {y[0, :6].astype(np.float32)}")
    print(f"  reference[0, :6] = {ref[0, :6].astype(np.float32)}")
    print(f"  max |diff| = {np.abs(diff).max():.3g}; elements off by >1 bf16 ulp: {(ulps > 1).sum()} of {y.size}")
    print()
    print(result.trace.summary())
    return 0 if (ulps <= 1).all() else 1
