"""A program's run plan (regions, DMA transfer plans, dependent flags, write windows: built at
its first run and cached, rust/core/src/machine/run_plan.rs) is never used stale: a program
grown after a run, run on a device with other DMA numbers, with other run options or other
inputs behaves exactly as a new copy of it (same results, times and trace) would."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from trn3emu import errors

F32 = np.float32


def fresh(p: t3.Program) -> t3.Program:
    """A new program with the same instructions (no cached plan)."""
    return t3.Program.from_text(p.to_text(), sync=p.sync)


def summary(res) -> tuple:
    tr = res.trace
    cols = [tr.instructions[k].tolist() for k in ("opcode", "start_ns", "end_ns", "bytes")]
    return (res.time_ns, res.executed, cols, tr.dma["end_ns"].tolist(), tr.dma["dma_engines"].tolist())


def test_instructions_appended_after_a_run_take_part_in_the_next(dev):
    x = np.arange(128 * 64, dtype=F32).reshape(128, 64)
    src = dev.hbm.put(x)
    out = dev.hbm.alloc((128, 64), F32)
    p = t3.Program()
    a = p.sbuf((128, 64), F32)
    b = p.sbuf((128, 64), F32)
    p.dma_copy(dst=a, src=src)
    p.tensor_scalar(dst=b, data=a, op0="multiply", operand0=2.0)
    p.dma_copy(dst=out, src=b)
    dev.run(p)
    np.testing.assert_array_equal(dev.hbm.get(out), 2 * x)
    # grown after the run: one more op and a second store; its trace and result follow
    p.tensor_scalar(dst=b, data=b, op0="add", operand0=1.0)
    p.dma_copy(dst=out, src=b)
    res = dev.run(p)
    np.testing.assert_array_equal(dev.hbm.get(out), 2 * x + 1)
    assert summary(res) == summary(dev.run(fresh(p)))
    assert len(res.trace.dma) == 3


def test_a_race_appended_after_a_clean_run_is_found():
    """The race log reads the plan's regions: an instruction appended after a run must be in
    them, or the race it makes goes unseen."""
    dev = t3.Device()
    p = t3.Program(sync="manual")
    a = p.sbuf((128, 64), F32)
    b = p.sbuf((128, 64), F32)
    p.memset(dst=a, value=1.0, signal=(0, 1))
    p.activation(dst=b, op="copy", data=a, wait=[(0, 1)])
    dev.run(p)
    p.memset(dst=a, value=3.0, engine="gpsimd")  # unordered with the activation's read of a
    with pytest.raises(errors.RaceError):
        dev.run(p)


def test_race_checks_and_trace_switched_on_after_a_run_without_them():
    dev = t3.Device()
    p = t3.Program(sync="manual")
    a = p.sbuf((128, 64), F32)
    b = p.sbuf((128, 64), F32)
    p.memset(dst=a, value=2.5)
    p.activation(dst=b, op="copy", data=a, scale=2.0)
    res = dev.run(p, check_races=False, trace=False)
    assert len(res.trace.instructions) == 0
    with pytest.raises(errors.RaceError):
        dev.run(p)
    res = dev.run(p, check_races=False)
    assert res.trace.instructions["bytes"].tolist() == [128 * 64 * 4, 2 * 128 * 64 * 4]


@pytest.mark.parametrize("timing", ["trn1", "trn2"])
def test_a_device_with_other_dma_numbers_times_the_program_as_new(timing):
    """A plan built on a trn3 device holds trn3 DMA transfer plans; on another generation's
    device the program runs as a new copy of it does there."""
    x = np.ones((128, 4096), F32)
    progs = []
    for dev in (t3.Device(), t3.Device(timing=timing)):
        src = dev.hbm.put(x)
        out = dev.hbm.alloc((128, 4096), F32)
        p = t3.Program()
        a = p.sbuf((128, 4096), F32)
        p.dma_copy(dst=a, src=src)
        p.tensor_scalar(dst=a, data=a, op0="add", operand0=1.0)
        p.dma_copy(dst=out, src=a)
        progs.append((dev, p))
    (d3, p3), (d1, p1) = progs
    assert p3.to_text() == p1.to_text()  # the same addresses on both devices
    first = summary(d3.run(p3))
    other = summary(d1.run(p3))  # p3's plan was built on the trn3 device
    assert other == summary(d1.run(fresh(p3)))
    assert other != first
    assert summary(d3.run(p3)) == first


def test_a_reused_program_reads_the_inputs_of_each_run(dev, rng):
    src = dev.hbm.alloc((128, 32), F32)
    out = dev.hbm.alloc((128, 32), F32)
    p = t3.Program()
    a = p.sbuf((128, 32), F32)
    p.dma_copy(dst=a, src=src)
    p.activation(dst=a, op="exp", data=a)
    p.dma_copy(dst=out, src=a)
    for _ in range(3):
        x = rng.standard_normal((128, 32)).astype(F32)
        dev.hbm.write(src, x)
        dev.run(p)
        np.testing.assert_allclose(dev.hbm.get(out), np.exp(x), rtol=1e-5)


def test_an_nki_kernel_called_with_other_shapes_and_inputs(rng):
    import trn3emu.nki as tn

    tn.install()
    import nki
    import nki.language as nl

    @nki.jit
    def double_plus(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, value=nl.add(nl.multiply(t, 2.0), 1.0))
        return out

    for shape in [(128, 64), (64, 32), (128, 64), (128, 512)]:
        x = rng.standard_normal(shape).astype(F32)
        np.testing.assert_array_equal(np.asarray(double_plus(x)), x * 2 + 1)
