"""Every code block of the README and docs/ runs (issue 29): Python blocks are executed (a block that
is a fragment of a larger program gets the setup it assumes from PRELUDE, keyed by the file and
the block's first line), the README's command-line block runs in a copy of the files it names, and
the blocks that install, build, fuzz, benchmark or need MPI are listed in NOT_RUN with the reason.
A new block is run as written: it fails here until it runs or is listed."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
CODE = {"python", "bash", "sh"}  # (text / diagram blocks are not code)

_KERNEL = """
import numpy as np
import trn3emu.nki
trn3emu.nki.install()
import nki, nki.language as nl

@nki.jit
def my_kernel(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out

a = np.ones((128, 64), np.float32)
b = np.full((128, 64), 2.0, np.float32)
"""

#: (file, first line of the block) -> the setup the fragment assumes
PRELUDE = {
    ("README.md", "import trn3emu.nki"): _KERNEL,
    ("nki.md", "import trn3emu.nki"): _KERNEL,
    (
        "nki.md",
        'prof = nki.profile(working_directory="prof")(my_kernel)  # or nki.benchmark(warmup=2, iters=10, ...)',
    ): _KERNEL,
    ("limits.md", "dev = t3.Device()"): "import trn3emu as t3\n",
    (
        "multicore.md",
        "progs = dev.programs()  # Program(core=0) .. Program(core=7); dev.programs([0, 1]) for a pair",
    ): """
import numpy as np, trn3emu as t3
dev = t3.Device()
x = [t3.Tensor("sbuf", "float32", (128, 64), core=k) for k in range(8)]
out = [t3.Tensor("sbuf", "float32", (128, 64), core=k) for k in range(8)]
""",
    ("sparsity.md", "from trn3emu import sparsity"): """
import numpy as np, trn3emu as t3
from trn3emu import sparsity as _sp
rng = np.random.default_rng(0)
w = np.zeros((512, 128), np.float32)
w[::4] = rng.random((128, 128))  # 4 of every 16 rows: 4:16
b = rng.random((512, 64)).astype(np.float32)
_v, _i = _sp.compress(w, "4:16")
p = t3.Program()
v, ix = p.sbuf(_v.shape, "float32"), p.sbuf(_i.shape, "uint8")
m = p.sbuf(_sp.moving_layout(b, "4:16").shape, "float32")
acc = p.psum((128, 64), "float32")
""",
    ("ultraserver.md", "from trn3emu import ultra_mpi"): """
import numpy as np, trn3emu as t3
us = t3.UltraServer(chips=2)
progs = [t3.Program(chip=c, core=0) for c in range(2)]
""",
    ("ultraserver.md", "outs = trn3emu.nki.spmd(kernel, world_size=W, lnc=2)(per_rank_args)  # W results"): _KERNEL
    + """
@nki.jit
def kernel(a, b):  # LNC=2: each core of the pair adds its half of the rows
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    r = nl.program_id(0) * 64
    nl.store(out[r : r + 64], nl.add(nl.load(a[r : r + 64]), nl.load(b[r : r + 64])))
    return out

W = 2
per_rank_args = [(a, b), (b, a)]
""",
}

#: blocks not run here, and why
NOT_RUN = {
    ("README.md", "pip install . && python3 -m trn3emu demo"): "installs and builds the package and runs the "
    "whole suite: .ci/run runs these two commands (tests/test_readme.py checks they are the same)",
    ("README.md", "pytest benches/ --benchmark-only                                     # run and print the table"): (
        "runs every benchmark (minutes of host time): CI's bench job runs it"
    ),
    ("README.md", "python -m venv .venv && . .venv/bin/activate && pip install maturin '.[test]'"): (
        "the contributor setup: creates a venv and rebuilds the extension"
    ),
    ("fuzzing.md", "cargo install cargo-fuzz                       # once; needs a nightly toolchain"): (
        "needs cargo-fuzz and a nightly toolchain: tests/test_fuzz_api_smoke.py and CI's seeded smoke run the targets"
    ),
    (
        "ultraserver.md",
        "pip install 'trn3emu[dist]'                                   # mpi4py + the mpich wheel (mpiexec)",
    ): ("installs the MPI extra and launches processes: tests/test_ultraserver_mpi.py runs these launches"),
}


def _blocks():
    for f in FILES:
        text = f.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) in CODE:
                body = m.group(2)
                line = text[: m.start()].count("\n") + 2
                yield f.name, line, m.group(1), body, body.splitlines()[0]


BLOCKS = list(_blocks())


def test_every_listed_block_exists():
    firsts = {(name, first) for name, _, _, _, first in BLOCKS}
    assert set(PRELUDE) <= firsts and set(NOT_RUN) <= firsts


@pytest.mark.parametrize(
    ("name", "line", "lang", "body", "first"),
    [b for b in BLOCKS if (b[0], b[4]) not in NOT_RUN],
    ids=[f"{b[0]}:{b[1]}" for b in BLOCKS if (b[0], b[4]) not in NOT_RUN],
)
def test_doc_block_runs(name, line, lang, body, first, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if lang == "python":
        if "ultra_mpi" in body:
            pytest.importorskip("mpi4py", reason="ultra_mpi.run needs the [dist] extra (mpi4py)")
        scope: dict = {"__name__": "__doc_block__"}
        exec(compile(PRELUDE.get((name, first), ""), f"{name} (setup)", "exec"), scope)
        exec(compile("\n" * (line - 1) + body, name, "exec"), scope)
        return
    # a shell block: run in a copy of the repository files it names (it writes files there)
    for d in ("examples",):
        shutil.copytree(ROOT / d, tmp_path / d, symlinks=False)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", MPLBACKEND="Agg")
    env["TRN3EMU_PROGRESS"] = "0"
    r = subprocess.run(["bash", "-e", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{name}:{line} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    if "prog.t3s" in body:  # the run wrote what the Python example computes
        import ml_dtypes
        import numpy as np

        cli = tmp_path / "examples" / "cli"
        a = np.load(cli / "a.npy").view(ml_dtypes.bfloat16).astype(np.float64)
        b = np.load(cli / "b.npy").view(ml_dtypes.bfloat16).astype(np.float64)
        np.testing.assert_allclose(np.load(cli / "out.npy"), np.maximum(0.5 * (a.T @ b), 0), rtol=1e-5, atol=1e-5)
        assert (cli / "t.png").stat().st_size > 0 and (tmp_path / "softmax.json").exists()


def test_trace_runs_an_ordinary_main_script(tmp_path):
    script = tmp_path / "k.py"
    script.write_text(
        "import sys\nimport numpy as np\nimport nki\nimport nki.language as nl\n\n\n"
        "@nki.jit\ndef double(a):\n    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(out, nl.multiply(nl.load(a), 2.0))\n    return out\n\n\n"
        'if __name__ == "__main__":\n    assert (double(np.ones((128, 512), np.float32)) == 2).all()\n    sys.exit(0)\n'
    )
    r = subprocess.run(
        [sys.executable, "-m", "trn3emu", "trace", str(script), "--out", str(tmp_path / "k.json")],
        capture_output=True,
        text=True,
        env=dict(os.environ, TRN3EMU_PROGRESS="0"),
    )
    assert r.returncode == 0, r.stderr
    assert "k.py:10" in r.stdout and (tmp_path / "k.json").exists()
