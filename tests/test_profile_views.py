"""Issue 29, profiles: DMA queues in the per-line roll-up and the JSON summary, stable plot colours,
a per-source-line plot, UltraResult.summary()/plot(), progress bars counting from the start, and
the benchmarks' ratio report."""

import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import pytest
import trn3emu as t3
import trn3emu.nki as tn
from trn3emu import progress, trace

tn.install()

import nki  # noqa: E402
import nki.language as nl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _line(marker: str) -> int:
    for i, text in enumerate(open(__file__).read().splitlines(), 1):
        if text.rstrip().endswith(f"# <{marker}>"):
            return i
    raise LookupError(marker)


@nki.jit
def _copy4(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for i in range(4):
        t = nl.ndarray((128, a.shape[1]), a.dtype, buffer=nl.sbuf)
        t[...] = nl.load(a[i * 128 : (i + 1) * 128])  # <load>
        nl.store(out[i * 128 : (i + 1) * 128], nl.multiply(t, 2.0))  # <store>
    return out


def test_dma_queues_are_in_the_per_line_rollup_with_sizes_and_the_published_efficiency():
    _copy4(np.ones((512, 512), np.float32))
    tr = _copy4.last_result.trace
    name = Path(__file__).name
    rows = {(u, r["line"]): r for (_, u), rs in tr.source_lines().items() for r in rs if u.startswith("dma.")}
    load = next(r for (u, line), r in rows.items() if line == f"{name}:{_line('load')}")
    # four [128, 512] fp32 loads: 256 KiB each, 2048 B per partition: the published curve's 82 %
    assert load["count"] == 4 and load["bytes"] == 4 * 128 * 512 * 4 and load["transfer_bytes"] == 128 * 512 * 4
    assert load["curve_efficiency"] == pytest.approx(0.82)
    assert load["gbps"] == pytest.approx(load["bytes"] / load["busy_ns"])
    assert any(line == f"{name}:{_line('store')}" for _, line in rows)
    text = tr.summary()
    assert f"{name}:{_line('load')}  256.0 KiB/transfer" in text and "curve 82%" in text
    st = json.loads(json.dumps(tr.stats()))  # profile_summary.json's "stats"
    assert any(
        e["unit"].startswith("dma.") and any("curve_efficiency" in r for r in e["lines"]) for e in st["source_lines"]
    )


def test_curve_interpolation_hits_the_published_points():
    for b, pct in ((256, 10), (512, 21), (1024, 42), (2048, 82), (4096, 96)):
        assert trace._curve_efficiency(b) == pytest.approx(pct / 100)
    assert trace._curve_efficiency(128) == pytest.approx(0.05) and trace._curve_efficiency(1 << 20) == 1.0


def test_a_class_has_the_same_colour_in_every_plot():
    a = trace._class_colours(["dma", "pe_matmul"])
    b = trace._class_colours(["act", "dma", "memset", "pe_matmul"])
    np.testing.assert_array_equal(a[0], b[1])
    np.testing.assert_array_equal(a[1], b[3])
    assert len({tuple(c) for c in trace._class_colours(list(trace.ALL_CLASSES[:20]))}) == 20


def test_plot_by_line_colours_the_top_lines_and_greys_the_rest(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    _copy4(np.ones((512, 512), np.float32))
    tr = _copy4.last_result.trace
    tr.plot(tmp_path / "lines.png", by="line", top=1)
    img = matplotlib.image.imread(tmp_path / "lines.png")[..., :3]
    first = trace._palette(1)[0]
    near = lambda rgb: (np.abs(img - np.asarray(rgb)).max(axis=-1) < 0.02).sum()  # noqa: E731
    assert near(first) > 50 and near(trace._OTHER_RGB) > 50
    with pytest.raises(ValueError):
        tr.plot(tmp_path / "x.png", by="engine")


def test_ultra_result_summary_and_plot(tmp_path):
    us = t3.UltraServer(chips=2)
    progs = [t3.Program(chip=c, core=0) for c in range(2)]
    group = [p.global_core for p in progs]
    xs = [us.chip(c).hbm.put(np.full((128, 64), c, np.float32)) for c in range(2)]
    outs = [us.chip(c).hbm.alloc((128, 64), np.float32) for c in range(2)]
    for p in progs:
        p.all_reduce(dst=outs[p.chip], src=xs[p.chip], cores=group)
    r = us.run(progs)
    text = r.summary()
    assert text.startswith("UltraServer run: 2 chips (2 ran programs)")
    assert "bytes between chips" in text and "busiest link chip" in text and "slowest chip" in text
    assert sum(1 for line in text.splitlines() if line.lstrip().startswith(("0 ", "1 ")) and "gpsimd" in line) >= 2
    pytest.importorskip("matplotlib")
    assert r.plot(tmp_path / "u.png") == ["chip 0 core 0 gpsimd", "chip 1 core 0 gpsimd"]
    assert (tmp_path / "u.png").stat().st_size > 0


def test_progress_bar_counts_from_the_start_of_the_work():
    pytest.importorskip("tqdm")
    bar = progress.RunProgress()
    bar.start = time.monotonic() - 3.0  # the work began 3 s ago; the bar appears now
    bar(300, 1000, 10**6)
    d = bar.bar.format_dict
    assert d["n"] == 300 and d["initial"] == 0 and d["elapsed"] >= 3.0
    assert "00:03<00:07" in str(bar.bar)  # 300 in 3 s: 700 more take 7 s
    bar.close()


def test_benchmark_ratio_report_lists_the_ratios():
    spec = importlib.util.spec_from_file_location("bench_conftest", ROOT / "benches" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lines = mod.ratio_report(
        [
            ("test_a", {"fraction_of_host": 0.0123, "emulated_over_wall": 2.5, "host_gbps": 10.0, "label": "x"}),
            ("test_b", {"notes": "none"}),
        ]
    )
    assert lines == ["test_a: fraction_of_host=0.0123, emulated_over_wall=2.5, host_gbps=10"]


def test_the_per_line_legend_quotes_each_lines_source_text():
    _copy4(np.ones((512, 512), np.float32))
    _, _, legend = _copy4.last_result.trace._line_categories(top=8)
    by_line = {text.split(" ")[0]: text for text in legend}
    load = by_line[f"test_profile_views.py:{_line('load')}"]
    assert "t[...] = nl.load(a[i * 128 : (i + 1) * 128])" in load
    assert "nl.store(out[i * 128" in by_line[f"test_profile_views.py:{_line('store')}"]
    assert not any("other line" in text for text in legend)  # every line is in the top 8: no empty entry
