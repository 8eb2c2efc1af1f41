"""v4 tensor indirection (`tile.indirect(index, num_elem)`) on compute operands: gathers and
scatters of free-dim columns at run-time offsets, `index_i = index[i % G, i // G]` with G = 16 on
Vector/Scalar/GpSimd and 32 on Tensor, and its quadrant / operand rules.

References are numpy fancy indexing written here; copies are compared bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, assert_bits_equal, random_bits


def _cols(idx: np.ndarray, n: int, g: int) -> np.ndarray:
    """The column offsets an index tile gives: element i = idx[i % g, i // g]."""
    return np.array([idx[i % g, i // g] for i in range(n)], dtype=np.int64)


def _load(p: t3.Program, dev: t3.Device, a: np.ndarray) -> t3.Tensor:
    t = p.sbuf(a.shape, a.dtype)
    p.dma_copy(dst=t, src=dev.hbm.put(a))
    return t


@pytest.mark.parametrize("engine", ["vector", "scalar", "gpsimd"])
def test_gather_columns_with_tensor_copy(dev, rng, engine):
    data = random_bits(rng, (128, 64), np.float32)
    idx = rng.integers(0, 64, size=(16, 3)).astype(np.int32)
    n = 40
    out = dev.hbm.alloc((128, n), np.float32)
    p = t3.Program()
    dt, it = _load(p, dev, data), _load(p, dev, idx)
    o = p.sbuf((128, n), np.float32)
    p.tensor_copy(dst=o, src=dt.indirect(it, num_elem=n), engine=engine)
    p.dma_copy(dst=out, src=o)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), np.ascontiguousarray(data[:, _cols(idx, n, 16)]))


def test_uint16_index_tile_gathers_and_other_offsets_refuse_it(dev, rng):
    """TI index tiles may be uint16 (the vendor's TI tutorial uses them); DMA offsets may not."""
    data = random_bits(rng, (128, 300), np.float32)
    idx = np.array([[299, 0], [7, 256]] * 8, dtype=np.uint16)  # (16, 2): values above 255
    n = 32
    out = dev.hbm.alloc((128, n), np.float32)
    p = t3.Program()
    dt, it = _load(p, dev, data), _load(p, dev, idx)
    o = p.sbuf((128, n), np.float32)
    p.tensor_copy(dst=o, src=dt.indirect(it, num_elem=n))
    p.dma_copy(dst=out, src=o)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), np.ascontiguousarray(data[:, _cols(idx, n, 16)]))
    table = dev.hbm.alloc((8, 8), np.float32)
    with pytest.raises(t3.DtypeError, match="int32 or uint32"):
        p.dma_copy(
            dst=p.sbuf((4, 8), np.float32), src=table.ap([[8, 4], [1, 8]], vector_offset=p.sbuf((4, 1), np.uint16))
        )


def test_scatter_columns_with_indirect_dst(dev, rng):
    src = rng.standard_normal((64, 32)).astype(np.float32)
    idx = rng.permutation(100)[:32].astype(np.uint32).reshape(2, 16).T.copy()  # (16, 2), unique
    old = rng.standard_normal((64, 100)).astype(np.float32)
    out = dev.hbm.alloc((64, 100), np.float32)
    p = t3.Program()
    st, it, ot = _load(p, dev, src), _load(p, dev, idx), _load(p, dev, old)
    p.tensor_scalar(dst=ot.indirect(it, num_elem=32), data=st, op0="multiply", operand0=3.0)
    p.dma_copy(dst=out, src=ot)
    dev.run(p)
    want = old.copy()
    want[:, _cols(idx, 32, 16)] = src * np.float32(3.0)
    assert_bits_equal(dev.hbm.get(out), want)


def test_activation_with_indirect_input_on_partial_partitions(dev, rng):
    data = rng.standard_normal((64, 48)).astype(np.float32)
    idx = rng.integers(0, 48, size=(32, 1)).astype(np.int32)
    out = dev.hbm.alloc((32, 16), np.float32)
    p = t3.Program()
    dt = _load(p, dev, data)
    it = p.sbuf((64, 1), np.int32)
    p.dma_copy(dst=it[32:64], src=dev.hbm.put(idx))
    o = p.sbuf((64, 16), np.float32)
    # input partitions 32..63, index view starting on the same partition (a quadrant boundary)
    p.activation(dst=o[32:64], op="copy", data=dt[32:64].indirect(it[32:64], num_elem=16), scale=2.0)
    p.dma_copy(dst=out, src=o[32:64])
    dev.run(p)
    want = data[32:64][:, _cols(idx, 16, 16)] * np.float32(2.0)
    assert_bits_equal(dev.hbm.get(out), want.astype(np.float32))


