"""Cross-thread use of a running Device (issue 18): a call from another thread while a run holds
the device waits for the run to end (it used to raise `RuntimeError: Already borrowed`)."""

from __future__ import annotations

import threading

import numpy as np
import trn3emu as t3


def _long_loop(dev: t3.Device, n: int) -> tuple[t3.Program, t3.Tensor]:
    """A loop of `n` iterations adding 1.0 to a tile, then a DMA of it to `out`."""
    out = dev.hbm.alloc((1, 8), np.float32)
    p = t3.Program(sync="manual")
    t = p.sbuf((1, 8), np.float32)
    r = p.register_alloc(0, engine="vector")
    p.memset(dst=t, value=0.0, engine="vector")
    top = len(p)
    p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0, engine="vector")
    p.register_op(dst=r, src=r, op="add", imm=1, engine="vector")
    p.branch(target=top, cmp="lt", reg=r, imm=n, engine="vector", signal=0)
    p.dma_copy(dst=out, src=t, engine="vector", wait=(0, n))
    return p, out


def test_calls_from_other_threads_wait_for_the_run():
    dev = t3.Device()
    x = dev.hbm.put(np.arange(4, dtype=np.float32))
    p, out = _long_loop(dev, 20_000)
    started, results, errors = threading.Event(), {}, []

    def runner():
        started.set()
        try:
            results["run"] = dev.run(p, trace=False)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def other():
        started.wait()
        try:
            results["get"] = dev.hbm.get(x)  # touches the device while it runs
            results["read_out"] = dev.hbm.get(out)
            dev.max_executed = dev.max_executed
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=runner), threading.Thread(target=other)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    np.testing.assert_array_equal(results["get"], np.arange(4, dtype=np.float32))
    # Either before or after the run, never half-way: the loop's result is all or nothing.
    assert results["read_out"].tolist() in ([[0.0] * 8], [[20_000.0] * 8])
    np.testing.assert_array_equal(dev.hbm.get(out), np.full((1, 8), 20_000.0, np.float32))


def test_two_threads_running_one_device_take_turns():
    dev = t3.Device()
    p, out = _long_loop(dev, 5_000)
    errors = []

    def runner():
        try:
            dev.run(p, trace=False)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=runner) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    np.testing.assert_array_equal(dev.hbm.get(out), np.full((1, 8), 5_000.0, np.float32))
