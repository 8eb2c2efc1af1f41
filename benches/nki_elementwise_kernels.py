"""Whole element-wise kernels (issue 30) in both dialects, for benches/test_bench_nki_elementwise.py
and tests/test_nki_elementwise_kernels.py: SiLU over rows of 128. Each has a numpy reference of
the same math: SiLU over rows of 128, an AdamW step (rows not a multiple of 128: a partial last
tile) and rotary position embedding (RoPE, rotate-half form, the cos / sin tile loaded once per
128 positions and reused over the heads)."""

import numpy as np
import trn3emu.nki as tn

tn.install()

import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.language as lnl  # noqa: E402
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


@nki.jit
def silu_06(x):
    """NKI 0.6 dialect: per 128-row tile a DMA in, one ScalarE activation(silu), a DMA out."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    rows, cols = x.shape
    for i in nl.affine_range(rows // 128):
        t = nl.ndarray((128, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128 : (i + 1) * 128, :])
        y = nl.ndarray((128, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.silu, data=t)
        nisa.dma_copy(dst=out[i * 128 : (i + 1) * 128, :], src=y)
    return out


@lnki.jit
def silu_legacy(x):
    """Legacy `neuronxcc.nki` dialect: nl.load, nl.silu, nl.store per 128-row tile."""
    out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
    rows = x.shape[0]
    for i in lnl.affine_range(rows // 128):
        t = lnl.load(x[i * 128 : (i + 1) * 128, :])
        lnl.store(out[i * 128 : (i + 1) * 128, :], value=lnl.silu(t))
    return out


def silu_reference(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) in numpy fp32."""
    return x / (np.float32(1) + np.exp(-x))


# AdamW step hyper-parameters (decoupled weight decay), step 10; the bias corrections are folded
# into scalar constants, computed once in fp32 as a kernel author would.
LR, B1, B2, EPS, WD, STEP = 1e-3, 0.9, 0.999, 1e-8, 0.01, 10
_F = np.float32
ADAMW = {
    "b1": _F(B1),
    "one_minus_b1": _F(1 - B1),
    "b2": _F(B2),
    "one_minus_b2": _F(1 - B2),
    "inv_bc2": _F(1 / (1 - B2**STEP)),
    "eps": _F(EPS),
    "lr_over_bc1": _F(LR / (1 - B1**STEP)),
    "decay": _F(1 - LR * WD),
}


def _row_tiles(rows: int):
    """(start, size) of each 128-row tile; the last one may be partial."""
    return [(r, min(128, rows - r)) for r in range(0, rows, 128)]


@nki.jit
def adamw_06(p, g, m, v):
    """NKI 0.6 dialect: one AdamW step per row tile with named destinations (nisa.* ops)."""
    c = ADAMW
    p_out = nl.ndarray(p.shape, dtype=p.dtype, buffer=nl.shared_hbm)
    m_out = nl.ndarray(p.shape, dtype=p.dtype, buffer=nl.shared_hbm)
    v_out = nl.ndarray(p.shape, dtype=p.dtype, buffer=nl.shared_hbm)
    cols = p.shape[1]
    for r, n in _row_tiles(p.shape[0]):
        rows = slice(r, r + n)
        tp, tg, tm, tv, t1, t2 = (nl.ndarray((n, cols), dtype=p.dtype, buffer=nl.sbuf) for _ in range(6))
        nisa.dma_copy(dst=tp, src=p[rows, :])
        nisa.dma_copy(dst=tg, src=g[rows, :])
        nisa.dma_copy(dst=tm, src=m[rows, :])
        nisa.dma_copy(dst=tv, src=v[rows, :])
        # m' = b1 m + (1 - b1) g
        nisa.tensor_scalar(dst=t1, data=tg, op0=nl.multiply, operand0=c["one_minus_b1"])
        nisa.tensor_scalar(dst=tm, data=tm, op0=nl.multiply, operand0=c["b1"])
        nisa.tensor_tensor(dst=tm, data1=tm, data2=t1, op=nl.add)
        # v' = b2 v + (1 - b2) g g
        nisa.tensor_tensor(dst=t2, data1=tg, data2=tg, op=nl.multiply)
        nisa.tensor_scalar(dst=t2, data=t2, op0=nl.multiply, operand0=c["one_minus_b2"])
        nisa.tensor_scalar(dst=tv, data=tv, op0=nl.multiply, operand0=c["b2"])
        nisa.tensor_tensor(dst=tv, data1=tv, data2=t2, op=nl.add)
        # p' = (1 - lr wd) p - lr / bc1 * m' / (sqrt(v' / bc2) + eps)
        nisa.tensor_scalar(dst=t2, data=tv, op0=nl.multiply, operand0=c["inv_bc2"])
        nisa.activation(dst=t2, op=nl.sqrt, data=t2)
        nisa.tensor_scalar(dst=t2, data=t2, op0=nl.add, operand0=c["eps"])
        nisa.tensor_tensor(dst=t1, data1=tm, data2=t2, op=nl.divide)
        nisa.tensor_scalar(dst=t1, data=t1, op0=nl.multiply, operand0=c["lr_over_bc1"])
        nisa.tensor_scalar(dst=tp, data=tp, op0=nl.multiply, operand0=c["decay"])
        nisa.tensor_tensor(dst=tp, data1=tp, data2=t1, op=nl.subtract)
        nisa.dma_copy(dst=p_out[rows, :], src=tp)
        nisa.dma_copy(dst=m_out[rows, :], src=tm)
        nisa.dma_copy(dst=v_out[rows, :], src=tv)
    return p_out, m_out, v_out


