"""Errors carry stable rule ids: every id raised in Rust or Python is listed in docs/errors.md
(and the list has no stale entries), ids are snake_case, and raised errors expose them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import trn3emu as t3
from trn3emu import errors as E

ROOT = Path(__file__).resolve().parents[1]
ID = r"[a-z][a-z0-9_]*"
RUST_SITES = [
    re.compile(r"\bfail\(\s*(?:ErrorKind::)?\w+,\s*\"(" + ID + r")\""),
    re.compile(r"EmuError::new\(\s*[\w:]+,\s*\"(" + ID + r")\""),
    re.compile(r"\brule:\s*\"(" + ID + r")\""),
]
PY_SITE = re.compile(r"\brule=\"(" + ID + r")\"")
DOC_ROW = re.compile(r"^\| `(" + ID + r")` \|", re.M)


def _used() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for f in [*(ROOT / "rust").rglob("*.rs"), *(ROOT / "python" / "trn3emu").rglob("*.py")]:
        if "target" in f.parts:
            continue
        text = f.read_text()
        pats = RUST_SITES if f.suffix == ".rs" else [PY_SITE]
        for pat in pats:
            for m in pat.finditer(text):
                used.setdefault(m.group(1), set()).add(str(f.relative_to(ROOT)))
    return used


def test_every_rule_id_is_documented_and_no_documented_id_is_stale():
    used = _used()
    documented = DOC_ROW.findall((ROOT / "docs" / "errors.md").read_text())
    assert len(documented) == len(set(documented)), "an id is listed twice"
    missing = sorted(set(used) - set(documented))
    stale = sorted(set(documented) - set(used))
    assert not missing, f"ids raised but not in docs/errors.md: {missing}"
    assert not stale, f"ids in docs/errors.md that nothing raises: {stale}"
    assert len(used) > 100  # the scanner finds the sites (a broken regex would find none)


def test_no_error_is_built_without_a_rule_id():
    # The transitional constructors that defaulted the id are gone.
    core_error = (ROOT / "rust" / "core" / "src" / "error.rs").read_text()
    assert "pub fn err(" not in core_error and "generic_rule" not in core_error
    assert not re.search(r"rule if rule is not None else", (ROOT / "python" / "trn3emu" / "errors.py").read_text())


@pytest.mark.parametrize(
    ("make", "cls", "rule"),
    [
        (lambda p: p.sbuf((129, 4), np.float32), E.AddressError, None),
        (
            lambda p: p.nc_matmul(
                dst=p.psum((128, 513), np.float32),
                stationary=p.sbuf((128, 128), np.float32),
                moving=p.sbuf((128, 513), np.float32),
            ),
            E.ValidationError,
            None,
        ),
    ],
)
def test_raised_errors_expose_a_snake_case_id(make, cls, rule):
    p = t3.Program()
    with pytest.raises(cls) as ei:
        make(p)
    assert re.fullmatch(ID, ei.value.rule), ei.value.rule
    assert ei.value.rule not in str(ei.value) or "_" not in ei.value.rule  # prose in the message, id apart
    if rule is not None:
        assert ei.value.rule == rule
