"""Synchronisation and error reporting.

(a) races between engines that share a tile without a semaphore, (b) deadlocks from cyclic waits,
(c) automatic synchronisation (race-free, correct, still concurrent), (d) validation errors: each
raises its specific `trn3emu.errors` class naming the operand, and the device keeps working.
"""

from __future__ import annotations

import itertools
import re

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from trn3emu import errors as E
from trn3emu.tensor import Tensor

F32 = np.float32
BF16 = ml_dtypes.bfloat16

_fill = itertools.count(1)


@pytest.fixture(scope="module")
def device() -> t3.Device:
    """One device shared by the error tests: every failure must leave it usable."""
    return t3.Device()


def assert_device_works(dev: t3.Device) -> None:
    """Run a small good program (memset -> HBM) on `dev` and check its result."""
    v = float(next(_fill))
    p = t3.Program()
    t = p.sbuf((128, 8), F32)
    p.memset(dst=t, value=v)
    out = dev.hbm.alloc((128, 8), F32)
    p.dma_copy(dst=out, src=t)
    r = dev.run(p)
    assert r.executed >= 3  # memset, DMA trigger, DMA transfer
    np.testing.assert_array_equal(dev.hbm.get(out), np.full((128, 8), v, F32))


def expect_in(msg: str, p: t3.Program, *indices: int) -> None:
    """The message names every instruction by index and full text."""
    for i in indices:
        assert f"#{i} `{p.instruction(i)}`" in msg, (i, p.instruction(i), msg)


# ==================================================================================== (a) races
def _writer_reader(sync: str, with_sem: bool):
    p = t3.Program(sync=sync)
    a = p.sbuf((128, 64), F32, name="a")
    b = p.sbuf((128, 64), F32, name="b")
    sem = p.semaphore() if with_sem else None
    w = p.memset(dst=a, value=2.5, signal=(sem, 1) if with_sem else ())
    r = p.activation(dst=b, op="copy", data=a, scale=2.0, wait=[(sem, 1)] if with_sem else ())
    return p, a, b, w, r


def test_missing_semaphore_between_engines_is_a_race_naming_both(device):
    p, _a, _b, w, r = _writer_reader("manual", with_sem=False)
    assert "vector" in p.instruction(w) and "scalar" in p.instruction(r)
    with pytest.raises(E.RaceError) as ei:
        device.run(p)
    msg = str(ei.value)
    expect_in(msg, p, w, r)
    assert "sbuf" in msg
    assert ei.value.instruction_index == r  # the later access, the one that found the race
    assert isinstance(ei.value, E.ExecutionError) and isinstance(ei.value, RuntimeError)
    assert_device_works(device)


def test_semaphore_orders_writer_and_reader(device):
    p, _a, b, w, r = _writer_reader("manual", with_sem=True)
    assert "signal=s0+1" in p.instruction(w) and "wait=s0>=1" in p.instruction(r)
    res = device.run(p)
    np.testing.assert_array_equal(device.read(b), np.full((128, 64), 5.0, F32))
    recs = {rec["index"]: rec for rec in res.trace}
    assert recs[r]["start_ns"] >= recs[w]["end_ns"]


def test_race_detection_can_be_disabled(device):
    p, *_ = _writer_reader("manual", with_sem=False)
    device.run(p, check_races=False)  # the scheduler still runs it (timing decides the order)


def test_disjoint_tiles_need_no_semaphore(device):
    p = t3.Program(sync="manual")
    a = p.sbuf((128, 64), F32)
    b = p.sbuf((128, 64), F32)
    c = p.sbuf((128, 64), F32)
    p.memset(dst=a, value=1.0)
    p.activation(dst=c, op="copy", data=b)  # b untouched by the vector engine
    device.run(p)
    # Same tile, disjoint partitions: no overlap either.
    q = t3.Program(sync="manual")
    t = q.sbuf((128, 64), F32)
    q.memset(dst=t[0:64], value=1.0)
    q.activation(dst=t[64:128], op="copy", data=t[64:128])
    device.run(q)