def test_matmul_with_indirect_stationary_columns(dev, rng):
    """TensorE reads index[i % 32, i // 32]: gather 48 stationary columns (M) from a (128, 80) tile."""
    base = rng.integers(-4, 5, size=(128, 80)).astype(BF16)
    mov = rng.integers(-4, 5, size=(128, 16)).astype(BF16)
    idx = rng.integers(0, 80, size=(32, 2)).astype(np.int32)
    out = dev.hbm.alloc((48, 16), np.float32)
    p = t3.Program()
    bt, mt = _load(p, dev, base), _load(p, dev, mov)
    it = p.sbuf((128, 2), np.int32)
    p.dma_copy(dst=it[0:32], src=dev.hbm.put(idx))
    acc = p.psum((48, 16), np.float32)
    p.nc_matmul(dst=acc, stationary=bt.indirect(it[0:32], num_elem=48), moving=mt)
    res = p.sbuf((48, 16), np.float32)
    p.tensor_copy(dst=res, src=acc)
    p.dma_copy(dst=out, src=res)
    dev.run(p)
    st = base.astype(np.float32)[:, _cols(idx, 48, 32)]
    want = st.T.astype(np.float64) @ mov.astype(np.float64)  # small integers: exact in fp32
    np.testing.assert_array_equal(dev.hbm.get(out), want.astype(np.float32))


def test_indirection_rules(dev):
    p = t3.Program()
    data = p.sbuf((128, 64), np.float32)
    idx = p.sbuf((128, 4), np.int32)
    o = p.sbuf((128, 32), np.float32)
    with pytest.raises(t3.PartitionError, match="quadrant"):
        p.tensor_copy(dst=o[0:32], src=data[0:32].indirect(idx[16:48], num_elem=32))
    with pytest.raises(t3.PartitionError, match="same partition as its index"):
        p.tensor_copy(dst=o[32:64], src=data[32:64].indirect(idx[0:32], num_elem=32))
    with pytest.raises(t3.PartitionError, match="dst's index"):
        p.tensor_copy(dst=o[0:32].indirect(idx[32:64], num_elem=32), src=data[0:32, 0:32])
    with pytest.raises(t3.ShapeError, match="index view needs"):
        p.tensor_copy(dst=o, src=data.indirect(idx[0:8], num_elem=32))
    with pytest.raises(t3.OperandError, match="only on dst, data1"):
        p.tensor_tensor(dst=o, data1=data[:, 0:32], data2=data.indirect(idx, num_elem=32), op="add")
    with pytest.raises(t3.MemorySpaceError, match="PSUM"):
        ps = p.psum((128, 64), np.float32)
        p.activation(dst=ps.indirect(idx, num_elem=32), op="copy", data=data[:, 0:32])
    with pytest.raises(t3.OperandError, match="does not support tensor indirection"):
        p.memset(dst=o.indirect(idx, num_elem=32), value=1.0)
    with pytest.raises(t3.OperandError, match="compute operands"):
        p.dma_copy(dst=o, src=data.indirect(idx, num_elem=32))
    with pytest.raises(t3.DtypeError, match="fp16, bf16 or fp8"):
        p.nc_matmul(
            dst=p.psum((32, 16), np.float32),
            stationary=data.indirect(idx[0:32], num_elem=32),
            moving=p.sbuf((128, 16), np.float32),
        )


def test_indirect_index_out_of_range_is_an_address_error(dev):
    p = t3.Program()
    data = p.sbuf((16, 8), np.float32)
    idx = p.sbuf((16, 1), np.int32)
    p.memset(dst=idx, value=8.0)
    p.tensor_copy(dst=p.sbuf((16, 4), np.float32), src=data.indirect(idx, num_elem=4))
    with pytest.raises(t3.AddressError, match="outside 0..8") as e:
        dev.run(p)
    assert e.value.operand == "src"


def test_indirect_write_races_over_the_whole_tile(dev):
    """An indirect dst may touch any column: an unsynchronised reader of another column races."""
    p = t3.Program(sync="manual")
    data = p.sbuf((16, 8), np.float32)
    idx = p.sbuf((16, 1), np.int32)
    p.tensor_copy(dst=data.indirect(idx, num_elem=1), src=p.sbuf((16, 1), np.float32), engine="vector")
    p.tensor_copy(dst=p.sbuf((16, 1), np.float32), src=data[:, 7:8], engine="gpsimd")
    with pytest.raises(t3.RaceError):
        dev.run(p)


def test_indirect_text_and_binary_round_trip():
    p = t3.Program(sync="manual")
    data = p.sbuf((128, 64), BF16)
    idx = p.sbuf((128, 4), np.uint32)
    p.tensor_copy(dst=p.sbuf((128, 32), BF16), src=data.indirect(idx, num_elem=32), engine="gpsimd")
    text = p.to_text()
    assert "@i(sbuf:uint32[0:128]+" in text
    assert t3.Program.from_text(text) == p
    assert t3.Program.decode(p.encode()) == p
