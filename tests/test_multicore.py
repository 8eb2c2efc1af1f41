"""All 8 cores on one device: LNC=2 `sendrecv` / `core_barrier`, the device collectives, and the
race and deadlock checks across cores. References are numpy, written here."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3
from trn3emu.errors import DeadlockError, DtypeError, MemorySpaceError, OperandError, RaceError, ShapeError


def _load(p: t3.Program, h, name: str = ""):
    t = p.sbuf(h.shape, h.dtype, name=name)
    p.dma_copy(dst=t, src=h)
    return t


def test_programs_helper_gives_ranks_and_peers(dev):
    progs = dev.programs()
    assert [p.core for p in progs] == list(range(8))
    assert [p.rank for p in progs] == [0, 1] * 4
    assert [p.peer for p in progs] == [1, 0, 3, 2, 5, 4, 7, 6]
    assert [p.peer_rank for p in progs] == [1, 0] * 4


@pytest.mark.parametrize("pair", [(0, 1), (6, 7)])
def test_sendrecv_exchanges_tiles_between_lnc2_pair(dev, rng, pair):
    data = {c: rng.integers(-1000, 1000, size=(128, 64)).astype(np.float32) for c in pair}
    outs = {}
    progs = dev.programs(pair)
    for p in progs:
        src = _load(p, dev.hbm.put(data[p.core]))
        dst = p.sbuf((128, 64), "float32")
        p.sendrecv(src=src, dst=dst, send_to_rank=p.peer_rank, recv_from_rank=p.peer_rank, pipe_id=0)
        outs[p.core] = dev.hbm.alloc((128, 64), "float32")
        p.dma_copy(dst=outs[p.core], src=dst)
    dev.run(progs)
    a, b = pair
    np.testing.assert_array_equal(dev.hbm.get(outs[a]), data[b])
    np.testing.assert_array_equal(dev.hbm.get(outs[b]), data[a])


def test_sendrecv_bf16_partial_partitions_raw_bits(dev, rng):
    import ml_dtypes

    bits = {c: rng.integers(0, 1 << 16, size=(32, 16), dtype=np.uint16) for c in (0, 1)}
    outs = {}
    progs = dev.programs([0, 1])
    for p in progs:
        src = _load(p, dev.hbm.put(bits[p.core].view(ml_dtypes.bfloat16)))
        dst = p.sbuf((32, 16), "bfloat16")
        p.sendrecv(src=src, dst=dst, send_to_rank=p.peer_rank, recv_from_rank=p.peer_rank, pipe_id=3)
        outs[p.core] = dev.hbm.alloc((32, 16), "bfloat16")
        p.dma_copy(dst=outs[p.core], src=dst)
    dev.run(progs)
    np.testing.assert_array_equal(dev.hbm.get(outs[0]).view(np.uint16), bits[1])
    np.testing.assert_array_equal(dev.hbm.get(outs[1]).view(np.uint16), bits[0])


def test_two_sendrecvs_on_two_pipes_and_a_chain(dev, rng):
    """Two rounds: round 2 sends back what round 1 received (so each core ends with its own data)."""
    data = {c: rng.integers(0, 100, size=(16, 8)).astype(np.int32) for c in (0, 1)}
    outs = {}
    progs = dev.programs([0, 1])
    for p in progs:
        src = _load(p, dev.hbm.put(data[p.core]))
        mid = p.sbuf((16, 8), "int32")
        back = p.sbuf((16, 8), "int32")
        p.sendrecv(src=src, dst=mid, send_to_rank=p.peer_rank, recv_from_rank=p.peer_rank, pipe_id=0)
        p.sendrecv(src=mid, dst=back, send_to_rank=p.peer_rank, recv_from_rank=p.peer_rank, pipe_id=1)
        outs[p.core] = dev.hbm.alloc((16, 8), "int32")
        p.dma_copy(dst=outs[p.core], src=back)
    dev.run(progs)
    for c in (0, 1):
        np.testing.assert_array_equal(dev.hbm.get(outs[c]), data[c])


def _hbm_handoff(dev, rng, barrier: bool, sync: str = "auto"):
    """Core 0 writes a shared HBM tensor; core 1 reads it (after a core_barrier when `barrier`)."""
    x = rng.integers(-50, 50, size=(64, 32)).astype(np.float32)
    shared = dev.hbm.alloc((64, 32), "float32", name="shared")
    out = dev.hbm.alloc((64, 32), "float32", name="out")
    p0, p1 = dev.programs([0, 1])
    t = _load(p0, dev.hbm.put(x))
    p0.dma_copy(dst=shared, src=t)
    if barrier:
        p0.core_barrier(data=shared, cores=[0, 1])
        p1.core_barrier(data=shared, cores=[0, 1])
    r = p1.sbuf((64, 32), "float32")
    p1.dma_copy(dst=r, src=shared)
    p1.dma_copy(dst=out, src=r)
    return x, out, [p0, p1]


def test_core_barrier_orders_an_hbm_handoff(dev, rng):
    x, out, progs = _hbm_handoff(dev, rng, barrier=True)
    res = dev.run(progs)
    np.testing.assert_array_equal(dev.hbm.get(out), x)
    assert res.time_ns > 0


def test_cross_core_hbm_race_without_barrier_names_both_instructions(dev, rng):
    _, _, progs = _hbm_handoff(dev, rng, barrier=False)
    with pytest.raises(RaceError) as e:
        dev.run(progs)
    msg = str(e.value)
    assert "core 0" in msg and "core 1" in msg
    assert msg.count("dma_copy") >= 2


def test_core_barrier_blocks_only_its_engine(dev):
    """Core 1's GpSimd barrier waits for core 0's late one; core 1's Vector work after it is not held."""
    shared = dev.hbm.alloc((1, 16), "float32")
    p0, p1 = dev.programs([0, 1])
    for _ in range(40):
        p0.memset(dst=p0.sbuf((128, 512), "float32"), value=1.0, engine="gpsimd")  # delays core 0's barrier
    p0.core_barrier(data=shared, cores=[0, 1])
    p1.core_barrier(data=shared, cores=[0, 1])
    t = p1.sbuf((128, 16), "float32")
    p1.memset(dst=t, value=2.0, engine="vector")
    res = dev.run([p0, p1])
    recs = {(r["core"], r["opcode"]): r for r in res.trace}
    b0, b1 = recs[(0, "core_barrier")], recs[(1, "core_barrier")]
    ms1 = recs[(1, "memset")]
    assert b0["end_ns"] == b1["end_ns"]
    assert b1["start_ns"] < b0["start_ns"]  # core 1 arrived first and waited
    assert ms1["end_ns"] < b0["start_ns"]  # core 1's vector was not blocked


