"""The pass `value_reuse` (docs/nki.md, "Passes"): an instruction repeating an earlier one exactly
(same encoding) on bytes nothing wrote in between is dropped. Each kernel here runs with the pass
on and off; results are compared with numpy and with each other, and the instruction counts with
counts worked out by hand from the kernel's source."""

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import OperandError

tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
from nki_util import opcodes  # noqa: E402

ON, OFF = {"value_reuse": "on"}, {"value_reuse": "off"}


def on_off(fn, *arrays, **options):
    """[(result, opcode counts, kernel)] with the pass on, then off."""
    out = []
    for p in (ON, OFF):
        k = nki.jit(fn, passes=p, **options)
        out.append((k(*arrays), opcodes(k), k))
    return out


def _inputs(shape=(128, 64), n=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


# ------------------------------------------------------------------- repeats that are dropped
def _repeat_mul(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    nisa.dma_copy(dst=y, src=b)
    prod = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    acc = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for _ in nl.affine_range(4):
        nisa.tensor_tensor(dst=prod, data1=x, data2=y, op=nl.multiply)  # the same every iteration
        nisa.tensor_tensor(dst=acc, data1=acc, data2=prod, op=nl.add)  # reads its own output: kept
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_a_repeated_multiply_on_unchanged_tiles_is_dropped():
    a, b = _inputs()
    (r, ops, k), (r_off, ops_off, _) = on_off(_repeat_mul, a, b)
    want = 4 * (a * b)
    np.testing.assert_allclose(r, want, rtol=1e-6)
    np.testing.assert_array_equal(r, r_off)  # the same bits
    # off: 2 loads + memset + 4 x (multiply, add) + store = 12; on: the multiply once (3 dropped)
    assert ops_off["tensor_tensor"] == 8 and sum(ops_off.values()) == 12
    assert ops["tensor_tensor"] == 5 and sum(ops.values()) == 9
    assert k.last_programs[0].value_reuse == 3


def test_the_pass_is_recorded_in_the_kernel_ir():
    a, b = _inputs()
    k = nki.jit(_repeat_mul, passes=ON, ir=True)
    np.testing.assert_allclose(k(a, b), 4 * (a * b), rtol=1e-6)
    ir = k.last_ir
    assert ir.passes["value_reuse"] == "3 repeated instructions dropped, from 1 kernel lines"
    muls = [c for c in ir.calls if c.op == "tensor_tensor"][::2]
    assert [c.notes.get("value_reuse") for c in muls] == [None] + [f"1 dropped, repeating call {muls[0].ordinal}"] * 3
    # every call's instruction index names the instruction it issued in the program it ran
    p = k.last_programs[0]
    starts = [c.instr for c in ir.calls]
    assert starts == sorted(starts) and starts[-1] < len(p)
    kept = [c for c in ir.calls if "value_reuse" not in c.notes]
    assert [p.instruction(c.instr).split(".")[0] for c in kept] == [c.op for c in kept]
    assert "value_reuse" in str(ir)


def _mamba_like(delta, u, b):
    """A state loop as in the fused Mamba tutorial (v2): delta and u loaded once per channel tile,
    `delta * u` computed in every state although it does not depend on the state."""
    n_states = b.shape[0]
    out = nl.ndarray(delta.shape, delta.dtype, buffer=nl.shared_hbm)
    d = nl.ndarray(delta.shape, nl.float32, buffer=nl.sbuf)
    x = nl.ndarray(delta.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=d, src=delta)
    nisa.dma_copy(dst=x, src=u)
    acc = nl.zeros(delta.shape, nl.float32, buffer=nl.sbuf)
    du = nl.ndarray(delta.shape, nl.float32, buffer=nl.sbuf)
    for s in nl.affine_range(n_states):
        bs = nl.ndarray((delta.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bs, src=b[s])
        nisa.tensor_tensor(dst=du, data1=d, data2=x, op=nl.multiply)  # deltaU
        term = nl.ndarray(delta.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=term, data=du, op0=nl.multiply, operand0=bs)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=term, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_a_loop_invariant_product_in_an_unrolled_state_loop_is_computed_once():
    delta, u = _inputs((128, 256))
    bvals = np.random.default_rng(1).standard_normal((16, 128, 1)).astype(np.float32)
    (r, ops, k), (r_off, ops_off, _) = on_off(_mamba_like, delta, u, bvals)
    want = sum((delta.astype(np.float64) * u) * bvals[s] for s in range(16))
    np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(r, r_off)
    # per state: load b[s], deltaU, scale, accumulate; deltaU's 15 repeats are dropped
    assert ops_off["tensor_tensor"] == 32 and ops["tensor_tensor"] == 17
    assert ops["tensor_scalar"] == ops_off["tensor_scalar"] == 16
    assert k.last_programs[0].value_reuse == 15


def _mamba_fresh_tiles(delta, u, b):
    """The same with every per-state tile allocated in the loop (as the tutorial's kernels do):
    only the products that land on the bytes of an earlier, unchanged product are repeats."""
    n_states = b.shape[0]
    out = nl.ndarray(delta.shape, delta.dtype, buffer=nl.shared_hbm)
    d = nl.ndarray(delta.shape, nl.float32, buffer=nl.sbuf)
    x = nl.ndarray(delta.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=d, src=delta)
    nisa.dma_copy(dst=x, src=u)
    acc = nl.zeros(delta.shape, nl.float32, buffer=nl.sbuf)
    for s in nl.affine_range(n_states):
        bs = nl.ndarray((delta.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bs, src=b[s])
        du = nl.ndarray(delta.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=du, data1=d, data2=x, op=nl.multiply)
        term = nl.ndarray(delta.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=term, data=du, op0=nl.multiply, operand0=bs)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=term, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_fresh_tiles_per_iteration_repeats_into_other_tiles_read_the_first_result():
    delta, u = _inputs((128, 256))
    bvals = np.random.default_rng(1).standard_normal((16, 128, 1)).astype(np.float32)
    want = sum((delta.astype(np.float64) * u) * bvals[s] for s in range(16))
    runs = {}
    for mode in ("on", "exact", "off"):
        k = nki.jit(_mamba_fresh_tiles, passes={"value_reuse": mode}, ir=True)
        r = k(delta, u, bvals)
        np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)
        runs[mode] = (r, opcodes(k), k)
    r_off, ops_off, _ = runs["off"]
    for mode in ("on", "exact"):
        r, ops, k = runs[mode]
        np.testing.assert_array_equal(r, r_off)
        n = k.last_programs[0].value_reuse
        assert ops_off["tensor_tensor"] - ops["tensor_tensor"] == n
        notes = [c for c in k.last_ir.calls if "value_reuse" in c.notes]
        assert len(notes) == n and len({c.line for c in notes}) <= 1
        assert all(c.op == "tensor_tensor" for c in notes)
    # "exact": only the products that land on an earlier product's unchanged bytes (where the
    # allocator put them); "on": every product after the first, the scales reading the first
    assert runs["on"][2].last_programs[0].value_reuse == 15
    # the scales after a product that went to another tile read the first product instead
    line = runs["on"][2].last_ir.passes["value_reuse"]
    head, _, moved = line.partition("; ")
    assert head == "15 repeated instructions dropped, from 1 kernel lines"
    assert moved.endswith(" reads moved to the earlier result") and 0 < int(moved.split()[0]) <= 15
    assert runs["exact"][2].last_programs[0].value_reuse < 15


def test_loads_into_fresh_tiles_are_kept():
    """The tutorial's v1 reloads delta and u into fresh tiles every state and is measured slower
    than v2, which loads them once: loads are not renamed (only compute instructions are)."""

    def k(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros(a.shape, nl.float32, buffer=nl.sbuf)
        held = []
        for _ in range(3):
            x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=x, src=a)  # the same HBM bytes, another tile each time
            nisa.dma_copy(dst=y, src=b)
            held += [x, y]  # (kept alive: each load has its own tile)
            p = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=p, data1=x, data2=y, op=nl.multiply)  # reads other tiles: no repeat
            nisa.tensor_tensor(dst=acc, data1=acc, data2=p, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    a, b = _inputs()
    (r, ops, _), (r_off, ops_off, _) = on_off(k, a, b)
    np.testing.assert_allclose(r, 3 * (a * b), rtol=1e-6)
    np.testing.assert_array_equal(r, r_off)
    assert ops == ops_off and (ops["dma_copy"], ops["tensor_tensor"]) == (7, 6)


def _reused_tile_overwritten(a, b):
    """A repeat into a fresh tile whose earlier result is overwritten before the repeat's result
    is read: it is kept."""
    out = nl.ndarray((2,) + a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    nisa.dma_copy(dst=y, src=b)
    p1 = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=p1, data1=x, data2=y, op=nl.multiply)
    nisa.dma_copy(dst=out[0], src=p1)
    p2 = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=p2, data1=x, data2=y, op=nl.multiply)  # p1's value, in another tile
    nisa.memset(dst=p1, value=0.0)  # the earlier result is gone before p2 is read
    q = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=q, data=p2, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out[1], src=q)
    return out


def test_a_repeat_into_another_tile_is_kept_when_the_earlier_result_is_overwritten_first():
    a, b = _inputs()
    (r, ops, k), (r_off, ops_off, _) = on_off(_reused_tile_overwritten, a, b)
    np.testing.assert_array_equal(r[0], a * b)
    np.testing.assert_array_equal(r[1], a * b + np.float32(1))
    np.testing.assert_array_equal(r, r_off)
    assert ops == ops_off and ops["tensor_tensor"] == 2


# ------------------------------------------------------------------- repeats that are kept
def _write_between(a, b, c, how):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    nisa.dma_copy(dst=y, src=b)
    prod = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    acc = nl.zeros(a.shape, nl.float32, buffer=nl.sbuf)
    for _ in nl.affine_range(3):
        nisa.tensor_tensor(dst=prod, data1=x, data2=y, op=nl.multiply)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=prod, op=nl.add)
        if how == "input":  # an input doubled in place (GpSimd): the next product differs
            nisa.tensor_scalar(dst=x, data=x, op0=nl.multiply, operand0=2.0, engine=nisa.gpsimd_engine)
        elif how == "reload":  # equal values reloaded from another HBM tensor: still a write
            nisa.dma_copy(dst=y, src=c)
        elif how == "output":  # the product's tile used as scratch by ScalarE
            nisa.activation(dst=prod[:, 0:1], op=nl.copy, data=y[:, 0:1])
    nisa.dma_copy(dst=out, src=acc)
    return out


