"""Timing model properties (not wall-clock): throughput against the published peaks, DMA
bandwidth and fixed cost, engine overlap, semaphore serialisation, trace views and exports.

Reference numbers come from the NeuronCore-v4 reference (§1.2 clocks and peaks, §1.8 DMA):
TensorE 128 x 128 PEs x 2 flop x 2.4 GHz = 78.6 TFLOPS bf16 ("79"), fp32 1/4 of it; 16 DMA
engines x 33 B/ns = 528 GB/s per core; ~1.3 us fixed cost per DMA; HBM 4.7 TB/s per device.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from trn3emu import _native
from trn3emu.cli import main as cli

BF16 = ml_dtypes.bfloat16
PEAK_BF16_TFLOPS = 79.0
DMA_ENGINE_BYTES_PER_NS = 33.0
DMA_PER_CORE = 16 * DMA_ENGINE_BYTES_PER_NS
DMA_FIXED_NS = 1300.0
HBM_BYTES_PER_NS = 4700.0
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync")


def matmul_chain(dev: t3.Device, dtype, count: int) -> t3.RunResult:
    """`count` back-to-back 128x128x512 matmuls accumulating into one PSUM bank."""
    p = t3.Program(sync="auto")
    st = p.sbuf((128, 128), dtype)
    mv = p.sbuf((128, 512), dtype)
    p.dma_copy(dst=st, src=dev.hbm.put(np.ones((128, 128), dtype)))
    p.dma_copy(dst=mv, src=dev.hbm.put(np.ones((128, 512), dtype)))
    acc = p.psum((128, 512), np.float32)
    for i in range(count):
        p.nc_matmul(dst=acc, stationary=st, moving=mv, accumulate=i > 0)
    return dev.run(p)


def chain_tflops(result: t3.RunResult) -> float:
    mm = result.trace.instructions
    mm = mm[mm["engine"] == "tensor"]
    # Independent FLOP count: 2 * K * M * N per matmul.
    assert (mm["flops"] == 2 * 128 * 128 * 512).all()
    span_ns = mm["end_ns"].max() - mm["start_ns"].min()
    return 2 * 128 * 128 * 512 * len(mm) / span_ns / 1e3


def test_bf16_matmul_chain_reaches_90_percent_of_peak(dev):
    tf = chain_tflops(matmul_chain(dev, BF16, 64))
    assert tf >= 0.9 * PEAK_BF16_TFLOPS
    assert tf <= 128 * 128 * 2 * 2.4e9 / 1e12 * 1.0001  # never above the array's peak


def test_fp32_matmul_chain_is_a_quarter_of_bf16():
    bf = chain_tflops(matmul_chain(t3.Device(), BF16, 32))
    f32 = chain_tflops(matmul_chain(t3.Device(), np.float32, 12))
    assert f32 / bf == pytest.approx(0.25, rel=0.05)


def test_mxfp8_matmul_chain_reaches_90_percent_of_315(dev):
    p = t3.Program(sync="auto")
    st = p.sbuf((128, 128), "float8_e4m3fn_x4")
    mv = p.sbuf((128, 512), "float8_e4m3fn_x4")
    ss = p.sbuf((128, 128), np.uint8)
    ms = p.sbuf((128, 512), np.uint8)
    for t, shape, dt in ((st, (128, 128), np.uint32), (mv, (128, 512), np.uint32)):
        p.dma_copy(dst=t, src=dev.hbm.put(np.full(shape, 0x38383838, dt), dtype="float8_e4m3fn_x4"))
    for t, shape in ((ss, (128, 128)), (ms, (128, 512))):
        p.dma_copy(dst=t, src=dev.hbm.put(np.full(shape, 127, np.uint8)))
    acc = p.psum((128, 512), np.float32)
    for i in range(64):
        p.nc_matmul_mx(dst=acc, stationary=st, moving=mv, stationary_scale=ss, moving_scale=ms, accumulate=i > 0)
    mm = dev.run(p).trace.instructions
    mm = mm[mm["engine"] == "tensor"]
    flops = 2 * 512 * 128 * 512 * len(mm)
    assert flops / (mm["end_ns"].max() - mm["start_ns"].min()) / 1e3 >= 0.9 * 315


def test_large_hbm_to_sbuf_copy_reaches_modelled_dma_bandwidth(dev):
    src = dev.hbm.put(np.zeros((128, 65536), BF16))  # 16 MiB, 128 KiB per partition
    p = t3.Program(sync="manual")
    p.dma_copy(dst=p.sbuf((128, 65536), BF16), src=src)
    d = dev.run(p).trace.dma
    assert len(d) == 1 and d["dma_engines"][0] == 16 and d["bytes"][0] == 128 * 65536 * 2
    rate = d["bytes"][0] / (d["end_ns"][0] - d["start_ns"][0])
    assert 0.9 * DMA_PER_CORE <= rate <= DMA_PER_CORE
    spans = dev.run(p).trace.dma_engines
    # Each of the 16 engines moved 8 partitions x 128 KiB, at most 33 B/ns.
    assert sorted(spans["engine"]) == list(range(16)) and (spans["bytes"] == 8 * 65536 * 2).all()
    assert (spans["bytes"] / (spans["end_ns"] - spans["start_ns"]) <= DMA_ENGINE_BYTES_PER_NS).all()


def test_partition_split_decides_how_many_engines_work(dev):
    # 32 partitions = 4 engines of 8 partitions each: a quarter of the per-core bandwidth.
    src = dev.hbm.put(np.zeros((32, 65536), BF16))
    p = t3.Program(sync="manual")
    p.dma_copy(dst=p.sbuf((32, 65536), BF16), src=src)
    d = dev.run(p).trace.dma
    assert d["dma_engines"][0] == 4
    rate = d["bytes"][0] / (d["end_ns"][0] - d["start_ns"][0])
    assert 0.85 * 4 * DMA_ENGINE_BYTES_PER_NS <= rate <= 4 * DMA_ENGINE_BYTES_PER_NS


def test_small_dma_costs_at_least_the_fixed_cost(dev):
    p = t3.Program(sync="manual")
    p.dma_copy(dst=p.sbuf((1, 16), np.float32), src=dev.hbm.put(np.zeros((1, 16), np.float32)))
    d = dev.run(p).trace.dma
    assert d["end_ns"][0] - d["start_ns"][0] >= DMA_FIXED_NS
    # One 64-byte DMA buffer still occupies its engine for the per-descriptor minimum (fitted to
    # the published DMA throughput curve, docs/cost-model.md table 2), on top of the fixed cost.
    floor = _native.cost_params()["dma_descriptor_min_ns"]
    assert d["end_ns"][0] - d["start_ns"][0] < DMA_FIXED_NS + floor + 10


def test_priority_decides_who_gets_busy_engines(dev):
    """Two transfers wait for engines a third occupies: the lower priority value goes first,
    whichever queue it sits on."""

    def run(prio_gpsimd: int, prio_sync: int) -> np.ndarray:
        d = t3.Device()
        src = d.hbm.put(np.zeros((128, 8192), BF16))
        p = t3.Program(sync="manual")
        a, b, c = (p.sbuf((128, 8192), BF16) for _ in range(3))
        p.dma_copy(dst=a, src=src, engine="sync", priority=3)
        # GpSimd triggers after the sync transfer owns the engines (its queue would win ties).
        p.memset(dst=p.sbuf((128, 512), np.float32), value=0.0, engine="gpsimd")
        p.dma_copy(dst=b, src=src, engine="gpsimd", priority=prio_gpsimd)
        p.dma_copy(dst=c, src=src, engine="sync", priority=prio_sync)
        t = d.run(p).trace.dma
        t = t[np.argsort(t["index"])]
        assert t["start_ns"][0] < min(t["start_ns"][1], t["start_ns"][2])
        return t

    t = run(3, 0)
    assert t["start_ns"][2] < t["start_ns"][1]  # sync's priority-0 transfer overtakes
    assert t["start_ns"][1] >= t["end_ns"][2] - DMA_FIXED_NS - 1e-6
    t = run(0, 3)
    assert t["start_ns"][1] < t["start_ns"][2]


def test_hbm_bandwidth_cap_is_shared_by_all_cores():
    dev = t3.Device()
    progs, nbytes = [], 128 * 16384 * 2
    for core in range(8):
        src = dev.hbm.put(np.zeros((128, 16384), BF16))
        dst = dev.hbm.alloc((128, 16384), BF16)
        p = t3.Program(core=core, sync="manual")
        p.dma_copy(dst=dst, src=src)
        progs.append(p)
    tr = dev.run(progs).trace
    d = tr.dma
    assert (d["hbm_bytes"] == 2 * nbytes).all()  # read and write both in HBM
    # The aggregate HBM traffic never exceeds 4.7 TB/s...
    assert d["hbm_bytes"].sum() / tr.total_ns <= HBM_BYTES_PER_NS * 1.0001
    # ...which binds here: 8 cores x 528 GB/s x 2 sides > 4.7 TB/s.
    alone = t3.Device()
    p = t3.Program(sync="manual")
    p.dma_copy(dst=alone.hbm.alloc((128, 16384), BF16), src=alone.hbm.put(np.zeros((128, 16384), BF16)))
    one = alone.run(p).trace.dma
    assert one["end_ns"][0] < d["end_ns"].max() * 0.75


def _dma_with_vector_work(dependent: bool) -> t3.RunResult:
    dev = t3.Device()
    p = t3.Program(sync="manual")
    big = p.sbuf((128, 32768), BF16)
    x = p.sbuf((128, 2048), np.float32)
    y = p.sbuf((128, 2048), np.float32)
    s = p.semaphore()
    p.dma_copy(dst=big, src=dev.hbm.put(np.zeros((128, 32768), BF16)), signal=s)
    for i in range(4):
        w = (s, 1) if dependent and i == 0 else []
        p.tensor_copy(dst=y, src=x, engine="vector", wait=w)
    return dev.run(p)


def test_independent_engines_overlap():
    r = _dma_with_vector_work(dependent=False)
    d, ins = r.trace.dma, r.trace.instructions
    vec = ins[ins["engine"] == "vector"]
    vec_busy = (vec["end_ns"] - vec["start_ns"]).sum()
    assert vec_busy > 5000  # the compute is substantial ...
    assert r.time_ns == pytest.approx(d["end_ns"].max())  # ... and hidden behind the DMA
    assert r.time_ns < d["end_ns"].max() + vec_busy


def test_semaphore_chain_serialises():
    r = _dma_with_vector_work(dependent=True)
    d, ins = r.trace.dma, r.trace.instructions
    vec = ins[ins["engine"] == "vector"]
    sem_latency = t3.trace.COST["sem_latency_ns"]
    assert vec["start_ns"].min() >= d["end_ns"][0] + sem_latency - 1e-6
    assert r.time_ns >= d["end_ns"][0] + (vec["end_ns"] - vec["start_ns"]).sum()
    sems = r.trace.semaphores
    waits = sems[sems["kind"] == "wait"]
    assert len(waits) == 1 and waits["by_unit"][0] == "dma.sync" and waits["by_index"][0] == 0


def test_cross_engine_chain_each_waits_for_the_previous(dev):
    p = t3.Program(sync="manual")
    x = p.sbuf((128, 512), np.float32)
    y = p.sbuf((128, 512), np.float32)
    s = p.semaphore()
    p.memset(dst=x, value=1.0, engine="vector", signal=s)
    p.tensor_copy(dst=y, src=x, engine="scalar", wait=(s, 1), signal=s)
    p.tensor_copy(dst=x, src=y, engine="gpsimd", wait=(s, 2), signal=s)
    p.tensor_copy(dst=y, src=x, engine="vector", wait=(s, 3))
    ins = dev.run(p).trace.instructions
    ins = ins[np.argsort(ins["index"])]
    lat = t3.trace.COST["sem_latency_ns"]
    for a, b in zip(ins[:-1], ins[1:]):
        assert b["start_ns"] == pytest.approx(a["end_ns"] + lat, abs=1e-3)


def _all_engines_program(dev: t3.Device) -> t3.Program:
    p = t3.Program(sync="auto")
    a = p.sbuf((128, 128), BF16, name="a")
    b = p.sbuf((128, 512), BF16, name="b")
    p.dma_copy(dst=a, src=dev.hbm.put(np.ones((128, 128), BF16)), name="kernel.py:10")
    p.dma_copy(dst=b, src=dev.hbm.put(np.ones((128, 512), BF16)), engine="scalar", name="kernel.py:11")
    acc = p.psum((128, 512), np.float32)
    p.nc_matmul(dst=acc, stationary=a, moving=b, name="kernel.py:12")
    o = p.sbuf((128, 512), np.float32)
    p.activation(dst=o, op="exp", data=acc, name="kernel.py:13")
    o2 = p.sbuf((128, 512), np.float32)
    p.tensor_tensor(dst=o2, data1=o, data2=o, op="add", name="kernel.py:14")
    i = p.sbuf((128, 64), np.int32)
    p.iota(dst=i, pattern=[[1, 64]], offset=0, channel_multiplier=1, name="kernel.py:15")
    out = dev.hbm.alloc((128, 512), np.float32)
    p.dma_copy(dst=out, src=o2, name="kernel.py:16")
    return p


def test_trace_views_schema_and_source_lines(dev):
    tr = dev.run(_all_engines_program(dev)).trace
    assert tr.schema_version == t3.trace.SCHEMA_VERSION == 1
    ins, d = tr.instructions, tr.dma
    assert set(ins["engine"]) == {"tensor", "scalar", "vector", "gpsimd", "sync"}
    assert len(d) == 3 and set(d["queue"]) == {"sync", "scalar"}
    mm = ins[ins["opcode"] == "nc_matmul"][0]
    assert mm["name"] == "kernel.py:12" and mm["flops"] == 2 * 128 * 128 * 512
    assert "stationary=" in mm["operands"]
    assert (np.sort(d, order="index")["bytes"] == [128 * 128 * 2, 128 * 512 * 2, 128 * 512 * 4]).all()
    assert (ins["end_ns"] > ins["start_ns"]).all() and (d["end_ns"] > d["start_ns"]).all()
    sems = tr.semaphores
    assert (sems["kind"] == "wait").any() and (sems["kind"] == "signal").any()
    # Every wait that needed a signal names one that became visible no later than the wait.
    for w in sems[sems["kind"] == "wait"]:
        if w["by_index"] >= 0:
            sig = sems[(sems["kind"] == "signal") & (sems["index"] == w["by_index"]) & (sems["unit"] == w["by_unit"])]
            assert len(sig) and sig["time_ns"].min() <= w["time_ns"] + 1e-6
    text = tr.summary()
    for e in ("tensor", "vector", "scalar", "gpsimd", "dma.sync", "critical path", "estimated time", "TFLOPS"):
        assert e in text
    st = tr.stats()
    assert sum(st["critical_path_ns_by_unit"].values()) == pytest.approx(tr.total_ns)
    path = st["critical_path"]
    ends = tr.columns["end_ns"][path]
    assert (np.diff(ends) >= 0).all() and ends[-1] == tr.total_ns


def test_tracing_off_changes_nothing_but_the_trace():
    on = t3.Device()
    off = t3.Device()
    r1 = on.run(_all_engines_program(on))
    r2 = off.run(_all_engines_program(off), trace=False)
    assert r1.time_ns == r2.time_ns and len(r2.trace) == 0 and len(r1.trace) > 0


def test_estimated_times_are_deterministic():
    runs = []
    for _ in range(2):
        dev = t3.Device()
        runs.append(dev.run(_all_engines_program(dev)).trace.columns)
    for k in ("start_ns", "end_ns", "unit", "index", "bytes", "flops"):
        assert np.array_equal(runs[0][k], runs[1][k])


def validate_chrome_trace(doc: dict) -> None:
    """Structural checks of Chrome Trace Event JSON as Perfetto reads it."""
    ev = doc["traceEvents"]
    assert doc["displayTimeUnit"] in ("ns", "ms")
    assert {e["ph"] for e in ev} <= {"M", "X", "s", "f", "C"}
    procs = {e["pid"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in ev:
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
            assert isinstance(e["args"], dict) and e["args"]
    slices: dict[tuple, list] = {}
    for e in ev:
        if e["ph"] == "X":
            assert e["pid"] in procs and (e["pid"], e["tid"]) in threads
            assert e["ts"] >= 0 and e["dur"] > 0 and isinstance(e["name"], str)
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in slices.values():  # per track: slices nest or are disjoint, never partially overlap
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[float] = []
        for s, t in spans:
            while stack and stack[-1] <= s + 1e-9:
                stack.pop()
            assert not stack or t <= stack[-1] + 1e-9
            stack.append(t)
    flows: dict[int, dict] = {}
    for e in ev:
        if e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], {})[e["ph"]] = e
            assert any(a - 1e-9 <= e["ts"] <= b + 1e-9 for a, b in slices[(e["pid"], e["tid"])])
    for f in flows.values():
        assert set(f) == {"s", "f"} and f["f"].get("bp") == "e" and f["s"]["ts"] <= f["f"]["ts"]
    for e in ev:
        if e["ph"] == "C":
            assert e["pid"] in procs and all(isinstance(v, (int, float)) for v in e["args"].values())


def test_perfetto_json_is_structurally_valid(dev, tmp_path):
    p0 = _all_engines_program(dev)
    p1 = t3.Program(core=1, sync="manual")
    for _ in range(3):  # overlapping transfers on one queue go to separate lanes
        p1.dma_copy(dst=p1.sbuf((128, 4096), BF16), src=dev.hbm.put(np.zeros((128, 4096), BF16)))
    tr = dev.run([p0, p1]).trace
    assert tr.to_perfetto(tmp_path / "t.json") == tmp_path / "t.json"
    loaded = json.loads((tmp_path / "t.json").read_text())
    validate_chrome_trace(loaded)
    ev = loaded["traceEvents"]
    assert {e["args"]["name"] for e in ev if e["name"] == "process_name"} == {"core 0", "core 1"}
    names = {e["args"]["name"] for e in ev if e["name"] == "thread_name" and e["pid"] == 0}
    assert {f"{e} engine" for e in ENGINES} <= names and "dma queue 4 (sync)" in names
    assert {f"dma engine {e}" for e in range(16)} <= names
    assert sum(1 for e in ev if e["ph"] == "s" and e["cat"] == "semaphore") >= 1
    assert sum(1 for e in ev if e["ph"] == "s" and e["cat"] == "dma") == len(tr.dma)
    counters = [e for e in ev if e["ph"] == "C" and e["pid"] == 0]
    assert {e["name"] for e in counters} == {"SBUF bytes written", "PSUM bytes written"}
    psum = [e["args"]["bytes"] for e in counters if e["name"] == "PSUM bytes written"]
    assert psum[-1] == 128 * 512 * 4  # the matmul's one bank, 128 partitions x 2 KiB


def test_plot_png_shows_every_engine(dev, tmp_path):
    pytest.importorskip("matplotlib")
    tr = dev.run(_all_engines_program(dev)).trace
    labels = tr.plot(tmp_path / "t.png")
    data = (tmp_path / "t.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert {f"core 0 {e}" for e in ENGINES} <= set(labels)


def test_cli_trace_writes_perfetto_and_prints_summary(tmp_path, capsys):
    prog = tmp_path / "k.t3s"
    p = t3.Program(sync="manual")
    s = p.semaphore()
    x = p.sbuf((128, 512), np.float32)
    p.memset(dst=x, value=2.0, engine="gpsimd", signal=s)
    p.tensor_copy(dst=p.sbuf((128, 512), np.float32), src=x, engine="vector", wait=(s, 1))
    prog.write_text(p.to_text())
    out = tmp_path / "trace.json"
    assert cli(["trace", str(prog), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "estimated time" in text and "critical path" in text
    validate_chrome_trace(json.loads(out.read_text()))


def test_cli_trace_of_a_python_kernel(tmp_path, capsys):
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "tiled_matmul.py"
    out = tmp_path / "trace.json"
    assert cli(["trace", str(example), "--out", str(out)]) == 0
    assert "tensor" in capsys.readouterr().out
    validate_chrome_trace(json.loads(out.read_text()))


def test_flash_attention_example_timeline(tmp_path):
    """The PNG timeline of the causal flash-attention example (seq 4096, d 128, through the NKI
    front end) is produced and shows every engine's track."""
    pytest.importorskip("matplotlib")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "nki_flash_attention.py"
    spec = importlib.util.spec_from_file_location("nki_flash_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    q_t, k_t, v, scale = mod.make_inputs(seq=4096, d=128)
    mod.flash_attention_causal(q_t, k_t, v, scale)
    tr = mod.flash_attention_causal.last_result.trace
    labels = tr.plot(tmp_path / "fa.png")
    assert (tmp_path / "fa.png").read_bytes()[:4] == b"\x89PNG"
    used = {lab.split()[-1] for lab in labels}
    assert {"tensor", "vector", "scalar", "gpsimd"} <= used and any(u.startswith("dma.") for u in used)
