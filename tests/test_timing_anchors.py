"""The cost model against the published Trainium measurements (docs/cost-model.md, "Validation";
the anchors and their sources: the reference's timing-anchors list). Each anchor is rebuilt by
`trn3emu.calibration` and run with its generation's constants (`Device(timing=...)`); the
published values are typed here from their sources, not taken from earlier output."""

import numpy as np
import pytest
import trn3emu as t3
from trn3emu import _native, calibration
from trn3emu.errors import EmuError


def test_timing_selects_a_generation_and_rejects_others(monkeypatch):
    assert t3.Device().timing == "trn3"
    assert t3.Device(timing="trn1").timing == "trn1"
    monkeypatch.setenv("TRN3EMU_TIMING", "trn2")
    assert t3.Device().timing == "trn2"
    assert t3.Device(timing="trn3").timing == "trn3"  # the argument wins
    with pytest.raises(EmuError) as e:
        t3.Device(timing="trn9")
    assert e.value.rule == "unknown_timing"
    monkeypatch.setenv("TRN3EMU_TIMING", "nope")
    with pytest.raises(EmuError) as e:
        t3.Device()
    assert e.value.rule == "unknown_timing"


def test_generation_constants_are_the_published_ones():
    # Clocks, DMA rates and HBM bandwidth per generation (timing-anchors reference table).
    want = {
        "trn1": (2.8, 1.12, 1.4, 17.0, 820.0),
        "trn2": (2.4, 0.96, 1.2, 23.0, 2900.0),
        "trn3": (2.4, 1.2, 1.2, 33.0, 4700.0),
    }
    for gen, (te, ve, se, dma, hbm) in want.items():
        c = _native.cost_params(gen)
        got = (c["tensor_ghz"], c["vector_ghz"], c["scalar_ghz"], c["dma_engine_bytes_per_ns"], c["hbm_bytes_per_ns"])
        assert got == (te, ve, se, dma, hbm), gen


def test_functional_results_do_not_depend_on_the_timing():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 2048)).astype(np.float32)
    outs, times = [], []
    for gen in ("trn1", "trn2", "trn3"):
        dev = t3.Device(timing=gen)
        src, dst = dev.hbm.put(x), dev.hbm.alloc((128, 2048), np.float32)
        p = t3.Program()
        t = p.sbuf((128, 2048), np.float32)
        p.dma_copy(dst=t, src=src)
        p.activation(dst=t, op="exp", data=t)
        p.dma_copy(dst=dst, src=t)
        r = dev.run(p)
        outs.append(dev.hbm.get(dst))
        times.append(r.time_ns)
        assert r.trace.timing == gen
        assert f"published constants of {gen}" in r.trace.summary()
        assert r.trace.stats()["timing"] == gen
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    assert len(set(times)) == 3


def test_i1_one_dma_engine_moves_32_kib_in_1416_ns():
    assert calibration.dma_one_engine_ns("trn2") == pytest.approx(1416.0, rel=0.10)


@pytest.mark.parametrize("nbytes,published", calibration.DMA_CURVE)
def test_i2_dma_efficiency_curve(nbytes, published):
    # Read off the DMA overview's figure (Trn2, P = 128): within 10 percentage points.
    assert abs(calibration.dma_efficiency(nbytes, "trn2") - published) <= 10.0


def test_i2_time_per_transfer_is_flat_to_2_kib_then_linear():
    eff = {b: calibration.dma_efficiency(b, "trn2") for b in (256, 512, 1024, 2048, 8192)}
    # Flat time: efficiency proportional to bytes up to 2 KiB ...
    assert eff[512] / eff[256] == pytest.approx(2.0, rel=0.05)
    assert eff[2048] / eff[1024] == pytest.approx(2.0, rel=0.05)
    # ... then linear time: efficiency saturates.
    assert eff[8192] > 95.0


def test_i3_dependent_one_element_scalar_chain():
    assert calibration.dependent_scalar_chain_ns("trn1") == pytest.approx(189.0, rel=0.15)


def test_i4_back_to_back_matmul_intervals():
    short_moving, short_stationary = calibration.matmul_intervals_cycles("trn1")
    assert short_moving == pytest.approx(64.0, rel=0.10)
    assert short_stationary == pytest.approx(128.0, rel=0.10)


def test_i5_dependent_vector_instruction_overhead():
    assert calibration.dependent_overhead_cycles("trn1") == pytest.approx(100.0, rel=0.10)


def test_i6_hardware_dge_issue():
    assert calibration.hwdge_issue_ns("trn2") == pytest.approx(600.0, rel=0.10)


def test_i7_dynamic_address_initiation_interval():
    assert calibration.dynamic_copy_ii_cycles("trn2") == pytest.approx(600.0, rel=0.10)


def test_i8_strided_access_halves_the_bandwidth():
    assert calibration.stride_penalty("trn1") == pytest.approx(2.0, rel=0.10)


