"""Issue 18 (NKI side): a launch grid too large for host memory is refused before tracing, a
kernel writing a read-only input says so instead of dropping the write, and a failed launch
leaves the kernel usable (the next good launch on the same kernel gives the right answer)."""

import time
import warnings

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu import ReadOnlyInputWarning
from trn3emu.errors import EmuError, ResourceError
from trn3emu.nki import _kernel

tn.install()

import nki  # noqa: E402
import nki.language as nl  # noqa: E402

X = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)


def _copy(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def _traced_nothing(x):
    raise AssertionError("traced although the grid is over the limit")


# ------------------------------------------------------------------ grid limit
def test_a_huge_grid_is_refused_before_tracing_naming_the_limit():
    k = nki.jit(_traced_nothing)
    t0 = time.perf_counter()
    with pytest.raises(ResourceError) as e:
        k[2**20, 2**20](X)
    assert time.perf_counter() - t0 < 5  # generous: refused before any tracing
    assert e.value.rule == "nki_grid_too_large"
    msg = str(e.value)
    assert str(2**40) in msg and str(_kernel.MAX_PROGRAMS) in msg and "max_programs" in msg
    assert isinstance(e.value, MemoryError) and isinstance(e.value, EmuError)
    with pytest.raises(ResourceError, match="16385 programs"):
        k[_kernel.MAX_PROGRAMS + 1]


def test_the_grid_limit_is_overridable(monkeypatch):
    k = nki.jit(_copy, max_programs=4)
    with pytest.raises(ResourceError, match="limit of 4 programs"):
        k[5](X)
    np.testing.assert_array_equal(k[2, 2](X), X)  # exactly at the limit runs
    monkeypatch.setenv("TRN3EMU_NKI_MAX_PROGRAMS", "2")
    with pytest.raises(ResourceError, match="limit of 2 programs"):
        nki.jit(_copy)[3](X)
    np.testing.assert_array_equal(nki.jit(_copy)[2](X), X)


# ------------------------------------------------------------------ read-only inputs
def _write_input(x):
    t = nl.load(x)
    nl.store(x, value=nl.add(t, 1.0))
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def test_writing_a_read_only_input_warns_naming_it():
    x = X.copy()
    x.flags.writeable = False
    with pytest.warns(ReadOnlyInputWarning, match=r"_write_input wrote input x \(128, 64\) float32"):
        out = nki.jit(_write_input)(x)
    np.testing.assert_array_equal(out, X)
    np.testing.assert_array_equal(x, X)  # unchanged: the caller's array cannot take it
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReadOnlyInputWarning)
        with pytest.raises(ReadOnlyInputWarning):
            nki.jit(_write_input)(x)


def test_writing_a_writable_input_copies_back_without_warning():
    x = X.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReadOnlyInputWarning)
        nki.jit(_write_input)(x)
    np.testing.assert_array_equal(x, X + 1)


def test_reading_a_read_only_input_does_not_warn():
    x = X.copy()
    x.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReadOnlyInputWarning)
        np.testing.assert_array_equal(nki.jit(_copy)(x), X)


def _write_scalar_input(s):
    t = nl.load(s)
    nl.store(s, value=nl.add(t, 2.0))
    out = nl.ndarray((1, 1), s.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def test_a_written_0d_input_is_copied_back():
    # 0-d arrays are placed as 1-element tensors; their write used to be dropped silently.
    s = np.array(5.0, dtype=np.float32)
    k = nki.jit(lambda s: _write_scalar_input(s.reshape((1, 1))))
    k(s)
    assert s.shape == () and s == 7.0


# ------------------------------------------------------------------ failed launch, then a good one
def _fails_for_wide(x):
    if x.shape[1] > 64:
        nl.ndarray((128, 300_000), nl.float32, buffer=nl.sbuf)  # SBUF overflow while tracing
    return _copy(x)


def test_a_failed_launch_leaves_the_kernel_usable():
    k = nki.jit(_fails_for_wide)
    good = k(X)
    np.testing.assert_array_equal(good, X)
    wide = np.ones((128, 128), np.float32)
    for _ in range(2):
        with pytest.raises(EmuError):
            k(wide)
        np.testing.assert_array_equal(k(X), X)  # cached trace
        np.testing.assert_array_equal(k[2](X + 3), X + 3)  # new trace after the failure
    with pytest.raises(ResourceError):
        k[1 << 20](X)
    np.testing.assert_array_equal(k(X * 2), X * 2)


@pytest.mark.parametrize("buffer", ["sbuf", "psum", "hbm"])
@pytest.mark.parametrize("dim", [4.5, 4.0, True])
def test_a_non_integer_tile_dimension_is_refused_not_truncated(buffer, dim):
    """nl.ndarray((128, 4.5)) used to become a (128, 4) tile silently (int() truncation)."""
    from trn3emu.errors import ShapeError

    @nki.jit
    def k(x):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.ndarray((128, dim), dtype=nl.float32, buffer=getattr(nl, buffer))
        nl.store(out, nl.load(x))
        return out

    with pytest.raises(ShapeError) as e:
        k(np.zeros((128, 4), np.float32))
    assert e.value.rule == "shape_not_integer" and repr(dim) in str(e.value)
