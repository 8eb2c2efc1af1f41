"""The kernel IR as the passes leave it (`nki/ir.py`, docs/nki.md "Passes"): the spill and reload
copies of the `spill` pass are calls of the lowered IR (with their tiles and HBM slots), device
loops are in the loop nest, and `engine_choice` runs over the IR when it is recorded, its
decisions written on the calls and lowered into the program. Expected counts are worked out by
hand from each kernel's source; results are checked against numpy."""

import sys
from pathlib import Path

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.nki import language as nl0
from trn3emu.nki.ir import KernelIR

tn.install()

import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.isa as lisa  # noqa: E402
import neuronxcc.nki.language as lnl  # noqa: E402
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import test_nki_liveness as lv  # noqa: E402

SBUF = nl0.tile_size.total_available_sbuf_size  # bytes per partition


def _spill_kernel(x):  # 16 tiles of 32 KiB per partition all loaded before any is used: 2x SBUF
    n = x.shape[0]
    out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
    ts = [lnl.load(x[i]) for i in range(n)]
    for i in range(n):
        lnl.store(out[i], value=lnl.multiply(ts[i], 2.0))
    return out


def _instr_text(prog, i: int) -> str:
    return prog._native.instruction_text(i)


def test_spill_and_reload_copies_are_calls_of_the_lowered_ir():
    x = np.random.default_rng(3).integers(-99, 99, (16, 128, 8192)).astype(np.float32)
    row = 8192 * 4
    assert 16 * row == 2 * SBUF
    k = lnki.jit(_spill_kernel)
    np.testing.assert_array_equal(k(x), 2 * x)
    ir, prog = k.last_ir, k.last_programs[0]
    # By hand (tests/test_nki_liveness.py): furthest next use first, 9 tiles go out and come back
    # once each. The lowered IR is the program: 16 loads, 16 multiplies, 16 stores + 9 + 9 copies.
    assert len(ir.calls) == len(prog) == 66
    assert [c.ordinal for c in ir.calls] == list(range(66))
    spills = [c for c in ir.calls if c.added_by == "spill" and c.hbm_writes]
    reloads = [c for c in ir.calls if c.added_by == "spill" and c.hbm_reads]
    assert len(spills) == len(reloads) == 9
    assert all(c.op == "dma_copy" for c in spills + reloads)
    assert sum(1 for c in ir.calls if not c.added_by) == 48
    tile_bytes = 128 * row
    for c in spills:
        (t,), (h,) = c.reads, c.hbm_writes
        slot = ir.tensors[h]
        assert slot.nbytes == tile_bytes and slot.name == f"spill slot of t{t}"
        assert c.notes["spill"] == f"t{t} -> h{h}, {tile_bytes} B"
        # its reload reads the same slot into the same tile, before the tile's next kernel use
        (r,) = [r for r in reloads if r.hbm_reads == (h,)]
        assert r.writes == (t,) and r.ordinal > c.ordinal
        nxt = [u for u in ir.tiles[t].uses if u > r.ordinal]
        assert nxt and not ir.calls[nxt[0]].added_by
        assert [u for u in ir.tiles[t].uses if c.ordinal < u < r.ordinal] == []
    assert sum(ir.tensors[c.hbm_writes[0]].nbytes for c in spills) == k.last_spills["spilled_bytes"] == 9 * tile_bytes
    # each call's instruction is where the IR says: spill copies are the DMAs named spill / reload
    for c in ir.calls:
        text = _instr_text(prog, c.instr)
        assert text.split()[0].split(".")[0] == c.op
        if c.added_by:
            assert ("name=reload" if c.hbm_reads else "name=spill") in text
    assert ir.passes["spill"].startswith("rule furthest: 9 spills")
    dump = ir.summary(limit=None)
    assert dump.count("dma_copy (spill)") == 18


