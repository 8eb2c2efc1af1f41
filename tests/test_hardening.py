"""Hardening (issue 18, findings 3-5): failed calls leave no poisoned state, HBM tensors can be
freed and reused, every bad argument raises an `EmuError` subclass, nothing is silently truncated."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from trn3emu.errors import (
    AddressError,
    ArgumentTypeError,
    AsmSyntaxError,
    CapacityError,
    EmuError,
    OperandError,
    ShapeError,
)

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


def test_free_and_reuse():
    dev = t3.Device()
    a = dev.hbm.alloc((1000,), np.float32)
    b = dev.hbm.alloc((16,), np.float32)
    assert (a.offset, b.offset) == (0, 4032)
    dev.hbm.free(a)
    c = dev.hbm.alloc((500,), np.float32)  # first fit: the freed range at 0
    assert c.offset == 0
    d = dev.hbm.alloc((600,), np.float32)  # does not fit in 2000..4032: goes after b
    assert d.offset == 4096
    e = dev.hbm.alloc((100,), np.float32)  # fits in the rest of a's old range
    assert e.offset == 2048
    x = np.arange(16, dtype=np.float32)
    dev.hbm.write(b, x)
    np.testing.assert_array_equal(dev.hbm.get(b), x)


def test_free_everything_restarts_at_zero():
    dev = t3.Device()
    ts = [dev.hbm.alloc((8,), np.float32) for _ in range(3)]
    for t in ts:
        dev.hbm.free(t)
    assert dev.hbm.alloc((8,), np.float32).offset == 0


def test_double_free_and_use_after_free_raise():
    dev = t3.Device()
    t = dev.hbm.put(np.arange(8, dtype=np.float32))
    view = t[2:6]
    dev.hbm.free(t)
    with pytest.raises(AddressError) as e:
        dev.hbm.free(t)
    assert e.value.rule == "hbm_double_free"
    for call in (
        lambda: dev.hbm.get(t),
        lambda: dev.hbm.get(view),
        lambda: dev.hbm.write(t, np.zeros(8, np.float32)),
        lambda: dev.hbm.holds(t, np.zeros(8, np.float32)),
        lambda: dev.read(view),
        lambda: dev.hbm.get(t.reshape(2, 4)),
    ):
        with pytest.raises(AddressError) as e:
            call()
        assert e.value.rule == "hbm_use_after_free"
    p = t3.Program()
    s = p.sbuf((1, 8), np.float32)
    with pytest.raises(AddressError) as e:
        p.dma_copy(dst=s, src=t.reshape(1, 8))
    assert e.value.rule == "hbm_use_after_free"
    assert len(p) == 0


def test_free_refuses_tensors_it_did_not_allocate():
    dev, other = t3.Device(), t3.Device()
    t = other.hbm.alloc((4,), np.float32)
    p = t3.Program()
    for bad in (t, p.sbuf((1, 4), np.float32), None):
        with pytest.raises(AddressError) as e:
            dev.hbm.free(bad)
        assert e.value.rule == "hbm_free_not_allocated"


def test_context_manager_frees():
    dev = t3.Device()
    with dev.hbm.alloc((1000,), np.float32) as t:
        dev.hbm.write(t, np.ones(1000, np.float32))
        assert dev.hbm.get(t).sum() == 1000
    with pytest.raises(AddressError):
        dev.hbm.get(t)
    assert dev.hbm.alloc((4,), np.float32).offset == 0  # the range came back
    with dev.hbm.put(np.ones(4, np.float32)) as u:
        dev.hbm.free(u)  # freeing inside the block is fine; the exit does not free twice
    with pytest.raises(ShapeError):
        with t3.Program().sbuf((1, 4), np.float32):
            pass


def test_explicit_and_automatic_placements_never_overlap():
    dev = t3.Device()
    fixed = dev.hbm.alloc((16,), np.float32, address=0)
    auto = dev.hbm.alloc((16,), np.float32)
    assert auto.offset >= fixed.offset + fixed.nbytes  # skips the explicit range
    high = dev.hbm.alloc((16,), np.float32, address=4096)
    big = dev.hbm.alloc((1000,), np.float32)  # 4000 bytes do not fit below `high`
    assert big.offset >= high.offset + high.nbytes
    with pytest.raises(AddressError) as e:
        dev.hbm.alloc((4,), np.float32, address=auto.offset + 8)
    assert e.value.rule == "hbm_overlap"
    with pytest.raises(AddressError):
        dev.hbm.put(np.ones(4, np.float32), address=0)
    alias = dev.hbm.alloc((8,), np.uint8, address=0, alias=True)  # on purpose: the same bytes
    dev.hbm.write(fixed, np.arange(16, dtype=np.float32))
    np.testing.assert_array_equal(dev.hbm.get(alias), np.arange(2, dtype=np.float32).view(np.uint8))
    dev.hbm.free(fixed)
    dev.hbm.free(alias)
    assert dev.hbm.alloc((16,), np.float32).offset == 0


# ------------------------------------------------- (finding 4) every bad argument is an EmuError
def _raises(call, cls, builtin, rule):
    with pytest.raises(cls) as e:
        call()
    assert isinstance(e.value, EmuError) and isinstance(e.value, builtin), type(e.value)
    assert e.value.rule == rule, e.value.rule
    return e.value


def test_lone_surrogate_in_assembly_text():
    e = _raises(lambda: t3.Program.from_text("nop\ud800"), AsmSyntaxError, ValueError, "str_not_utf8")
    assert e.operand == "text"
    _raises(lambda: t3.Program.from_text(5), ArgumentTypeError, TypeError, "str_expected")


@pytest.mark.parametrize(
    "call, operand",
    [
        (lambda: t3.Device(seed=-1), "seed"),
        (lambda: t3.Device(seed=2**64), "seed"),
        (lambda: t3.Device(sr_bits=-1), "sr_bits"),
        (lambda: t3.Program(core=2**70), "core"),
        (lambda: t3.Program(core=-(2**70)), "core"),
    ],
)
def test_out_of_range_integers(call, operand):
    e = _raises(call, OperandError, ValueError, "int_out_of_range")
    assert e.operand == operand


def test_negative_start_partition():
    e = _raises(
        lambda: t3.Program().psum((128, 4), np.float32, address=(-1, 0)),
        AddressError,
        IndexError,
        "tile_partitions_out_of_range",
    )
    assert e.operand == "address"


def test_negative_read_offsets_and_empty_get():
    dev = t3.Device()
    p = t3.Program()
    s = p.sbuf((4, 8), np.float32)
    with pytest.raises(EmuError):
        dev.read(s.ap([[8, 4], [1, 8]], offset=-16))
    t = dev.hbm.put(np.arange(8, dtype=np.float32))
    with pytest.raises(EmuError):
        dev.hbm.get(t.ap([[1, 0]]))


@pytest.mark.parametrize(
    "call, rule",
    [
        (lambda: t3.Device(seed=1.5), "int_expected"),
        (lambda: t3.Device(sr_bits="8"), "int_expected"),
        (lambda: t3.Device(rounding=5), "str_expected"),
        (lambda: t3.Program(core="1"), "int_expected"),
        (lambda: t3.Program().memset(dst=t3.Program().sbuf((1, 4), np.float32), value=0.0, name=5), "str_expected"),
        (lambda: t3.Device().run([None]), "program_expected"),
        (lambda: t3.Device().run(None), "program_expected"),
        (lambda: setattr(t3.Device(), "max_executed", 1.5), "int_expected"),
    ],
)
def test_wrong_types(call, rule):
    _raises(call, ArgumentTypeError, TypeError, rule)


def test_bad_calls_leave_device_and_program_usable():
    dev = t3.Device()
    p = t3.Program()
    t = p.sbuf((1, 4), np.float32)
    for bad in (lambda: p.memset(dst=t, value=0.0, name=5), lambda: dev.run([None]), lambda: dev.run([p, 3])):
        with pytest.raises(EmuError):
            bad()
    assert len(p) == 0
    p.memset(dst=t, value=3.0)
    dev.run(p)
    np.testing.assert_array_equal(dev.read(t), np.full((1, 4), 3.0, np.float32))


# ------------------------------------------------------------ (finding 5) no silent truncation
@pytest.mark.parametrize("shape", [(1.9,), (2, 1.0), (True, 4), 2.5, (np.float32(4),)])
def test_non_integer_shapes_are_refused(shape):
    dev = t3.Device()
    e = _raises(lambda: dev.hbm.alloc(shape, np.float32), ShapeError, ValueError, "shape_not_integer")
    assert e.operand == "shape"
    p = t3.Program()
    _raises(lambda: p.sbuf(shape, np.float32), ShapeError, ValueError, "shape_not_integer")
    assert dev.hbm.alloc((4,), np.float32).offset == 0  # nothing was placed


def test_numpy_integer_shapes_still_work():
    dev = t3.Device()
    t = dev.hbm.alloc((np.int64(3), np.uint8(5)), np.float32)
    assert t.shape == (3, 5) and all(type(s) is int for s in t.shape)
    assert t.reshape(np.int32(15)).shape == (15,)


@pytest.mark.parametrize("pattern, offset", [([[1, 2.5]], 0), ([[1.0, 4]], 0), ([[1, True]], 0), ([[1, 4]], 0.5)])
def test_non_integer_pattern_entries_are_refused(pattern, offset):
    t = t3.Device().hbm.alloc((8,), np.float32)
    _raises(lambda: t.ap(pattern, offset=offset), OperandError, ValueError, "ap_entry_not_integer")


def test_empty_pattern_dims_and_zero_size_get_are_refused():
    dev = t3.Device()
    t = dev.hbm.put(np.arange(8, dtype=np.float32))
    _raises(lambda: t.ap([[1, 0]]), ShapeError, ValueError, "tensor_empty_dimension")
    _raises(lambda: t.reshape(4.0, 2), ShapeError, ValueError, "shape_not_integer")
    _raises(lambda: t[0:1].broadcast(0, 2.5), ShapeError, ValueError, "shape_not_integer")


def test_non_integer_addresses_and_names_are_refused():
    dev = t3.Device()
    _raises(lambda: dev.hbm.alloc((4,), np.float32, address=64.5), ArgumentTypeError, TypeError, "int_expected")
    _raises(lambda: dev.hbm.alloc((4,), np.float32, name=5), ArgumentTypeError, TypeError, "str_expected")
    _raises(lambda: dev.hbm.alloc((4,), np.float32, core=0.0), ArgumentTypeError, TypeError, "int_expected")
    _raises(
        lambda: t3.Program().sbuf((1, 4), np.float32, address=(0, 64.0)), ArgumentTypeError, TypeError, "int_expected"
    )
    assert dev.hbm.alloc((4,), np.float32).offset == 0


def test_nonzero_with_count_index_offset_wraps_as_documented():
    # docs/isa.md: positions + index_offset wrap as int32 (two's complement).
    dev = t3.Device()
    x = np.zeros((128, 4), np.float32)
    x[:, 1] = x[:, 3] = 1.0
    p = t3.Program()
    s = p.sbuf((128, 4), np.float32)
    d = p.sbuf((128, 5), np.int32)
    p.memset(dst=d, value=0, engine="gpsimd")
    p.dma_copy(dst=s, src=dev.hbm.put(x))
    p.nonzero_with_count(dst=d, src=s, index_offset=2**31 - 1)
    dev.run(p)
    want = (np.array([1, 3], np.int64) + 2**31 - 1 + 2**31) % 2**32 - 2**31
    np.testing.assert_array_equal(dev.read(d)[0], [want[0], want[1], -1, -1, 2])
