"""CLI findings of issue 18 (item 5): sizes the demo cannot tile are refused instead of reporting
a result of 0 instructions, and an `--output` spec without `=FILE` is an error instead of writing
`.npy`."""

from __future__ import annotations

import pytest
from trn3emu.cli import main


@pytest.mark.parametrize("argv", [["--m", "100"], ["--k", "0"], ["--n", "100"], ["--m", "-128"]])
def test_demo_refuses_sizes_it_cannot_tile(argv, capsys):
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err
    assert "ShapeError" in err and "multiple of" in err and argv[0] in err


@pytest.mark.parametrize("spec", ["0x0:4:float32", "0x0:4:float32=", "0x0:4=out.npy", "0x0=out.npy"])
def test_run_output_spec_without_a_file_or_fields_is_an_error(spec, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    prog = tmp_path / "p.s"
    prog.write_text("nop.sync\n")
    assert main(["run", str(prog), "--output", spec]) == 2
    assert "expected ADDR:SHAPE:DTYPE=FILE.npy" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.npy"))


@pytest.mark.parametrize("extra", [[], ["--np", "2"]])
def test_ultra_mpi_launcher_names_a_missing_script(extra, tmp_path, capsys):
    """`python -m trn3emu.ultra_mpi [--np N] script.py`: a script that is not there is a usage
    error naming it (exit 2), not a traceback or an mpiexec failure."""
    from trn3emu import ultra_mpi

    missing = str(tmp_path / "nope.py")
    with pytest.raises(SystemExit) as e:
        ultra_mpi.main([*extra, missing])
    assert e.value.code == 2
    assert f"no script file {missing!r}" in capsys.readouterr().err
