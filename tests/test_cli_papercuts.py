"""The command line's papercuts (issue 16): --version, `isa NAME` pages, --sync auto by default,
typed .npy inputs, NKI kernel files for `trace`, quiet broken pipes, packaged examples, and docs
that stay inside the repository. Everything runs the real command in a subprocess."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from trn3emu._asm import INSTRUCTIONS

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, cwd=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trn3emu", *map(str, args)], capture_output=True, text=True, cwd=cwd, **kw
    )


def test_version():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"trn3emu {version('trn3emu')}"


def test_isa_name_prints_the_full_page():
    r = cli("isa", "nc_matmul")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for param, _kind, _enum in INSTRUCTIONS["nc_matmul"][2]:
        assert f"`{param}`" in out
    assert "0x0100" in out and "pe_matmul" in out  # opcode and cost class
    assert "fp32 accumulation" in out  # the rule text
    assert "`False`" in out and "`none`" in out and "required" in out  # defaults
    # the dtype classes the operands name, spelled out
    line = next(x for x in out.splitlines() if x.strip().startswith("matmul_in:"))
    assert {"bfloat16", "float8_e4m3fn", "float32"} <= {d.strip() for d in line.split(":")[1].split(",")}


def test_isa_unknown_name_fails_with_a_suggestion():
    r = cli("isa", "nc_matmull")
    assert r.returncode != 0 and r.stdout == ""
    assert "no instruction 'nc_matmull'" in r.stderr and "did you mean nc_matmul" in r.stderr
    r = cli("isa", "activaton")
    assert r.returncode != 0 and "activation" in r.stderr


@pytest.mark.parametrize("args", [("isa",), ("isa", "dma_copy"), ("--help",)])
def test_broken_pipe_exits_quietly(args):
    """The reader is gone before the command writes (as `trn3emu isa | head -1` ends up): no traceback."""
    p = subprocess.Popen([sys.executable, "-m", "trn3emu", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and err == "", err


def test_broken_pipe_through_a_shell_pipe():
    r = subprocess.run(
        f"{sys.executable} -m trn3emu isa | head -1", shell=True, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("0x0001 nop")


def _racy_program(tmp_path: Path) -> Path:
    """Two engines touch one tile with no semaphore: fine with --sync auto, a race with manual."""
    p = t3.Program(sync="manual")
    x = p.sbuf((128, 64), np.float32)
    p.dma_copy(dst=x, src=t3.Tensor("hbm", np.float32, (128, 64)), engine="sync")
    p.tensor_scalar(dst=x, data=x, op0="multiply", operand0=3.0, engine="vector")
    p.dma_copy(dst=t3.Tensor("hbm", np.float32, (128, 64), offset=1 << 20), src=x, engine="sync")
    path = tmp_path / "racy.t3s"
    path.write_text(p.to_text())
    return path


@pytest.mark.parametrize("cmd", ["run", "trace"])
def test_run_and_trace_default_to_sync_auto(tmp_path, cmd):
    prog = _racy_program(tmp_path)
    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    np.save(tmp_path / "a.npy", a)
    extra = ["--output", f"{1 << 20}:128x64:float32={tmp_path / 'o.npy'}"] if cmd == "run" else []
    extra += ["--out", tmp_path / "t.json"] if cmd == "trace" else []
    r = cli(cmd, prog, "--input", f"0={tmp_path / 'a.npy'}", *extra)
    assert r.returncode == 0, r.stderr
    if cmd == "run":
        np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), a * np.float32(3))
    r = cli(cmd, prog, "--input", f"0={tmp_path / 'a.npy'}", "--sync", "manual", *extra)
    assert r.returncode == 2
    assert "RaceError" in r.stderr and "--sync auto" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3"])
def test_input_npy_of_bf16_and_fp8_as_numpy_saves_them(tmp_path, dtype):
    dt = np.dtype(getattr(ml_dtypes, dtype))
    rng = np.random.default_rng(3)
    a = rng.standard_normal((128, 64)).astype(np.float32).astype(dt)
    np.save(tmp_path / "a.npy", a)
    header = (tmp_path / "a.npy").read_bytes()[:128].decode("latin1")
    # numpy writes raw words (<V2 / <V1), or for float8_e5m2 a '<f1' np.load itself refuses
    assert re.search(r"'descr': '([|<]V[12]|<f1)'", header), header
    p = t3.Program()
    x = p.sbuf((128, 64), dt)
    p.dma_copy(dst=x, src=t3.Tensor("hbm", dt, (128, 64)))
    p.dma_copy(dst=t3.Tensor("hbm", dt, (128, 64), offset=1 << 20), src=x)
    (tmp_path / "copy.t3s").write_text(p.to_text())
    out = tmp_path / "o.npy"
    r = cli(
        "run",
        tmp_path / "copy.t3s",
        "--input",
        f"0x0:{dtype}={tmp_path / 'a.npy'}",
        "--output",
        f"{1 << 20}:128x64:{dtype}={out}",
    )
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[-a.nbytes :] == a.tobytes()  # bit-exact (an .npy ends with its data)
    # Without the dtype the raw words cannot be placed: a clear error, not a crash.
    r = cli("run", tmp_path / "copy.t3s", "--input", f"0x0={tmp_path / 'a.npy'}")
    assert r.returncode == 2 and f"0x0:bfloat16={tmp_path / 'a.npy'}" in r.stderr and "Traceback" not in r.stderr


def test_input_dtype_converts_an_ordinary_array(tmp_path):
    a = np.linspace(-3, 3, 128 * 64, dtype=np.float32).reshape(128, 64)
    np.save(tmp_path / "a.npy", a)
    p = t3.Program()
    bf = ml_dtypes.bfloat16
    x = p.sbuf((128, 64), bf)
    p.dma_copy(dst=x, src=t3.Tensor("hbm", bf, (128, 64)))
    p.dma_copy(dst=t3.Tensor("hbm", bf, (128, 64), offset=1 << 20), src=x)
    (tmp_path / "c.t3s").write_text(p.to_text())
    out = tmp_path / "o.npy"
    r = cli(
        "run",
        tmp_path / "c.t3s",
        "--input",
        f"0:bfloat16={tmp_path / 'a.npy'}",
        "--output",
        f"{1 << 20}:128x64:bfloat16={out}",
    )
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(out).view(np.uint16), a.astype(bf).view(np.uint16))


def test_trace_accepts_an_nki_kernel_file(tmp_path):
    out = tmp_path / "softmax.json.gz"
    r = cli("trace", ROOT / "examples" / "nki_softmax.py", "--out", out, "--png", tmp_path / "s.png")
    assert r.returncode == 0, r.stderr
    assert "estimated time" in r.stdout and "top source lines" in r.stdout
    with gzip.open(out, "rt") as f:
        names = {e["name"] for e in json.load(f)["traceEvents"] if e["ph"] == "X"}
    assert any(re.fullmatch(r"nki_softmax\.py:\d+", n) for n in names)
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    r = cli("trace", ROOT / "examples" / "nki_softmax.py", "--kernel", "nope", "--out", out)
    assert r.returncode == 2 and "no NKI kernel 'nope'" in r.stderr


def test_demo_nki_runs_the_packaged_example_from_anywhere(tmp_path):
    import trn3emu.examples

    pkg = Path(trn3emu.examples.__file__).resolve().parent
    assert (pkg / "nki_tensor_add.py").is_file()
    # examples/ in the checkout is the packaged directory, not a second copy (the installed
    # package, editable or not, ships the same files).
    src = ROOT / "python" / "trn3emu" / "examples"
    assert (ROOT / "examples").resolve() == src.resolve()
    assert {f.name for f in src.glob("*.py")} <= {f.name for f in pkg.glob("*.py")}
    r = cli("demo", "--nki", "tensor_add", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "tensor_add" in r.stdout and "estimated time" in r.stdout
    r = cli("demo", "--nki", "tensor_ad", cwd=tmp_path)
    assert r.returncode == 2 and "did you mean 'tensor_add'" in r.stderr


def test_docs_never_point_outside_the_repository():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bad = []
    for f in files:
        text = f.read_text()
        for m in re.finditer(r"(?<![\w.])((?:\.\./)+[\w./-]*)", text):
            target = (f.parent / m.group(1)).resolve()
            if ROOT.resolve() not in target.parents and target != ROOT.resolve() or not target.exists():
                bad.append(f"{f.name}: {m.group(1)}")
        for m in re.finditer(r"(?<![\w.:/])/(?:work|home|root|tmp|Users|opt|mnt)/\S*", text):
            bad.append(f"{f.name}: {m.group(0)}")
    assert not bad, bad
