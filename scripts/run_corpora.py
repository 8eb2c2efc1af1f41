"""Run a public NKI kernel corpus, unchanged, on trn3emu and count what runs.

    python scripts/run_corpora.py DIR [DIR ...] [--timeout S] [-v] [--json OUT] [--python PY]
                                  [--only PATH_PART ...] [--nkilib NKI_LIBRARY_CHECKOUT]
                                  [--pytest-arg ARG ...]

Each DIR is a copy of a kernel repository fetched outside this one (nki-samples, nki-library,
neuronx-distributed, nkipy, aws-neuron-sdk ...): nothing of it is part of trn3emu. Every `.py`
file under DIR that imports NKI (`nki`, `neuronxcc.nki`) is handled in a fresh interpreter with
`trn3emu.nki.install()` done first:

- a test file (`test_*.py`, `*_test.py`) runs under pytest: **ran** when at least one case
  passes and none fails (skips allowed), else **refused**;
- a script with a `__main__` block runs as `__main__`: **ran** when it exits 0;
- any other file is imported (its kernels decorated, nothing called: their inputs are the
  caller's): **imported** when that works.

The corpus's own packages are importable as an install would make them (each project folder
and its src/ on PYTHONPATH); modules it needs beyond that (torch, neuronxcc internals) count as refusals.
`--nkilib` names a checkout of github.com/aws-neuron/nki-library: the neuronx-cc wheel bundles that
library as the top-level package `nkilib`, and `pip install nki-library` adds it as
`nkilib_src.nkilib` (the bundled `nkilib/__init__.py` then swaps itself for it); the checkout's
`src/nkilib_src` and `src` go on the children's PYTHONPATH to stand for both, the library's own code.

A refusal is classed by its first error: a trn3emu error as `Class[rule]`, a missing module as
`needs <module>` (its top package; in full under `nki` / `neuronxcc`, which trn3emu provides), a
missing NKI name as `missing <name>`, a failed comparison as `AssertionError`, `timeout`, or the
exception class. The per-file lines, then counts per outcome
and per reason class, are printed; docs/nki.md records them with the corpus commit. The SDK's own
`nki/test` suite with its case-level report is `scripts/nki_conformance.py`'s job (issue 28).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: a file that uses NKI (either dialect)
_USES_NKI = re.compile(r"^\s*(import nki\b|from nki\b|import neuronxcc\.nki|from neuronxcc(\.nki)? import)", re.M)
_MAIN = re.compile(r"^if __name__ == ['\"]__main__['\"]", re.M)
_SKIP_DIRS = {".git", "__pycache__", "build", "dist", ".tox", "site-packages"}
#: top-level packages `trn3emu.nki.install()` provides: a missing module under them is a part it lacks
_EMULATED = {"nki", "neuronxcc"}

#: child-side bootstrap: install the emulator, run the file, report the first error as one JSON line
_BOOT = r"""
import json, os, sys, traceback
import trn3emu.nki
trn3emu.nki.install()
REPORT = os.environ["TRN3EMU_CORPUS_REPORT"]

def report(exc):
    if os.path.exists(REPORT) and os.path.getsize(REPORT):
        return
    with open(REPORT, "w") as f:
        json.dump({"cls": type(exc).__name__, "rule": getattr(exc, "rule", None),
                   "msg": (str(exc).strip().splitlines() or [""])[0][:300]}, f)

mode, path = sys.argv[1], sys.argv[2]
if not os.environ.get("TRN3EMU_CORPUS_MODULE"):  # a loose file sees its folder (a package's would shadow stdlib names)
    sys.path.insert(0, os.path.dirname(path))
else:  # a module sees its siblings too (last: they shadow nothing)
    sys.path.append(os.path.dirname(path))
if mode == "pytest":
    import pytest

    class Plugin:
        def pytest_runtest_makereport(self, item, call):
            if call.excinfo is not None and call.when == "call" and not call.excinfo.errisinstance(
                    pytest.skip.Exception):
                report(call.excinfo.value)

    sys.exit(pytest.main(sys.argv[3:] + [path], plugins=[Plugin()]))
try:
    import runpy
    sys.argv = [path]
    module = os.environ.get("TRN3EMU_CORPUS_MODULE", "")
    if module:  # a file inside a package: imported by name, so its relative imports resolve
        runpy.run_module(module, run_name="__main__" if mode == "script" else module, alter_sys=True)
    else:
        runpy.run_path(path, run_name="__main__" if mode == "script" else "corpus_import")
except SystemExit as e:
    if e.code not in (None, 0):
        report(e)
        raise
except BaseException as e:
    report(e)
    traceback.print_exc()
    sys.exit(1)
