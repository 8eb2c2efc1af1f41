"""The kernel IR (`nki/ir.py`, recorded by `nki/record.py`; docs/nki.md "Passes"): calls in program
order with their loop nest, tiles with their uses, live bytes per partition. Every expected figure
is worked out by hand from the kernel's source."""

import json

import ml_dtypes
import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.nki.ir import KernelIR

tn.install()

import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.language as lnl  # noqa: E402
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

BF16 = ml_dtypes.bfloat16


def _three_temporaries(x):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        a = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)  # 512 B per partition
        b = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)  # 256 B
        c = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)  # 512 B
        nisa.dma_copy(dst=a, src=x[:, i * 128 : (i + 1) * 128])
        nisa.activation(dst=b, op=nl.exp, data=a)
        nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.add)
        nisa.dma_copy(dst=out[:, i * 128 : (i + 1) * 128], src=c)
    return out


def _x():
    return np.random.default_rng(0).uniform(-2, 2, (128, 512)).astype(np.float32)


def _line_of(fn, text: str) -> str:
    """file:line of the first source line of `fn` containing `text` (independent of the IR)."""
    import inspect
    import os

    lines, first = inspect.getsourcelines(fn)
    for i, s in enumerate(lines):
        if text in s:
            return f"{os.path.basename(inspect.getsourcefile(fn))}:{first + i}"
    raise AssertionError(text)