def test_fast_vector_modes_only_where_documented():
    # tensor_copy bf16 SBUF->SBUF contiguous: 4x on trn2/trn3 (v3+ perf mode), 1x on trn1.
    def copy_ns(gen, dt, step=1, mem="sbuf"):
        dev = t3.Device(timing=gen)
        p = t3.Program()
        src = p.sbuf((128, 4096 * step), dt) if mem == "sbuf" else p.psum((128, 512 * step), dt)
        f = 4096 if mem == "sbuf" else 512
        dst = p.sbuf((128, f), dt)
        p.memset(dst=src, value=1.0, engine="vector")
        p.memset(dst=p.sbuf((128, 1), np.float32), value=0.0, engine="vector")  # copy is not dependent
        p.tensor_copy(dst=dst, src=src[:, ::step][:, :f], engine="vector")
        ins = dev.run(p).trace.instructions
        return float(ins["end_ns"][-1] - ins["start_ns"][-1])

    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    ghz = {g: _native.cost_params(g)["vector_ghz"] for g in ("trn1", "trn2")}
    assert copy_ns("trn1", bf16) * ghz["trn1"] == pytest.approx(4096, rel=0.01)
    assert copy_ns("trn2", bf16) * ghz["trn2"] == pytest.approx(1024, rel=0.01)
    assert copy_ns("trn2", np.float32) * ghz["trn2"] == pytest.approx(4096, rel=0.01)
    # Non-contiguous (stride 2 x 2 B = 4 B, no stride penalty): 2x; PSUM side contiguous: 2x.
    assert copy_ns("trn2", bf16, step=2) * ghz["trn2"] == pytest.approx(2048, rel=0.01)
    assert copy_ns("trn2", bf16, mem="psum") * ghz["trn2"] == pytest.approx(256, rel=0.01)
    # fp8 is not among the documented dtypes: no mode.
    assert copy_ns("trn2", "float8_e4m3") * ghz["trn2"] == pytest.approx(4096, rel=0.01)


def test_gpsimd_rsqrt_is_four_times_slower_than_scalar():
    def ns(engine):
        dev = t3.Device(timing="trn2")
        p = t3.Program()
        src, dst = p.sbuf((128, 2048), np.float32), p.sbuf((128, 2048), np.float32)
        p.memset(dst=src, value=4.0, engine="vector")
        p.tensor_scalar(dst=dst, data=src, op0="rsqrt", engine=engine)
        ins = dev.run(p).trace.instructions
        return float(ins["end_ns"][-1] - ins["start_ns"][-1])

    assert ns("gpsimd") / ns("scalar") == pytest.approx(4.0, rel=0.01)


# --------------------------------------------------------------------------- tutorial
def _affine_in_n(name, k, m, ns, n_full):
    """Modelled ms at `n_full` from runs at the `ns` (time is affine in N for these loops)."""
    (n0, n1) = ns
    t0 = calibration.tutorial_ms(name, (k, m, n0))
    t1 = calibration.tutorial_ms(name, (k, m, n1))
    return t0 + (t1 - t0) * (n_full - n0) / (n1 - n0)


@pytest.mark.slow
def test_matmul_tutorial_latencies_and_speed_up():
    """The four tutorial kernels on timing="trn1" at the published shape, [4096, 8192] @ [8192,
    8192] bf16, within 25 % of the published latencies. To stay within CI time the kernels run
    at a smaller M and/or N and are scaled: every loop level is a whole number of blocks, the
    time is linear in M (tiled, hoisted, blocked: identical M blocks) and affine in N (two N
    values give the line); the optimised kernel keeps M = 4096 (its two 2048-row blocks) and
    is linear in its N blocks. The full-shape numbers are in docs/cost-model.md."""
    k, m, n = calibration.TUTORIAL_SHAPE
    got = {
        "tiled": calibration.tutorial_ms("tiled", (k, 512, 512)) * (m / 512) * (n / 512),
        "hoisted": _affine_in_n("hoisted", k, 512, (512, 1024), n) * (m / 512),
        "blocked": _affine_in_n("blocked", k, 512, (1024, 2048), n) * (m / 512),
        "optimized": calibration.tutorial_ms("optimized", (k, m, 1024)) * (n / 1024),
    }
    for name, published in calibration.TUTORIAL.items():
        # hoisted: the known deviation of the derived trn1 DMA rates (docs/cost-model.md, "Trn1
        # DMA rates"): its 1 KiB rows move at 152 GB/s in the model, 101.5 GB/s on hardware.
        low = 0.70 if name == "hoisted" else 0.75
        assert low * published <= got[name] <= 1.25 * published, (name, got)
    assert got["tiled"] / got["optimized"] >= 6.0, got


