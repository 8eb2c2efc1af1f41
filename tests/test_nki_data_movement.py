"""Issue 13, outcomes 2-4: integer data moves like float data (partition broadcast, transposes,
copies, fills: bit-exact), indirect DMA with the index tile in any dim after constant indices,
and reductions over non-trailing free axes. References are numpy; integer results compare exactly."""

import ml_dtypes
import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import NotSupportedError

tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

RNG = np.random.default_rng(13)


def _words(shape, dtype):
    """Random 32-bit words (every bit pattern, including ones that are NaN as fp32)."""
    return RNG.integers(0, 2**32, shape, dtype=np.uint32).view(dtype)


# ------------------------------------------------------------------- outcome 2: integer data
@nki.jit
def _block_table(num_blocks, parts):
    """A paged-attention style block table: iota along the free dim, broadcast to every partition."""
    row = nl.ndarray((1, num_blocks), nl.int32, buffer=nl.sbuf)
    nisa.iota(row, [[1, num_blocks]], offset=(1 << 28) + 3, channel_multiplier=0)
    table = row.broadcast_to((parts, num_blocks))
    out = nl.ndarray((parts, num_blocks), nl.int32, buffer=nl.shared_hbm)
    nl.store(out, table)
    return out


def test_iota_block_table_broadcast_along_partitions_is_exact():
    out = _block_table(96, 128)
    ref = np.broadcast_to(np.arange(96, dtype=np.int32) + (1 << 28) + 3, (128, 96))
    np.testing.assert_array_equal(out, ref)  # 2^28 + k is not exact in fp32 above 2^24


@nki.jit
def _bcast(a, parts):
    t = nl.load(a)
    out = nl.ndarray((parts,) + tuple(a.shape[1:]), a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.broadcast_to(t, (parts,) + tuple(a.shape[1:])))
    return out


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int16, np.uint8, np.bool_])
def test_partition_broadcast_of_integer_tiles_is_bit_exact(dtype):
    if dtype in (np.int32, np.uint32):
        a = _words((1, 700), dtype)  # > 512 columns: more than one PSUM bank's worth
    else:
        a = (
            RNG.integers(0, 2, (1, 33)).astype(dtype)
            if dtype == np.bool_
            else RNG.integers(0, 100, (1, 33)).astype(dtype)
        )
    out = _bcast(a, 128)
    assert out.dtype == a.dtype
    np.testing.assert_array_equal(out, np.broadcast_to(a, (128,) + a.shape[1:]))


def test_partition_broadcast_of_a_3d_int_tile():
    a = _words((1, 4, 8), np.int32)
    np.testing.assert_array_equal(_bcast(a, 64), np.broadcast_to(a, (64, 4, 8)))


def test_partition_broadcast_lowers_to_dma_not_to_an_instruction_the_user_did_not_write():
    _bcast(_words((1, 16), np.int32), 32)
    text = _bcast.last_programs[0].to_text().splitlines()
    ops = [line.split()[0].split(".")[0] for line in text if line.strip() and not line.startswith(".")]
    assert "nc_matmul" not in ops and ops.count("dma_copy") >= 3


@nki.jit
def _scaled_rows(x, w):
    """out[s] = x * w[s] for each row s of w: one partition broadcast per loop iteration."""
    xt = nl.load(x)
    out = nl.ndarray((w.shape[0],) + tuple(x.shape), x.dtype, buffer=nl.shared_hbm)
    for s in nl.affine_range(w.shape[0]):
        ws = nl.load(w[s : s + 1, :])
        wb = nl.broadcast_to(ws, x.shape)
        y = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=xt, data2=wb, op=nl.multiply)
        nl.store(out[s], y)
    return out


def test_fp32_partition_broadcasts_share_one_ones_row():
    """Each fp32 broadcast is one matmul (+ the copy to SBUF); the ones row they multiply is
    filled once per program, not once per broadcast (a VectorE memset in front of every matmul)."""
    x = RNG.standard_normal((128, 300)).astype(np.float32)
    w = RNG.standard_normal((3, 300)).astype(np.float32)
    np.testing.assert_array_equal(_scaled_rows(x, w), x[None] * w[:, None, :])  # x * (w * 1) exactly
    text = _scaled_rows.last_programs[0].to_text().splitlines()
    ops = [line.split()[0].split(".")[0] for line in text if line.strip() and not line.startswith(".")]
    assert (ops.count("memset"), ops.count("nc_matmul"), ops.count("tensor_tensor")) == (1, 3, 3)


