"""The NKI front end's own cost: tracing a kernel into Programs and running it end to end.

pytest benches/test_bench_nki.py --benchmark-only
"""

import ml_dtypes
import numpy as np
import trn3emu.nki as tn

BF16 = ml_dtypes.bfloat16
tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


@nki.jit
def _matmul(lhs_t, rhs):
    k, m = lhs_t.shape
    n = rhs.shape[1]
    out = nl.ndarray((m, n), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    for mi in nl.affine_range(m // 128):
        for ni in nl.affine_range(n // 512):
            acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            for ki in nl.affine_range(k // 128):
                a = nl.ndarray((128, 128), dtype=lhs_t.dtype, buffer=nl.sbuf)
                b = nl.ndarray((128, 512), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhs_t[ki * 128 : (ki + 1) * 128, mi * 128 : (mi + 1) * 128])
                nisa.dma_copy(dst=b, src=rhs[ki * 128 : (ki + 1) * 128, ni * 512 : (ni + 1) * 512])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            res = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[mi * 128 : (mi + 1) * 128, ni * 512 : (ni + 1) * 512], src=res)
    return out


def test_nki_tiled_matmul_end_to_end(benchmark):
    """A 512 x 1024 x 2048 bf16 matmul kernel: trace (~400 instructions) + run, per call."""
    rng = np.random.default_rng(0)
    lhs_t = rng.standard_normal((1024, 512)).astype(BF16)
    rhs = rng.standard_normal((1024, 2048)).astype(BF16)
    out = benchmark(_matmul, lhs_t, rhs)
    n_instr = sum(len(p) for p in _matmul.last_programs)
    emu = benchmark.stats.stats.median
    benchmark.extra_info.update(
        instructions=n_instr,
        instructions_per_s=n_instr / emu,
        emulated_gflops=2 * 512 * 1024 * 2048 / emu / 1e9,
    )
    assert out.shape == (512, 2048)
