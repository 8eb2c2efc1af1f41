"""Rerun the published NKI tutorial kernels unchanged and report modelled / published latency.

Validation only (docs/cost-model.md, "Validation only"): nothing in the cost model is fitted to
these numbers. The kernels are read from checkouts of the public repositories, fetched outside
this one (none of their code is committed):

    python scripts/validate_tutorials.py --sdk ~/src/aws-neuron-sdk --samples ~/src/nki-samples

- `mamba` (`--sdk`): the fused Mamba tutorial, `nki/examples/fused_mamba/mamba_nki_kernels.py`
  (NKI 0.6 dialect), fp32, batch 1, state 16, on `timing="trn1"` with the pass `value_reuse` on,
  against the tutorial's published device times (v1 / v2 and the v2 / v3 seq_len table of
  `general/nki/tutorials/fused_mamba.rst`); the [256, 512] outputs checked against a float64
  numpy scan.
- `layernorm` (`--samples`, the file read at `--samples-commit`, default 7af4e4d: the
  tutorial was deleted later): `tutorials/layernorm/layernorm_nki_kernel.py` (legacy dialect),
  input (300, 1000) fp32 on trn1; only the ratio v2 / v1 is published to compare (1969 / 2311
  us p50: the absolute figures are dominated by fixed overheads, timing-anchors.md).
- `matmul` (`--samples`, at `--matmul-commit`, default b2be1a5: the legacy-dialect version of
  the SDK 2.21 era): the matrix-multiplication tutorial's four kernels at [4096, 8192] @ [8192,
  8192] bf16 on trn1 (about a minute each), against the published latencies.

`--only mamba,layernorm,matmul` picks parts; `--quick` runs the Mamba rows up to seq_len 1024
only; `--json PATH` writes every row.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: (kernel, channels, seq_len) -> published device time in ms (fused_mamba.rst).
MAMBA = {
    ("v1", 256, 512): 0.17293,
    ("v1", 4096, 512): 2.34,
    ("v2", 4096, 512): 1.61,
    ("v3", 4096, 512): 1.6,
    **{("v2", 4096, s): t for s, t in ((1024, 4.4), (2048, 8.9), (4096, 17.6), (8192, 52.2))},
    **{("v3", 4096, s): t for s, t in ((1024, 3.3), (2048, 6.6), (4096, 13.3), (8192, 27.8))},
}
#: matrix-multiplication tutorial kernel -> published latency (ms), trn1, one NeuronCore.
MATMUL = {
    "nki_matmul_tiled_": 51.80,
    "nki_matmul_hoist_load_": 42.96,
    "nki_matmul_block_free_dimension_": 22.07,
    "nki_matmul_fully_optimized_": 6.97,
}
LAYERNORM_V2_OVER_V1 = 1969 / 2311


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _at_commit(repo: Path, commit: str, rel: str, tmp: Path) -> Path:
    """`rel` as it was at `commit` of the git checkout `repo`, written under `tmp`."""
    text = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{rel}"], check=True, capture_output=True, text=True
    ).stdout
    out = tmp / f"{commit}_{Path(rel).name}"
    out.write_text(text)
    return out


def _mamba_reference(delta, u, a, b, c) -> np.ndarray:
    """The tutorial's scan in float64 (its `mamba_torch.py` reference, written with numpy)."""
    d, uu = delta.astype(np.float64)[0], u.astype(np.float64)[0]
    da = np.exp(d[:, None, :] * a.astype(np.float64)[:, :, None])  # [ch, state, seq]
    dbu = d[:, None, :] * b.astype(np.float64)[0][None] * uu[:, None, :]
    state = np.zeros(da.shape[:2])
    out = np.empty_like(d)
    for t in range(d.shape[1]):
        state = da[..., t] * state + dbu[..., t]
        out[:, t] = (c.astype(np.float64)[0][None, :, t] * state).sum(axis=1)
    return out[None]


