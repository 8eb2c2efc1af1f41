"""DMA instructions: dma_transpose (direct HWDGE and indirect SWDGE forms), dma_compute (sums of up
to 16 sources, near-memory SBUF read-add-write, scatter-add / gather-add), dynamic addressing
(scalar_offset from registers or tiles, vector_offset gather/scatter) with oob_mode error/skip,
descriptor-mode restrictions, and race detection of dynamic accesses.

Every expectation is an independent numpy / ml_dtypes computation written here; copies and
transposes are compared bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from conftest import BF16, assert_bits_equal, random_bits

# ------------------------------------------------------------------------------ dma_transpose


@pytest.mark.parametrize("dtype", [BF16, np.float16, np.int16, np.uint16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("f", [1, 16, 100, 128])
def test_dma_transpose_2d_hbm_to_sbuf_bit_exact(dev, rng, dtype, f):
    src = random_bits(rng, (16, f), dtype)
    h = dev.hbm.put(src)
    out = dev.hbm.alloc((f, 16), dtype)
    p = t3.Program()
    t = p.sbuf((f, 16), dtype)
    p.dma_transpose(dst=t, src=h)
    p.dma_copy(dst=out, src=t)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), np.ascontiguousarray(src.T))


def test_dma_transpose_2d_sbuf_to_sbuf_hwdge_from_scalar(dev, rng):
    src = random_bits(rng, (16, 64), BF16)
    h = dev.hbm.put(src)
    out = dev.hbm.alloc((64, 16), BF16)
    p = t3.Program()
    a = p.sbuf((16, 64), BF16)
    b = p.sbuf((64, 16), BF16)
    p.dma_copy(dst=a, src=h)
    p.dma_transpose(dst=b, src=a, dge_mode="hwdge", engine="scalar")
    p.dma_copy(dst=out, src=b)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), np.ascontiguousarray(src.T))


def test_dma_transpose_default_dge_has_no_hwdge_shape_rules(dev, rng):
    # dge_mode unknown (the default) lets the compiler pick the lowering: a 128x128 SBUF->SBUF
    # transpose (as public attention kernels issue) is valid there; only hwdge needs shape[0] == 16.
    src = random_bits(rng, (128, 128), BF16)
    h = dev.hbm.put(src)
    out = dev.hbm.alloc((128, 128), BF16)
    p = t3.Program()
    a = p.sbuf((128, 128), BF16)
    b = p.sbuf((128, 128), BF16)
    p.dma_copy(dst=a, src=h)
    p.dma_transpose(dst=b, src=a)
    p.dma_copy(dst=out, src=b)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), np.ascontiguousarray(src.T))
    with pytest.raises(t3.ShapeError, match=r"src.shape\[0\] == 16"):
        t3.Program().dma_transpose(dst=p.sbuf((128, 128), BF16), src=a, dge_mode="hwdge", engine="scalar")


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32], ids=lambda d: np.dtype(d).name)
def test_dma_transpose_4byte_with_default_dge_is_bit_exact(dev, rng, dtype):
    # 4-byte elements: the arch guide allows them; the API's 2-byte rule binds the DGE forms only
    src = random_bits(rng, (256, 96), dtype)
    out = dev.hbm.alloc((96, 256), dtype)
    p = t3.Program()
    t = p.sbuf((96, 256), dtype)
    p.dma_transpose(dst=t, src=dev.hbm.put(src))
    p.dma_copy(dst=out, src=t)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), np.ascontiguousarray(src.T))


@pytest.mark.parametrize(
    "shape,axes",
    [((2, 8, 64), (2, 1, 0)), ((16, 3, 128), (2, 1, 0)), ((4, 2, 4, 32), (3, 1, 2, 0)), ((1, 3, 16, 8), (3, 1, 2, 0))],
)
def test_dma_transpose_3d_4d_permutations(dev, rng, shape, axes):
    src = random_bits(rng, shape, np.float16)
    h = dev.hbm.put(src)
    want = np.ascontiguousarray(np.transpose(src, axes))
    out = dev.hbm.alloc(want.shape, np.float16)
    p = t3.Program()
    t = p.sbuf(want.shape, np.float16)
    p.dma_transpose(dst=t, src=h, axes=axes)
    p.dma_copy(dst=out, src=t)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), want)


def test_dma_transpose_rules(dev):
    p = t3.Program()
    h16 = dev.hbm.alloc((16, 32), BF16)
    with pytest.raises(t3.ShapeError, match=r"src.shape\[0\] == 16"):
        p.dma_transpose(dst=p.sbuf((32, 8), BF16), src=dev.hbm.alloc((8, 32), BF16), dge_mode="hwdge", engine="scalar")
    with pytest.raises(t3.DtypeError, match="2-byte"):
        p.dma_transpose(
            dst=p.sbuf((32, 16), np.float32), src=dev.hbm.alloc((16, 32), np.float32), dge_mode="hwdge", engine="sync"
        )
    with pytest.raises(t3.DtypeError):
        p.dma_transpose(dst=p.sbuf((32, 16), np.int8), src=dev.hbm.alloc((16, 32), np.int8))
    with pytest.raises(t3.DtypeError, match="same dtype"):
        p.dma_transpose(dst=p.sbuf((32, 16), np.float16), src=h16)
    with pytest.raises(t3.ShapeError, match="permuted src shape"):
        p.dma_transpose(dst=p.sbuf((16, 32), BF16), src=h16)
    with pytest.raises(t3.OperandError, match="documented permutation") as e:
        p.dma_transpose(dst=p.sbuf((32, 16), BF16), src=h16, axes=(0, 1))
    assert e.value.operand == "axes"
    with pytest.raises(t3.ShapeError, match="exceeds 128"):
        p.dma_transpose(dst=p.sbuf((128, 16, 2), BF16), src=dev.hbm.alloc((2, 16, 129), BF16))
    with pytest.raises(t3.ShapeError, match=r"\{1,2,4,8,16\}"):
        p.dma_transpose(
            dst=p.sbuf((32, 16, 3), BF16), src=dev.hbm.alloc((3, 16, 32), BF16), dge_mode="hwdge", engine="scalar"
        )
    with pytest.raises(t3.ShapeError, match="% 16"):
        p.dma_transpose(
            dst=p.sbuf((32, 4, 2), BF16), src=dev.hbm.alloc((2, 4, 32), BF16), dge_mode="hwdge", engine="sync"
        )
    with pytest.raises(t3.OperandError, match="hardware DGE"):
        p.dma_transpose(dst=p.sbuf((32, 16), BF16), src=h16, dge_mode="swdge")
    with pytest.raises(t3.OperandError, match="sync or scalar"):
        p.dma_transpose(dst=p.sbuf((32, 16), BF16), src=h16, dge_mode="hwdge", engine="vector")
    with pytest.raises(t3.MemorySpaceError):
        p.dma_transpose(dst=dev.hbm.alloc((32, 16), BF16), src=h16)


def test_dma_transpose_indirect_gather(dev, rng):
    """SWDGE transpose: flat = indices.T.flatten()[:n]; dst = src[flat, :].T."""
    table = random_bits(rng, (100, 48), BF16)
    idx = rng.integers(0, 100, size=(32, 1)).astype(np.uint32)
    ht, hi = dev.hbm.put(table), dev.hbm.put(idx)
    out = dev.hbm.alloc((48, 32), BF16)
    p = t3.Program()
    it = p.sbuf((32, 1), np.uint32)
    t = p.sbuf((48, 32), BF16)
    p.dma_copy(dst=it, src=hi)
    p.dma_transpose(dst=t, src=ht.ap([[48, 32], [1, 48]], vector_offset=it), engine="gpsimd")
    p.dma_copy(dst=out, src=t)
    dev.run(p)
    flat = idx.T.flatten()[:32]
    assert_bits_equal(dev.hbm.get(out), np.ascontiguousarray(table[flat, :].T))


def test_hazard_0_5_gather_transpose_oob_keeps_dst(dev, rng):
    """Hazard (NKI 0.5 fix): an out-of-bounds gather index must not overwrite valid dst data
    with zeros; the skipped row's column of dst keeps its old contents."""
    table = random_bits(rng, (40, 16), np.float16)
    idx = rng.integers(0, 40, size=(16, 1)).astype(np.uint32)
    idx[[3, 11], 0] = [40, 0xFFFFFFFF]
    old = random_bits(rng, (16, 16), np.float16)
    ht, hi, ho = dev.hbm.put(table), dev.hbm.put(idx), dev.hbm.put(old)
    out = dev.hbm.alloc((16, 16), np.float16)
    p = t3.Program()
    it = p.sbuf((16, 1), np.uint32)
    t = p.sbuf((16, 16), np.float16)
    p.dma_copy(dst=it, src=hi)
    p.dma_copy(dst=t, src=ho)
    p.dma_transpose(dst=t, src=ht.ap([[16, 16], [1, 16]], vector_offset=it), oob_mode="skip")
    p.dma_copy(dst=out, src=t)
    dev.run(p)
    want = old.copy()
    for r in range(16):
        if idx[r, 0] < 40:
            want[:, r] = table[idx[r, 0], :]
    assert_bits_equal(dev.hbm.get(out), want)


