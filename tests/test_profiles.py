"""Profiles: the PNG timeline's busy pixels, the Perfetto export (source-line slices, gzip), the
per-source-line roll-up, nki.profile / nki.benchmark writing their files."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fa_trace():
    spec = importlib.util.spec_from_file_location(
        "nki_flash_attention_prof", ROOT / "examples" / "nki_flash_attention.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    q_t, k_t, v, scale = mod.make_inputs(seq=4096, d=128)
    mod.flash_attention_causal(q_t, k_t, v, scale)
    return mod.flash_attention_causal.last_result.trace


def _union_length(st: np.ndarray, en: np.ndarray) -> float:
    """Independent reference: the length of a union of intervals, by a plain sweep."""
    total, cur_s, cur_e = 0.0, None, None
    for a, b in sorted(zip(st.tolist(), en.tolist())):
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


def _reference_busy(tr, t0: float, t1: float) -> dict[str, float]:
    """Busy fraction of [t0, t1] per unit from the trace's numpy views."""
    out = {}
    ins = tr.instructions
    for eng in np.unique(ins["engine"]).tolist():
        m = ins["engine"] == eng
        st, en = np.clip(ins["start_ns"][m], t0, t1), np.clip(ins["end_ns"][m], t0, t1)
        out[eng] = float((en - st).sum()) / (t1 - t0)
    dma = tr.dma
    for q in np.unique(dma["queue"]).tolist():
        m = dma["queue"] == q
        st, en = np.clip(dma["start_ns"][m], t0, t1), np.clip(dma["end_ns"][m], t0, t1)
        out[f"dma.{q}"] = _union_length(st, en) / (t1 - t0)
    return out


def _png_bands(path: Path) -> tuple[list[float], list[int], list[np.ndarray]]:
    """Read the PNG back: find the unit rows (runs of pixel rows with no white pixel across the
    plot's columns, located by the idle colour) and return each row's busy pixel fraction (pixels
    neither idle-coloured), its height and which of its pixel columns show any busy pixel."""
    import matplotlib.image as mpimg
    from trn3emu.trace import PLOT_IDLE_RGB

    img = mpimg.imread(path)[..., :3]
    idle = np.all(np.abs(img - np.array(PLOT_IDLE_RGB)) < 1.5 / 255, axis=-1)
    ys, xs = np.nonzero(idle)
    x0, x1 = xs.min(), xs.max() + 1
    area = img[:, x0:x1]
    white = np.all(area > 1 - 1.5 / 255, axis=-1)
    in_band = ~white.any(axis=1)
    runs, start = [], None
    for y, b in enumerate(in_band.tolist() + [False]):
        if b and start is None:
            start = y
        elif not b and start is not None:
            runs.append((start, y))
            start = None
    fracs = [1.0 - idle[a:b, x0:x1].mean() for a, b in runs]
    busy_columns = [~idle[a:b, x0:x1].all(axis=0) for a, b in runs]
    return fracs, [(b - a) for a, b in runs], busy_columns


@pytest.mark.parametrize("window", [None, (200_000.0, 450_000.0)])
def test_png_busy_pixels_match_the_trace(fa_trace, tmp_path, window):
    pytest.importorskip("matplotlib")
    tr = fa_trace
    assert (tr.instructions["engine"] == "tensor").sum() == 1296
    kw = {} if window is None else {"start_ns": window[0], "end_ns": window[1]}
    labels = tr.plot(tmp_path / "fa.png", **kw)
    t0, t1 = window or (0.0, tr.total_ns)
    ref = _reference_busy(tr, t0, t1)
    fracs, heights, columns = _png_bands(tmp_path / "fa.png")
    assert len(fracs) == len(labels) and len(set(heights)) == 1
    for label, got in zip(labels, fracs):
        want = ref[label.split()[-1]]
        assert want > 0.01
        assert abs(got - want) <= 0.05 * want, (label, got, want)
    # No instruction disappears: every tensor-engine instruction's pixel column shows busy pixels.
    cols = columns[labels.index("core 0 tensor")]
    ins = tr.instructions[tr.instructions["engine"] == "tensor"]
    ins = ins[(ins["end_ns"] > t0) & (ins["start_ns"] < t1)]
    mid = (np.clip(ins["start_ns"], t0, t1) + np.clip(ins["end_ns"], t0, t1)) / 2
    at = np.minimum(((mid - t0) / (t1 - t0) * len(cols)).astype(int), len(cols) - 1)
    assert len(ins) > 100 and cols[at].all()


