"""The pass `dead_code` (docs/nki.md, "Passes"; `CompileConfig(dead_code_elim=True)`,
`remove_unused_instructions`, `remove_overwritten_writes`): an instruction whose SBUF / PSUM
result no later instruction reads is removed. Each kernel runs with the pass on and off; results
are compared with numpy, and the instruction counts with counts worked out by hand from the
kernel's source."""

from collections import Counter

import numpy as np
import trn3emu.nki as tn

tn.install()

import nki  # noqa: E402
import nki.compiler as ncc  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
from nki_util import normal_input, opcodes, run_counted  # noqa: E402

ON, OFF = {"dead_code": "on"}, {"dead_code": "off"}


def run(fn, *arrays, **options):
    """(result, opcode counts, kernel)."""
    return run_counted(nki.jit, fn, *arrays, **options)


_input = normal_input


def _overwritten_memset(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=y, value=0.0)  # dead: overwritten whole before any read
    nisa.tensor_scalar(dst=y, data=x, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out, src=y)  # (reads the product: it stays)
    return out


def _unstored_chain(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    z = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=z, op=nl.exp, data=x)  # read only by the add below
    w = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=w, data1=z, data2=x, op=nl.add)  # never read
    y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=x, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out, src=y)
    return out


def test_a_memset_overwritten_whole_before_any_read_is_removed():
    a = _input()
    (r, ops, k), (r_off, ops_off, _) = (run(_overwritten_memset, a, passes=p) for p in (ON, OFF))
    want = a * np.float32(2)
    np.testing.assert_array_equal(r, want)
    np.testing.assert_array_equal(r_off, want)
    assert ops == Counter({"dma_copy": 2, "tensor_scalar": 1})
    assert ops_off == ops + Counter({"memset": 1})
    assert (k.last_programs[0].dead_code, sum(ops_off.values()) - sum(ops.values())) == (1, 1)
    # "unused" keeps it (overwritten, not left unread); "overwritten" removes it
    assert run(_overwritten_memset, a, passes={"dead_code": "unused"})[1] == ops_off
    assert run(_overwritten_memset, a, passes={"dead_code": "overwritten"})[1] == ops


def _memset_then_scan(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=y, value=0.0)  # dead: the scan assigns every element of y
    nisa.tensor_tensor_scan(dst=y, data0=x, data1=x, initial=0.0, op0=nl.multiply, op1=nl.add)
    nisa.dma_copy(dst=out, src=y)
    return out


def test_a_scan_overwrites_its_destination_whole():
    """Scans, selects with a fill value, reductions into dst and statistics assign every element
    of dst: an earlier result there is dead (not only after the element-wise ops)."""
    a = _input(seed=3)
    (r, ops, _), (r_off, ops_off, _) = (run(_memset_then_scan, a, passes=p) for p in (ON, OFF))
    want = np.zeros_like(a)
    acc = np.zeros(a.shape[0], np.float32)
    for j in range(a.shape[1]):  # r[j] = x[j] * r[j-1] + x[j], fp32, from r[-1] = 0
        acc = a[:, j] * acc + a[:, j]
        want[:, j] = acc
    np.testing.assert_allclose(r, want, rtol=1e-6)
    np.testing.assert_array_equal(r, r_off)
    assert ops_off - ops == Counter({"memset": 1})


def test_a_chain_whose_result_is_never_stored_goes_whole():
    """The add is never read; once it is gone, nothing reads the exp either (the fixed point)."""
    a = _input(seed=1)
    (r, ops, k), (r_off, ops_off, _) = (run(_unstored_chain, a, passes=p) for p in (ON, OFF))
    want = a + np.float32(1)
    np.testing.assert_array_equal(r, want)
    np.testing.assert_array_equal(r_off, want)
    assert ops_off - ops == Counter({"activation": 1, "tensor_tensor": 1})
    assert k.last_programs[0].dead_code == 2
    assert run(_unstored_chain, a, passes={"dead_code": "unused"})[1] == ops
    assert run(_unstored_chain, a, passes={"dead_code": "overwritten"})[1] == ops_off


def test_a_partly_overwritten_write_stays():
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=y, value=1.0)  # its right half is read by the store
        nisa.tensor_scalar(dst=y[:, 0:32], data=x[:, 0:32], op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(dst=out, src=y)
        return out

    a = _input(seed=2)
    (r, ops, kk), (_, ops_off, _) = (run(k, a, passes=p) for p in (ON, OFF))
    want = np.concatenate([a[:, :32] * np.float32(3), np.ones((128, 32), np.float32)], axis=1)
    np.testing.assert_array_equal(r, want)
    assert ops == ops_off == Counter({"dma_copy": 2, "memset": 1, "tensor_scalar": 1})
    assert kk.last_programs[0].dead_code == 0


def test_a_psum_accumulation_group_stays():
    """The first matmul's partial is read by the accumulating one (a matmul that adds onto
    PSUM is a read of it); an overwriting matmul in its place makes the first one dead."""

    def k(a, b, accumulate):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        s = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        nisa.dma_copy(dst=m, src=b)
        ps = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=s, moving=m, accumulate=False)
        nisa.nc_matmul(dst=ps, stationary=s, moving=m, accumulate=accumulate)
        r = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=ps)
        nisa.dma_copy(dst=out, src=r)
        return out

    rng = np.random.default_rng(3)
    a = rng.integers(-4, 4, (128, 128)).astype(np.float32)  # small integers: exact sums
    b = rng.integers(-4, 4, (128, 64)).astype(np.float32)
    for accumulate, matmuls, times in [(True, 2, 2), (False, 1, 1)]:
        r, ops, kk = run(lambda a, b, acc=accumulate: k(a, b, acc), a, b, passes=ON)
        np.testing.assert_array_equal(r, times * (a.T @ b))
        assert ops["nc_matmul"] == matmuls and kk.last_programs[0].dead_code == 2 - matmuls

    def overwritten_group(a, b):
        """A group whose sum an overwriting matmul replaces: the accumulating matmul still
        reads the partial (never a candidate itself), so the group stays whole."""
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        s = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        nisa.dma_copy(dst=m, src=b)
        ps = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=s, moving=m, accumulate=False)
        nisa.nc_matmul(dst=ps, stationary=s, moving=m, accumulate=True)
        nisa.nc_matmul(dst=ps, stationary=s, moving=s[:, 0:64], accumulate=False)
        r = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=ps)
        nisa.dma_copy(dst=out, src=r)
        return out

    r, ops, kk = run(overwritten_group, a, b, passes=ON)
    np.testing.assert_array_equal(r, a.T @ a[:, :64])
    assert ops["nc_matmul"] == 3 and kk.last_programs[0].dead_code == 0


