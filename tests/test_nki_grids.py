"""NKI 2.34 grid views: nl.tiles / nl.blocks / nl.alloc_tiles and NkiGrid indexing. Each kernel's
result is compared with numpy slicing of the input; grid attributes with values computed by hand
(tile counts by ceiling division, boundary extents by subtraction)."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu import errors as E

tn.install()
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

RNG = np.random.default_rng(7)


def _data(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _attrs(g) -> dict:
    return dict(
        shape=g.shape,
        element_shape=g.element_shape,
        is_remainder=g.is_remainder,
        index_step_elements=g.index_step_elements,
        is_data_representable=g.is_data_representable,
    )


# ------------------------------------------------------------------- the documented copy patterns


@nki.jit
def copy_tile_grid(src):
    tile_shape = (128, 256)
    src_tiles = nl.tiles(src, tile_shape=tile_shape)
    dst = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
    dst_tiles = nl.tiles(dst, tile_shape=tile_shape)
    for i in range(src_tiles.shape[0]):
        for j in range(src_tiles.shape[1]):
            src_tile = src_tiles[i, j]
            tile = nl.ndarray(src_tile.element_shape, dtype=src.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile.data, src=src_tile.data)
            nisa.dma_copy(dst=dst_tiles[i, j].data, src=tile.data)
    return dst


@pytest.mark.parametrize("shape", [(256, 512), (300, 600), (100, 70), (129, 257)])
def test_copy_tile_grid_with_remainders(shape):
    a = _data(*shape)
    np.testing.assert_array_equal(np.asarray(copy_tile_grid(a)), a)


def test_copy_block_grid_through_block_to_tile_transition():
    seen = {}

    @nki.jit
    def k(src):
        src_blocks = nl.blocks(src, tile_shape=(128, 256), block_shape=(2, 2))
        dst = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        dst_blocks = nl.blocks(dst, tile_shape=(128, 256), block_shape=(2, 2))
        seen["grid"] = _attrs(src_blocks)
        for i in range(src_blocks.shape[0]):
            for j in range(src_blocks.shape[1]):
                block = src_blocks[i, j]
                seen[i, j] = (block.element_shape, block.is_remainder, block.block_shape, block.tile_shape)
                inner, out = nl.tiles(block), nl.tiles(dst_blocks[i, j])
                assert isinstance(inner, nl.NkiTileGrid) and isinstance(block, nl.NkiBlockGrid)
                for a in range(inner.shape[0]):
                    for b in range(inner.shape[1]):
                        t = nl.ndarray(inner[a, b].element_shape, dtype=src.dtype, buffer=nl.sbuf)
                        nisa.dma_copy(dst=t, src=inner[a, b].data)
                        nisa.dma_copy(dst=out[a, b].data, src=t)
        return dst

    a = _data(300, 600)
    np.testing.assert_array_equal(np.asarray(k(a)), a)
    # 300 rows = 3 tiles of 128 -> 2 blocks of 2 tiles (256 + 44); 600 cols = 3 tiles of 256 -> 512 + 88
    assert seen["grid"] == dict(
        shape=(2, 2),
        element_shape=(300, 600),
        is_remainder=True,
        index_step_elements=(256, 512),
        is_data_representable=True,
    )
    assert seen[0, 0] == ((256, 512), False, (2, 2), (128, 256))
    assert seen[0, 1] == ((256, 88), True, (2, 2), (128, 256))
    assert seen[1, 0] == ((44, 512), True, (2, 2), (128, 256))
    assert seen[1, 1] == ((44, 88), True, (2, 2), (128, 256))


def test_block_data_is_one_aggregate_operand():
    """A whole block's .data moves in one dma_copy (HBM to HBM here: the block is 256 rows)."""

    @nki.jit
    def k(src):
        dst = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        sb, db = (nl.blocks(t, tile_shape=(128, 128), block_shape=(2, 3)) for t in (src, dst))
        for i in range(sb.shape[0]):
            for j in range(sb.shape[1]):
                nisa.dma_copy(dst=db[i, j].data, src=sb[i, j].data)
        return dst

    a = _data(300, 500)
    np.testing.assert_array_equal(np.asarray(k(a)), a)
    assert len(k.last_programs[0].to_text().splitlines()) >= 4  # 2 x 2 blocks: four copies


# ------------------------------------------------------------------------- attributes by hand


