"""Causal flash-attention forward (one head) with online softmax: O = softmax(Q K^T * scale + causal) V.

Queries in 128-row tiles on partitions; keys in 512-column blocks up to the diagonal. Per block:
S = Q K^T on the PE (fp32 PSUM), scaled into SBUF by ScalarE, masked on the diagonal block by
GpSimd's `affine_select` (keep key <= query), row max by `tensor_reduce`, running max / rescale
factor alpha = exp(m_old - m_new), P = exp(S - m_new) with its row sum in one `activation`,
P^T in 128-key chunks by PE transposes, P V accumulated in PSUM, then O = alpha O + P V and
l = alpha l + rowsum. Finally O / l. Inputs: Q^T, K^T [d, seq] and V [seq, d] in bf16.
Run: python examples/nki_flash_attention.py
"""

import math

import ml_dtypes
import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

BF16 = ml_dtypes.bfloat16
NEG = -3.0e38
BQ, BK = 128, 512


@nki.jit
def flash_attention_causal(q_t, k_t, v, scale):
    d, seq = q_t.shape
    out = nl.ndarray((seq, d), dtype=v.dtype, buffer=nl.shared_hbm)
    for qi in nl.affine_range(seq // BQ):
        q0 = qi * BQ
        qt = nl.ndarray((d, BQ), dtype=q_t.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=qt, src=q_t[:, q0 : q0 + BQ])
        m = nl.full((BQ, 1), NEG, dtype=nl.float32, buffer=nl.sbuf)
        l_sum = nl.zeros((BQ, 1), dtype=nl.float32, buffer=nl.sbuf)
        o = nl.zeros((BQ, d), dtype=nl.float32, buffer=nl.sbuf)
        for kj in nl.sequential_range((q0 + BQ - 1) // BK + 1):
            k0 = kj * BK
            kt = nl.ndarray((d, BK), dtype=k_t.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=kt, src=k_t[:, k0 : k0 + BK])
            s_ps = nl.ndarray((BQ, BK), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=s_ps, stationary=qt, moving=kt)
            s = nl.ndarray((BQ, BK), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=s, op=nl.copy, data=s_ps, scale=scale)
            if k0 + BK - 1 > q0:  # the block crosses the diagonal: keep (q0 + p) - (k0 + f) >= 0
                nisa.affine_select(
                    dst=s,
                    pattern=[[-1, BK]],
                    channel_multiplier=1,
                    on_true_tile=s,
                    on_false_value=NEG,
                    cmp_op=nl.greater_equal,
                    offset=q0 - k0,
                )
            bmax = nl.ndarray((BQ, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=bmax, op=nl.maximum, data=s, axis=(1,), keepdims=True)
            m_new = nl.ndarray((BQ, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=m_new, data1=m, data2=bmax, op=nl.maximum)
            neg_m = nl.ndarray((BQ, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-1.0)
            alpha = nl.ndarray((BQ, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=alpha, op=nl.exp, data=m, bias=neg_m)
            p = nl.ndarray((BQ, BK), dtype=nl.bfloat16, buffer=nl.sbuf)
            rsum = nl.ndarray((BQ, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(
                dst=p,
                op=nl.exp,
                data=s,
                bias=neg_m,
                reduce_op=nl.add,
                reduce_res=rsum,
                reduce_cmd=nisa.reduce_cmd.reset_reduce,
            )
            nisa.tensor_scalar(dst=l_sum, data=l_sum, op0=nl.multiply, operand0=alpha)
            nisa.tensor_tensor(dst=l_sum, data1=l_sum, data2=rsum, op=nl.add)
            pv = nl.ndarray((BQ, d), dtype=nl.float32, buffer=nl.psum)
            for c in nl.affine_range(BK // 128):
                pt_ps = nl.ndarray((128, BQ), dtype=nl.bfloat16, buffer=nl.psum)
                nisa.nc_transpose(dst=pt_ps, data=p[:, c * 128 : (c + 1) * 128])
                pt = nl.ndarray((128, BQ), dtype=nl.bfloat16, buffer=nl.sbuf)
                nisa.tensor_copy(dst=pt, src=pt_ps)
                vt = nl.ndarray((128, d), dtype=v.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=vt, src=v[k0 + c * 128 : k0 + (c + 1) * 128, :])
                nisa.nc_matmul(dst=pv, stationary=pt, moving=vt, accumulate=(c != 0))
            nisa.tensor_scalar(dst=o, data=o, op0=nl.multiply, operand0=alpha)
            nisa.tensor_tensor(dst=o, data1=o, data2=pv, op=nl.add)
            nisa.tensor_copy(dst=m, src=m_new)
        rl = nl.ndarray((BQ, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=rl, data=l_sum)
        res = nl.ndarray((BQ, d), dtype=v.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=res, data=o, op0=nl.multiply, operand0=rl)
        nisa.dma_copy(dst=out[q0 : q0 + BQ, :], src=res)
    return out


def reference(q_t: np.ndarray, k_t: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    q, k, vv = q_t.astype(np.float64).T, k_t.astype(np.float64).T, v.astype(np.float64)
    s = q @ k.T * scale
    s[np.triu_indices(s.shape[0], 1)] = -np.inf
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    return (p @ vv / p.sum(axis=1, keepdims=True)).astype(v.dtype)


def make_inputs(seq: int = 4096, d: int = 128, seed: int = 9):
    rng = np.random.default_rng(seed)
    q_t = rng.standard_normal((d, seq)).astype(BF16)
    k_t = rng.standard_normal((d, seq)).astype(BF16)
    v = rng.standard_normal((seq, d)).astype(BF16)
    return q_t, k_t, v, 1.0 / math.sqrt(d)


def main() -> int:
    from trn3emu.testing import assert_close

    q_t, k_t, v, scale = make_inputs()
    out = flash_attention_causal(q_t, k_t, v, scale)
    assert_close(out, reference(q_t, k_t, v, scale), rtol=1e-2, atol=1e-2)
    print(f"causal flash attention seq {q_t.shape[1]}, d {q_t.shape[0]}: matches numpy (atol=rtol=1e-2)")
    print(flash_attention_causal.last_result.trace.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