"""


def nki_files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if name.endswith(".py") and name not in ("setup.py", "conftest.py"):
                try:
                    text = p.read_text(errors="replace")
                except OSError:
                    continue
                if _USES_NKI.search(text):
                    out.append(p)
    return out


def kind(p: Path) -> str:
    if re.fullmatch(r"test_.*\.py|.*_test\.py", p.name):
        return "pytest"
    return "script" if _MAIN.search(p.read_text(errors="replace")) else "import"


def reason(err: dict | None, stderr: str) -> str:
    """The reason class of a refusal from the child's JSON report (or its stderr)."""
    if err is None:
        tail = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        m = re.match(r"(\w+(?:\.\w+)*):", tail[-1]) if tail else None
        err = {
            "cls": m.group(1).rsplit(".", 1)[-1] if m else (tail[-1][:60] if tail else "no error reported"),
            "rule": None,
            "msg": tail[-1] if tail else "",
        }
    cls, rule, msg = err["cls"], err.get("rule"), err.get("msg", "")
    if cls == "ModuleNotFoundError":
        m = re.search(r"No module named '([\w.]+)'", msg)
        name = m.group(1) if m else "?"
        # a part of the packages trn3emu stands in for is named in full (the package itself is there)
        return f"needs {name if name.split('.')[0] in _EMULATED else name.split('.')[0]}"
    if rule:
        return f"{cls}[{rule}]"
    if cls in ("AttributeError", "ImportError"):
        m = re.search(r"'([\w.]+)'.*?'(\w+)'|cannot import name '(\w+)'", msg)
        if m and "nki" in msg:
            return f"missing {m.group(3) or (m.group(1) + '.' + m.group(2))}"
    if cls == "SystemExit":
        return "exit status"
    return cls


def package_paths(root: Path) -> list[str]:
    """What installing the corpus would put on sys.path: the folder of each project file
    (`pyproject.toml` / `setup.py`, the root and up to two levels down) and its `src/`."""
    projects = [root] + sorted(
        {
            f.parent
            for pat in ("*/pyproject.toml", "*/*/pyproject.toml", "*/setup.py", "*/*/setup.py")
            for f in root.glob(pat)
        }
    )
    return [str(d) for p in projects for d in (p / "src", p) if d.is_dir()]


def module_of(p: Path, paths: list[str] = ()) -> tuple[str, str]:
    """(dotted module name, the folder above its top package) of a file inside a package (its
    folder has `__init__.py` and a name Python can import), or of a file under a `src/` folder of
    `paths` (what an install puts on sys.path; its folders may be namespace packages, PEP 420,
    as nki-samples' `nki_samples/reference/util` is), or ("", "") for a loose file."""
    parts, d = [p.stem], p.parent
    while (d / "__init__.py").exists() and d.name.isidentifier():
        parts.insert(0, d.name)
        d = d.parent
    for src in (Path(x) for x in paths if Path(x).name == "src"):
        if src in p.parents:
            rel = p.relative_to(src).with_suffix("").parts
            if len(rel) > len(parts) and all(x.isidentifier() for x in rel):
                return ".".join(rel), str(src)
    return (".".join(parts), str(d)) if len(parts) > 1 else ("", "")


def pytest_args_for(p: Path, root: Path, extra: list[str]) -> list[str]:
    """The `--pytest-arg`s a test file takes: those whose option a conftest.py of its folder or
    above (up to the corpus root) defines, e.g. nki-samples' `--simulation-only`, which runs the
    cases marked for running without a NeuronDevice."""
    texts = [
        c.read_text(errors="replace")
        for d in [p.parent, *p.parents]
        if root in (d, *d.parents)
        for c in [d / "conftest.py"]
        if c.exists()
    ]
    return [a for a in extra if any(a.split("=", 1)[0] in t for t in texts)]


def nkilib_paths(checkout: Path) -> list[str]:
    """PYTHONPATH entries that make an nki-library checkout importable as an install does: `nkilib`
    (neuronx-cc's bundled copy) and `nkilib_src.nkilib` (the `nki-library` wheel)."""
    src = checkout / "src"
    if not (src / "nkilib_src" / "nkilib" / "__init__.py").exists():
        raise SystemExit(f"--nkilib {checkout}: no src/nkilib_src/nkilib/__init__.py (not an nki-library checkout)")
    return [str(src / "nkilib_src"), str(src)]