def test_psum_spills_through_sbuf_are_calls_with_their_sbuf_copies():
    # 16 matmul results of one PSUM bank each (twice PSUM) made before any is read: by hand, the
    # furthest-next-use rule spills blocks 7..14 to SBUF copies (8 `psum_spill` copies, SBUF holds
    # them: nothing goes to HBM) and copies each back before its read (8 `psum_reload`)
    k = lnki.jit(lv._psum_qk_kernel)
    a, b = lv._psum_qk_inputs()
    np.testing.assert_array_equal(k(a, b), (a.T @ b).reshape(128, 16, 512).transpose(1, 0, 2))
    ir = k.last_ir
    added = [c for c in ir.calls if c.added_by]
    assert [c.op for c in added] == ["tensor_copy"] * 16
    out_, back = added[:8], added[8:]
    copies = set()
    for c in out_:
        (t,), (cp,) = c.reads, c.writes
        assert ir.tiles[t].buffer == "psum" and ir.tiles[cp].buffer == "sbuf"
        assert ir.tiles[cp].label.startswith("PSUM spill of") and ir.tiles[cp].row_bytes == 2048
        copies.add(cp)
    assert {c.reads[0] for c in back} == copies  # each copy read back once
    assert not any(c.hbm_reads or c.hbm_writes for c in added)
    # the lowered program has them where the IR says
    prog = k.last_programs[0]
    assert len(ir.calls) == len(prog)
    assert all("name=psum_spill" in _instr_text(prog, c.instr) for c in out_)
    assert all("name=psum_reload" in _instr_text(prog, c.instr) for c in back)


@nki.jit(ir=True)
def _device_loops(a, n):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    cnt = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cnt, src=n)
    r = nisa.register_alloc()
    nisa.register_load(r, cnt)
    for _ in nl.dynamic_range(r):  # n iterations, n read on the device
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

    def halve_and_count_down(c):  # while c: t *= 2; c -= 1
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.tensor_scalar(cnt, cnt, op0=nl.add, operand0=-1)
        nxt = nisa.register_alloc()
        nisa.register_load(nxt, cnt)
        return nxt

    nl.while_loop(r, halve_and_count_down)

    def add_one(i):  # n more iterations (r still holds n), i a register
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

    nl.fori_loop(0, r, add_one)
    for _i in nl.affine_range(2):  # a trace-time loop after them
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=0.5)
    nl.store(out, value=t)
    return out


def test_device_loops_are_in_the_loop_nest():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    n = 3
    np.testing.assert_array_equal(_device_loops(a, np.array([[n]], np.int32)), (a + n) * 2.0**n + n + 1.0)
    ir = _device_loops.last_ir
    kinds = [(lp.kind, lp.var, lp.device) for lp in ir.loops]
    assert kinds == [
        ("dynamic_range", "_", True),
        ("while_loop", "", True),
        ("fori_loop", "", True),
        ("affine_range", "_i", False),
    ]
    add1 = [c for c in ir.calls if c.op == "tensor_scalar" and c.nest and c.nest[0][0] == 0]
    assert [c.nest for c in add1] == [((0, i, 3),) for i in range(3)]
    # the while loop ran 3 times (its count filled in when it ended): t *= 2 and cnt -= 1 each time
    body = [c for c in ir.calls if c.nest and c.nest[0][0] == 1 and c.op == "tensor_scalar"]
    assert [c.nest for c in body] == [((1, i, 3),) for i in range(3) for _ in range(2)]
    fori = [c for c in ir.calls if c.nest and c.nest[0][0] == 2]
    assert [(c.op, c.nest) for c in fori] == [
        (op, ((2, i, 3),)) for i in range(3) for op in ("register_move", "tensor_scalar")
    ]
    # the register calls are calls too: the while body's register_load reads cnt (a tile)
    loads = [c for c in ir.calls if c.op == "register_load"]
    assert len(loads) == 1 + 3 and all(len(c.reads) == 1 for c in loads)
    assert [c.nest for c in ir.calls if c.nest and c.nest[0][0] == 3] == [((3, 0, 2),), ((3, 1, 2),)]
    # by hand: the bound of dynamic_range, 4 while conditions (3 true, 1 false) and fori_loop's
    # upper bound are read on the device, each ending a program: 7 segments; the dynamic loop's
    # calls are in segment 1, the while loop's k-th iteration in segment 2 + k, the rest in the last
    assert [c.segment for c in add1] == [1, 1, 1]
    assert [c.segment for c in body] == [2, 2, 3, 3, 4, 4]
    assert {c.segment for c in fori} == {6} and ir.calls[-1].segment == 6 and ir.calls[0].segment == 0
    assert "loop L0: for _ in dynamic_range (device loop)" in str(ir)


