"""scripts/run_corpora.py counts what a corpus does: a small folder of our own (the real corpora are
fetched outside the repository) with a script that runs and checks its kernel against numpy, a
module that imports, one that needs a module nobody has, and a failing script; `--only` narrows
the files and `--python` names the children's interpreter."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("run_corpora", ROOT / "scripts" / "run_corpora.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


KERNEL = """
import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def double(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.multiply(nl.load(a), 2))
    return out
"""


def test_outcomes_of_a_small_corpus(tmp_path):
    (tmp_path / "runs.py").write_text(
        KERNEL
        + """
if __name__ == "__main__":
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(double(a), a * 2)
"""
    )
    (tmp_path / "wrong.py").write_text(
        KERNEL
        + """
if __name__ == "__main__":
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(double(a), a * 3)
"""
    )
    (tmp_path / "lib.py").write_text(KERNEL)
    (tmp_path / "needs.py").write_text("import no_such_module_here\n" + KERNEL)
    (tmp_path / "part.py").write_text(KERNEL + "import neuronxcc.nki.no_such_part\n")
    (tmp_path / "plain.py").write_text("x = 1\n")  # no NKI: not counted
    out = tmp_path / "r.json"
    mod = _script()
    assert mod.main([str(tmp_path), "--timeout", "120", "--json", str(out), "--python", sys.executable]) == 0
    rows = {r["file"]: (r["outcome"], r["reason"]) for r in json.loads(out.read_text())}
    assert rows == {
        "runs.py": ("ran", ""),
        "wrong.py": ("refused", "AssertionError"),
        "lib.py": ("imported", ""),
        "needs.py": ("refused", "needs no_such_module_here"),
        "part.py": ("refused", "needs neuronxcc.nki.no_such_part"),
    }
    assert mod.main([str(tmp_path), "--json", str(out), "--only", "lib"]) == 0
    assert [r["file"] for r in json.loads(out.read_text())] == ["lib.py"]


def test_nkilib_option_puts_an_nki_library_checkout_on_the_path(tmp_path):
    """`--nkilib CHECKOUT`: `import nkilib` (neuronx-cc's bundled name) and `nkilib_src.nkilib` (the
    wheel's) both resolve to the checkout's src/nkilib_src/nkilib; without it the file needs nkilib."""
    lib = tmp_path / "library" / "src" / "nkilib_src" / "nkilib"
    lib.mkdir(parents=True)
    (lib.parent / "__init__.py").write_text("")
    (lib / "__init__.py").write_text("WHERE = __file__\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "uses.py").write_text(
        "import os\nimport nkilib\nimport nkilib_src.nkilib as standalone\n"
        + KERNEL
        + "\nif __name__ == '__main__':\n    assert os.path.samefile(nkilib.WHERE, standalone.WHERE)\n"
    )
    out = tmp_path / "r.json"
    mod = _script()
    assert mod.main([str(corpus), "--json", str(out)]) == 0
    assert [(r["outcome"], r["reason"]) for r in json.loads(out.read_text())] == [("refused", "needs nkilib")]
    assert mod.main([str(corpus), "--json", str(out), "--nkilib", str(tmp_path / "library")]) == 0
    assert [(r["outcome"], r["reason"]) for r in json.loads(out.read_text())] == [("ran", "")]
    with pytest.raises(SystemExit):
        mod.main([str(corpus), "--nkilib", str(corpus)])
