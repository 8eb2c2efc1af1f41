"""Benchmarks run with `pytest benches/ --benchmark-only`; each records host baselines in extra_info.

Every benchmark whose timed function runs the device also gets, from the autouse fixture below:
- `emulated_ns`: the estimated device time of the last `Device.run` the benchmark made (the cost
  model's estimate for one call; a call that makes several runs, e.g. an NKI grid of more than 8
  programs, would need its own figure);
- `emulated_over_wall`: emulated time / measured median wall time per call (how many seconds of
  device time one second of host time emulates; 1.0 would be real time).
Every benchmark records `host_cpu` (the CPU model) and `simd_path` (the kernels' SIMD path when
it finished: narrow it with `TRN3EMU_SIMD=avx2+fma|portable` to time another host class's path).

After the run, a short terminal report ("trn3emu ratios") lists each benchmark's ratios from
extra_info (`fraction_of_host`, `emulated_over_wall`, speedups, rates), which the default
pytest-benchmark table leaves out (they were only in `--benchmark-json`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import trn3emu
import trn3emu.device

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "benches", ROOT / "examples"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def host_cpu() -> str:
    """The host's CPU model: /proc/cpuinfo's "model name" with its family and model numbers
    (virtual machines often report a bare "AMD EPYC" for both Zen 3 and Zen 5, which differ
    in SIMD width and cache behaviour); platform.processor() elsewhere."""
    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        if "model name" in fields:
            name = fields["model name"]
            if "cpu family" in fields and "model" in fields:
                name += f" (family {fields['cpu family']} model {fields['model']})"
            return name
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


HOST_CPU = host_cpu()


class RunRecorder:
    """Remembers the estimated device time of the last Device.run while a benchmark runs."""

    def __init__(self) -> None:
        self.runs = 0
        self.last_ns: float | None = None

    def wrap(self, run):
        def recorded(dev, *args, **kwargs):
            res = run(dev, *args, **kwargs)
            self.runs += 1
            self.last_ns = res.time_ns
            return res

        return recorded


def record_emulated(benchmark, recorder: RunRecorder) -> None:
    """Put emulated_ns and emulated_over_wall into the benchmark's extra_info (if it ran the device)."""
    stats = getattr(benchmark, "stats", None)
    if recorder.runs < 2 or stats is None:
        return  # the device ran only in setup (or not at all): nothing timed to compare with
    wall = stats.stats.median
    # a benchmark that computed its own figures (e.g. from its own RunResult) keeps them
    benchmark.extra_info.setdefault("emulated_ns", recorder.last_ns)
    benchmark.extra_info.setdefault("emulated_over_wall", recorder.last_ns * 1e-9 / wall if wall else None)


def smoke_timed(monkeypatch, fixture_type) -> None:
    """Under `--benchmark-disable` the benchmark fixture calls the function once and keeps no
    stats; patch it (for this test only) to time that call and expose it as
    `stats.stats.median`, so every benchmark still checks its results and computes its
    extra_info: a quick smoke run of benches/ whose figures are single samples."""

    def timed(self, fn, args, kwargs):
        t0 = time.perf_counter()
        result = fn(*args, **(kwargs or {}))
        t = time.perf_counter() - t0
        self.stats = SimpleNamespace(stats=SimpleNamespace(median=t, min=t, max=t, mean=t))
        self._mode = "smoke"  # marks the fixture used (the plugin warns otherwise)
        return result

    monkeypatch.setattr(fixture_type, "__call__", lambda self, fn, *a, **k: timed(self, fn, a, k))
    monkeypatch.setattr(
        fixture_type, "pedantic", lambda self, fn, args=(), kwargs=None, **_: timed(self, fn, args, kwargs)
    )


#: extra_info keys the terminal report shows, in this order, when a benchmark has them
RATIO_KEYS = ("fraction_of_host", "emulated_over_wall")
#: other extra_info keys shown: ratios and rates by their names
_RATIO_WORDS = ("speedup", "fraction", "_over_", "ratio", "per_s", "gflops", "gbps")
_RESULTS = pytest.StashKey[list]()


def ratio_report(entries: list) -> list[str]:
    """The report's lines for [(benchmark name, extra_info)]: one line per benchmark with ratios."""
    lines = []
    for name, info in entries:
        keys = [k for k in RATIO_KEYS if k in info]
        keys += sorted(k for k in info if k not in keys and any(w in k for w in _RATIO_WORDS))
        vals = [(k, info[k]) for k in keys if isinstance(info[k], (int, float)) and not isinstance(info[k], bool)]
        if vals:
            lines.append(f"{name}: " + ", ".join(f"{k}={v:.3g}" for k, v in vals))
    return lines


def pytest_configure(config) -> None:
    config.stash[_RESULTS] = []


@pytest.hookimpl(trylast=True)  # (after pytest-benchmark's table)
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = ratio_report(config.stash.get(_RESULTS, []))
    if lines:
        terminalreporter.write_sep("-", "trn3emu ratios (extra_info; all figures: --benchmark-json)")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _emulated_time(request, monkeypatch):
    if "benchmark" not in request.fixturenames:
        yield
        return
    bench = request.getfixturevalue("benchmark")  # set up first, so torn down after this fixture
    if bench.disabled:
        smoke_timed(monkeypatch, type(bench))
    recorder = RunRecorder()
    monkeypatch.setattr(trn3emu.device.Device, "run", recorder.wrap(trn3emu.device.Device.run))
    yield
    record_emulated(bench, recorder)
    bench.extra_info.setdefault("host_cpu", HOST_CPU)
    bench.extra_info.setdefault("simd_path", trn3emu.simd_path())
    request.config.stash[_RESULTS].append((request.node.name, dict(bench.extra_info)))