# (kernel, result / (a * b), tensor_tensor and dma_copy with the pass on; off: 6 and 3 + reloads)
@pytest.mark.parametrize(
    "how,scale,on",
    [
        ("input", 1 + 2 + 4, (6, 3)),
        # the first reload keeps the second product; the second reload repeats the first (c and y
        # unchanged since), so nothing is written before the third product: a repeat of the second
        ("reload", 3, (5, 4)),
        ("output", 3, (6, 3)),
    ],
)
def test_a_write_in_between_by_any_engine_keeps_the_repeat(how, scale, on):
    a, b = _inputs()
    (r, ops, k), (r_off, ops_off, _) = on_off(lambda a, b, c: _write_between(a, b, c, how), a, b, b.copy())
    np.testing.assert_allclose(r, scale * (a * b), rtol=1e-6)
    np.testing.assert_array_equal(r, r_off)
    assert (ops_off["tensor_tensor"], ops_off["dma_copy"]) == (6, 6 if how == "reload" else 3)
    assert (ops["tensor_tensor"], ops["dma_copy"]) == on


def test_a_reload_of_unchanged_bytes_is_itself_a_repeat():
    def k(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        prod = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        acc = nl.zeros(a.shape, nl.float32, buffer=nl.sbuf)
        for _ in nl.affine_range(3):
            nisa.dma_copy(dst=y, src=b)  # the same load into the same tile: y already holds it
            nisa.tensor_tensor(dst=prod, data1=x, data2=y, op=nl.multiply)
            nisa.tensor_tensor(dst=acc, data1=acc, data2=prod, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    a, b = _inputs()
    (r, ops, _), (r_off, ops_off, _) = on_off(k, a, b)
    np.testing.assert_allclose(r, 3 * (a * b), rtol=1e-6)
    np.testing.assert_array_equal(r, r_off)
    assert (ops_off["dma_copy"], ops_off["tensor_tensor"]) == (5, 6)
    assert (ops["dma_copy"], ops["tensor_tensor"]) == (3, 4)


def test_an_in_place_update_repeated_is_applied_every_time():
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        for _ in range(3):
            nisa.tensor_scalar(dst=x, data=x, op0=nl.add, operand0=1.0)  # x = x + 1
        nisa.dma_copy(dst=out, src=x)
        return out

    (a,) = _inputs(n=1)
    (r, ops, _), (r_off, ops_off, _) = on_off(k, a)
    np.testing.assert_array_equal(r, ((a + np.float32(1)) + np.float32(1)) + np.float32(1))
    assert ops == ops_off and ops["tensor_scalar"] == 3


def test_random_numbers_are_drawn_every_time():
    def k(a):
        out = nl.ndarray((2,) + a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        for i in range(2):
            nisa.rand2(dst=t, min=0.0, max=1.0)  # the same encoding twice
            nisa.dma_copy(dst=out[i], src=t)
        return out

    (a,) = _inputs(n=1)
    (r, ops, _), (r_off, ops_off, _) = on_off(k, a)
    assert ops["rand2"] == ops_off["rand2"] == 2
    assert ((r >= 0) & (r <= 1)).all() and not np.array_equal(r[0], r[1])  # two draws
    np.testing.assert_array_equal(r, r_off)


def test_nothing_is_dropped_under_stochastic_rounding(monkeypatch):
    def k(a, b):
        out = nl.ndarray((2,) + a.shape, nl.bfloat16, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=b)
        p = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
        for i in range(2):
            nisa.tensor_tensor(dst=p, data1=x, data2=y, op=nl.multiply)  # fp32 -> bf16: rounds
            nisa.dma_copy(dst=out[i], src=p)
        return out

    a, b = _inputs()
    (_, ops, _), _ = on_off(k, a, b)
    assert ops["tensor_tensor"] == 1  # RNE: the second product is a repeat
    monkeypatch.setenv("NEURON_RT_STOCHASTIC_ROUNDING_EN", "1")
    (r, ops, kk), (_, ops_off, _) = on_off(k, a, b)
    assert ops["tensor_tensor"] == ops_off["tensor_tensor"] == 2 and kk.last_programs[0].value_reuse == 0
    bits = (a * b).view(np.uint32)
    down = bits & np.uint32(0xFFFF0000)  # the bf16 neighbour toward zero, and the next one out
    for i in range(2):  # each product is one of its two bf16 neighbours
        got = r[i].astype(np.float32).view(np.uint32)
        assert ((got == down) | (got == down + np.uint32(0x10000))).all()


def test_an_accumulating_matmul_is_kept_and_an_overwriting_one_dropped():
    def k(a, b, accumulate):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        s = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        nisa.dma_copy(dst=m, src=b)
        ps = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=s, moving=m, accumulate=False)
        for _ in range(2):
            nisa.nc_matmul(dst=ps, stationary=s, moving=m, accumulate=accumulate)
        r = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=ps)
        nisa.dma_copy(dst=out, src=r)
        return out

    rng = np.random.default_rng(3)
    a = rng.integers(-4, 4, (128, 128)).astype(np.float32)  # small integers: exact sums
    b = rng.integers(-4, 4, (128, 64)).astype(np.float32)
    for accumulate, n, times in [(True, 3, 3), (False, 1, 1)]:
        (r, ops, _), (r_off, ops_off, _) = on_off(lambda a, b, acc=accumulate: k(a, b, acc), a, b)
        np.testing.assert_array_equal(r, times * (a.T @ b))
        np.testing.assert_array_equal(r, r_off)
        assert ops["nc_matmul"] == n and ops_off["nc_matmul"] == 3


# ------------------------------------------------------------------- switches
def test_defaults_per_dialect_and_switches(monkeypatch):
    a, b = _inputs()
    k = nki.jit(_repeat_mul)  # NKI 0.6: the new compiler preserves the developer's choices
    k(a, b)
    assert opcodes(k)["tensor_tensor"] == 8
    monkeypatch.setenv("TRN3EMU_NKI_PASSES", "value_reuse=on")
    k(a, b)
    assert opcodes(k)["tensor_tensor"] == 5
    k2 = nki.jit(_repeat_mul, passes="literal")  # the kernel's option wins
    k2(a, b)
    assert opcodes(k2)["tensor_tensor"] == 8
    monkeypatch.delenv("TRN3EMU_NKI_PASSES")
    import neuronxcc.nki as lnki

    k3 = lnki.jit(_repeat_mul)  # legacy dialect: on
    np.testing.assert_allclose(k3(a, b), 4 * (a * b), rtol=1e-6)
    assert opcodes(k3)["tensor_tensor"] == 5


def test_a_bad_pass_value_is_refused(monkeypatch):
    (a,) = _inputs(n=1)
    with pytest.raises(OperandError, match="value_reuse='sometimes'.*value_reuse in on, exact, off, dialect") as e:
        nki.jit(_repeat_mul, passes={"value_reuse": "sometimes"})(a, a)
    assert e.value.rule == "nki_pass_setting"
    monkeypatch.setenv("TRN3EMU_NKI_PASSES", "value_reuse=maybe")
    with pytest.raises(OperandError, match="TRN3EMU_NKI_PASSES.*value_reuse='maybe'"):
        nki.jit(_repeat_mul)(a, a)


# ------------------------------------------------------------ before allocation (the kernel IR)
def _states_by_tiles(delta, u, b):
    """A state loop around a loop over column tiles, a fresh product tile per (state, tile) (the
    fused Mamba tutorial's v2 / v3 shape): the product of tile j is the same in every state, but
    by the next state the literal allocation has given most first products' bytes to later
    tiles."""
    n_states, (P, N), F = b.shape[0], delta.shape, 512
    out = nl.ndarray(delta.shape, delta.dtype, buffer=nl.shared_hbm)
    d = nl.ndarray(delta.shape, nl.float32, buffer=nl.sbuf)
    x = nl.ndarray(delta.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=d, src=delta)
    nisa.dma_copy(dst=x, src=u)
    acc = nl.zeros(delta.shape, nl.float32, buffer=nl.sbuf)
    for s in nl.affine_range(n_states):
        bs = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bs, src=b[s])
        for j in nl.static_range(N // F):
            c = slice(j * F, (j + 1) * F)
            du = nl.ndarray((P, F), nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=du, data1=d[:, c], data2=x[:, c], op=nl.multiply)
            term = nl.ndarray((P, F), nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=term, data=du, op0=nl.multiply, operand0=bs)
            nisa.tensor_tensor(dst=acc[:, c], data1=acc[:, c], data2=term, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_repeats_the_literal_allocation_loses_are_dropped_before_allocation():
    delta, u = _inputs((128, 4096))
    bvals = np.random.default_rng(2).standard_normal((4, 128, 1)).astype(np.float32)
    want = sum((delta.astype(np.float64) * u) * bvals[s] for s in range(4))
    repeats = 3 * 8  # every state after the first, 8 column tiles each
    runs = {}
    for name, p in (("literal", {"liveness": "off"}), ("auto", {}), ("off", {"value_reuse": "off"})):
        k = nki.jit(_states_by_tiles, passes={"value_reuse": "on", **p}, ir=True)
        r = k(delta, u, bvals)
        np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)
        runs[name] = (r, opcodes(k), k)
    for name in ("literal", "auto"):
        np.testing.assert_array_equal(runs[name][0], runs["off"][0])  # the same arithmetic
    # literally allocated, the pass over the finished program drops the repeats whose earlier
    # product is still in place and counts the others as missed (their inputs unchanged)
    lit = runs["literal"][2].last_programs[0]
    assert 0 < lit.reuse_missed and lit.value_reuse + lit.reuse_missed == repeats
    # by default the launch then records and lowers the kernel, finding all of them on the IR
    _, ops, k = runs["auto"]
    assert k.last_programs[0].value_reuse == repeats
    assert runs["off"][1]["tensor_tensor"] - ops["tensor_tensor"] == repeats == 3 * 8
    assert k.last_ir.passes["lowering"].startswith("walk")
    assert k.last_ir.passes["value_reuse"].startswith(
        f"{repeats} repeats into other tiles dropped before allocation, from 1 kernel lines"
    )
    notes = [c for c in k.last_ir.calls if "value_reuse" in c.notes]
    assert len(notes) == repeats and all(c.reads == c.writes == () for c in notes)
    # each repeats a product of the first state, whose tile now lives to the last state
    first = {int(c.notes["value_reuse"].split("repeating call ")[1].split()[0]) for c in notes}
    assert len(first) == 8
    for o in first:
        (t,) = k.last_ir.calls[o].writes
        assert k.last_ir.tiles[t].last_use > max(c.ordinal for c in notes if f"call {o} " in c.notes["value_reuse"])


def _wide_products(xin, dvec, b):
    """Eight products of 32 KiB per partition, each the same in every state: keeping the first
    state's alive for the others needs 256 KiB on top of the inputs (SBUF: 256 KiB)."""
    P, N = xin.shape
    out = nl.ndarray(xin.shape, xin.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(xin.shape, nl.float32, buffer=nl.sbuf)
    dd = nl.ndarray(dvec.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=xin)
    nisa.dma_copy(dst=dd, src=dvec)
    acc = nl.zeros(xin.shape, nl.float32, buffer=nl.sbuf)
    for s in nl.affine_range(b.shape[0]):
        bs = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bs, src=b[s])
        for j in nl.static_range(dvec.shape[1]):
            du = nl.ndarray(xin.shape, nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=du, data=x, op0=nl.multiply, operand0=dd[:, j : j + 1])
            term = nl.ndarray(xin.shape, nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=term, data=du, op0=nl.multiply, operand0=bs)
            nisa.tensor_tensor(dst=acc, data1=acc, data2=term, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


@pytest.mark.parametrize("dialect", ["nki", "legacy"])
def test_keeping_earlier_results_alive_never_adds_a_spill(dialect):
    rng = np.random.default_rng(3)
    x = rng.integers(-4, 5, (128, 8192)).astype(np.float32)
    dvec = rng.integers(-4, 5, (128, 8)).astype(np.float32)
    bvals = rng.integers(-4, 5, (2, 128, 1)).astype(np.float32)
    want = sum(x * dvec[:, j : j + 1] * bvals[s] for s in range(2) for j in range(8))  # exact: small ints
    if dialect == "legacy":
        import neuronxcc.nki as lnki

        k = lnki.jit(_wide_products, passes={"liveness": "on"}, ir=True)
    else:
        k = nki.jit(_wide_products, passes={"value_reuse": "on", "liveness": "on"}, ir=True)
    np.testing.assert_array_equal(k(x, dvec, bvals), want)
    # the repeats were found, but keeping the 8 first products alive does not fit (NKI 0.6:
    # no spilling) or spills (legacy): lowered without them, as literally, and nothing spilled
    line = k.last_ir.passes["value_reuse"]
    why = "did not fit" if dialect == "nki" else "spilled more"
    assert line.startswith(f"8 repeats found before allocation not dropped: keeping their earlier results alive {why}")
    assert k.last_spills["spills"] == 0
    assert opcodes(k)["tensor_scalar"] == 2 * 2 * 8


def test_a_kernel_whose_missed_repeats_the_ir_cannot_drop_stays_literal():
    """The same product into the same tile, overwritten in between: the pass over the literal
    program counts it as missed (inputs unchanged), the IR rule does not drop it (the tile has
    two writers), so the launch keeps the literal allocation, traced a third time."""
    runs = []

    def k(a, b):
        runs.append(1)
        out = nl.ndarray((2,) + a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=b)
        p = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=p, data1=x, data2=y, op=nl.multiply)
        nisa.dma_copy(dst=out[0], src=p)
        nisa.memset(dst=p, value=0.0)
        nisa.tensor_tensor(dst=p, data1=x, data2=y, op=nl.multiply)  # p's old value, needed again
        nisa.dma_copy(dst=out[1], src=p)
        return out

    a, b = _inputs()
    kern = nki.jit(k, passes=ON, ir=True)
    r = kern(a, b)
    np.testing.assert_array_equal(r, np.stack([a * b, a * b]))
    assert opcodes(kern)["tensor_tensor"] == 2 and kern.last_programs[0].reuse_missed == 1
    assert "lowering" not in kern.last_ir.passes and len(runs) == 3
