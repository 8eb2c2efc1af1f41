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
# Rust: the id is the `rule: &'static str` argument of `fail`, `EmuError::new` or a local wrapper
# (`fn perr(rule: &'static str, ..)`); found by the parameter's position in each such signature.
RULE_PARAM = re.compile(r"fn\s+(\w+)(?:<[^>]*>)?\(([^)]*\brule:\s*&'static str[^)]*)\)")
RUST_LITERAL = re.compile(r"\brule:\s*\"(" + ID + r")\"")


def _args(text: str, start: int) -> list[str]:
    """The top-level arguments of the call whose '(' is at text[start]."""
    depth, out, cur = 0, [], []
    for ch in text[start:]:
        if ch in "([{":
            depth += 1
            if depth == 1:
                continue
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                out.append("".join(cur).strip())
                return out
        elif ch == "," and depth == 1:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    return out


def _rust_ids(texts: list[str]) -> set[str]:
    positions = {"fail": 1, "new": 1}
    for text in texts:
        for m in RULE_PARAM.finditer(text):
            params = [q.split(":")[0].strip() for q in m.group(2).split(",")]
            params = [q for q in params if q not in ("&self", "self", "&mut self")]
            positions[m.group(1)] = params.index("rule")
    ids = set()
    for text in texts:
        for name, pos in positions.items():
            for m in re.finditer(r"\b" + name + r"\(", text):
                args = _args(text, m.end() - 1)
                if len(args) > pos and re.fullmatch(r'"' + ID + r'"', args[pos]):
                    ids.add(args[pos].strip('"'))
        ids |= set(RUST_LITERAL.findall(text))
    return ids


PY_SITE = re.compile(r"\brule=\"(" + ID + r")\"")
DOC_ROW = re.compile(r"^\| `(" + ID + r")` \|", re.M)


def _used() -> set[str]:
    rust = [f.read_text() for f in (ROOT / "rust").rglob("*.rs") if "target" not in f.parts]
    py = [f.read_text() for f in (ROOT / "python" / "trn3emu").rglob("*.py")]
    return _rust_ids(rust) | {i for t in py for i in PY_SITE.findall(t)}


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


def _mismatched_copy(p):
    p.tensor_copy(dst=p.sbuf((128, 64), np.float32), src=p.sbuf((128, 32), np.float32))


CASES = [
    # (what, the call, class, rule id) -- ids from docs/errors.md, raised by Python, the core's
    # validation, the text parser and the binary decoder.
    ("tile_partitions", lambda p: p.sbuf((129, 4), np.float32), E.AddressError, "tile_partitions_out_of_range"),
    ("copy_shapes", _mismatched_copy, E.ShapeError, "shape_mismatch"),
    (
        "enum",
        lambda p: p.activation(dst=p.sbuf((128, 4), np.float32), op="nope", data=p.sbuf((128, 4), np.float32)),
        E.OperandError,
        "enum_value_unknown",
    ),
    (
        "text",
        lambda p: t3.Program.from_text("nc_matmul dst=psum:float32[0:128]+0[[1,512]]\n"),
        E.AsmSyntaxError,
        "asm_missing_operand",
    ),
    ("binary", lambda p: t3.Program.decode(b"xxxx"), E.DecodeError, "decode_bad_magic"),
]


@pytest.mark.parametrize(("make", "cls", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_raised_errors_carry_their_rule_id(make, cls, rule):
    with pytest.raises(cls) as ei:
        make(t3.Program())
    assert ei.value.rule == rule
    assert rule in DOC_ROW.findall((ROOT / "docs" / "errors.md").read_text())


def test_an_error_without_a_rule_id_cannot_be_built():
    with pytest.raises(TypeError):
        E.ShapeError("no id")
    with pytest.raises(TypeError):
        E.ShapeError("prose as id", rule="Shapes must match")
    assert E.ShapeError("m", rule="shape_mismatch").rule == "shape_mismatch"
