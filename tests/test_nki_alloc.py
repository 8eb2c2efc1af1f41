"""Allocation like the NKI compiler's (issue 13, outcome 1): PSUM tiles share 2 KiB banks without
straddling them, block dimensions of par_dim tiles do not reserve every block up front (blocks are
allocated when used and rotate, with a capacity error when more are kept live than fit), direct
allocation of block tiles, next-fit rotation, and one allocator behind `Program` and the front end.

Each refusal the issue reports is reproduced with a small kernel of our own; results are compared
with numpy (exact: copies, small-integer sums and products)."""

import numpy as np
import pytest
import trn3emu as t3
import trn3emu.nki as tn
from trn3emu.allocator import Allocator
from trn3emu.errors import CapacityError, NotSupportedError

tn.install()
import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.compiler as ncc  # noqa: E402
import neuronxcc.nki.isa as lisa  # noqa: E402
import neuronxcc.nki.language as lnl  # noqa: E402
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


# ------------------------------------------------------------------------------------- PSUM
def test_ten_psum_tiles_of_512_bytes_live_at_once():
    """Ten (128, 128) fp32 PSUM tiles (512 B per partition each) share 3 banks; with one bank per
    tile only 8 could be live."""

    @nki.jit
    def k(a, b):
        out = nl.ndarray((10, 128, 128), nl.float32, buffer=nl.shared_hbm)
        st = nl.load(a)
        mv = nl.load(b)
        accs = []
        for i in range(10):
            acc = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
            nisa.nc_matmul(acc, stationary=st, moving=mv[:, i * 128 : (i + 1) * 128])
            accs.append(acc)
        offsets = [acc.tensor.offset for acc in accs]
        for i, acc in enumerate(accs):  # every tile still holds its own result
            nl.store(out[i], value=acc)
        return out, offsets

    rng = np.random.default_rng(1)
    a = rng.integers(-3, 4, (128, 128)).astype(np.float32)
    b = rng.integers(-3, 4, (128, 1280)).astype(np.float32)
    got, offsets = k(a, b)
    for i in range(10):
        np.testing.assert_array_equal(got[i], a.T @ b[:, i * 128 : (i + 1) * 128])
    assert len(set(offsets)) == 10
    assert all(off // 2048 == (off + 511) // 2048 for off in offsets)  # none straddles a bank
    assert len({off // 2048 for off in offsets}) == 3  # 4 + 4 + 2 tiles


def test_psum_tiles_never_straddle_a_bank():
    a = Allocator.psum()
    _, x = a.alloc(1536, "x")
    _, y = a.alloc(1536, "y")  # would straddle banks 0 and 1 at 1536: goes to bank 1
    _, z = a.alloc(512, "z")  # the rest of bank 0
    _, w = a.alloc(4096, "w")  # wider than a bank: whole banks, bank-aligned
    _, v = a.alloc(1024, "v")  # bank 1 has 512 left, bank 2.. are w's: bank 6
    assert (x, y, z, w, v) == (0, 2048, 1536, 4096, 8192)


def test_psum_full_names_the_banks_and_their_tiles():
    @nki.jit(passes="literal")  # the literal allocator's message: tiles held by Python, unused ones too
    def k(a):
        keep = [nl.ndarray((128, 384), nl.float32, buffer=nl.psum, name=f"acc{i}") for i in range(8)]
        nl.ndarray((128, 256), nl.float32, buffer=nl.psum, name="one_more")  # 1 KiB: no bank has it
        del keep

    with pytest.raises(CapacityError) as ei:
        k(np.zeros(1, np.float32))
    msg = str(ei.value)
    assert ei.value.rule == "onchip_capacity"
    assert "one_more" in msg and "largest free gap" not in msg
    assert "bank 0 (1536 of 2048 bytes): acc0" in msg and "bank 7 (1536 of 2048 bytes): acc7" in msg
    assert "never straddle" in msg


def test_program_and_front_end_share_one_allocator():
    p = t3.Program()
    tiles = [p.psum((128, 128)) for _ in range(5)]
    assert [t.offset for t in tiles] == [0, 512, 1024, 1536, 2048]
    assert isinstance(p._psum, Allocator) and isinstance(p._sbuf, Allocator)

    seen = {}

    @nki.jit
    def k(a):
        from trn3emu.nki._kernel import current

        ctx = current()
        seen["same"] = ctx.sbuf is ctx.program._sbuf and ctx.psum is ctx.program._psum
        return a

    k(np.zeros((1, 1), np.float32))
    assert seen["same"]


# -------------------------------------------------------------------------- rotation in loops
def test_loop_tiles_rotate_over_free_memory():
    """A tile allocated per iteration does not get the range the previous iteration used (the
    allocator keeps recently freed ranges out of reach while others fit), and the results are
    those of the serial loop."""

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        offs = []
        for i in range(4):
            t = nl.load(x[i * 128 : (i + 1) * 128])
            offs.append(t.tensor.offset)
            nl.store(out[i * 128 : (i + 1) * 128], value=nl.multiply(t, 3.0))
        return out, offs

    x = np.arange(512 * 64, dtype=np.float32).reshape(512, 64)
    got, offs = k(x)
    np.testing.assert_array_equal(got, x * 3)
    assert all(a != b for a, b in zip(offs, offs[1:])) and len(set(offs)) >= 3


# ------------------------------------------------------------------------------ block tiles
def test_block_tile_larger_than_sbuf_runs_when_live_blocks_fit():
    """(64, par_dim(128), 2048) fp32 declares 512 KiB per partition (SBUF has 256 KiB); one block
    is live per iteration, as in the migration guide's example. (Two input blocks, reused, and a
    per-block row sum keep the test's host memory small.)"""

    @lnki.jit
    def k(x):
        out = lnl.ndarray((128, 64), dtype=lnl.float32, buffer=lnl.shared_hbm)
        a = lnl.ndarray((64, lnl.par_dim(128), 2048), dtype=lnl.float32, buffer=lnl.sbuf)
        for i in lnl.affine_range(64):
            a[i] = lnl.load(x[i % 2])
            a[i] = lnl.multiply(a[i], float(i + 1))
            lnl.store(out[:, i : i + 1], value=lnl.sum(a[i], axis=1, keepdims=True))
        return out

    x = (np.arange(2 * 128 * 2048, dtype=np.float32).reshape(2, 128, 2048) % 7) - 3
    want = np.stack([x[i % 2].sum(axis=1) * (i + 1) for i in range(64)], axis=1)
    np.testing.assert_array_equal(k(x), want)


def test_block_tile_keeping_too_many_blocks_live_names_the_tile():
    @lnki.jit(passes="literal")  # the literal allocator's message: tiles held by Python, unused ones too
    def k(x):
        out = lnl.ndarray((64, 128, 2048), dtype=x.dtype, buffer=lnl.shared_hbm)
        a = lnl.ndarray((64, lnl.par_dim(128), 2048), dtype=lnl.float32, buffer=lnl.sbuf, name="blocks")
        for i in lnl.affine_range(64):
            a[i] = lnl.load(x[i % 2])
        for i in lnl.affine_range(64):  # every block is still needed: 512 KiB live
            lnl.store(out[i], value=a[i])
        return out

    with pytest.raises(CapacityError) as ei:
        k(np.zeros((2, 128, 2048), np.float32))
    assert ei.value.rule == "nki_block_tile_overflow"
    msg = str(ei.value)
    assert "blocks (64, 128, 2048)" in msg and "block (0,)" in msg and "test_nki_alloc.py:" in msg


def test_zeros_block_tile_fills_each_block_when_first_used():
    @lnki.jit
    def k(x):
        nb = x.shape[0]
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        acc = lnl.zeros((nb, lnl.par_dim(128), 4096), dtype=lnl.float32)  # no block exists before its first use
        for _rep in lnl.affine_range(2):
            for b in lnl.affine_range(nb):
                acc[b, 0:128, 0:4096] += lnl.load(x[b])
        for b in lnl.affine_range(nb):
            lnl.store(out[b], value=acc[b])
        return out

    x = np.arange(4 * 128 * 4096, dtype=np.float32).reshape(4, 128, 4096) % 97
    np.testing.assert_array_equal(k(x), 2 * x)


def test_psum_block_tile_rotates_over_banks():
    """Legacy `(n, par_dim(128), 512)` fp32 PSUM block tile with n = 12 > 8 banks: one block live
    per iteration."""

    @lnki.jit
    def k(a, b):
        n = b.shape[0]
        out = lnl.ndarray((n, 128, 512), dtype=lnl.float32, buffer=lnl.shared_hbm)
        ps = lnl.ndarray((n, lnl.par_dim(128), 512), dtype=lnl.float32, buffer=lnl.psum)
        st = lnl.load(a)
        for i in lnl.affine_range(n):
            ps[i] = lisa.nc_matmul(st, lnl.load(b[i]))
            lnl.store(out[i], value=ps[i])
        return out

    rng = np.random.default_rng(3)
    a = rng.integers(-2, 3, (128, 128)).astype(np.float32)
    b = rng.integers(-2, 3, (12, 128, 512)).astype(np.float32)
    np.testing.assert_array_equal(k(a, b), np.einsum("km,nkf->nmf", a, b))


def test_block_tile_direct_allocation_mod_alloc_and_alloc():
    """`ncc.sbuf.mod_alloc(num_free_tiles=(2,))` double-buffers a 4-block tile: blocks 0 and 2
    share bytes, as do 1 and 3; `ncc.sbuf.alloc(func)` places each block where func says."""

    def at(idx, pdim, fbytes):
        (i,) = idx
        return 0, 65536 + (i % 3) * fbytes

    @lnki.jit
    def k(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        out2 = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        a = lnl.ndarray(
            (4, lnl.par_dim(128), 512), dtype=x.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,))
        )
        c = lnl.ndarray((4, lnl.par_dim(128), 512), dtype=x.dtype, buffer=ncc.sbuf.alloc(at))
        offs, offs2 = [], []
        for i in range(4):
            a[i] = lnl.load(x[i])
            offs.append(a[i].tensor.offset)
            lnl.store(out[i], value=a[i])
            c[i] = lnl.load(x[i])
            offs2.append(c[i].tensor.offset)
            lnl.store(out2[i], value=c[i])
        return out, out2, offs, offs2

    x = np.arange(4 * 128 * 512, dtype=np.float32).reshape(4, 128, 512)
    got, got2, offs, offs2 = k(x)
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(got2, x)
    assert offs == [0, 2048, 0, 2048]
    assert offs2 == [65536, 65536 + 2048, 65536 + 4096, 65536]


def test_block_tile_view_across_blocks_is_refused_clearly():
    @lnki.jit
    def k(x):
        a = lnl.ndarray((4, lnl.par_dim(128), 8), dtype=lnl.float32, buffer=lnl.sbuf)
        return a[0:2]

    with pytest.raises(NotSupportedError, match="several blocks"):
        k(np.zeros(1, np.float32))


def test_block_tile_at_an_address_lays_blocks_out_densely():
    @lnki.jit
    def k(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        a = lnl.ndarray((2, 3, lnl.par_dim(128), 16), dtype=x.dtype, buffer=lnl.sbuf, address=(0, 8192))
        offs = []
        for i in range(2):
            for j in range(3):
                a[i, j] = lnl.load(x[i, j])
                offs.append(a[i, j].tensor.offset)
        for i in range(2):
            for j in range(3):
                lnl.store(out[i, j], value=a[i, j])
        return out, offs

    x = np.arange(2 * 3 * 128 * 16, dtype=np.float32).reshape(2, 3, 128, 16)
    got, offs = k(x)
    np.testing.assert_array_equal(got, x)
    assert offs == [8192 + b * 64 for b in range(6)]  # 16 fp32 = 64 bytes per block


def _counter_in_loop(x, loop):
    """nki-samples' allocated SD attention's pattern: direct-allocation addresses from a Python
    counter increased in an `affine_range` body. The legacy toolchain traced that body once (one
    buffer per allocation, used by every iteration); 64 iterations of 8 KiB would need 512 KiB."""
    out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
    addr = 0
    for i in loop(x.shape[0] // 128):
        t = lnl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=addr))
        addr += x.shape[1] * 4
        u = lnl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=addr))
        addr += x.shape[1] * 4
        t[...] = lnl.load(x[i * 128 : (i + 1) * 128])
        u[...] = lnl.multiply(t, 3.0)
        lnl.store(out[i * 128 : (i + 1) * 128], value=u)
    return out


@pytest.mark.parametrize("loop", ["affine_range", "sequential_range"])
def test_legacy_loop_bodies_place_their_allocations_once(loop):
    x = np.random.default_rng(4).integers(-9, 9, (64 * 128, 1024)).astype(np.float32)
    k = lnki.jit(_counter_in_loop)
    np.testing.assert_array_equal(k(x, getattr(lnl, loop)), 3 * x)
    # every iteration's two tiles at the first iteration's addresses: bytes 0 and 4096
    text = k.last_programs[0].to_text()
    places = {w.split("]+")[1].split("[")[0] for w in text.split() if w.startswith("dst=sbuf:")}
    assert places == {"0", "4096"}, places


def test_static_range_bodies_and_nki_06_kernels_place_every_iteration():
    # static_range was unrolled while tracing: each iteration asks for its own addresses, and
    # the counter runs past the 256 KiB partition at iteration 32
    x = np.zeros((64 * 128, 1024), np.float32)
    with pytest.raises(CapacityError, match="262144"):
        lnki.jit(_counter_in_loop)(x, lnl.static_range)
    with pytest.raises(CapacityError, match="262144"):
        nki.jit(_counter_in_loop)(x, nl.affine_range)