def test_perfetto_gzip_round_trip_with_source_line_names(fa_trace, tmp_path):
    tr = fa_trace
    path = tr.to_perfetto(tmp_path / "fa.json.gz")
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    from test_timing import validate_chrome_trace

    validate_chrome_trace(doc)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") in ("instr", "dma")]
    assert len(slices) == len(tr)
    # Every slice is named by its kernel source line and carries its opcode; compare with the
    # instructions view record by record (same order: engine instructions then transfers by start).
    ins = tr.instructions
    by_key = {(e["pid"], e["args"]["i"], e["cat"]): e for e in slices}
    for row in ins[:: max(1, len(ins) // 200)]:
        e = by_key[(int(row["core"]), int(row["index"]), "instr")]
        assert e["name"] == row["name"] and e["name"].startswith("nki_flash_attention.py:")
        assert e["args"]["op"] == row["opcode"] and e["args"]["b"] == int(row["bytes"])
        assert abs(e["dur"] * 1000 - (row["end_ns"] - row["start_ns"])) < 1e-6
    assert {e["args"]["op"] for e in slices if e["cat"] == "dma"} == {"dma_copy"}
    plain = tr.to_perfetto(tmp_path / "fa.json")
    assert json.loads(plain.read_text()) == doc
    assert (tmp_path / "fa.json.gz").stat().st_size * 5 < plain.stat().st_size


def test_summary_rolls_up_source_lines_to_each_engines_busy_time(fa_trace):
    tr = fa_trace
    st = tr.stats()
    busy = {u["unit"]: u["busy_ns"] for u in st["units"]}
    ins = tr.instructions
    rolled = {e["unit"]: e["lines"] for e in st["source_lines"] if not e["unit"].startswith("dma.")}
    assert set(rolled) == set(np.unique(ins["engine"]).tolist())
    # issue 29: DMA queues too, their transfers per line (bytes recomputed from the dma view)
    queues = {e["unit"]: e["lines"] for e in st["source_lines"] if e["unit"].startswith("dma.")}
    dq = tr.dma
    assert queues and set(queues) == {f"dma.{q}" for q in np.unique(dq["queue"]).tolist()}
    for unit, lines in queues.items():
        m = dq["queue"] == unit[4:]
        assert sum(r["count"] for r in lines) == int(m.sum())
        for r in lines[:3]:
            mm = m & (dq["name"] == r["line"])
            assert r["bytes"] == int(dq["bytes"][mm].sum()) and r["transfer_bytes"] == r["bytes"] / r["count"]
    for unit, lines in rolled.items():
        m = ins["engine"] == unit
        assert sum(r["busy_ns"] for r in lines) == pytest.approx(busy[unit], rel=1e-9)
        assert sum(r["count"] for r in lines) == int(m.sum())
        assert [r["busy_ns"] for r in lines] == sorted((r["busy_ns"] for r in lines), reverse=True)
        # each line's time, recomputed from the instructions view
        for r in lines[:3]:
            mm = m & (ins["name"] == r["line"])
            assert r["busy_ns"] == pytest.approx(float((ins["end_ns"][mm] - ins["start_ns"][mm]).sum()))
    text = tr.summary()
    assert "top source lines by busy time" in text and "nki_flash_attention.py:" in text
    json.dumps(st)  # the stats are JSON-ready (nki.profile writes them)


def _add_one_kernel():
    import trn3emu.nki.language as nl

    def add_one(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(nl.load(a), 1.0))
        return out

    return add_one


@pytest.mark.parametrize("namespace", ["nki", "neuronxcc.nki"])
@pytest.mark.parametrize("entry", ["profile", "benchmark"])
def test_profile_and_benchmark_write_trace_png_and_summary(tmp_path, namespace, entry):
    pytest.importorskip("matplotlib")
    import trn3emu.nki

    mod = trn3emu.nki if namespace == "nki" else trn3emu.nki._legacy_modules()["neuronxcc.nki"]
    a = np.arange(512, dtype=np.float32).reshape(128, 4)
    kernel = mod.jit(_add_one_kernel())
    opts = {"warmup": 1, "iters": 3} if entry == "benchmark" else {"save_trace_name": "k.ntff"}
    wrapped = getattr(mod, entry)(working_directory=tmp_path / "prof", **opts)(kernel)
    np.testing.assert_array_equal(wrapped(a), a + 1)
    us = kernel.last_result.time_ns / 1000.0
    assert us > 0
    lat = wrapped.latency()
    assert lat["p50"] == lat["p99"] == lat["mean"] == pytest.approx(us)
    assert wrapped.benchmark_result.nc_latency.get_latency_percentile(99) == pytest.approx(us)
    files = sorted(p.name for p in (tmp_path / "prof").iterdir())
    trace_name = "profile.json.gz" if entry == "benchmark" else "k.ntff.json.gz"
    assert files == sorted([trace_name, "profile.png", "profile_lines.png", "profile_summary.json"])
    summary = json.loads((tmp_path / "prof" / "profile_summary.json").read_text())
    assert summary["kernel"] == "add_one" and summary["latency_us"]["p50"] == pytest.approx(us)
    assert summary["stats"]["total_ns"] == pytest.approx(kernel.last_result.time_ns)
    with gzip.open(tmp_path / "prof" / trace_name, "rt") as f:
        names = {e["name"] for e in json.load(f)["traceEvents"] if e["ph"] == "X"}
    assert any(n.startswith("test_profiles.py:") for n in names)
    assert (tmp_path / "prof" / "profile.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_of_an_empty_trace_and_a_bad_window(tmp_path):
    pytest.importorskip("matplotlib")
    import trn3emu as t3

    dev = t3.Device()
    p = t3.Program()
    p.memset(dst=p.sbuf((128, 4), np.float32), value=1.0)
    assert dev.run(p, trace=False).trace.plot(tmp_path / "e.png") == []
    tr = dev.run(p).trace
    assert tr.plot(tmp_path / "w.png", start_ns=0.0, end_ns=tr.total_ns / 2) == ["core 0 vector"]
    assert tr.busy_fraction(0.0, tr.total_ns / 2) == {(0, "vector"): pytest.approx(1.0)}
    with pytest.raises(ValueError, match="empty time window"):
        tr.plot(tmp_path / "x.png", start_ns=5.0, end_ns=5.0)