def test_tile_grid_attributes():
    seen = {}

    @nki.jit
    def k(src):
        g = nl.tiles(src, tile_shape=(128, 256))
        seen["g"] = _attrs(g)
        seen["last"] = _attrs(g[2, 2])
        seen["first"] = _attrs(g[0, 0])
        seen["neg"] = _attrs(g[-1, 0])
        seen["col"] = _attrs(g[:, 1])
        seen["row_tail"] = _attrs(g[1, 1:])
        seen["strided"] = _attrs(g[0:3:2, 0])
        seen["strided_one"] = _attrs(g[0:3:2, 0][1])
        seen["meta"] = (g.tile_shape, g.buffer, str(g.dtype), isinstance(g, nl.NkiGrid))
        out = nl.ndarray((1, 1), dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=src[0:1, 0:1])
        return out

    k(_data(300, 600))
    assert seen["g"] == dict(
        shape=(3, 3), element_shape=(300, 600), is_remainder=True, index_step_elements=(128, 256),
        is_data_representable=True,
    )  # fmt: skip
    assert seen["last"] == dict(
        shape=(), element_shape=(44, 88), is_remainder=True, index_step_elements=(), is_data_representable=True
    )
    assert seen["first"]["element_shape"] == (128, 256) and seen["first"]["is_remainder"] is False
    assert seen["neg"]["element_shape"] == (44, 256)
    assert seen["col"] == dict(
        shape=(3,), element_shape=(300, 256), is_remainder=True, index_step_elements=(128,),
        is_data_representable=True,
    )  # fmt: skip
    assert seen["row_tail"] == dict(
        shape=(2,), element_shape=(128, 344), is_remainder=True, index_step_elements=(256,),
        is_data_representable=True,
    )  # fmt: skip
    # tiles 0 and 2 of the rows: 128 + 44 rows, not adjacent; a step of 2 tiles
    assert seen["strided"] == dict(
        shape=(2,), element_shape=(172, 256), is_remainder=True, index_step_elements=(256,),
        is_data_representable=False,
    )  # fmt: skip
    assert seen["strided_one"]["element_shape"] == (44, 256) and seen["strided_one"]["is_data_representable"]
    assert seen["meta"] == ((128, 256), "hbm", "float32", True)


def test_untiled_leading_hbm_dims_are_slabs():
    seen = {}

    @nki.jit
    def k(src):
        g = nl.tiles(src, tile_shape=(128, 256))
        seen["g"] = _attrs(g)
        seen["slab"] = _attrs(g[1])
        seen["two_slabs"] = _attrs(g[1:3])
        dst = nl.ndarray((72, 44), dtype=src.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(g[2, 1, 1].element_shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=g[2, 1, 1].data)
        nisa.dma_copy(dst=dst, src=t)
        return dst

    a = _data(4, 200, 300)
    np.testing.assert_array_equal(np.asarray(k(a)), a[2, 128:200, 256:300])
    assert seen["g"] == dict(
        shape=(4, 2, 2), element_shape=(4, 200, 300), is_remainder=True, index_step_elements=(1, 128, 256),
        is_data_representable=True,
    )  # fmt: skip
    assert seen["slab"]["shape"] == (2, 2) and seen["slab"]["element_shape"] == (200, 300)
    assert seen["two_slabs"]["shape"] == (2, 2, 2) and seen["two_slabs"]["element_shape"] == (2, 200, 300)


# -------------------------------------------------------------------- negative and slice keys


def test_negative_and_slice_selections_copy_the_numpy_region():
    @nki.jit
    def k(src):
        g = nl.tiles(src, tile_shape=(128, 128))
        row = nl.ndarray(g[-1, 1:3].element_shape, dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=row, src=g[-1, 1:3].data)  # last row of tiles, tiles 1..2
        col = nl.ndarray(g[:, -1].element_shape, dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=col, src=g[:, -1].data)  # the last (partial) column of tiles
        pick = nl.ndarray(g[0:3:2, -2][-1].element_shape, dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=pick, src=g[0:3:2, -2][-1].data)  # tile (2, 2) via a step-2 slice
        return row, col, pick

    a = _data(300, 400)  # 3 x 4 tiles of 128: rows 128 128 44, cols 128 128 128 16
    row, col, pick = k(a)
    np.testing.assert_array_equal(np.asarray(row), a[256:300, 128:384])
    np.testing.assert_array_equal(np.asarray(col), a[:, 384:400])
    np.testing.assert_array_equal(np.asarray(pick), a[256:300, 256:384])


# --------------------------------------------------------------------------------- alloc_tiles


def test_alloc_tiles_hbm_aggregate_data():
    seen = {}

    @nki.jit
    def k(src):
        store = nl.alloc_tiles(tile_shape=(128, 128), element_shape=(200, 300), buffer=nl.shared_hbm, dtype=src.dtype)
        seen["g"] = (type(store).__name__, _attrs(store))
        s = nl.tiles(src, tile_shape=(128, 128))
        for i in range(store.shape[0]):
            for j in range(store.shape[1]):
                t = nl.ndarray(s[i, j].element_shape, dtype=src.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=t, src=s[i, j].data)
                nisa.dma_copy(dst=store[i, j].data, src=t)
        return store.data

    a = _data(200, 300)
    np.testing.assert_array_equal(np.asarray(k(a)), a)
    assert seen["g"] == (
        "NkiTileGrid",
        dict(
            shape=(2, 3), element_shape=(200, 300), is_remainder=True, index_step_elements=(128, 128),
            is_data_representable=True,
        ),
    )  # fmt: skip


def test_alloc_tiles_sbuf_aggregate_data_is_one_operand():
    @nki.jit
    def k(src):
        tiles = nl.alloc_tiles(tile_shape=(64, 128), element_shape=(100, 300), buffer=nl.sbuf, dtype=src.dtype)
        s = nl.tiles(src, tile_shape=(64, 128))
        for i in range(tiles.shape[0]):
            for j in range(tiles.shape[1]):
                nisa.dma_copy(dst=tiles[i, j].data, src=s[i, j].data)
        nisa.tensor_scalar(dst=tiles.data, data=tiles.data, op0=nl.multiply, operand0=2.0)
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tiles.data)
        return out

    a = _data(100, 300)
    np.testing.assert_array_equal(np.asarray(k(a)), a * 2)