def test_loop_of_four_with_three_temporaries():
    k = nki.jit(_three_temporaries, ir=True)
    x = _x()
    got = k(x)
    want = x + np.exp(x).astype(BF16).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-2)
    ir = k.last_ir
    assert isinstance(ir, KernelIR) and ir.program == 0 and ir.kernel == "_three_temporaries"
    # 4 calls per iteration, 4 iterations
    assert len(ir.calls) == 16
    assert [c.op for c in ir.calls[:4]] == ["dma_copy", "activation", "tensor_tensor", "dma_copy"]
    assert [c.ordinal for c in ir.calls] == list(range(16))
    # one loop, its variable, kind and line; every call's nest is (loop 0, iteration, 4)
    assert len(ir.loops) == 1
    lp = ir.loops[0]
    assert (lp.kind, lp.var, lp.line) == ("affine_range", "i", _line_of(_three_temporaries, "nl.affine_range(4)"))
    for c in ir.calls:
        assert c.nest == ((0, c.ordinal // 4, 4),)
    assert ir.calls[1].line == _line_of(_three_temporaries, "nisa.activation")
    # 3 tiles per iteration, allocation order a, b, c
    assert len(ir.tiles) == 12
    assert [(t.buffer, t.shape, t.dtype, t.row_bytes) for t in ir.tiles[:3]] == [
        ("sbuf", (128, 128), "float32", 512),
        ("sbuf", (128, 128), "bfloat16", 256),
        ("sbuf", (128, 128), "float32", 512),
    ]
    for i in range(4):
        a, b, c = ir.tiles[3 * i : 3 * i + 3]
        # a: written by the load, read by activation and tensor_tensor; b: written, read; c: written, stored
        assert a.uses == [4 * i, 4 * i + 1, 4 * i + 2]
        assert b.uses == [4 * i + 1, 4 * i + 2]
        assert c.uses == [4 * i + 2, 4 * i + 3]
        assert (a.last_use, b.last_use, c.last_use) == (4 * i + 2, 4 * i + 2, 4 * i + 3)
        assert (a.born, b.born, c.born) == (4 * i,) * 3  # allocated before the iteration's first call
        assert not (a.placed or b.placed or c.placed)
        act, tt = ir.calls[4 * i + 1], ir.calls[4 * i + 2]
        assert (act.writes, act.reads) == ((b.ordinal,), (a.ordinal,))
        assert (tt.writes, tt.reads) == ((c.ordinal,), (a.ordinal, b.ordinal))
    # HBM: the output (allocated first) and the input x
    names = {t.name for t in ir.tensors}
    assert "x" in names and len(ir.tensors) == 2
    hx = next(t for t in ir.tensors if t.name == "x")
    assert hx.shape == (128, 512) and hx.uses == [0, 4, 8, 12]
    assert ir.calls[0].hbm_reads == (hx.ordinal,)
    assert ir.calls[3].hbm_writes != () and ir.calls[3].hbm_reads == ()
    # live bytes per partition: a, b, c from the iteration's start, a and b to the third call,
    # c to the store: 1280, 1280, 1280, 512 per iteration
    assert ir.live_bytes("sbuf") == [1280, 1280, 1280, 512] * 4
    assert ir.peak("sbuf") == (1280, 0)
    assert ir.peak("psum") == (0, 0)
    assert ir.live_at(3) == [2] and ir.live_at(4) == [3, 4, 5]


def test_summary_is_one_line_per_call_and_truncates():
    k = nki.jit(_three_temporaries, ir=True)
    k(_x())
    ir = k.last_ir
    full = ir.summary(limit=None).splitlines()
    calls = [s for s in full if s.lstrip().split(" ")[0].isdigit()]
    assert len(calls) == 16
    assert "tensor_tensor  t2 <- t0, t1  | i=0/4  | last use: t0, t1" in calls[2]
    assert "peak live SBUF 1280 B/partition at call 0" in full[0]
    short = ir.summary(limit=6).splitlines()
    shown = [s for s in short if s.lstrip().split(" ")[0].isdigit()]
    assert len(shown) == 6 and shown[0].lstrip().startswith("0 ") and shown[-1].lstrip().startswith("15 ")
    assert any("10 calls not shown" in s for s in short)
    assert str(ir) == ir.summary()


def test_to_dict_json_round_trip():
    k = nki.jit(_three_temporaries, ir=True)
    k(_x())
    ir = k.last_ir
    d = json.loads(json.dumps(ir.to_dict()))
    back = KernelIR.from_dict(d)
    assert back == ir
    assert back.calls[5].nest == ((0, 1, 4),) and back.tiles[0].shape == (128, 128)
    assert back.live_bytes() == ir.live_bytes()
    d["calls"]["rows"][0][1] = "memset"  # a different IR compares unequal
    assert KernelIR.from_dict(d) != ir


def test_not_recorded_unless_asked(monkeypatch):
    monkeypatch.delenv("TRN3EMU_NKI_IR", raising=False)
    k = nki.jit(_three_temporaries)
    k(_x())
    assert k.last_ir is None and k.last_irs == []


def test_recording_keeps_the_program():
    x = _x()
    plain, rec = nki.jit(_three_temporaries), nki.jit(_three_temporaries, ir=True)
    a, b = plain(x), rec(x)
    np.testing.assert_array_equal(a, b)
    assert [len(p) for p in plain.last_programs] == [len(p) for p in rec.last_programs] == [16]


def test_nested_loops_break_and_grid():
    @nki.jit(ir=True)
    def kern(x):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        for _r in nl.sequential_range(2):
            for c in nl.static_range(3):
                if c == 2:
                    break
                nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.zeros((128, 64), np.float32)
    np.testing.assert_array_equal(kern[2](x), x + 4)
    assert len(kern.last_irs) == 2 and kern.last_ir is kern.last_irs[0]
    assert [ir.program for ir in kern.last_irs] == [0, 1]
    ir = kern.last_irs[1]
    assert [(lp.kind, lp.var) for lp in ir.loops] == [("sequential_range", "_r"), ("static_range", "c")]
    assert [c.nest for c in ir.calls] == [
        (),
        ((0, 0, 2), (1, 0, 3)),
        ((0, 0, 2), (1, 1, 3)),
        ((0, 1, 2), (1, 0, 3)),
        ((0, 1, 2), (1, 1, 3)),
        (),  # after the loops (the inner one left by break)
    ]
    assert ir.tiles[0].uses == [0, 1, 2, 3, 4, 5]
    assert ir.calls[1].reads == (0,) and ir.calls[1].writes == (0,)


def test_legacy_kernel_and_the_liveness_pass_read_the_same_ir():
    def body(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        for i in lnl.affine_range(2):
            t0 = lnl.load(x[i * 128 : (i + 1) * 128, :])
            t1 = lnl.multiply(t0, 2.0)
            t2 = lnl.add(t1, 1.0)
            lnl.store(out[i * 128 : (i + 1) * 128, :], value=t2)
        return out

    x = np.random.default_rng(3).integers(-8, 8, (256, 64)).astype(np.float32)
    rec = lnki.jit(body, ir=True)
    np.testing.assert_array_equal(rec(x), x * 2 + 1)
    ir = rec.last_ir
    # per iteration: load, multiply, add, store
    assert [c.op for c in ir.calls] == ["dma_copy", "tensor_scalar", "tensor_scalar", "dma_copy"] * 2
    assert [c.nest for c in ir.calls] == [((0, i, 2),) for i in range(2) for _ in range(4)]
    assert ir.loops[0].var == "i"
    assert [t.uses for t in ir.tiles] == [[0, 1], [1, 2], [2, 3], [4, 5], [5, 6], [6, 7]]
    assert [t.row_bytes for t in ir.tiles] == [256] * 6
    # the liveness pass (forced on) records the same IR in its first trace and lowers to the same
    # instructions
    live = lnki.jit(body, passes={"liveness": "on"})
    np.testing.assert_array_equal(live(x), x * 2 + 1)
    # its IR is the lowered one (no spills here: the same calls and tiles), which says so
    assert all(len(t.at) == 1 for t in live.last_ir.tiles)  # placed once each, never moved
    for t in live.last_ir.tiles:
        t.at = []  # (the pass's placements: a literal trace records none)
    lowered = live.last_ir.to_dict()
    assert {k: v for k, v in lowered.items() if k != "passes"} == {
        k: v for k, v in ir.to_dict().items() if k != "passes"
    }
    assert list(live.last_ir.passes) == ["liveness", "spill", "lowering", "engine_choice"]
    assert len(live.last_programs[0]) == len(rec.last_programs[0]) == 8


def test_liveness_decisions_come_from_the_ir(monkeypatch):
    # the pass frees a tile after `Tile.uses[-1]`: an IR whose uses are cut short frees the
    # tile early, and the second trace, naming it later, refuses the plan (literal allocation)
    from trn3emu.nki import liveness

    seen = []
    orig = liveness.Placer.__init__

    def spy(self, plan, spill, sbuf):
        seen.append([list(t.uses) for t in plan.ir.tiles])
        orig(self, plan, spill, sbuf)
        assert self.uses == seen[-1]

    monkeypatch.setattr(liveness.Placer, "__init__", spy)
    k = nki.jit(_three_temporaries, passes={"liveness": "on"})
    k(_x())
    assert seen and seen[0][:3] == [[0, 1, 2], [1, 2], [2, 3]]


def test_placed_tiles_live_to_the_end():
    @nki.jit(ir=True)
    def kern(x):
        out = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.sbuf, address=(0, 4096))  # 128 B
        q = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)  # 64 B
        nisa.dma_copy(dst=p, src=x)
        nisa.dma_copy(dst=q, src=x[:, 0:16])
        nisa.dma_copy(dst=out, src=p)
        return out

    x = np.arange(128 * 32, dtype=np.float32).reshape(128, 32)
    np.testing.assert_array_equal(kern(x), x)
    ir = kern.last_ir
    assert [t.placed for t in ir.tiles] == [True, False]
    # p from its allocation to the end (call 2), q from its allocation to its only use (call 1)
    assert ir.live_range(0) == (0, 2) and ir.live_range(1) == (0, 1)
    assert ir.live_bytes() == [192, 192, 128]


@pytest.mark.parametrize("value", ["1", "0"])
def test_environment_switch(monkeypatch, value):
    monkeypatch.setenv("TRN3EMU_NKI_IR", value)
    k = nki.jit(_three_temporaries)
    k(_x())
    assert (k.last_ir is not None) == (value == "1")


def test_blocks_of_a_block_tile_are_tiles():
    def kern(x):
        nb, p, f = x.shape
        out = lnl.ndarray((nb, p, f), dtype=x.dtype, buffer=lnl.shared_hbm)
        buf = lnl.ndarray((nb, lnl.par_dim(p), f), dtype=x.dtype, buffer=lnl.sbuf)
        for i in lnl.affine_range(nb):
            buf[i] = lnl.load(x[i])
        for j in lnl.affine_range(nb):
            lnl.store(out[j], value=lnl.multiply(buf[j], 2.0))
        return out

    x = np.arange(4 * 128 * 64, dtype=np.float32).reshape(4, 128, 64)
    k = lnki.jit(kern, ir=True)
    np.testing.assert_array_equal(k(x), 2 * x)
    ir = k.last_ir
    # 4 loads into blocks 0..3 (calls 0..3), then per j: multiply of block j (4 + 2j), store (5 + 2j)
    assert [c.op for c in ir.calls] == ["dma_copy"] * 4 + ["tensor_scalar", "dma_copy"] * 4
    assert [(ir.loops[c.nest[0][0]].var, c.nest[0][1]) for c in ir.calls] == [("i", n) for n in range(4)] + [
        ("j", n // 2) for n in range(8)
    ]
    blocks, temps = ir.tiles[:4], ir.tiles[4:]
    assert all(f"block ({n},) of" in t.label for n, t in enumerate(blocks))
    assert [t.uses for t in blocks] == [[n, 4 + 2 * n] for n in range(4)]
    assert [t.uses for t in temps] == [[4 + 2 * n, 5 + 2 * n] for n in range(4)]
    assert [t.born for t in blocks] == [0, 1, 2, 3]  # each block made at its first write
    # 256 B per partition each: blocks pile up to 4, the first product joins them, then each
    # iteration frees one block and swaps one product for the next
    assert ir.live_bytes() == [256 * n for n in (1, 2, 3, 4, 5, 4, 4, 3, 3, 2, 2, 1)]
    assert ir.peak() == (1280, 4)