def test_dma_transpose_indirect_oob_error(dev):
    table = dev.hbm.put(np.zeros((20, 16), np.float16))
    hi = dev.hbm.put(np.full((16, 1), 20, np.uint32))
    p = t3.Program()
    it = p.sbuf((16, 1), np.uint32)
    p.dma_copy(dst=it, src=hi)
    p.dma_transpose(dst=p.sbuf((16, 16), np.float16), src=table.ap([[16, 16], [1, 16]], vector_offset=it))
    with pytest.raises(t3.AddressError, match="outside 0..20"):
        dev.run(p)


def test_dma_transpose_indirect_rules(dev):
    p = t3.Program()
    table = dev.hbm.alloc((64, 16), BF16)
    i2 = p.sbuf((16, 2), np.uint32)
    with pytest.raises(t3.ShapeError, match="exactly 128"):
        p.dma_transpose(dst=p.sbuf((16, 32), BF16), src=table.ap([[16, 32], [1, 16]], vector_offset=i2))
    i32 = p.sbuf((32, 1), np.int32)
    with pytest.raises(t3.DtypeError, match="uint32"):
        p.dma_transpose(dst=p.sbuf((16, 32), BF16), src=table.ap([[16, 32], [1, 16]], vector_offset=i32))
    iu = p.sbuf((32, 1), np.uint32)
    with pytest.raises(t3.ShapeError, match="% 16"):
        p.dma_transpose(dst=p.sbuf((16, 24), BF16), src=table.ap([[16, 24], [1, 16]], vector_offset=iu))
    with pytest.raises(t3.OperandError, match="swdge"):
        p.dma_transpose(
            dst=p.sbuf((16, 32), BF16),
            src=table.ap([[16, 32], [1, 16]], vector_offset=iu),
            dge_mode="hwdge",
            engine="sync",
        )


