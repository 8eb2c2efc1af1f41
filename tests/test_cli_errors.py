"""Issue 31 item 7, the command line: inputs that used to end in a Python traceback give one
`trn3emu: ...` line and exit code 2; text saved by `to_text(synced=True)` gets a `--sync manual`
hint; a UTF-8 byte-order mark before ISA text is accepted."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import trn3emu as t3
from trn3emu.cli import main

PROGRAM = "dma_copy.sync dst=sbuf:float32[0:128]+0[[1,4]] src=hbm:float32+0[[4,128],[1,4]]\n"


def _one_line_error(capsys, *needles) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x]
    assert lines and lines[0].startswith("trn3emu: "), err
    for n in needles:
        assert n in err, err
    return err


def test_input_of_an_npz_archive_is_named(tmp_path, capsys):
    prog, npz = tmp_path / "p.s", tmp_path / "x.npz"
    prog.write_text(PROGRAM)
    np.savez(npz, a=np.ones(4, np.float32))
    assert main(["run", str(prog), "--input", f"0={npz}"]) == 2
    _one_line_error(capsys, ".npz archive", "numpy.save")


def test_input_npy_header_claiming_more_than_the_file_holds(tmp_path, capsys):
    prog, big = tmp_path / "p.s", tmp_path / "big.npy"
    prog.write_text(PROGRAM)
    with open(big, "wb") as f:  # a header claiming 400 TB of float32, 16 bytes of data
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (10**14,)})
        f.write(bytes(16))
    assert main(["run", str(prog), "--input", f"0={big}"]) == 2
    _one_line_error(capsys, "400,000,000,000,000 bytes", "16 bytes")


def test_a_good_npy_input_still_loads(tmp_path, capsys):
    prog, good, out = tmp_path / "p.s", tmp_path / "x.npy", tmp_path / "o.npy"
    prog.write_text(PROGRAM + "dma_copy.sync dst=hbm:float32+2048[[4,128],[1,4]] src=sbuf:float32[0:128]+0[[1,4]]\n")
    x = np.arange(512, dtype=np.float32).reshape(128, 4)
    np.save(good, x)
    assert (
        main(["run", str(prog), "--sync", "auto", "--input", f"0={good}", "--output", f"2048:128x4:float32={out}"]) == 0
    )
    np.testing.assert_array_equal(np.load(out), x)


def test_trace_build_returning_a_non_program(tmp_path, capsys):
    script = tmp_path / "b.py"
    script.write_text("def build(dev):\n    return 5\n")
    assert main(["trace", str(script), "--out", str(tmp_path / "t.json")]) == 2
    _one_line_error(capsys, "build(dev) must return a Program", "5 (int)")


def test_disasm_with_stdout_closed_is_an_error_line(tmp_path):
    binary = tmp_path / "p.bin"
    binary.write_bytes(t3.Program.from_text(PROGRAM).encode())
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from trn3emu.cli import main; sys.exit(main(sys.argv[1:]))",
            "disasm",
            str(binary),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        # stdout closed in the child (`>&-`): Python starts with sys.stdout None
        preexec_fn=lambda: __import__("os").close(1),
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "standard output is closed" in r.stderr
    # with -o the command writes no stdout and works
    out = tmp_path / "p.txt"
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from trn3emu.cli import main; sys.exit(main(sys.argv[1:]))",
            "disasm",
            str(binary),
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: __import__("os").close(1),
    )
    assert r.returncode == 0, r.stderr
    assert t3.Program.from_text(out.read_text()) == t3.Program.from_text(PROGRAM)


def test_demo_with_a_huge_size_is_refused(capsys):
    # 512 x 10^9 elements: a multiple of the demo's tiles, far over host memory
    assert main(["demo", "--n", "1000000000"]) == 2
    _one_line_error(capsys, "ResourceError", "2^26")


def test_demo_with_a_non_integer_size_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo", "--n", "1e9"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "invalid int value: '1e9'" in err


def _synced_text() -> str:
    dev = t3.Device()
    a = dev.hbm.alloc((128, 4), np.float32)
    p = t3.Program()
    t, u = p.sbuf((128, 4), np.float32), p.sbuf((128, 4), np.float32)
    p.dma_copy(dst=t, src=a)
    p.tensor_copy(dst=u, src=t, engine="vector")  # another engine: a semaphore orders them
    p.dma_copy(dst=a, src=u)
    return p.to_text(synced=True)


def test_run_of_synced_text_hints_sync_manual(tmp_path, capsys):
    prog = tmp_path / "synced.s"
    prog.write_text(_synced_text())
    assert main(["run", str(prog)]) == 2
    _one_line_error(capsys, "SemaphoreError", "--sync manual")
    assert main(["run", str(prog), "--sync", "manual"]) == 0


def test_a_utf8_bom_before_isa_text_is_accepted(tmp_path, capsys):
    prog = tmp_path / "bom.s"
    prog.write_bytes(b"\xef\xbb\xbf" + PROGRAM.encode())
    assert main(["run", str(prog)]) == 0
    assert main(["asm", str(prog), "-o", str(tmp_path / "bom.bin")]) == 0
    with_bom = t3.Program.from_text("\ufeff" + PROGRAM)
    assert with_bom == t3.Program.from_text(PROGRAM) and len(with_bom) == 1