def test_alloc_tiles_sbuf_more_partitions_than_the_core_has():
    seen = {}

    @nki.jit
    def k(src):
        g = nl.alloc_tiles(tile_shape=(128, 128), element_shape=(200, 300), buffer=nl.sbuf, dtype=src.dtype)
        seen["whole"] = g.is_data_representable
        seen["row1"] = (g[1].is_data_representable, g[1].element_shape, g[1].data.shape)
        s = nl.tiles(src, tile_shape=(128, 128))
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        o = nl.tiles(out, tile_shape=(128, 128))
        for i in range(2):
            for j in range(3):
                nisa.dma_copy(dst=g[i, j].data, src=s[i, j].data)
        for i in range(2):
            nisa.dma_copy(dst=o[i].data, src=g[i].data)  # one row of partition tiles at a time
        return out

    a = _data(200, 300)
    np.testing.assert_array_equal(np.asarray(k(a)), a)
    assert seen == {"whole": False, "row1": (True, (72, 300), (72, 300))}


# -------------------------------------------------------------------------- run-time indices


def test_nkiscalar_index_selects_a_tile():
    @nki.jit
    def k(src, idx):
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=idx)
        i = nisa.scalar_load(t)
        g = nl.tiles(src, tile_shape=(128, 64))
        sel = g[i, 1]
        buf = nl.ndarray(sel.element_shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=buf, src=sel.data)
        out = nl.ndarray(sel.element_shape, dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=buf)
        return out

    a = _data(512, 192)
    for i in (0, 2, 3):
        got = k(a, np.array([[i]], np.int32))
        np.testing.assert_array_equal(np.asarray(got), a[128 * i : 128 * (i + 1), 64:128])


def test_sbuf_scalar_tile_and_virtual_register_index_free_dim_tiles():
    @nki.jit
    def k(src, idx):
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=idx)
        sb = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=src)
        g = nl.tiles(sb, tile_shape=(128, 32))
        r = nisa.register_alloc(t)
        out1 = nl.ndarray((128, 32), dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out1, src=g[0, t].data)  # the SBUF scalar tile itself
        out2 = nl.ndarray((128, 32), dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out2, src=g[0, r].data)  # a VirtualRegister
        out3 = nl.ndarray((128, 32), dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out3, src=g[0, nisa.scalar_load(t)].data)  # an NkiScalar nothing else holds
        return out1, out2, out3

    a = _data(128, 128)
    for i in (1, 3):
        for o in k(a, np.array([[i]], np.int32)):  # (the DMAs read the registers on the engine holding them)
            np.testing.assert_array_equal(np.asarray(o), a[:, 32 * i : 32 * (i + 1)])


# ------------------------------------------------------------------------------------- errors


