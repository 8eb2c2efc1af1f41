"""An UltraServer run spread over 4 MPI processes (mpiexec from the `dist` extra's mpich wheel) is
bit-identical to the single-process run: every chip's outputs and Perfetto trace, the fabric's
messages and CC-core spans, the run's time; a killed process ends the job with an error, no hang."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from trn3emu import ultra_mpi

pytest.importorskip("mpi4py")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from ultra_mpi_case import build, summary  # noqa: E402


def _mpiexec() -> str:
    found = ultra_mpi.mpiexec()
    if not found:
        pytest.skip("no mpiexec (install the dist extra)")
    return found


def _launch(out: Path, *mode: str, n: int = 4, timeout: float = 120):
    cmd = [_mpiexec(), "-n", str(n), sys.executable, str(HERE / "ultra_mpi_case.py"), str(out), *mode]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_four_processes_bit_identical(tmp_path):
    out = tmp_path / "out.npz"
    p = _launch(out)
    assert p.returncode == 0, p.stderr
    us, progs, outs = build()
    r = us.run(progs)
    want, traces = summary(us, r, outs, range(len(us)))
    got = np.load(out)
    assert set(got.files) == set(want)
    for k, v in want.items():
        assert np.array_equal(got[k], v), k
    assert len(want["msg_bytes"]) > 0
    got_traces = json.loads(Path(str(out) + ".json").read_text())
    for c, t in traces.items():
        assert got_traces[str(c)] == t, f"chip {c} trace differs"


def test_killed_process_ends_the_job(tmp_path):
    p = _launch(tmp_path / "out.npz", "kill", timeout=90)
    assert p.returncode != 0
    assert not (tmp_path / "out.npz").exists()
    text = p.stdout + p.stderr
    assert "KILLED" in text.upper() or "ultra_dist_timeout" in text or "TERMINATION" in text.upper(), text[-2000:]


def test_hung_process_ends_the_others_with_a_timeout(tmp_path):
    """A peer that neither answers nor dies: every other process raises ExecutionError
    (`ultra_dist_timeout`) after timeout_s instead of waiting for ever."""
    _launch(tmp_path / "out.npz", "hang", timeout=90)
    for r in (0, 1, 3):
        line = (tmp_path / f"out.npz.rank{r}.txt").read_text()
        assert line.startswith(f"rank {r}: ExecutionError ultra_dist_timeout"), line
        assert "a process died or hangs" in line, line
    assert not (tmp_path / "out.npz.rank2.txt").exists()


def test_error_in_one_process_reaches_every_process(tmp_path):
    p = _launch(tmp_path / "out.npz", "race")
    assert p.returncode == 0, p.stderr
    lines = [(tmp_path / f"out.npz.rank{r}.txt").read_text() for r in range(4)]
    assert len(lines) == 4, p.stdout
    # chip 7 belongs to process 3: it raises the race itself, the others name it
    assert lines[3].startswith("rank 3: RaceError"), lines[3]
    for line in lines[:3]:
        assert "ExecutionError ultra_dist_peer_failed" in line and "process 3" in line and "chip 7" in line, line


_SCRIPT = """
import sys
import numpy as np
import trn3emu as t3
from mpi4py import MPI
from trn3emu import ultra_mpi

us = t3.UltraServer(chips=2)
progs = [t3.Program(chip=c, core=0) for c in range(2)]
outs = []
for p in progs:
    h = us.chip(p.chip).hbm
    x = h.put(np.full(8, p.chip + 1.0, np.float32))
    outs.append(h.alloc((8,), np.float32))
    p.all_reduce(dst=outs[-1], src=x, cores=[q.global_core for q in progs])
ultra_mpi.run(us, progs, timeout_s=20)
me = MPI.COMM_WORLD.rank
with open(f"{sys.argv[1]}.{me}", "w") as f:
    f.write(f"{MPI.COMM_WORLD.size} {sys.argv[2]} {us.chip(me).hbm.get(outs[me]).tolist()}")
"""


def test_launcher_starts_the_processes(tmp_path):
    """`python -m trn3emu.ultra_mpi --np 2 script.py args` runs the script in 2 MPI processes (the
    mpiexec next to python), each owning its chip; without --np it runs the script in place."""
    _mpiexec()
    script = tmp_path / "s.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "trn3emu.ultra_mpi", "--np", "2", str(script), str(out), "hello"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    for rank in range(2):
        assert (tmp_path / f"o.{rank}").read_text() == "2 hello " + str([3.0] * 8)
    # in place (one process, as under `mpiexec -n 1 python -m trn3emu.ultra_mpi script.py`)
    cmd = [sys.executable, "-m", "trn3emu.ultra_mpi", str(script), str(out) + "x", "again"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "ox.0").read_text() == "1 again " + str([3.0] * 8)
