"""The four steps of the NKI matrix-multiplication tutorial, as kernels of our own with the same
loop structure (tiles per loop level, what is loaded where, how PSUM is evacuated) as the public
`nki-samples` tutorial (src/nki_samples/tutorials/matrix_multiplication): C[M, N] = A[M, K] @ B[K, N]
with A given transposed (lhsT [K, M]).

- `matmul_tiled`: per output tile, per K tile: load a 128 x 128 lhsT tile and a 128 x 512 rhs
  tile, one matmul accumulating into PSUM; evacuate, store.
- `matmul_hoisted`: the lhsT column of tiles is loaded once per M tile, the rhs column once per
  (M, N) tile.
- `matmul_blocked`: the free dimensions are blocked (2 M tiles x 2 N tiles share their loads).
- `matmul_optimized`: every dimension blocked; rhs / lhsT loaded as wide rows (BLOCK_N / BLOCK_M
  bytes per partition), partial sums accumulated in SBUF across K blocks, results coalesced into
  wide stores.

They use the direct forms: `nisa.dma_copy` into a fresh tile, `nisa.nc_matmul` into a PSUM tile
(accumulating after the first write), `nisa.tensor_copy` / `nisa.tensor_tensor` out of PSUM. The
published latencies at [4096, 8192] @ [8192, 8192] bf16 on one trn1 NeuronCore are what
`python -m trn3emu.calibration` compares them with (docs/cost-model.md, validation table).
Run: python -m trn3emu.examples.nki_matmul_tutorial
"""

import ml_dtypes
import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

BF16 = ml_dtypes.bfloat16
TK, TM, TN = 128, 128, 512  # pmax, gemm_stationary_fmax, gemm_moving_fmax


def _tile(shape, dtype, buffer=None):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf if buffer is None else buffer)