# ---------------------------------------------------------------------------- dma_compute


@pytest.mark.parametrize("n", [1, 2, 5, 16])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
def test_dma_compute_sum_of_sources(dev, rng, n, dtype):
    xs = [rng.standard_normal((64, 40)).astype(dtype) for _ in range(n)]
    hs = [dev.hbm.put(x) for x in xs]
    out = dev.hbm.alloc((64, 40), dtype)
    p = t3.Program()
    srcs = {}
    for k, h in enumerate(hs):
        if k % 2:  # mix SBUF and HBM sources
            t = p.sbuf((64, 40), dtype)
            p.dma_copy(dst=t, src=h)
            srcs[f"src{k}"] = t
        else:
            srcs[f"src{k}"] = h
    d = p.sbuf((64, 40), dtype)
    p.dma_compute(dst=d, **srcs)
    p.dma_copy(dst=out, src=d)
    dev.run(p)
    acc = xs[0].astype(np.float32)
    for x in xs[1:]:
        acc = (acc + x.astype(np.float32)).astype(np.float32)  # fp32, in source order
    assert_bits_equal(dev.hbm.get(out), acc.astype(dtype))


def test_dma_compute_hbm_to_hbm_casts_once(dev, rng):
    a = rng.standard_normal((8, 33)).astype(np.float32)
    b = rng.standard_normal((8, 33)).astype(BF16)
    ha, hb = dev.hbm.put(a), dev.hbm.put(b)
    out = dev.hbm.alloc((8, 33), BF16)
    p = t3.Program()
    p.dma_compute(dst=out, src0=ha, src1=hb)
    dev.run(p)
    want = (a + b.astype(np.float32)).astype(BF16)
    assert_bits_equal(dev.hbm.get(out), want)


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("a_in", ["hbm", "sbuf"])
def test_sbuf_read_add_write(dev, rng, dtype, a_in):
    """Near-memory B += A (v4): B in SBUF, A in HBM or SBUF, same dtype, bf16 or fp32."""
    b0 = rng.standard_normal((128, 256)).astype(dtype)
    a = rng.standard_normal((128, 256)).astype(dtype)
    hb, ha = dev.hbm.put(b0), dev.hbm.put(a)
    out = dev.hbm.alloc((128, 256), dtype)
    p = t3.Program()
    b = p.sbuf((128, 256), dtype)
    p.dma_copy(dst=b, src=hb)
    src = ha
    if a_in == "sbuf":
        src = p.sbuf((128, 256), dtype)
        p.dma_copy(dst=src, src=ha)
    p.dma_compute(dst=b, src0=b, src1=src)
    p.dma_copy(dst=out, src=b)
    dev.run(p)
    want = (b0.astype(np.float32) + a.astype(np.float32)).astype(dtype)
    assert_bits_equal(dev.hbm.get(out), want)