@nki.jit
def _int_binary_bcast(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


def test_binary_op_with_a_one_partition_int_operand():
    a = RNG.integers(-1000, 1000, (128, 40)).astype(np.int32)
    b = RNG.integers(-1000, 1000, (1, 40)).astype(np.int32)
    np.testing.assert_array_equal(_int_binary_bcast(a, b), a + b)


@nki.jit
def _transposes(a):
    t = nl.load(a)
    pe = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
    nl.store(pe, nl.transpose(t))
    ps = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.psum)
    nisa.nc_transpose(ps, t)
    sb = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(sb, ps)
    isa = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
    nl.store(isa, sb)
    dma = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
    nl.store(dma, nl.load_transpose2d(a))
    return pe, isa, dma


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int16, np.uint16, np.int8, np.uint8])
def test_transposes_of_integer_tiles_are_bit_exact(dtype):
    a = _words((128, 64), np.uint32).astype(dtype) if np.dtype(dtype).itemsize < 4 else _words((128, 64), dtype)
    for out in _transposes(a):
        assert out.dtype == a.dtype
        np.testing.assert_array_equal(out, a.T)


@nki.jit
def _copies(a):
    t = nl.load(a)
    c = nl.copy(t)
    act = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(act, c, engine=nisa.scalar_engine)
    ps = nl.ndarray(a.shape, a.dtype, buffer=nl.psum)
    nisa.tensor_copy(ps, act)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, ps)  # PSUM -> SBUF -> HBM
    out2 = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out2, t.astype(a.dtype))
    return out, out2


@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
def test_copies_of_32_bit_words_are_bit_exact(dtype):
    a = _words((128, 64), dtype)
    for out in _copies(a):
        np.testing.assert_array_equal(out.view(np.uint32), a.view(np.uint32))


@nki.jit
def _fills(v):
    t = nl.ndarray((128, 8), nl.int32, buffer=nl.sbuf)
    t[...] = v
    a = nl.ndarray((128, 8), nl.int32, buffer=nl.shared_hbm)
    nl.store(a, t)
    b = nl.ndarray((128, 8), nl.uint32, buffer=nl.shared_hbm)
    nl.store(b, 4294967295)
    c = nl.ndarray((128, 8), nl.int32, buffer=nl.shared_hbm)
    nl.store(c, nl.full((128, 8), -(2**31) + 5, nl.int32))
    return a, b, c


def test_integer_fills_keep_every_bit():
    a, b, c = _fills(2**31 - 1)
    assert (a == 2**31 - 1).all() and (b == 2**32 - 1).all() and (c == -(2**31) + 5).all()


# ------------------------------------------------ outcome 3: index tile in any dim (gather/scatter)
L, N, F = 3, 50, 64


@nki.jit
def _gather(cache, idx, layer):
    i_f = nl.arange(F)[None, :]
    it = nl.load(idx)
    legacy = nl.ndarray((idx.shape[0], F), cache.dtype, buffer=nl.shared_hbm)
    nl.store(legacy, nl.load(cache[layer, it, i_f]))
    sliced = nl.ndarray((idx.shape[0], F), cache.dtype, buffer=nl.shared_hbm)
    nl.store(sliced, nl.load(cache[layer, it, :]))
    return legacy, sliced


def test_gather_with_index_tile_after_a_constant_index():
    cache = RNG.standard_normal((L, N, F)).astype(np.float32)
    idx = RNG.permutation(N)[:32].reshape(32, 1).astype(np.int32)
    for layer in (0, 2):
        for out in _gather(cache, idx, layer):
            np.testing.assert_array_equal(out, cache[layer, idx[:, 0]])


@nki.jit
def _scatter(cache, idx, val):
    i_f = nl.arange(F)[None, :]
    nl.store(cache[1, nl.load(idx), i_f], nl.load(val))
    return cache


def test_scatter_with_index_tile_after_a_constant_index():
    cache = RNG.standard_normal((L, N, F)).astype(np.float32)
    idx = RNG.permutation(N)[:32].reshape(32, 1).astype(np.int32)
    val = RNG.standard_normal((32, F)).astype(np.float32)
    ref = cache.copy()
    ref[1, idx[:, 0]] = val
    np.testing.assert_array_equal(_scatter(cache.copy(), idx, val), ref)


@nki.jit
def _gather4(cache, idx):
    it = nl.load(idx)
    a = nl.ndarray((idx.shape[0], cache.shape[-1]), cache.dtype, buffer=nl.shared_hbm)
    nl.store(a, nl.load(cache[1, 2, it, :]))
    return a


@nki.jit
def _gather_mid(cache, idx):
    it = nl.load(idx)
    a = nl.ndarray((idx.shape[0], cache.shape[-1]), cache.dtype, buffer=nl.shared_hbm)
    nl.store(a, nl.load(cache[1, it, 2, :]))  # a constant after the index tile too
    return a


def test_gather_index_tile_deeper_and_with_trailing_constants():
    idx = RNG.permutation(N)[:16].reshape(16, 1).astype(np.int32)
    c4 = RNG.integers(0, 2**31, (2, 3, N, F)).astype(np.int32)
    np.testing.assert_array_equal(_gather4(c4, idx), c4[1, 2, idx[:, 0]])
    c5 = RNG.integers(0, 2**31, (2, N, 3, F)).astype(np.int32)
    np.testing.assert_array_equal(_gather_mid(c5, idx), c5[1, idx[:, 0], 2])


