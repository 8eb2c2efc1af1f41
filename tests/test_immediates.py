"""Integer immediates: operands of kind f32 / tensor_or_f32 carry either an fp32 value or an exact
32-bit integer (docs/encoding.md). memset of integer dtypes and bitwise tensor_scalar use the
integer exactly; arithmetic converts it to fp32 (signed int32, RNE). Text prints integers without a
decimal point; binary uses tag 3; both round-trip.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, assert_bits_equal, random_bits, run_op

F32 = np.float32


@pytest.mark.parametrize(
    "dt,value",
    [
        (np.int32, 123456789),  # not representable in fp32 (would be 123456792)
        (np.int32, -2147483648),
        (np.int32, 2147483647),
        (np.uint32, 0xFFFFFFFF),
        (np.uint32, 4294967041),
        (np.int16, -32768),
        (np.uint8, 255),
        (np.int8, -1),
    ],
    ids=str,
)
@pytest.mark.parametrize("engine", ["vector", "gpsimd"])
def test_memset_integer_immediate_is_exact(dev, dt, value, engine):
    def body(p, out):
        p.memset(dst=out, value=value, engine=engine)

    (got,) = run_op(dev, [], [((64, 10), dt)], body)
    assert_bits_equal(got, np.full((64, 10), value, np.int64).astype(dt))


def test_memset_int32_word_and_float_dtypes(dev):
    def body(p, a, b, c):
        p.memset(dst=a, value=0xFFFFFFFF)  # a 32-bit word: all ones in an int32 tile
        p.memset(dst=b, value=123456789)  # float tile: fp32 conversion with RNE
        p.memset(dst=c, value=-3)

    a, b, c = run_op(dev, [], [((8, 4), np.int32), ((8, 4), F32), ((8, 4), BF16)], body)
    assert_bits_equal(a, np.full((8, 4), -1, np.int32))
    assert_bits_equal(b, np.full((8, 4), 123456792.0, F32))
    assert_bits_equal(c, np.full((8, 4), -3, BF16))


@pytest.mark.parametrize("dt,value", [(np.int8, 128), (np.uint8, -1), (np.uint16, 65536), (np.int16, 40000)], ids=str)
def test_memset_integer_out_of_range(dev, dt, value):
    with pytest.raises(t3.OperandError, match="not an integer in range"):
        run_op(dev, [], [((8, 4), dt)], lambda p, o: p.memset(dst=o, value=value))


def test_integer_immediate_beyond_32_bits_rejected(dev):
    with pytest.raises(t3.OperandError, match="does not fit 32 bits"):
        run_op(dev, [], [((8, 4), np.int32)], lambda p, o: p.memset(dst=o, value=1 << 32))


@pytest.mark.parametrize(
    "dt,op0,k0,op1,k1",
    [
        (np.uint32, "bitwise_and", 0xFFFFFFFF, "bitwise_xor", 0x80000001),
        (np.uint32, "bitwise_or", 0x7FFFFFFF, None, None),
        (np.int32, "bitwise_xor", 0xDEADBEEF, "bitwise_and", 0x0F0F0F0F),
        (np.int32, "bitwise_and", -2147483648, None, None),
        (np.uint16, "bitwise_xor", 0xFFFF, None, None),
    ],
    ids=str,
)
def test_tensor_scalar_bitwise_integer_immediates_exact(dev, rng, dt, op0, k0, op1, k1):
    x = random_bits(rng, (128, 16), dt)

    def body(p, xt, out):
        p.tensor_scalar(dst=out, data=xt, op0=op0, operand0=k0, op1=op1, operand1=k1)

    (got,) = run_op(dev, [x], [(x.shape, dt)], body)
    fns = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}
    w = x.astype(np.int64).astype(np.uint32)
    r = fns[op0](w, np.uint32(k0 & 0xFFFFFFFF))
    if op1:
        r = fns[op1](r, np.uint32(k1 & 0xFFFFFFFF))
    assert_bits_equal(got, r.astype(dt))


def test_arithmetic_converts_integer_immediates_to_fp32(dev, rng):
    x = rng.standard_normal((32, 8)).astype(F32)

    def body(p, xt, o1, o2):
        p.tensor_scalar(dst=o1, data=xt, op0="add", operand0=3, op1="multiply", operand1=-2)
        p.tensor_scalar(dst=o2, data=xt, op0="add", operand0=16777217)  # 2^24 + 1 -> 2^24 (RNE)

    o1, o2 = run_op(dev, [x], [((32, 8), F32), ((32, 8), F32)], body)
    assert_bits_equal(o1, ((x + F32(3)) * F32(-2)).astype(F32))
    assert_bits_equal(o2, (x + F32(16777216.0)).astype(F32))


@pytest.mark.parametrize(
    "value,printed",
    [(123456789, "123456789"), (-1, "-1"), (0xFFFFFFFF, "-1"), (0x80000000, "-2147483648"), (0, "0"), (2.0, "2.0")],
    ids=str,
)
def test_integer_immediates_text_and_binary_round_trip(value, printed):
    p = t3.Program(sync="manual")
    t = p.sbuf((128, 4), np.uint32)
    p.memset(dst=t, value=value)
    p.tensor_scalar(dst=t, data=t, op0="bitwise_and", operand0=value)
    text = p.to_text()
    assert re.findall(r"(?:value|operand0)=(\S+)", text) == [printed, printed]
    assert t3.Program.from_text(text) == p
    assert t3.Program.decode(p.encode()) == p


def test_integer_immediates_parse_from_text():
    line = "memset.vector dst=sbuf:int32[0:32]+0[[1,4]] value={}"
    for src, want in [("0xffffffff", "-1"), ("4294967295", "-1"), ("-7", "-7"), ("1e3", "1000.0"), ("3.0", "3.0")]:
        p = t3.Program.from_text(line.format(src))
        assert f"value={want}" in p.to_text(), (src, p.to_text())
    with pytest.raises(t3.AsmSyntaxError, match="32 bits"):
        t3.Program.from_text(line.format("4294967296"))


def test_binary_integer_immediate_uses_tag_3():
    p = t3.Program(sync="manual")
    p.memset(dst=p.sbuf((8, 4), np.int32), value=0x01020304)
    q = t3.Program(sync="manual")
    q.memset(dst=q.sbuf((8, 4), np.int32), value=float(0x01020304))
    a, b = p.encode(), q.encode()
    assert bytes([3, 4, 3, 2, 1]) in a  # tag 3, then the i32 little-endian
    assert bytes([2]) + np.float32(0x01020304).tobytes() in b  # tag 2, then the fp32 bits
