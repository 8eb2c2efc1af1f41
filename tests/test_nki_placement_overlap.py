"""A kernel's explicit placements never land on a tile the emulator placed itself (issue 28).

An automatic tile (a result, `nl.shared_identity_matrix`, a scratch tile of an `nl` op) is placed
first fit while tracing; a later explicit placement (`address=` in the `import nki` dialect,
`ncc.sbuf.mod_alloc`, `ncc.sbuf.alloc(func)`, `ncc.psum.mod_alloc`, `ncc.psum.alloc(func)`) of the
same bytes used to overwrite it silently. Each kernel here keeps an automatic tile live across an
explicit placement of its bytes and checks the automatic tile's data exactly against numpy; each
fails on the allocator that let the two overlap."""

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.allocator import Allocator
from trn3emu.errors import AddressError

tn.install()
import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.compiler as ncc  # noqa: E402
import neuronxcc.nki.isa as lisa  # noqa: E402
import neuronxcc.nki.language as lnl  # noqa: E402
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

RNG = np.random.default_rng(28)
A = RNG.integers(-1000, 1000, (128, 64)).astype(np.int32)
B = RNG.integers(-1000, 1000, (128, 64)).astype(np.int32)


def _check(out, a, b):
    np.testing.assert_array_equal(out[0], a)  # the automatic tile, read after the placement
    np.testing.assert_array_equal(out[1], b)  # the explicit tile


def test_address_in_import_nki_dialect():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((2, 128, 64), nl.int32, buffer=nl.shared_hbm)
        auto = nl.ndarray((128, 64), nl.int32, buffer=nl.sbuf)  # first fit: byte 0
        nisa.dma_copy(dst=auto, src=a)
        placed = nl.ndarray((128, 64), nl.int32, buffer=nl.sbuf, address=(0, 0))
        nisa.dma_copy(dst=placed, src=b)
        nisa.dma_copy(dst=out[0], src=auto)
        nisa.dma_copy(dst=out[1], src=placed)
        return out

    _check(k(A, B), A, B)


def test_address_in_import_nki_dialect_psum():
    """An automatic PSUM tile (a matmul result) and an explicit PSUM tile at (0, 0)."""
    a = RNG.integers(-3, 4, (128, 128)).astype(np.float32)
    b = RNG.integers(-3, 4, (128, 128)).astype(np.float32)

    @nki.jit
    def k(a, b):
        out = nl.ndarray((2, 128, 128), nl.float32, buffer=nl.shared_hbm)
        st, mv = nl.load(a), nl.load(b)
        acc = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, stationary=st, moving=mv)  # acc = a.T @ b
        placed = nl.ndarray((128, 128), nl.float32, buffer=nl.psum, address=(0, 0))
        nisa.nc_matmul(placed, stationary=mv, moving=st)  # b.T @ a
        nl.store(out[0], value=acc)
        nl.store(out[1], value=placed)
        return out

    _check(k(a, b), a.T @ b, b.T @ a)


def _legacy_sbuf_kernel(buffer):
    @lnki.jit
    def k(a, b):
        out = lnl.ndarray((2, 128, 64), lnl.int32, buffer=lnl.shared_hbm)
        auto = lnl.ndarray((lnl.par_dim(128), 64), lnl.int32, buffer=lnl.sbuf)  # automatic: byte 0
        auto[...] = lnl.load(a)
        placed = lnl.ndarray((lnl.par_dim(128), 64), lnl.int32, buffer=buffer())
        placed[...] = lnl.load(b)
        lnl.store(out[0], value=auto)
        lnl.store(out[1], value=placed)
        return out

    return k


def test_legacy_sbuf_mod_alloc():
    _check(_legacy_sbuf_kernel(lambda: ncc.sbuf.mod_alloc(base_addr=0))(A, B), A, B)


def test_legacy_sbuf_alloc_function():
    _check(_legacy_sbuf_kernel(lambda: ncc.sbuf.alloc(lambda idx, pdim, fdim: (0, 0)))(A, B), A, B)