def test_concurrent_read_add_write_into_one_tile(dev, rng):
    """16 read-add-writes from every issuing engine into the same SBUF tile: all sums land (no
    lost update), no race is reported between them, and the bits are the same run after run."""
    parts = [rng.integers(-1000, 1000, size=(128, 64)).astype(np.float32) for _ in range(16)]
    engines = ["sync", "scalar", "gpsimd", "vector", "tensor"]
    results = []
    for _ in range(2):
        d = t3.Device()
        hs = [d.hbm.put(x) for x in parts]
        out = d.hbm.alloc((128, 64), np.float32)
        p = t3.Program()
        acc = p.sbuf((128, 64), np.float32)
        p.memset(dst=acc, value=0.0)
        for k, h in enumerate(hs):
            p.dma_compute(dst=acc, src0=acc, src1=h, engine=engines[k % 5])
        p.dma_copy(dst=out, src=acc)
        d.run(p)
        results.append(d.hbm.get(out))
    want = np.sum(np.stack(parts), axis=0, dtype=np.float64).astype(np.float32)  # exact: small integers
    assert_bits_equal(results[0], want)
    assert_bits_equal(results[1], results[0])


def test_dma_compute_rules(dev):
    p = t3.Program()
    a = p.sbuf((4, 8), np.float32)
    b = p.sbuf((4, 8), np.float32)
    with pytest.raises(t3.OperandError, match="without gaps") as e:
        p.dma_compute(dst=a, src0=b, src2=b)
    assert e.value.operand == "src1"
    with pytest.raises(t3.OperandError, match="add only"):
        p.dma_compute(dst=a, src0=b, src1=b, reduce_op="multiply")
    with pytest.raises(t3.OperandError, match="no scale mode"):
        p.dma_compute(dst=a, src0=b, src1=b, scale=2.0)
    with pytest.raises(t3.OperandError, match="unique_indices"):
        p.dma_compute(dst=a, src0=b, unique_indices=False)
    with pytest.raises(t3.ShapeError, match="element count"):
        p.dma_compute(dst=a, src0=b, src1=p.sbuf((4, 9), np.float32))
    i = p.sbuf((4, 8), np.int32)
    with pytest.raises(t3.DtypeError, match="bf16 or fp32"):
        p.dma_compute(dst=i, src0=i, src1=p.sbuf((4, 8), np.int32))
    with pytest.raises(t3.DtypeError, match="same dtype"):
        p.dma_compute(dst=a, src0=a, src1=p.sbuf((4, 8), BF16))
    with pytest.raises(t3.MemorySpaceError):
        p.dma_compute(dst=p.psum((4, 8), np.float32), src0=b)


def test_hazard_0_4_dma_compute_has_no_scale_mode(dev, rng):
    """Hazard (NKI 0.4 fix): dma_compute sums its sources with scale 1.0; a scale is refused, and
    the default sum applies no scaling."""
    a = rng.standard_normal((8, 8)).astype(np.float32)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    out = dev.hbm.alloc((8, 8), np.float32)
    p = t3.Program()
    with pytest.raises(t3.OperandError, match="no scale mode"):
        p.dma_compute(dst=out, src0=dev.hbm.put(a), src1=dev.hbm.put(b), scale=0.5)
    p.dma_compute(dst=out, src0=dev.hbm.put(a), src1=dev.hbm.put(b))
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), a + b)


