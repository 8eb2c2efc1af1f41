"""HBM tensors carry their chip: in an UltraServer run a program may name only its own chip's HBM
tensors (data moves between chips through collectives); another chip's raises MemorySpaceError
(`hbm_tensor_wrong_chip`) naming the instruction, the operand and both chips."""

import numpy as np
import pytest
import trn3emu as t3
from trn3emu.errors import MemorySpaceError, ShapeError


def _copy(us, src_chip, dst_chip, prog_chip):
    x = us.chip(src_chip).hbm.put(np.arange(64, dtype=np.float32).reshape(8, 8))
    y = us.chip(dst_chip).hbm.alloc((8, 8), np.float32)
    p = t3.Program(chip=prog_chip, core=0)
    t = p.sbuf((8, 8), np.float32)
    p.dma_copy(dst=t, src=x)
    p.dma_copy(dst=y, src=t)
    return p, x, y


def test_other_chips_src_is_refused():
    us = t3.UltraServer(chips=6)
    p, _, _ = _copy(us, 3, 5, 5)
    with pytest.raises(MemorySpaceError) as e:
        us.run([p])
    assert e.value.rule == "hbm_tensor_wrong_chip"
    assert e.value.operand == "src"
    msg = str(e.value)
    assert "instruction #0 dma_copy" in msg and "chip 3's HBM" in msg and "runs on chip 5" in msg


def test_other_chips_dst_is_refused():
    us = t3.UltraServer(chips=6)
    p, _, _ = _copy(us, 5, 3, 5)
    with pytest.raises(MemorySpaceError) as e:
        us.run([p])
    assert e.value.rule == "hbm_tensor_wrong_chip" and e.value.operand == "dst"
    assert "instruction #1 dma_copy" in str(e.value) and "chip 3's HBM" in str(e.value)


def test_another_devices_tensor_is_refused():
    us = t3.UltraServer(chips=2)
    other = t3.Device()
    x = other.hbm.put(np.ones((8, 8), np.float32))
    p = t3.Program(chip=1, core=0)
    p.dma_copy(dst=p.sbuf((8, 8), np.float32), src=x)
    with pytest.raises(MemorySpaceError, match="another device's HBM") as e:
        us.run(p)
    assert e.value.rule == "hbm_tensor_wrong_chip"


def test_own_chips_tensors_run_and_chip_may_be_set_after_assembly():
    us = t3.UltraServer(chips=6)
    p, x, y = _copy(us, 4, 4, 0)
    p.chip = 4  # placed after assembly: checked when the UltraServer runs
    us.run([p])
    np.testing.assert_array_equal(us.chip(4).hbm.get(y), np.arange(64, dtype=np.float32).reshape(8, 8))
    p.chip = 2
    with pytest.raises(MemorySpaceError, match="chip 4's HBM, this program runs on chip 2"):
        us.run([p])


def test_failed_append_records_nothing():
    """An instruction the assembler refuses leaves no record: the error of a later run names the
    instruction that really uses the tensor."""
    us = t3.UltraServer(chips=2)
    x = us.chip(1).hbm.put(np.ones((8, 8), np.float32))
    p = t3.Program(chip=0, core=0)
    with pytest.raises(ShapeError):
        p.dma_copy(dst=p.sbuf((4, 4), np.float32), src=x)  # element counts differ: refused
    p.tensor_copy(dst=p.sbuf((8, 8), np.float32), src=p.sbuf((8, 8), np.float32))
    p.dma_copy(dst=p.sbuf((8, 8), np.float32), src=x)
    with pytest.raises(MemorySpaceError, match="instruction #1 dma_copy operand src"):
        us.run(p)
