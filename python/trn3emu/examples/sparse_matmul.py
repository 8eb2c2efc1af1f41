"""4:16 structured-sparse matmul on the Tensor engine against the dense kernel (NKI, bf16).

C[M, N] = W[K, M]^T @ B[K, N] where W keeps at most 4 non-zeros in every 16 contiguous rows of a
column. The dense kernel streams all K = 512 rows through four 128-row `nc_matmul`s per output
tile; the sparse kernel loads W compressed (`trn3emu.sparsity.compress`: 128 value rows plus
uint8 positions) and issues one `nc_matmul_sparse` per tile (`trn3emu.nki.sparse`, the emulator
extension: nki.isa has no sparse API). The moving operand B stays dense, laid out [128, 4, N].
Both results match numpy exactly (small-integer inputs); the trace summaries show the Tensor
engine's 4x shorter busy time and the dense-equivalent TFLOPS of the sparse matmuls.
Run: python examples/sparse_matmul.py
"""

import ml_dtypes
import numpy as np

import trn3emu.nki
from trn3emu import sparsity

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

import trn3emu.nki.sparse as nsp  # noqa: E402

BF16 = ml_dtypes.bfloat16
TN = 512  # output columns per PSUM bank (fp32)


@nki.jit
def dense_matmul(w, b):
    k, m = w.shape
    n = b.shape[1]
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    ws = []
    for ki in nl.static_range(k // 128):
        wt = nl.ndarray((128, m), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=wt, src=w[ki * 128 : (ki + 1) * 128, :])
        ws.append(wt)
    for ni in nl.affine_range(n // TN):
        acc = nl.ndarray((m, TN), dtype=nl.float32, buffer=nl.psum)
        for ki in nl.static_range(k // 128):
            bt = nl.ndarray((128, TN), dtype=b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=bt, src=b[ki * 128 : (ki + 1) * 128, ni * TN : (ni + 1) * TN])
            nisa.nc_matmul(dst=acc, stationary=ws[ki], moving=bt)
        res = nl.ndarray((m, TN), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out[:, ni * TN : (ni + 1) * TN], src=res)
    return out


@nki.jit
def sparse_matmul(values, index, moving):
    """values, index: [128, M] (4:16 compressed W); moving: B laid out [128, 4, N]."""
    kc, m = values.shape
    r, n = moving.shape[1], moving.shape[2]
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    v = nl.ndarray((kc, m), dtype=values.dtype, buffer=nl.sbuf)
    ix = nl.ndarray((kc, m), dtype=index.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=v, src=values)
    nisa.dma_copy(dst=ix, src=index)
    for ni in nl.affine_range(n // TN):
        bt = nl.ndarray((kc, r, TN), dtype=moving.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=bt, src=moving[:, :, ni * TN : (ni + 1) * TN])
        acc = nl.ndarray((m, TN), dtype=nl.float32, buffer=nl.psum)
        nsp.nc_matmul_sparse(acc, v, ix, bt, pattern="4:16", accumulate=False)
        res = nl.ndarray((m, TN), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out[:, ni * TN : (ni + 1) * TN], src=res)
    return out


def make_inputs(k: int = 512, m: int = 128, n: int = 2048, seed: int = 7):
    """A 4:16-sparse W (small integers: every sum exact) and a dense B."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-4, 5, (k // 16, 16, m)).astype(np.float32)
    keep = np.argsort(rng.random((k // 16, 16, m)), axis=1)[:, :4, :]
    mask = np.zeros_like(w, bool)
    np.put_along_axis(mask, keep, True, axis=1)
    w = np.where(mask, w, 0).reshape(k, m).astype(BF16)
    b = rng.integers(-4, 5, (k, n)).astype(BF16)
    return w, b


def tensor_unit(kernel) -> dict:
    return next(u for u in kernel.last_result.trace.stats()["units"] if u["unit"] == "tensor")


def main() -> int:
    w, b = make_inputs()
    want = (w.astype(np.float64).T @ b.astype(np.float64)).astype(np.float32)
    dense = dense_matmul(w, b)
    values, index = sparsity.compress(w, "4:16")
    sparse = sparse_matmul(values, index, sparsity.moving_layout(b, "4:16"))
    ok = np.array_equal(dense, want) and np.array_equal(sparse, want)
    print(f"W {w.shape} 4:16, B {b.shape}: dense and sparse {'match numpy exactly' if ok else 'MISMATCH'}")
    print("--- dense kernel (nc_matmul) ---")
    print(dense_matmul.last_result.trace.summary())
    print("--- sparse kernel (nc_matmul_sparse) ---")
    print(sparse_matmul.last_result.trace.summary())
    d, s = tensor_unit(dense_matmul), tensor_unit(sparse_matmul)
    speedup = d["busy_ns"] / s["busy_ns"]
    print(
        f"Tensor engine busy time: sparse is {speedup:.2f}x faster than dense; while busy: dense "
        f"{d['flops'] / d['busy_ns'] / 1e3:.1f} TFLOPS, sparse {s['flops'] / s['busy_ns'] / 1e3:.1f} TFLOPS dense-equivalent"
    )
    return 0 if ok and speedup > 3.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
