"""scripts/validate_tutorials.py (the published tutorials rerun, docs/cost-model.md): its Mamba
reference against a plain per-element loop, and its layernorm part end to end on a stand-in of
our own committed to a scratch git repository (the real tutorials are fetched outside this one)."""

import importlib.util
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("validate_tutorials", ROOT / "scripts" / "validate_tutorials.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mamba_reference_is_the_scan_element_by_element():
    rng = np.random.default_rng(0)
    ch, st, seq = 3, 2, 5
    delta = rng.random((1, ch, seq)).astype(np.float32)
    u = rng.standard_normal((1, ch, seq)).astype(np.float32)
    a = -rng.random((ch, st)).astype(np.float32)
    b = rng.standard_normal((1, st, seq)).astype(np.float32)
    c = rng.standard_normal((1, st, seq)).astype(np.float32)
    want = np.zeros((1, ch, seq))
    for i in range(ch):
        for n in range(st):
            x = 0.0
            for t in range(seq):
                d = float(delta[0, i, t])
                x = math.exp(d * float(a[i, n])) * x + d * float(b[0, n, t]) * float(u[0, i, t])
                want[0, i, t] += float(c[0, n, t]) * x
    np.testing.assert_allclose(_script()._mamba_reference(delta, u, a, b, c), want, rtol=1e-12, atol=1e-12)


STAND_IN = """
import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


def _norm(x, g, b):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    gt, bt = nl.load(g.reshape((1, g.shape[0]))), nl.load(b.reshape((1, b.shape[0])))
    for i in nl.affine_range((x.shape[0] + 127) // 128):
        i_p = i * 128 + nl.arange(128)[:, None]
        i_f = nl.arange(x.shape[1])[None, :]
        t = nl.load(x[i_p, i_f], mask=(i_p < x.shape[0]))
        m = nl.mean(t, axis=1)
        v = nl.mean(nl.square(t), axis=1) - m * m
        y = (t - m) * nl.rsqrt(v + 1e-5)
        nl.store(out[i_p, i_f], value=y * gt.broadcast_to((128, g.shape[0])) + bt.broadcast_to((128, g.shape[0])),
                 mask=(i_p < x.shape[0]))
    return out


@nki.jit
def nki_layernorm_kernel_v1(x, eps, g, b):
    return _norm(x, g, b)


@nki.jit
def nki_layernorm_kernel_v2(x, eps, g, b):
    return _norm(x, g, b)
"""


def test_layernorm_part_runs_the_file_at_the_commit(tmp_path):
    repo = tmp_path / "samples"
    rel = repo / "src/nki_samples/tutorials/layernorm/layernorm_nki_kernel.py"
    rel.parent.mkdir(parents=True)
    rel.write_text(STAND_IN)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "stand-in"], check=True)
    rel.unlink()  # (the script reads the file as committed, as for the deleted tutorial)
    out = tmp_path / "rows.json"
    assert (
        _script().main(["--samples", str(repo), "--samples-commit", "HEAD", "--only", "layernorm", "--json", str(out)])
        == 0
    )
    rows = {r["kernel"]: r for r in json.loads(out.read_text())}
    assert rows["v1"]["max_abs_error"] < 1e-4 and rows["v2"]["max_abs_error"] < 1e-4
    assert rows["v1"]["modelled_us"] > 0
    assert rows["v2/v1"]["modelled"] == pytest.approx(rows["v2"]["modelled_us"] / rows["v1"]["modelled_us"])
    assert rows["v2/v1"]["published"] == pytest.approx(1969 / 2311)
