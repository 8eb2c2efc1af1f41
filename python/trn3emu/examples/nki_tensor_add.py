"""Tiled tensor add written against the NKI 0.6 ISA API, run unchanged on trn3emu.

out = a + b for [M, N] tensors, M a multiple of 128 and N of 512: each 128 x 512 tile is
DMA'd into SBUF, added on the Vector engine and DMA'd back.
Run: python examples/nki_tensor_add.py
"""

import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

TILE_P, TILE_F = 128, 512


@nki.jit
def tensor_add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows, cols = a.shape
    for i in nl.affine_range(rows // TILE_P):
        for j in nl.affine_range(cols // TILE_F):
            rs = nl.ds(i * TILE_P, TILE_P)
            cs = nl.ds(j * TILE_F, TILE_F)
            x = nl.ndarray((TILE_P, TILE_F), dtype=a.dtype, buffer=nl.sbuf)
            y = nl.ndarray((TILE_P, TILE_F), dtype=b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=x, src=a[rs, cs])
            nisa.dma_copy(dst=y, src=b[rs, cs])
            z = nl.ndarray((TILE_P, TILE_F), dtype=a.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=z, data1=x, data2=y, op=nl.add)
            nisa.dma_copy(dst=out[rs, cs], src=z)
    return out


def main() -> int:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 1024)).astype(np.float16)
    b = rng.standard_normal((256, 1024)).astype(np.float16)
    out = tensor_add(a, b)
    ok = np.array_equal(out, (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16))
    print(f"tensor_add {a.shape} float16: {'exact' if ok else 'MISMATCH'}")
    print(tensor_add.last_result.trace.summary())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
