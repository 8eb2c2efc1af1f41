"""NKI scalar values: nisa.scalar_load / scalar_store / scalar_alu, NkiScalar arithmetic, scalar
offsets, fori_loop bounds and nki.typing.scalar. Expected values are computed by hand / numpy."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu import errors as E

tn.install()
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
import nki.typing  # noqa: E402

I32_MAX, I32_MIN = 2**31 - 1, -(2**31)


def _run_scalar(fn, *values, dtype=np.int32, out_dtype=None):
    """A kernel that loads each value into a scalar, stores `fn(*scalars)` and returns it."""
    out_dtype = out_dtype or dtype

    @nki.jit
    def k(v):
        t = nl.ndarray((1, len(values)), dtype=v.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=v)
        scalars = [nisa.scalar_load(t[0:1, j : j + 1]) for j in range(len(values))]
        r = fn(*scalars)
        res = nl.ndarray((1, 1), dtype=out_dtype, buffer=nl.sbuf)
        nisa.scalar_store(res, r, engine=nisa.engine.sync)
        out = nl.ndarray((1, 1), dtype=out_dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out

    out = k(np.array([list(values)], dtype=dtype))
    return int(np.asarray(out).reshape(-1)[0])


# ------------------------------------------------------------------- load / arithmetic / store


def test_round_trip_and_traced_arithmetic():
    assert _run_scalar(lambda i: i, 123) == 123
    assert _run_scalar(lambda i: i * 4 + 1, 5) == 21
    assert _run_scalar(lambda i: 100 - i, 7) == 93
    assert _run_scalar(lambda i: -i, 9) == -9
    assert _run_scalar(lambda a, b: a * b - a, 6, -7) == 6 * -7 - 6


def test_int32_wraps():
    assert _run_scalar(lambda i: i * 100000, 100000) == 1410065408
    assert _run_scalar(lambda a, b: a * b, 100000, 100000) == 1410065408
    assert _run_scalar(lambda i: i + 1, I32_MAX) == I32_MIN
    assert _run_scalar(lambda i: i - 1, I32_MIN) == I32_MAX
    assert _run_scalar(lambda i: -i, I32_MIN) == I32_MIN


def test_uint32_arithmetic_and_unsigned_compare():
    big = 0xFFFFFFF0
    assert _run_scalar(lambda i: i + 0x20, big, dtype=np.uint32) == (big + 0x20) % 2**32
    # unsigned: 0xFFFFFFF0 > 1 (signed it would be -16 < 1)
    assert _run_scalar(lambda a, b: a > b, big, 1, dtype=np.uint32, out_dtype=np.int32) == 1
    assert _run_scalar(lambda a, b: a < b, big, 1, dtype=np.uint32, out_dtype=np.int32) == 0
    assert _run_scalar(lambda a, b: a > b, -16, 1) == 0  # the same bits, signed
    assert _run_scalar(lambda a: nisa.scalar_alu(a, 16, nl.divide), big, dtype=np.uint32) == big // 16


@pytest.mark.parametrize(
    ("op", "expect"),
    [
        (lambda a, b: a < b, lambda a, b: a < b),
        (lambda a, b: a <= b, lambda a, b: a <= b),
        (lambda a, b: a > b, lambda a, b: a > b),
        (lambda a, b: a >= b, lambda a, b: a >= b),
        (lambda a, b: a == b, lambda a, b: a == b),
        (lambda a, b: a != b, lambda a, b: a != b),
    ],
)
def test_comparisons_give_int32_zero_or_one(op, expect):
    for a, b in ((3, 5), (5, 5), (-2, -9)):
        assert _run_scalar(op, a, b) == int(expect(a, b)), (a, b)
    # against a Python int, on either side
    assert _run_scalar(lambda a: op(a, 4), 4) == int(expect(4, 4))
    assert _run_scalar(lambda a: op(7, a), 4) == int(expect(7, 4))


def test_comparison_result_is_a_scalar_usable_in_arithmetic():
    # (a < b) * 10 + (a == b)
    assert _run_scalar(lambda a, b: (a < b) * 10 + (a == b), 1, 2) == 10


def test_scalar_alu_ops():
    assert _run_scalar(lambda a: nisa.scalar_alu(a, 4, op=nl.divide), -17) == -4  # toward zero
    assert _run_scalar(lambda a: nisa.scalar_alu(a, 4, op=nl.fmod), -17) == -1  # sign of data1
    assert _run_scalar(lambda a, b: nisa.scalar_alu(a, b, op=nl.fmod), 17, -4) == 1
    assert _run_scalar(lambda a, b: nisa.scalar_alu(a, b, op=nl.maximum), -3, 2) == 2
    assert _run_scalar(lambda a, b: nisa.scalar_alu(a, b, op=nl.minimum), -3, 2) == -3
    assert _run_scalar(lambda a: nisa.scalar_alu(100, a, op=nl.subtract), 1) == 99
    assert _run_scalar(lambda a: nisa.scalar_alu(a, 3, op=nl.add), 1) == 4


def test_scalar_alu_folds_python_ints():
    assert nisa.scalar_alu(-17, 4, nl.divide) == -4
    assert nisa.scalar_alu(-17, 4, nl.fmod) == -1
    assert nisa.scalar_alu(3, 5, nl.less) is True


def test_engine_bound_scalar():
    def fn(a):
        return a  # loaded below with engine=

    @nki.jit
    def k(v):
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=v)
        s = nisa.scalar_load(t, engine=nisa.engine.gpsimd) * 3
        assert s.engine == "gpsimd"
        res = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.scalar_store(res, s, engine=nisa.engine.gpsimd)
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out

    assert int(np.asarray(k(np.array([[14]], np.int32)))[0, 0]) == 42


def test_many_temporaries_reuse_registers():
    # 300 traced operations: more than the 64 register numbers, which dead scalars give back
    def fn(a):
        for _ in range(300):
            a = a + 1
        return a

    assert _run_scalar(fn, 5) == 305


def test_hbm_internal_tile_as_source():
    @nki.jit
    def k(v):
        h = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=h, src=v)
        s = nisa.scalar_load(h) + 2
        h2 = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.scalar_store(h2, s, engine=nisa.engine.sync)
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=h2)
        return out

    assert int(np.asarray(k(np.array([[40]], np.int32)))[0, 0]) == 42


# -------------------------------------------------------------------- dynamic addressing


def test_scalar_offset_gathers_the_row_a_device_value_names():
    data = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)

    @nki.jit
    def k(table, idx):
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=idx)
        row = nisa.scalar_load(t) * 2 + 1  # row 2 * idx + 1
        buf = nl.ndarray((1, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=buf, src=table.ap([[16, 1], [1, 16]], scalar_offset=row))  # (rows of dim 0)
        out = nl.ndarray((1, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=buf)
        return out

    for i in (0, 1, 3):
        np.testing.assert_array_equal(np.asarray(k(data, np.array([[i]], np.int32))), data[2 * i + 1 : 2 * i + 2])


# -------------------------------------------------------------------------- loop bounds


def test_fori_loop_bounded_by_a_loaded_scalar():
    @nki.jit
    def k(n):
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=n)
        count = nisa.scalar_load(t)
        acc = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        seen = nl.ndarray((1, 8), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=seen, value=-1)

        def body(i):
            assert isinstance(i, nisa.NkiScalar)
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=1.0)
            sq = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
            nisa.scalar_store(sq, i * i, engine=nisa.engine.sync)
            nisa.dma_copy(dst=seen.ap([[8, 1], [1, 1]], scalar_offset=i, indirect_dim=1), src=sq)

        nl.fori_loop(0, count + 1, body)  # an arithmetic expression as the bound
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=acc)
        out2 = nl.ndarray((1, 8), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out2, src=seen)
        return out, out2

    for n in (0, 3, 6):
        trips, seen = k(np.array([[n]], np.int32))
        assert float(np.asarray(trips)[0, 0]) == n + 1
        want = np.full((1, 8), -1, np.int32)
        want[0, : n + 1] = np.arange(n + 1) ** 2
        np.testing.assert_array_equal(np.asarray(seen), want)


def test_typing_scalar_trip_count():
    @nki.jit
    def k(n):
        t = nl.load(n)  # (as the public flash_paged_attn_varlen kernel does)
        acc = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for _ in range(nki.typing.scalar(t)):
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=2.0)
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=acc)
        return out

    for n in (0, 5):
        assert float(np.asarray(k(np.array([[n]], np.int32)))[0, 0]) == 2.0 * n


# ------------------------------------------------------------------------------- errors


def _trace(body):
    @nki.jit
    def k(v):
        body(v)
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=v)
        return out

    return k(np.array([[1]], np.int32))


def _sbuf(v, dtype=nl.int32, shape=(1, 1)):
    t = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
    if dtype == nl.int32 and shape == (1, 1):
        nisa.dma_copy(dst=t, src=v)
    else:
        nisa.memset(dst=t, value=0)
    return t


def test_psum_source_is_refused():
    def body(v):
        p = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.psum)
        nisa.scalar_load(p)

    with pytest.raises(E.MemorySpaceError) as e:
        _trace(body)
    assert e.value.rule == "nki_scalar_psum" and e.value.operand == "src" and "scalar_load" in str(e.value)


def test_kernel_argument_is_refused():
    with pytest.raises(E.MemorySpaceError) as e:
        _trace(lambda v: nisa.scalar_load(v))
    assert e.value.rule == "nki_scalar_kernel_argument" and e.value.operand == "src"

    def store(v):
        nisa.scalar_store(v[0:1, 0:1], nisa.scalar_load(_sbuf(v)), engine=nisa.engine.sync)

    with pytest.raises(E.MemorySpaceError) as e:
        _trace(store)
    assert e.value.rule == "nki_scalar_kernel_argument" and e.value.operand == "dst"


def test_non_1x1_tile_is_refused():
    with pytest.raises(E.ShapeError) as e:
        _trace(lambda v: nisa.scalar_load(_sbuf(v, shape=(1, 2))))
    assert e.value.rule == "nki_scalar_one_element"


def test_float_dtype_is_refused():
    with pytest.raises(E.DtypeError) as e:
        _trace(lambda v: nisa.scalar_load(_sbuf(v, dtype=nl.float32)))
    assert e.value.rule == "nki_scalar_dtype"


def test_store_dtype_must_match():
    def body(v):
        s = nisa.scalar_load(_sbuf(v))
        nisa.scalar_store(_sbuf(v, dtype=nl.uint32), s, engine=nisa.engine.sync)

    with pytest.raises(E.DtypeError) as e:
        _trace(body)
    assert e.value.rule == "nki_scalar_store_dtype" and e.value.operand == "dst"


def test_store_of_python_int_is_refused():
    with pytest.raises(E.ArgumentTypeError) as e:
        _trace(lambda v: nisa.scalar_store(_sbuf(v), 5, engine=nisa.engine.sync))
    assert e.value.rule == "nki_scalar_store_value" and e.value.operand == "value"


def test_mixed_dtypes_are_refused():
    def body(v):
        a = nisa.scalar_load(_sbuf(v))
        u = nl.ndarray((1, 1), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.memset(dst=u, value=0)
        return a + nisa.scalar_load(u)

    with pytest.raises(E.DtypeError) as e:
        _trace(body)
    assert e.value.rule == "nki_scalar_dtype_mismatch"


def test_immediate_out_of_range_is_refused():
    with pytest.raises(E.OperandError) as e:
        _trace(lambda v: nisa.scalar_load(_sbuf(v)) + 2**31)
    assert e.value.rule == "nki_scalar_immediate_range"


def test_int64_is_refused():
    with pytest.raises(E.NotSupportedError) as e:
        nl.int64  # noqa: B018
    assert e.value.rule == "nki_scalar_int64"


def test_bound_scalar_used_on_another_engine_is_refused():
    def unbound_store(v):
        s = nisa.scalar_load(_sbuf(v), engine=nisa.engine.gpsimd)
        nisa.scalar_store(_sbuf(v), s)

    with pytest.raises(E.OperandError) as e:
        _trace(unbound_store)
    assert e.value.rule == "nki_scalar_engine"

    def other_engine(v):
        s = nisa.scalar_load(_sbuf(v), engine=nisa.engine.gpsimd)
        nisa.scalar_store(_sbuf(v), s, engine=nisa.engine.sync)

    with pytest.raises(E.OperandError) as e:
        _trace(other_engine)
    assert e.value.rule == "nki_scalar_engine"


def test_python_control_flow_on_a_scalar_is_refused():
    def body(v):
        s = nisa.scalar_load(_sbuf(v))
        if s < 3:
            pass

    with pytest.raises(E.NotSupportedError) as e:
        _trace(body)
    assert e.value.rule == "nki_register_value"


def test_floor_division_operator_is_refused():
    with pytest.raises(E.NotSupportedError) as e:
        _trace(lambda v: nisa.scalar_load(_sbuf(v)) // 2)
    assert e.value.rule == "nki_scalar_operator"


def test_isa_form_still_works():
    @nki.jit
    def k(v):
        t = _sbuf(v)
        r = nisa.register_alloc()
        nisa.scalar_load(dst=r, src=t)
        res = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.scalar_store(dst=res, value=r)
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out

    assert int(np.asarray(k(np.array([[77]], np.int32)))[0, 0]) == 77


# ------------------------------------------------------------------- random expressions


def _wrap(x: int, unsigned: bool) -> int:
    """Python's exact integer result reduced to the 32-bit register (the independent reference)."""
    x &= 0xFFFFFFFF
    return x if unsigned or x < 2**31 else x - 2**32


