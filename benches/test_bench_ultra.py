"""UltraServer benches: collectives across many chips (time and host memory) and cores / chips on
host threads.

pytest benches/test_bench_ultra.py --benchmark-only
The big cases run in a child process so that its peak resident memory (`ru_maxrss`) is the case's
own; extra_info records wall time, emulated time and peak memory.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
import time

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from hosttime import blas_threads, load_avg

GIB = 1 << 30

_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    import numpy as np
    import trn3emu as t3

    kind, chips, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    t0 = time.perf_counter()
    us = t3.UltraServer(chips=chips)
    progs = [t3.Program(chip=c, core=0) for c in range(chips)]
    group = [p.global_core for p in progs]
    bufs = []
    for p in progs:
        hbm = us.chip(p.chip).hbm
        x = np.full(nbytes // 4, p.chip + 1, np.float32)
        x[:: 1 << 12] = np.arange(len(x[:: 1 << 12]), dtype=np.float32)
        src = hbm.put(x)
        if kind == "all_to_all":
            p.all_to_all(dst=src, src=src, cores=group)  # in place: 1 buffer per chip
            bufs.append(src)
        else:
            dst = hbm.alloc(x.shape, np.float32)
            p.all_reduce(dst=dst, src=src, cores=group)
            bufs.append(dst)
        del x
    t1 = time.perf_counter()
    r = us.run(progs, check_races=False, trace=False)
    t2 = time.perf_counter()
    # spot check against the closed form
    got = us.chip(chips - 1).hbm.get(bufs[-1])
    if kind == "all_to_all":
        blk = nbytes // 4 // chips
        ok = all(float(got[i * blk + 1]) == float(i + 1) for i in range(chips))
    else:
        ok = float(got[1]) == float(sum(range(1, chips + 1)))
    print(json.dumps({
        "setup_s": t1 - t0, "run_s": t2 - t1, "total_s": t2 - t0, "emulated_us": r.time_ns / 1e3,
        "messages": int(len(r.messages["bytes"])), "ok": bool(ok),
        "maxrss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }))
    """
)