@pytest.mark.parametrize("issuer", ["sync", "scalar", "gpsimd"])
def test_dma_written_tile_read_without_wait_races(device, issuer):
    x = np.arange(128 * 32, dtype=F32).reshape(128, 32)
    h = device.hbm.put(x)
    p = t3.Program(sync="manual")
    a = p.sbuf((128, 32), F32)
    b = p.sbuf((128, 32), F32)
    d = p.dma_copy(dst=a, src=h, engine=issuer)
    r = p.activation(dst=b, op="copy", data=a)
    with pytest.raises(E.RaceError) as ei:
        device.run(p)
    expect_in(str(ei.value), p, d, r)
    assert_device_works(device)
    # Signalled on transfer completion and waited for: clean and correct.
    q = t3.Program(sync="manual")
    a = q.sbuf((128, 32), F32)
    b = q.sbuf((128, 32), F32)
    s = q.semaphore()
    q.dma_copy(dst=a, src=h, engine=issuer, signal=(s, 1))
    q.activation(dst=b, op="copy", data=a, wait=[(s, 1)])
    device.run(q)
    np.testing.assert_array_equal(device.read(b), x)


def test_hbm_write_then_dma_read_without_wait_races(device):
    h = device.hbm.alloc((128, 16), F32)
    out = device.hbm.alloc((128, 16), F32)
    p = t3.Program(sync="manual")
    t = p.sbuf((128, 16), F32)
    u = p.sbuf((128, 16), F32)
    p.memset(dst=t, value=7.0, signal=(0, 1))
    w = p.dma_copy(dst=h, src=t, wait=[(0, 1)])  # writes HBM on the sync queue
    r = p.dma_copy(dst=u, src=h, engine="gpsimd")  # reads it on another queue, unordered
    p.dma_copy(dst=out, src=u)
    with pytest.raises(E.RaceError) as ei:
        device.run(p)
    expect_in(str(ei.value), p, w, r)
    assert "hbm" in str(ei.value)
    assert_device_works(device)


# ================================================================================= (b) deadlock
def test_cyclic_wait_is_a_deadlock_naming_the_blocked_instructions(device):
    p = t3.Program(sync="manual")
    s1, s2 = p.semaphore(), p.semaphore()
    i = p.nop(engine="vector", wait=[(s1, 1)], signal=(s2, 1))
    j = p.nop(engine="scalar", wait=[(s2, 1)], signal=(s1, 1))
    with pytest.raises(E.DeadlockError) as ei:
        device.run(p)
    msg = str(ei.value)
    expect_in(msg, p, i, j)
    assert "s0>=1" in msg and "s1>=1" in msg
    assert isinstance(ei.value, E.ExecutionError)
    assert_device_works(device)


def test_wait_that_nothing_reaches_is_a_deadlock(device):
    p = t3.Program(sync="manual")
    s = p.semaphore()
    a = p.sbuf((128, 4), F32)
    p.memset(dst=a, value=1.0, signal=(s, 1))
    k = p.activation(dst=a, op="copy", data=a, wait=[(s, 2)])  # only one signal ever arrives
    with pytest.raises(E.DeadlockError) as ei:
        device.run(p)
    expect_in(str(ei.value), p, k)
    assert "stays 1" in str(ei.value)
    assert_device_works(device)


# ================================================================================ (c) auto sync
def test_auto_sync_makes_the_racy_programs_clean_and_correct(device):
    p, _a, b, w, r = _writer_reader("auto", with_sem=False)
    assert "wait=" not in p.to_text() and "wait=" in p.to_text(synced=True)
    res = device.run(p)
    np.testing.assert_array_equal(device.read(b), np.full((128, 64), 5.0, F32))
    recs = {rec["index"]: rec for rec in res.trace if rec["unit"] in ("vector", "scalar")}
    assert recs[r]["start_ns"] >= recs[w]["end_ns"]
    # The manual version of the same program still races (auto sync is what fixed it).
    with pytest.raises(E.RaceError):
        device.run(t3.Program.from_text(p.to_text()))


