"""NKI 0.8.0 (Neuron SDK 2.34.0) entry points and device control flow: nl.if_else on a condition
computed on the device, nki.execute and nki.multi_rank_simulate. Expected values by hand / numpy."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu import errors as E

tn.install()
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

# ---------------------------------------------------------------------------------- nl.if_else


@nki.jit
def _branch(flag, data):
    """data + 10 when flag[0, 0] > 0, else data * 2 (the condition is a comparison of a scalar)."""
    f = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=f, src=flag)
    cond = nisa.scalar_load(f) > 0
    t = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=data)

    def then_fn():
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=10.0)

    def else_fn():
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)

    nl.if_else(cond, then_fn, else_fn)
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("flag, taken", [(7, True), (1, True), (0, False), (-4, False)])
def test_if_else_takes_the_branch_the_device_computes(flag, taken):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.asarray(_branch(np.array([[flag]], np.int32), data))
    np.testing.assert_array_equal(out, data + 10.0 if taken else data * 2.0)
    assert _branch.device_dependent  # (the trace read a device value: never replayed from the cache)


@nki.jit
def _raw(flag, data):
    """The scalar itself as the condition (no comparison), no else branch."""
    f = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=f, src=flag)
    t = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=data)
    nl.if_else(nisa.scalar_load(f), lambda: nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0))
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("flag, want", [(3, 1.0), (-3, 1.0), (0, 0.0)])  # any nonzero value is true
def test_if_else_nonzero_scalar_and_missing_else(flag, want):
    data = np.full((2, 2), 5.0, np.float32)
    np.testing.assert_array_equal(np.asarray(_raw(np.array([[flag]], np.int32), data)), data + want)


@nki.jit
def _per_column(signs, data):
    """Column j: +100 when signs[0, j] > 0, else -100; one if_else per iteration of a loop."""
    s = nl.ndarray(signs.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=signs)
    t = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=data)

    def body(j):
        col = t[0 : data.shape[0], j : j + 1]
        nl.if_else(
            nisa.scalar_load(s[0:1, j : j + 1]) > 0,
            lambda: nisa.tensor_scalar(dst=col, data=col, op0=nl.add, operand0=100.0),
            lambda: nisa.tensor_scalar(dst=col, data=col, op0=nl.add, operand0=-100.0),
        )

    nl.fori_loop(0, data.shape[1], body)
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_if_else_in_a_loop():
    rng = np.random.default_rng(8)
    data = rng.standard_normal((4, 5)).astype(np.float32)
    signs = np.array([[1, -2, 0, 5, -1]], np.int32)
    want = data + np.where(signs > 0, 100.0, -100.0).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(_per_column(signs, data)), want)


@nki.jit
def _countdown(n, data):
    """while c: (t += 1 when c is odd); c -= 1 -- an if_else inside a device while_loop."""
    c = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=n)
    t = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=data)

    def body(cur):
        nl.if_else(
            nisa.scalar_alu(cur, 2, op=nl.fmod), lambda: nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        )
        nxt = cur - 1
        return nxt

    nl.while_loop(nisa.scalar_load(c), body)
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("n", [0, 1, 4, 5])
def test_if_else_inside_a_device_while_loop(n):
    data = np.zeros((2, 3), np.float32)
    odd = sum(1 for c in range(1, n + 1) if c % 2)
    np.testing.assert_array_equal(np.asarray(_countdown(np.array([[n]], np.int32), data)), data + odd)


@pytest.mark.parametrize("cond", [True, 1, 0, False, np.int32(2)])
def test_if_else_python_condition_is_decided_while_tracing(cond):
    called = []

    @nki.jit
    def k(data):
        t = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=data)
        nl.if_else(
            cond,
            lambda: called.append("then") or nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0),
            lambda: called.append("else"),
        )
        out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    data = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(np.asarray(k(data)), data + (1.0 if cond else 0.0))
    assert called == ["then" if cond else "else"]
    assert not k.device_dependent  # (nothing was read on the device)


def _flag_kernel(make_cond, then_fn=None, else_fn=None):
    @nki.jit
    def k(flag):
        f = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=f, src=flag)
        nl.if_else(make_cond(f), then_fn or (lambda: None), else_fn)
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=f)
        return out

    return k


FLAG = np.array([[1]], np.int32)


def test_if_else_refuses_a_condition_bound_to_one_sequencer():
    k = _flag_kernel(lambda f: nisa.scalar_load(f, engine=nisa.engine.sync))
    with pytest.raises(E.OperandError, match="bound to the sync sequencer") as e:
        k(FLAG)
    assert e.value.rule == "nki_if_else_bound_condition"


def test_if_else_refuses_a_tile_condition():
    with pytest.raises(E.NotSupportedError, match="scalar_load") as e:
        _flag_kernel(lambda f: f)(FLAG)
    assert e.value.rule == "nki_if_else_condition"


def test_if_else_refuses_a_float_condition():
    with pytest.raises(E.ArgumentTypeError, match="got float") as e:
        _flag_kernel(lambda f: 1.5)(FLAG)
    assert e.value.rule == "nki_if_else_condition"


def test_if_else_refuses_a_branch_that_is_not_callable():
    with pytest.raises(E.ArgumentTypeError, match="else_fn must be a function") as e:
        _flag_kernel(lambda f: 1, else_fn=3)(FLAG)
    assert e.value.rule == "nki_if_else_branch"


def test_python_if_on_a_scalar_still_raises():
    @nki.jit
    def k(flag):
        f = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=f, src=flag)
        if nisa.scalar_load(f) > 0:  # Python control flow on a device value
            pass
        return flag

    with pytest.raises(E.NotSupportedError) as e:
        k(FLAG)
    assert e.value.rule == "nki_register_value"


def test_if_else_on_a_device_value_needs_a_single_program_launch():
    k = _flag_kernel(lambda f: nisa.scalar_load(f) > 0)
    with pytest.raises(E.NotSupportedError) as e:
        k[2](FLAG)
    assert e.value.rule == "nki_register_read_multiprogram"