def _child(kind: str, chips: int, nbytes: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(chips), str(nbytes)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _record(benchmark, res: dict, limit_gib: float, limit_s: float | None = None) -> None:
    benchmark.extra_info.update(res)
    benchmark.extra_info["memory_limit_gib"] = limit_gib
    benchmark.extra_info["within_memory_limit"] = res["maxrss_gib"] <= limit_gib
    if limit_s is not None:
        benchmark.extra_info["time_limit_s"] = limit_s
        benchmark.extra_info["within_time_limit"] = res["total_s"] <= limit_s
    benchmark.extra_info["loadavg"] = load_avg()
    assert res["ok"]


def test_all_to_all_64_chips_1mib_blocks(benchmark):
    """64 chips, one rank each, in-place all_to_all with 1 MiB per (sender, receiver) block (64 MiB
    per rank, 4 GiB in all): <= 60 s wall, <= 8 GiB resident (issue 19)."""
    res = benchmark.pedantic(_child, args=("all_to_all", 64, 64 << 20), rounds=1, iterations=1)
    _record(benchmark, res, 8.0, 60.0)


def test_all_reduce_144_chips_16mib(benchmark):
    """144 chips, one rank each, all_reduce of 16 MiB per chip: <= 12 GiB resident (issue 19)."""
    res = benchmark.pedantic(_child, args=("all_reduce", 144, 16 << 20), rounds=1, iterations=1)
    _record(benchmark, res, 12.0)


def _eight_core_matmuls(dev: t3.Device, size: int = 512):
    """8 independent tiled bf16 matmuls C_k = A_k^T B_k (size^3), one per core."""
    rng = np.random.default_rng(0)
    progs = []
    for core in range(8):
        a = dev.hbm.put(rng.standard_normal((size, size)).astype(ml_dtypes.bfloat16))
        b = dev.hbm.put(rng.standard_normal((size, size)).astype(ml_dtypes.bfloat16))
        out = dev.hbm.alloc((size, size), ml_dtypes.bfloat16)
        p = t3.Program(core=core)
        kt = size // 128
        a_t = [p.sbuf((128, size), ml_dtypes.bfloat16) for _ in range(kt)]
        b_t = [p.sbuf((128, size), ml_dtypes.bfloat16) for _ in range(kt)]
        for i in range(kt):
            p.dma_copy(dst=a_t[i], src=a[i * 128 : (i + 1) * 128, :])
            p.dma_copy(dst=b_t[i], src=b[i * 128 : (i + 1) * 128, :])
        acc = p.psum((128, 512), np.float32)
        res = p.sbuf((128, 512), ml_dtypes.bfloat16)
        for m0 in range(0, size, 128):
            for n0 in range(0, size, 512):
                for i in range(kt):
                    p.nc_matmul(
                        dst=acc, stationary=a_t[i][:, m0 : m0 + 128], moving=b_t[i][:, n0 : n0 + 512], accumulate=i > 0
                    )
                p.tensor_copy(dst=res, src=acc)
                p.dma_copy(dst=out[m0 : m0 + 128, n0 : n0 + 512], src=res)
        progs.append(p)
    return progs


def test_eight_core_data_parallel_threads(benchmark):
    """8 independent tiled matmuls (one per core) on 1 and 2 host threads, alternating; extra_info
    holds the speed-up (issue 19 asks >= 1.6x)."""
    dev = t3.Device()
    progs = _eight_core_matmuls(dev)
    natives = [p.native() for p in progs]  # assemble once

    cpu: dict[int, list[float]] = {1: [], 2: []}

    def run(threads: int) -> float:
        t3.set_num_threads(threads)
        c0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        t0 = time.perf_counter()
        dev.run(progs, check_races=False, trace=False)
        wall = time.perf_counter() - t0
        cpu[threads].append((resource.getrusage(resource.RUSAGE_SELF).ru_utime - c0) / wall)
        return wall

    # Control, measured right after: numpy's sgemm on 1 and 2 BLAS threads (what the host gives
    # any 2-thread work at that moment).
    x = np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32)
    sgemm: dict[int, list[float]] = {1: [], 2: []}

    def control(threads: int) -> float:
        with blas_threads(threads):
            t0 = time.perf_counter()
            x @ x
            return time.perf_counter() - t0

    try:
        run(2)
        times: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(3):
            for n in (1, 2):
                times[n].append(run(n))
        t3.set_num_threads(2)
        benchmark.pedantic(dev.run, args=(progs,), kwargs={"check_races": False, "trace": False}, rounds=3)
    finally:
        t3.set_num_threads(0)
    # After the emulator's runs (BLAS threads spin a while after a call and would slow them).
    for _ in range(3):
        for n in (1, 2):
            sgemm[n].append(control(n))
    med = {n: float(np.median(v)) for n, v in times.items()}
    benchmark.extra_info.update(
        single_thread_s=med[1],
        two_threads_s=med[2],
        speedup_2_vs_1_thread=med[1] / med[2],
        target_speedup=1.6,
        # process user time / wall: ~2 when the host gives the run both cores (a helper spins
        # when idle, so this bounds what it got rather than what it used)
        two_threads_cpu_per_wall=float(np.median(cpu[2][1:])),
        single_thread_cpu_per_wall=float(np.median(cpu[1])),
        numpy_sgemm_speedup_2_vs_1_thread=float(np.median(sgemm[1]) / np.median(sgemm[2])),
        loadavg=load_avg(),
        programs=len(natives),
    )


@pytest.mark.parametrize("chips", [8])
def test_chips_in_parallel_threads(benchmark, chips):
    """Chips run their windows on the host's threads: the same 8-chip run of per-chip matmul work
    and an all_reduce on 1 and 2 threads (speed-up in extra_info; results identical)."""
    us = t3.UltraServer(chips=chips)
    progs = []
    for c in range(chips):
        progs += [pp for pp in _eight_core_matmuls(us.chip(c))[:1]]
        progs[-1].chip = c
    group = [p.global_core for p in progs]
    for p in progs:
        h = us.chip(p.chip).hbm.alloc((1024,), np.float32)
        p.all_reduce(dst=h, src=h, cores=group)

    def run(threads: int) -> float:
        t3.set_num_threads(threads)
        t0 = time.perf_counter()
        us.run(progs, check_races=False, trace=False)
        return time.perf_counter() - t0

    try:
        times: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(3):
            for n in (1, 2):
                times[n].append(run(n))
        t3.set_num_threads(2)
        benchmark.pedantic(us.run, args=(progs,), kwargs={"check_races": False, "trace": False}, rounds=3)
    finally:
        t3.set_num_threads(0)
    med = {n: float(np.median(v)) for n, v in times.items()}
    benchmark.extra_info.update(speedup_2_vs_1_thread=med[1] / med[2], loadavg=load_avg(), gib=GIB)
