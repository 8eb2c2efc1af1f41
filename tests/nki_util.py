"""Helpers for the NKI front-end tests: load examples, and skip (naming the instruction) when a
kernel needs an instruction whose semantics this build does not implement yet."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from trn3emu.errors import NotImplementedInstruction

ROOT = Path(__file__).resolve().parents[1]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_or_skip(fn, *args, **kwargs):
    """fn(*args); a NotImplementedInstruction becomes a skip whose reason names the instruction."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedInstruction as e:
        m = re.match(r"\s*([a-z0-9_]+)", e.instruction or "")
        name = m.group(1) if m else str(e)
        pytest.skip(f"needs {name} (NotImplementedInstruction in this build)")
