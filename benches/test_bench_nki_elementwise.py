"""Whole element-wise kernels, trace + run (a first call: traced, assembled, synchronised, run)
against the numpy reference of the same math measured in the same run (issue 30 target: at most
3x numpy). Only SiLU on 4096 x 7168 fp32 so far, in the NKI 0.6 and legacy dialects.

pytest benches/test_bench_nki_elementwise.py --benchmark-only
"""

import platform

import nki_elementwise_kernels as ek
import numpy as np
import pytest
import trn3emu as t3
from hosttime import load_avg, median_s


@pytest.mark.parametrize("dialect", ["0.6", "legacy"])
def test_silu_4096x7168_trace_and_run(benchmark, dialect):
    x = np.random.default_rng(0).standard_normal((4096, 7168)).astype(np.float32)
    kern = ek.KERNELS["silu"][dialect]

    def first_call():
        kern.cache_clear()
        return kern(x)

    out = benchmark.pedantic(first_call, rounds=3, iterations=1)
    ref = ek.silu_reference(x)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    host = median_s(lambda: ek.silu_reference(x), 5)
    emu = benchmark.stats.stats.median
    benchmark.extra_info.update(
        numpy_reference_s=host,
        ratio_over_numpy=emu / host,
        ratio_target=3.0,
        simd_path=t3.simd_path(),
        host_cpu=platform.processor() or platform.machine(),
        load_avg_1min=load_avg(),
    )
