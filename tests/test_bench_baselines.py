"""The benchmarks' numpy-eager NKI baseline (benches/numpy_eager_nki.py) stays a valid baseline:
it runs the flash-attention example's own kernel code and matches the float64 numpy reference,
as the emulator does, on a short sequence."""

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches"))

import numpy_eager_nki  # noqa: E402
from nki_util import load_example  # noqa: E402


def test_eager_flash_attention_matches_reference_and_emulator():
    fa = load_example("nki_flash_attention")
    q_t, k_t, v, scale = fa.make_inputs(seq=1024)
    ref = fa.reference(q_t, k_t, v, scale).astype(np.float32)
    eager = numpy_eager_nki.rebind(fa.flash_attention_causal)
    assert eager.__code__ is fa.flash_attention_causal.__wrapped__.__code__  # the same kernel code
    got = eager(q_t, k_t, v, scale)
    assert got.dtype == v.dtype and got.shape == (1024, 128)
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=1e-2, atol=1e-2)
    emu = fa.flash_attention_causal(q_t, k_t, v, scale).astype(np.float32)
    np.testing.assert_allclose(emu, ref, rtol=1e-2, atol=1e-2)
    assert np.abs(emu - got.astype(np.float32)).max() <= 2e-2


def test_eager_matmul_implicit_accumulation():
    """accumulate=None: the first matmul into a new PSUM tile overwrites, later ones add (NKI 0.6)."""
    nl, nisa = numpy_eager_nki.nl, numpy_eager_nki.nisa
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((2, 4), np.float32)
    acc = nl.ndarray((3, 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    np.testing.assert_array_equal(acc, 2 * np.array([[3.0] * 4, [5.0] * 4, [7.0] * 4], np.float32))
    nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=False)
    np.testing.assert_array_equal(acc, np.array([[3.0] * 4, [5.0] * 4, [7.0] * 4], np.float32))
