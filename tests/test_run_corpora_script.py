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


def test_layouts_of_real_corpora_a_hyphenated_folder_a_namespace_package_and_a_pytest_option(tmp_path):
    """Three layouts of nki-samples before its kernels were removed: `contributed/neuron-team-kernels/`
    has an `__init__.py` but a name no import can spell, so its files are loose and see their
    siblings (`from common import ...`); `src/pkg/sub/` has no `__init__.py` (a namespace package,
    which an install makes importable), so its relative imports resolve; and `--pytest-arg` goes
    only to test files whose conftest.py defines the option (`--simulation-only` there)."""
    team = tmp_path / "contributed" / "team-kernels"
    team.mkdir(parents=True)
    (team / "__init__.py").write_text("")
    (team / "common.py").write_text("def two():\n    return 2\n")
    (team / "uses_sibling.py").write_text(
        "from common import two\n" + KERNEL + "\nif __name__ == '__main__':\n    assert two() == 2\n"
    )
    sub = tmp_path / "src" / "pkg" / "sub"
    (tmp_path / "src" / "pkg" / "util").mkdir(parents=True)
    sub.mkdir()
    (tmp_path / "src" / "pkg" / "util" / "consts.py").write_text("SCALE = 2\n")
    (sub / "kern.py").write_text("from ..util.consts import SCALE\n" + KERNEL)
    (sub / "plain.py").write_text("TWO = 2\n")
    (sub / "sibling.py").write_text("import plain\n" + KERNEL)  # a plain import of a sibling module
    tests = tmp_path / "test"
    (tests / "unit").mkdir(parents=True)
    (tests / "unit" / "conftest.py").write_text(
        "def pytest_addoption(parser):\n    parser.addoption('--sim-only', action='store_true')\n\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    if config.getoption('--sim-only'):\n"
        "        items[:] = [i for i in items if 'sim' in i.name]\n"
    )
    (tests / "unit" / "test_k.py").write_text(
        KERNEL + "\ndef test_hardware_only():\n    raise RuntimeError('needs a NeuronDevice')\n\n"
        "def test_sim():\n    a = np.ones((2, 3), np.float32)\n    np.testing.assert_array_equal(double(a), a * 2)\n"
    )
    (tests / "test_other.py").write_text(KERNEL + "\ndef test_plain():\n    assert double is not None\n")
    out = tmp_path / "r.json"
    mod = _script()

    def outcomes(*extra):
        assert mod.main([str(tmp_path), "--timeout", "120", "--json", str(out), *extra]) == 0
        return {r["file"]: (r["outcome"], r["reason"]) for r in json.loads(out.read_text())}

    rows = outcomes("--pytest-arg=--sim-only")
    assert rows == {
        "contributed/team-kernels/uses_sibling.py": ("ran", ""),
        "src/pkg/sub/kern.py": ("imported", ""),
        "src/pkg/sub/sibling.py": ("imported", ""),
        "test/test_other.py": ("ran", ""),  # its folder's conftest has no --sim-only: not given
        "test/unit/test_k.py": ("ran", ""),
    }
    assert outcomes()["test/unit/test_k.py"] == ("refused", "RuntimeError")
