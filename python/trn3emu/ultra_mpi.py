"""An UltraServer run spread over MPI processes (docs/ultraserver.md, "Several processes").

Every process builds the same `UltraServer` and programs (the same script), and calls
`run(us, programs)`: process p runs only the chips it owns (`owned(len(us), p, size)`, contiguous
blocks). At every window boundary the processes exchange their next event times and their chips'
arrival messages (without data); then each sends each peer only the bytes that peer's chips
consume. Times, results of the owned chips and the fabric trace are bit-identical to
`us.run(programs)` in one process.

    mpiexec -n 4 python script.py                                    # one host
    mpiexec -n 8 -hosts node1,node2 python script.py                 # several hosts
    python -m trn3emu.ultra_mpi --np 4 script.py [args]              # the same, mpiexec found for you

A peer that stops answering (killed, hung) ends the run in every other process with an
`ExecutionError` after `timeout_s` (no hang); `mpiexec` itself also ends the job when a process dies.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np

from . import _native
from .device import _program_list
from .errors import ExecutionError
from .program import Program
from .ultra import UltraResult, UltraServer

#: Seconds a process waits for its peers at one window boundary before giving up.
TIMEOUT_S = 60.0


def _comm(comm: Any = None) -> Any:
    if comm is not None:
        return comm
    from mpi4py import MPI  # the `dist` extra

    return MPI.COMM_WORLD


def owned(chips: int, rank: int, size: int) -> list[bool]:
    """Which of `chips` chips process `rank` of `size` owns: contiguous blocks, chip c to
    process c * size // chips."""
    return [c * size // chips == rank for c in range(chips)]


def _wait(req: Any, deadline: float, what: str) -> None:
    spins = 0
    while not req.Test():
        if time.monotonic() > deadline:
            raise ExecutionError(
                f"distributed UltraServer run: no answer from the other processes within the timeout ({what}); "
                "a process died or hangs",
                rule="ultra_dist_timeout",
            )
        spins += 1
        if spins > 1000:
            time.sleep(0.0002)


#: The MPI tag of the run's point-to-point messages.
_TAG = 0x7E3


def _all_to_all(comm: Any, timeout_s: float):
    """An all-to-all of bytes with a deadline: message sizes by a non-blocking MPI alltoall, then
    one non-blocking send / receive per peer with a message (polled)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    # One receive buffer for the run, grown when needed (the caller copies out of it): fresh
    # memory is slow to fault in, and an in-place all_to_all exchanges many same-sized rounds.
    held = [np.empty(0, np.uint8)]

    def exchange(data: np.ndarray, counts: list[int]) -> tuple[np.ndarray, list[int]]:
        deadline = time.monotonic() + timeout_s
        sent = np.array(counts, np.int64)
        got = np.zeros(size, np.int64)
        _wait(comm.Ialltoall(sent, got), deadline, "message sizes")
        so = np.concatenate([[0], np.cumsum(sent)])
        ro = np.concatenate([[0], np.cumsum(got)])
        if len(held[0]) < ro[-1]:
            held[0] = np.empty(int(ro[-1]), np.uint8)
        buf = held[0][: int(ro[-1])]
        reqs = []
        for p in range(size):
            if p == rank:
                buf[ro[p] : ro[p + 1]] = data[so[p] : so[p + 1]]
                continue
            if got[p]:
                reqs.append(comm.Irecv(buf[ro[p] : ro[p + 1]], source=p, tag=_TAG))
            if sent[p]:
                reqs.append(comm.Isend(data[so[p] : so[p + 1]], dest=p, tag=_TAG))
        for req in reqs:
            _wait(req, deadline, "messages")
        return buf, got.tolist()

    return exchange


def run(
    us: UltraServer,
    programs: Program | list[Program],
    comm: Any = None,
    check_races: bool = True,
    trace: bool = True,
    trace_limit: int | None = None,
    timeout_s: float = TIMEOUT_S,
) -> UltraResult:
    """This process's part of `us.run(programs)` over the processes of `comm` (default
    `MPI.COMM_WORLD`): its owned chips' `RunResult`s (other chips' are empty and their memories
    untouched) and the whole run's time, messages and CC-core spans (the same in every process)."""
    comm = _comm(comm)
    progs = [programs] if isinstance(programs, Program) else _program_list(programs)
    by_chip: list[list] = [[] for _ in us.chips]
    pairs = []
    for p in progs:
        chip = int(getattr(p, "chip", 0))
        n = p.native()
        if 0 <= chip < len(us.chips):
            if isinstance(p, Program):
                p._check_chip(us.chips)
            by_chip[chip].append(n)
        pairs.append((chip, n))
    size = comm.Get_size()
    owner = [c * size // len(us.chips) for c in range(len(us.chips))]
    limit = {} if trace_limit is None else {"trace_limit": trace_limit}
    fabric = {k: v for k, v in us._fabric.items() if v is not None}
    raw = _native.ultra_run_dist(
        [d._native for d in us.chips],
        pairs,
        owner,
        comm.Get_rank(),
        size,
        _all_to_all(comm, timeout_s),
        check_races,
        trace,
        **limit,
        **fabric,
    )
    return UltraResult(raw, by_chip)


def mpiexec() -> str | None:
    """The `mpiexec` next to this Python (the `dist` extra's mpich wheel installs it there), else
    the first on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.access(local, os.X_OK) else shutil.which("mpiexec")


def main(argv: list[str] | None = None) -> int:
    """`python -m trn3emu.ultra_mpi --np 4 [--hosts a,b] script.py [args]`: run the script in 4 MPI
    processes (`mpiexec -n 4 [-hosts a,b] python script.py args`). Without `--np` (e.g. under
    `mpiexec -n 4 python -m trn3emu.ultra_mpi script.py`) it runs the script in this process, as
    `python script.py` would."""
    ap = argparse.ArgumentParser(
        prog="python -m trn3emu.ultra_mpi",
        description="Run an UltraServer script (one that calls trn3emu.ultra_mpi.run) over MPI processes.",
    )
    ap.add_argument("--np", type=int, default=None, help="number of processes to start with mpiexec")
    ap.add_argument("--hosts", default=None, help="comma-separated hosts (mpiexec -hosts)")
    ap.add_argument("--mpiexec", default=None, help="the mpiexec to use (default: next to python, else PATH)")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    ns = ap.parse_args(argv)
    if not ns.hosts and not os.path.isfile(ns.script):  # (on other hosts it may exist there only)
        ap.error(f"no script file {ns.script!r}")
    if ns.np is None:
        if ns.hosts:
            ap.error("--hosts needs --np")
        sys.argv = [ns.script, *ns.args]
        runpy.run_path(ns.script, run_name="__main__")
        return 0
    if ns.np < 1:
        ap.error(f"--np must be >= 1, not {ns.np}")
    exe = ns.mpiexec or mpiexec()
    if exe is None:
        ap.error("no mpiexec found: pip install 'trn3emu[dist]' (mpi4py and the mpich wheel) or pass --mpiexec")
    cmd = [exe, "-n", str(ns.np)]
    if ns.hosts:
        cmd += ["-hosts", ns.hosts]
    cmd += [sys.executable, ns.script, *ns.args]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
