"""MXFP8 matmul with on-device quantisation: C[M, N] = A[M, K] @ B[K, N], A given as A^T [K, M].

Both bf16 operands are DMA'd into SBUF in the MX contraction layout (logical row k = q * K/4 + p
-> partition p, quad position q, via an HBM view), quantised on the Vector engine
(`quantize_mx` -> float8_e4m3fn_x4 data + E8M0 scales, 32 values per scale = 8 partitions x 4),
and multiplied on the PE (`nc_matmul_mx`, fp32 PSUM).
Run: python examples/nki_mxfp8_matmul.py
"""

import ml_dtypes
import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

BF16 = ml_dtypes.bfloat16


def _mx_tile(src_hbm, cols):
    """HBM [K, cols] bf16 -> SBUF [K/4, cols * 4] in the MX contraction layout, quantised."""
    k = src_hbm.shape[0]
    p = k // 4
    staged = nl.ndarray((p, cols * 4), dtype=src_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=staged.reshape((p, cols, 4)), src=src_hbm.reshape((4, p, cols)).permute((1, 2, 0)))
    data = nl.ndarray((p, cols), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    scale = nl.ndarray((p, cols), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=data, src=staged, dst_scale=scale)
    return data, scale


@nki.jit
def mxfp8_matmul(a_t, b):
    _, m = a_t.shape
    n = b.shape[1]
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    a_q, a_s = _mx_tile(a_t, m)
    b_q, b_s = _mx_tile(b, n)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=a_q, moving=b_q, stationary_scale=a_s, moving_scale=b_s)
    res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def quantize_dequantize(x: np.ndarray) -> np.ndarray:
    """The documented quantize_mx rule on logical [K, C] data, back to values (float64).

    Groups of 32 along K (8 partitions x 4 quad positions of the MX layout); scale
    X = 2^(floor(log2 amax) - 7) (twice the OCP sample scale, NKI >= 0.5); q = e4m3fn(clip(v / X)).
    """
    k, c = x.shape
    p = k // 4
    v = x.astype(np.float64).reshape(4, p, c).transpose(1, 2, 0)  # [p, c, q]
    g = v.reshape(p // 8, 8, c, 4)
    amax = np.abs(g).max(axis=(1, 3), keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 7, -127)
    scale = np.exp2(e)
    q = np.clip(g / scale, -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    deq = (q * scale).reshape(p, c, 4).transpose(2, 0, 1).reshape(k, c)
    return deq


def reference(a_t: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (quantize_dequantize(a_t).T @ quantize_dequantize(b)).astype(np.float32)


def main() -> int:
    from trn3emu.testing import assert_close

    rng = np.random.default_rng(8)
    a_t = rng.standard_normal((512, 128)).astype(BF16)
    b = rng.standard_normal((512, 512)).astype(BF16)
    out = mxfp8_matmul(a_t, b)
    assert_close(out, reference(a_t, b), rtol=1e-4, atol=1e-4, mode="max")
    exact = a_t.astype(np.float64).T @ b.astype(np.float64)
    rel = np.abs(out - exact).max() / np.abs(exact).max()
    print(f"MXFP8 matmul A^T {a_t.shape} x B {b.shape}: matches the MX reference; vs exact bf16 max rel err {rel:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