@nki.jit
def _gather_after_slice(cache, idx):
    a = nl.ndarray((idx.shape[0], F), cache.dtype, buffer=nl.shared_hbm)
    nl.store(a, nl.load(cache[0:1, nl.load(idx), :]))
    return a


def test_index_tile_after_a_slice_is_refused_by_name():
    idx = np.arange(4, dtype=np.int32).reshape(4, 1)
    with pytest.raises(NotSupportedError, match="constant integers") as e:
        _gather_after_slice(np.zeros((L, N, F), np.float32), idx)
    assert e.value.rule == "nki_index_tile_dim"


# ------------------------------------------------------- outcome 4: non-trailing reduce axes
@nki.jit
def _isa_reduce(a, axes, keep, op):
    t = nl.load(a)
    if keep:
        shape = tuple(1 if d in axes else n for d, n in enumerate(a.shape))
    else:
        shape = tuple(n for d, n in enumerate(a.shape) if d not in axes)
    s = nl.ndarray(shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(s, op, t, axis=axes, keepdims=keep)
    out = nl.ndarray(shape, nl.float32, buffer=nl.shared_hbm)
    nl.store(out, s)
    return out


@pytest.mark.parametrize("axes", [(1, 3), (2,), (1,), (1, 2), (2, 3), (3,)])
@pytest.mark.parametrize("keep", [False, True])
def test_nisa_tensor_reduce_over_any_free_axes(axes, keep):
    a = RNG.integers(-8, 8, (16, 3, 4, 5)).astype(np.float32)  # small ints: sums are exact
    np.testing.assert_array_equal(_isa_reduce(a, axes, keep, nl.add), a.sum(axis=axes, keepdims=keep))
    np.testing.assert_array_equal(_isa_reduce(a, axes, keep, nl.maximum), a.max(axis=axes, keepdims=keep))


@nki.jit
def _minor_first(a):
    t = nl.load(a)
    s = nl.ndarray((a.shape[0], a.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(s, nl.add, t, axis=1)  # older minor-first numbering: the last dim
    out = nl.ndarray(s.shape, nl.float32, buffer=nl.shared_hbm)
    nl.store(out, s)
    return out


def test_minor_first_axis_numbering_still_reads_as_before():
    a = RNG.integers(-8, 8, (16, 3, 5)).astype(np.float32)
    np.testing.assert_array_equal(_minor_first(a), a.sum(axis=2))


@nki.jit
def _nl_reduce(a, axes):
    out_t = nl.sum(nl.load(a), axis=axes)
    out = nl.ndarray(out_t.shape, out_t.dtype, buffer=nl.shared_hbm)
    nl.store(out, out_t)
    return out


@pytest.mark.parametrize("axes", [(1, 3), [1, 3], (2,), (1, 2)])
def test_nl_sum_over_non_trailing_axes(axes):
    a = RNG.integers(-8, 8, (16, 3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(_nl_reduce(a, axes), a.sum(axis=tuple(axes)))


@nki.jit
def _scatter_add_masked(cache, idx, val, m):
    i_f = nl.arange(cache.shape[2])[None, :]
    nl.atomic_rmw(cache[1, nl.load(idx), i_f], nl.load(val), op=nl.add, mask=nl.load(m))
    return cache


def test_masked_scatter_add_with_index_tile_after_a_constant_index():
    cache = RNG.integers(-50, 50, (2, 40, 16)).astype(np.float32)
    idx = RNG.permutation(40)[:8].reshape(8, 1).astype(np.int32)
    val = RNG.integers(-50, 50, (8, 16)).astype(np.float32)
    m = np.array([1, 0, 1, 1, 0, 1, 1, 1], np.uint8).reshape(8, 1)
    ref = cache.copy()
    for r in range(8):
        if m[r, 0]:
            ref[1, idx[r, 0]] += val[r]
    np.testing.assert_array_equal(_scatter_add_masked(cache.copy(), idx, val, m), ref)


@pytest.mark.parametrize("src_dtype", [np.float32, np.int8])
def test_load_transpose2d_casts_to_the_dtype_asked(src_dtype):
    """`nl.load_transpose2d(src, dtype=...)` casts the transposed tile (the API page: "data type
    to cast the output type to"); the DMA transpose itself moves raw elements, so the cast is a
    conversion after it. Checked against ml_dtypes' round-to-nearest-even bf16."""
    rng = np.random.default_rng(41)
    if src_dtype == np.int8:
        a = rng.integers(-128, 128, (64, 96)).astype(np.int8)
    else:
        a = rng.standard_normal((64, 96)).astype(np.float32) * 1000

    @nki.jit
    def kern(a):
        out = nl.ndarray((a.shape[1], a.shape[0]), nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, nl.load_transpose2d(a, dtype=nl.bfloat16))
        return out

    got = kern(a)
    want = a.T.astype(np.float32).astype(ml_dtypes.bfloat16)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
