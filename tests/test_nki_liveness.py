"""The allocation passes (`nki/liveness.py`, docs/nki.md "Passes"): tiles die at their last use,
blocks of a block tile are never evicted while used, SBUF spills to HBM when live data exceeds
it, and `nl.loop_reduce` into a fresh buffer never reads stale bytes.

Every kernel here fails on the literal allocator (tiles freed when Python drops them); results
are compared with numpy, and the spill counts with the furthest-next-use rule worked out by hand."""

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import CapacityError, OperandError
from trn3emu.nki import language as nl0

tn.install()

import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.isa as lisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402

SBUF = nl0.tile_size.total_available_sbuf_size  # bytes per partition
LITERAL = {
    "liveness": "off",
    "spill": "off",
    "inplace_assign": "off",
    "load_reuse": "off",
}  # (the allocation as written)


def test_chain_of_ten_wide_temporaries_runs_with_two_live():
    # ten [128, 7168] fp32 temporaries (28 KiB per partition each, 280 KiB in all: more than the
    # 256 KiB of a partition), each held by a Python name, but only the last two are live
    def body(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t0 = nl.load(x)
        t1 = nl.multiply(t0, 2.0)
        t2 = nl.add(t1, 1.0)
        t3 = nl.multiply(t2, 0.5)
        t4 = nl.subtract(t3, 0.25)
        t5 = nl.multiply(t4, 4.0)
        t6 = nl.add(t5, 3.0)
        t7 = nl.multiply(t6, 0.125)
        t8 = nl.add(t7, 1.5)
        t9 = nl.multiply(t8, 8.0)
        nl.store(out, value=t9)
        return out

    x = np.random.default_rng(1).integers(-64, 64, (128, 7168)).astype(np.float32)
    want = (((((x * 2 + 1) * 0.5 - 0.25) * 4 + 3) * 0.125 + 1.5) * 8).astype(np.float32)
    assert 10 * 7168 * 4 > SBUF
    with pytest.raises(CapacityError, match="SBUF overflow"):
        lnki.jit(body, passes=LITERAL)(x)
    k = lnki.jit(body)
    np.testing.assert_array_equal(k(x), want)  # small integers and powers of two: exact
    # load, 9 element-wise ops, store: no spill, nothing added
    assert len(k.last_programs[0]) == 11
    assert not any(k.last_spills.values())


def _block_kernel(x, w0, w1):
    # phase 1 uses two wide tiles (72 KiB per partition each) whose names stay bound; phase 2
    # writes and reads a 32-block tile per iteration (16 KiB blocks): the dead wide tiles
    # crowd out the block just written, unless they die at their last use
    nb, p, f = x.shape
    out = nl.ndarray((nb, p, f), dtype=x.dtype, buffer=nl.shared_hbm)
    s = nl.ndarray((p, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.load(w0)
    b = nl.load(w1)
    c = nl.add(a, b)
    nl.store(s, value=nl.sum(c, axis=1, keepdims=True))
    buf = nl.ndarray((nb, nl.par_dim(p), f), dtype=x.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(nb):
        buf[i] = nl.load(x[i])
        t = nl.load(x[nb - 1 - i])
        u = nl.multiply(t, 3.0)
        buf[i] = nl.add(buf[i], u)
        nl.store(out[i], value=buf[i])
    return out, s


def test_block_tile_written_and_read_per_iteration_with_32_blocks():
    rng = np.random.default_rng(2)
    x = rng.integers(-8, 8, (32, 128, 4096)).astype(np.float32)
    w0 = rng.integers(-8, 8, (128, 18432)).astype(np.float32)
    w1 = rng.integers(-8, 8, (128, 18432)).astype(np.float32)
    with pytest.raises(CapacityError, match=r"block \(0,\) was evicted"):
        lnki.jit(_block_kernel, passes=LITERAL)(x, w0, w1)
    k = lnki.jit(_block_kernel)
    out, s = k(x, w0, w1)
    np.testing.assert_array_equal(out, x + 3 * x[::-1])
    np.testing.assert_array_equal(s[:, 0], (w0 + w1).sum(axis=1))
    assert k.last_spills["spills"] == 0


def _spill_kernel(x):
    # 16 tiles of [128, 8192] fp32 (32 KiB per partition each: 512 KiB, twice SBUF) all loaded
    # before any is used
    n = x.shape[0]
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ts = [nl.load(x[i]) for i in range(n)]
    for i in range(n):
        nl.store(out[i], value=nl.multiply(ts[i], 2.0))
    return out


def test_live_data_twice_sbuf_runs_with_spills_and_counts_them():
    x = np.random.default_rng(3).integers(-99, 99, (16, 128, 8192)).astype(np.float32)
    row = 8192 * 4
    assert 16 * row == 2 * SBUF
    with pytest.raises(CapacityError, match="SBUF overflow"):
        lnki.jit(_spill_kernel, passes=LITERAL)(x)
    k = lnki.jit(_spill_kernel)
    np.testing.assert_array_equal(k(x), 2 * x)
    # By hand, furthest next use first: 8 tiles fill SBUF; loading t8..t15 spills the newest
    # resident tile each time (t7..t14: its use comes last), and the first product's tile spills
    # t15. 9 tiles of 128 x 32 KiB go out and come back once each.
    tile_bytes = 128 * row
    assert k.last_spills == {
        "spills": 9,
        "spilled_bytes": 9 * tile_bytes,
        "reloads": 9,
        "reloaded_bytes": 9 * tile_bytes,
        "psum_spills": 0,
        "psum_spilled_bytes": 0,
    }
    prog = k.last_programs[0]
    # 16 loads + 16 multiplies + 16 stores, plus 9 spill and 9 reload DMAs
    assert len(prog) == 66
    text = prog.to_text()
    assert text.count("spill") >= 9 and text.count("reload") >= 9
    # counted again from the trace's DMAs
    assert k.last_result.trace.spills() == {n: v for n, v in k.last_spills.items() if not n.startswith("psum")}
    assert f"spilled {9 * tile_bytes:,} bytes to HBM in 9 DMAs" in k.last_result.trace.summary()


def test_spill_is_off_for_the_new_dialect_and_when_switched_off():
    x = np.zeros((16, 128, 8192), np.float32)
    with pytest.raises(CapacityError, match="SBUF overflow"):
        lnki.jit(_spill_kernel, passes={"spill": "off"})(x)
    with pytest.raises(CapacityError, match="SBUF overflow"):
        tn.jit(_spill_kernel)(x)  # NKI 0.6: the developer's allocation is kept


def test_loop_reduce_into_an_uninitialised_buffer_starts_from_the_first_value():
    # the accumulator is an nl.ndarray no instruction wrote: its bytes are whatever the range
    # held (here the NaN fill); the reduction must not read them
    @lnki.jit(fill=0xFF)
    def k(a):
        acc = nl.ndarray((a.shape[1], a.shape[2]), dtype=nl.float32, buffer=nl.sbuf)
        big = nl.ndarray((a.shape[1], a.shape[2]), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(a.shape[0]):
            t = nl.load(a[i])
            acc[...] = nl.loop_reduce(t, op=np.add, loop_indices=[i])
            big[...] = nl.loop_reduce(t, op=np.maximum, loop_indices=[i])
        out = nl.ndarray((2, a.shape[1], a.shape[2]), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], value=acc)
        nl.store(out[1], value=big)
        return out

    a = np.random.default_rng(4).standard_normal((4, 8, 16)).astype(np.float32)
    got = k(a)
    np.testing.assert_array_equal(got[0], ((a[0] + a[1]) + a[2]) + a[3])
    np.testing.assert_array_equal(got[1], np.maximum.reduce(a))


def test_pass_switches_env_and_option(monkeypatch):
    x = np.ones((128, 7168), np.float32)

    def chain(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        ts = [nl.load(x)]
        for _ in range(9):
            ts.append(nl.add(ts[-1], 1.0))  # every temporary held by the list, each used once
        nl.store(out, value=ts[-1])
        return out

    np.testing.assert_array_equal(lnki.jit(chain)(x), x + 9)
    monkeypatch.setenv("TRN3EMU_NKI_PASSES", "literal")
    with pytest.raises(CapacityError, match="SBUF overflow"):
        lnki.jit(chain)(x)
    # the kernel's option wins over the environment
    np.testing.assert_array_equal(lnki.jit(chain, passes={"liveness": "on"})(x), x + 9)
    monkeypatch.setenv("TRN3EMU_NKI_PASSES", "liveness=sometimes")
    with pytest.raises(OperandError, match="unknown pass setting liveness='sometimes'"):
        lnki.jit(chain)(x)


def test_liveness_always_on_keeps_results_and_instructions_of_a_fitting_kernel():
    # a kernel that fits: the liveness pass moves tiles, never adds or drops an instruction
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(a.shape[0] // 128):
            ta = nl.load(a[i * 128 : (i + 1) * 128])
            tb = nl.load(b[i * 128 : (i + 1) * 128])
            nl.store(out[i * 128 : (i + 1) * 128], value=nl.maximum(nl.exp(ta), tb))
        return out

    rng = np.random.default_rng(5)
    a = rng.standard_normal((512, 256)).astype(np.float32)
    b = rng.standard_normal((512, 256)).astype(np.float32)
    lit = lnki.jit(k, passes="literal")
    on = lnki.jit(k, passes={"liveness": "on"})
    r_lit, r_on = lit(a, b), on(a, b)
    np.testing.assert_array_equal(r_on, r_lit)
    np.testing.assert_allclose(r_on, np.maximum(np.exp(a), b), rtol=2e-6)
    assert len(on.last_programs[0]) == len(lit.last_programs[0]) == 4 * 5  # 2 loads, exp, max, store


@pytest.mark.parametrize("seed", [0, 4, 13])
def test_random_tile_mixes_over_sbuf_spill_and_reload_anywhere(seed):
    # tiles of mixed widths (1.3-2.6x SBUF in all) loaded up front, then read in pairs in a random
    # order: reloads land wherever there is room and the instructions' views follow them
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 20))
    widths = [int(rng.choice([512, 1024, 4096, 8192, 12288, 16384])) for _ in range(n)]
    order = [(int(rng.integers(n)), int(rng.integers(n))) for _ in range(int(rng.integers(n, 2 * n)))]
    xs = [rng.integers(-50, 50, (128, w)).astype(np.float32) for w in widths]
    assert sum(widths) * 4 > SBUF

    def k(*xs):
        out = nl.ndarray((len(order), 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        ts = [nl.load(x) for x in xs]
        for j, (a, b) in enumerate(order):
            nl.store(out[j], value=nl.add(ts[a][:, 0:512], ts[b][:, 0:512]))
        return out

    kern = lnki.jit(k)
    np.testing.assert_array_equal(kern(*xs), np.stack([xs[a][:, :512] + xs[b][:, :512] for a, b in order]))
    st = kern.last_spills
    assert st["spills"] == st["reloads"] > 0 and st["spilled_bytes"] == st["reloaded_bytes"]


def test_reduce_init_switched_off_reads_the_fresh_tile_as_it_is():
    @lnki.jit(fill=0xFF, passes={"reduce_init": "off"})
    def k(a):
        acc = nl.ndarray((a.shape[1], a.shape[2]), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(a.shape[0]):
            acc[...] = nl.loop_reduce(nl.load(a[i]), op=np.add, loop_indices=[i])
        out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=acc)
        return out

    assert np.isnan(k(np.ones((2, 8, 16), np.float32))).all()  # the fill's NaN, added to


def _psum_qk_kernel(a, b):
    """16 matmul results of [128, 512] fp32 (one 2 KiB PSUM bank each: twice PSUM's 8 banks), all
    made before any is read, as the attention tutorial's attn_fwd_v3 keeps its QK blocks."""
    n = b.shape[1] // 512
    out = nl.ndarray((n, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    at = nl.load(a)
    bt = nl.load(b)
    qk = nl.ndarray((n, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(n):
        qk[i] = lisa.nc_matmul(at, bt[:, i * 512 : (i + 1) * 512])
    for i in nl.affine_range(n):
        nl.store(out[i], value=nl.copy(qk[i]))
    return out


def _psum_qk_inputs():
    """Small integers (exact in fp32) for `_psum_qk_kernel`."""
    rng = np.random.default_rng(6)
    a = rng.integers(-4, 4, (128, 128)).astype(np.float32)
    b = rng.integers(-4, 4, (128, 16 * 512)).astype(np.float32)
    return a, b


def test_psum_block_tile_over_psum_spills_through_sbuf():
    # 16 matmul results of [128, 512] fp32 (one 2 KiB bank each: twice PSUM's 8 banks) all made
    # before any is read, as the attention tutorial's attn_fwd_v3 keeps its QK blocks
    k = lnki.jit(_psum_qk_kernel)
    a, b = _psum_qk_inputs()
    with pytest.raises(CapacityError, match="was evicted"):
        lnki.jit(k.fn, passes="literal")(a, b)
    got = k(a, b)
    want = (a.T @ b).reshape(128, 16, 512).transpose(1, 0, 2)
    np.testing.assert_array_equal(got, want)  # small integers: exact in fp32
    # By hand, furthest next use first: blocks 0-7 fill the 8 banks; making blocks 8..15 spills
    # the newest resident block each time (7..14), through SBUF (PSUM has no DMA path); SBUF
    # holds the 8 copies, so nothing goes to HBM
    st = k.last_spills
    assert (st["psum_spills"], st["psum_spilled_bytes"], st["spills"]) == (8, 8 * 128 * 2048, 0)


def test_spill_rule_lru_is_switchable():
    # same 2x-SBUF kernel with least-recently-used spilling: correct too, and never fewer reloads
    # than furthest-next-use's 9 (Belady's rule needs the fewest for tiles of one size)
    x = np.random.default_rng(7).integers(-99, 99, (16, 128, 8192)).astype(np.float32)
    k = lnki.jit(_spill_kernel, passes={"spill": "lru"})
    np.testing.assert_array_equal(k(x), 2 * x)
    assert k.last_spills["reloads"] >= 9 and k.last_spills["spills"] >= 9


def test_a_kernel_tracing_differently_the_second_time_falls_back_to_literal_allocation():
    # the plan of the first trace does not describe the second: never free by it (the literal
    # allocation's error instead of wrong results)
    runs = []

    def k(x):
        runs.append(1)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        ts = [nl.load(x)]
        if len(runs) == 2:
            ts.append(nl.multiply(ts[-1], 1.0))  # an extra tile the first trace did not make
        for _ in range(9):
            ts.append(nl.add(ts[-1], 1.0))
        nl.store(out, value=ts[-1])
        return out

    with pytest.raises(CapacityError, match="SBUF overflow"):
        lnki.jit(k, passes={"liveness": "on", "lowering": "retrace"})(np.ones((128, 7168), np.float32))
    assert len(runs) == 3  # first trace, second trace, literal trace
    # lowered by the walk, the body runs once: nothing can trace differently
    runs.clear()
    x = np.ones((128, 7168), np.float32)
    np.testing.assert_array_equal(lnki.jit(k, passes={"liveness": "on"})(x), x + 9)
    assert len(runs) == 1


def _dyn_read_kernel(x, ix):
    # every tile is loaded before any is read, each read through a run-time column index
    n = x.shape[0]
    out = nl.ndarray((n, 128, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    idx = nl.load(ix)
    ts = [nl.load(x[i]) for i in range(n)]
    for i in range(n):
        nl.store(out[i], value=ts[i].select(1, idx))
    return out


def test_tiles_read_through_run_time_offsets_are_not_spilled_and_the_error_says_so():
    """Views with a run-time offset cannot move, so the spill pass never spills their tiles: 6
    [128, 8192] fp32 tiles (192 KiB per partition) fit and run; 10 (320 KiB, over SBUF's 256 KiB)
    get CapacityError naming the run-time-offset tiles as what cannot be spilled."""
    rng = np.random.default_rng(5)
    ix = np.array([[5]], np.int32)
    x = rng.integers(-99, 99, (6, 128, 8192)).astype(np.float32)
    k = lnki.jit(_dyn_read_kernel)
    np.testing.assert_array_equal(k(x, ix)[:, :, 0], x[:, :, 5])
    assert k.last_spills.get("spills", 0) == 0
    x = rng.integers(-99, 99, (10, 128, 8192)).astype(np.float32)
    with pytest.raises(CapacityError, match="read through run-time offsets .* which are never spilled") as e:
        lnki.jit(_dyn_read_kernel)(x, ix)
    assert e.value.rule == "onchip_capacity"
