"""UltraServer: collectives across chips against numpy references (reduction order: a left fold
in rank order in fp32, one cast at the end; docs/ultraserver.md), errors, traces, determinism."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from trn3emu.errors import DeadlockError, OperandError, ShapeError

CHIPS = [2, 4, 16]


def world(n_chips: int, cores_per_chip: int = 1):
    """An UltraServer and one program per rank: `cores_per_chip` cores on each chip, ranks in
    global-core order."""
    us = t3.UltraServer(chips=n_chips)
    progs = [t3.Program(chip=c, core=k) for c in range(n_chips) for k in range(cores_per_chip)]
    return us, progs, [p.global_core for p in progs]


def put(us, p, a):
    return us.chip(p.chip).hbm.put(a)


def alloc(us, p, shape, dtype):
    return us.chip(p.chip).hbm.alloc(shape, dtype)


def get(us, p, t):
    return us.chip(p.chip).hbm.get(t)


def fold(arrs, op):
    acc = arrs[0].astype(np.float32)
    for a in arrs[1:]:
        acc = op(acc, a.astype(np.float32))
    return acc


@pytest.mark.parametrize("n", CHIPS)
@pytest.mark.parametrize("op,npop", [("add", np.add), ("maximum", np.maximum), ("minimum", np.minimum)])
def test_all_reduce(n, op, npop):
    us, progs, group = world(n)
    rng = np.random.default_rng(n)
    xs = [rng.standard_normal((16, 32)).astype(np.float32) for _ in progs]
    outs = []
    for p, x in zip(progs, xs):
        o = alloc(us, p, (16, 32), "float32")
        p.all_reduce(dst=o, src=put(us, p, x), cores=group, reduce_op=op)
        outs.append(o)
    us.run(progs)
    want = fold(xs, npop)
    for p, o in zip(progs, outs):
        np.testing.assert_array_equal(get(us, p, o), want)


@pytest.mark.parametrize("n", CHIPS)
def test_all_reduce_bf16_casts_once(n):
    us, progs, group = world(n)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((8, 64)).astype(ml_dtypes.bfloat16) for _ in progs]
    outs = []
    for p, x in zip(progs, xs):
        o = alloc(us, p, (8, 64), ml_dtypes.bfloat16)
        p.all_reduce(dst=o, src=put(us, p, x), cores=group)
        outs.append(o)
    us.run(progs)
    want = fold(xs, np.add).astype(ml_dtypes.bfloat16)
    for p, o in zip(progs, outs):
        np.testing.assert_array_equal(get(us, p, o).view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("n", CHIPS)
def test_all_gather(n):
    us, progs, group = world(n)
    xs = [np.full((4, 8), i, np.int32) + np.arange(32, dtype=np.int32).reshape(4, 8) for i in range(len(progs))]
    outs = []
    for p, x in zip(progs, xs):
        o = alloc(us, p, (4 * len(progs), 8), "int32")
        p.all_gather(dst=o, src=put(us, p, x), cores=group)
        outs.append(o)
    us.run(progs)
    for p, o in zip(progs, outs):
        np.testing.assert_array_equal(get(us, p, o), np.concatenate(xs))


@pytest.mark.parametrize("n", CHIPS)
def test_reduce_scatter(n):
    us, progs, group = world(n)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((n * 4, 16)).astype(np.float32) for _ in progs]
    outs = []
    for p, x in zip(progs, xs):
        o = alloc(us, p, (4, 16), "float32")
        p.reduce_scatter(dst=o, src=put(us, p, x), cores=group)
        outs.append(o)
    us.run(progs)
    total = fold(xs, np.add)
    for r, (p, o) in enumerate(zip(progs, outs)):
        np.testing.assert_array_equal(get(us, p, o), total[r * 4 : (r + 1) * 4])


@pytest.mark.parametrize("n", CHIPS)
def test_all_to_all(n):
    us, progs, group = world(n)
    xs = [np.arange(n * 6, dtype=np.float32).reshape(n * 2, 3) + 1000 * i for i in range(n)]
    outs = []
    for p, x in zip(progs, xs):
        o = alloc(us, p, x.shape, "float32")
        p.all_to_all(dst=o, src=put(us, p, x), cores=group)
        outs.append(o)
    us.run(progs)
    for r, (p, o) in enumerate(zip(progs, outs)):
        want = np.concatenate([x[r * 2 : (r + 1) * 2] for x in xs])
        np.testing.assert_array_equal(get(us, p, o), want)


def a2av_reference(xs, counts, displs, cap, rdispls=None):
    """numpy all_to_all_v: rank i sends xs[i][displs[i, j]:+counts[i, j]] to j, placed at
    rdispls[j, i] or packed in rank order; the rest of dst stays -7."""
    n = len(xs)
    outs = []
    for r in range(n):
        want = np.full(cap, -7, np.int32)
        at = 0
        for i in range(n):
            c, d = counts[i, r], displs[i, r]
            pos = at if rdispls is None else rdispls[r, i]
            want[pos : pos + c] = xs[i][d : d + c]
            at += c
        outs.append(want)
    return outs


@pytest.mark.parametrize("n", CHIPS)
@pytest.mark.parametrize("rd", [False, True])
def test_all_to_all_v_runtime_counts(n, rd):
    us, progs, group = world(n)
    rng = np.random.default_rng(11)
    counts = rng.integers(0, 4, size=(n, n)).astype(np.uint32)  # counts[i, j]: i sends to j
    # send blocks in reverse rank order, with a gap of one element between them
    displs = np.zeros((n, n), np.uint32)
    for i in range(n):
        at = 1
        for j in reversed(range(n)):
            displs[i, j] = at
            at += counts[i, j] + 1
    xs = [rng.integers(-100, 100, size=int(displs[i].max() + counts[i].max() + 1)).astype(np.int32) for i in range(n)]
    recv = counts.T  # recv[j, i] = counts[i, j]
    cap = int(recv.sum(axis=1).max()) + 2 * n
    rdispls = np.stack([np.concatenate(([1], 1 + np.cumsum(recv[j] + 1)[:-1])) for j in range(n)]).astype(np.uint32)
    outs = []
    for i, (p, x) in enumerate(zip(progs, xs)):
        rows = [counts[i], displs[i], recv[i]] + ([rdispls[i]] if rd else [])
        meta = put(us, p, np.stack(rows).astype(np.uint32))
        o = put(us, p, np.full(cap, -7, np.int32))
        p.all_to_all_v(dst=o, src=put(us, p, x), metadata=meta, cores=group, recv_counts_known=True, has_rdispls=rd)
        outs.append(o)
    us.run(progs)
    want = a2av_reference(xs, counts.astype(np.int64), displs.astype(np.int64), cap, rdispls if rd else None)
    for p, o, w in zip(progs, outs, want):
        np.testing.assert_array_equal(get(us, p, o), w)


@pytest.mark.parametrize("n", CHIPS)
def test_collective_permute_ring(n):
    us, progs, group = world(n)
    pairs = [v for i in range(n) for v in (i, (i + 1) % n)]
    xs = [np.full((8, 8), i, np.float32) for i in range(n)]
    outs = []
    for p, x in zip(progs, xs):
        o = alloc(us, p, (8, 8), "float32")
        p.collective_permute(dst=o, src=put(us, p, x), cores=group, pairs=pairs)
        outs.append(o)
    us.run(progs)
    for r, (p, o) in enumerate(zip(progs, outs)):
        np.testing.assert_array_equal(get(us, p, o), xs[(r - 1) % n])


def test_collective_permute_non_target_keeps_dst():
    us, progs, group = world(4)
    outs = []
    for p in progs:
        o = put(us, p, np.full(4, -1.0, np.float32))
        p.collective_permute(dst=o, src=put(us, p, np.full(4, p.chip, np.float32)), cores=group, pairs=[0, 3])
        outs.append(o)
    us.run(progs)
    got = [get(us, p, o)[0] for p, o in zip(progs, outs)]
    assert got == [-1.0, -1.0, -1.0, 0.0]


@pytest.mark.parametrize("n", [2, 4])
def test_mixed_on_chip_and_cross_chip_ranks(n):
    """Two cores per chip: ranks meet on their chip and across chips in one group; a group within
    one chip still runs as an on-chip rendezvous."""
    us, progs, group = world(n, cores_per_chip=2)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in progs]
    outs, locs = [], []
    for p, x in zip(progs, xs):
        src = put(us, p, x)
        o = alloc(us, p, (4, 8), "float32")
        p.all_reduce(dst=o, src=src, cores=group)
        loc = alloc(us, p, (8, 8), "float32")
        p.all_gather(dst=loc, src=src, cores=[p.chip * 8, p.chip * 8 + 1])
        outs.append(o)
        locs.append(loc)
    us.run(progs)
    for i, (p, o, loc) in enumerate(zip(progs, outs, locs)):
        np.testing.assert_array_equal(get(us, p, o), fold(xs, np.add))
        j = i - i % 2
        np.testing.assert_array_equal(get(us, p, loc), np.concatenate(xs[j : j + 2]))


def test_sbuf_operands_and_chained_collectives():
    """SBUF src/dst, two collectives in a row on each rank (the second sees the first's result)."""
    us, progs, group = world(4)
    xs = [np.full((2, 8), i + 1, np.float32) for i in range(4)]
    outs = []
    for p, x in zip(progs, xs):
        s = p.sbuf((2, 8), "float32")
        d = p.sbuf((2, 8), "float32")
        p.dma_copy(dst=s, src=put(us, p, x))
        p.all_reduce(dst=d, src=s, cores=group)
        p.all_reduce(dst=s, src=d, cores=group, reduce_op="maximum")
        o = alloc(us, p, (2, 8), "float32")
        p.dma_copy(dst=o, src=s)
        outs.append(o)
    us.run(progs)
    for p, o in zip(progs, outs):
        np.testing.assert_array_equal(get(us, p, o), np.full((2, 8), 10.0, np.float32))


def test_wrong_size_names_the_rank():
    us, progs, group = world(2)
    for p in progs:
        rows = 4 if p.chip == 0 else 5
        p.all_reduce(dst=alloc(us, p, (rows, 4), "float32"), src=alloc(us, p, (rows, 4), "float32"), cores=group)
    with pytest.raises(ShapeError, match="chip 1") as e:
        us.run(progs)
    assert e.value.rule == "collective_src_shape_mismatch"


def test_missing_rank_is_a_deadlock_naming_the_ranks():
    us, progs, group = world(4)
    for p in progs:
        if p.chip != 2:
            h = alloc(us, p, (4,), "float32")
            p.all_reduce(dst=h, src=h, cores=group)
        else:
            p.memset(dst=p.sbuf((1, 4), "float32"), value=0.0)
    with pytest.raises(DeadlockError) as e:
        us.run(progs)
    msg = str(e.value)
    assert "chip 2 core 0" in msg and "never arrive" in msg
    assert "chip 0 core 0, chip 1 core 0, chip 3 core 0 wait" in msg


def test_mismatched_participants_deadlock():
    us, progs, group = world(3)
    for p in progs:
        h = alloc(us, p, (4,), "float32")
        g = group if p.chip != 1 else group[:2]
        p.all_reduce(dst=h, src=h, cores=g)
    with pytest.raises(DeadlockError, match="never arrive"):
        us.run(progs)


def test_rank_without_program_and_bad_placements():
    us, progs, group = world(2)
    p = progs[0]
    h = alloc(us, p, (4,), "float32")
    p.all_reduce(dst=h, src=h, cores=group + [16 + 3])
    with pytest.raises(OperandError) as e:
        us.run(progs)
    assert e.value.rule == "collective_peer_without_program"
    with pytest.raises(OperandError) as e:
        us.run([t3.Program(chip=5)])
    assert e.value.rule == "chip_out_of_range"
    for bad in (0, 145):
        with pytest.raises(OperandError) as e:
            t3.UltraServer(chips=bad)
        assert e.value.rule == "ultraserver_chips"


def test_collective_permute_pair_rules():
    p = t3.Program()
    h = t3.Device().hbm.alloc((4,), "float32")
    with pytest.raises(OperandError) as e:
        p.collective_permute(dst=h, src=h, cores=[0, 1], pairs=[0, 1, 1, 1])
    assert e.value.rule == "collective_permute_pairs"
    with pytest.raises(OperandError):
        p.collective_permute(dst=h, src=h, cores=[0, 1], pairs=[0, 2])


def run_timed(threads: int):
    t3.set_num_threads(threads)
    try:
        us, progs, group = world(4, cores_per_chip=2)
        rng = np.random.default_rng(1)
        outs = []
        for p in progs:
            x = rng.standard_normal((64, 128)).astype(np.float32)
            s = p.sbuf((64, 128), "float32")
            p.dma_copy(dst=s, src=put(us, p, x))
            p.tensor_scalar(dst=s, data=s, op0="multiply", operand0=2.0)
            o = alloc(us, p, (64, 128), "float32")
            p.all_reduce(dst=o, src=s, cores=group)
            outs.append(o)
        r = us.run(progs)
        return r, [get(us, p, o) for p, o in zip(progs, outs)]
    finally:
        t3.set_num_threads(0)


def test_deterministic_across_thread_counts():
    r1, v1 = run_timed(1)
    r2, v2 = run_timed(2)
    assert r1.time_ns == r2.time_ns
    for a, b in zip(v1, v2):
        np.testing.assert_array_equal(a, b)
    for k in ("send_ps", "arrive_ps", "bytes"):
        np.testing.assert_array_equal(r1.messages[k], r2.messages[k])


def test_fabric_timing_follows_the_model():
    """Two chips, one rank each, arriving together: the all_gather completes one sync latency, the
    CC-core launch, and one message (link latency + transfer) after the arrival."""
    us, progs, group = world(2)
    nbytes = 128 * 1024
    for p in progs:
        p.all_gather(
            dst=alloc(us, p, (2 * nbytes // 4,), "float32"), src=alloc(us, p, (nbytes // 4,), "float32"), cores=group
        )
    r = us.run(progs)
    fp = t3.ultra.FABRIC_PARAMS
    arrive = r.chips[0].trace.columns["start_ns"][0]
    transfer = nbytes / fp["link_bytes_per_ns"]
    want = arrive + 2 * fp["latency_ns"] + fp["cc_launch_ns"] + transfer
    assert r.time_ns == pytest.approx(want, abs=0.01)
    m = r.messages
    assert sorted(zip(m["from_chip"].tolist(), m["to_chip"].tolist())) == [(0, 1), (1, 0)]
    assert (m["bytes"] == nbytes).all()
    assert len(r.cc["cc"]) == 2


def test_ring_for_large_gathers_mesh_for_small():
    for nbytes, rounds in ((1024, 1), (2 << 20, 3)):
        us, progs, group = world(4)
        for p in progs:
            p.all_gather(
                dst=alloc(us, p, (4 * nbytes // 4,), "float32"),
                src=alloc(us, p, (nbytes // 4,), "float32"),
                cores=group,
            )
        r = us.run(progs)
        # mesh: every rank sends to the 3 others once; ring: 3 rounds of one message per rank
        assert len(r.messages["bytes"]) == 12
        sends = sorted(zip(r.messages["from_chip"].tolist(), r.messages["to_chip"].tolist()))
        if rounds == 1:
            assert sends == sorted((i, j) for i in range(4) for j in range(4) if i != j)
        else:
            assert sends == sorted((i, (i + 1) % 4) for i in range(4) for _ in range(3))


def test_perfetto_has_per_chip_cc_and_link_tracks(tmp_path):
    us, progs, group = world(2)
    for p in progs:
        h = alloc(us, p, (256,), "float32")
        p.all_reduce(dst=h, src=h, cores=group)
    r = us.run(progs)
    path = r.to_perfetto(tmp_path / "u.json")
    ev = json.loads(path.read_text())["traceEvents"]
    names = {
        (e["pid"], e["args"]["name"]) for e in ev if e.get("ph") == "M" and e["name"] in ("process_name", "thread_name")
    }
    procs = {n for _, n in names}
    for c in (0, 1):
        assert f"chip {c} fabric" in procs and f"chip {c} core 0" in procs
    assert "link egress" in procs and "link ingress" in procs and "cc-core 0" in procs
    assert any(e.get("cat") == "collective" for e in ev)
    assert any(e.get("cat") == "link" for e in ev)


def test_single_device_keeps_global_ids_apart():
    """On a lone Device, a replica group naming another chip's core needs a program there."""
    dev = t3.Device()
    p = t3.Program(core=0)
    h = dev.hbm.alloc((4,), "float32")
    p.all_reduce(dst=h, src=h, cores=[0, 9])
    with pytest.raises(OperandError) as e:
        dev.run(p)
    assert e.value.rule == "collective_peer_without_program"


def test_all_to_all_v_count_rules():
    def run(meta_of, known=False):
        us, progs, group = world(2)
        for p in progs:
            src = put(us, p, np.arange(4, dtype=np.int32))
            dst = alloc(us, p, (4,), "int32")
            meta = put(us, p, np.asarray(meta_of(p.chip), np.uint32))
            p.all_to_all_v(dst=dst, src=src, metadata=meta, cores=group, recv_counts_known=known)
        return us.run(progs)

    with pytest.raises(ShapeError, match="chip 1") as e:
        run(lambda c: [[2, 2], [0, 2]] if c == 0 else [[2, 2]])  # chip 1: no displacement row
    assert e.value.rule == "all_to_all_v_counts_size"
    with pytest.raises(OperandError) as e:
        run(lambda c: [[2, 2], [0, 3]])  # elements 3..5 of a 4-element src
    assert e.value.rule == "all_to_all_v_counts"
    with pytest.raises(OperandError) as e:
        run(lambda c: [[2, 2], [0, 2], [2, 1]], known=True)
    assert e.value.rule == "all_to_all_v_recv_counts"
    with pytest.raises(OperandError) as e:
        run(lambda c: [[3, 3], [0, 0]])  # 6 elements into a 4-element dst
    assert e.value.rule == "all_to_all_v_dst_size"


@pytest.mark.parametrize("n", CHIPS)
def test_all_to_all_in_place(n):
    """dst = src: the blocks are exchanged in place (no copy of every rank's data)."""
    us, progs, group = world(n)
    xs = [np.arange(n * 4, dtype=np.float32).reshape(n, 4) + 100 * i for i in range(n)]
    bufs = []
    for p, x in zip(progs, xs):
        b = put(us, p, x)
        p.all_to_all(dst=b, src=b, cores=group)
        bufs.append(b)
    us.run(progs)
    for r, (p, b) in enumerate(zip(progs, bufs)):
        np.testing.assert_array_equal(get(us, p, b), np.stack([x[r] for x in xs]))


def test_all_to_all_in_place_on_one_device():
    dev = t3.Device()
    xs = [np.arange(8, dtype=np.int32).reshape(4, 2) + 10 * i for i in range(4)]
    bufs = [dev.hbm.put(x) for x in xs]
    progs = dev.programs([0, 1, 2, 3])
    for p, b in zip(progs, bufs):
        p.all_to_all(dst=b, src=b, cores=[0, 1, 2, 3])
    dev.run(progs)
    for r, b in enumerate(bufs):
        np.testing.assert_array_equal(dev.hbm.get(b), np.stack([x[r] for x in xs]))


def test_in_place_all_to_all_is_timed_like_the_copy():
    """In place or not, an all_to_all moves the same messages and takes the same time."""
    times = []
    for in_place in (False, True):
        us, progs, group = world(4)
        for p in progs:
            b = put(us, p, np.zeros((4, 256), np.float32))
            d = b if in_place else alloc(us, p, (4, 256), "float32")
            p.all_to_all(dst=d, src=b, cores=group)
        r = us.run(progs)
        assert len(r.messages["bytes"]) == 12 and (r.messages["bytes"] == 1024).all()
        times.append(r.time_ns)
    assert times[0] == times[1]


@pytest.mark.parametrize("kw", [{"latency_ns": 0}, {"latency_ns": float("nan")}, {"link_bytes_per_ns": -1.0}])
def test_fabric_overrides_are_checked_not_clamped(kw):
    (name,) = kw
    with pytest.raises(t3.OperandError) as e:
        t3.UltraServer(2, **kw)
    assert e.value.rule == "fabric_param_invalid" and e.value.operand == name


def test_native_run_refuses_bad_fabric_numbers_and_a_repeated_chip():
    from trn3emu import _native

    us = t3.UltraServer(2)
    progs = [p.native() for p in us.programs(cores=[0])]
    placed = [(0, progs[0]), (1, progs[1])]
    devs = [c._native for c in us.chips]
    with pytest.raises(t3.OperandError) as e:
        _native.ultra_run(devs, placed, latency_ns=-5.0)
    assert e.value.rule == "fabric_param_invalid"
    with pytest.raises(t3.OperandError) as e:
        _native.ultra_run([devs[0], devs[0]], placed)
    assert e.value.rule == "ultraserver_device_repeated"


@pytest.mark.parametrize(
    "chip, cls", [(-1, OperandError), (144, OperandError), ("a", t3.ArgumentTypeError), (1.5, t3.ArgumentTypeError)]
)
def test_program_chip_is_checked(chip, cls):
    with pytest.raises(cls) as e:
        t3.Program(chip=chip)
    assert e.value.operand == "chip"
    assert t3.Program(chip=143).global_core == 143 * 8  # the last chip of the largest UltraServer


def test_mesh_threshold_must_be_a_nonnegative_int():
    with pytest.raises(OperandError) as e:
        t3.UltraServer(2, mesh_max_bytes=-1)
    assert e.value.operand == "mesh_max_bytes"
