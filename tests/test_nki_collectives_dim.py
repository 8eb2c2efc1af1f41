"""`nki.collectives` with the NKI 0.6 API reference signatures (issue 28): all_gather / reduce_scatter
/ all_to_all take `collective_dim` (any dim, positional as the reference spells them), and
`all_gather_v` (new in 0.6.0) runs on one chip and across chips. Integer data: exact against numpy."""

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import OperandError, ShapeError

tn.install()
import nki  # noqa: E402
import nki.collectives as cc  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

N = 4
RNG = np.random.default_rng(6)
X = RNG.integers(-1000, 1000, (N, 4, 8, 12)).astype(np.int32)  # rank r's src: X[r] (4, 8, 12)


def _kernel(op_name, dim):
    """Each program (rank) runs the collective on its (4, 8, 12) src in private HBM along `dim` and
    stores its dst as row `rank` of the output."""
    ish = X.shape[1:]

    def dst_shape():
        if op_name == "all_gather":
            return tuple(s * N if i == dim % 3 else s for i, s in enumerate(ish))
        if op_name == "reduce_scatter":
            return tuple(s // N if i == dim % 3 else s for i, s in enumerate(ish))
        return ish

    shape = dst_shape()

    @nki.jit
    def k(x):
        pid = nl.program_id(0)
        out = nl.ndarray((N,) + shape, x.dtype, buffer=nl.shared_hbm)
        src = nl.ndarray(ish, x.dtype, buffer=nl.private_hbm)
        nisa.dma_copy(dst=src, src=x[pid])
        dst = nl.ndarray(shape, x.dtype, buffer=nl.private_hbm)
        group = cc.ReplicaGroup([list(range(N))])
        if op_name == "all_gather":
            cc.all_gather([src], [dst], group, dim)
        elif op_name == "reduce_scatter":
            cc.reduce_scatter([src], [dst], group, dim, nl.add)
        else:
            cc.all_to_all([src], [dst], group, dim)
        nisa.dma_copy(dst=out[pid], src=dst)
        return out

    return k


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_all_gather_any_dim(dim):
    got = _kernel("all_gather", dim)[N](X)
    want = np.concatenate(list(X), axis=dim)
    for r in range(N):
        np.testing.assert_array_equal(got[r], want)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_reduce_scatter_any_dim(dim):
    got = _kernel("reduce_scatter", dim)[N](X)
    total = X.sum(axis=0)
    chunks = np.split(total, N, axis=dim)
    for r in range(N):
        np.testing.assert_array_equal(got[r], chunks[r])


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_all_to_all_any_dim(dim):
    got = _kernel("all_to_all", dim)[N](X)
    for i in range(N):
        want = np.concatenate([np.split(X[j], N, axis=dim)[i] for j in range(N)], axis=dim)
        np.testing.assert_array_equal(got[i], want)


def test_collective_dim_rules():
    with pytest.raises(OperandError, match="collective_dim 3 is not an axis") as e:
        _kernel("all_gather", 3)[N](X)
    assert e.value.rule == "nki_collective_dim"
    y = RNG.integers(0, 9, (N, 4, 6, 12)).astype(np.int32)  # dim 1 (6) does not split over 4 ranks

    @nki.jit
    def k(x):
        pid = nl.program_id(0)
        src = nl.ndarray((4, 6, 12), x.dtype, buffer=nl.private_hbm)
        nisa.dma_copy(dst=src, src=x[pid])
        dst = nl.ndarray((4, 6, 12), x.dtype, buffer=nl.private_hbm)
        cc.all_to_all([src], [dst], cc.ReplicaGroup([list(range(N))]), 1)
        return dst

    with pytest.raises(ShapeError, match="split into 4 chunks along dim 1"):
        k[N](y)


# --------------------------------------------------------------------------------- all_gather_v
def _all_gather_v_reference(xs, counts, displs, cap, rdispls=None):
    """Rank s's chunk xs[s][displs[s]:+counts[s]] lands at rdispls[s] or at s * (cap // n) in every
    rank's dst; the rest keeps -7."""
    n = len(xs)
    want = np.full(cap, -7, np.int32)
    for s in range(n):
        at = s * (cap // n) if rdispls is None else rdispls[s]
        want[at : at + counts[s]] = xs[s][displs[s] : displs[s] + counts[s]]
    return want


def _gather_v_kernel(n, cap, width, has_rdispls, recv_counts_known):
    rows = 4 if has_rdispls else 3

    @nki.jit
    def k(x, meta, rank):
        r = rank if rank is not None else nl.program_id(0)
        out = nl.ndarray((1, cap), x.dtype, buffer=nl.shared_hbm)
        mo = nl.ndarray((rows, n), nl.uint32, buffer=nl.shared_hbm)
        src = nl.ndarray((1, width), x.dtype, buffer=nl.private_hbm)
        nisa.dma_copy(dst=src, src=x[r : r + 1])
        dst = nl.ndarray((1, cap), x.dtype, buffer=nl.private_hbm)
        nisa.dma_copy(dst=dst, src=nl.shared_constant(np.full((1, cap), -7, np.int32)))
        m = nl.ndarray((rows, n), nl.uint32, buffer=nl.private_hbm)
        nisa.dma_copy(dst=m, src=meta[r])
        cc.all_gather_v(
            [src],
            [dst],
            cc.ReplicaGroup([list(range(n))]),
            m,
            recv_counts_known=recv_counts_known,
            has_rdispls=has_rdispls,
        )
        if rank is not None or r == 0:  # (a plain launch's programs share out: program 0 stores)
            nisa.dma_copy(dst=out, src=dst)
            nisa.dma_copy(dst=mo, src=m)
        return out, mo

    return k


def _gather_v_case(n, has_rdispls):
    width, cap = 10, 12 * n
    xs = RNG.integers(-1000, 1000, (n, width)).astype(np.int32)
    counts = RNG.integers(0, 11, n)
    displs = np.array([RNG.integers(0, width - c + 1) for c in counts])
    rdispls = np.cumsum(np.concatenate(([1], counts[:-1] + 1))) if has_rdispls else None  # gaps of one
    meta = np.zeros((n, 4 if has_rdispls else 3, n), np.uint32)
    for r in range(n):
        meta[r, 0, 0], meta[r, 1, 0] = counts[r], displs[r]  # only the first column is read
        meta[r, 0, 1:], meta[r, 1, 1:] = 999, 999
        if has_rdispls:
            meta[r, 3] = rdispls
    return xs, meta, counts, _all_gather_v_reference(xs, counts, displs, cap, rdispls), cap, width


@pytest.mark.parametrize("has_rdispls", [False, True])
def test_all_gather_v_one_chip(has_rdispls):
    xs, meta, counts, want, cap, width = _gather_v_case(N, has_rdispls)
    out, mo = _gather_v_kernel(N, cap, width, has_rdispls, False)[N](xs, meta, None)
    np.testing.assert_array_equal(out[0], want)  # rank 0's
    np.testing.assert_array_equal(mo[2], counts.astype(np.uint32))  # row 2: the counts received


def test_all_gather_v_every_rank_and_recv_counts_known_keeps_row_2():
    xs, meta, counts, want, cap, width = _gather_v_case(N, False)
    k = _gather_v_kernel(N, cap, width, False, True)
    launch = tn.spmd(k, world_size=N)
    outs = launch([(xs, meta, r) for r in range(N)])
    for r, (out, mo) in enumerate(outs):
        np.testing.assert_array_equal(out[0], want)
        np.testing.assert_array_equal(mo, meta[r])  # row 2 untouched


def test_all_gather_v_across_chips():
    n = 16  # two chips of 8 cores
    xs, meta, counts, want, cap, width = _gather_v_case(n, True)
    k = _gather_v_kernel(n, cap, width, True, False)
    launch = tn.spmd(k, world_size=n)
    outs = launch([(xs, meta, r) for r in range(n)])
    assert len(launch.last_result.chips) == 2
    for out, mo in outs:
        np.testing.assert_array_equal(out[0], want)
        np.testing.assert_array_equal(mo[2], counts.astype(np.uint32))
