"""`nki.profile` and `nki.benchmark` (both `nki` and `neuronxcc.nki`) on the emulator.

There is no device to sample, so a run's latency is the cost model's estimated kernel time and every
percentile is that one number (the emulator is deterministic: warmup and iters change nothing).

`nki.profile(working_directory=DIR)(kernel)(*arrays)` and `nki.benchmark(..., working_directory=DIR)`
write into DIR (created if missing):

- the Perfetto trace (`save_trace_name`, default `profile.json.gz`; a name that is not `.json` or
  `.json.gz`, such as the device's `profile.ntff`, gets `.json.gz` appended),
- `profile.png`, the timeline (`Trace.plot`; skipped when matplotlib is not installed),
- `profile_summary.json`: the kernel name, the latency statistics and `Trace.stats()`.

The call returns the kernel's outputs as it would on a device; the estimated latency statistics
are on `.benchmark_result.nc_latency` (as `nki.benchmark` reports them) and returned by
`.latency()` as a dict.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._kernel import Kernel, _Launcher

#: The percentiles a summary lists (every one is the same estimated time).
PERCENTILES = (0, 1, 10, 25, 50, 90, 99, 100)


class LatencyStats:
    """`benchmark_result.nc_latency`: the emulator's estimated kernel time (us) for every percentile."""

    def __init__(self, us: float, iters: int = 1) -> None:
        self.us = us
        self.iters = iters

    def get_latency_percentile(self, p) -> float:
        return self.us

    def as_dict(self) -> dict:
        return {
            "unit": "us",
            "estimated": True,
            "iterations": self.iters,
            "mean": self.us,
            **{f"p{p}": self.us for p in PERCENTILES},
        }

    def __repr__(self) -> str:
        return f"<LatencyStats {self.us:,.3f} us estimated (every percentile)>"


class BenchmarkResult:
    def __init__(self, us: float, iters: int = 1) -> None:
        self.nc_latency = LatencyStats(us, iters)


def _trace_name(name: str | None) -> str:
    name = name or "profile.json.gz"
    return name if name.endswith((".json", ".json.gz")) else name + ".json.gz"


class Profiled:
    """A kernel wrapped by `nki.profile` / `nki.benchmark`: calling it runs the kernel, records the
    latency statistics and, with a working directory, writes the trace, the PNG and the summary."""

    def __init__(self, kernel: Kernel, grid=None, working_directory=None, save_trace_name=None, iters=1) -> None:
        self.kernel, self.grid = kernel, grid
        self.working_directory = working_directory
        self.save_trace_name = save_trace_name
        self.iters = int(iters or 1)
        self.benchmark_result: BenchmarkResult | None = None
        self.files: dict[str, Path] = {}
        self.__name__ = kernel.__name__
        self.__wrapped__ = kernel

    def __getitem__(self, grid) -> Profiled:
        return Profiled(self.kernel, grid, self.working_directory, self.save_trace_name, self.iters)

    def __call__(self, *args, **kwargs):
        run = self.kernel if self.grid is None else self.kernel[self.grid]
        out = run(*args, **kwargs)
        res = self.kernel.last_result
        runs = res if isinstance(res, list) else [res]
        res = max(runs, key=lambda r: float(getattr(r, "time_ns", 0) or 0))
        self.benchmark_result = BenchmarkResult(float(getattr(res, "time_ns", 0) or 0) / 1000.0, self.iters)
        if self.working_directory is not None and res is not None:
            self._write(Path(self.working_directory), res.trace)
        return out

    def latency(self) -> dict:
        """The last call's estimated latency statistics (us) as a dict."""
        if self.benchmark_result is None:
            raise RuntimeError("call the profiled kernel first")
        return self.benchmark_result.nc_latency.as_dict()

    def _write(self, root: Path, trace) -> None:
        root.mkdir(parents=True, exist_ok=True)
        files = {"trace": trace.to_perfetto(root / _trace_name(self.save_trace_name))}
        try:
            trace.plot(root / "profile.png")
            files["png"] = root / "profile.png"
            trace.plot(root / "profile_lines.png", by="line")  # the top source lines coloured
            files["png_lines"] = root / "profile_lines.png"
        except ImportError:
            pass
        summary = {
            "kernel": self.__name__,
            "latency_us": self.latency(),
            "files": {k: v.name for k, v in files.items()},
            "stats": trace.stats(),
        }
        files["summary"] = root / "profile_summary.json"
        files["summary"].write_text(json.dumps(summary, indent=1) + "\n")
        self.files = files


def _kernel_of(k) -> tuple[Kernel, tuple | None]:
    if isinstance(k, Profiled):
        return k.kernel, k.grid
    if isinstance(k, _Launcher):
        return k.kernel, k.grid
    return (k if isinstance(k, Kernel) else Kernel(k)), None


def profile(kernel=None, *, working_directory=None, save_trace_name=None, **options):
    """`nki.profile(working_directory=DIR, ...)(kernel)`: runs on trn3emu; writes the trace, the
    PNG and a JSON summary into DIR (module doc); other device options are accepted."""

    def wrap(k):
        kern, grid = _kernel_of(k)
        return Profiled(kern, grid, working_directory, save_trace_name)

    return wrap if kernel is None else wrap(kernel)


def benchmark(kernel=None, *, warmup=None, iters=None, working_directory=None, save_trace_name=None, **options):
    """`nki.benchmark(warmup=..., iters=...)(kernel)`: runs on trn3emu; `.benchmark_result.nc_latency`
    reports the estimated kernel time; with `working_directory` also writes what `profile` writes."""

    def wrap(k):
        kern, grid = _kernel_of(k)
        return Profiled(kern, grid, working_directory, save_trace_name, iters or 1)

    return wrap if kernel is None else wrap(kernel)
