"""The structure the architecture promises (docs/architecture.md), checked on the sources.

- Adding an instruction takes its isa.toml record plus one semantics implementation; without the
  implementation the core does not compile (the generated dispatch names it).
- No function of the core is longer than ~120 lines outside generated code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "rust" / "core"

TOY_RECORD = """
[[instruction]]
name = "toy_double"
opcode = 0x7f01
engines = ["vector"]
cost = "vec_1in"
since = "v4"
nki = false
summary = "Test fixture: dst = 2 * src."
math = "dst[p, i] = 2 * src[p, i] in fp32, cast to dst (RNE)."
params = [
  { name = "dst", kind = "tensor", access = "write", mem = ["sbuf"], dtypes = "float", doc = "result" },
  { name = "src", kind = "tensor", access = "read", mem = ["sbuf"], dtypes = "float", doc = "input" },
]
"""

TOY_SEMANTICS = """
impl super::Semantics for crate::isa::ops::ToyDouble<'_> {
    fn check(&self) -> crate::error::Result<()> {
        if self.dst.num_elements() != self.src.num_elements() {
            return Err(crate::error::fail(
                crate::error::ErrorKind::Shape,
                "toy_shape_mismatch",
                "dst and src hold different element counts",
            )
            .operand("dst"));
        }
        Ok(())
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        let v: Vec<f32> = ctx.read_f32(self.src).iter().map(|x| 2.0 * x).collect();
        ctx.write_f32(self.dst, &v);
        Ok(())
    }
}
"""

TOY_TEST = r"""
use trn3emu_core::engines::{decode_program, parse_program};
use trn3emu_core::isa::encode::encode_program;
use trn3emu_core::isa::text::format_program;
use trn3emu_core::{Device, ErrorKind, RunOptions};

#[test]
fn toy_double_runs_round_trips_and_checks() {
    let text = "memset.vector dst=sbuf:float32[0:128]+0[[1,64]] value=1.5\n\
                toy_double.vector dst=sbuf:float32[0:128]+1024[[1,64]] src=sbuf:float32[0:128]+0[[1,64]]\n";
    let p = parse_program(text).unwrap();
    assert_eq!(decode_program(&encode_program(&p)).unwrap(), p);
    assert_eq!(parse_program(&format_program(&p)).unwrap(), p);
    let mut dev = Device::new();
    dev.run(&[p], &RunOptions::default()).unwrap();
    for part in [0usize, 77, 127] {
        let b = &dev.cores[0].sbuf.partition(part)[1024 + 4 * 63..];
        assert_eq!(f32::from_le_bytes([b[0], b[1], b[2], b[3]]), 3.0);
    }
    let bad = "toy_double.vector dst=sbuf:float32[0:128]+1024[[1,64]] src=sbuf:float32[0:128]+0[[1,32]]\n";
    let e = parse_program(bad).unwrap_err();
    assert_eq!((e.kind, e.rule), (ErrorKind::Shape, "toy_shape_mismatch"));
}
"""


def _cargo(args: list[str], cwd: Path, target: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CARGO_TARGET_DIR=str(target), CARGO_PROFILE_TEST_OPT_LEVEL="0")
    env.pop("RUSTFLAGS", None)
    return subprocess.run(
        ["cargo", *args, "--offline", "-p", "trn3emu-core"], cwd=cwd, env=env, capture_output=True, text=True
    )


def _snapshot(root: Path) -> dict[str, str]:
    files = [*root.joinpath("rust").rglob("*.rs"), *root.joinpath("isa").rglob("*.toml")]
    return {str(f.relative_to(root)): f.read_text() for f in files}


def _generated(text: str) -> bool:
    return text.startswith("// @generated")


@pytest.mark.skipif(shutil.which("cargo") is None, reason="needs the Rust toolchain")
def test_a_toy_instruction_needs_its_record_and_one_semantics_impl(tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(CORE, ws / "rust" / "core", ignore=shutil.ignore_patterns("target"))
    shutil.copytree(ROOT / "isa", ws / "isa")
    cargo_toml = (ROOT / "Cargo.toml").read_text()
    (ws / "Cargo.toml").write_text(re.sub(r"members = \[[^\]]*\]", 'members = ["rust/core"]', cargo_toml))
    shutil.copy(ROOT / "Cargo.lock", ws / "Cargo.lock")
    before = _snapshot(ws)

    # 1. The record alone: the generated dispatch needs an implementation -> compile error.
    with open(ws / "isa" / "isa.toml", "a") as f:
        f.write(TOY_RECORD)
    subprocess.run([sys.executable, str(ws / "isa" / "generate.py")], check=True, capture_output=True)
    target = tmp_path / "target"
    r = _cargo(["check", "--lib"], ws, target)
    assert r.returncode != 0, "the core compiled without a semantics implementation for toy_double"
    assert "ToyDouble" in r.stderr and "Semantics" in r.stderr, r.stderr[-3000:]

    # 2. Plus one semantics implementation (in an existing engine module): it compiles, runs,
    #    round-trips through text and binary, and its check is enforced at assembly.
    with open(ws / "rust" / "core" / "src" / "engines" / "vector.rs", "a") as f:
        f.write(TOY_SEMANTICS)
    after = _snapshot(ws)
    edited = sorted(k for k in after if after[k] != before.get(k) and not _generated(after[k]))
    assert edited == ["isa/isa.toml", "rust/core/src/engines/vector.rs"], edited
    (ws / "rust" / "core" / "tests" / "toy.rs").write_text(TOY_TEST)
    r = _cargo(["test", "--test", "toy"], ws, target)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "1 passed" in r.stdout


# --------------------------------------------------------------------------- function length
_LITERALS = re.compile(r'r#*"(?:.|\n)*?"#*|b?"(?:\\.|[^"\\])*"|b?\'(?:\\.|[^\'\\])\'|//[^\n]*')
_FN = re.compile(r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+|unsafe\s+|extern\s+"C"\s+)*fn\s+(\w+)', re.M)


def _function_lengths(text: str):
    """(name, lines) of every fn with a body; literals and comments blanked before brace matching."""
    clean = _LITERALS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    for m in _FN.finditer(clean):
        brace, semi = clean.find("{", m.end()), clean.find(";", m.end())
        if brace < 0 or 0 <= semi < brace:
            continue
        depth = 0
        for j in range(brace, len(clean)):
            depth += {"{": 1, "}": -1}.get(clean[j], 0)
            if depth == 0:
                break
        yield m.group(1), clean.count("\n", m.start(), j) + 1


def test_function_length_scanner_measures_bodies():
    src = 'fn a() {\n    let s = "}}}";\n    // }\n}\nfn b(x: u8) -> u8 {\n    if x > 0 {\n        1\n    } else {\n        0\n    }\n}\n'
    assert dict(_function_lengths(src)) == {"a": 4, "b": 7}


def test_no_core_function_is_longer_than_120_lines():
    long = []
    for f in sorted((CORE / "src").rglob("*.rs")):
        text = f.read_text()
        if _generated(text):
            continue
        long += [f"{f.relative_to(ROOT)}::{name} ({n} lines)" for name, n in _function_lengths(text) if n > 120]
    assert not long, long
