"""Errors raised by the NKI front end carry a specific snake_case rule id (matched here, not wording)."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import EmuError, NotSupportedError
from trn3emu.nki import isa as nisa
from trn3emu.nki import language as nl


def _run(body, *arrays):
    @tn.jit
    def k(*args):
        return body(*args)

    return k(*arrays)


def _rule(body, *arrays) -> str:
    with pytest.raises(EmuError) as ei:
        _run(body, *arrays)
    return ei.value.rule


X = np.zeros((128, 128), np.float32)


def test_unknown_name():
    with pytest.raises(NotSupportedError) as ei:
        nisa.no_such_instruction  # noqa: B018
    assert ei.value.rule == "nki_unknown_name"
    assert isinstance(ei.value, AttributeError)


def test_call_form_and_op_tokens():
    def legacy_call(x):
        t = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(t, x, bogus=1)

    assert _rule(legacy_call, X) == "nki_call_form"

    def bad_op(x):
        t = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(t, t, t, op=np.negative)

    assert _rule(bad_op, X) == "nki_op_unsupported"


def test_mask_on_an_unmaskable_instruction():
    def body(x):
        # (nc_matmul takes a mask since the legacy partial-tile form is supported; a PE transpose
        # of a plain tile does not)
        a = nl.ndarray((128, 128), nl.bfloat16, buffer=nl.sbuf)
        acc = nl.ndarray((128, 128), nl.bfloat16, buffer=nl.psum)
        i = nl.arange(128)[:, None]
        nisa.nc_transpose(acc, a, mask=(i < 64))

    assert _rule(body, X) == "nki_mask_unsupported"


def test_tile_truth_value_and_grid():
    def body(x):
        t = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        if t:
            pass

    assert _rule(body, X) == "nki_tile_truth_value"
    with pytest.raises(EmuError) as ei:
        tn.jit(lambda x: x)[0]
    assert ei.value.rule == "nki_grid_not_positive"
