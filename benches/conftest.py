"""Benchmarks run with `pytest benches/ --benchmark-only`; each records host baselines in extra_info.

Every benchmark whose timed function runs the device also gets, from the autouse fixture below:
- `emulated_ns`: the estimated device time of the last `Device.run` the benchmark made (the cost
  model's estimate for one call; a call that makes several runs, e.g. an NKI grid of more than 8
  programs, would need its own figure);
- `emulated_over_wall`: emulated time / measured median wall time per call (how many seconds of
  device time one second of host time emulates; 1.0 would be real time).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trn3emu.device

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "benches", ROOT / "examples"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


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


@pytest.fixture(autouse=True)
def _emulated_time(request, monkeypatch):
    if "benchmark" not in request.fixturenames:
        yield
        return
    bench = request.getfixturevalue("benchmark")  # set up first, so torn down after this fixture
    recorder = RunRecorder()
    monkeypatch.setattr(trn3emu.device.Device, "run", recorder.wrap(trn3emu.device.Device.run))
    yield
    record_emulated(bench, recorder)
