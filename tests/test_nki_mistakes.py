"""Issue 13: mistakes a golden model must catch. An output the kernel never writes, HBM outputs
filled under `fill_uninitialized`, slices past a tensor's end, `nl.ds` windows out of bounds
(with the kernel line), misspelt names and keywords (did you mean), and kernel-first tracebacks."""

import os
import traceback

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu import testing
from trn3emu.errors import ArgumentTypeError, NotSupportedError, OperandError, ShapeError

tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

HERE = os.path.basename(__file__)
A = np.arange(128 * 1024, dtype=np.float32).reshape(128, 1024)


def _line_of(fn, text: str) -> str:
    """`file:line` of the line in fn's source containing `text`."""
    import inspect

    src, first = inspect.getsourcelines(fn)
    for i, line in enumerate(src):
        if text in line:
            return f"{HERE}:{first + i}"
    raise AssertionError(text)


# ------------------------------------------------------------------ outputs never written
def _never_written(x):
    out = nl.ndarray((128, 64), x.dtype, buffer=nl.shared_hbm, name="result")
    return out


def _second_never_written(x):
    o1 = nl.ndarray((128, 64), x.dtype, buffer=nl.shared_hbm)
    o2 = nl.ndarray((128, 64), x.dtype, buffer=nl.shared_hbm)
    nl.store(o1, nl.load(x[:, 0:64]))
    return o1, o2


def test_an_output_never_written_is_an_error_naming_it():
    with pytest.raises(OperandError, match="never writes it") as e:
        nki.jit(_never_written)(A)
    assert e.value.rule == "nki_output_never_written"
    assert "result (128, 64) float32" in str(e.value) and _line_of(_never_written, "nl.ndarray") in str(e.value)
    with pytest.raises(OperandError, match=r"result\[1\]"):
        nki.jit(_second_never_written)(A)


def _partly_written(x):
    out = nl.ndarray((128, 128), x.dtype, buffer=nl.shared_hbm)
    nl.store(out[:, 0:64], nl.load(x[:, 0:64]))
    return out


def test_hbm_outputs_start_as_the_fill_pattern():
    k = nki.jit(_partly_written)
    plain = k(A)
    np.testing.assert_array_equal(plain[:, :64], A[:, :64])
    assert (plain[:, 64:] == 0).all()  # default: zero-filled, as before
    with testing.fill_uninitialized(0xFF):
        for _ in range(2):  # traced, then from the trace cache: the fill is part of the key
            filled = k(A)
            np.testing.assert_array_equal(filled[:, :64], A[:, :64])
            assert np.isnan(filled[:, 64:]).all()
    assert (k(A)[:, 64:] == 0).all()


def _full_in_hbm(x):
    return nl.full((4, 4), 7.0, nl.float32, buffer=nl.shared_hbm)  # written before the run


def test_hbm_tensors_written_while_tracing_count_as_written():
    np.testing.assert_array_equal(nki.jit(_full_in_hbm)(A), np.full((4, 4), 7.0, np.float32))


# ------------------------------------------------------------------------ slices past the end
def _slice_past_end(x):
    out = nl.ndarray((128, 128), x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x[0:128, 960:1088])
    nl.store(out, t)
    return out


def test_a_slice_past_the_end_is_an_error_at_the_slicing_line():
    with pytest.raises(ShapeError, match="960:1088 of dim 1 runs past the end") as e:
        nki.jit(_slice_past_end)(A)
    assert e.value.rule == "nki_slice_out_of_bounds"
    assert _line_of(_slice_past_end, "960:1088") in str(e.value)


def _slices_in_bounds(x):
    out = nl.ndarray((128, 64), x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x[..., 960:1024][:, -64:]))
    return out


def test_slices_to_the_end_and_negative_ones_still_work():
    np.testing.assert_array_equal(nki.jit(_slices_in_bounds)(A), A[:, 960:1024])


def _ds_past_end(x):
    out = nl.ndarray((128, 128), x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x[0:128, nl.ds(960, 128)])
    nl.store(out, t)
    return out


