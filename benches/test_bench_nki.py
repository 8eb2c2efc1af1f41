"""Whole NKI kernels through the front end: tiled matmul, causal flash attention against a
numpy-eager execution of the same kernel (how the vendor's simulator runs it), RMSNorm 4096 x 4096.

pytest benches/test_bench_nki.py --benchmark-only
The flash-attention figures are single-thread on both sides: the emulator runs with
`trn3emu.set_num_threads(1)` and numpy's BLAS is limited to one thread (threadpoolctl); the
default-thread times are recorded too.
"""

import time

import ml_dtypes
import numpy as np
import numpy_eager_nki
import trn3emu as t3
import trn3emu.nki as tn
from hosttime import blas_threads, load_avg, median_s

BF16 = ml_dtypes.bfloat16
tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
import nki_flash_attention  # noqa: E402
import nki_rmsnorm  # noqa: E402


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
    """A 512 x 1024 x 2048 bf16 matmul kernel (~400 instructions), per call (traced once, cached)."""
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
    a32, b32 = lhs_t.astype(np.float32), rhs.astype(np.float32)
    want = a32.T @ b32
    np.testing.assert_allclose(out.astype(np.float32), want, rtol=1e-2, atol=1e-1)
    with blas_threads(1):
        host = median_s(lambda: a32.T @ b32, 10)
    benchmark.extra_info.update(host_sgemm_gflops=2 * 512 * 1024 * 2048 / host / 1e9, fraction_of_host=host / emu)


def test_nki_flash_attention_vs_numpy_eager(benchmark):
    """Causal flash attention, seq 4096, d 128 (examples/nki_flash_attention.py): the emulator's
    warm call (traced once, cached) and first call against the same kernel run eagerly in numpy
    (benches/numpy_eager_nki.py), both checked against the float64 numpy reference.

    `speedup_vs_eager_bound` = eager time / time of the kernel's matmuls alone in numpy sgemm:
    the most any emulator that performs those matmuls at sgemm speed could reach.
    `speedup_vs_eager_bound_emulator` = eager time / time of the same matmuls alone on this
    emulator (one thread, checks off): the most it could reach if every other instruction
    were free."""
    fa = nki_flash_attention
    q_t, k_t, v, scale = fa.make_inputs()
    ref = fa.reference(q_t, k_t, v, scale).astype(np.float32)
    kern = fa.flash_attention_causal
    kern.cache_clear()
    t0 = time.perf_counter()
    out = kern(q_t, k_t, v, scale)
    cold = time.perf_counter() - t0  # default threads
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1e-2, atol=1e-2)

    eager = numpy_eager_nki.rebind(kern)
    np.testing.assert_allclose(eager(q_t, k_t, v, scale).astype(np.float32), ref, rtol=1e-2, atol=1e-2)
    with blas_threads(1):
        eager_1t = median_s(lambda: eager(q_t, k_t, v, scale), 5)
    eager_default = median_s(lambda: eager(q_t, k_t, v, scale), 5)

    # The kernel's matmuls alone in numpy fp32 (QK^T blocks and P V chunks): a floor for any
    # emulator that computes them at sgemm speed.
    d, seq = q_t.shape
    blocks = sum((q0 + 127) // 512 + 1 for q0 in range(0, seq, 128))
    qk_a, qk_b = np.ones((d, 128), np.float32), np.ones((d, 512), np.float32)
    pv_a, pv_b = np.ones((128, 128), np.float32), np.ones((128, d), np.float32)

    def matmuls():
        for _ in range(blocks):
            qk_a.T @ qk_b
            for _ in range(4):
                pv_a.T @ pv_b

    with blas_threads(1):
        host_mm = median_s(matmuls, 3)
    flop = blocks * 2 * 128 * (d * 512 + 512 * d)

    # The same matmuls (bf16 operands, fp32 PSUM, P V accumulated over 4 chunks) on the emulator.
    dev = t3.Device()
    mm = t3.Program(sync="manual")
    qt, kt = mm.sbuf((d, 128), BF16), mm.sbuf((d, 512), BF16)
    pt, vt = mm.sbuf((128, 128), BF16), mm.sbuf((128, d), BF16)
    s_ps, pv_ps = mm.psum((128, 512), np.float32), mm.psum((128, d), np.float32)
    for _ in range(blocks):
        mm.nc_matmul(dst=s_ps, stationary=qt, moving=kt, accumulate=False)
        for c in range(4):
            mm.nc_matmul(dst=pv_ps, stationary=pt, moving=vt, accumulate=c > 0)
    t3.set_num_threads(1)
    emu_mm = median_s(lambda: dev.run(mm, check_races=False, trace=False), 3)

    t3.set_num_threads(0)
    warm_default_threads = median_s(lambda: kern(q_t, k_t, v, scale), 3)
    t3.set_num_threads(1)  # the headline figure: one host thread, like the eager baseline
    try:
        out = benchmark.pedantic(kern, args=(q_t, k_t, v, scale), rounds=5, iterations=1)
    finally:
        t3.set_num_threads(0)
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1e-2, atol=1e-2)
    warm = benchmark.stats.stats.median
    n_instr = sum(len(p) for p in kern.last_programs)
    benchmark.extra_info.update(
        instructions=n_instr,
        matmul_gflop=flop / 1e9,
        emulated_gflops=flop / warm / 1e9,
        host_sgemm_s=host_mm,
        fraction_of_host=host_mm / warm,
        speedup_vs_eager_bound=eager_1t / host_mm,
        emulator_matmuls_s=emu_mm,
        whole_over_matmuls=warm / emu_mm,
        whole_over_matmuls_target=1.4,
        speedup_vs_eager_bound_emulator=eager_1t / emu_mm,
        cold_first_call_s=cold,
        warm_median_s=warm,
        eager_median_s=eager_1t,
        eager_default_blas_threads_median_s=eager_default,
        speedup_vs_eager=eager_1t / warm,
        speedup_target=5.0,
        emulator_threads=1,
        warm_median_default_threads_s=warm_default_threads,
        default_threads=t3.get_num_threads(),
        load_avg_1min=load_avg(),
    )