def test_deadlock_across_cores_is_reported(dev):
    shared = dev.hbm.alloc((1, 16), "float32")
    p0, p1 = dev.programs([0, 1])
    p0.core_barrier(data=shared, cores=[0, 1])
    p1.nop()
    with pytest.raises(DeadlockError, match="core_barrier"):
        dev.run([p0, p1])


def test_sendrecv_on_different_pipes_deadlocks(dev):
    p0, p1 = dev.programs([0, 1])
    for p, pipe in ((p0, 0), (p1, 1)):
        s, d = p.sbuf((8, 8), "float32"), p.sbuf((8, 8), "float32")
        p.memset(dst=s, value=1.0)
        p.sendrecv(src=s, dst=d, send_to_rank=p.peer_rank, recv_from_rank=p.peer_rank, pipe_id=pipe)
    with pytest.raises(DeadlockError, match="sendrecv"):
        dev.run([p0, p1])


def test_sendrecv_needs_the_peer_core(dev):
    p2 = t3.Program(core=2)
    s, d = p2.sbuf((8, 8), "float32"), p2.sbuf((8, 8), "float32")
    p2.sendrecv(src=s, dst=d, send_to_rank=1, recv_from_rank=1, pipe_id=0)
    with pytest.raises(OperandError, match="LNC=2 peer core 3"):
        dev.run([p2])


def test_sendrecv_to_own_rank_is_rejected(dev):
    p0, p1 = dev.programs([0, 1])
    for p in (p0, p1):
        s, d = p.sbuf((8, 8), "float32"), p.sbuf((8, 8), "float32")
        p.sendrecv(src=s, dst=d, send_to_rank=0, recv_from_rank=0, pipe_id=0)
    with pytest.raises(OperandError, match="must send to the other rank") as e:
        dev.run([p0, p1])
    assert e.value.operand == "send_to_rank"


