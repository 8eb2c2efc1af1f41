"""Sequencer registers (64 x 32-bit per engine), register/scalar load and store, register
arithmetic and runtime branches (loops) on the engine streams.

References are written here: numpy integer arithmetic (wrapping uint32), numpy casts for the
sign/zero extension of narrow dtypes, and loop results computed by plain Python loops.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3

ENGINES = ["sync", "vector", "scalar", "gpsimd", "tensor"]


def _store_regs(p: t3.Program, dev: t3.Device, regs, engine: str, dtype=np.int32):
    """register_store each register into its own (1,1) tile and copy them all to HBM."""
    tile = p.sbuf((1, len(regs)), dtype)
    for i, r in enumerate(regs):
        p.register_store(dst=tile[:, i : i + 1], src=r, engine=engine)
    out = dev.hbm.alloc((1, len(regs)), dtype)
    p.dma_copy(dst=out, src=tile)
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_register_move_then_store_each_engine(dev, engine):
    vals = [0, 1, -1, 2**31 - 1, -(2**31), 123456789]
    p = t3.Program()
    regs = [p.register_alloc(v, engine=engine) for v in vals]
    out = _store_regs(p, dev, regs, engine)
    dev.run(p)
    np.testing.assert_array_equal(dev.hbm.get(out)[0], np.array(vals, np.int32))


def test_registers_are_per_engine(dev):
    p = t3.Program()
    r = p.register_alloc()
    p.register_move(dst=r, src=7, engine="vector")
    p.register_move(dst=r, src=9, engine="scalar")
    a = _store_regs(p, dev, [r], "vector")
    b = _store_regs(p, dev, [r], "scalar")
    c = _store_regs(p, dev, [r], "gpsimd")  # never written on gpsimd: registers start at 0
    dev.run(p)
    assert dev.hbm.get(a)[0, 0] == 7 and dev.hbm.get(b)[0, 0] == 9 and dev.hbm.get(c)[0, 0] == 0


@pytest.mark.parametrize(
    "dtype,value",
    [
        (np.int8, -5),
        (np.int16, -30000),
        (np.uint8, 250),
        (np.uint16, 65000),
        (np.int32, -123456),
        (np.uint32, 0xFEDCBA98),
        (np.float32, -1.5),
        (ml_dtypes.bfloat16, 3.25),
    ],
)
def test_register_load_extends_by_kind(dev, dtype, value):
    a = np.array([[value]], dtype=dtype)
    raw = a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])[0, 0]
    if np.issubdtype(a.dtype, np.signedinteger):
        want = np.uint32(np.int64(a[0, 0]) & 0xFFFFFFFF)  # sign-extended
    else:
        want = np.uint32(raw)  # zero-extended raw bits (floats keep their pattern)
    h = dev.hbm.put(a)
    p = t3.Program()
    r = p.register_alloc()
    p.register_load(dst=r, src=h, engine="gpsimd")  # straight from HBM
    out = _store_regs(p, dev, [r], "gpsimd", np.uint32)
    dev.run(p)
    assert dev.hbm.get(out)[0, 0] == want


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint16, np.int32])
def test_register_store_truncates_to_width(dev, dtype):
    p = t3.Program()
    r = p.register_alloc(0x12345678 - 2**32 + 2**32, engine="sync")
    out = _store_regs(p, dev, [r], "sync", dtype)
    dev.run(p)
    want = np.array([0x12345678], np.uint32).astype(dtype)  # numpy truncation = keep the low bits
    assert dev.hbm.get(out)[0, 0] == want[0]


@pytest.mark.parametrize(
    "op,fn",
    [
        ("add", lambda a, b: a + b),
        ("subtract", lambda a, b: a - b),
        ("multiply", lambda a, b: a * b),
        ("bitwise_and", lambda a, b: a & b),
        ("bitwise_or", lambda a, b: a | b),
        ("bitwise_xor", lambda a, b: a ^ b),
        ("left_shift", lambda a, b: a << (b & np.uint32(31))),
        ("right_shift", lambda a, b: a >> (b & np.uint32(31))),
    ],
)
def test_register_op_wraps_like_uint32(dev, op, fn):
    cases = [(7, 5), (0x7FFFFFFF, 1), (-3, 0x10001), (123456, 33), (-(2**31), -1)]
    p = t3.Program()
    regs = []
    for a, b in cases:
        x = p.register_alloc(a, engine="vector")
        y = p.register_alloc()
        p.register_op(dst=y, src=x, op=op, imm=b, engine="vector")
        regs.append(y)
    out = _store_regs(p, dev, regs, "vector", np.uint32)
    dev.run(p)
    with np.errstate(over="ignore"):
        want = [fn(np.uint32(a & 0xFFFFFFFF), np.uint32(b & 0xFFFFFFFF)) for a, b in cases]
    np.testing.assert_array_equal(dev.hbm.get(out)[0], np.array(want, np.uint32))


def test_register_op_rejects_non_integer_ops():
    p = t3.Program()
    with pytest.raises(t3.OperandError, match="register_op supports") as e:
        p.register_op(dst=t3.Reg(0), src=t3.Reg(1), op="maximum")
    assert e.value.operand == "op"


def test_scalar_load_store_int32(dev):
    a = np.array([[-77]], np.int32)
    h = dev.hbm.put(a)
    p = t3.Program()
    t = p.sbuf((1, 1), np.int32)
    p.dma_copy(dst=t, src=h)
    r = p.register_alloc()
    p.scalar_load(dst=r, src=t, engine="scalar")
    p.register_op(dst=r, src=r, op="multiply", imm=3, engine="scalar")
    o = p.sbuf((1, 1), np.int32)
    p.scalar_store(dst=o, value=r, engine="scalar")
    out = dev.hbm.alloc((1, 1), np.int32)
    p.dma_copy(dst=out, src=o)
    dev.run(p)
    assert dev.hbm.get(out)[0, 0] == -231


def test_scalar_load_rules():
    p = t3.Program()
    with pytest.raises(t3.DtypeError):
        p.scalar_load(dst=t3.Reg(0), src=p.sbuf((1, 1), np.float32))
    with pytest.raises(t3.ShapeError, match="exactly 1 element"):
        p.register_load(dst=t3.Reg(0), src=p.sbuf((1, 2), np.int32))
    with pytest.raises(t3.ShapeError, match="exactly 1 element"):
        p.register_store(dst=p.sbuf((2, 1), np.int32), src=t3.Reg(0))
    with pytest.raises(t3.DtypeError):
        p.register_load(dst=t3.Reg(0), src=p.sbuf((1, 1), "float8_e4m3fn_x4"))
    with pytest.raises(t3.OperandError):
        t3.Reg(64)


# ------------------------------------------------------------------------------------ control flow


def test_fori_loop_on_vector_engine(dev, rng):
    """acc = 0; for i in range(n): acc += x; out = acc — a runtime loop on the vector stream."""
    n = 5
    x = rng.integers(-50, 50, size=(128, 64)).astype(np.float32)
    hx = dev.hbm.put(x)
    out = dev.hbm.alloc((128, 64), np.float32)
    p = t3.Program(sync="manual")
    loaded, done = p.semaphore(), p.semaphore()
    xt = p.sbuf((128, 64), np.float32)
    acc = p.sbuf((128, 64), np.float32)
    p.dma_copy(dst=xt, src=hx, signal=loaded)
    i = p.register_alloc(0, engine="vector")
    p.memset(dst=acc, value=0.0, engine="vector", wait=(loaded, 1))
    top = len(p)
    p.tensor_tensor(dst=acc, data1=acc, data2=xt, op="add", engine="vector")
    p.register_op(dst=i, src=i, op="add", imm=1, engine="vector")
    p.branch(target=top, cmp="lt", reg=i, imm=n, engine="vector")
    p.nop(engine="vector", signal=done)
    p.dma_copy(dst=out, src=acc, wait=(done, 1))
    res = dev.run(p)
    want = np.zeros_like(x)
    for _ in range(n):
        want = want + x
    np.testing.assert_array_equal(dev.hbm.get(out), want)
    # register_move, memset, 3 body instructions per iteration and the nop ran on the vector stream
    cols = res.trace.columns
    assert int((cols["unit"] == 1).sum()) == 3 + 3 * n
    body = cols["index"][(cols["unit"] == 1)]
    assert int((body == top).sum()) == n


def test_loop_with_register_scalar_offset_dma(dev, rng):
    """A sync-engine loop copies row i of src to row n-1-i of dst with register offsets; the
    DMA reads the register when it is triggered, not when its queue gets to it."""
    n, f = 12, 40
    src = rng.integers(0, 2**31, size=(n, f)).astype(np.int32)
    hs = dev.hbm.put(src)
    hd = dev.hbm.alloc((n, f), np.int32)
    p = t3.Program(sync="manual")
    i = p.register_alloc(0, engine="sync")
    j = p.register_alloc(n - 1, engine="sync")
    top = len(p)
    p.dma_copy(
        dst=hd.ap([[f, 1], [1, f]], scalar_offset=j, indirect_dim=0),
        src=hs.ap([[f, 1], [1, f]], scalar_offset=i, indirect_dim=0),
        engine="sync",
    )
    p.register_op(dst=i, src=i, op="add", imm=1, engine="sync")
    p.register_op(dst=j, src=j, op="subtract", imm=1, engine="sync")
    p.branch(target=top, cmp="ge", reg=j, imm=0, engine="sync")
    dev.run(p)
    np.testing.assert_array_equal(dev.hbm.get(hd), src[::-1])


def test_forward_branch_skips_instructions(dev):
    p = t3.Program(sync="manual")
    done = p.semaphore()
    t = p.sbuf((4, 4), np.float32)
    r = p.register_alloc(3, engine="gpsimd")
    p.memset(dst=t, value=1.0, engine="gpsimd")
    skip_to = len(p) + 2
    p.branch(target=skip_to, cmp="eq", reg=r, imm=3, engine="gpsimd")
    p.memset(dst=t, value=2.0, engine="gpsimd")  # skipped
    p.nop(engine="gpsimd", signal=done)
    out = dev.hbm.alloc((4, 4), np.float32)
    p.dma_copy(dst=out, src=t, wait=(done, 1))
    dev.run(p)
    np.testing.assert_array_equal(dev.hbm.get(out), np.ones((4, 4), np.float32))


def test_branch_always_to_program_end_ends_the_stream(dev):
    p = t3.Program(sync="manual")
    t = p.sbuf((4, 4), np.float32)
    p.memset(dst=t, value=1.0, engine="vector")
    p.branch(target=4, engine="vector")  # 4 == program length below
    p.memset(dst=t, value=2.0, engine="vector")
    p.nop(engine="vector")
    assert len(p) == 4
    dev.run(p)
    assert (dev.read(t) == 1.0).all()


def test_branch_target_on_another_engine_is_rejected(dev):
    p = t3.Program(sync="manual")
    p.nop(engine="vector")
    p.branch(target=0, engine="scalar")
    with pytest.raises(t3.OperandError, match="branch target 0") as e:
        dev.run(p)
    assert e.value.operand == "target"


def test_conditional_branch_needs_a_register():
    p = t3.Program(sync="manual")
    with pytest.raises(t3.OperandError, match="reg is required"):
        p.branch(target=0, cmp="lt", imm=3)


def test_auto_sync_refuses_runtime_control_flow(dev):
    p = t3.Program()  # sync="auto"
    p.branch(target=1)
    with pytest.raises(t3.OperandError, match="control flow"):
        dev.run(p)


def test_race_inside_a_loop_is_detected(dev):
    """A vector loop writes a tile that gpsimd reads without any semaphore: a race, whatever
    the iteration."""
    p = t3.Program(sync="manual")
    t = p.sbuf((8, 8), np.float32)
    u = p.sbuf((8, 8), np.float32)
    i = p.register_alloc(0, engine="vector")
    top = len(p)
    p.memset(dst=t, value=1.0, engine="vector")
    p.register_op(dst=i, src=i, op="add", imm=1, engine="vector")
    p.branch(target=top, cmp="lt", reg=i, imm=3, engine="vector")
    p.tensor_copy(dst=u, src=t, engine="gpsimd")
    with pytest.raises(t3.RaceError):
        dev.run(p)


def test_register_loop_results_are_deterministic(dev, rng):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    outs = []
    for _ in range(2):
        d = t3.Device()
        hx = d.hbm.put(x)
        out = d.hbm.alloc((32, 16), np.float32)
        p = t3.Program(sync="manual")
        s0, s1 = p.semaphore(), p.semaphore()
        xt = p.sbuf((32, 16), np.float32)
        p.dma_copy(dst=xt, src=hx, signal=s0)
        i = p.register_alloc(0, engine="scalar")
        p.nop(engine="scalar", wait=(s0, 1))
        top = len(p)
        p.activation(dst=xt, op="copy", data=xt, scale=1.1, engine="scalar")
        p.register_op(dst=i, src=i, op="add", imm=1, engine="scalar")
        p.branch(target=top, cmp="lt", reg=i, imm=4, engine="scalar")
        p.nop(engine="scalar", signal=s1)
        p.dma_copy(dst=out, src=xt, wait=(s1, 1))
        d.run(p)
        outs.append(d.hbm.get(out))
    want = x.copy()
    for _ in range(4):
        want = (want * np.float32(1.1)).astype(np.float32)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], want)


def test_hazard_0_5_while_loop_terminates(dev):
    """Hazard (NKI 0.5 fix): a while loop whose condition is reloaded from memory each iteration
    stops when the condition turns false: counter = 5; while counter: counter -= 1; total += 2."""
    p = t3.Program(sync="manual")
    cnt = p.sbuf((1, 1), np.int32)
    tot = p.sbuf((1, 1), np.int32)
    c = p.register_alloc(5, engine="gpsimd")
    t = p.register_alloc(0, engine="gpsimd")
    p.register_store(dst=cnt, src=c, engine="gpsimd")
    top = len(p)
    p.register_load(dst=c, src=cnt, engine="gpsimd")
    p.branch(target=top + 6, cmp="eq", reg=c, imm=0, engine="gpsimd")  # while counter != 0
    p.register_op(dst=c, src=c, op="subtract", imm=1, engine="gpsimd")
    p.register_store(dst=cnt, src=c, engine="gpsimd")
    p.register_op(dst=t, src=t, op="add", imm=2, engine="gpsimd")
    p.branch(target=top, engine="gpsimd")
    assert len(p) == top + 6
    p.register_store(dst=tot, src=t, engine="gpsimd")
    res = dev.run(p)
    assert dev.read(tot)[0, 0] == 10 and dev.read(cnt)[0, 0] == 0
    assert res.executed == 3 + 6 * 5 + 2 + 1


@pytest.mark.parametrize("lower,upper,step", [(0, 7, 1), (3, 20, 4), (10, -2, -3)])
def test_fori_loop_helper_visits_range(dev, rng, lower, upper, step):
    """Row i of a table is copied to row i of the output for every i in range(lower, upper, step)."""
    n, f = 24, 8
    src = rng.integers(-1000, 1000, size=(n, f)).astype(np.int32)
    hs = dev.hbm.put(src + 30)  # rows offset by 2 so negative starts stay in range
    hd = dev.hbm.put(np.zeros((n, f), np.int32))
    p = t3.Program(sync="manual")
    with p.fori_loop(lower, upper, step, engine="sync") as i:
        p.dma_copy(
            dst=hd.ap([[f, 1], [1, f]], offset=2 * f, scalar_offset=i),
            src=hs.ap([[f, 1], [1, f]], offset=2 * f, scalar_offset=i),
            engine="sync",
        )
    dev.run(p)
    want = np.zeros((n, f), np.int32)
    for k in range(lower, upper, step):
        want[k + 2] = src[k + 2] + 30
    np.testing.assert_array_equal(dev.hbm.get(hd), want)


def test_fori_loop_rules():
    p = t3.Program(sync="manual")
    with pytest.raises(t3.OperandError, match="zero times"):
        with p.fori_loop(5, 5):
            pass
    t = p.sbuf((4, 4), np.float32)
    with pytest.raises(t3.OperandError, match="not on the loop's engine"):
        with p.fori_loop(0, 3, engine="vector"):
            p.memset(dst=t, value=1.0, engine="gpsimd")


def test_register_move_from_a_register_copies_it(dev):
    p = t3.Program()
    a = p.register_alloc(-42, engine="scalar")
    b = p.register_alloc()
    p.register_move(dst=b, src=a, engine="scalar")
    assert p.instruction(len(p) - 1).startswith("register_op.scalar")
    out = _store_regs(p, dev, [b], "scalar")
    dev.run(p)
    assert dev.hbm.get(out)[0, 0] == -42


def test_register_where_a_number_is_expected_is_refused():
    p = t3.Program()
    with pytest.raises(t3.OperandError, match="not register"):
        p.register_op(dst=t3.Reg(0), src=t3.Reg(1), op="add", imm=t3.Reg(2))