def test_scatter_add_and_gather_add(dev, rng):
    """vector_offset modes: scatter-add dst_hbm[idx] += src_sbuf; gather-add dst_sbuf += src_hbm[idx]."""
    table = rng.integers(-100, 100, size=(50, 24)).astype(np.float32)
    idx = rng.permutation(50)[:32].astype(np.int32).reshape(32, 1)  # unique indices
    upd = rng.integers(-100, 100, size=(32, 24)).astype(np.float32)
    base = rng.integers(-100, 100, size=(32, 24)).astype(np.float32)
    ht, hi, hu, hb = dev.hbm.put(table), dev.hbm.put(idx), dev.hbm.put(upd), dev.hbm.put(base)
    gathered = dev.hbm.alloc((32, 24), np.float32)
    p = t3.Program()
    it = p.sbuf((32, 1), np.int32)
    ut = p.sbuf((32, 24), np.float32)
    bt = p.sbuf((32, 24), np.float32)
    for d_, s_ in ((it, hi), (ut, hu), (bt, hb)):
        p.dma_copy(dst=d_, src=s_)
    rows = ht.ap([[24, 32], [1, 24]], vector_offset=it)
    p.dma_compute(dst=bt, src0=bt, src1=rows)  # gather-add (reads the table before the scatter)
    p.dma_compute(dst=rows, src0=rows, src1=ut)  # scatter-add
    p.dma_copy(dst=gathered, src=bt)
    dev.run(p)
    want_g = base + table[idx[:, 0]]
    want_t = table.copy()
    want_t[idx[:, 0]] += upd
    np.testing.assert_array_equal(dev.hbm.get(gathered), want_g)
    np.testing.assert_array_equal(dev.hbm.get(ht), want_t)


def test_vector_offset_dma_compute_needs_two_sources_one_dst(dev):
    p = t3.Program()
    table = dev.hbm.alloc((50, 8), np.float32)
    it = p.sbuf((4, 1), np.int32)
    rows = table.ap([[8, 4], [1, 8]], vector_offset=it)
    t = p.sbuf((4, 8), np.float32)
    with pytest.raises(t3.OperandError, match="exactly 2 sources"):
        p.dma_compute(dst=t, src0=t, src1=rows, src2=t)
    with pytest.raises(t3.OperandError, match="exactly 2 sources"):
        p.dma_compute(dst=t, src0=rows, src1=rows)


# ----------------------------------------------------------------------- dynamic dma_copy


def test_vector_offset_gather_and_scatter_copy(dev, rng):
    table = rng.standard_normal((200, 64)).astype(np.float32)
    idx = rng.integers(0, 200, size=(128, 1)).astype(np.uint32)
    dst_idx = rng.permutation(300)[:128].astype(np.int32).reshape(128, 1)
    ht, hi, hj = dev.hbm.put(table), dev.hbm.put(idx), dev.hbm.put(dst_idx)
    big = dev.hbm.put(np.zeros((300, 64), np.float32))
    p = t3.Program()
    it = p.sbuf((128, 1), np.uint32)
    jt = p.sbuf((128, 1), np.int32)
    g = p.sbuf((128, 64), np.float32)
    p.dma_copy(dst=it, src=hi)
    p.dma_copy(dst=jt, src=hj)
    p.dma_copy(dst=g, src=ht.ap([[64, 128], [1, 64]], vector_offset=it), dge_mode="swdge", engine="gpsimd")
    p.dma_copy(dst=big.ap([[64, 128], [1, 64]], vector_offset=jt), src=g)
    dev.run(p)
    want = np.zeros((300, 64), np.float32)
    want[dst_idx[:, 0]] = table[idx[:, 0]]
    assert_bits_equal(dev.hbm.get(big), want)


def test_vector_offset_oob_error_names_the_row(dev):
    table = dev.hbm.alloc((10, 4), np.float32)
    hi = dev.hbm.put(np.array([[1], [2], [-3], [4]], np.int32))
    p = t3.Program()
    it = p.sbuf((4, 1), np.int32)
    p.dma_copy(dst=it, src=hi)
    p.dma_copy(dst=p.sbuf((4, 4), np.float32), src=table.ap([[4, 4], [1, 4]], vector_offset=it))
    with pytest.raises(t3.AddressError, match="row 2") as e:
        dev.run(p)
    assert e.value.operand == "src"