def test_sendrecv_rank_out_of_pair_is_rejected():
    p = t3.Program(core=0)
    s, d = p.sbuf((8, 8), "float32"), p.sbuf((8, 8), "float32")
    with pytest.raises(OperandError, match="0 or 1"):
        p.sendrecv(src=s, dst=d, send_to_rank=2, recv_from_rank=2, pipe_id=0)


def test_sendrecv_shape_mismatch_between_ranks(dev):
    p0, p1 = dev.programs([0, 1])
    for p, f in ((p0, 8), (p1, 4)):
        s, d = p.sbuf((8, f), "float32"), p.sbuf((8, f), "float32")
        p.memset(dst=s, value=0.0)
        p.sendrecv(src=s, dst=d, send_to_rank=p.peer_rank, recv_from_rank=p.peer_rank, pipe_id=0)
    with pytest.raises(ShapeError, match="same shape"):
        dev.run([p0, p1])


def test_sendrecv_dtype_mismatch(dev):
    p = t3.Program(core=0)
    with pytest.raises(DtypeError, match="same dtype"):
        p.sendrecv(
            src=p.sbuf((8, 8), "float32"), dst=p.sbuf((8, 8), "int32"), send_to_rank=1, recv_from_rank=1, pipe_id=0
        )
    p0, p1 = dev.programs([0, 1])
    for p, dt in ((p0, "float32"), (p1, "int32")):
        s, d = p.sbuf((8, 8), dt), p.sbuf((8, 8), dt)
        p.memset(dst=s, value=0.0)
        p.sendrecv(src=s, dst=d, send_to_rank=p.peer_rank, recv_from_rank=p.peer_rank, pipe_id=0)
    with pytest.raises(DtypeError, match="same dtype"):
        dev.run([p0, p1])


def test_sendrecv_gpsimd_dma_size_limit():
    p = t3.Program(core=0)
    s, d = p.sbuf((8, 512), "float32"), p.sbuf((8, 512), "float32")
    with pytest.raises(ShapeError, match="1024 bytes per partition"):
        p.sendrecv(src=s, dst=d, send_to_rank=1, recv_from_rank=1, pipe_id=0, dma_engine="gpsimd_dma", engine="gpsimd")
    s2, d2 = p.sbuf((8, 256), "float32"), p.sbuf((8, 256), "float32")
    p.sendrecv(src=s2, dst=d2, send_to_rank=1, recv_from_rank=1, pipe_id=0, dma_engine="gpsimd_dma", engine="gpsimd")


@pytest.mark.parametrize("cores", [[0, 2], [1, 0], [0], [0, 1, 2]])
def test_core_barrier_only_between_ranks_0_and_1(dev, cores):
    p = t3.Program(core=0)
    with pytest.raises(OperandError, match=r"cores must be \(0, 1\)"):
        p.core_barrier(data=dev.hbm.alloc((1, 4), "float32"), cores=cores)


def test_private_hbm_is_not_visible_to_another_core(dev):
    priv = dev.hbm.alloc((8, 8), "float32", core=0)
    p1 = t3.Program(core=1)
    with pytest.raises(MemorySpaceError, match="belongs to core 0"):
        p1.dma_copy(dst=p1.sbuf((8, 8), "float32"), src=priv)
    p0 = t3.Program(core=0)
    p0.dma_copy(dst=p0.sbuf((8, 8), "float32"), src=priv)


# ----------------------------------------------------------------------------------- collectives


def _fold(arrays, op):
    """Left fold in rank order in float32, as documented for the collectives."""
    acc = arrays[0].astype(np.float32)
    for a in arrays[1:]:
        acc = op(acc, a.astype(np.float32)).astype(np.float32)
    return acc


@pytest.mark.parametrize("mem", ["hbm", "sbuf"])
def test_all_reduce_8_cores_integer_valued_exact(dev, rng, mem):
    xs = [rng.integers(-(1 << 16), 1 << 16, size=(16, 32)).astype(np.float32) for _ in range(8)]
    outs = []
    progs = dev.programs()
    for p, x in zip(progs, xs):
        h = dev.hbm.put(x)
        out = dev.hbm.alloc((16, 32), "float32")
        if mem == "hbm":
            p.all_reduce(dst=out, src=h)
        else:
            s = _load(p, h)
            d = p.sbuf((16, 32), "float32")
            p.all_reduce(dst=d, src=s)
            p.dma_copy(dst=out, src=d)
        outs.append(out)
    dev.run(progs)
    want = np.sum(np.stack(xs).astype(np.int64), axis=0).astype(np.float32)
    for out in outs:
        np.testing.assert_array_equal(dev.hbm.get(out), want)


