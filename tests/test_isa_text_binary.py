"""Text assembly and binary encoding round trips, including dynamic access patterns (scalar and
vector offsets), registers and branches, and the decoder's / parser's refusal of malformed input."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16


def _program() -> t3.Program:
    dev = t3.Device()
    table = dev.hbm.alloc((100, 32), np.float32)
    t16 = dev.hbm.alloc((64, 16), BF16)
    p = t3.Program(core=3, sync="manual")
    it = p.sbuf((16, 1), np.int32)
    iu = p.sbuf((32, 1), np.uint32)
    k = p.sbuf((1, 1), np.uint32)
    g = p.sbuf((16, 32), np.float32)
    r = p.register_alloc(5, engine="sync")
    p.register_op(dst=r, src=r, op="left_shift", imm=-3, engine="sync")
    p.dma_copy(dst=g, src=table.ap([[32, 16], [1, 32]], vector_offset=it), oob_mode="skip", engine="gpsimd")
    p.dma_copy(dst=g[0:1], src=table.ap([[32, 1], [1, 32]], scalar_offset=r), engine="sync", signal=(1, 1))
    p.dma_copy(dst=g[0:1], src=table.ap([[32, 1], [1, 32]], scalar_offset=k, indirect_dim=0), dge_mode="swdge")
    p.dma_compute(
        dst=table.ap([[32, 16], [1, 32]], vector_offset=it),
        src0=table.ap([[32, 16], [1, 32]], vector_offset=it),
        src1=g,
    )
    p.dma_transpose(dst=p.sbuf((16, 32), BF16), src=t16.ap([[16, 32], [1, 16]], vector_offset=iu), oob_mode="skip")
    p.register_load(dst=r, src=k, engine="vector", wait=[(1, 1)])
    p.scalar_store(dst=p.sbuf((1, 1), np.int32), value=r, engine="scalar")
    p.branch(target=len(p) + 1, cmp="ge", reg=r, imm=-7, engine="vector", name="loop.top")
    p.branch(target=0, engine="sync")
    return p


def test_text_round_trip_with_dynamic_patterns_and_branches():
    p = _program()
    text = p.to_text()
    assert "@v(sbuf:int32[0:16]+" in text and "@s(r0,32,100)" in text and "branch.vector" in text
    q = t3.Program.from_text(text)
    assert q == p
    assert q.to_text() == text


def test_binary_round_trip_with_dynamic_patterns_and_branches():
    p = _program()
    b = p.encode()
    q = t3.Program.decode(b)
    assert q == p
    assert q.encode() == b
    assert q.to_text() == p.to_text()


def test_static_programs_keep_the_version_1_layout():
    """A static access pattern still encodes its flags byte as 0 (the former reserved byte)."""
    dev = t3.Device()
    h = dev.hbm.alloc((4, 8), np.float32)
    p = t3.Program(sync="manual")
    p.dma_copy(dst=p.sbuf((4, 8), np.float32), src=h)
    b = p.encode()
    assert b[:4] == b"T3EP" and struct.unpack_from("<H", b, 4)[0] == 1
    # instruction header (12 bytes incl. n_wait/n_signal) + tag; tensor: mem, dtype, start, flags
    ap0 = 12 + 10 + 1
    assert b[ap0 + 3] == 0


def test_decoder_rejects_unknown_pattern_flags():
    dev = t3.Device()
    h = dev.hbm.alloc((4, 8), np.float32)
    p = t3.Program(sync="manual")
    p.dma_copy(dst=p.sbuf((4, 8), np.float32), src=h)
    b = bytearray(p.encode())
    b[12 + 10 + 1 + 3] = 2
    with pytest.raises(t3.DecodeError, match="flags"):
        t3.Program.decode(bytes(b))


def test_decoder_rejects_truncated_dynamic_part():
    p = _program()
    b = p.encode()
    with pytest.raises(t3.DecodeError):
        t3.Program.decode(b[:-3])


@pytest.mark.parametrize(
    "line,err",
    [
        ("dma_copy.sync dst=sbuf:float32[0:1]+0[[1,8]] src=hbm:float32+0[[8,1],[1,8]]@x(r0,8,4)", "dynamic offset"),
        ("dma_copy.sync dst=sbuf:float32[0:1]+0[[1,8]] src=hbm:float32+0[[8,1],[1,8]]@s(r0,8)", "bad number"),
        (
            "dma_copy.sync dst=sbuf:float32[0:1]+0[[1,8]] src=hbm:float32+0[[8,1],[1,8]]"
            "@s(sbuf:int32[0:1]+0[[1,1]]@s(r1,1,1),8,4)",
            "itself be dynamic",
        ),
    ],
)
def test_parser_rejects_malformed_dynamic_patterns(line, err):
    with pytest.raises(t3.AsmSyntaxError, match=err):
        t3.Program.from_text(line)


def test_parsed_dynamic_pattern_is_validated():
    line = "dma_copy.sync dst=sbuf:float32[0:1]+0[[1,8]] src=hbm:float32+0[[8,1],[1,8]]@s(r64,8,4)"
    with pytest.raises(t3.OperandError, match="r64"):
        t3.Program.from_text(line)
    line = "tensor_copy.vector dst=sbuf:float32[0:1]+0[[1,8]] src=sbuf:float32[0:1]+0[[1,8]]@s(r1,8,4)"
    with pytest.raises(t3.OperandError, match="not a DMA instruction"):
        t3.Program.from_text(line)