def _copies(x):
    out = nl.ndarray((4, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    for i in range(4):
        nl.store(out[i], value=nl.copy(t))
    return out


def test_engine_choice_runs_over_the_ir_and_lowering_applies_it():
    x = np.random.default_rng(1).standard_normal((128, 512)).astype(np.float32)
    want = np.broadcast_to(x, (4, 128, 512))
    fused = nki.jit(_copies)  # no IR: the rule runs while appending
    over_ir = nki.jit(_copies, ir=True)  # the pass over the recorded IR, then lowering
    literal = nki.jit(_copies, ir=True, passes={"engine_choice": "off"})
    for k in (fused, over_ir, literal):
        np.testing.assert_array_equal(k(x), want)
    # By hand (trn3: a [128, 512] fp32 copy costs the same on VectorE, ScalarE and GpSimd; DMAs
    # are not compute): the copies go round VectorE, ScalarE, GpSimd and back to VectorE (least
    # loaded, ties by affinity); each store is triggered by its source's writer, the copy before it
    engines = ["vector", "scalar", "gpsimd", "vector"]
    ir = over_ir.last_ir
    assert [c.op for c in ir.calls] == ["dma_copy"] + ["tensor_copy", "dma_copy"] * 4
    decided = [c.notes["engine_choice"] for c in ir.calls[1:]]
    prog = over_ir.last_programs[0]
    assert [e for ((i, e),) in decided] == [e for e in engines for _ in range(2)]
    assert [i for ((i, e),) in decided] == [c.instr for c in ir.calls[1:]] == list(range(1, 9))
    assert "engine_choice" not in ir.calls[0].notes  # a load: not the rule's
    assert [prog._native.instruction_engine(i) for i in range(9)] == ["sync"] + [e for e in engines for _ in range(2)]
    # the same program as the rule applied while appending; the literal one differs
    assert prog.to_text() == fused.last_programs[0].to_text()
    lit = literal.last_programs[0]
    assert [lit._native.instruction_engine(i) for i in range(9)] == ["sync"] + ["vector", "scalar"] * 4
    assert not any(c.notes for c in literal.last_ir.calls) and "engine_choice" not in literal.last_ir.passes
    # the dump says what the pass did, per call and in all
    assert (
        ir.passes["engine_choice"]
        == "8 unpinned instructions: VectorE 4, ScalarE 2, GpSimd 2; 6 off their ISA default engine"
    )
    text = str(ir)
    assert "pass engine_choice: 8 unpinned instructions" in text
    assert text.count("| engine_choice: gpsimd") == 2
    assert KernelIR.from_dict(ir.to_dict()) == ir  # notes and passes round-trip


def test_engine_choice_over_the_ir_with_spills_matches_the_fused_rule(monkeypatch):
    # the liveness pass's lowering (the walk, by default) records the lowered IR: engine_choice
    # runs over it, including the spill copies the spill pass adds; the rule applied while
    # appending (here in the second trace of lowering=retrace) gives the same program.
    from trn3emu.nki import engine_choice

    x = np.random.default_rng(5).integers(-9, 9, (16, 128, 8192)).astype(np.float32)
    k = lnki.jit(_spill_kernel)
    np.testing.assert_array_equal(k(x), 2 * x)
    over_ir = k.last_programs[0].to_text()
    assert "engine_choice" in k.last_ir.passes
    monkeypatch.setattr(engine_choice, "run", lambda ctx: None)
    orig = engine_choice.configure

    def fused(ctx):  # the rule while appending, also in the lowering trace
        if ctx.ir is not None and ctx.ir.mode == "emit":
            ctx.program._native.set_engine_balance("trn3")
        else:
            orig(ctx)

    monkeypatch.setattr(engine_choice, "configure", fused)
    k2 = lnki.jit(_spill_kernel, passes={"lowering": "retrace"})  # (the second trace: `fused` applies)
    np.testing.assert_array_equal(k2(x), 2 * x)
    assert k2.last_programs[0].to_text() == over_ir
    assert not any(c.notes.get("engine_choice") for c in k2.last_ir.calls)


@pytest.mark.parametrize("n", [0, 2])
def test_device_loop_segments_balance_like_the_first(n):
    # every segment of a device-loop kernel has the rule (the pass over the IR per segment with
    # ir=True; while appending without): the last segment's copies go round the engines
    @nki.jit
    def k(a, m):
        out = nl.ndarray((3, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        cnt = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=cnt, src=m)
        r = nisa.register_alloc()
        nisa.register_load(r, cnt)
        t = nl.load(a)
        for _ in nl.dynamic_range(r):  # (only a register_move per iteration, on the sync engine)
            pass
        for i in range(3):
            nl.store(out[i], value=nl.copy(t))
        return out

    a = np.random.default_rng(2).standard_normal((128, 512)).astype(np.float32)
    m = np.array([[n]], np.int32)
    want = np.broadcast_to(a, (3, 128, 512))
    np.testing.assert_array_equal(k(a, m), want)
    rec = nki.jit(k.fn, ir=True)
    np.testing.assert_array_equal(rec(a, m), want)
    assert rec.last_programs[0].to_text() == k.last_programs[0].to_text()
    prog = k.last_programs[0]
    copies = [prog._native.instruction_engine(i) for i in range(len(prog)) if "tensor_copy" in _instr_text(prog, i)]
    # by hand: the last segment's only compute instructions are the 3 equal copies: VectorE,
    # ScalarE, GpSimd (before every segment balanced, the last one's were all on VectorE)
    assert copies == ["vector", "scalar", "gpsimd"]


def _legacy_row_loop(x, w):
    out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
    for i in lnl.affine_range(4):
        wt = lnl.load(w)  # loop-invariant
        t = lnl.load(x[i * 128 : (i + 1) * 128, :])
        u = lnl.ndarray((128, 64), dtype=lnl.float32, buffer=lnl.sbuf)
        u[...] = lisa.tensor_tensor(t, wt, op=lnl.add)
        u[...] = lisa.activation(op=lnl.exp, data=u)
        lnl.store(out[i * 128 : (i + 1) * 128, :], value=u)
    return out


def test_passes_acting_while_tracing_are_counted_and_noted_in_the_ir():
    x = np.random.default_rng(0).random((512, 64), dtype=np.float32)
    w = np.random.default_rng(1).random((128, 64), dtype=np.float32)
    want = np.exp(x + np.tile(w, (4, 1)))
    k = lnki.jit(_legacy_row_loop, ir=True)
    np.testing.assert_allclose(k(x, w), want, rtol=1e-6)
    ir = k.last_ir
    # by hand: w is loaded once and served from SBUF 3 times (load_reuse); each of the 2
    # assignments per iteration is the op writing u (inplace_assign), no copy: 1 + 4 x 4 calls
    assert len(ir.calls) == 17 == len(k.last_programs[0])
    assert ir.passes["load_reuse"] == "loads served from an SBUF tile (no DMA): 3"
    assert ir.passes["inplace_assign"] == "written into the assignment target: 8"
    noted = [c.op for c in ir.calls if "inplace_assign" in c.notes]
    assert noted == ["tensor_tensor", "activation"] * 4
    assert sum(c.op == "dma_copy" and c.hbm_reads == () for c in ir.calls) == 4  # the stores
    text = str(ir)
    assert "pass load_reuse:" in text and "| inplace_assign: written into the assignment target" in text
    # switched off: the literal program (2 loads, op + copy twice, store per iteration), no notes
    lit = lnki.jit(_legacy_row_loop, ir=True, passes={"inplace_assign": "off", "load_reuse": "off"})
    np.testing.assert_allclose(lit(x, w), want, rtol=1e-6)
    assert len(lit.last_ir.calls) == 28
    assert "load_reuse" not in lit.last_ir.passes and "inplace_assign" not in lit.last_ir.passes
    assert not any("inplace_assign" in c.notes for c in lit.last_ir.calls)
    # recording changes nothing: the same program without the IR
    plain = lnki.jit(_legacy_row_loop)
    plain(x, w)
    assert plain.last_programs[0].to_text() == k.last_programs[0].to_text()


def test_reduce_init_is_noted_on_the_copy_it_makes():
    @lnki.jit(ir=True)
    def k(x):
        out = lnl.ndarray((128, 64), dtype=lnl.float32, buffer=lnl.shared_hbm)
        acc = lnl.ndarray((128, 64), dtype=lnl.float32, buffer=lnl.sbuf)  # never written
        for i in lnl.affine_range(3):
            t = lnl.load(x[i])
            acc[...] = lnl.loop_reduce(t, op=np.add, loop_indices=[i])
        lnl.store(out, value=acc)
        return out

    x = np.random.default_rng(4).integers(-9, 9, (3, 128, 64)).astype(np.float32)
    np.testing.assert_array_equal(k(x), x.sum(axis=0))
    ir = k.last_ir
    # by hand: the first reduction into the unwritten acc is a copy (noted), the other two add
    assert ir.passes["reduce_init"] == "reductions started from their first value: 1"
    assert [(c.op, "reduce_init" in c.notes) for c in ir.calls if c.op != "dma_copy"] == [
        ("tensor_copy", True),
        ("tensor_tensor", False),
        ("tensor_tensor", False),
    ]


def _three_big(x):  # three [128, 28672] fp32 tiles of 112 KiB per partition: 336 KiB > SBUF
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((128, 28672), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((128, 28672), dtype=nl.float32, buffer=nl.sbuf)
    c = nl.ndarray((128, 28672), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x[0])  # call 0
    nisa.dma_copy(dst=b, src=x[1])  # call 1
    nisa.dma_copy(dst=c, src=x[2])  # call 2
    nisa.dma_copy(dst=out[2], src=c)  # call 3: c's last use
    nisa.dma_copy(dst=out[1], src=b)  # call 4: b's last use
    nisa.dma_copy(dst=out[0], src=a)  # call 5: a's last use
    return out


def test_one_spill_worked_out_by_hand():
    x = np.random.default_rng(8).standard_normal((3, 128, 28672)).astype(np.float32)
    row = 28672 * 4
    assert 2 * row <= SBUF < 3 * row
    k = nki.jit(_three_big, passes={"liveness": "on", "spill": "on"})
    np.testing.assert_array_equal(k(x), x)
    ir = k.last_ir
    # By hand: the three tiles are allocated before any call. a and b fill 224 of 256 KiB; c needs
    # 112 KiB before call 0, when a is used next (not spillable) and b next at call 1: b goes out,
    # never written, so without a copy. Before call 1 b comes back (no copy either): a (next use
    # call 5) is further than c (call 2), so a, written by call 0, is spilled by DMA; after b's
    # store (call 4) b and c are dead and a is reloaded before its store. Lowered: load a, spill a,
    # load b, load c, store c, store b, reload a, store a.
    assert [(c.op, c.added_by) for c in ir.calls] == [
        ("dma_copy", ""),
        ("dma_copy", "spill"),
        ("dma_copy", ""),
        ("dma_copy", ""),
        ("dma_copy", ""),
        ("dma_copy", ""),
        ("dma_copy", "spill"),
        ("dma_copy", ""),
    ]
    spill, reload = ir.calls[1], ir.calls[6]
    (h,) = spill.hbm_writes
    assert spill.reads == (0,) and reload.writes == (0,) and reload.hbm_reads == (h,)
    assert ir.tensors[h].nbytes == 128 * row == 14_680_064
    assert spill.notes["spill"] == f"t0 -> h{h}, 14680064 B"
    assert reload.notes["spill"] == f"reload h{h} -> t0, 14680064 B"
    assert ir.tiles[0].uses == [0, 1, 6, 7]
    assert k.last_spills["spills"] == k.last_spills["reloads"] == 1
    assert k.last_spills["spilled_bytes"] == k.last_spills["reloaded_bytes"] == 14_680_064
    assert ir.passes["spill"].startswith("rule furthest: 1 spills (14680064 B), 1 reloads (14680064 B)")
    assert [c.instr for c in ir.calls] == list(range(8))  # one instruction each, in this order


@pytest.mark.parametrize(
    "name, kernel, shapes",
    [
        ("nki_softmax", "softmax_rows", [(256, 512)]),
        ("nki_layernorm", "layernorm", [(256, 512), (512,), (512,)]),
        ("nki_rmsnorm", "rmsnorm", [(384, 768), (768,)]),
    ],
)
def test_shipped_examples_lower_to_the_same_program_over_the_ir(name, kernel, shapes):
    # engine_choice over the recorded IR and fused into the append give the same instructions
    # (engines, stores' trigger engines) and the same results on the shipped examples
    import importlib

    mod = importlib.import_module(f"trn3emu.examples.{name}")
    fn = getattr(mod, kernel).fn
    rng = np.random.default_rng(9)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    plain, rec = nki.jit(fn), nki.jit(fn, ir=True)
    np.testing.assert_array_equal(plain(*args), rec(*args))
    assert rec.last_programs[0].to_text() == plain.last_programs[0].to_text()
    assert rec.last_ir.passes["engine_choice"]  # (it decided something)
    # (the notes name the instructions still in the program: a broadcast copy the pass
    # psum_forward dropped had its engine decided, unpinned, and is gone from them)
    assert (
        sum(len(c.notes.get("engine_choice", ())) for c in rec.last_ir.calls)
        == int(rec.last_ir.passes["engine_choice"].split()[0]) - rec.last_programs[0].psum_forward
    )


def test_set_engine_refuses_a_missing_instruction_and_an_engine_the_isa_forbids():
    # a pass's decision is validated as at append: nothing changes on a refusal
    import trn3emu as t3
    from trn3emu.errors import OperandError

    p = t3.Program()
    a, b = p.sbuf((128, 4), np.float32), p.sbuf((128, 4), np.float32)
    p.memset(dst=a, value=1.0)
    p.tensor_copy(dst=b, src=a)
    with pytest.raises(OperandError) as e:
        p._native.set_engine(2, "vector")
    assert e.value.rule == "instruction_out_of_range" and e.value.operand == "index"
    before = p.to_text()
    with pytest.raises(OperandError) as e:
        p._native.set_engine(1, "tensor")  # tensor_copy never runs on the PE array
    assert e.value.rule == "engine_not_allowed"
    assert p.to_text() == before


@pytest.mark.parametrize(
    "call, operand",
    [
        (lambda n: n.set_engine(-1, "vector"), "index"),
        (lambda n: n.remove([-1]), "indices"),
        (lambda n: n.move_operands([(-1, 0, 4)]), "moves"),
        (lambda n: n.move_operands([(0, -2, 4)]), "moves"),
        (lambda n: n.forward_copies([-3]), "copies"),
    ],
)
def test_negative_instruction_indices_are_operand_errors(call, operand):
    # the passes' native hooks name the operand and the rule, not Python's bare OverflowError
    import trn3emu as t3
    from trn3emu.errors import OperandError

    p = t3.Program()
    a, b = p.sbuf((128, 4), np.float32), p.sbuf((128, 4), np.float32)
    p.memset(dst=a, value=1.0)
    p.tensor_copy(dst=b, src=a)
    before = p.to_text()
    with pytest.raises(OperandError, match="negative") as e:
        call(p._native)
    assert (e.value.rule, e.value.operand) == ("instruction_out_of_range", operand)
    assert p.to_text() == before