def test_all_reduce_fp32_follows_rank_order_bitwise(dev, rng):
    xs = [(rng.standard_normal((8, 64)) * 10.0 ** rng.integers(-3, 4)).astype(np.float32) for _ in range(8)]
    order = [3, 1, 4, 0, 5, 7, 2, 6]  # replica group order = rank order
    outs = {}
    progs = dev.programs()
    for p in progs:
        out = dev.hbm.alloc((8, 64), "float32")
        p.all_reduce(dst=out, src=dev.hbm.put(xs[p.core]), cores=order)
        outs[p.core] = out
    dev.run(progs)
    want = _fold([xs[c] for c in order], np.add)
    for c in range(8):
        np.testing.assert_array_equal(dev.hbm.get(outs[c]).view(np.uint32), want.view(np.uint32))


def test_all_reduce_max_on_a_subgroup_and_bf16_output(dev, rng):
    import ml_dtypes

    group = [4, 5, 6, 7]
    xs = {c: rng.standard_normal((4, 16)).astype(np.float32) for c in group}
    outs = {}
    progs = dev.programs(group)
    for p in progs:
        outs[p.core] = dev.hbm.alloc((4, 16), "bfloat16")
        p.all_reduce(dst=outs[p.core], src=dev.hbm.put(xs[p.core]), cores=group, reduce_op="maximum")
    dev.run(progs)
    want = np.max(np.stack([xs[c] for c in group]), axis=0).astype(ml_dtypes.bfloat16)
    for c in group:
        np.testing.assert_array_equal(dev.hbm.get(outs[c]).view(np.uint16), want.view(np.uint16))


def test_all_gather_8_cores(dev, rng):
    xs = [rng.integers(0, 1 << 30, size=(4, 8)).astype(np.int32) for _ in range(8)]
    outs = []
    progs = dev.programs()
    for p in progs:
        out = dev.hbm.alloc((32, 8), "int32")
        p.all_gather(dst=out, src=dev.hbm.put(xs[p.core]))
        outs.append(out)
    dev.run(progs)
    want = np.concatenate(xs, axis=0)
    for out in outs:
        np.testing.assert_array_equal(dev.hbm.get(out), want)


def test_reduce_scatter_8_cores(dev, rng):
    xs = [rng.integers(-100, 100, size=(16, 8)).astype(np.float32) for _ in range(8)]
    outs = []
    progs = dev.programs()
    for p in progs:
        out = dev.hbm.alloc((2, 8), "float32")
        p.reduce_scatter(dst=out, src=dev.hbm.put(xs[p.core]))
        outs.append(out)
    dev.run(progs)
    total = _fold(xs, np.add)
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(dev.hbm.get(out), total[2 * r : 2 * r + 2])


def test_all_reduce_then_barrier_free_reuse_is_ordered(dev, rng):
    """After an all_reduce every rank may read another rank's result: the rendezvous orders it."""
    xs = [rng.integers(0, 10, size=(2, 8)).astype(np.float32) for _ in range(2)]
    outs = [dev.hbm.alloc((2, 8), "float32") for _ in range(2)]
    got = dev.hbm.alloc((2, 8), "float32")
    progs = dev.programs([0, 1])
    for p in progs:
        p.all_reduce(dst=outs[p.core], src=dev.hbm.put(xs[p.core]), cores=[0, 1])
    t = progs[1].sbuf((2, 8), "float32")
    progs[1].core_barrier(data=outs[0], cores=[0, 1])
    progs[0].core_barrier(data=outs[0], cores=[0, 1])
    progs[1].dma_copy(dst=t, src=outs[0])
    progs[1].dma_copy(dst=got, src=t)
    dev.run(progs)
    np.testing.assert_array_equal(dev.hbm.get(got), xs[0] + xs[1])