def test_trn1_dma_rates_come_from_the_published_per_engine_figures():
    """timing="trn1" takes the DMA bandwidth guide's 17 B/ns per engine x 16 engines at full share
    and the per-buffer floor measured on trn2 (anchor I2): nothing is fitted to the tutorial. Large
    stores reach the published aggregate (272 GB/s per core, less the per-buffer cost: 16 KiB rows
    -> 272 x 16384 / (16384 + 7.4 x 17) = 270 GB/s, plus the 1.3 us start); hardware measures
    ~250 GB/s for large stores on trn1 (issue 27)."""
    c = _native.cost_params("trn1")
    assert c["dma_sustained"] == 1.0 and c["dma_engine_bytes_per_ns"] == 17.0 and c["dma_engines"] == 16
    assert c["dma_descriptor_min_ns"] == _native.cost_params("trn2")["dma_descriptor_min_ns"] == 108.0
    p = t3.Program()
    dev = t3.Device(timing="trn1")
    x = np.ones((128, 4096), np.float32)  # 16 KiB per partition
    src = dev.hbm.put(x)
    outs = [dev.hbm.alloc((128, 4096), np.float32) for _ in range(8)]
    sb = p.sbuf((128, 4096), np.float32)
    p.dma_copy(dst=sb, src=src)
    for o in outs:
        p.dma_copy(dst=o, src=sb)
    r = dev.run(p)
    stores = [row for row in r.trace.dma if row["index"] > 0]
    span = max(row["end_ns"] for row in stores) - min(row["start_ns"] for row in stores)
    gbps = 8 * x.nbytes / span
    per_row = 16384 / 17.0 + 7.4  # ns per 16 KiB buffer on one engine
    want = 16 * 16384 / per_row  # bytes/ns: 16 engines, each 8 such rows back to back
    assert 0.95 * want <= gbps <= want * 1.0001, (gbps, want)
    assert gbps >= 250.0


def test_cli_trace_states_the_generation(tmp_path):
    import subprocess
    import sys

    prog = tmp_path / "p.t3s"
    prog.write_text(
        ".core 0\nmemset.vector dst=sbuf:float32[0:128]+0[[1,64]] value=1.0\n"
        "activation.scalar dst=sbuf:float32[0:128]+1024[[1,64]] op=exp data=sbuf:float32[0:128]+0[[1,64]]\n"
    )
    for args, gen in (([], "trn3"), (["--timing", "trn1"], "trn1")):
        r = subprocess.run(
            [sys.executable, "-m", "trn3emu", "trace", str(prog), "--out", str(tmp_path / "t.json"), *args],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        assert f"published constants of {gen}" in r.stdout


def test_dual_chiplet_locality():
    # Stacks: lower half of HBM on chiplet 0's stacks 0/1, upper half on chiplet 1's 2/3,
    # alternating every HBM_INTERLEAVE_BYTES (an estimate, docs/cost-model.md).
    half, g = _native.HBM_BYTES // 2, _native.HBM_INTERLEAVE_BYTES
    assert [_native.hbm_stack(a) for a in (0, g, 2 * g, half, half + g)] == [0, 1, 0, 2, 3]
    assert (_native.CHIPLETS, _native.HBM_STACKS) == (2, 4)

    def load_ns(core, address, timing="trn3"):
        dev = t3.Device(timing=timing)
        src = dev.hbm.alloc((128, 2048), np.float32, address=address)
        p = t3.Program(core=core)
        p.dma_copy(dst=p.sbuf((128, 2048), np.float32), src=src)
        d = dev.run(p).trace.dma
        return float(d["end_ns"][0] - d["start_ns"][0])

    near0, far0 = load_ns(0, 0), load_ns(0, half)
    near4, far4 = load_ns(4, half), load_ns(4, 0)
    assert far0 >= near0 + 200.0  # + the far latency, and the die-to-die link
    assert (near0, far0) == (near4, far4)  # symmetric between the chiplets
    # Under trn1 / trn2 timing every stack is near.
    assert load_ns(0, 0, "trn2") == load_ns(0, half, "trn2")


def test_core_private_tensors_are_placed_on_their_chiplet():
    """`hbm.alloc(..., core=k)` places automatically on core k's chiplet (cores 4-7: the upper
    half's stacks 2/3), so core k reads it at the near cost; shared tensors start at address 0."""
    half = _native.HBM_BYTES // 2
    dev = t3.Device()
    shared = dev.hbm.alloc((128, 2048), np.float32)
    mine = {k: dev.hbm.alloc((128, 2048), np.float32, core=k) for k in (1, 5, 6)}
    after = dev.hbm.alloc((16,), np.float32)
    assert shared.offset == 0 and mine[1].offset < half and after.offset < half
    assert mine[5].offset == half and mine[6].offset >= half + mine[5].nbytes
    assert _native.hbm_stack(mine[5].offset) in (2, 3) and _native.hbm_stack(mine[1].offset) in (0, 1)
    # No two live allocations overlap.
    spans = sorted((t.offset, t.offset + t.nbytes) for t in (shared, after, *mine.values()))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))

    def load_ns(src):
        p = t3.Program(core=5)
        p.dma_copy(dst=p.sbuf((128, 2048), np.float32), src=src)
        d = dev.run(p).trace.dma
        return float(d["end_ns"][0] - d["start_ns"][0])

    assert load_ns(mine[5]) + 200.0 <= load_ns(shared)  # the shared one is on the far chiplet
