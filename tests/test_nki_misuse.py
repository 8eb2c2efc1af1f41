"""Issue 31 item 7, the NKI front end: a tile kept from an earlier launch's trace is refused
where a later kernel uses it (it used to read whatever its SBUF range held), `nki.jit` refuses
what is not a plain function (a generator or `async def` kernel used to return a generator and
trace nothing), and bad launch arguments raise `EmuError`s with rule ids."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import AddressError, ArgumentTypeError, EmuError, NotSupportedError, OperandError

tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

X = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)


def _copy(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


# ------------------------------------------------------------------ a tile kept past its trace
@pytest.mark.parametrize("use", ["nl.store", "nisa.dma_copy", "a view of it", "nl.add"])
def test_a_tile_kept_from_an_earlier_launch_is_refused(use):
    kept = {}

    @nki.jit(cache=False)
    def first(x):
        t = nl.load(x)
        kept["t"] = t  # outlives the trace
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    @nki.jit(cache=False)
    def second(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = kept["t"]
        if use == "nl.store":
            nl.store(out, t)
        elif use == "nisa.dma_copy":
            nisa.dma_copy(dst=out, src=t)
        elif use == "a view of it":
            nl.store(out[0:64, :], t[0:64, :])
            nl.store(out[64:128, :], nl.load(x[64:128, :]))
        else:
            nl.store(out, nl.add(t, nl.load(x)))
        return out

    np.testing.assert_array_equal(first(X), X)
    with pytest.raises(AddressError) as e:
        second(np.zeros_like(X))
    assert e.value.rule == "nki_tile_from_earlier_trace"
    assert "kernel first" in str(e.value)
    np.testing.assert_array_equal(first(X + 1), X + 1)  # the kernels themselves still work


def test_tiles_inside_one_trace_and_kernels_called_as_functions_are_unaffected():
    @nki.jit
    def helper(t):
        return nl.multiply(t, t)

    @nki.jit(cache=False)
    def k(x):
        t = nl.load(x)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, helper(t))
        return out

    for _ in range(3):
        np.testing.assert_array_equal(k(X), X * X)


# ------------------------------------------------------------------ what nki.jit takes
def _gen(x):
    yield _copy(x)


async def _coro(x):
    return _copy(x)


async def _agen(x):
    yield _copy(x)


@pytest.mark.parametrize("fn", [_gen, _coro, _agen], ids=["generator", "async def", "async generator"])
def test_jit_refuses_generator_and_async_kernels(fn):
    with pytest.raises(NotSupportedError) as e:
        nki.jit(fn)
    assert e.value.rule == "nki_kernel_generator" and fn.__name__ in str(e.value)
    with pytest.raises(NotSupportedError):
        nki.jit(platform_target="trn3")(fn)


@pytest.mark.parametrize("fn", [5, None, "kernel"])
def test_jit_refuses_what_is_not_callable(fn):
    with pytest.raises(ArgumentTypeError) as e:
        nki.jit(fn) if fn is not None else nki.jit()(fn)
    assert e.value.rule == "nki_kernel_not_callable"


# ------------------------------------------------------------------ launch arguments
def test_launch_grids():
    k = nki.jit(_copy)
    np.testing.assert_array_equal(k[[1]](X), X)  # a list grid works as a tuple
    np.testing.assert_array_equal(k[np.int64(1)](X), X)
    for bad in ("a", 1.0, (1, "2"), True, [[1]]):
        with pytest.raises(ArgumentTypeError) as e:
            k[bad]
        assert e.value.rule == "nki_grid_not_integer"


def test_an_array_argument_whose_array_method_returns_no_array():
    class Bad:
        def __array__(self, *a, **kw):
            return 5

    with pytest.raises(OperandError) as e:
        nki.jit(_copy)(Bad())
    assert e.value.rule == "array_not_array_like" and "x" in str(e.value)


@pytest.mark.parametrize("value", [np.float32(3.0), 3.0, None])
def test_a_scalar_where_nl_load_needs_a_tensor(value):
    with pytest.raises(OperandError) as e:
        nki.jit(lambda x: nl.load(x))(value)
    assert isinstance(e.value, EmuError)
    assert e.value.rule == "operand_not_tensor" and "nl.load" in str(e.value) and "src" in str(e.value)


def test_a_numpy_scalar_argument_is_a_number_while_tracing():
    @nki.jit
    def scale(x, s):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(x), s))
        return out

    np.testing.assert_array_equal(scale(X, np.float32(0.5)), X * np.float32(0.5))


def test_spmd_needs_a_list_of_argument_sets():
    with pytest.raises(ArgumentTypeError) as e:
        tn.spmd(nki.jit(_copy), 2)(None)
    assert e.value.rule == "nki_spmd_args"