def test_collective_invalid_uses(dev):
    p = t3.Program(core=0)
    h = dev.hbm.alloc((4, 4), "float32")
    with pytest.raises(OperandError, match="appears twice"):
        p.all_reduce(dst=h, src=h, cores=[0, 0])
    with pytest.raises(OperandError, match="not a core of the device"):
        p.all_gather(dst=h, src=h, cores=[0, 144 * 8])
    with pytest.raises(OperandError, match="reduce_op"):
        p.all_reduce(dst=h, src=h, reduce_op="subtract")
    q = t3.Program(core=0)
    q.all_reduce(dst=h, src=h, cores=[1, 2])
    with pytest.raises(OperandError, match="does not contain it"):
        dev.run([q, t3.Program(core=1), t3.Program(core=2)])


def test_collective_shape_mismatch_and_reduce_scatter_divisibility(dev):
    progs = dev.programs([0, 1])
    for p, n in zip(progs, (4, 8)):
        h = dev.hbm.alloc((1, n), "float32")
        p.all_reduce(dst=h, src=h, cores=[0, 1])
    with pytest.raises(ShapeError, match="same shape"):
        dev.run(progs)
    progs = dev.programs([0, 1, 2])
    for p in progs:
        p.reduce_scatter(dst=dev.hbm.alloc((1, 1), "float32"), src=dev.hbm.alloc((1, 4), "float32"), cores=[0, 1, 2])
    with pytest.raises(ShapeError, match="not divisible"):
        dev.run(progs)


def test_collectives_cost_time(dev):
    progs = dev.programs()
    for p in progs:
        h = dev.hbm.alloc((128, 1024), "float32")
        p.all_reduce(dst=h, src=h)
    res = dev.run(progs)
    # ring all-reduce of 512 KiB per rank: 2*7/8 of it over the 16 DMA engines, plus fixed costs.
    assert res.time_ns > 2 * 7 / 8 * 512 * 1024 / (16 * 33)


def test_multicore_run_is_deterministic(dev, rng):
    xs = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(8)]

    def once():
        d = t3.Device()
        outs = []
        progs = d.programs()
        for p in progs:
            o = d.hbm.alloc((8, 8), "float32")
            p.all_reduce(dst=o, src=d.hbm.put(xs[p.core]))
            outs.append(o)
        r = d.run(progs)
        return r.time_ns, [d.hbm.get(o).tobytes() for o in outs]

    assert once() == once()


@pytest.mark.parametrize("barrier_waits_for_dma", [True, False])
def test_manual_sync_barrier_must_wait_for_the_local_dma(dev, rng, barrier_waits_for_dma):
    """With sync='manual' the barrier only orders what its own engine waited for."""
    x = rng.integers(0, 9, size=(8, 8)).astype(np.float32)
    xh, shared, out = dev.hbm.put(x), dev.hbm.alloc((8, 8), "float32"), dev.hbm.alloc((8, 8), "float32")
    p0, p1 = dev.programs([0, 1], sync="manual")
    a, b = p0.semaphore(), p0.semaphore()
    t = p0.sbuf((8, 8), "float32")
    p0.dma_copy(dst=t, src=xh, signal=a)
    p0.dma_copy(dst=shared, src=t, wait=[(a, 1)], signal=b)
    p0.core_barrier(data=shared, cores=[0, 1], wait=[(b, 1)] if barrier_waits_for_dma else [])
    c, d = p1.semaphore(), p1.semaphore()
    r = p1.sbuf((8, 8), "float32")
    p1.core_barrier(data=shared, cores=[0, 1], signal=c)
    p1.dma_copy(dst=r, src=shared, wait=[(c, 1)], signal=d)
    p1.dma_copy(dst=out, src=r, wait=[(d, 1)])
    if barrier_waits_for_dma:
        dev.run([p0, p1])
        np.testing.assert_array_equal(dev.hbm.get(out), x)
    else:
        # The barrier reads and writes `data` (its ordering footprint): unordered with the DMA.
        with pytest.raises(RaceError, match="core 0 #2 `core_barrier.*core 0 #1 `dma_copy"):
            dev.run([p0, p1])