def test_nki_rmsnorm_4096(benchmark):
    """RMSNorm of a 4096 x 4096 fp32 matrix (examples/nki_rmsnorm.py), GB/s of x read + y written,
    against the same formula in numpy fp32 (fraction_of_host) measured in the same run."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4096, 4096)).astype(np.float32)
    w = rng.standard_normal(4096).astype(np.float32)
    kern = nki_rmsnorm.rmsnorm
    out = benchmark.pedantic(kern, args=(x, w), rounds=3, iterations=1, warmup_rounds=1)
    np.testing.assert_allclose(out, nki_rmsnorm.reference(x, w), rtol=1e-4, atol=1e-5)

    def host():
        r = 1.0 / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + np.float32(nki_rmsnorm.EPS))
        return x * r * w

    host_s = median_s(host, 5)
    emu = benchmark.stats.stats.median
    nbytes = 2 * x.nbytes
    benchmark.extra_info.update(
        emulated_gbps=nbytes / emu / 1e9,
        host_numpy_gbps=nbytes / host_s / 1e9,
        fraction_of_host=host_s / emu,
        load_avg_1min=load_avg(),
    )


def _front_end_only(monkeypatch):
    """Stub the device run so only tracing and assembly are timed. The front end launches through
    `Device._run`; both entry points are stubbed (stubbing `run` alone timed the device run too:
    46 k vs ~90 k/s)."""
    import trn3emu.device

    class _NoRun:
        time_ns = 0.0
        identical_writes = ()

    monkeypatch.setattr(trn3emu.device.Device, "run", lambda self, *a, **k: _NoRun())
    monkeypatch.setattr(trn3emu.device.Device, "_run", lambda self, *a, **k: _NoRun())


def test_nki_tracing_per_instruction(benchmark, monkeypatch):
    """The front end alone: tracing + assembling the flash-attention kernel (seq 4096) with the
    trace cache off and Device.run stubbed out; extra_info has microseconds per instruction."""
    _front_end_only(monkeypatch)
    fa = nki_flash_attention
    q_t, k_t, v, scale = fa.make_inputs()
    kern = nki.jit(fa.flash_attention_causal.fn, cache=False)
    benchmark.pedantic(kern, args=(q_t, k_t, v, scale), rounds=9, iterations=1, warmup_rounds=1)
    n_instr = sum(len(p) for p in kern.last_programs)
    # Thread CPU time as well: on a shared 2-core host the wall-clock median of a ~30 ms call
    # swings 30-48 ms between runs (other processes), the CPU time of the thread far less.
    cpu = []
    for _ in range(9):
        t0 = time.thread_time()
        kern(q_t, k_t, v, scale)
        cpu.append(time.thread_time() - t0)
    benchmark.extra_info.update(
        cpu_instructions_per_s=n_instr / float(np.median(cpu)),
        cpu_instructions_per_s_best=n_instr / min(cpu),
        instructions=n_instr,
        us_per_instruction=benchmark.stats.stats.median / n_instr * 1e6,
        instructions_per_s=n_instr / benchmark.stats.stats.median,
        instructions_per_s_target=200_000,
        load_avg_1min=load_avg(),
    )


def test_nki_tracing_value_reuse(benchmark, monkeypatch):
    """What the pass `value_reuse` costs (docs/nki.md, "Passes"): the front-end-only run above
    with the pass on and off, thread CPU time measured alternately in the same run; extra_info has
    the ratio (the pass is one native scan of the finished program: `Program.exact_repeats`)."""
    _front_end_only(monkeypatch)
    fa = nki_flash_attention
    q_t, k_t, v, scale = fa.make_inputs()
    off = nki.jit(fa.flash_attention_causal.fn, cache=False, passes={"value_reuse": "off"})
    on = nki.jit(fa.flash_attention_causal.fn, cache=False, passes={"value_reuse": "on"})
    benchmark.pedantic(on, args=(q_t, k_t, v, scale), rounds=5, iterations=1, warmup_rounds=1)
    off(q_t, k_t, v, scale)
    cpu: dict = {"off": [], "on": []}
    for _ in range(9):
        for name, k in (("off", off), ("on", on)):
            t0 = time.thread_time()
            k(q_t, k_t, v, scale)
            cpu[name].append(time.thread_time() - t0)
    n_instr = sum(len(p) for p in off.last_programs)
    scan = []
    for _ in range(9):
        t0 = time.thread_time()
        off.last_programs[0]._native.exact_repeats()
        scan.append(time.thread_time() - t0)
    benchmark.extra_info.update(
        instructions=n_instr,
        dropped=sum(p.value_reuse for p in on.last_programs),
        off_cpu_instructions_per_s=n_instr / float(np.median(cpu["off"])),
        on_cpu_instructions_per_s=n_instr / float(np.median(cpu["on"])),
        on_over_off_cpu=float(np.median(cpu["on"]) / np.median(cpu["off"])),
        scan_us_per_instruction=float(np.median(scan)) / n_instr * 1e6,
        load_avg_1min=load_avg(),
    )


def test_nki_tracing_ir_recording(benchmark, monkeypatch):
    """What recording the kernel IR costs (`nki.jit(ir=True)`, docs/nki.md "Passes"): the same
    front-end-only run as above, with and without recording, thread CPU time measured alternately
    in the same run; extra_info has the ratio (why recording is opt-in: it is not < 1.05)."""
    _front_end_only(monkeypatch)
    fa = nki_flash_attention
    q_t, k_t, v, scale = fa.make_inputs()
    plain = nki.jit(fa.flash_attention_causal.fn, cache=False)
    rec = nki.jit(fa.flash_attention_causal.fn, cache=False, ir=True)
    benchmark.pedantic(rec, args=(q_t, k_t, v, scale), rounds=5, iterations=1, warmup_rounds=1)
    plain(q_t, k_t, v, scale)
    cpu: dict = {"plain": [], "ir": []}
    for _ in range(7):
        for name, k in (("plain", plain), ("ir", rec)):
            t0 = time.thread_time()
            k(q_t, k_t, v, scale)
            cpu[name].append(time.thread_time() - t0)
    n_instr = sum(len(p) for p in plain.last_programs)
    assert len(rec.last_ir.calls) >= len(plain.last_programs[0])  # (masked-out calls emit nothing)
    benchmark.extra_info.update(
        instructions=n_instr,
        plain_cpu_instructions_per_s=n_instr / float(np.median(cpu["plain"])),
        ir_cpu_instructions_per_s=n_instr / float(np.median(cpu["ir"])),
        ir_over_plain_cpu=float(np.median(cpu["ir"]) / np.median(cpu["plain"])),
        load_avg_1min=load_avg(),
    )