def test_auto_sync_dma_then_compute_then_dma(device):
    x = np.random.default_rng(5).standard_normal((128, 48)).astype(F32)
    h = device.hbm.put(x)
    out = device.hbm.alloc((128, 48), F32)
    p = t3.Program()  # sync="auto" is the default
    a = p.sbuf((128, 48), F32)
    b = p.sbuf((128, 48), F32)
    p.dma_copy(dst=a, src=h, engine="scalar")
    p.tensor_scalar(dst=b, data=a, op0="multiply", operand0=3.0)
    p.activation(dst=a, op="copy", data=b, bias=1.0)  # WAR on a against the DMA, RAW on b
    p.dma_copy(dst=out, src=a)
    device.run(p)
    np.testing.assert_array_equal(device.hbm.get(out), (x * F32(3.0)) + F32(1.0))


def _overlaps(iv1, iv2) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in iv1 for s2, e2 in iv2)


def test_auto_sync_keeps_independent_chains_concurrent(device):
    p = t3.Program()
    va, vb = p.sbuf((128, 256), F32), p.sbuf((128, 256), F32)
    sa, sb = p.sbuf((128, 256), F32), p.sbuf((128, 256), F32)
    p.memset(dst=va, value=1.0)
    p.memset(dst=sa, value=2.0, engine="gpsimd")
    for _ in range(3):
        p.tensor_scalar(dst=vb, data=va, op0="add", operand0=1.0)  # vector chain
        p.tensor_scalar(dst=va, data=vb, op0="multiply", operand0=2.0)
        p.activation(dst=sb, op="copy", data=sa, scale=0.5)  # scalar chain
        p.activation(dst=sa, op="copy", data=sb, bias=1.0)
    res = device.run(p)
    tr = res.trace
    iv = {u: [(r["start_ns"], r["end_ns"]) for r in tr if r["unit"] == u] for u in ("vector", "scalar")}
    assert len(iv["vector"]) == 7 and len(iv["scalar"]) == 6
    assert _overlaps(iv["vector"], iv["scalar"]), iv
    # Each chain stays ordered within its engine, and the results are right.
    v, s = 1.0, 2.0
    for _ in range(3):
        v = (v + 1.0) * 2.0
        s = s * 0.5 + 1.0
    np.testing.assert_array_equal(device.read(va), np.full((128, 256), v, F32))
    np.testing.assert_array_equal(device.read(sa), np.full((128, 256), s, F32))
    # The only cross-engine dependency (gpsimd memset -> first activation) was synchronised.
    synced = p.to_text(synced=True)
    assert synced.count("wait=") == 1, synced


def test_auto_sync_rejects_reserved_semaphores(device):
    p = t3.Program()
    p.nop(engine="vector", signal=(t3._native.AUTO_SEM_BASE, 1))
    with pytest.raises(E.SemaphoreError):
        device.run(p)
    with pytest.raises(E.SemaphoreError):
        t3.Program(sync="manual").nop(signal=(t3._native.NUM_SEMAPHORES, 1))
    assert_device_works(device)


# ============================================================================ (d) error classes
def _p() -> t3.Program:
    return t3.Program(sync="manual")


def raw_tile(mem, shape, dtype, offset=0, start=0) -> Tensor:
    """A view the allocator never checked (as a buggy front end might produce)."""
    return Tensor(mem, dtype, shape, offset=offset, start=start)


def case_tile_of_129_partitions():
    _p().sbuf((129, 4), F32)


def case_view_of_129_partitions():
    _p().memset(dst=raw_tile("sbuf", (129, 4), F32), value=0.0)


def case_view_starting_at_partition_129():
    _p().memset(dst=raw_tile("sbuf", (1, 4), F32, start=129), value=0.0)