@nki.jit
def matmul_tiled(lhs_t, rhs):
    k, m = lhs_t.shape
    n = rhs.shape[1]
    out = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for mi in nl.affine_range(m // TM):
        for ni in nl.affine_range(n // TN):
            acc = _tile((TM, TN), nl.float32, nl.psum)
            for ki in nl.affine_range(k // TK):
                a = _tile((TK, TM), lhs_t.dtype)
                b = _tile((TK, TN), rhs.dtype)
                nisa.dma_copy(dst=a, src=lhs_t[ki * TK : (ki + 1) * TK, mi * TM : (mi + 1) * TM])
                nisa.dma_copy(dst=b, src=rhs[ki * TK : (ki + 1) * TK, ni * TN : (ni + 1) * TN])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            res = _tile((TM, TN), out.dtype)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[mi * TM : (mi + 1) * TM, ni * TN : (ni + 1) * TN], src=res)
    return out


@nki.jit
def matmul_hoisted(lhs_t, rhs):
    k, m = lhs_t.shape
    n = rhs.shape[1]
    out = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for mi in nl.affine_range(m // TM):
        a_col = []
        for ki in nl.affine_range(k // TK):
            a = _tile((TK, TM), lhs_t.dtype)
            nisa.dma_copy(dst=a, src=lhs_t[ki * TK : (ki + 1) * TK, mi * TM : (mi + 1) * TM])
            a_col.append(a)
        for ni in nl.affine_range(n // TN):
            b_col = []
            for ki in nl.affine_range(k // TK):
                b = _tile((TK, TN), rhs.dtype)
                nisa.dma_copy(dst=b, src=rhs[ki * TK : (ki + 1) * TK, ni * TN : (ni + 1) * TN])
                b_col.append(b)
            acc = _tile((TM, TN), nl.float32, nl.psum)
            for ki in nl.affine_range(k // TK):
                nisa.nc_matmul(dst=acc, stationary=a_col[ki], moving=b_col[ki])
            res = _tile((TM, TN), out.dtype)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[mi * TM : (mi + 1) * TM, ni * TN : (ni + 1) * TN], src=res)
    return out


@nki.jit
def matmul_blocked(lhs_t, rhs, bm_tiles=2, bn_tiles=2):
    k, m = lhs_t.shape
    n = rhs.shape[1]
    bm, bn = TM * bm_tiles, TN * bn_tiles
    out = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for mb in nl.affine_range(m // bm):
        a_blk = []
        for i in nl.affine_range(bm_tiles):
            col = []
            m0 = mb * bm + i * TM
            for ki in nl.affine_range(k // TK):
                a = _tile((TK, TM), lhs_t.dtype)
                nisa.dma_copy(dst=a, src=lhs_t[ki * TK : (ki + 1) * TK, m0 : m0 + TM])
                col.append(a)
            a_blk.append(col)
        for nb in nl.affine_range(n // bn):
            b_blk = []
            for j in nl.affine_range(bn_tiles):
                col = []
                n0 = nb * bn + j * TN
                for ki in nl.affine_range(k // TK):
                    b = _tile((TK, TN), rhs.dtype)
                    nisa.dma_copy(dst=b, src=rhs[ki * TK : (ki + 1) * TK, n0 : n0 + TN])
                    col.append(b)
                b_blk.append(col)
            for i in nl.affine_range(bm_tiles):
                for j in nl.affine_range(bn_tiles):
                    acc = _tile((TM, TN), nl.float32, nl.psum)
                    for ki in nl.affine_range(k // TK):
                        nisa.nc_matmul(dst=acc, stationary=a_blk[i][ki], moving=b_blk[j][ki])
                    res = _tile((TM, TN), out.dtype)
                    nisa.tensor_copy(dst=res, src=acc)
                    m0, n0 = mb * bm + i * TM, nb * bn + j * TN
                    nisa.dma_copy(dst=out[m0 : m0 + TM, n0 : n0 + TN], src=res)
    return out


def _load(src, k0: int, f0: int, width: int):
    """A [128, width] row block of `src` from row k0, column f0, in a fresh SBUF tile."""
    t = _tile((TK, width), src.dtype)
    nisa.dma_copy(dst=t, src=src[k0 : k0 + TK, f0 : f0 + width])
    return t


@nki.jit
def matmul_optimized(lhs_t, rhs, bm_tiles=16, bn_tiles=2, bk_tiles=8):
    k, m = lhs_t.shape
    n = rhs.shape[1]
    bm, bn, bk = TM * bm_tiles, TN * bn_tiles, TK * bk_tiles
    out = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for nb in nl.affine_range(n // bn):
        # Partial sums of this N block for every M tile, in SBUF, zeroed.
        parts = []
        for _mb in range(m // bm):
            rows = []
            for _i in range(bm_tiles):
                row = []
                for _j in range(bn_tiles):
                    t = _tile((TM, TN), lhs_t.dtype)
                    nisa.memset(dst=t, value=0.0)
                    row.append(t)
                rows.append(row)
            parts.append(rows)
        for kb in nl.sequential_range(k // bk):
            k0 = kb * bk
            # Each list is built while the previous block's is still alive, so block kb + 1 loads
            # into other buffers while block kb's matmuls run (double buffering).
            b_rows = [_load(rhs, k0 + kk * TK, nb * bn, bn) for kk in range(bk_tiles)]
            for mb in nl.affine_range(m // bm):
                a_rows = [_load(lhs_t, k0 + kk * TK, mb * bm, bm) for kk in range(bk_tiles)]
                for j in nl.affine_range(bn_tiles):
                    for i in nl.affine_range(bm_tiles):
                        acc = _tile((TM, TN), nl.float32, nl.psum)
                        for kk in nl.affine_range(bk_tiles):
                            nisa.nc_matmul(
                                dst=acc,
                                stationary=a_rows[kk][:, i * TM : (i + 1) * TM],
                                moving=b_rows[kk][:, j * TN : (j + 1) * TN],
                            )
                        p = parts[mb][i][j]
                        nisa.tensor_tensor(dst=p, data1=p, data2=acc, op=nl.add)
        for mb in nl.affine_range(m // bm):
            for i in nl.affine_range(bm_tiles):
                packed = _tile((TM, bn), nl.float32)
                for j in nl.affine_range(bn_tiles):
                    nisa.tensor_copy(dst=packed[:, j * TN : (j + 1) * TN], src=parts[mb][i][j])
                m0 = mb * bm + i * TM
                nisa.dma_copy(dst=out[m0 : m0 + TM, nb * bn : (nb + 1) * bn], src=packed)
    return out


KERNELS = {
    "tiled": matmul_tiled,
    "hoisted": matmul_hoisted,
    "blocked": matmul_blocked,
    "optimized": matmul_optimized,
}


def reference(lhs_t: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    return (lhs_t.astype(np.float32).T @ rhs.astype(np.float32)).astype(BF16)


def main(k: int = 1024, m: int = 2048, n: int = 2048) -> int:
    from trn3emu.testing import assert_close

    rng = np.random.default_rng(1)
    lhs_t = rng.standard_normal((k, m)).astype(BF16)
    rhs = rng.standard_normal((k, n)).astype(BF16)
    want = reference(lhs_t, rhs)
    for name, kern in KERNELS.items():
        out = kern(lhs_t, rhs)
        assert_close(out, want)
        print(f"{name:>9}: [{m}, {k}] @ [{k}, {n}] matches numpy; estimated {kern.last_result.time_ns / 1e3:,.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
