"""Ring all-gather fused with a matmul, SPMD across chips (the pattern of the public NKI
collectives tutorial, written anew): each rank holds a column shard X_r [K, M/W] of X and the
whole of W [K, N]; every rank computes all of X^T W [M, N]. The shards travel around the ring of
ranks with `collective_permute_implicit` while each rank multiplies the shard it holds, so
communication overlaps compute: at step t rank r works on the shard of rank (r - t) mod W.

Run: python examples/nki_ring_allgather_matmul.py
"""

import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.collectives as ncc  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


@nki.jit
def ring_allgather_matmul(x_shard, w, world):
    k, ms = x_shard.shape
    _, n_all = w.shape
    # With LNC=2 the two programs of a rank split the output columns.
    n = n_all // nl.num_programs(0)
    c0 = nl.program_id(0) * n
    rank = ncc.rank_id()
    ring = ncc.ReplicaGroup([list(range(world))])
    out = nl.ndarray((world * ms, n_all), dtype=nl.float32, buffer=nl.shared_hbm)
    wt = nl.ndarray((k, n), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w[:, c0 : c0 + n])
    bufs = [nl.ndarray((k, ms), dtype=x_shard.dtype, buffer=nl.sbuf) for _ in range(2)]
    nisa.dma_copy(dst=bufs[0], src=x_shard)
    for t in range(world):
        cur = bufs[t % 2]
        if t + 1 < world:  # pass the shard on while multiplying it
            ncc.collective_permute_implicit([[cur]], [[bufs[(t + 1) % 2]]], ring)
        owner = (rank - t) % world
        acc = nl.ndarray((ms, n), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=cur, moving=wt)
        res = nl.ndarray((ms, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out[owner * ms : (owner + 1) * ms, c0 : c0 + n], src=res)
    return out


def main(world: int = 4, lnc: int = 1, k: int = 128, ms: int = 64, n: int = 256) -> int:
    rng = np.random.default_rng(0)
    # Small integers: every product and sum is exact in fp32, so the check is bit for bit.
    x = rng.integers(-3, 4, size=(k, world * ms)).astype(np.float32)
    w = rng.integers(-3, 4, size=(k, n)).astype(np.float32)
    shards = [x[:, r * ms : (r + 1) * ms].copy() for r in range(world)]
    launch = trn3emu.nki.spmd(ring_allgather_matmul, world_size=world, lnc=lnc)
    outs = launch([(shards[r], w, world) for r in range(world)])
    want = x.T @ w
    ok = all(np.array_equal(o, want) for o in outs)
    r = launch.last_result
    print(f"ring all-gather + matmul over {world} ranks: {'exact' if ok else 'MISMATCH'}; {r}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
