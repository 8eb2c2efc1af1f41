"""`nki.lnc` (NKI 0.8.0): sendrecv, sendrecv_compute and core_barrier between the two cores of an
LNC=2 launch (`kernel[2]`), against numpy; the deprecated `nki.isa` entry points warn at the
kernel's line."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu import errors as E

tn.install()
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
import nki.lnc as lnc  # noqa: E402

SHAPE = (128, 64)


def _pair_input(seed=0):
    return np.random.default_rng(seed).standard_normal((2, *SHAPE)).astype(np.float32)


def _pair_kernel(exchange):
    """A kernel[2] whose program r loads a[r] into x, calls `exchange(x, z, peer)` to fill the tile
    z, and stores z as out[r]."""

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        r = nl.program_id(0)
        x = nl.ndarray(SHAPE, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a[r])
        z = nl.ndarray(SHAPE, dtype=a.dtype, buffer=nl.sbuf)
        exchange(x, z, 1 - r)
        nisa.dma_copy(dst=out[r], src=z)
        return out

    return k


_swap = _pair_kernel(lambda x, z, peer: lnc.sendrecv(src=x, dst=z, send_to_rank=peer, recv_from_rank=peer))


def test_sendrecv_swaps_the_pair_tiles_without_a_warning():
    a = _pair_input()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        out = _swap[2](a)
    np.testing.assert_array_equal(out[0], a[1])
    np.testing.assert_array_equal(out[1], a[0])


def _reducer(op):
    return _pair_kernel(
        lambda x, z, peer: lnc.sendrecv_compute(
            src=x, dst=z, send_to_rank=peer, recv_from_rank=peer, reduce_op=op, priority=1
        )
    )


@pytest.mark.parametrize("op, ref", [("add", np.add), ("maximum", np.maximum), ("minimum", np.minimum)])
def test_sendrecv_compute_reduces_the_local_and_the_peer_tile(op, ref):
    a = _pair_input(seed=1)
    out = _reducer(getattr(nl, op))[2](a)
    want = ref(a[0], a[1])  # (each core: reduce_op(own, peer); add and max / min are symmetric)
    np.testing.assert_array_equal(out[0], want)
    np.testing.assert_array_equal(out[1], want)


@nki.jit
def _barrier(a):
    """Each core writes its half of a shared tensor, waits at the barrier, then reads the whole."""
    shared = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    out = nl.ndarray((2, *a.shape), dtype=a.dtype, buffer=nl.shared_hbm)
    r = nl.program_id(0)
    half = a.shape[0] // 2
    t = nl.ndarray((half, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[r * half : (r + 1) * half])
    nisa.dma_copy(dst=shared[r * half : (r + 1) * half], src=t)
    lnc.core_barrier(data=shared, cores=(0, 1))
    w = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w, src=shared)
    nisa.dma_copy(dst=out[r], src=w)
    return out


def test_core_barrier_orders_the_halves_before_the_reads():
    a = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    out = _barrier[2](a)
    np.testing.assert_array_equal(out[0], a)
    np.testing.assert_array_equal(out[1], a)


_old_swap = _pair_kernel(
    lambda x, z, peer: nisa.sendrecv(src=x, dst=z, send_to_rank=peer, recv_from_rank=peer, pipe_id=3)
)


def test_the_nki_isa_entry_point_still_works_and_warns_at_the_kernel_line():
    a = _pair_input(seed=3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", DeprecationWarning)
        out = _old_swap[2](a)
    np.testing.assert_array_equal(out[0], a[1])
    dep = [w for w in seen if issubclass(w.category, DeprecationWarning) and "nki.lnc.sendrecv" in str(w.message)]
    assert dep and all(w.filename == __file__ for w in dep), [(w.filename, str(w.message)) for w in seen]


def _bad(**call):
    if "reduce_op" in call:
        return _pair_kernel(
            lambda x, z, peer: lnc.sendrecv_compute(src=x, dst=z, send_to_rank=peer, recv_from_rank=peer, **call)
        )
    return _pair_kernel(lambda x, z, peer: lnc.sendrecv(src=x, dst=z, send_to_rank=peer, recv_from_rank=peer, **call))


@pytest.mark.parametrize(
    "call, rule",
    [
        ({"priority": 4}, "nki_lnc_priority"),
        ({"priority": 0, "dma_engine": nisa.dma_engine.gpsimd_dma}, "nki_lnc_priority"),
        ({"reduce_op": nl.multiply}, "nki_lnc_reduce_op"),
    ],
)
def test_bad_calls_name_the_rule(call, rule):
    with pytest.raises(E.OperandError) as e:
        _bad(**call)[2](_pair_input())
    assert e.value.rule == rule


def test_sendrecv_compute_needs_src_and_dst_in_one_memory():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        r = nl.program_id(0)
        x = nl.ndarray(SHAPE, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a[r])
        lnc.sendrecv_compute(src=x, dst=out[r], send_to_rank=1 - r, recv_from_rank=1 - r, reduce_op=nl.add)
        return out

    with pytest.raises(E.MemorySpaceError) as e:
        k[2](_pair_input())
    assert e.value.rule == "nki_lnc_operands"
