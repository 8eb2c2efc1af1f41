"""Lowering the allocation passes' program by a walk over the kernel IR (`nki/lowering.py`,
docs/nki.md "Passes"): the kernel body runs once, and the program is the one the second trace
(`passes={"lowering": "retrace"}`) builds, byte for byte. Every kernel here needs the liveness
pass (most need spills); results are compared with numpy, counts are worked out by hand."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import OperandError
from trn3emu.nki import lowering

tn.install()

import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import test_nki_liveness as lv  # noqa: E402

WALK, RETRACE = {"lowering": "walk"}, {"lowering": "retrace"}


def _counted(fn):
    """`fn` with a count of how many times its body ran (a Python side effect of tracing)."""
    runs = []

    def k(*a):
        runs.append(1)
        return fn(*a)

    k.__name__ = fn.__name__
    return k, runs


def _both(fn, args, want, **options):
    """Run `fn` lowered by the walk and by the second trace: both results equal `want`, the body
    ran once less with the walk (liveness "on": once; "auto": the literal trace that did not fit
    first), and the programs are the same bytes. Returns the walk's kernel."""
    out, count = {}, {}
    # (the walk also drops repeats into other tiles before allocation, `value_reuse` "on", which
    # the second trace does not: compared with the same-encoding rule only)
    options = {"value_reuse": "exact", **options}
    for name, passes in (("walk", WALK), ("retrace", RETRACE)):
        body, runs = _counted(fn)
        k = lnki.jit(body, passes={**options, **passes})
        got = k(*args)
        for g, w in zip(got if isinstance(want, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            np.testing.assert_array_equal(g, w)
        count[name] = len(runs)
        assert k.last_ir.passes["lowering"].startswith(name), k.last_ir.passes["lowering"]
        out[name] = k
    assert count["walk"] == count["retrace"] - 1 == (1 if options.get("liveness") == "on" else 2), count
    w, r = out["walk"], out["retrace"]
    assert [p._native.encode() for p in w.last_programs] == [p._native.encode() for p in r.last_programs]
    assert w.last_spills == r.last_spills
    assert len(w.last_ir.calls) == len(r.last_ir.calls)
    assert [c.notes.get("spill") for c in w.last_ir.calls] == [c.notes.get("spill") for c in r.last_ir.calls]
    return w


def _spill_input(seed=3):
    return np.random.default_rng(seed).integers(-99, 99, (16, 128, 8192)).astype(np.float32)


def test_live_data_twice_sbuf_lowers_by_the_walk_to_the_second_traces_program():
    x = _spill_input()
    k = _both(lv._spill_kernel, (x,), 2 * x)
    # by hand (tests/test_nki_liveness.py): 16 loads, 16 multiplies, 16 stores, 9 spills, 9 reloads
    assert len(k.last_programs[0]) == 66
    assert (k.last_spills["spills"], k.last_spills["reloads"]) == (9, 9)


def test_lru_spills_lower_by_the_walk_alike():
    x = _spill_input(7)
    k = _both(lv._spill_kernel, (x,), 2 * x, spill="lru")
    assert k.last_spills["spills"] >= 9


def test_chain_of_ten_wide_temporaries():
    def body(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        for i in range(9):
            t = nl.add(t, float(i))
        nl.store(out, value=t)
        return out

    x = np.random.default_rng(1).integers(-64, 64, (128, 7168)).astype(np.float32)
    k = _both(body, (x,), x + sum(range(9)), liveness="on")
    assert len(k.last_programs[0]) == 11  # load, 9 adds, store: nothing added


def test_block_tile_written_and_read_per_iteration_with_32_blocks():
    rng = np.random.default_rng(2)
    x = rng.integers(-8, 8, (32, 128, 4096)).astype(np.float32)
    w0 = rng.integers(-8, 8, (128, 18432)).astype(np.float32)
    w1 = rng.integers(-8, 8, (128, 18432)).astype(np.float32)
    want = (x + 3 * x[::-1], (w0 + w1).sum(axis=1, keepdims=True))
    k = _both(lv._block_kernel, (x, w0, w1), want)
    assert k.last_spills["spills"] == 0


def test_psum_block_tile_spills_through_sbuf():
    a, b = lv._psum_qk_inputs()
    want = (a.T @ b).reshape(128, 16, 512).transpose(1, 0, 2)
    k = _both(lv._psum_qk_kernel, (a, b), want)
    # by hand (tests/test_nki_liveness.py): blocks 8..15 spill blocks 7..14 through SBUF
    st = k.last_spills
    assert (st["psum_spills"], st["psum_spilled_bytes"], st["spills"]) == (8, 8 * 128 * 2048, 0)


def test_accumulating_matmuls_into_a_moved_psum_tile_resolve_at_the_new_place():
    # two K-steps accumulate into each of 16 PSUM tiles all live at once (twice PSUM): the
    # first matmul of each overwrites, the second adds; where the walk moves a tile, the
    # accumulate=None of its matmuls is resolved again against the place it lands
    def body(a, b):
        n = b.shape[2] // 512
        out = nl.ndarray((n, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        a0, a1 = nl.load(a[0]), nl.load(a[1])
        b0, b1 = nl.load(b[0]), nl.load(b[1])
        acc = [nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(n)]
        for i in range(n):
            acc[i] += nl.matmul(a0, b0[:, i * 512 : (i + 1) * 512], transpose_x=True)
            acc[i] += nl.matmul(a1, b1[:, i * 512 : (i + 1) * 512], transpose_x=True)
        for i in range(n):
            nl.store(out[i], value=nl.copy(acc[i]))
        return out

    rng = np.random.default_rng(11)
    a = rng.integers(-4, 4, (2, 128, 128)).astype(np.float32)
    b = rng.integers(-4, 4, (2, 128, 16 * 512)).astype(np.float32)
    want = (a[0].T @ b[0] + a[1].T @ b[1]).reshape(128, 16, 512).transpose(1, 0, 2)
    _both(body, (a, b), want)


@pytest.mark.parametrize("seed", [0, 4, 13])
def test_random_tile_mixes(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 20))
    widths = [int(rng.choice([512, 1024, 4096, 8192, 12288, 16384])) for _ in range(n)]
    order = [(int(rng.integers(n)), int(rng.integers(n))) for _ in range(int(rng.integers(n, 2 * n)))]
    xs = [rng.integers(-50, 50, (128, w)).astype(np.float32) for w in widths]

    def body(*xs):
        out = nl.ndarray((len(order), 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        ts = [nl.load(x) for x in xs]
        for j, (a, b) in enumerate(order):
            nl.store(out[j], value=nl.add(ts[a][:, 0:512], ts[b][:, 0:512]))
        return out

    want = np.stack([xs[a][:, :512] + xs[b][:, :512] for a, b in order])
    # two tiles one add reads may share the first trace's bytes (both placed over tiles used
    # least recently): the walk tells them apart by the operand each was passed as
    _both(body, xs, want)


def test_tiles_sharing_the_first_traces_bytes_are_moved_apart(monkeypatch):
    # the spill kernel's first trace fills SBUF with t0..t7 (32 KiB per partition each) and
    # places t8 over the least recently used tile, t0 (no tile was used yet: the oldest). The
    # pass keeps t0 (its use comes first) and spills t7 for t8: the walk must move t8's load
    # away from t0's bytes, else out[0] would be 2 * x[8]
    seen = {}
    walk = lowering.walk

    def spy(ctx, *a):
        seen["off"] = list(ctx.ir.plan_off)
        seen["ops"] = [t.op for t in ctx.ir.ir.calls]
        return walk(ctx, *a)

    monkeypatch.setattr(lowering, "walk", spy)
    x = _spill_input(9)
    k = lnki.jit(lv._spill_kernel, passes=WALK)
    np.testing.assert_array_equal(k(x), 2 * x)
    assert seen["off"][0] == seen["off"][8]  # shared bytes in the first trace
    ir = k.last_ir
    (_, at0), (_, at8) = ir.tiles[0].at[0], ir.tiles[8].at[0]
    assert at8 != at0  # placed apart by the pass
    assert ir.tiles[8].at[0][1] == ir.tiles[7].at[0][1]  # in the range of t7, spilled for it
    # and the loads were moved there: their destinations are where the pass placed the tiles
    prog = k.last_programs[0]._native
    loads = [prog.instruction_text(c.instr) for c in ir.calls if c.op == "dma_copy" and not c.added_by]
    loads = [t for t in loads if "dst=sbuf" in t]
    assert re.search(r"dst=sbuf:float32\[0:128\]\+(\d+)\[", loads[0]).group(1) == str(at0)
    assert re.search(r"dst=sbuf:float32\[0:128\]\+(\d+)\[", loads[8]).group(1) == str(at8)


def test_views_read_through_run_time_offsets_move_with_their_tiles():
    # each data tile is read through a run-time column index held in an index tile: the view's
    # base moves with its data tile and the offset's index tile with its own (the offset counts
    # from the base); 10 [128, 8192] fp32 tiles (over SBUF) are refused alike both ways, as the
    # tiles read through run-time offsets are never spilled
    ix = np.array([[5]], np.int32)
    x = np.random.default_rng(5).integers(-99, 99, (6, 128, 8192)).astype(np.float32)
    _both(lv._dyn_read_kernel, (x, ix), x[:, :, 5:6], liveness="on")


def test_an_hbm_gather_moves_its_on_chip_index_tile(monkeypatch):
    # a gather from HBM whose row index tile is on chip: the DMA's HBM operand keeps its address,
    # its index tile moves to where the pass placed it. Two [128, 32768] fp32 tiles fill SBUF;
    # the first trace puts the index tile over w1, the least recently used (w1 is read last);
    # the pass puts it where w2 was (dead after its store), 128 KiB further
    def body(big, table, idx):
        out = nl.ndarray((2, 128, big.shape[2]), dtype=big.dtype, buffer=nl.shared_hbm)
        res = nl.ndarray((128, table.shape[1]), dtype=table.dtype, buffer=nl.shared_hbm)
        w1 = nl.load(big[0])
        w2 = nl.load(big[1])
        nl.store(out[1], value=w2)
        ix = nl.load(idx)
        rows = nl.load(table[ix, :])
        nl.store(res, value=rows)
        nl.store(out[0], value=w1)
        return out, res

    seen = {}
    walk = lowering.walk

    def spy(ctx, *a):
        seen["off"] = list(ctx.ir.plan_off)
        return walk(ctx, *a)

    monkeypatch.setattr(lowering, "walk", spy)
    rng = np.random.default_rng(4)
    big = rng.integers(-9, 9, (2, 128, 32768)).astype(np.float32)
    table = rng.integers(-9, 9, (512, 2048)).astype(np.float32)
    idx = rng.permutation(512)[:128].reshape(128, 1).astype(np.int32)
    assert 2 * 32768 * 4 == lv.SBUF
    k = _both(body, (big, table, idx), (big, table[idx[:, 0]]), liveness="on")
    assert seen["off"][2] == 0 and k.last_ir.tiles[2].at == [(3, 32768 * 4)]  # moved by 128 KiB
    prog = k.last_programs[0]._native
    gather = prog.instruction_text(k.last_ir.calls[4].instr)
    assert f"@v(sbuf:int32[0:128]+{32768 * 4}[" in gather, gather  # its index tile, moved


def test_unknown_lowering_setting_is_refused():
    with pytest.raises(OperandError, match="lowering in walk, retrace"):
        lnki.jit(lv._spill_kernel, passes={"lowering": "both"})(np.zeros((2, 128, 8), np.float32))


def test_spilled_tiles_are_not_live_while_out_and_an_empty_spill_is_noted():
    # nine [128, 8192] fp32 tiles (32 KiB per partition each, nine over SBUF's 256 KiB) made
    # before any is written: making the ninth spills t7 (its first use comes last), which holds
    # nothing yet, so no copy is made; the IR still says so, and t7 is out until it is written
    def body(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        ts = [nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.sbuf) for _ in range(9)]
        for i in range(9):
            ts[i][...] = nl.load(x[i])
            nl.store(out[i], value=ts[i])
        return out

    x = np.random.default_rng(8).random((9, 128, 8192), dtype=np.float32)
    k = _both(body, (x,), x, liveness="on")
    ir = k.last_ir
    assert not any(k.last_spills.values())
    assert len(k.last_programs[0]) == len(ir.calls) == 18  # 9 loads into the tiles, 9 stores
    assert ir.calls[0].notes["spill"] == "t7 spilled, never written: nothing copied"
    # out from the first call to its load (call 14: loads and stores alternate)
    assert ir.tiles[7].out == [(0, 14)] and ir.calls[14].writes == (7,)
    assert 7 not in ir.live_at(13) and 7 in ir.live_at(14)
    # eight tiles live at once, not nine: the peak is SBUF's 256 KiB, reached at call 0
    assert ir.peak("sbuf") == (8 * 8192 * 4, 0) == (lv.SBUF, 0)
    # the pass's placements: t0..t7 first fit in order (t7 in the last 32 KiB); t7 comes back at
    # call 14 wherever there is room then; the dump shows both and the spell out
    assert [t.at[0] for t in ir.tiles[:8]] == [(0, 32768 * i) for i in range(8)]
    (c, back) = ir.tiles[7].at[1]
    assert c == 14
    line = f"  t7: sbuf [128, 8192] float32 32768 B/partition, at +229376; +{back} from call 14, out 0..13,"
    assert line in ir.summary(limit=None)


def test_peak_of_the_lowered_ir_counts_spilled_tiles_out():
    x = _spill_input(12)
    k = lnki.jit(lv._spill_kernel, passes=WALK)
    np.testing.assert_array_equal(k(x), 2 * x)
    ir = k.last_ir
    # never more than the eight 32 KiB tiles SBUF holds (a spilled tile counted while out made
    # it 9 or more before)
    assert ir.peak("sbuf")[0] == 8 * 8192 * 4 == lv.SBUF
    assert sum(len(t.out) for t in ir.tiles) == k.last_spills["spills"] == 9


def test_explicitly_placed_tiles_are_walked_and_kept_where_placed():
    # a tile placed at bytes 0.., one from partition 64 at byte 4096, a PSUM tile in bank 3, and
    # automatic temporaries: the body runs once; the placed ranges are held for the whole
    # program (the IR does not know when Python drops them), the automatic tiles go around them
    def body(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray((64, 512), dtype=x.dtype, buffer=nl.shared_hbm)
        fixed = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
        low = nl.ndarray((64, 512), dtype=nl.float32, buffer=nl.sbuf, address=(64, 4096))
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 3 * 2048))
        fixed[...] = nl.load(x)
        low[...] = nl.load(x[64:128])
        acc[...] = nl.add(fixed, 1.0)
        t = nl.multiply(acc, 2.0)
        nl.store(out, value=nl.add(t, t))
        nl.store(out2, value=nl.multiply(low, 3.0))
        return out, out2

    k, runs = _counted(body)
    kern = lnki.jit(k, passes={"liveness": "on"}, ir=True)
    x = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)
    got, got2 = kern(x)
    np.testing.assert_array_equal(got, 4 * (x + 1))
    np.testing.assert_array_equal(got2, 3 * x[64:128])
    assert len(runs) == 1
    ir = kern.last_ir
    assert ir.passes["lowering"].startswith("walk"), ir.passes["lowering"]
    placed = [t for t in ir.tiles if t.placed]
    assert len(placed) == 3 and all(not t.at for t in placed)
    for t in ir.tiles:  # every automatic SBUF tile clear of bytes 0..2048 and 4096..6144
        if t.buffer == "sbuf" and not t.placed:
            for _, o in t.at:
                assert o + t.row_bytes <= 0 or o >= 2048, (t.label, o)
                assert o + t.row_bytes <= 4096 or o >= 6144, (t.label, o)
    # the instructions kept the kernel's addresses: the loads into bytes 0 and 4096 (partition 64)
    text = kern.last_programs[0].to_text()
    assert "dst=sbuf:float32[0:128]+0[" in text and "dst=sbuf:float32[64:128]+4096[" in text
    assert "dst=psum:float32[0:128]+6144[" in text
