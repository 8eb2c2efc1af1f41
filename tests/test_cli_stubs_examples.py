"""The console command, the native-module stubs, the ISA generator and the examples."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trn3emu as t3
from trn3emu import _native
from trn3emu.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent


def test_native_stub_matches_module():
    """Every class, method and function in _native.pyi exists in the compiled module, and vice versa."""
    stub = ast.parse((ROOT / "python" / "trn3emu" / "_native.pyi").read_text())
    declared = {}
    for node in stub.body:
        if isinstance(node, ast.ClassDef):
            declared[node.name] = {
                n.name for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("__")
            }
        elif isinstance(node, ast.FunctionDef):
            declared[node.name] = None
        elif isinstance(node, ast.AnnAssign):
            declared[node.target.id] = None
    public = {n for n in dir(_native) if not n.startswith("_")}
    assert public == set(declared), f"stub/module mismatch: {public ^ set(declared)}"
    for cls, methods in declared.items():
        if methods is None:
            continue
        actual = {n for n in dir(getattr(_native, cls)) if not n.startswith("__")}
        assert methods == actual, f"{cls}: stub/module mismatch {methods ^ actual}"


def test_generated_isa_files_are_fresh():
    r = subprocess.run([sys.executable, str(ROOT / "isa" / "generate.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _program_text(tmp_path):
    p = t3.Program(sync="manual")
    x = p.sbuf((128, 64), np.float32)
    s = p.semaphore()
    p.dma_copy(dst=x, src=t3.Tensor("hbm", np.float32, (128, 64)), signal=s)
    p.tensor_scalar(dst=x, data=x, op0="multiply", operand0=3.0, op1="add", operand1=1.0, wait=[(s, 1)], signal=s)
    out = t3.Tensor("hbm", np.float32, (128, 64), offset=1 << 20)
    p.dma_copy(dst=out, src=x, wait=[(s, 2)])
    path = tmp_path / "prog.t3s"
    path.write_text(p.to_text())
    return p, path


def test_cli_asm_disasm_round_trip(tmp_path, capsys):
    p, path = _program_text(tmp_path)
    binary = tmp_path / "prog.t3b"
    assert cli(["asm", str(path), "-o", str(binary)]) == 0
    assert binary.read_bytes() == p.encode()
    back = tmp_path / "back.t3s"
    assert cli(["disasm", str(binary), "-o", str(back)]) == 0
    assert back.read_text() == path.read_text()


def test_cli_run_with_inputs_and_outputs(tmp_path, capsys):
    _, path = _program_text(tmp_path)
    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    np.save(tmp_path / "a.npy", a)
    out = tmp_path / "out.npy"
    assert (
        cli(["run", str(path), "--input", f"0x0={tmp_path / 'a.npy'}", "--output", f"{1 << 20}:128x64:float32={out}"])
        == 0
    )
    np.testing.assert_array_equal(np.load(out), a * np.float32(3) + np.float32(1))
    assert "dma.sync" in capsys.readouterr().out


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.t3s"
    bad.write_text("tensor_tensor.vector dst=sbuf:float32[0:128]+0[[1,4]] op=add\n")
    assert cli(["disasm", str(bad)]) == 2
    assert "AsmSyntaxError" in capsys.readouterr().err


def test_cli_demo_passes(capsys):
    assert cli(["demo", "--m", "128", "--k", "256", "--n", "512"]) == 0
    out = capsys.readouterr().out
    assert "tensor" in out and "estimated time" in out


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "trn3emu", "isa", "nc_matmul"], capture_output=True, text=True)
    assert r.returncode == 0 and "nc_matmul" in r.stdout


@pytest.mark.parametrize("name", ["tiled_matmul"])
def test_example_runs_and_matches_numpy(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    err = mod.main(128, 256, 512)
    # bf16 output: relative error bounded by the bf16 half-ulp (2^-8) of the largest element.
    assert err < 2.0**-8
