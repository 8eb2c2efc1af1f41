"""Per-run limits on host time and host memory (issue 18): `Device.run(max_seconds=,
max_memory=)`, docs/limits.md. Each raises its own `EmuError` subclass and leaves the device
usable."""

from __future__ import annotations

import time

import numpy as np
import pytest
import trn3emu as t3

MIB = 1 << 20


def _branch_loop() -> t3.Program:
    p = t3.Program(sync="manual")
    p.branch(target=0, engine="sync")
    return p


def _still_usable(dev: t3.Device) -> None:
    p = t3.Program()
    x = np.arange(8, dtype=np.float32)
    s = p.sbuf((1, 8), np.float32)
    p.dma_copy(dst=s, src=dev.hbm.put(x).reshape(1, 8))
    dev.run(p)
    np.testing.assert_array_equal(dev.read(s), x.reshape(1, 8))


def test_wall_time_limit_stops_a_runaway_loop_within_seconds():
    dev = t3.Device()
    dev.max_executed = 1 << 50  # the step limit would take hours
    t0 = time.monotonic()
    with pytest.raises(t3.RunawayError) as e:
        dev.run(_branch_loop(), trace=False, max_seconds=0.5)
    took = time.monotonic() - t0
    assert e.value.rule == "run_time_limit" and "max_seconds" in str(e.value)
    assert took < 20, took  # the bound: within seconds (generous on a shared VM)
    _still_usable(dev)


def test_no_wall_time_limit_by_default_and_a_generous_one_changes_nothing():
    dev = t3.Device()
    p = t3.Program()
    s = p.sbuf((4, 8), np.float32)
    p.memset(dst=s, value=2.0)
    a = dev.run(p)
    b = dev.run(p, max_seconds=3600, max_memory=1 << 30)
    assert a.executed == b.executed and a.time_ns == b.time_ns


def _hbm_spray(dev: t3.Device, rows: int) -> t3.Program:
    """A loop writing one 128-byte row per MiB of a `rows` MiB HBM tensor: every iteration backs
    a fresh 1 MiB host page."""
    big = dev.hbm.alloc((rows, MIB // 4), np.float32)
    p = t3.Program(sync="manual")
    r = p.register_alloc(0, engine="sync")
    g = p.sbuf((1, 32), np.float32)
    top = len(p)
    p.dma_copy(dst=big.ap([[MIB // 4, 1], [1, 32]], scalar_offset=r), src=g, engine="sync")
    p.register_op(dst=r, src=r, op="add", imm=1, engine="sync")
    p.branch(target=top, cmp="lt", reg=r, imm=rows, engine="sync")
    return p


def test_host_memory_limit_stops_a_loop_that_backs_new_hbm_pages():
    dev = t3.Device()
    p = _hbm_spray(dev, 4096)  # would back 4 GiB
    before = dev.hbm.resident_bytes
    with pytest.raises(t3.ResourceError) as e:
        dev.run(p, trace=False, max_memory=64 * MIB)
    assert e.value.rule == "run_memory_limit" and "max_memory" in str(e.value)
    assert isinstance(e.value, MemoryError)
    grown = dev.hbm.resident_bytes - before
    # The limit is checked every POLL_EVERY (64) units of work: 16 iterations of 4 items
    # (3 instructions and a transfer), each backing one page, may pass between two checks. The
    # run's own state (race logs, queued transfers, semaphore increments) counts too, so the
    # pages alone may stop a little below the limit.
    assert 60 * MIB < grown <= 80 * MIB, grown
    _still_usable(dev)


def test_host_memory_limit_refuses_a_staging_buffer_before_allocating_it():
    dev = t3.Device()
    a = dev.hbm.put(np.arange(16, dtype=np.float32))
    b = dev.hbm.put(np.zeros(16, np.float32))
    p = t3.Program()
    p.dma_copy(dst=b.ap([[0, 1 << 15], [0, 1 << 15]]), src=a.ap([[0, 1 << 15], [0, 1 << 15]]))
    with pytest.raises(t3.ResourceError) as e:
        dev.run(p, max_memory=1 << 30)  # the 2^30-element staging buffer needs 4 GiB
    assert e.value.rule == "run_memory_limit" and "4294967296 bytes" in str(e.value)
    np.testing.assert_array_equal(dev.hbm.get(b), np.zeros(16, np.float32))
    _still_usable(dev)


@pytest.mark.parametrize("kw", [{"max_seconds": "1"}, {"max_memory": -1}, {"max_memory": 1.5}])
def test_bad_limit_arguments_are_emu_errors(kw):
    with pytest.raises(t3.EmuError):
        t3.Device().run(_branch_loop(), **kw)
