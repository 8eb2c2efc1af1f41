"""Whole element-wise kernels (issue 30) in both dialects, for benches/test_bench_nki_elementwise.py
and tests/test_nki_elementwise_kernels.py: SiLU over rows of 128. Each has a numpy reference of
the same math. (AdamW and RoPE kernels: not written yet.)"""

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


KERNELS = {"silu": {"0.6": silu_06, "legacy": silu_legacy}}
