"""An UltraServer run spread over MPI processes (docs/ultraserver.md, "Several processes").

Every process builds the same `UltraServer` and programs (the same script), and calls
`run(us, programs)`: process p runs only the chips it owns (`owned(len(us), p, size)`, contiguous
blocks), and at every window boundary the processes exchange the arrival messages of their chips
and their next event times with an MPI allgather. Times, results of the owned chips and the fabric
trace are bit-identical to `us.run(programs)` in one process.

    mpiexec -n 4 python script.py                                    # one host
    mpiexec -n 8 -hosts node1,node2 python script.py                 # several hosts

A peer that stops answering (killed, hung) ends the run in every other process with an
`ExecutionError` after `timeout_s` (no hang); `mpiexec` itself also ends the job when a process dies.
"""

from __future__ import annotations

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


def _allgather(comm: Any, timeout_s: float):
    """An allgather of bytes with a deadline (non-blocking MPI collectives, polled)."""
    size = comm.Get_size()

    def exchange(mine: bytes) -> list[bytes]:
        deadline = time.monotonic() + timeout_s
        n = np.array([len(mine)], np.int64)
        counts = np.zeros(size, np.int64)
        _wait(comm.Iallgather(n, counts), deadline, "message sizes")
        buf = np.empty(int(counts.sum()), np.uint8)
        send = np.frombuffer(mine, np.uint8) if mine else np.empty(0, np.uint8)
        _wait(comm.Iallgatherv(send, [buf, counts.tolist()]), deadline, "messages")
        offs = np.concatenate([[0], np.cumsum(counts)])
        return [buf[offs[i] : offs[i + 1]].tobytes() for i in range(size)]

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
            by_chip[chip].append(n)
        pairs.append((chip, n))
    own = owned(len(us.chips), comm.Get_rank(), comm.Get_size())
    limit = {} if trace_limit is None else {"trace_limit": trace_limit}
    fabric = {k: v for k, v in us._fabric.items() if v is not None}
    raw = _native.ultra_run_dist(
        [d._native for d in us.chips],
        pairs,
        own,
        _allgather(comm, timeout_s),
        check_races,
        trace,
        **limit,
        **fabric,
    )
    return UltraResult(raw, by_chip)