def test_legacy_shared_identity_matrix_under_mod_alloc_loop():
    """The shape of the SDK's `test_sbuf_modulo_alloc`: the identity is an automatic tile at byte 0
    and the loop's tiles are placed at bytes 0 and up; 4 transposes by matmul, all exact."""
    x = RNG.integers(-100, 100, (128, 512)).astype(np.float32)

    @lnki.jit
    def k(x):
        out = lnl.ndarray((512, 128), lnl.float32, buffer=lnl.shared_hbm)
        ident = lnl.shared_identity_matrix(n=128, dtype=lnl.bfloat16)
        for j in lnl.affine_range(4):
            i_p, i_f = lnl.mgrid[0:128, 0:128]
            xt = lnl.ndarray((lnl.par_dim(128), 128), lnl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
            xt[i_p, i_f] = lnl.load(x[i_p, j * 128 + i_f])
            idf = lnl.ndarray((lnl.par_dim(128), 128), lnl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=512))
            idf[i_p, i_f] = lnl.copy(ident, dtype=lnl.float32)
            ps = lnl.ndarray((lnl.par_dim(128), 128), lnl.float32, buffer=ncc.psum.mod_alloc(base_bank=0))
            ps[i_p, i_f] = lisa.nc_matmul(xt[i_p, i_f], idf)
            lnl.store(out[j * 128 + i_p, i_f], value=ps[i_p, i_f])
        return out

    np.testing.assert_array_equal(k(x), x.T)


def test_legacy_psum_mod_alloc():
    a = RNG.integers(-3, 4, (128, 128)).astype(np.float32)
    b = RNG.integers(-3, 4, (128, 128)).astype(np.float32)

    @lnki.jit
    def k(a, b):
        out = lnl.ndarray((2, 128, 128), lnl.float32, buffer=lnl.shared_hbm)
        st, mv = lnl.load(a), lnl.load(b)
        auto = lnl.ndarray((lnl.par_dim(128), 128), lnl.float32, buffer=lnl.psum)  # automatic: bank 0
        auto[...] = lisa.nc_matmul(st, mv)  # a.T @ b
        placed = lnl.ndarray((lnl.par_dim(128), 128), lnl.float32, buffer=ncc.psum.mod_alloc(base_bank=0))
        placed[...] = lisa.nc_matmul(mv, st)
        lnl.store(out[0], value=auto)
        lnl.store(out[1], value=placed)
        return out

    _check(k(a, b), a.T @ b, b.T @ a)


def test_allocator_records_explicit_over_automatic_only():
    a = Allocator.sbuf()
    _, off = a.alloc(256, "auto")
    a.place(1024, 64, "elsewhere")
    a.place(1024, 64, "alias of elsewhere")  # explicit over explicit: the author's aliasing
    assert a.conflicts == []
    a.place(off, 64, "placed")
    assert a.conflicts == [((off, off + 64, "placed"), (off, off + 256, "auto"))]
    b = Allocator.sbuf()
    b.reserve(0, 512, "held")
    assert b.alloc(64, "auto")[1] >= 512  # automatic tiles go around a reserved range


def test_spmd_launch_overlap_is_an_error_naming_both():
    """An SPMD launch is traced once on a shared chip: no second trace, a clear error instead."""

    @nki.jit
    def k(a, b):
        out = nl.ndarray((128, 64), nl.int32, buffer=nl.shared_hbm)
        auto = nl.ndarray((128, 64), nl.int32, buffer=nl.sbuf, name="auto_tile")
        nisa.dma_copy(dst=auto, src=a)
        placed = nl.ndarray((128, 64), nl.int32, buffer=nl.sbuf, address=(0, 0), name="placed_tile")
        nisa.dma_copy(dst=placed, src=b)
        nisa.dma_copy(dst=out, src=auto)
        return out

    with pytest.raises(AddressError, match="placed_tile.*over auto_tile") as e:
        tn.spmd(k, world_size=1)([(A, B)])
    assert e.value.rule == "nki_placement_over_automatic_tile"
