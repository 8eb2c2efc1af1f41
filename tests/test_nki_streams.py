"""NKI 0.8 stream buffers: nl.alloc_stream_buffers / NkiStreamBuffers. Each kernel streams an HBM
input through a few on-chip slots and is compared with numpy; slot rotation (k % num_slots), the
clamped final step of a grid, the modelled overlap of a two-slot pipeline and each refused input."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu import errors as E

tn.install()
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

RNG = np.random.default_rng(11)


def _data(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------ an NkiTensor view


def _scale_slabs(num_slots):
    @nki.jit
    def k(src):
        # src (128, S, F): step m is the (128, F) slab src[:, m, :]
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        pool = nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=1, num_slots=num_slots)
        for m in range(src.shape[1]):
            slab = pool[m]
            assert isinstance(slab, nl.NkiTensor) and slab.shape == (src.shape[0], src.shape[2])
            nisa.dma_copy(dst=slab, src=src[:, m, :])
            nisa.tensor_scalar(dst=slab, data=slab, op0=nl.multiply, operand0=3.0, op1=nl.add, operand1=-1.0)
            nisa.dma_copy(dst=out[:, m, :], src=slab)
        return out

    return k


@pytest.mark.parametrize("num_slots", [1, 2, 3])
def test_tensor_view_streams_through_slots(num_slots):
    a = _data(128, 7, 96)
    np.testing.assert_allclose(np.asarray(_scale_slabs(num_slots)(a)), a * 3.0 - 1.0, rtol=1e-6, atol=1e-6)


def test_tensor_view_along_leading_dim_with_dtype():
    @nki.jit
    def k(src):
        # src (4, 64, 32) streamed along dim 0 into bf16 slots, summed on chip
        out = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        pool = nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=0, num_slots=2, dtype=nl.bfloat16)
        assert pool.num_slots == 2 and pool.dtype == nl.bfloat16
        for b in range(src.shape[0]):
            nisa.dma_copy(dst=pool[b], src=src[b])
            nisa.tensor_tensor(dst=acc, data1=acc, data2=pool[b], op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    a = (RNG.integers(-8, 8, (4, 64, 32)) / 4).astype(np.float32)  # exact in bf16
    np.testing.assert_array_equal(np.asarray(k(a)), a.sum(axis=0))


# ------------------------------------------------------------------------------ a tile grid view


@nki.jit
def add_one_by_tile_columns(src):
    # (300, 700) in (128, 256) tiles: a 3 x 3 grid, the last row and column partial; one step is a
    # column of three tiles (element extent (300, 256), the last (300, 188))
    out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
    grid = nl.tiles(src, tile_shape=(128, 256))
    out_grid = nl.tiles(out, tile_shape=(128, 256))
    pool = nl.alloc_stream_buffers(grid, buffer=nl.sbuf, dim=1, num_slots=2)
    for j in range(grid.shape[1]):
        col = pool[j]
        assert isinstance(col, nl.NkiTileGrid)
        assert col.shape == grid[:, j].shape and col.element_shape == grid[:, j].element_shape
        assert col.is_remainder == grid[:, j].is_remainder
        for i in range(col.shape[0]):
            t = col[i]
            nisa.dma_copy(dst=t.data, src=grid[i, j].data)
            nisa.tensor_scalar(dst=t.data, data=t.data, op0=nl.add, operand0=1.0)
            nisa.dma_copy(dst=out_grid[i, j].data, src=t.data)
    return out


def test_tile_grid_columns_with_partial_final_step():
    a = _data(300, 700)
    np.testing.assert_allclose(np.asarray(add_one_by_tile_columns(a)), a + 1.0, rtol=1e-6)


def test_tile_grid_step_attributes_and_clamped_final_view():
    seen = {}

    @nki.jit
    def k(src):
        grid = nl.tiles(src, tile_shape=(128, 128))  # (128, 320): grid (1, 3), last column 64 wide
        pool = nl.alloc_stream_buffers(grid, buffer=nl.sbuf, dim=1, num_slots=2)
        for j in range(3):
            s = pool[j]
            seen[j] = (type(s).__name__, s.shape, s.element_shape, s.is_remainder, s.data.shape)
        # the clamped final step is a view of its full-capacity slot: same storage as step 0
        seen["alias"] = (pool[2].data.offset, pool[0].data.offset, pool[1].data.offset)
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=src)
        return out

    k(_data(128, 320))
    assert seen[0] == ("NkiTileGrid", (1,), (128, 128), False, (128, 128))
    assert seen[1] == seen[0]
    assert seen[2] == ("NkiTileGrid", (1,), (128, 64), True, (128, 64))
    a2, a0, a1 = seen["alias"]
    assert a2 == a0 and a1 != a0


def test_tile_grid_of_hbm_slabs_along_untiled_dim():
    @nki.jit
    def k(src):
        # src (3, 128, 200): the untiled leading dim is the stream; a step is a (1, 2) tile grid
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        grid = nl.tiles(src, tile_shape=(128, 128))
        pool = nl.alloc_stream_buffers(grid, buffer=nl.sbuf, dim=0, num_slots=2)
        for b in range(grid.shape[0]):
            s = pool[b]
            assert s.shape == (1, 2) and s.element_shape == (128, 200)
            nisa.dma_copy(dst=s.data, src=grid[b].data)
            nisa.activation(dst=s.data, op=nl.exp, data=s.data)
            nisa.dma_copy(dst=out[b], src=s.data)
        return out

    a = _data(3, 128, 200) * 0.5
    np.testing.assert_allclose(np.asarray(k(a)), np.exp(a), rtol=2e-3, atol=1e-5)


# ------------------------------------------------------------------------------ a block grid view


def test_block_grid_rows_with_partial_final_block():
    seen = {}

    @nki.jit
    def k(src):
        # (96, 1100) in (96, 128) tiles, blocks of 4 tiles: 3 blocks along dim 1, the last 76 wide
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        bgrid = nl.blocks(src, tile_shape=(96, 128), block_shape=(1, 4))
        out_b = nl.blocks(out, tile_shape=(96, 128), block_shape=(1, 4))
        pool = nl.alloc_stream_buffers(bgrid, buffer=nl.sbuf, dim=1, num_slots=3)
        for j in range(bgrid.shape[1]):
            blk = pool[j]
            assert isinstance(blk, nl.NkiBlockGrid) and blk.block_shape == (1, 4)
            seen[j] = (blk.shape, blk.element_shape, blk.is_remainder)
            nisa.dma_copy(dst=blk.data, src=bgrid[:, j].data)  # one coalesced DMA per block
            for t in range(nl.tiles(blk).shape[1]):
                tile = nl.tiles(blk)[0, t]
                nisa.tensor_scalar(dst=tile.data, data=tile.data, op0=nl.multiply, operand0=-2.0)
            nisa.dma_copy(dst=out_b[:, j].data, src=blk.data)
        return out

    a = _data(96, 1100)
    np.testing.assert_allclose(np.asarray(k(a)), -2.0 * a, rtol=1e-6)
    assert seen[0] == ((1,), (96, 512), False) and seen[1] == seen[0]
    assert seen[2] == ((1,), (96, 76), True)


# ------------------------------------------------------------------------------ pipelines


def _pipelined_scale(num_slots, repeats=4):
    @nki.jit
    def k(src):
        # (128, S, 512) streamed along dim 1; two stages written in logical order: the load of step
        # m + 1 is issued before the compute of step m (a prologue load, an epilogue compute)
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        pool = nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=1, num_slots=num_slots)
        res = nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=1, num_slots=2)
        steps = src.shape[1]
        nisa.dma_copy(dst=pool[0], src=src[:, 0, :])
        for m in range(steps):
            if m + 1 < steps and num_slots > 1:
                nisa.dma_copy(dst=pool[m + 1], src=src[:, m + 1, :])
            r = res[m]
            nisa.activation(dst=r, op=nl.exp, data=pool[m], scale=0.5)
            for _ in range(repeats - 1):
                nisa.activation(dst=r, op=nl.exp, data=pool[m], scale=0.5)
            nisa.dma_copy(dst=out[:, m, :], src=r)
            if m + 1 < steps and num_slots == 1:
                nisa.dma_copy(dst=pool[m + 1], src=src[:, m + 1, :])
        return out

    return k


def test_two_stage_pipeline_matches_numpy_and_overlaps_in_the_model():
    a = _data(128, 8, 512) * 0.25
    times = {}
    for n in (1, 2, 3):
        k = _pipelined_scale(n)
        np.testing.assert_allclose(np.asarray(k(a)), np.exp(0.5 * a), rtol=2e-3, atol=1e-5)
        times[n] = k.last_result.time_ns
    # model property: with two slots the load of step m + 1 runs during the compute of step m, so
    # the modelled time drops; one slot must wait for each step's compute before the next load
    assert times[2] < 0.9 * times[1], times
    assert times[3] <= times[2] * 1.02, times


def test_psum_slots_accumulate_matmuls():
    @nki.jit
    def k(lhs_t, rhs):
        # out = lhs_t.T @ rhs, K = 256 in two 128 steps; output row-tile m accumulates in PSUM slot
        # m % 2 (the first matmul of a step overwrites what step m - 2 left there)
        out = nl.ndarray((lhs_t.shape[1], rhs.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        out_grid = nl.tiles(out, tile_shape=(128, rhs.shape[1]))
        lhs_grid = nl.tiles(lhs_t, tile_shape=(128, 128))
        rhs_grid = nl.tiles(rhs, tile_shape=(128, rhs.shape[1]))
        lhs_pool = nl.alloc_stream_buffers(lhs_grid, buffer=nl.sbuf, dim=1, num_slots=2)
        acc_pool = nl.alloc_stream_buffers(out_grid, buffer=nl.psum, dim=0, num_slots=2)
        res = nl.alloc_stream_buffers(out_grid, buffer=nl.sbuf, dim=0, num_slots=2)
        rhs_sb = nl.alloc_tiles(
            tile_shape=(128, rhs.shape[1]), element_shape=rhs.shape, buffer=nl.sbuf, dtype=rhs.dtype
        )
        for kk in range(rhs_grid.shape[0]):
            nisa.dma_copy(dst=rhs_sb[kk, 0].data, src=rhs_grid[kk, 0].data)
        for m in range(lhs_grid.shape[1]):
            lhs = lhs_pool[m]  # a column of K tiles
            acc = acc_pool[m]
            assert acc.buffer == nl.psum and acc.element_shape == (128, rhs.shape[1])
            for kk in range(lhs.shape[0]):
                nisa.dma_copy(dst=lhs[kk].data, src=lhs_grid[kk, m].data)
                nisa.nc_matmul(dst=acc.data, stationary=lhs[kk].data, moving=rhs_sb[kk, 0].data, accumulate=kk > 0)
            nisa.tensor_copy(dst=res[m].data, src=acc.data)
            nisa.dma_copy(dst=out_grid[m].data, src=res[m].data)
        return out

    lhs_t, rhs = _data(256, 512), _data(256, 256)
    np.testing.assert_allclose(np.asarray(k(lhs_t, rhs)), lhs_t.T @ rhs, rtol=1e-4, atol=1e-3)


# ------------------------------------------------------------------------------ slot identity


def test_slot_k_and_k_plus_num_slots_share_storage():
    seen = {}

    @nki.jit
    def k(src):
        pool = nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=1, num_slots=3)
        grid_pool = nl.alloc_stream_buffers(nl.tiles(src, tile_shape=(128, 64)), buffer=nl.sbuf, dim=0, num_slots=2)
        seen["t"] = [(pool[i].offset, pool[i].tensor) for i in range(src.shape[1])]
        seen["g"] = [grid_pool[i].data.offset for i in range(src.shape[0])]
        seen["repr"] = repr(pool)
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=src)
        return out

    k(_data(4, 128, 6 * 64).reshape(4, 128, 384)[:, :, :].copy())
    t = seen["t"]
    for i in range(len(t) - 3):
        assert t[i] == t[i + 3]
    assert len({t[i][0] for i in range(3)}) == 3  # three distinct slots
    g = seen["g"]
    assert g[0] == g[2] and g[1] == g[3] and g[0] != g[1]
    assert "3 slots" in seen["repr"]


def test_selecting_a_slot_emits_nothing():
    counts = {}

    def make(select):
        @nki.jit
        def k(src):
            pool = nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=0, num_slots=2)
            if select:
                for i in range(src.shape[0]):
                    pool[i]
                    pool[i]
            out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=src)
            return out

        return k

    a = _data(4, 32, 32)
    for select in (False, True):
        k = make(select)
        np.testing.assert_array_equal(np.asarray(k(a)), a)
        counts[select] = (k.last_result.executed, [p.to_text() for p in k.last_programs])
    assert counts[True] == counts[False]


# ------------------------------------------------------------------------------ refused inputs


def _run_refused(body, shape=(128, 4, 64)):
    @nki.jit
    def k(src):
        body(src)
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=src)
        return out

    k(_data(*shape))


@pytest.mark.parametrize(
    "kwargs, exc, rule",
    [
        (dict(dim=3), E.ShapeError, "nki_stream_dim"),
        (dict(dim=-1), E.ShapeError, "nki_stream_dim"),
        (dict(dim=1.0), E.ArgumentTypeError, "nki_stream_dim"),
        (dict(dim=1, num_slots=0), E.ShapeError, "nki_stream_num_slots"),
        (dict(dim=1, num_slots=2.0), E.ArgumentTypeError, "nki_stream_num_slots"),
        (dict(dim=1, buffer="shared_hbm"), E.MemorySpaceError, "nki_stream_buffer"),
        (dict(dim=1, buffer=3), E.ArgumentTypeError, "nki_stream_buffer"),
        (dict(dim=1, transpose_axes=(1, 0)), E.NotSupportedError, "nki_stream_transpose_axes"),
        (dict(dim=1, address=(0, 0)), E.NotSupportedError, "nki_stream_address"),
    ],
)
def test_bad_arguments(kwargs, exc, rule):
    kwargs.setdefault("buffer", "sbuf")

    def body(src):
        nl.alloc_stream_buffers(src, **kwargs)

    with pytest.raises(exc) as ei:
        _run_refused(body)
    assert ei.value.rule == rule


def test_documented_type_and_value_errors_subclass_builtins():
    assert issubclass(E.ArgumentTypeError, TypeError) and issubclass(E.ShapeError, ValueError)
    assert issubclass(E.MemorySpaceError, ValueError) and issubclass(E.AddressError, IndexError)


def test_view_must_be_a_tensor_or_grid():
    with pytest.raises(E.ArgumentTypeError) as ei:
        _run_refused(lambda src: nl.alloc_stream_buffers(np.zeros((4, 4)), buffer=nl.sbuf, dim=0))
    assert ei.value.rule == "nki_stream_view_type"


@pytest.mark.parametrize(
    "key, exc, rule",
    [
        (-1, E.NotSupportedError, "nki_stream_index_negative"),
        (4, E.AddressError, "nki_stream_index_out_of_range"),
        (1.0, E.ArgumentTypeError, "nki_stream_index_type"),
        (slice(0, 2), E.ArgumentTypeError, "nki_stream_index_type"),
        (True, E.ArgumentTypeError, "nki_stream_index_type"),
    ],
)
def test_bad_static_indices(key, exc, rule):
    def body(src):
        pool = nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=1)
        pool[key]

    with pytest.raises(exc) as ei:
        _run_refused(body)
    assert ei.value.rule == rule


def test_runtime_index_is_refused():
    def body(src):
        pool = nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=1)
        idx = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=idx, value=1)
        s = nisa.scalar_load(idx)
        pool[s]

    with pytest.raises(E.NotSupportedError) as ei:
        _run_refused(body)
    assert ei.value.rule == "nki_stream_index_runtime"


def test_scalar_tile_index_is_refused():
    def body(src):
        pool = nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=1)
        idx = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        pool[idx]

    with pytest.raises(E.NotSupportedError) as ei:
        _run_refused(body)
    assert ei.value.rule == "nki_stream_index_runtime"


@pytest.mark.parametrize("op", [iter, len, list])
def test_iteration_and_len_are_refused(op):
    def body(src):
        op(nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=1))

    with pytest.raises(E.NotSupportedError) as ei:
        _run_refused(body)
    assert ei.value.rule == "nki_stream_iteration"


def test_rank_one_view_has_no_tensor_step():
    with pytest.raises(E.ShapeError) as ei:
        _run_refused(lambda src: nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=0), shape=(64,))
    assert ei.value.rule == "nki_stream_step_rank"


def test_constructor_is_refused():
    with pytest.raises(E.ArgumentTypeError) as ei:
        nl.NkiStreamBuffers()
    assert ei.value.rule == "nki_stream_buffers_constructor"


def test_capacity_overflow():
    # 8 slots of (128, 16384) fp32 = 512 KiB per partition, twice SBUF's 256 KiB
    def body(src):
        nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=1, num_slots=8)

    with pytest.raises(E.CapacityError) as ei:
        _run_refused(body, shape=(128, 2, 16384))
    assert ei.value.rule == "nki_stream_capacity"


def test_step_beyond_128_partitions_is_refused():
    with pytest.raises(E.AddressError) as ei:
        _run_refused(lambda src: nl.alloc_stream_buffers(src, buffer=nl.sbuf, dim=1), shape=(256, 2, 8))
    assert ei.value.rule == "partitions_out_of_range"


def test_tile_grid_row_selection_and_steps_beyond_128_partitions():
    @nki.jit
    def k(src):
        # src (300, 512) in (128, 128) tiles: grid (3, 4). Stream 1: the tiles of row 1 one at a
        # time (a view that already consumed a coordinate). Stream 2: columns of three tiles, 300
        # partitions per step (alloc_tiles' rows of partition tiles); out = 2 * src
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        grid, out_grid = nl.tiles(src, tile_shape=(128, 128)), nl.tiles(out, tile_shape=(128, 128))
        row = nl.alloc_stream_buffers(grid[1], buffer=nl.sbuf, dim=0, num_slots=2)
        for j in range(grid.shape[1]):
            t = row[j]
            assert t.shape == () and t.element_shape == (128, 128)
            nisa.dma_copy(dst=t.data, src=grid[1, j].data)
        cols = nl.alloc_stream_buffers(grid, buffer=nl.sbuf, dim=1, num_slots=2)
        for j in range(grid.shape[1]):
            col = cols[j]
            assert col.shape == (3,) and col.element_shape == (300, 128)
            for i in range(3):
                nisa.dma_copy(dst=col[i].data, src=grid[i, j].data)
                nisa.tensor_tensor(dst=col[i].data, data1=col[i].data, data2=col[i].data, op=nl.add)
                nisa.dma_copy(dst=out_grid[i, j].data, src=col[i].data)
        return out

    a = _data(300, 512)
    np.testing.assert_allclose(np.asarray(k(a)), 2 * a, rtol=1e-6)
