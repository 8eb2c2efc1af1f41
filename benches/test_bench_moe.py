"""An MoE expert MLP through the NKI front end: y = (silu(x Wg) * (x Wu)) Wd, bf16, 2048 tokens,
hidden 1024, intermediate 4096 (the gate/up/down projections of one expert), warm call (traced
once, cached), one host thread, against the time of its matmuls alone on this emulator
(`whole_over_matmuls`, target <= 1.4) and in host sgemm (`fraction_of_host`).

pytest benches/test_bench_moe.py --benchmark-only
"""

import ml_dtypes
import numpy as np
import trn3emu as t3
import trn3emu.nki as tn
from hosttime import blas_threads, load_avg, median_s

BF16 = ml_dtypes.bfloat16
tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

TOK, HID, INTER = 2048, 1024, 4096
TB = 512  # tokens per block (the moving free size of the gate/up matmuls)


@nki.jit
def expert_mlp(x_t, wg, wu, wd):
    """x_t [HID, TOK] (x transposed), wg / wu [HID, INTER], wd [INTER, HID] -> y [TOK, HID]."""
    hid, tok = x_t.shape
    inter = wg.shape[1]
    nk, ni = hid // 128, inter // 128
    y = nl.ndarray((tok, hid), dtype=x_t.dtype, buffer=nl.shared_hbm)
    for tb in nl.affine_range(tok // TB):
        xt = []
        for kt in range(nk):
            a = nl.ndarray((128, TB), dtype=x_t.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=x_t[kt * 128 : (kt + 1) * 128, tb * TB : (tb + 1) * TB])
            xt.append(a)
        # h^T [inter, tokens] = silu(Wg^T x^T) * (Wu^T x^T), one 128-row tile of inter at a time
        ht = []
        for it in range(ni):
            g_ps = nl.ndarray((128, TB), dtype=nl.float32, buffer=nl.psum)
            u_ps = nl.ndarray((128, TB), dtype=nl.float32, buffer=nl.psum)
            for kt in range(nk):
                g_w = nl.ndarray((128, 128), dtype=wg.dtype, buffer=nl.sbuf)
                u_w = nl.ndarray((128, 128), dtype=wu.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=g_w, src=wg[kt * 128 : (kt + 1) * 128, it * 128 : (it + 1) * 128])
                nisa.dma_copy(dst=u_w, src=wu[kt * 128 : (kt + 1) * 128, it * 128 : (it + 1) * 128])
                nisa.nc_matmul(dst=g_ps, stationary=g_w, moving=xt[kt], accumulate=kt != 0)
                nisa.nc_matmul(dst=u_ps, stationary=u_w, moving=xt[kt], accumulate=kt != 0)
            g = nl.ndarray((128, TB), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=g, op=nl.silu, data=g_ps)
            h = nl.ndarray((128, TB), dtype=x_t.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=h, data1=g, data2=u_ps, op=nl.multiply)
            ht.append(h)
        # y [tokens, hid] = h Wd: stationary h^T [inter tile, 128 tokens], moving Wd [inter tile, 512]
        wdt = []
        for it in range(ni):
            w = nl.ndarray((128, hid), dtype=wd.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=w, src=wd[it * 128 : (it + 1) * 128, :])
            wdt.append(w)
        for mt in range(TB // 128):
            for nt in range(hid // 512):
                y_ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
                for it in range(ni):
                    nisa.nc_matmul(
                        dst=y_ps,
                        stationary=ht[it][:, mt * 128 : (mt + 1) * 128],
                        moving=wdt[it][:, nt * 512 : (nt + 1) * 512],
                        accumulate=it != 0,
                    )
                res = nl.ndarray((128, 512), dtype=x_t.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=res, src=y_ps)
                t0 = tb * TB + mt * 128
                nisa.dma_copy(dst=y[t0 : t0 + 128, nt * 512 : (nt + 1) * 512], src=res)
    return y


def make_inputs(tok=TOK, hid=HID, inter=INTER, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tok, hid)) * 0.5
    wg = rng.standard_normal((hid, inter)) / np.sqrt(hid)
    wu = rng.standard_normal((hid, inter)) / np.sqrt(hid)
    wd = rng.standard_normal((inter, hid)) / np.sqrt(inter)
    return tuple(np.ascontiguousarray(a).astype(BF16) for a in (x.T, wg, wu, wd))


def reference(x_t, wg, wu, wd):
    """float64 numpy, with h rounded to bf16 as the kernel stores it."""
    x = x_t.astype(np.float64).T
    g = x @ wg.astype(np.float64)
    u = x @ wu.astype(np.float64)
    h = (g / (1 + np.exp(-g)) * u).astype(BF16).astype(np.float64)
    return h @ wd.astype(np.float64)


def _matmuls_alone(tok, hid, inter):
    """The kernel's nc_matmul instructions alone (same shapes, accumulation and count)."""
    mm = t3.Program(sync="manual")
    a, xb = mm.sbuf((128, 128), BF16), mm.sbuf((128, TB), BF16)
    w = mm.sbuf((128, 512), BF16)
    ps, ps2 = mm.psum((128, TB), np.float32), mm.psum((128, 512), np.float32)
    nk, ni = hid // 128, inter // 128
    for _ in range(tok // TB):
        for _ in range(ni):
            for kt in range(nk):
                for _ in range(2):
                    mm.nc_matmul(dst=ps, stationary=a, moving=xb, accumulate=kt != 0)
        for _ in range((TB // 128) * (hid // 512)):
            for it in range(ni):
                mm.nc_matmul(dst=ps2, stationary=a, moving=w, accumulate=it != 0)
    return mm


def test_nki_moe_expert_mlp(benchmark):
    args = make_inputs()
    ref = reference(*args)
    expert_mlp.cache_clear()
    t3.set_num_threads(1)
    try:
        out = benchmark.pedantic(expert_mlp, args=args, rounds=3, iterations=1, warmup_rounds=1)
        dev, mm = t3.Device(), _matmuls_alone(TOK, HID, INTER)
        emu_mm = median_s(lambda: dev.run(mm, check_races=False, trace=False), 3)
    finally:
        t3.set_num_threads(0)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2e-2, atol=2e-2)
    warm = benchmark.stats.stats.median
    flop = 3 * 2 * TOK * HID * INTER
    x32, wg32 = np.ones((TOK, HID), np.float32), np.ones((HID, INTER), np.float32)
    wd32 = np.ones((INTER, HID), np.float32)
    h32 = np.ones((TOK, INTER), np.float32)

    def host_matmuls():
        x32 @ wg32
        x32 @ wg32
        h32 @ wd32

    with blas_threads(1):
        host_mm = median_s(host_matmuls, 3)
    benchmark.extra_info.update(
        instructions=sum(len(p) for p in expert_mlp.last_programs),
        matmul_gflop=flop / 1e9,
        emulated_gflops=flop / warm / 1e9,
        warm_median_s=warm,
        emulator_matmuls_s=emu_mm,
        whole_over_matmuls=warm / emu_mm,
        whole_over_matmuls_target=1.4,
        host_sgemm_s=host_mm,
        fraction_of_host=host_mm / warm,
        emulator_threads=1,
        load_avg_1min=load_avg(),
    )