def case_partition_range_past_128():
    _p().tensor_copy(dst=raw_tile("sbuf", (4, 4), F32), src=raw_tile("sbuf", (4, 4), F32, start=126))


def case_sbuf_access_past_256k():
    _p().memset(dst=raw_tile("sbuf", (128, 16), F32, offset=256 * 1024 - 32), value=0.0)


def case_psum_access_past_16k():
    p = _p()
    p.activation(dst=raw_tile("psum", (128, 8), F32, offset=16 * 1024 - 16), op="copy", data=p.sbuf((128, 8), F32))


def case_psum_matmul_dst_crossing_a_bank():
    p = _p()
    acc = p.psum((128, 1024), F32)  # two banks
    st = p.sbuf((128, 128), BF16)
    mv = p.sbuf((128, 512), BF16)
    p.nc_matmul(dst=acc[:, 256:768], stationary=st, moving=mv)  # bytes 1024..3072: mid-bank start


def case_matmul_int32_stationary():
    p = _p()
    p.nc_matmul(dst=p.psum((128, 128), F32), stationary=p.sbuf((128, 128), np.int32), moving=p.sbuf((128, 128), BF16))


def case_bitwise_on_float_tiles():
    p = _p()
    a, b, c = (p.sbuf((128, 8), F32) for _ in range(3))
    p.tensor_tensor(dst=c, data1=a, data2=b, op="bitwise_and")


def case_memset_dst_dtype_not_allowed_for_scale():
    p = _p()
    p.activation(dst=p.sbuf((128, 8), F32), op="copy", data=p.sbuf((128, 8), "float8_e4m3fn_x4"))


def case_matmul_stationary_in_psum():
    p = _p()
    p.nc_matmul(dst=p.psum((128, 128), F32), stationary=p.psum((128, 128), BF16), moving=p.sbuf((128, 128), BF16))


def case_tensor_tensor_both_inputs_in_psum():
    p = _p()
    p.tensor_tensor(dst=p.sbuf((128, 8), F32), data1=p.psum((128, 8), F32), data2=p.psum((128, 8), F32), op="add")


def case_gpsimd_iota_into_psum():
    p = _p()
    p.iota(dst=p.psum((128, 8), F32), pattern=[[1, 8]])


def case_gpsimd_memset_into_psum():
    p = _p()
    p.memset(dst=p.psum((128, 8), F32), value=0.0, engine="gpsimd")


def case_dma_copy_to_psum():
    p = _p()
    p.dma_copy(dst=p.psum((128, 8), F32), src=p.sbuf((128, 8), F32))


def case_64_partitions_starting_at_32():
    p = _p()
    t = p.sbuf((128, 8), F32)
    p.memset(dst=t[32:96], value=0.0)


def case_16_partitions_starting_at_8():
    p = _p()
    t = p.sbuf((128, 8), F32)
    p.tensor_copy(dst=t[0:16], src=t[8:24])


def case_sbuf_capacity():
    p = _p()
    p.sbuf((128, 64 * 1024), F32)  # exactly the 256 KiB of every partition
    p.sbuf((128, 1), F32)


def case_psum_capacity():
    p = _p()
    for _ in range(8):
        p.psum((128, 512), F32)  # one 2 KiB bank each
    p.psum((128, 1), F32)


def case_tensor_tensor_shape_mismatch():
    p = _p()
    p.tensor_tensor(dst=p.sbuf((128, 8), F32), data1=p.sbuf((128, 8), F32), data2=p.sbuf((64, 8), F32), op="add")


def case_matmul_contraction_mismatch():
    p = _p()
    p.nc_matmul(dst=p.psum((128, 64), F32), stationary=p.sbuf((128, 128), BF16), moving=p.sbuf((64, 64), BF16))


def case_activation_bias_not_a_column():
    p = _p()
    p.activation(dst=p.sbuf((128, 8), F32), op="exp", data=p.sbuf((128, 8), F32), bias=p.sbuf((128, 2), F32))


