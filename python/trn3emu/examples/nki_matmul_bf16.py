"""Tiled bf16 matmul in NKI: C[M, N] = A[M, K] @ B[K, N] with A given transposed (A^T [K, M]).

Each 128 x 512 output tile accumulates K/128 `nc_matmul`s into one fp32 PSUM bank (the first
write overwrites, the rest accumulate: accumulate=None), is evacuated to SBUF as bf16 by
`tensor_copy`, and stored.
Run: python examples/nki_matmul_bf16.py
"""

import ml_dtypes
import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

BF16 = ml_dtypes.bfloat16


@nki.jit
def matmul_bf16(lhs_t, rhs):
    k, m = lhs_t.shape
    _, n = rhs.shape
    tk, tm, tn = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    out = nl.ndarray((m, n), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    for mi in nl.affine_range(m // tm):
        for ni in nl.affine_range(n // tn):
            acc = nl.ndarray((tm, tn), dtype=nl.float32, buffer=nl.psum)
            for ki in nl.affine_range(k // tk):
                a = nl.ndarray((tk, tm), dtype=lhs_t.dtype, buffer=nl.sbuf)
                b = nl.ndarray((tk, tn), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhs_t[ki * tk : (ki + 1) * tk, mi * tm : (mi + 1) * tm])
                nisa.dma_copy(dst=b, src=rhs[ki * tk : (ki + 1) * tk, ni * tn : (ni + 1) * tn])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            res = nl.ndarray((tm, tn), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[mi * tm : (mi + 1) * tm, ni * tn : (ni + 1) * tn], src=res)
    return out


def reference(lhs_t: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    return (lhs_t.astype(np.float64).T @ rhs.astype(np.float64)).astype(np.float32).astype(BF16)


def main() -> int:
    from trn3emu.testing import assert_close

    rng = np.random.default_rng(1)
    lhs_t = rng.standard_normal((512, 256)).astype(BF16)
    rhs = rng.standard_normal((512, 1024)).astype(BF16)
    out = matmul_bf16(lhs_t, rhs)
    assert_close(out, reference(lhs_t, rhs))
    print(f"matmul_bf16 A^T {lhs_t.shape} x B {rhs.shape}: matches numpy within bf16 tolerance")
    print(matmul_bf16.last_result.trace.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
