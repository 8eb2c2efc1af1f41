"""Hardening (issue 18, findings 3-5): failed calls leave no poisoned state, HBM tensors can be
freed and reused, every bad argument raises an `EmuError` subclass, nothing is silently truncated."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from trn3emu.errors import CapacityError

GIB = 1 << 30


# ------------------------------------------------------------------ (finding 3) no poisoned state
def test_refused_alloc_leaves_the_allocator_usable():
    dev = t3.Device()
    first = dev.hbm.alloc((4,), np.float32)
    with pytest.raises(CapacityError) as e:
        dev.hbm.alloc((200 * GIB,), np.uint8)
    assert e.value.rule == "hbm_capacity"
    small = dev.hbm.alloc((16,), np.float32)
    assert small.offset == 64  # right after `first`, as if the refused call never happened
    x = np.arange(16, dtype=np.float32)
    t = dev.hbm.put(x)
    np.testing.assert_array_equal(dev.hbm.get(t), x)
    assert first.offset == 0
