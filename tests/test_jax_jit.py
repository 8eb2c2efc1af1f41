"""NKI kernels and jax.jit (issue 29): a kernel called on tracers says how to call it, and
`trn3emu.nki.jax_call` runs it inside jax.jit as a pure_callback (real JAX, the test extra)."""

import ml_dtypes
import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import IdenticalWritesWarning, NotSupportedError

jax = pytest.importorskip("jax")
jnp = jax.numpy

tn.install()

import nki  # noqa: E402
import nki.language as nl  # noqa: E402


@nki.jit
def _scale_add(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.multiply(nl.load(a), 2.0), nl.load(b)))
    return out


@nki.jit
def _two(a):
    s = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    d = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    nl.store(s, nl.add(t, t))
    nl.store(d, nl.multiply(t, t))
    return s, d


def test_a_kernel_called_inside_jit_says_how_to_call_it():
    a = jnp.ones((128, 64), jnp.float32)
    with pytest.raises(NotSupportedError) as ei:
        jax.jit(lambda x: _scale_add(x, x))(a)
    msg = str(ei.value)
    assert ei.value.rule == "jax_tracer_input" and "jax.jit" in msg
    assert "fix: call an NKI kernel there as trn3emu.nki.jax_call(kernel, *args)" in msg


def test_jax_call_runs_the_kernel_inside_jit():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((128, 64)).astype(np.float32)

    @jax.jit
    def f(x, y):
        z = tn.jax_call(_scale_add, x, y)
        return jnp.tanh(z) + 1.0  # JAX ops around the kernel

    got = f(jnp.asarray(a), jnp.asarray(b))
    assert isinstance(got, jax.Array)
    np.testing.assert_allclose(np.asarray(got), np.tanh(2 * a + b) + 1.0, rtol=1e-6, atol=1e-6)


def test_jax_call_bf16_tuple_results_and_a_grid():
    a = (np.arange(128 * 32).reshape(128, 32) % 7).astype(ml_dtypes.bfloat16)
    s, d = jax.jit(lambda x: tn.jax_call(_two, x))(jnp.asarray(a))
    assert s.dtype == jnp.bfloat16 and s.shape == (128, 32)
    np.testing.assert_array_equal(np.asarray(s), (a.astype(np.float32) * 2).astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(np.asarray(d), (a.astype(np.float32) ** 2).astype(ml_dtypes.bfloat16))
    x = jnp.ones((128, 64), jnp.float32)
    with pytest.warns(IdenticalWritesWarning):  # (both programs store all of out: benign)
        out = jax.jit(lambda v: tn.jax_call(_scale_add, v, v, grid=2))(x)
    np.testing.assert_array_equal(np.asarray(out), np.full((128, 64), 3.0, np.float32))
