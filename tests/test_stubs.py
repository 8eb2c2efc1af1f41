"""The typed stubs agree with the modules they describe (mypy.stubtest), and a type checker sees
the assembler's operand types (generated from isa/isa.toml into python/trn3emu/_asm.pyi)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy")

HERE = Path(__file__).resolve().parent


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_stubtest_asm_and_native(tmp_path):
    r = _run(
        [
            "mypy.stubtest",
            "trn3emu._asm",
            "trn3emu._native",
            "--allowlist",
            str(HERE / "stubtest_allowlist.txt"),
            "--mypy-config-file",
            str(tmp_path / "none.ini"),
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_type_checker_sees_operand_types(tmp_path):
    src = tmp_path / "user.py"
    src.write_text(
        textwrap.dedent(
            """
            import trn3emu as t3

            p = t3.Program()
            a = p.sbuf((128, 64), "float32")
            b = p.sbuf((128, 64), "float32")
            p.tensor_tensor(dst=a, data1=a, data2=b, op="add")
            p.tensor_scalar(a, b, op0="multiply", operand0=2, engine="vector")
            p.tensor_tensor(dst=a, data1=a, data2=b, op="addd")
            p.tensor_scalar(a, b, op0="multiply", operand0="two")
            p.nc_matmul(a, a, b, perf_mode="single_row")
            p.tensor_copy(a, b, engine="tensor")
            reveal_type(p.memset(a, 0.0))
            """
        )
    )
    r = _run(["mypy", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(src)], tmp_path)
    out = r.stdout
    errors = [line for line in out.splitlines() if ": error:" in line]
    # exactly the four bad calls (lines 9-12 of the snippet), each on its bad operand
    assert [int(line.split(":")[1]) for line in errors] == [9, 10, 11, 12], out
    assert '"op"' in errors[0] and "'divide'" in errors[0], out  # the expected type lists the enum's names
    assert '"operand0"' in errors[1], out
    assert '"perf_mode"' in errors[2], out
    assert '"engine"' in errors[3], out
    assert 'Revealed type is "int"' in out, out
