"""LayerNorm in NKI with the Vector engine's batch-norm statistics: y = (x - mean) / sqrt(var + eps) * g + b.

Per 128-row tile: `bn_stats` over each 512-element chunk of a row (bn_stats_fmax) into one stats
tile, one `bn_aggr` for [mean, variance], `tensor_scalar` + `activation(rsqrt)` for the inverse
std, one two-op `tensor_scalar` for (x - mean) * rstd, then gamma and beta (broadcast once to all
partitions) by `tensor_tensor`.
Run: python examples/nki_layernorm.py
"""

import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

EPS = 1e-5


@nki.jit
def layernorm(x, gamma, beta):
    rows, h = x.shape
    fmax = nl.tile_size.bn_stats_fmax
    n_chunks = (h + fmax - 1) // fmax
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g_row = nl.load(gamma.reshape((1, h)))
    b_row = nl.load(beta.reshape((1, h)))
    g_all = nl.broadcast_to(g_row, (128, h))
    b_all = nl.broadcast_to(b_row, (128, h))
    for i in nl.affine_range(rows // 128):
        xt = nl.load(x[i * 128 : (i + 1) * 128, :])
        stats = nl.ndarray((128, 6 * n_chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(n_chunks):
            lo = c * fmax
            hi = min(h, lo + fmax)
            nisa.bn_stats(dst=stats[:, 6 * c : 6 * c + 6], data=xt[:, lo:hi])
        mv = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        rstd = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd, data=mv[:, 1:2], op0=nl.add, operand0=EPS)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
        y = nl.ndarray((128, h), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=xt, op0=nl.subtract, operand0=mv[:, 0:1], op1=nl.multiply, operand1=rstd)
        nisa.tensor_tensor(dst=y, data1=y, data2=g_all, op=nl.multiply)
        res = nl.ndarray((128, h), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=res, data1=y, data2=b_all, op=nl.add)
        nl.store(out[i * 128 : (i + 1) * 128, :], res)
    return out


def reference(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    var = x64.var(axis=1, keepdims=True)
    return ((x64 - mu) / np.sqrt(var + EPS) * gamma + beta).astype(x.dtype)


def main() -> int:
    from trn3emu.testing import assert_close

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((256, 1536)) * 3 + 1).astype(np.float32)
    gamma = rng.standard_normal(1536).astype(np.float32)
    beta = rng.standard_normal(1536).astype(np.float32)
    assert_close(layernorm(x, gamma, beta), reference(x, gamma, beta), rtol=1e-3, atol=1e-4)
    print(f"layernorm {x.shape}: matches numpy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
