"""scripts/nki_conformance.py counts what it runs: a small SDK-shaped folder of our own (CI is
offline; the real SDK copy is fetched outside the repository) with a passing, a failing and a
non-importing test file, and a passing, a mismatching and a module-lacking example."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("nki_conformance", ROOT / "scripts" / "nki_conformance.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


KERNEL = """
import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def test_double(a):  # a kernel named test_*: not a test (pytest must not collect it)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.multiply(nl.load(a), 2))
    return out
"""


def test_counts_of_a_small_sdk(tmp_path, capsys):
    t = tmp_path / "nki" / "test"
    t.mkdir(parents=True)
    (t / "test_ok.py").write_text(
        KERNEL
        + """

def test_pass():
    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    assert (test_double(a) == 2 * a).all()


def test_fail():
    assert False, "wrong on purpose"
"""
    )
    (t / "test_broken.py").write_text(
        "import no_such_module_here\n\ndef test_a():\n    pass\n\ndef test_b():\n    pass\n"
    )
    ex = tmp_path / "nki" / "examples"
    ex.mkdir()
    (ex / "good.py").write_text(KERNEL + "\nif __name__ == '__main__':\n    print('NKI and NumPy match')\n")
    (ex / "bad.py").write_text("if __name__ == '__main__':\n    print('NKI and NumPy differ')\n")
    (ex / "needs.py").write_text("if __name__ == '__main__':\n    import torch_xla_not_here\n")
    (ex / "library.py").write_text("X = 1\n")  # no __main__ block: not a script
    notes = tmp_path / "release-notes"
    notes.mkdir()
    for v in ("2.9.0", "2.32.0", "2.31.1"):
        (notes / f"{v}.rst").write_text("")
    rc = _script().main([str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "(SDK 2.32.0)" in out
    assert "nki/test: 1 of 4 cases pass" in out  # test_pass; test_fail and test_broken's two cases fail
    assert "test_fail: AssertionError: wrong on purpose" in out
    assert out.count("test_broken.py (does not import; 2 cases)") == 2
    assert "examples: 1 of 2 runnable scripts pass (1 need a module this host lacks)" in out
    assert "bad.py: prints a mismatch: differ" in out
    assert "needs.py: needs torch_xla_not_here" in out
