"""Helpers for the NKI front-end tests: load the example kernels; count a kernel's instructions."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def opcodes(kernel) -> Counter:
    """Instruction count per opcode of the last launch's program (core 0)."""
    text = kernel.last_programs[0].to_text().splitlines()
    return Counter(line.split(".")[0].split()[0] for line in text if line and not line.startswith("."))


def run_counted(jit, fn, *arrays, **options):
    """`jit(fn, **options)` called on `arrays`: (result, opcode counts, kernel)."""
    k = jit(fn, **options)
    return k(*arrays), opcodes(k), k


def normal_input(shape=(128, 64), seed=0) -> np.ndarray:
    """A standard-normal fp32 array (a pass test's kernel input)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