def run_file(
    p: Path, timeout: float, paths: list[str], python: str = sys.executable, pytest_args: list[str] = ()
) -> tuple[str, str, str]:
    """(outcome, reason class, detail) of one corpus file run by `python`; `paths` go on PYTHONPATH,
    `pytest_args` to a test file's pytest."""
    k = kind(p)
    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(tmp) / "err.json"
        xml = Path(tmp) / "r.xml"
        module, top = module_of(p, paths) if k != "pytest" else ("", "")
        pp = os.pathsep.join([top] * bool(top) + paths + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env = dict(os.environ, TRN3EMU_CORPUS_REPORT=str(rep), PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
        env["PYTHONPATH"], env["TRN3EMU_CORPUS_MODULE"] = pp, module
        args = [python, "-c", _BOOT, k, str(p)]
        if k == "pytest":
            args += ["-q", "-p", "no:cacheprovider", "-x", f"--junitxml={xml}", *pytest_args]
        try:
            cwd = top or p.parent  # (`-c` puts the cwd first on sys.path: a package folder would shadow stdlib names)
            r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "refused", "timeout", f"over {timeout:.0f} s"
        err = json.loads(rep.read_text()) if rep.exists() and rep.stat().st_size else None
        if k == "pytest":
            passed = failed = skipped = 0
            first = ""
            if xml.exists():
                import xml.etree.ElementTree as ET

                for case in ET.parse(xml).getroot().iter("testcase"):
                    tags = {c.tag for c in case}
                    if tags & {"failure", "error"}:
                        failed += 1
                        bad = next(c for c in case if c.tag in ("failure", "error"))
                        lines = [ln for ln in (bad.text or "").splitlines() if re.match(r"E\s+\w", ln)]
                        first = first or (lines[-1][1:].strip() if lines else bad.get("message", ""))
                    elif "skipped" in tags:
                        skipped += 1
                    else:
                        passed += 1
            detail = f"{passed} passed, {failed} failed, {skipped} skipped (stops at the first failure)"
            if passed and not failed:
                return "ran", "", detail
            if not passed and not failed and r.returncode in (0, 5):
                return "refused", "no case runs here (all skipped)", detail
            if not passed and not failed:  # pytest stopped before any case (conftest, options)
                lines = [ln for ln in (r.stdout + r.stderr).splitlines() if re.search(r"Error|error:", ln)]
                first = lines[-1].strip().lstrip("E ").strip() if lines else f"pytest exit status {r.returncode}"
            return "refused", reason(err, first or r.stdout + r.stderr), f"{detail}: {first[:200]}"
        if r.returncode == 0:
            return ("ran" if k == "script" else "imported"), "", ""
        return "refused", reason(err, r.stderr), (err or {}).get("msg", "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="fetched corpus directories")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per file (default 300)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each refusal's message")
    ap.add_argument("--json", type=Path, help="write every file's outcome here (rewritten after each file)")
    ap.add_argument(
        "--python", default=sys.executable, help="interpreter of the children (a venv with the corpora's deps)"
    )
    ap.add_argument(
        "--only", action="append", default=[], help="run only files whose path under DIR contains this (repeatable)"
    )
    ap.add_argument(
        "--nkilib",
        type=Path,
        help="an nki-library checkout, importable as `nkilib` (neuronx-cc's bundled copy) and `nkilib_src`",
    )
    ap.add_argument(
        "--pytest-arg",
        action="append",
        default=[],
        help="an argument for the corpus's test files whose conftest.py defines it (repeatable), "
        "e.g. --pytest-arg=--simulation-only",
    )
    a = ap.parse_args(argv)
    extra = nkilib_paths(a.nkilib.resolve()) if a.nkilib else []
    rows = []
    for d in a.dirs:
        root = d.resolve()
        if not root.is_dir():
            ap.error(f"{root} is not a directory")
        files = [p for p in nki_files(root) if not a.only or any(o in str(p.relative_to(root)) for o in a.only)]
        print(f"== {root} ({len(files)} files use NKI)", flush=True)
        for p in files:
            targs = pytest_args_for(p, root, a.pytest_arg) if kind(p) == "pytest" else []
            outcome, why, detail = run_file(p, a.timeout, package_paths(root) + extra, a.python, targs)
            rel = str(p.relative_to(root))
            rows.append(
                {"corpus": root.name, "file": rel, "kind": kind(p), "outcome": outcome, "reason": why, "detail": detail}
            )
            line = f"{outcome:8s} {rel}" + (f"  [{why}]" if why else "")
            if a.verbose and detail:
                line += f"  {detail}"
            print(line, flush=True)
            if a.json:  # a partial run keeps what it did
                a.json.write_text(json.dumps(rows, indent=1))
    print("\n== counts")
    for corpus in dict.fromkeys(r["corpus"] for r in rows):
        mine = [r for r in rows if r["corpus"] == corpus]
        c = collections.Counter(r["outcome"] for r in mine)
        print(f"{corpus}: " + ", ".join(f"{n} {o}" for o, n in sorted(c.items())) + f" (of {len(mine)})")
        for why, n in collections.Counter(r["reason"] for r in mine if r["reason"]).most_common():
            print(f"    {n:4d}  {why}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
