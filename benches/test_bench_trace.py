"""Cost of tracing: the same instruction stream run with the trace off and on, and the cost of the
trace's analyses (summary with critical path, Perfetto export) per record."""

import numpy as np
import pytest
import trn3emu as t3


def _stream(n: int = 5000) -> t3.Program:
    p = t3.Program(sync="manual")
    x = p.sbuf((128, 1), np.float32)
    y = p.sbuf((128, 1), np.float32)
    for i in range(n):
        src, dst = (x, y) if i % 2 else (y, x)
        p.tensor_scalar(dst=dst, data=src, op0="add", operand0=1.0)
    return p


@pytest.mark.parametrize("trace", [False, True], ids=["trace_off", "trace_on"])
def test_run_with_and_without_trace(benchmark, trace):
    """Instructions per second with the trace off (baseline) and on."""
    dev, p = t3.Device(), _stream()
    benchmark(dev.run, p, check_races=False, trace=trace)
    benchmark.extra_info["instructions_per_s"] = len(p) / benchmark.stats.stats.median


def test_summary_and_perfetto(benchmark, tmp_path):
    """Seconds per 1000 records for summary() + to_perfetto()."""
    dev, p = t3.Device(), _stream(2000)
    tr = dev.run(p, check_races=False).trace

    def both():
        tr.summary()
        tr.to_perfetto(tmp_path / "t.json")

    benchmark(both)
    benchmark.extra_info["s_per_1000_records"] = benchmark.stats.stats.median / len(tr) * 1000