def test_hazard_0_4_dma_oob_skip_does_not_cast_ints(dev, rng):
    """Hazard (NKI 0.4 fix): dma_copy(oob_mode=skip) must not route ints through fp32; skipped
    rows keep their old contents."""
    table = rng.integers(2**24 + 1, 2**31 - 1, size=(16, 8)).astype(np.int32)  # not fp32-exact
    idx = np.array([[3], [99], [0], [15], [16], [7]], np.int32)
    old = rng.integers(-(2**31), 2**31 - 1, size=(6, 8)).astype(np.int32)
    ht, hi, ho = dev.hbm.put(table), dev.hbm.put(idx), dev.hbm.put(old)
    out = dev.hbm.alloc((6, 8), np.int32)
    p = t3.Program()
    it = p.sbuf((6, 1), np.int32)
    t = p.sbuf((6, 8), np.int32)
    p.dma_copy(dst=it, src=hi)
    p.dma_copy(dst=t, src=ho)
    p.dma_copy(dst=t, src=ht.ap([[8, 6], [1, 8]], vector_offset=it), oob_mode="skip")
    p.dma_copy(dst=out, src=t)
    dev.run(p)
    want = old.copy()
    for r, i in enumerate(idx[:, 0]):
        if 0 <= i < 16:
            want[r] = table[i]
    np.testing.assert_array_equal(dev.hbm.get(out), want)


def test_hazard_0_5_dma_oob_skip_with_x4(dev, rng):
    """Hazard (NKI 0.5 fix): OOB skip with x4 packed dtypes moves raw words."""
    words = rng.integers(0, 2**32, size=(8, 4), dtype=np.uint64).astype(np.uint32)
    idx = np.array([[7], [8], [2], [1000]], np.uint32)
    ht = dev.hbm.put(words, dtype="float8_e4m3fn_x4")
    hi = dev.hbm.put(idx)
    out = dev.hbm.put(np.zeros((4, 4), np.uint32), dtype="float8_e4m3fn_x4")
    p = t3.Program()
    it = p.sbuf((4, 1), np.uint32)
    t = p.sbuf((4, 4), "float8_e4m3fn_x4")
    p.dma_copy(dst=it, src=hi)
    p.memset(dst=t, value=0.0)
    p.dma_copy(dst=t, src=ht.ap([[4, 4], [1, 4]], vector_offset=it), oob_mode="skip")
    p.dma_copy(dst=out, src=t)
    dev.run(p)
    want = np.zeros((4, 4), np.uint32)
    want[0], want[2] = words[7], words[2]
    np.testing.assert_array_equal(dev.hbm.get(out).view(np.uint32), want)


def test_scalar_offset_from_tile_and_skip(dev, rng):
    x = rng.standard_normal((10, 32)).astype(np.float32)
    hx = dev.hbm.put(x)
    hk = dev.hbm.put(np.array([[6]], np.int32))
    hbad = dev.hbm.put(np.array([[10]], np.int32))
    out = dev.hbm.put(np.full((1, 32), 7.0, np.float32))
    out2 = dev.hbm.put(np.full((1, 32), 7.0, np.float32))
    p = t3.Program()
    k = p.sbuf((1, 1), np.int32)
    bad = p.sbuf((1, 1), np.int32)
    p.dma_copy(dst=k, src=hk)
    p.dma_copy(dst=bad, src=hbad)
    p.dma_copy(dst=out, src=hx.ap([[32, 1], [1, 32]], scalar_offset=k, indirect_dim=0))
    p.dma_copy(dst=out2, src=hx.ap([[32, 1], [1, 32]], scalar_offset=bad, indirect_dim=0), oob_mode="skip")
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), x[6:7])
    assert_bits_equal(dev.hbm.get(out2), np.full((1, 32), 7.0, np.float32))


def test_scalar_offset_on_free_dim_of_a_tile(dev, rng):
    """An SBUF scalar offset along a free dim (indirect_dim=1): columns k..k+7 of each partition."""
    x = rng.standard_normal((16, 4, 8)).astype(np.float32)
    hx = dev.hbm.put(x)
    out = dev.hbm.alloc((16, 8), np.float32)
    p = t3.Program()
    t = p.sbuf((16, 4, 8), np.float32)
    p.dma_copy(dst=t, src=hx)
    r = p.register_alloc(2, engine="sync")
    p.dma_copy(dst=out, src=t.ap([[32, 16], [1, 8]], scalar_offset=r, indirect_dim=1), engine="sync")
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), x[:, 2, :])


def test_scalar_offset_register_oob_error(dev):
    x = dev.hbm.alloc((4, 8), np.float32)
    p = t3.Program()
    r = p.register_alloc(-1, engine="sync")
    p.dma_copy(dst=p.sbuf((1, 8), np.float32), src=x.ap([[8, 1], [1, 8]], scalar_offset=r), engine="sync")
    with pytest.raises(t3.AddressError, match="scalar_offset -1 is outside 0..4"):
        dev.run(p)


