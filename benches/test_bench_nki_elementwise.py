"""Whole element-wise kernels, trace + run (a first call: traced, assembled, synchronised, run)
against the numpy reference of the same math measured in the same run (issue 30 target: at most
3x numpy): SiLU, an AdamW step and RoPE, each in the NKI 0.6 and legacy dialects.

pytest benches/test_bench_nki_elementwise.py --benchmark-only
"""

import time

import nki_elementwise_kernels as ek
import numpy as np
import pytest
import trn3emu as t3
from hosttime import load_avg, median_s


def _inputs(name):
    """The issue's shapes: SiLU 4096 x 7168, AdamW 10944 x 2048 (a partial last row tile), RoPE
    64 heads x 4096 positions x d 128; all fp32."""
    rng = np.random.default_rng(0)
    if name == "silu":
        return (rng.standard_normal((4096, 7168)).astype(np.float32),)
    if name == "adamw":
        p, g, m = (rng.standard_normal((10944, 2048)).astype(np.float32) for _ in range(3))
        return p, g, m, rng.random((10944, 2048)).astype(np.float32) * 0.01
    x = rng.standard_normal((64, 4096, 128)).astype(np.float32)
    ang = np.outer(np.arange(4096), 10000.0 ** (-np.arange(64) / 64))
    return x, np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


REFERENCES = {"silu": ek.silu_reference, "adamw": ek.adamw_reference, "rope": ek.rope_reference}


@pytest.mark.parametrize("dialect", ["0.6", "legacy"])
@pytest.mark.parametrize("name", ["silu", "adamw", "rope"])
def test_elementwise_kernel_trace_and_run(benchmark, name, dialect):
    args = _inputs(name)
    kern = ek.KERNELS[name][dialect]

    def first_call():
        kern.cache_clear()
        return kern(*args)

    # One warm-up call: the first test of each shape grows the process's memory (the emulator's
    # HBM pages, numpy's output arrays), page faults of 0.3-1.4 s system time measured in its first
    # rounds, whichever dialect runs first. Every measured round is still a first call (traced).
    out = benchmark.pedantic(first_call, rounds=3, iterations=1, warmup_rounds=1)
    ref = REFERENCES[name](*args)
    for got, want in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    host = median_s(lambda: REFERENCES[name](*args), 5)
    emu = benchmark.stats.stats.median
    benchmark.extra_info.update(
        numpy_reference_s=host,
        ratio_over_numpy=emu / host,
        ratio_target=3.0,
        simd_path=t3.simd_path(),
        load_avg_1min=load_avg(),
    )


@pytest.mark.parametrize("name", ["silu", "adamw"])
def test_elementwise_kernel_threads(benchmark, name):
    """One large element-wise kernel, NKI 0.6 (SiLU on 4096 x 7168 fp32: per 128-row tile a DMA in,
    an activation, a DMA out; AdamW on 10944 x 2048: per tile 4 DMAs in, 12 tensor_scalar /
    tensor_tensor, an in-place sqrt activation, 3 DMAs out) traced once, then warm calls at 2 host threads against 1
    (issue 30 asks >= 1.6x on a 2-core host). Timed: the device run alone (`Device._run`, the
    instructions) and the whole warm call (plus resetting the device, writing the input to HBM
    and reading the output back, host copies that stay on one thread). The outputs of the two
    thread counts are compared bit for bit. `speedup_2_over_1` only means something when the
    host really gives this process two cores: `load_avg_1min` is recorded before and after."""
    args = _inputs(name)
    kern = ek.KERNELS[name]["0.6"]
    run_s: list[float] = []
    plain_run = t3.Device._run

    def timed_run(self, *a, **k):  # the device run of each warm call, timed alone
        t0 = time.perf_counter()
        try:
            return plain_run(self, *a, **k)
        finally:
            run_s.append(time.perf_counter() - t0)

    load_before = load_avg()
    outs, run_med, call_med = {}, {}, {}
    try:
        t3.Device._run = timed_run
        kern(*args)  # traced (and the process's memory grown) once
        # alternate the thread counts so that load changes hit both alike
        calls = {1: [], 2: []}
        runs = {1: [], 2: []}
        for _ in range(4):
            for n in (1, 2):
                t3.set_num_threads(n)
                run_s.clear()
                t0 = time.perf_counter()
                outs[n] = kern(*args)
                calls[n].append(time.perf_counter() - t0)
                runs[n].append(sum(run_s))
        run_med = {n: float(np.median(v)) for n, v in runs.items()}
        call_med = {n: float(np.median(v)) for n, v in calls.items()}
        t3.set_num_threads(2)
        benchmark.pedantic(kern, args=args, rounds=3, iterations=1)
    finally:
        t3.Device._run = plain_run
        t3.set_num_threads(0)
    ref = REFERENCES[name](*args)
    as_tuple = lambda o: o if isinstance(o, tuple) else (o,)  # noqa: E731
    for a, b, want in zip(as_tuple(outs[1]), as_tuple(outs[2]), as_tuple(ref)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
        np.testing.assert_allclose(b, want, rtol=1e-5, atol=1e-6)
    benchmark.extra_info.update(
        speedup_2_over_1=run_med[1] / run_med[2],
        speedup_target=1.6,
        run_threads_1_s=run_med[1],
        run_threads_2_s=run_med[2],
        runs_threads_1_s=runs[1],
        runs_threads_2_s=runs[2],
        call_speedup_2_over_1=call_med[1] / call_med[2],
        call_threads_1_s=call_med[1],
        call_threads_2_s=call_med[2],
        load_avg_1min=load_before,
        load_avg_1min_after=load_avg(),
    )