def test_a_result_read_by_a_store_to_hbm_stays_and_stores_never_go():
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        spare = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=x, data2=x, op=nl.multiply)
        nisa.dma_copy(dst=spare, src=y)  # an HBM tensor nothing returns: still written
        nisa.dma_copy(dst=out, src=x)
        return out

    a = _input(seed=4)
    r, ops, kk = run(k, a, passes=ON)
    np.testing.assert_array_equal(r, a)
    assert ops == Counter({"dma_copy": 3, "tensor_tensor": 1}) and kk.last_programs[0].dead_code == 0


def _random_then_dead(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    t = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.rand2(dst=t, min=0.0, max=1.0)  # never read: it still draws (the RNG state moves)
    u = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=u, value=5.0)  # never read: dead
    y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=x, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out, src=y)
    return out


def test_random_numbers_stay_and_stochastic_rounding_removes_nothing(monkeypatch):
    a = _input(seed=5)
    want = a + np.float32(1)
    r, ops, k = run(_random_then_dead, a, passes=ON)
    np.testing.assert_array_equal(r, want)
    assert ops["rand2"] == 1 and ops["memset"] == 0 and k.last_programs[0].dead_code == 1
    # each stochastic rounding draws from its instruction's index: nothing is removed
    monkeypatch.setenv("NEURON_RT_STOCHASTIC_ROUNDING_EN", "1")
    r, ops, k = run(_random_then_dead, a, passes=ON)
    np.testing.assert_array_equal(r, want)  # (fp32 throughout: no rounding)
    assert ops["memset"] == 1 and k.last_programs[0].dead_code == 0


def test_off_by_default_and_set_by_compile_config():
    a = _input(seed=6)
    want = a + np.float32(1)

    def counts(**options):
        r, ops, k = run(_unstored_chain, a, **options)
        np.testing.assert_array_equal(r, want)
        return sum(ops.values()), k.last_programs[0].dead_code

    # today's program: 2 DMAs, the exp, the add, the increment
    assert counts() == counts(passes=OFF) == counts(passes="literal") == (5, 0)
    assert counts(compile_config=ncc.CompileConfig(dead_code_elim=True)) == (3, 2)
    assert counts(compile_config=ncc.CompileConfig(remove_unused_instructions=True)) == (3, 2)
    assert counts(compile_config=ncc.CompileConfig(remove_overwritten_writes=True)) == (5, 0)
    assert counts(compile_config=ncc.CompileConfig(dead_code_elim=True, remove_unused_instructions=False)) == (5, 0)
    # passes= wins over the config
    assert counts(compile_config=ncc.CompileConfig(dead_code_elim=True), passes=OFF) == (5, 0)
    b = _input(seed=7)
    r, ops, k = run(_overwritten_memset, b, compile_config=ncc.CompileConfig(remove_overwritten_writes=True))
    np.testing.assert_array_equal(r, b * np.float32(2))
    assert ops["memset"] == 0 and k.last_programs[0].dead_code == 1


def test_the_kernel_ir_says_what_was_removed():
    a = _input(seed=8)
    k = nki.jit(_unstored_chain, passes=ON, ir=True)
    np.testing.assert_array_equal(k(a), a + np.float32(1))
    ir = k.last_ir
    assert ir.passes["dead_code"] == "2 dead instructions removed, from 2 kernel lines"
    notes = [c.notes.get("dead_code") for c in ir.calls]
    assert notes == [None, "1 removed (1 unused)", "1 removed (1 unused)", None, None]
    # the calls' program indices follow the program without them
    assert [c.instr for c in ir.calls] == [0, 1, 1, 1, 2]


def test_a_write_partly_overwritten_and_partly_unread_goes_only_with_both_kinds():
    def k(a):
        out = nl.ndarray((128, 32), a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=y, value=1.0)  # left half overwritten below, right half never read
        nisa.tensor_scalar(dst=y[:, 0:32], data=x[:, 0:32], op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(dst=out, src=y[:, 0:32])
        return out

    a = _input(seed=9)
    want = a[:, :32] * np.float32(3)
    for mode, memsets in [("on", 0), ("unused", 1), ("overwritten", 1), ("off", 1)]:
        kk = nki.jit(k, passes={"dead_code": mode}, ir=True)
        np.testing.assert_array_equal(kk(a), want)
        assert opcodes(kk)["memset"] == memsets, mode
    assert kk.last_ir.calls[1].notes.get("dead_code") is None  # (off)
    on = nki.jit(k, passes=ON, ir=True)
    on(a)
    assert on.last_ir.calls[1].notes["dead_code"] == "1 removed (1 both)"