def test_ds_out_of_bounds_names_the_kernel_line():
    with pytest.raises(ShapeError, match="run outside") as e:
        nki.jit(_ds_past_end)(A)
    assert _line_of(_ds_past_end, "nl.ds(960") in str(e.value)


# ----------------------------------------------------------------- misspelt names / keywords
def _typo_name(x):
    return nl.gelo(nl.load(x[:, 0:8]))


def _typo_keyword(x):
    return nl.exp(nl.load(x[:, 0:8]), dtyp=nl.float32)


def _typo_isa_keyword(x):
    t = nl.load(x[:, 0:8])
    u = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
    nisa.activation(u, op=nl.exp, dat=t)
    return u


def _typo_method(x):
    return nl.load(x[:, 0:8]).reshap((128, 8))


def _typo_ndarray(x):
    return nl.ndarray((128, 8), nl.float32, bufer=nl.sbuf)


def test_misspelt_names_and_keywords_suggest_the_right_one():
    with pytest.raises(ArgumentTypeError, match="did you mean `buffer`"):
        nki.jit(_typo_ndarray)(A)
    with pytest.raises(NotSupportedError, match="no such function.*nki.language.gelo; did you mean `gelu`"):
        nki.jit(_typo_name)(A)
    with pytest.raises(AttributeError, match="did you mean `reshape`"):
        nki.jit(_typo_method)(A)
    with pytest.raises(ArgumentTypeError, match=r"no such parameter: nl.exp\(dtyp=...\); did you mean `dtype`") as e:
        nki.jit(_typo_keyword)(A)
    assert e.value.rule == "nki_unknown_parameter"
    with pytest.raises(ArgumentTypeError, match="nki.isa.activation.*did you mean `data`"):
        nki.jit(_typo_isa_keyword)(A)


def test_names_not_close_to_any_stay_not_supported():
    with pytest.raises(NotSupportedError, match="not supported: nki.language.no_such_api_at_all"):
        nl.no_such_api_at_all  # noqa: B018


# ----------------------------------------------------------------------- kernel-first tracebacks
def _helper_that_breaks(t):
    return nl.load(t[0:128, 1000:1100])


def _kernel_calling_a_helper(x):
    out = nl.ndarray((128, 100), x.dtype, buffer=nl.shared_hbm)
    nl.store(out, _helper_that_breaks(x))
    return out


def test_kernel_errors_show_the_kernel_frames_not_the_front_end(monkeypatch):
    monkeypatch.delenv("TRN3EMU_NKI_TRACEBACK", raising=False)
    k = nki.jit(_kernel_calling_a_helper)
    with pytest.raises(ShapeError) as e:
        k(A)
    frames = traceback.extract_tb(e.value.__traceback__)
    files = [os.path.basename(f.filename) for f in frames]
    internal = [f for f in frames if f"{os.sep}trn3emu{os.sep}" in f.filename]
    assert len(internal) <= 1  # at most the launch frame that re-raises
    assert files[-1] == HERE and frames[-1].name == "_helper_that_breaks"
    assert frames[-2].name == "_kernel_calling_a_helper"
    monkeypatch.setenv("TRN3EMU_NKI_TRACEBACK", "full")
    with pytest.raises(ShapeError) as e:
        k(A)
    full = traceback.extract_tb(e.value.__traceback__)
    assert sum(f"{os.sep}trn3emu{os.sep}" in f.filename for f in full) > 2


def _int_matmul(a, b):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.matmul(nl.load(a), nl.load(b)))
    return out


def test_an_instruction_an_nl_op_issued_names_that_op():
    from trn3emu.errors import DtypeError

    with pytest.raises(DtypeError) as e:
        nki.jit(_int_matmul)(np.ones((128, 128), np.int32), np.ones((128, 64), np.int32))
    notes = getattr(e.value, "__notes__", [])
    assert any(_line_of(_int_matmul, "nl.matmul") in n for n in notes)
    assert "  issued by nl.matmul (part of its lowering)" in notes
