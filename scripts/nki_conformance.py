"""Rerun the Neuron SDK's own NKI tests and examples, unchanged, on trn3emu; print the counts.

    python scripts/nki_conformance.py /path/to/aws-neuron-sdk [-v] [--tests-only | --examples-only]

The argument is a copy of github.com/aws-neuron/aws-neuron-sdk (at least its `nki/` folder) fetched
outside the repository: nothing of it is part of trn3emu. Every `nki/test/*.py` runs under pytest in
a fresh interpreter with `trn3emu.nki.install()` done first (both dialects: `import nki` and
`neuronxcc.nki`); a file that fails to import counts each of its `def test_` cases as failed. Every
example script with a `__main__` block (`nki/examples/**`, `nki/deep-dives/**`) runs in its own
interpreter the same way; it passes when it exits 0 and prints no mismatch, and is counted apart
("needs ...") when it imports a module this host lacks (torch_xla, a Neuron device). The counts
and the SDK version recorded in docs/nki.md come from this script.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

#: run inside the child interpreter: `nki` and `neuronxcc.nki` are trn3emu's, then pytest / the script
_BOOT = "import sys, trn3emu.nki; trn3emu.nki.install(); "
_PYTEST = _BOOT + "import pytest; sys.exit(pytest.main(sys.argv[1:]))"
_SCRIPT = _BOOT + "import runpy; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
#: an example's output that says its result differs from the reference, though it exited 0
_MISMATCH = re.compile(r"\b(differ|mismatch|do not match|don't match|not match)\b", re.I)
_TIMEOUT = 900


def sdk_version(root: Path) -> str:
    """The newest SDK release the copy has release notes for (`release-notes/2.X.Y.rst`)."""
    found = []
    for p in (root / "release-notes").glob("2.*.rst"):
        m = re.fullmatch(r"2\.(\d+)\.(\d+)", p.stem)
        if m:
            found.append((int(m.group(1)), int(m.group(2))))
    if not found:
        return "unknown (no release-notes/2.X.Y.rst)"
    minor, patch = max(found)
    return f"2.{minor}.{patch}"


def _child(code: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=_TIMEOUT
    )


def run_tests(root: Path, verbose: bool) -> dict[str, list[str]]:
    """pytest over nki/test: outcome -> test ids."""
    test_dir = root / "nki" / "test"
    files = sorted(test_dir.glob("test_*.py"))
    out: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "report.xml"
        args = ["-q", "-p", "no:cacheprovider", "--continue-on-collection-errors", f"--junitxml={xml}"]
        r = _child(_PYTEST, args + [str(f) for f in files], test_dir)
        if not xml.exists():
            raise SystemExit(f"pytest wrote no report:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            kids = {c.tag: c for c in case}
            bad = kids.get("failure", kids.get("error"))
            if bad is not None and bad.get("message") == "collection failure":
                # the file did not import: each of its test functions counts as failed
                path = test_dir / (case.get("name", "").replace(".", "/") + ".py")
                n = len(re.findall(r"^\s*def test_", path.read_text(), re.M)) if path.exists() else 1
                why = (bad.text or "").strip().splitlines()[-1:] or [""]
                out["failed"] += [f"{path.name} (does not import; {n} cases): {why[0][:200]}"] * max(n, 1)
            elif bad is not None:
                why = (bad.get("message") or "").splitlines()
                out["failed"].append(f"{name}: {why[0][:200] if why else ''}")
            elif "skipped" in kids:
                out["skipped"].append(f"{name}: {kids['skipped'].get('message', '')[:160]}")
            else:  # (a vendor xfail that passes is reported as passed)
                out["passed"].append(name)
    if verbose:
        print(r.stdout[-20000:])
    return out


def run_examples(root: Path, verbose: bool) -> dict[str, list[str]]:
    """Each example script with a __main__ block: outcome -> paths."""
    out: dict[str, list[str]] = {"passed": [], "failed": [], "needs": []}
    scripts = sorted(
        p
        for sub in ("nki/examples", "nki/deep-dives")
        for p in (root / sub).rglob("*.py")
        if re.search(r"^if __name__ == .__main__.", p.read_text(), re.M)
    )
    for p in scripts:
        rel = str(p.relative_to(root))
        try:
            r = _child(_SCRIPT, [str(p)], p.parent)
        except subprocess.TimeoutExpired:
            out["failed"].append(f"{rel}: over {_TIMEOUT} s")
            continue
        tail = (r.stderr.strip().splitlines() or [""])[-1]
        missing = re.search(r"No module named '([\w.]+)'", tail)
        if r.returncode != 0 and missing:
            out["needs"].append(f"{rel}: needs {missing.group(1)}")
        elif r.returncode != 0:
            out["failed"].append(f"{rel}: {tail[:200]}")
        elif _MISMATCH.search(r.stdout):
            out["failed"].append(f"{rel}: prints a mismatch: {_MISMATCH.search(r.stdout).group(0)}")
        else:
            out["passed"].append(rel)
        if verbose:
            print(f"--- {rel} (exit {r.returncode})\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sdk", type=Path, help="a fetched copy of aws-neuron/aws-neuron-sdk")
    ap.add_argument("-v", "--verbose", action="store_true")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tests-only", action="store_true")
    g.add_argument("--examples-only", action="store_true")
    a = ap.parse_args(argv)
    root = a.sdk.resolve()
    if not (root / "nki").is_dir():
        ap.error(f"{root} has no nki/ folder (a copy of aws-neuron/aws-neuron-sdk is expected)")
    print(f"aws-neuron-sdk copy {root} (SDK {sdk_version(root)})")
    ok = True
    if not a.examples_only:
        t = run_tests(root, a.verbose)
        total = len(t["passed"]) + len(t["failed"])
        print(f"nki/test: {len(t['passed'])} of {total} cases pass ({len(t['skipped'])} skipped or xfail)")
        for line in t["failed"]:
            print(f"  FAILED {line}")
        for line in t["skipped"]:
            print(f"  skipped {line}")
        ok &= not t["failed"]
    if not a.tests_only:
        e = run_examples(root, a.verbose)
        total = len(e["passed"]) + len(e["failed"])
        print(
            f"examples: {len(e['passed'])} of {total} runnable scripts pass ({len(e['needs'])} need a module this host lacks)"
        )
        for line in e["failed"]:
            print(f"  FAILED {line}")
        for line in e["needs"]:
            print(f"  not run: {line}")
        ok &= not e["failed"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
