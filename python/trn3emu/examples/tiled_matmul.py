"""Tiled bf16 matmul on one NeuronCore, assembled directly from Python.

C[M, N] = A[M, K] @ B[K, N] with A supplied transposed (A^T is [K, M], the stationary layout).
Each 128 x 512 output tile accumulates K/128 matmuls in one PSUM bank; ScalarE/VectorE evacuate
PSUM to SBUF with a cast to bf16; DMAs move tiles between HBM and SBUF.
Run: python examples/tiled_matmul.py; timeline: trn3emu trace examples/tiled_matmul.py --out t.json --png t.png
"""

import ml_dtypes
import numpy as np

import trn3emu as t3

BF16 = ml_dtypes.bfloat16


def tiled_matmul(dev: t3.Device, a_t: t3.Tensor, b: t3.Tensor, c: t3.Tensor) -> t3.Program:
    k, m = a_t.shape
    n = b.shape[1]
    p = t3.Program()
    for mi in range(0, m, 128):
        for ni in range(0, n, 512):
            acc = p.psum((128, 512), np.float32)
            for ki in range(0, k, 128):
                at = p.sbuf((128, 128), BF16)
                bt = p.sbuf((128, 512), BF16)
                p.dma_copy(dst=at, src=a_t[ki : ki + 128, mi : mi + 128])
                p.dma_copy(dst=bt, src=b[ki : ki + 128, ni : ni + 512])
                p.nc_matmul(dst=acc, stationary=at, moving=bt)
                p.free(at)
                p.free(bt)
            out = p.sbuf((128, 512), BF16)
            p.tensor_copy(dst=out, src=acc)
            p.dma_copy(dst=c[mi : mi + 128, ni : ni + 512], src=out)
            p.free(out)
            p.free(acc)
    return p


def build(dev: t3.Device, m: int = 256, k: int = 512, n: int = 1024) -> t3.Program:
    """Inputs in `dev`'s HBM and the program: what `trn3emu trace examples/tiled_matmul.py` runs."""
    rng = np.random.default_rng(1)
    a_t = dev.hbm.put(rng.standard_normal((k, m)).astype(BF16))
    b = dev.hbm.put(rng.standard_normal((k, n)).astype(BF16))
    return tiled_matmul(dev, a_t, b, dev.hbm.alloc((m, n), BF16))


def main(m: int = 256, k: int = 512, n: int = 1024) -> float:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    dev = t3.Device()
    a_t = dev.hbm.put(np.ascontiguousarray(a.T))
    b_h = dev.hbm.put(b)
    c = dev.hbm.alloc((m, n), BF16)
    result = dev.run(tiled_matmul(dev, a_t, b_h, c))
    got = dev.hbm.get(c).astype(np.float32)
    want = a.astype(np.float32) @ b.astype(np.float32)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"{m}x{k} @ {k}x{n}: max error relative to max |C| = {err:.2e}; estimated {result.time_ns:,.0f} ns")
    print(result.trace.summary())
    return err


if __name__ == "__main__":
    main()