_ARITH = {
    "add": lambda a, b, u: _wrap(a + b, u),
    "subtract": lambda a, b, u: _wrap(a - b, u),
    "multiply": lambda a, b, u: _wrap(a * b, u),
    "maximum": lambda a, b, u: max(a, b),
    "minimum": lambda a, b, u: min(a, b),
}
_COMPARE = {
    "less": lambda a, b: int(a < b),
    "greater_equal": lambda a, b: int(a >= b),
    "equal": lambda a, b: int(a == b),
    "not_equal": lambda a, b: int(a != b),
}


@pytest.mark.parametrize("unsigned", [False, True])
def test_random_expression_chains_match_python_integers(unsigned):
    """Chains of scalar_alu ops on random 32-bit values (wrap-around, extremes, unsigned order),
    ending in a comparison every other trial; each result is checked against Python's exact
    integers reduced to 32 bits (signed comparisons also feed back into int32 arithmetic)."""
    rng = np.random.default_rng(20261207 + unsigned)
    dt, lo, hi = (np.uint32, 0, 2**32) if unsigned else (np.int32, -(2**31), 2**31)
    special = [0, 1, hi - 1, lo + 1, 65535, 65536, lo]
    for trial in range(8):
        vals = [int(v) for v in rng.integers(lo, hi, size=3, dtype=np.int64)]
        vals[trial % 3] = special[trial % len(special)]
        ops = [str(o) for o in rng.choice(sorted(_ARITH), size=5)]
        last = str(rng.choice(sorted(_COMPARE))) if trial % 2 else None
        # signed: a comparison in the middle too, its 0 / 1 used as an int32 operand
        mid = str(rng.choice(sorted(_COMPARE))) if not unsigned else None

        def chain(a, b, c, ops=ops, last=last, mid=mid):
            x = a
            for k, op in enumerate(ops):
                x = nisa.scalar_alu(x, (b, c)[k % 2], op)
                if k == 2 and mid is not None:
                    x = nisa.scalar_alu(nisa.scalar_alu(x, c, mid), x, "add")
            return nisa.scalar_alu(x, b, last) if last is not None else x

        want = vals[0]
        for k, op in enumerate(ops):
            want = _ARITH[op](want, vals[1 + k % 2], unsigned)
            if k == 2 and mid is not None:
                want = _wrap(_COMPARE[mid](want, vals[2]) + want, unsigned)
        if last is not None:
            want = _COMPARE[last](want, vals[1])
        got = _run_scalar(chain, *vals, dtype=dt, out_dtype=np.int32 if last is not None else dt)
        assert got == want, (vals, ops, mid, last, got, want)
