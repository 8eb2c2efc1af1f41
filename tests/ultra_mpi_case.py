"""The MPI side of tests/test_ultraserver_mpi.py: `mpiexec -n P python ultra_mpi_case.py OUT [MODE]`
runs one UltraServer program over P processes; rank 0 saves every chip's outputs and trace."""

import json
import os
import pathlib
import signal
import sys
import tempfile
import time

import ml_dtypes
import numpy as np
import trn3emu as t3
from trn3emu import ultra_mpi


def build(nchips=8, race=False):
    us = t3.UltraServer(chips=nchips)
    progs = us.programs(cores=[0, 1])
    if race:  # cores 0 and 1 of the last chip race on an HBM tensor: only its process fails
        p0, p1 = progs[-2:]
        shared = us.chip(p0.chip).hbm.alloc((64, 32), np.float32)
        p0.dma_copy(dst=shared, src=p0.sbuf((64, 32), np.float32))
        p1.dma_copy(dst=p1.sbuf((64, 32), np.float32), src=shared)
    group = [p.global_core for p in progs]
    n = len(group)
    rng = np.random.default_rng(7)
    outs = {}
    for p in progs:
        d = us.chip(p.chip)
        x = d.hbm.put(rng.standard_normal((n * 4, 32)).astype(np.float32))
        ar = d.hbm.alloc((n * 4, 32), np.float32)
        a2a = d.hbm.alloc((n * 4, 32), np.float32)
        ag = d.hbm.alloc((n * n * 4, 32), np.float32)
        p.all_reduce(dst=ar, src=x, cores=group)
        p.all_to_all(dst=a2a, src=x, cores=group)
        p.all_gather(dst=ag, src=ar, cores=group)
        outs[(p.chip, p.core)] = (ar, a2a, ag, *more_collectives(p, d, group, rng))
    return us, progs, outs


def more_collectives(p, d, group, rng):
    """reduce_scatter (cast to bf16), a ring collective_permute, all_to_all_v with run-time counts
    and an in-place all_to_all: every kind's data path across processes."""
    n = len(group)
    r = group.index(p.global_core)
    x = d.hbm.put(rng.standard_normal((n * 2, 16)).astype(np.float32))
    rs = d.hbm.alloc((2, 16), ml_dtypes.bfloat16)
    p.reduce_scatter(dst=rs, src=x, cores=group)
    perm = d.hbm.alloc((n * 2, 16), np.float32)
    p.collective_permute(dst=perm, src=x, cores=group, pairs=[v for i in range(n) for v in (i, (i + 3) % n)])
    counts = np.array([(r + j) % 3 for j in range(n)], np.uint32)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.uint32)
    meta = d.hbm.put(np.stack([counts, displs]))
    v = d.hbm.put(rng.integers(-9, 9, 3 * n).astype(np.int32))
    vdst = d.hbm.put(np.full(3 * n, -1, np.int32))
    p.all_to_all_v(dst=vdst, src=v, metadata=meta, cores=group)
    inplace = d.hbm.put(rng.standard_normal((n * 3, 8)).astype(np.float32))
    p.all_to_all(dst=inplace, src=inplace, cores=group)
    return rs, perm, vdst, inplace


def summary(us, r, outs, chips):
    data = {}
    traces = {}
    for (c, k), ts in outs.items():
        if c in chips:
            for j, t in enumerate(ts):
                data[f"{c}_{k}_{j}"] = np.asarray(us.chip(c).hbm.get(t)).view(np.uint8)
    for c in chips:
        with tempfile.TemporaryDirectory() as tmp:
            f = pathlib.Path(tmp) / "t.json"
            r.chips[c].trace.to_perfetto(f)
            traces[c] = f.read_text()
        data[f"executed_{c}"] = np.array([r.chips[c].executed])
    for k, v in r.messages.items():
        data["msg_" + k] = v
    for k, v in r.cc.items():
        data["cc_" + k] = v
    data["time_ns"] = np.array([r.time_ns])
    return data, traces


if __name__ == "__main__":
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    us, progs, outs = build(race=sys.argv[2:] == ["race"])
    if sys.argv[2:] == ["race"]:
        try:
            ultra_mpi.run(us, progs, timeout_s=20)
        except Exception as e:  # noqa: BLE001 - report each process's error class and rule
            text = f"rank {comm.rank}: {type(e).__name__} {getattr(e, 'rule', '')}: {e}"
            pathlib.Path(f"{sys.argv[1]}.rank{comm.rank}.txt").write_text(text)
        sys.exit(0)
    if sys.argv[2:] == ["hang"]:  # process 2 never joins: the others give up after timeout_s
        start = time.monotonic()
        if comm.rank != 2:
            try:
                ultra_mpi.run(us, progs, timeout_s=2)
            except Exception as e:  # noqa: BLE001 - report each process's error class and rule
                text = f"rank {comm.rank}: {type(e).__name__} {getattr(e, 'rule', '')}: {e}"
                pathlib.Path(f"{sys.argv[1]}.rank{comm.rank}.txt").write_text(text)
        # every process leaves at the same time (the first to leave ends the job), without
        # MPI_Finalize: the abandoned exchange would hold it
        time.sleep(max(0.0, start + 8 - time.monotonic()))
        os._exit(0)
    if sys.argv[2:] == ["kill"] and comm.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    r = ultra_mpi.run(us, progs, timeout_s=20)
    mine = [c for c, o in enumerate(ultra_mpi.owned(len(us), comm.rank, comm.size)) if o]
    data, traces = summary(us, r, outs, mine)
    allp = comm.gather((data, traces), root=0)
    if comm.rank == 0:
        merged, tr = {}, {}
        for d, t in allp:
            for k, v in d.items():
                if k.startswith(("msg_", "cc_", "time_ns")) and k in merged:
                    assert np.array_equal(merged[k], v), k
                merged[k] = v
            tr.update({str(c): s for c, s in t.items()})
        np.savez(sys.argv[1], **merged)
        pathlib.Path(sys.argv[1] + ".json").write_text(json.dumps(tr))
