"""The element-wise bench kernels (benches/nki_elementwise_kernels.py) compute what numpy does, in
both dialects, on small shapes: the bench cannot time a wrong kernel."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))
import nki_elementwise_kernels as ek  # noqa: E402


@pytest.mark.parametrize("dialect", ["0.6", "legacy"])
def test_silu_matches_numpy(dialect):
    x = np.random.default_rng(1).standard_normal((256, 384)).astype(np.float32) * 4
    out = ek.KERNELS["silu"][dialect](x)
    want = x.astype(np.float64) / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dialect", ["0.6", "legacy"])
def test_adamw_step_matches_numpy(dialect):
    """Rows 320 = two full tiles and a partial one of 64; reference in float64 from the formula."""
    rng = np.random.default_rng(2)
    p, g, m = (rng.standard_normal((320, 96)).astype(np.float32) for _ in range(3))
    v = rng.random((320, 96)).astype(np.float32) * 0.01
    got = ek.KERNELS["adamw"][dialect](p, g, m, v)
    b1, b2, lr, wd, eps, t = ek.B1, ek.B2, ek.LR, ek.WD, ek.EPS, ek.STEP
    p64, g64, m64, v64 = (a.astype(np.float64) for a in (p, g, m, v))
    m2 = b1 * m64 + (1 - b1) * g64
    v2 = b2 * v64 + (1 - b2) * g64 * g64
    p2 = p64 * (1 - lr * wd) - lr * (m2 / (1 - b1**t)) / (np.sqrt(v2 / (1 - b2**t)) + eps)
    for out, want in zip(got, (p2, m2, v2)):
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dialect", ["0.6", "legacy"])
def test_rope_matches_numpy(dialect):
    """3 heads x 256 positions x d 64: rotate-half against a float64 reference."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 256, 64)).astype(np.float32)
    ang = np.outer(np.arange(256), 10000.0 ** (-np.arange(32) / 32))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    out = ek.KERNELS["rope"][dialect](x, cos, sin)
    x64, c64, s64 = x.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64)
    want = np.concatenate([x64[..., :32] * c64 - x64[..., 32:] * s64, x64[..., 32:] * c64 + x64[..., :32] * s64], -1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