def case_unknown_enum_value():
    p = _p()
    p.activation(dst=p.sbuf((128, 8), F32), op="frobnicate", data=p.sbuf((128, 8), F32))


def case_engine_cannot_execute():
    p = _p()
    p.nc_matmul(
        dst=p.psum((128, 128), F32),
        stationary=p.sbuf((128, 128), BF16),
        moving=p.sbuf((128, 128), BF16),
        engine="vector",
    )


def case_semaphore_out_of_range():
    _p().nop(engine="vector", wait=[(t3._native.NUM_SEMAPHORES, 1)])


# (case, class, operand or None when the error is not about one operand, words the message contains)
ERROR_CASES = [
    (case_tile_of_129_partitions, E.AddressError, "shape", "129"),
    (case_view_of_129_partitions, E.AddressError, "dst", "128"),
    (case_view_starting_at_partition_129, E.AddressError, "dst", "129"),
    (case_partition_range_past_128, E.AddressError, "src", "130"),
    (case_sbuf_access_past_256k, E.AddressError, "dst", "262144"),
    (case_psum_access_past_16k, E.AddressError, "dst", "16384"),
    (case_psum_matmul_dst_crossing_a_bank, E.PsumBankError, "dst", "bank"),
    (case_matmul_int32_stationary, E.DtypeError, "stationary", "int32"),
    (case_bitwise_on_float_tiles, E.DtypeError, "dst", "bitwise"),
    (case_memset_dst_dtype_not_allowed_for_scale, E.DtypeError, "data", "float8_e4m3fn_x4"),
    (case_matmul_stationary_in_psum, E.MemorySpaceError, "stationary", "psum"),
    (case_tensor_tensor_both_inputs_in_psum, E.MemorySpaceError, "data2", "PSUM"),
    (case_gpsimd_iota_into_psum, E.MemorySpaceError, "dst", "psum"),
    (case_gpsimd_memset_into_psum, E.MemorySpaceError, "dst", "psum"),
    (case_dma_copy_to_psum, E.MemorySpaceError, "dst", "psum"),
    (case_64_partitions_starting_at_32, E.PartitionError, "dst", "start partition 32"),
    (case_16_partitions_starting_at_8, E.PartitionError, "src", "start partition 8"),
    (case_sbuf_capacity, E.CapacityError, "shape", "SBUF allocation"),
    (case_psum_capacity, E.CapacityError, "shape", "PSUM allocation"),
    (case_tensor_tensor_shape_mismatch, E.ShapeError, "data2", "64"),
    (case_matmul_contraction_mismatch, E.ShapeError, "moving", "partitions"),
    (case_activation_bias_not_a_column, E.ShapeError, "bias", "(128, 1)"),
    (case_unknown_enum_value, E.OperandError, "op", "frobnicate"),
    (case_engine_cannot_execute, E.OperandError, "engine", "vector"),
    (case_semaphore_out_of_range, E.SemaphoreError, "wait", "256"),
]


@pytest.mark.parametrize(("case", "cls", "operand", "words"), ERROR_CASES, ids=[c[0].__name__[5:] for c in ERROR_CASES])
def test_error_class_and_operand_then_device_still_works(device, case, cls, operand, words):
    with pytest.raises(t3.EmuError) as ei:
        case()
    e = ei.value
    assert type(e) is cls, f"{type(e).__name__} instead of {cls.__name__}: {e}"
    assert e.operand == operand, (e.operand, str(e))
    if e.instruction is not None:  # raised by the native validator: the message names all three
        assert "(being assembled)" in e.instruction
        assert f"operand `{operand}`" in str(e), str(e)
    assert words in str(e), str(e)
    assert re.fullmatch(r"[a-z][a-z0-9_]*", e.rule), e.rule  # a stable id, not prose
    assert isinstance(e, E.ValidationError) and isinstance(e, ValueError)
    assert_device_works(device)