@lnki.jit
def adamw_legacy(p, g, m, v):
    """Legacy dialect: the same step with nl.load / value-returning nl ops / nl.store."""
    c = ADAMW
    p_out = lnl.ndarray(p.shape, dtype=p.dtype, buffer=lnl.shared_hbm)
    m_out = lnl.ndarray(p.shape, dtype=p.dtype, buffer=lnl.shared_hbm)
    v_out = lnl.ndarray(p.shape, dtype=p.dtype, buffer=lnl.shared_hbm)
    for r, n in _row_tiles(p.shape[0]):
        rows = slice(r, r + n)
        tp, tg = lnl.load(p[rows, :]), lnl.load(g[rows, :])
        tm, tv = lnl.load(m[rows, :]), lnl.load(v[rows, :])
        m2 = lnl.add(lnl.multiply(tm, c["b1"]), lnl.multiply(tg, c["one_minus_b1"]))
        v2 = lnl.add(lnl.multiply(tv, c["b2"]), lnl.multiply(lnl.multiply(tg, tg), c["one_minus_b2"]))
        den = lnl.add(lnl.sqrt(lnl.multiply(v2, c["inv_bc2"])), c["eps"])
        upd = lnl.multiply(lnl.divide(m2, den), c["lr_over_bc1"])
        lnl.store(p_out[rows, :], value=lnl.subtract(lnl.multiply(tp, c["decay"]), upd))
        lnl.store(m_out[rows, :], value=m2)
        lnl.store(v_out[rows, :], value=v2)
    return p_out, m_out, v_out


def adamw_reference(p, g, m, v):
    """The same step in numpy fp32, the same operation order."""
    c = ADAMW
    m2 = m * c["b1"] + g * c["one_minus_b1"]
    v2 = v * c["b2"] + (g * g) * c["one_minus_b2"]
    den = np.sqrt(v2 * c["inv_bc2"]) + c["eps"]
    return p * c["decay"] - (m2 / den) * c["lr_over_bc1"], m2, v2


@nki.jit
def rope_06(x, cos, sin):
    """NKI 0.6 dialect: x [heads, seq, d], cos / sin [seq, d/2]; per 128 positions the cos / sin
    tiles are loaded once and used for every head."""
    heads, seq, d = x.shape
    h2 = d // 2
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for s in nl.affine_range(seq // 128):
        pos = slice(s * 128, (s + 1) * 128)
        tc = nl.ndarray((128, h2), dtype=x.dtype, buffer=nl.sbuf)
        ts = nl.ndarray((128, h2), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tc, src=cos[pos, :])
        nisa.dma_copy(dst=ts, src=sin[pos, :])
        for h in nl.affine_range(heads):
            tx = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
            to = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
            t1 = nl.ndarray((128, h2), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tx, src=x[h, pos, :])
            x1, x2 = tx[:, 0:h2], tx[:, h2:d]
            # out1 = x1 cos - x2 sin; out2 = x2 cos + x1 sin
            nisa.tensor_tensor(dst=to[:, 0:h2], data1=x1, data2=tc, op=nl.multiply)
            nisa.tensor_tensor(dst=t1, data1=x2, data2=ts, op=nl.multiply)
            nisa.tensor_tensor(dst=to[:, 0:h2], data1=to[:, 0:h2], data2=t1, op=nl.subtract)
            nisa.tensor_tensor(dst=to[:, h2:d], data1=x2, data2=tc, op=nl.multiply)
            nisa.tensor_tensor(dst=t1, data1=x1, data2=ts, op=nl.multiply)
            nisa.tensor_tensor(dst=to[:, h2:d], data1=to[:, h2:d], data2=t1, op=nl.add)
            nisa.dma_copy(dst=out[h, pos, :], src=to)
    return out


@lnki.jit
def rope_legacy(x, cos, sin):
    """Legacy dialect: the same rotation with value-returning nl ops."""
    heads, seq, d = x.shape
    h2 = d // 2
    out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
    for s in lnl.affine_range(seq // 128):
        pos = slice(s * 128, (s + 1) * 128)
        tc, ts = lnl.load(cos[pos, :]), lnl.load(sin[pos, :])
        for h in lnl.affine_range(heads):
            x1 = lnl.load(x[h, pos, 0:h2])
            x2 = lnl.load(x[h, pos, h2:d])
            lnl.store(out[h, pos, 0:h2], value=lnl.subtract(lnl.multiply(x1, tc), lnl.multiply(x2, ts)))
            lnl.store(out[h, pos, h2:d], value=lnl.add(lnl.multiply(x2, tc), lnl.multiply(x1, ts)))
    return out


def rope_reference(x, cos, sin):
    """Rotate-half RoPE in numpy fp32."""
    h2 = x.shape[-1] // 2
    x1, x2 = x[..., :h2], x[..., h2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


KERNELS = {
    "silu": {"0.6": silu_06, "legacy": silu_legacy},
    "adamw": {"0.6": adamw_06, "legacy": adamw_legacy},
    "rope": {"0.6": rope_06, "legacy": rope_legacy},
}