def _raises(body, cls, rule, *shape):
    """Trace a kernel running `body(src)` on an HBM input of `shape`; it must raise `cls` with `rule`."""

    @nki.jit
    def k(src):
        body(src)
        out = nl.ndarray((1, 1), dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=src[0:1, 0:1])
        return out

    with pytest.raises(cls) as e:
        k(_data(*(shape or (300, 600))))
    assert e.value.rule == rule, e.value
    return e.value


def _alloc(**kw):
    args = dict(tile_shape=(128, 128), element_shape=(128, 256), buffer=nl.sbuf, dtype=nl.float32)
    args.update(kw)
    return lambda src: nl.alloc_tiles(**args)


@pytest.mark.parametrize(
    "kw, cls, rule",
    [
        (dict(tile_shape=[128, 128]), TypeError, "nki_grid_view_shape_type"),
        (dict(tile_shape=(128.0, 128)), TypeError, "nki_grid_view_shape_type"),
        (dict(element_shape=(True, 128)), TypeError, "nki_grid_view_shape_type"),
        (dict(buffer=object()), TypeError, "nki_grid_view_buffer_type"),
        (dict(tile_shape=(0, 128)), ValueError, "nki_grid_view_shape_value"),
        (dict(element_shape=(128, -4)), ValueError, "nki_grid_view_shape_value"),
        (dict(tile_shape=(128,)), ValueError, "nki_grid_view_tile_rank"),
        (dict(tile_shape=(1, 128, 128)), ValueError, "nki_grid_view_tile_rank"),
        (dict(buffer="dram"), ValueError, "nki_unknown_buffer"),
    ],
)
def test_alloc_tiles_documented_errors(kw, cls, rule):
    _raises(_alloc(**kw), cls, rule)


@pytest.mark.parametrize(
    "body, cls, rule",
    [
        (lambda g: g[3, 0], IndexError, "nki_grid_view_index_out_of_range"),
        (lambda g: g[0, -4], IndexError, "nki_grid_view_index_out_of_range"),
        (lambda g: g[0, 0, 0], IndexError, "nki_grid_view_too_many_indices"),
        (lambda g: g[::-1, 0], ValueError, "nki_grid_view_slice_step"),
        (lambda g: g[2:2], ValueError, "nki_grid_view_empty_selection"),
        (lambda g: g[1.0], TypeError, "nki_grid_view_index_type"),
        (lambda g: g[0:3:2, 0].data, ValueError, "nki_grid_view_data_not_representable"),
        (lambda g: nl.tiles(g[0:3:2]), ValueError, "nki_grid_view_data_not_representable"),
        (lambda g: nl.blocks(g, block_shape=(2,)), ValueError, "nki_grid_view_block_rank"),
    ],
)
def test_grid_indexing_errors(body, cls, rule):
    _raises(lambda src: body(nl.tiles(src, tile_shape=(128, 256))), cls, rule)


def test_grid_source_errors():
    _raises(lambda src: nl.tiles(src), TypeError, "nki_grid_view_shape_type")
    _raises(lambda src: nl.tiles(src, tile_shape=(1, 128, 256)), ValueError, "nki_grid_view_tile_rank")
    _raises(lambda src: nl.tiles(np.zeros((4, 4)), tile_shape=(2, 2)), TypeError, "nki_grid_view_source_type")
    _raises(lambda src: nl.NkiTileGrid(), TypeError, "nki_grid_view_constructor")


def test_sbuf_scalar_index_must_be_one_int():
    def bad_dtype(src):
        f = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        return nl.tiles(src, tile_shape=(128, 256))[f]

    def bad_shape(src):
        i = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf)
        return nl.tiles(src, tile_shape=(128, 256))[i]

    _raises(bad_dtype, TypeError, "nki_grid_view_index_type")
    _raises(bad_shape, ValueError, "nki_grid_view_index_shape")


def test_runtime_index_over_a_remainder_dim_is_refused():
    def body(src):
        i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        return nl.tiles(src, tile_shape=(128, 256))[i, 0].data  # 300 rows: the last tile is partial

    e = _raises(body, E.NotSupportedError, "nki_grid_view_runtime_index")
    assert "not a whole number" in str(e)


def test_alloc_tiles_rows_of_partition_tiles_not_one_operand():
    def body(src):
        return nl.alloc_tiles(tile_shape=(128, 128), element_shape=(200, 128), buffer=nl.sbuf, dtype=src.dtype).data

    _raises(body, ValueError, "nki_grid_view_data_not_representable")


