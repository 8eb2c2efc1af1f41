"""Timing helpers the benchmarks share for their host baselines (numpy runs measured in the same
process as the emulator)."""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np


def median_s(fn, reps: int) -> float:
    """Median wall time of `reps` calls of `fn`, seconds."""
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def blas_threads(n: int):
    """numpy's BLAS limited to n threads (a no-op without threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


def load_avg() -> float:
    """1-minute load average (NaN where the OS has none): how busy the shared host was."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
