"""Mixture-of-experts, expert parallel, SPMD across chips: rank e holds expert e's weights; each
rank routes each of its tokens to one expert (top-1). Dispatch is an `all_to_all` of
capacity-packed token buffers (block j of a rank's send buffer goes to rank j), each rank runs
its expert y = relu(x @ W_e) on what it received, and a second `all_to_all` returns the results
to the tokens' ranks (combine), where the gates weight them. Packing and unpacking by route are
index bookkeeping done on the host (numpy); the kernel moves and computes.

Run: python examples/nki_moe_all_to_all.py
"""

import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.collectives as ncc  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


@nki.jit
def moe_expert_parallel(send, w_expert, world):
    rows, d = send.shape  # rows = world * capacity tokens, d <= 128
    group = ncc.ReplicaGroup([list(range(world))])
    recv = nl.ndarray((rows, d), dtype=send.dtype, buffer=nl.private_hbm)
    ncc.all_to_all([send], [recv], group)  # dispatch
    wt = nl.ndarray((d, d), dtype=w_expert.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w_expert)
    xt = nl.ndarray((d, rows), dtype=send.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=recv.permute(1, 0))  # tokens on the free dim: x^T as stationary
    acc = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=xt, moving=wt)
    y = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=y, op=nl.relu, data=acc)
    done = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.private_hbm)
    nisa.dma_copy(dst=done, src=y)
    back = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.shared_hbm)
    ncc.all_to_all([done], [back], group)  # combine
    return back


def pack(route: np.ndarray, world: int, cap: int) -> np.ndarray:
    """slot[t] = where token t sits in its rank's send buffer (expert block, then arrival order)."""
    slot = np.empty(len(route), np.int64)
    fill = np.zeros(world, np.int64)
    for t, e in enumerate(route):
        slot[t] = e * cap + fill[e]
        fill[e] += 1
    return slot


def main(world: int = 4, lnc: int = 1, tokens: int = 16, d: int = 64) -> int:
    rng = np.random.default_rng(1)
    cap = tokens  # capacity per (rank, expert): no token dropped
    xs = [rng.integers(-2, 3, size=(tokens, d)).astype(np.float32) for _ in range(world)]
    ws = [rng.integers(-2, 3, size=(d, d)).astype(np.float32) for _ in range(world)]
    routes = [rng.integers(0, world, size=tokens) for _ in range(world)]
    gates = [rng.integers(1, 4, size=tokens).astype(np.float32) for _ in range(world)]
    sends, slots = [], []
    for r in range(world):
        slot = pack(routes[r], world, cap)
        buf = np.zeros((world * cap, d), np.float32)
        buf[slot] = xs[r]
        sends.append(buf)
        slots.append(slot)
    launch = trn3emu.nki.spmd(moe_expert_parallel, world_size=world, lnc=lnc)
    backs = launch([(sends[r], ws[r], world) for r in range(world)])
    ok = True
    for r in range(world):
        got = backs[r][slots[r]] * gates[r][:, None]
        want = np.stack([np.maximum(xs[r][t] @ ws[routes[r][t]], 0) * gates[r][t] for t in range(tokens)])
        ok &= np.array_equal(got, want)
    print(
        f"MoE expert-parallel dispatch/combine over {world} ranks: {'exact' if ok else 'MISMATCH'}; {launch.last_result}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
