"""Embedding lookup and its gradient with DMA gather / scatter-add, assembled from Python.

out[t] = table[ids[t]] * scale for T tokens, in tiles of 128 tokens: each tile's ids go to SBUF,
one DMA gathers the 128 rows (`table.ap(..., vector_offset=ids)`), VectorE scales them, a DMA
writes them out. The gradient pass scatter-adds each tile into a gradient table with
`dma_compute` in read-add-write mode (`grad[ids[t]] += out[t]`; ids are unique within a tile).
Run: python examples/embedding_gather_scatter.py
"""

import numpy as np

import trn3emu as t3


def build(dev: t3.Device, table: t3.Tensor, ids: t3.Tensor, out: t3.Tensor, grad: t3.Tensor, scale: float):
    v, d = table.shape
    p = t3.Program()
    for t0 in range(0, ids.shape[0], 128):
        idx = p.sbuf((128, 1), np.int32)
        rows = p.sbuf((128, d), np.float32)
        p.dma_copy(dst=idx, src=ids[t0 : t0 + 128].reshape(128, 1))
        p.dma_copy(dst=rows, src=table.ap([[d, 128], [1, d]], vector_offset=idx), engine="gpsimd")
        p.tensor_scalar(dst=rows, data=rows, op0="multiply", operand0=scale)
        p.dma_copy(dst=out[t0 : t0 + 128], src=rows)
        g = grad.ap([[d, 128], [1, d]], vector_offset=idx)
        p.dma_compute(dst=g, src0=g, src1=rows, engine="gpsimd")
    return p


def main(vocab: int = 1000, dim: int = 64, tokens: int = 512, scale: float = 0.5) -> float:
    rng = np.random.default_rng(7)
    table = rng.standard_normal((vocab, dim)).astype(np.float32)
    ids = np.concatenate([rng.permutation(vocab)[:128] for _ in range(tokens // 128)]).astype(np.int32)
    dev = t3.Device()
    ht, hi = dev.hbm.put(table), dev.hbm.put(ids)
    out = dev.hbm.alloc((tokens, dim), np.float32)
    grad = dev.hbm.put(np.zeros((vocab, dim), np.float32))
    result = dev.run(build(dev, ht, hi, out, grad, scale))
    want = table[ids] * np.float32(scale)
    want_grad = np.zeros_like(table)
    for t in range(tokens):  # in token order, as the tiles are applied
        want_grad[ids[t]] += want[t]
    err = max(float(np.abs(dev.hbm.get(out) - want).max()), float(np.abs(dev.hbm.get(grad) - want_grad).max()))
    print(f"{tokens} lookups of a {vocab}x{dim} table: max abs error {err:.1e}; estimated {result.time_ns:,.0f} ns")
    return err


if __name__ == "__main__":
    main()