def test_dynamic_addressing_rules(dev):
    p = t3.Program()
    table = dev.hbm.alloc((50, 8), np.float32)
    it = p.sbuf((4, 1), np.int32)
    rows = table.ap([[8, 4], [1, 8]], vector_offset=it)
    t = p.sbuf((4, 8), np.float32)
    with pytest.raises(t3.OperandError, match="swdge"):
        p.dma_copy(dst=t, src=rows, dge_mode="hwdge", engine="sync")
    with pytest.raises(t3.OperandError, match="sync or scalar"):
        p.dma_copy(dst=t, src=table[0:4], dge_mode="hwdge", engine="gpsimd")
    with pytest.raises(t3.ShapeError, match="same rows"):
        p.dma_copy(dst=p.sbuf((2, 16), np.float32), src=rows)
    with pytest.raises(t3.OperandError, match="not a DMA instruction"):
        p.tensor_copy(
            dst=t, src=p.sbuf((4, 16), np.float32).ap([[16, 4], [1, 8]], scalar_offset=t3.Reg(0), indirect_dim=1)
        )
    with pytest.raises(t3.DtypeError, match="int32 or uint32"):
        p.dma_copy(dst=t, src=table.ap([[8, 4], [1, 8]], vector_offset=p.sbuf((4, 1), np.float32)))
    with pytest.raises(t3.ShapeError, match="1x1"):
        p.dma_copy(dst=t, src=table.ap([[8, 4], [1, 8]], scalar_offset=p.sbuf((2, 1), np.int32)))
    with pytest.raises(t3.ShapeError, match="fewer than"):
        p.dma_copy(dst=t, src=table.ap([[8, 4], [1, 8]], vector_offset=p.sbuf((2, 1), np.int32)))
    with pytest.raises(t3.AddressError):  # the last index would run past the 144 GiB of HBM
        big = dev.hbm.alloc((2, 8), np.float32, address=(144 << 30) - 64)
        p.dma_copy(dst=p.sbuf((1, 16), np.float32), src=big.ap([[8, 1], [1, 16]], scalar_offset=t3.Reg(0)))
    with pytest.raises(t3.ShapeError):
        table.ap(vector_offset=it, indirect_dim=1)
    two = rows[1:3, 2:6]  # rows of a gather keep their own index-tile rows; free dims slice
    assert two.shape == (2, 4) and two.dyn[1][2:4] == (it.start + 1, 2)  # (index rows start, count)
    assert two.offset == rows.offset + 2 * 4
    for bad in (1, slice(0, 4, 2), (Ellipsis, 3)):
        with pytest.raises(t3.ShapeError, match="dynamic"):
            _ = rows[bad]


def test_dynamic_access_is_raced_over_its_whole_range(dev):
    """Race detection treats a dynamic access as touching every index it could: a register-offset
    write to row 0 still races with an unsynchronised read of row 9 of the same tensor."""
    h = dev.hbm.alloc((10, 16), np.float32)
    p = t3.Program(sync="manual")
    r = p.register_alloc(0, engine="sync")
    p.dma_copy(dst=h.ap([[16, 1], [1, 16]], scalar_offset=r), src=p.sbuf((1, 16), np.float32), engine="sync")
    p.dma_copy(dst=p.sbuf((1, 16), np.float32), src=h[9:10], engine="gpsimd")
    with pytest.raises(t3.RaceError):
        dev.run(p)


def test_dynamic_footprint_is_the_union_over_indices_not_a_byte_box(dev):
    """A dynamic access touches, for every index it could take, its pattern there: a scatter into
    columns 0..8 of gathered rows does not race with an unsynchronised read of columns 8..16 of
    every row (the byte box spanning both would), but does with a read of column 7."""
    h = dev.hbm.alloc((10, 16), np.float32)

    def prog(first_col):
        p = t3.Program(sync="manual")
        idx = p.sbuf((4, 1), np.int32)
        p.memset(dst=idx, value=3, engine="gpsimd")
        left = h.ap([[16, 4], [1, 8]], vector_offset=idx, indirect_dim=0)
        p.dma_copy(dst=left, src=p.sbuf((4, 8), np.float32), engine="gpsimd")
        p.dma_copy(dst=p.sbuf((10, 16 - first_col), np.float32), src=h[:, first_col:16], engine="sync")
        return p

    dev.run(prog(8))
    with pytest.raises(t3.RaceError):
        dev.run(prog(7))