def mamba(sdk: Path, quick: bool) -> list[dict]:
    mod = _module(sdk / "nki/examples/fused_mamba/mamba_nki_kernels.py", "mamba_nki_kernels")
    rows = []
    checks = {("v2", 256, 512): None, ("v3", 256, 512): None}  # (checked against numpy only)
    for (ver, ch, seq), pub in {**MAMBA, **checks}.items():
        if quick and seq > 1024:
            continue
        rng = np.random.default_rng(0)
        delta = rng.random((1, ch, seq), dtype=np.float32) * 0.1
        u = rng.standard_normal((1, ch, seq), dtype=np.float32)
        a = -rng.random((ch, 16), dtype=np.float32)
        b = rng.standard_normal((1, 16, seq), dtype=np.float32)
        c = rng.standard_normal((1, 16, seq), dtype=np.float32)
        kern = getattr(mod, "mamba_" + ver)
        t0 = time.time()
        out = kern(delta, u, a, b, c)
        row = {"part": "mamba", "kernel": ver, "channels": ch, "seq_len": seq, "published_ms": pub}
        row["modelled_ms"] = kern.last_result.time_ns / 1e6
        row["host_s"] = time.time() - t0
        if ch == 256:
            row["max_abs_error"] = float(np.abs(out - _mamba_reference(delta, u, a, b, c)).max())
        rows.append(row)
        _print(row)
    return rows


def layernorm(path: Path) -> list[dict]:
    mod = _module(path, "layernorm_nki_kernel")
    rng = np.random.default_rng(0)
    x = rng.random((300, 1000), dtype=np.float32)
    g, b = rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * g + b
    rows, ns = [], {}
    for ver in ("v1", "v2"):
        kern = getattr(mod, "nki_layernorm_kernel_" + ver)
        out = kern(x, 1e-5, g, b)
        ns[ver] = kern.last_result.time_ns
        row = {"part": "layernorm", "kernel": ver, "modelled_us": ns[ver] / 1e3}
        row["max_abs_error"] = float(np.abs(out - want).max())
        rows.append(row)
        _print(row)
    row = {"part": "layernorm", "kernel": "v2/v1", "published": LAYERNORM_V2_OVER_V1, "modelled": ns["v2"] / ns["v1"]}
    rows.append(row)
    _print(row)
    return rows


def matmul(path: Path) -> list[dict]:
    import ml_dtypes

    mod = _module(path, "matrix_multiplication_nki_kernels")
    rng = np.random.default_rng(0)
    lhs_t = rng.standard_normal((8192, 4096), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((8192, 8192), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rows = []
    for name, pub in MATMUL.items():
        kern = getattr(mod, name)
        t0 = time.time()
        kern(lhs_t, rhs)
        row = {"part": "matmul", "kernel": name, "published_ms": pub, "modelled_ms": kern.last_result.time_ns / 1e6}
        row["host_s"] = time.time() - t0
        kern.last_result = kern.last_programs = None  # (a large trace: not kept)
        rows.append(row)
        _print(row)
    return rows


def _print(row: dict) -> None:
    pub = row.get("published_ms", row.get("published"))
    got = row.get("modelled_ms", row.get("modelled"))
    ratio = f"  ratio {got / pub:.2f}" if pub and got else ""
    rest = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items() if k != "part")
    print(f"{row['part']:9s} {rest}{ratio}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdk", type=Path, help="a checkout of github.com/aws-neuron/aws-neuron-sdk")
    ap.add_argument("--samples", type=Path, help="a clone of github.com/aws-neuron/nki-samples (with history)")
    ap.add_argument("--samples-commit", default="7af4e4d", help="nki-samples commit of the layernorm tutorial")
    ap.add_argument("--matmul-commit", default="b2be1a5", help="nki-samples commit of the matmul tutorial")
    ap.add_argument("--only", default="mamba,layernorm,matmul")
    ap.add_argument("--quick", action="store_true", help="Mamba rows up to seq_len 1024 only")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    parts = set(args.only.split(","))
    env = {"TRN3EMU_TIMING": "trn1", "TRN3EMU_NKI_CACHE": "0"}
    env["TRN3EMU_NKI_PASSES"] = os.environ.get("TRN3EMU_NKI_PASSES", "value_reuse=on")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _run(ap, args, parts)
    finally:  # (the environment as it was: the script also runs inside the test suite)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(ap, args, parts: set) -> int:
    import trn3emu.nki

    trn3emu.nki.install()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        if "mamba" in parts:
            if args.sdk is None:
                ap.error("mamba needs --sdk")
            rows += mamba(args.sdk, args.quick)
        if parts & {"layernorm", "matmul"} and args.samples is None:
            ap.error("layernorm and matmul need --samples")
        if "layernorm" in parts:
            rel = "src/nki_samples/tutorials/layernorm/layernorm_nki_kernel.py"
            rows += layernorm(_at_commit(args.samples, args.samples_commit, rel, Path(tmp)))
        if "matmul" in parts:
            rel = "src/nki_samples/tutorials/matrix_multiplication/matrix_multiplication_nki_kernels.py"
            rows += matmul(_at_commit(args.samples, args.matmul_commit, rel, Path(tmp)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