def test_assembly_errors_name_the_instruction_being_assembled():
    p = _p()
    p.nop(engine="vector")
    p.nop(engine="scalar")
    with pytest.raises(E.DtypeError) as ei:
        p.nc_matmul(
            dst=p.psum((128, 128), F32), stationary=p.sbuf((128, 128), np.int32), moving=p.sbuf((128, 128), BF16)
        )
    assert ei.value.instruction_index == 2
    assert "nc_matmul" in ei.value.instruction
    assert len(p) == 2  # the rejected instruction was not appended


def test_validation_also_guards_decode_and_text(device):
    """A rule the assembler enforces holds for every entry point (text here), with the same class."""
    bad = "memset.vector dst=sbuf:float32[32:96]+0[[1,8]] value=0.0\n"
    with pytest.raises(E.PartitionError) as ei:
        t3.Program.from_text(bad)
    assert ei.value.operand == "dst" and ei.value.instruction_index == 0
    bad = "nc_matmul.tensor dst=psum:float32[0:128]+0[[1,128]] stationary=sbuf:int32[0:128]+0[[1,128]] moving=sbuf:bfloat16[0:128]+1024[[1,128]]"
    with pytest.raises(E.DtypeError) as ei:
        t3.Program.from_text(bad)
    assert ei.value.operand == "stationary"
    assert_device_works(device)


# ============================================================================== the hierarchy
VALIDATION = [
    E.ShapeError,
    E.DtypeError,
    E.MemorySpaceError,
    E.AddressError,
    E.PartitionError,
    E.PsumBankError,
    E.CapacityError,
    E.OperandError,
    E.ArgumentTypeError,
    E.SemaphoreError,
]


def test_exception_hierarchy():
    classes = [getattr(E, n) for n in E.__all__]
    expected = {"EmuError", "ValidationError", "EncodingError", "DecodeError", "AsmSyntaxError", "ExecutionError"}
    expected |= {"RaceError", "DeadlockError", "RunawayError", "ResourceError", "InternalError"}
    expected |= {"NotSupportedError"}  # the NKI front end's "not supported: <name>" (Python only)
    assert set(E.__all__) == expected | {c.__name__ for c in VALIDATION}
    for c in classes:
        assert issubclass(c, E.EmuError), c
        assert getattr(t3, c.__name__) is c  # re-exported at the top level
    for c in VALIDATION:
        assert issubclass(c, E.ValidationError) and issubclass(c, ValueError), c
    assert issubclass(E.DtypeError, TypeError)
    assert issubclass(E.AddressError, IndexError)
    assert issubclass(E.NotSupportedError, NotImplementedError)
    assert not issubclass(E.NotSupportedError, E.ValidationError)
    for c in (E.DecodeError, E.AsmSyntaxError):
        assert issubclass(c, E.EncodingError) and issubclass(c, ValueError)
    for c in (E.RaceError, E.DeadlockError, E.RunawayError):
        assert issubclass(c, E.ExecutionError) and issubclass(c, RuntimeError)
        assert not issubclass(c, ValueError)
    assert issubclass(E.InternalError, RuntimeError)
    e = E.ShapeError("m", 3, "nop.vector", "dst", "the_rule")
    assert (e.instruction_index, e.instruction, e.operand, e.rule, str(e)) == (3, "nop.vector", "dst", "the_rule", "m")


def test_raised_errors_carry_operand_and_rule():
    with pytest.raises(ValueError) as ei:  # catchable as the builtin
        case_64_partitions_starting_at_32()
    e = ei.value
    assert isinstance(e, E.PartitionError)
    assert e.operand == "dst" and "start-partition rule" in str(e)
    with pytest.raises(TypeError) as ei:
        case_bitwise_on_float_tiles()
    assert ei.value.operand == "dst" and "integer" in str(ei.value)
    with pytest.raises(IndexError):
        case_sbuf_access_past_256k()
