"""Issue 13, outcome 5: SPMD launches of kernels that ignore `program_id`. Cores writing
identical bytes to the same HBM unordered are a warning naming both instructions; different
bytes, or a read involved, stay a race; a switch makes the warning an error."""

import warnings

import numpy as np
import pytest
import trn3emu
import trn3emu.nki as tn
from trn3emu.errors import IdenticalWritesWarning, OperandError, RaceError

tn.install()

import nki  # noqa: E402
import nki.language as nl  # noqa: E402

A = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)


@nki.jit
def _same(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.multiply(nl.load(a), 2.0))
    return out


@nki.jit
def _differ(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.multiply(nl.load(a), float(nl.program_id(0) + 1)))
    return out


@nki.jit
def _read_other(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    if nl.program_id(0) == 0:
        nl.store(out, nl.load(a))
    else:
        t = nl.load(out)  # reads what core 0 writes, unordered
        nl.store(a, t)
    return out


def test_identical_writes_from_two_cores_warn_naming_both_instructions(monkeypatch):
    monkeypatch.delenv("TRN3EMU_NKI_IDENTICAL_WRITES", raising=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = _same[2](A)
    np.testing.assert_array_equal(out, A * 2)
    ws = [x for x in w if issubclass(x.category, IdenticalWritesWarning)]
    msgs = [str(x.message) for x in ws]
    assert len(msgs) == 1
    # issue 29: both cores named, the instruction text once, attributed to the kernel's store line
    # (not to the front end) with its source text, and a fix
    assert "core 0 and core 1" in msgs[0] and msgs[0].count("dma_copy") == 1
    store = _same.fn.__code__.co_firstlineno + 3  # (the decorator line) `nl.store(...)`: the store
    assert ws[0].filename == __file__ and ws[0].lineno == store
    assert "fix: store from one core only" in msgs[0]
    raw = _same.last_result.identical_writes  # the device's own report: both instructions
    assert len(raw) == 1 and "core 0 #" in raw[0] and "core 1 #" in raw[0]


def test_different_bytes_stay_a_race(monkeypatch):
    monkeypatch.delenv("TRN3EMU_NKI_IDENTICAL_WRITES", raising=False)
    with pytest.raises(RaceError, match="bytes written differ") as e:
        _differ[2](A)
    assert e.value.rule == "data_race"


def test_a_read_involved_stays_a_race(monkeypatch):
    monkeypatch.delenv("TRN3EMU_NKI_IDENTICAL_WRITES", raising=False)
    with pytest.raises(RaceError) as e:
        _read_other[2](A.copy())
    assert e.value.rule == "data_race" and "differ" not in str(e.value)


def test_switch_makes_identical_writes_an_error(monkeypatch):
    monkeypatch.setenv("TRN3EMU_NKI_IDENTICAL_WRITES", "error")
    with pytest.raises(RaceError) as e:
        _same[2](A)
    assert e.value.rule == "data_race"
    monkeypatch.delenv("TRN3EMU_NKI_IDENTICAL_WRITES")
    strict = nki.jit(_same.fn, identical_writes="error")
    with pytest.raises(RaceError):
        strict[2](A)
    with pytest.raises(OperandError) as e:
        nki.jit(_same.fn, identical_writes="maybe")[2](A)
    assert e.value.rule == "nki_identical_writes_mode"


def test_device_run_keeps_identical_writes_a_race_unless_asked():
    dev = trn3emu.Device()
    x = dev.hbm.put(A)
    y = dev.hbm.alloc(A.shape, "float32")
    progs = dev.programs(sync="auto", cores=[0, 1])
    for p in progs:
        t = trn3emu.Tensor("sbuf", "float32", A.shape, core=p.core)
        p.dma_copy(t, x)
        p.dma_copy(y, t)
    with pytest.raises(RaceError):
        dev.run(progs)
    with pytest.warns(IdenticalWritesWarning):
        r = dev.run(progs, identical_writes=True)
    assert len(r.identical_writes) == 1
    np.testing.assert_array_equal(dev.hbm.get(y), A)


@nki.jit
def _same_tiles(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for j in range(2):
        nl.store(out[:, j * 32 : (j + 1) * 32], nl.load(a[:, j * 32 : (j + 1) * 32]))
    return out


def test_one_warning_per_launch_listing_every_overlap(monkeypatch):
    monkeypatch.delenv("TRN3EMU_NKI_IDENTICAL_WRITES", raising=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = _same_tiles[2](A)
    np.testing.assert_array_equal(out, A)
    msgs = [str(x.message) for x in w if issubclass(x.category, IdenticalWritesWarning)]
    assert len(msgs) == 1 and "and 1 more" in msgs[0]
    assert len(_same_tiles.last_result.identical_writes) == 2