def test_all_four_pairs_exchange_concurrently_with_dma_traffic(dev, rng):
    data = {c: rng.integers(-(1 << 20), 1 << 20, size=(64, 32)).astype(np.int32) for c in range(8)}
    outs, side = {}, {}
    progs = dev.programs()
    for p in progs:
        src = _load(p, dev.hbm.put(data[p.core]))
        dst = p.sbuf((64, 32), "int32")
        # unrelated DMA traffic on the same core keeps running while the exchange waits
        side[p.core] = dev.hbm.alloc((64, 32), "int32")
        p.dma_copy(dst=side[p.core], src=src, engine="scalar")
        p.sendrecv(src=src, dst=dst, send_to_rank=p.peer_rank, recv_from_rank=p.peer_rank, pipe_id=p.core // 2)
        outs[p.core] = dev.hbm.alloc((64, 32), "int32")
        p.dma_copy(dst=outs[p.core], src=dst)
    dev.run(progs)
    for c in range(8):
        np.testing.assert_array_equal(dev.hbm.get(outs[c]), data[c ^ 1])
        np.testing.assert_array_equal(dev.hbm.get(side[c]), data[c])


def test_all_gather_into_sbuf_partitions_in_rank_order(dev, rng):
    group = [2, 0, 1]
    xs = {c: rng.integers(0, 1000, size=(4, 8)).astype(np.float32) for c in group}
    outs = {}
    progs = dev.programs(group)
    for p in progs:
        d = p.sbuf((12, 8), "float32")
        p.all_gather(dst=d, src=_load(p, dev.hbm.put(xs[p.core])), cores=group)
        outs[p.core] = dev.hbm.alloc((12, 8), "float32")
        p.dma_copy(dst=outs[p.core], src=d)
    dev.run(progs)
    want = np.concatenate([xs[c] for c in group], axis=0)
    for c in group:
        np.testing.assert_array_equal(dev.hbm.get(outs[c]), want)


def test_in_place_all_reduce_and_two_rounds(dev, rng):
    """dst == src works (inputs are read before outputs are written); rounds match in order."""
    xs = [rng.integers(-8, 8, size=(2, 16)).astype(np.float32) for _ in range(8)]
    hs = [dev.hbm.put(x) for x in xs]
    progs = dev.programs()
    for p in progs:
        p.all_reduce(dst=hs[p.core], src=hs[p.core])
        p.all_reduce(dst=hs[p.core], src=hs[p.core], reduce_op="maximum")
    dev.run(progs)
    total = np.sum(np.stack(xs), axis=0)
    for h in hs:
        np.testing.assert_array_equal(dev.hbm.get(h), total)


@pytest.mark.parametrize("policy", ["ieee", "saturate"])
def test_all_reduce_fp8_output_follows_the_overflow_policy(policy):
    """Collectives cast their result like DMA does: round to nearest even, and the device's fp8
    overflow policy (saturate: +-448 for e4m3fn; ieee: NaN, as ml_dtypes)."""
    import ml_dtypes

    dev = t3.Device(fp8_overflow=policy)
    x = np.array([[100.0, -100.0, 3.0, 0.3]], np.float32)  # summed over 8 cores: 800, -800, 24, 2.4
    progs = dev.programs()
    outs = []
    for p in progs:
        outs.append(dev.hbm.alloc((1, 4), "float8_e4m3fn"))
        p.all_reduce(dst=outs[-1], src=dev.hbm.put(x))
    dev.run(progs)
    total = _fold([x] * 8, np.add)
    want = total.astype(ml_dtypes.float8_e4m3fn)
    if policy == "saturate":
        want = np.clip(total, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    for out in outs:
        got = dev.hbm.get(out)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_lone_program_on_the_last_core_synchronises_with_its_semaphores():
    """One program on core 7 only (cores 0-6 idle), synchronised by hand: its semaphores are
    those of core 7 (the scheduler builds agents and semaphores up to the last core with a
    program); the wait orders the VectorE add after the ScalarE write, as numpy computes."""
    dev = t3.Device()
    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    p = t3.Program(core=7, sync="manual")
    src = dev.hbm.put(x, core=7)
    out = dev.hbm.alloc((128, 8), np.float32, core=7)
    loaded, scaled, added = p.semaphore(), p.semaphore(), p.semaphore()
    a = p.sbuf((128, 8), np.float32)
    b = p.sbuf((128, 8), np.float32)
    p.dma_copy(dst=a, src=src, signal=loaded)
    p.activation(dst=b, op="copy", data=a, scale=2.0, wait=[(loaded, 1)], signal=scaled)
    p.tensor_scalar(dst=b, data=b, op0="add", operand0=1.0, engine="vector", wait=[(scaled, 1)], signal=added)
    p.dma_copy(dst=out, src=b, wait=[(added, 1)])
    dev.run(p)
    np.testing.assert_array_equal(dev.hbm.get(out), x * np.float32(2.0) + np.float32(1.0))