def test_nki_tensor_data_is_itself():
    @nki.jit
    def k(src):
        t = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        assert t.data is t
        nisa.dma_copy(dst=t.data, src=src.data)
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out.data, src=t.data)
        return out

    a = _data(64, 32)
    np.testing.assert_array_equal(np.asarray(k(a)), a)


# ----------------------------------------------------------- alloc_blocks, grid_element_offset


def test_alloc_blocks_hbm_and_sbuf():
    seen = {}

    @nki.jit
    def k(src):
        g = nl.alloc_blocks(
            tile_shape=(128, 128), block_shape=(2, 2), element_shape=(300, 500), buffer=nl.shared_hbm, dtype=src.dtype
        )
        seen["g"] = (type(g).__name__, g.block_shape, _attrs(g), g[1, 1].element_shape, g[0, 1].element_shape)
        s = nl.blocks(src, tile_shape=(128, 128), block_shape=(2, 2))
        for i in range(2):
            for j in range(2):
                nisa.dma_copy(dst=g[i, j].data, src=s[i, j].data)
        sb = nl.alloc_blocks(
            tile_shape=(128, 128), block_shape=(1, 2), element_shape=(128, 500), buffer=nl.sbuf, dtype=src.dtype
        )
        seen["sb"] = (sb.shape, sb[0, 1].element_shape, nl.tiles(sb[0, 1]).shape)
        nisa.dma_copy(dst=sb[0, 1].data, src=src[0:128, 256:500])
        out = nl.ndarray((128, 244), dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb[0, 1].data)
        return g.data, out

    a = _data(300, 500)
    whole, part = k(a)
    np.testing.assert_array_equal(np.asarray(whole), a)
    np.testing.assert_array_equal(np.asarray(part), a[0:128, 256:500])
    # 300 x 500 in 128-tiles: 3 x 4 tiles; blocks of 2 x 2 tiles -> 2 x 2 blocks, steps 256 x 256
    assert seen["g"] == (
        "NkiBlockGrid",
        (2, 2),
        dict(
            shape=(2, 2), element_shape=(300, 500), is_remainder=True, index_step_elements=(256, 256),
            is_data_representable=True,
        ),
        (44, 244),
        (256, 244),
    )  # fmt: skip
    assert seen["sb"] == ((1, 2), (128, 244), (1, 2))


def test_grid_element_offset_static_and_runtime():
    seen = {}

    @nki.jit
    def k(src, idx):
        g = nl.tiles(src, tile_shape=(128, 64))
        static = g[nl.grid_element_offset(256), 1]  # the same tile as g[2, 1]
        seen["static"] = (static.element_shape, static.shape)
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=idx)
        off = nisa.scalar_load(t) * 128  # a run-time element offset: tile idx
        sel = g[nl.grid_element_offset(off), 2]
        o1 = nl.ndarray((128, 64), dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=static.data)
        o2 = nl.ndarray((128, 64), dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o2, src=sel.data)
        return o1, o2

    a = _data(512, 192)
    for i in (0, 3):
        o1, o2 = k(a, np.array([[i]], np.int32))
        np.testing.assert_array_equal(np.asarray(o1), a[256:384, 64:128])
        np.testing.assert_array_equal(np.asarray(o2), a[128 * i : 128 * (i + 1), 128:192])
    assert seen["static"] == ((128, 64), ())


@pytest.mark.parametrize(
    "body, cls, rule",
    [
        (lambda g: g[nl.grid_element_offset(100), 0], ValueError, "nki_grid_view_element_offset"),
        (lambda g: g[nl.grid_element_offset(384), 0], ValueError, "nki_grid_view_element_offset"),
        (lambda g: nl.grid_element_offset(-128), ValueError, "nki_grid_view_element_offset"),
        (lambda g: nl.grid_element_offset(True), TypeError, "nki_grid_view_index_type"),
        (lambda g: nl.grid_element_offset(1.5), TypeError, "nki_grid_view_index_type"),
    ],
)
def test_grid_element_offset_errors(body, cls, rule):
    _raises(lambda src: body(nl.tiles(src, tile_shape=(128, 256))), cls, rule)


def test_alloc_blocks_block_rank():
    body = lambda src: nl.alloc_blocks(  # noqa: E731
        tile_shape=(128, 128), block_shape=(2,), element_shape=(128, 256), buffer=nl.sbuf, dtype=src.dtype
    )
    _raises(body, ValueError, "nki_grid_view_block_rank")
