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
