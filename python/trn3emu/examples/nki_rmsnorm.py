"""RMSNorm in NKI: y = x / sqrt(mean(x^2) + eps) * w, rows on partitions.

Per 128-row tile: ScalarE squares and sums each row in one `activation` (reduce_res), VectorE
turns the sum into mean + eps, ScalarE takes rsqrt, VectorE scales each row by it and multiplies
by the weight, broadcast once to all partitions by a ones-vector matmul (`nl.broadcast_to`).
Run: python examples/nki_rmsnorm.py
"""

import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

EPS = 1e-6


@nki.jit
def rmsnorm(x, w):
    n_rows, h = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    w_row = nl.ndarray((1, h), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_row, src=w.reshape((1, h)))
    w_all = nl.broadcast_to(w_row, (nl.tile_size.pmax, h))
    for i in nl.affine_range((n_rows + 127) // 128):
        p = min(128, n_rows - i * 128)
        xt = nl.ndarray((128, h), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:p, :], src=x[i * 128 : i * 128 + p, :])
        sq = nl.ndarray((128, h), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(
            dst=sq[0:p],
            op=nl.square,
            data=xt[0:p],
            reduce_op=nl.add,
            reduce_res=ss[0:p],
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        nisa.tensor_scalar(dst=ss[0:p], data=ss[0:p], op0=nl.multiply, operand0=1.0 / h, op1=nl.add, operand1=EPS)
        nisa.activation(dst=ss[0:p], op=nl.rsqrt, data=ss[0:p])
        y = nl.ndarray((128, h), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y[0:p], data=xt[0:p], op0=nl.multiply, operand0=ss[0:p])
        nisa.tensor_tensor(dst=y[0:p], data1=y[0:p], data2=w_all[0:p], op=nl.multiply)
        nisa.dma_copy(dst=out[i * 128 : i * 128 + p, :], src=y[0:p])
    return out


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    r = 1.0 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + EPS)
    return (x64 * r * w.astype(np.float64)).astype(x.dtype)


def main() -> int:
    from trn3emu.testing import assert_close

    rng = np.random.default_rng(2)
    x = rng.standard_normal((256, 512)).astype(np.float32)
    w = rng.standard_normal(512).astype(np.float32)
    y = rmsnorm(x, w)
    assert_close(y, reference(x, w), rtol=1e-4, atol=1e-5)
    print(f"rmsnorm {x.shape}: matches numpy (rtol 1e-4)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