def test_auto_sync_orders_dynamic_accesses(dev, rng):
    """Auto-sync sees the index tile read and the whole possible range: a gather after the index
    load and a scatter before a read-back come out right without manual semaphores."""
    table = rng.standard_normal((64, 16)).astype(np.float32)
    idx = rng.permutation(64)[:16].astype(np.int32).reshape(16, 1)
    ht, hi = dev.hbm.put(table), dev.hbm.put(idx)
    out = dev.hbm.alloc((64, 16), np.float32)
    p = t3.Program()
    it = p.sbuf((16, 1), np.int32)
    g = p.sbuf((16, 16), np.float32)
    p.dma_copy(dst=it, src=hi, engine="scalar")
    p.dma_copy(dst=g, src=ht.ap([[16, 16], [1, 16]], vector_offset=it), engine="gpsimd")
    p.tensor_scalar(dst=g, data=g, op0="multiply", operand0=2.0, engine="vector")
    p.dma_copy(dst=ht.ap([[16, 16], [1, 16]], vector_offset=it), src=g, engine="sync")
    p.dma_copy(dst=out, src=ht, engine="tensor")
    dev.run(p)
    want = table.copy()
    want[idx[:, 0]] = table[idx[:, 0]] * np.float32(2.0)
    assert_bits_equal(dev.hbm.get(out), want)


def test_dma_stress_64_transfers_with_read_add_writes(dev, rng):
    """64 transfers issued from every engine with every priority: 48 copies into distinct tiles
    plus 16 read-add-writes into one tile. Every copy is exact, no add is lost, and two runs give
    the same bits."""
    engines = ["sync", "scalar", "gpsimd", "vector", "tensor"]
    srcs = [rng.integers(-512, 512, size=(128, 32)).astype(np.float32) for _ in range(48)]
    adds = [rng.integers(-512, 512, size=(128, 32)).astype(np.float32) for _ in range(16)]
    runs = []
    for _ in range(2):
        d = t3.Device()
        hs = [d.hbm.put(x) for x in srcs]
        ha = [d.hbm.put(x) for x in adds]
        outs = [d.hbm.alloc((128, 32), np.float32) for _ in range(49)]
        p = t3.Program()
        acc = p.sbuf((128, 32), np.float32)
        p.memset(dst=acc, value=0.0)
        tiles = []
        for k, h in enumerate(hs):
            t = p.sbuf((128, 32), np.float32)
            p.dma_copy(dst=t, src=h, priority=k % 4, engine=engines[k % 5])
            tiles.append(t)
        for k, h in enumerate(ha):
            p.dma_compute(dst=acc, src0=acc, src1=h, engine=engines[(k + 2) % 5])
        for t, o in zip([*tiles, acc], outs):
            p.dma_copy(dst=o, src=t)
        d.run(p)
        runs.append([d.hbm.get(o) for o in outs])
    for k in range(48):
        assert_bits_equal(runs[0][k], srcs[k])
    want = np.sum(np.stack(adds), axis=0, dtype=np.float64).astype(np.float32)  # exact: small integers
    assert_bits_equal(runs[0][48], want)
    for a, b in zip(*runs):
        assert_bits_equal(a, b)


def test_embedding_example_is_exact():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "embedding_gather_scatter.py"
    spec = importlib.util.spec_from_file_location("embedding_gather_scatter", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(300, 16, 256) == 0.0


def test_concurrent_hbm_scatter_adds_do_race(dev):
    """Only SBUF adds near memory: two unsynchronised read-add-writes into the same HBM bytes race
    (each is a DMA read then a write), unlike SBUF read-add-writes."""
    h = dev.hbm.alloc((4, 8), np.float32)
    p = t3.Program(sync="manual")
    a = p.sbuf((4, 8), np.float32)
    p.dma_compute(dst=h, src0=h, src1=a, engine="sync")
    p.dma_compute(dst=h, src0=h, src1=a, engine="gpsimd")
    with pytest.raises(t3.RaceError):
        dev.run(p)
    q = t3.Program(sync="manual")
    b = q.sbuf((4, 8), np.float32)
    q.dma_compute(dst=b, src0=b, src1=h, engine="sync")
    q.dma_compute(dst=b, src0=b, src1=h, engine="gpsimd")
    dev.run(q)  # SBUF: no race
