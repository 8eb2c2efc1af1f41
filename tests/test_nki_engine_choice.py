"""Engine choice for instructions a kernel leaves unpinned (docs/nki.md "Engine choice"): which
engines the balancing rule picks, results equal to numpy either way, and the switch (the pass
`engine_choice`)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import OperandError

tn.install()
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

ITERS = 8


def _pipeline(a, b, choice):
    """ITERS x: matmul into PSUM, evacuate (nl.copy), relu (ScalarE), x * 2, + relu, max with
    the copy, store. Integer-valued inputs keep every step exact in fp32."""

    @nki.jit(cache=False, passes={"engine_choice": choice})
    def k(a, b):
        out = nl.ndarray((ITERS, 128, 512), nl.float32, buffer=nl.shared_hbm)
        at = nl.load(a)
        bt = nl.load(b)
        for i in range(ITERS):
            p = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
            nisa.nc_matmul(p, stationary=at, moving=bt)
            s = nl.copy(p)
            r = nl.relu(s)
            t = nl.multiply(s, 2.0)
            u = nl.add(t, r)
            v = nl.maximum(u, s)
            nl.store(out[i], v)
        return out

    got = k(a, b)
    return got, k.last_programs[0], k.last_result


def _inputs():
    rng = np.random.default_rng(7)
    a = rng.integers(-3, 4, (128, 128)).astype(np.float32)
    b = rng.integers(-3, 4, (128, 512)).astype(np.float32)
    s = a.T @ b  # small integers: exact in fp32 whatever the summation order
    want = np.maximum(s * 2 + np.maximum(s, 0), s)
    return a, b, want


def _engines(prog, opcodes=("tensor_copy", "tensor_scalar", "tensor_tensor")) -> Counter:
    out = Counter()
    for i in range(len(prog)):
        head = prog._native.instruction_text(i).split()[0]
        op, eng = head.split(".")
        if op in opcodes:
            out[eng] += 1
    return out


def _busy(result) -> dict:
    return {u["unit"]: u["busy_ns"] for u in result.trace.stats()["units"]}


def test_balancing_spreads_unpinned_work_and_keeps_the_bits():
    a, b, want = _inputs()
    got_isa, prog_isa, res_isa = _pipeline(a, b, "off")
    got, prog, res = _pipeline(a, b, "on")
    for g in (got_isa, got):
        np.testing.assert_array_equal(g, np.broadcast_to(want, g.shape))
    # The literal program: every unpinned op on VectorE.
    assert _engines(prog_isa) == Counter({"vector": 4 * ITERS})
    # Balanced: the same instructions, spread over the three streaming engines.
    eng = _engines(prog)
    assert sum(eng.values()) == 4 * ITERS and set(eng) == {"vector", "scalar", "gpsimd"}, eng
    # The first PSUM evacuation goes to ScalarE (affinity), never to GpSimd (no PSUM port).
    copies = [
        prog._native.instruction_text(i).split()[0]
        for i in range(len(prog))
        if prog._native.instruction_text(i).startswith("tensor_copy")
    ]
    assert copies[0] == "tensor_copy.scalar" and "tensor_copy.gpsimd" not in copies, copies
    # Float tensor_tensor (the add and the max) stays on VectorE (the fused Mamba tutorial's
    # profile: "can only run on VectorE"); the copies and tensor_scalars leave it, so VectorE
    # carries 2 of the 4 unpinned ops per iteration and the kernel ends sooner.
    assert _engines(prog, ("tensor_tensor",)) == Counter({"vector": 2 * ITERS})
    bi, bb = _busy(res_isa), _busy(res)
    assert bb["vector"] < 0.75 * bi["vector"], (bi, bb)
    assert res.time_ns < res_isa.time_ns


def test_rounding_sensitive_and_integer_ops_stay_on_their_default_engine():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 256)).astype(np.float32)
    y = rng.standard_normal((128, 256)).astype(np.float32)
    ia = rng.integers(-1000, 1000, (128, 256)).astype(np.int32)
    ib = rng.integers(-1000, 1000, (128, 256)).astype(np.int32)

    @nki.jit(cache=False)
    def k(x, y, ia, ib):
        o1 = nl.ndarray((128, 256), nl.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((128, 256), nl.float32, buffer=nl.shared_hbm)
        o3 = nl.ndarray((128, 256), nl.int32, buffer=nl.shared_hbm)
        xt, yt, it, jt = nl.load(x), nl.load(y), nl.load(ia), nl.load(ib)
        two = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(two, xt, op0=nl.multiply, operand0=3.0, op1=nl.add, operand1=0.5)
        q = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(q, xt, yt, op=nl.divide)
        s = nl.ndarray((128, 256), nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(s, it, jt, op=nl.add)
        nl.store(o1, two)
        nl.store(o2, q)
        nl.store(o3, s)
        return o1, o2, o3

    o1, o2, o3 = k(x, y, ia, ib)
    prog = k.last_programs[0]
    heads = [prog._native.instruction_text(i).split()[0] for i in range(len(prog))]
    # Two operators (a ScalarE / GpSimd pipeline might fuse them) and divide: VectorE, as the
    # ISA default; all-int32 tensor_tensor: GpSimd, the ISA default (exact integer add).
    assert "tensor_scalar.vector" in heads and "tensor_tensor.vector" in heads, heads
    assert "tensor_tensor.gpsimd" in heads, heads
    np.testing.assert_array_equal(o1, (x * np.float32(3.0)) + np.float32(0.5))
    np.testing.assert_array_equal(o2, x / y)
    np.testing.assert_array_equal(o3, ia + ib)


def test_unknown_engine_choice_is_refused(monkeypatch):
    monkeypatch.setenv("TRN3EMU_NKI_PASSES", "engine_choice=fastest")

    @nki.jit(cache=False)
    def k(x):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out

    with pytest.raises(OperandError) as ei:
        k(np.ones((128, 8), np.float32))
    assert ei.value.rule == "nki_pass_setting"
