"""Cumulative sum along rows with the Vector engine's scan: r[i] = 1 * r[i-1] + x[i].

`tensor_tensor_scan(data0=ones, data1=x, initial=carry, op0=multiply, op1=add)` per 512-column
tile; the carry into the next tile is the previous tile's last column (a [P, 1] `tensor_copy`),
so the loop is sequential.
Run: python examples/nki_cumsum.py
"""

import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

TILE_F = 512


@nki.jit
def cumsum_rows(x):
    rows, cols = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ones = nl.full((128, TILE_F), 1.0, dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.affine_range(rows // 128):
        carry = nl.zeros((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        for j in nl.sequential_range(cols // TILE_F):
            xt = nl.load(x[i * 128 : (i + 1) * 128, j * TILE_F : (j + 1) * TILE_F])
            r = nl.ndarray((128, TILE_F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor_scan(dst=r, data0=ones, data1=xt, initial=carry, op0=nl.multiply, op1=nl.add)
            nisa.tensor_copy(dst=carry, src=r[:, TILE_F - 1 : TILE_F])
            res = nl.copy(r, dtype=x.dtype)
            nl.store(out[i * 128 : (i + 1) * 128, j * TILE_F : (j + 1) * TILE_F], res)
    return out


def reference(x: np.ndarray) -> np.ndarray:
    # Sequential fp32 accumulation, as the scan does.
    acc = np.zeros(x.shape[0], np.float32)
    out = np.empty(x.shape, np.float32)
    for c in range(x.shape[1]):
        acc = (acc + x[:, c].astype(np.float32)).astype(np.float32)
        out[:, c] = acc
    return out.astype(x.dtype)


def main() -> int:
    from trn3emu.testing import assert_close

    x = np.random.default_rng(6).standard_normal((128, 2048)).astype(np.float32)
    assert_close(cumsum_rows(x), reference(x), rtol=1e-6, atol=1e-6)
    print(f"cumsum {x.shape}: matches numpy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
