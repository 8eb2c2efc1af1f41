"""API gaps the Neuron SDK's own NKI tests ran into (issue 28), each with a kernel of our own and an
independent numpy reference (exact: integer data and copies)."""

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import NotSupportedError

tn.install()
import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.isa as lisa  # noqa: E402
import neuronxcc.nki.language as lnl  # noqa: E402

RNG = np.random.default_rng(2828)


# ------------------------------------------------------------------- dma_copy(dst_rmw_op=np.add)
def test_legacy_dma_copy_dst_rmw_op_add_scatter():
    """Rows 3*i of a [96, 40] HBM tensor get += row i of a tile (an index-tile dst), the rest keep."""
    base = RNG.integers(-1000, 1000, (96, 40)).astype(np.int32)
    upd = RNG.integers(-1000, 1000, (32, 40)).astype(np.int32)

    @lnki.jit
    def k(base, upd):
        out = lnl.ndarray((96, 40), lnl.int32, buffer=lnl.shared_hbm)
        lnl.store(out[0:96, :], value=lnl.load(base[0:96, :]))
        ix, iy = lnl.mgrid[0:32, 0:40]
        idx = lisa.iota(3 * lnl.arange(32)[:, None], dtype=np.int32)
        lisa.dma_copy(dst=out[idx, iy], src=lnl.load(upd), dst_rmw_op=np.add)
        return out

    want = base.copy()
    want[0::3][:32] += upd
    np.testing.assert_array_equal(k(base, upd), want)


def test_legacy_dma_copy_dst_rmw_op_add_plain_and_other_ops_refused():
    a = RNG.integers(-1000, 1000, (64, 16)).astype(np.int32)
    b = RNG.integers(-1000, 1000, (64, 16)).astype(np.int32)

    @lnki.jit
    def k(a, b):
        out = lnl.ndarray((64, 16), lnl.int32, buffer=lnl.shared_hbm)
        lnl.store(out, value=lnl.load(a))
        lisa.dma_copy(dst=out, src=lnl.load(b), dst_rmw_op=np.add)
        return out

    np.testing.assert_array_equal(k(a, b), a + b)

    @lnki.jit
    def bad(a, b):
        out = lnl.ndarray((64, 16), lnl.int32, buffer=lnl.shared_hbm)
        lisa.dma_copy(dst=out, src=lnl.load(b), dst_rmw_op=np.multiply)
        return out

    with pytest.raises(NotSupportedError, match="dst_rmw_op=multiply"):
        bad(a, b)


# ------------------------------------------------------------------------ mask with Python `and`
def test_legacy_mask_written_with_python_and_is_the_conjunction():
    """`mask=(i_p < 40 and i_f < 24)`: only the [40, 24] corner is written (not the `i_f < 24`
    band alone, which is what Python's `and` returns); the rest keeps the memset value."""
    x = RNG.integers(-100, 100, (128, 64)).astype(np.float32)

    @lnki.jit
    def k(x):
        out = lnl.ndarray((128, 64), lnl.float32, buffer=lnl.shared_hbm)
        t = lnl.load(x)
        r = lisa.memset(shape=(128, 64), value=-7.0, dtype=lnl.float32)
        i_p, i_f = lnl.mgrid[0:128, 0:64]
        r[i_p, i_f] = lnl.add(t[i_p, i_f], 1.0, mask=(i_p < 40 and i_f < 24))
        lnl.store(out, value=r)
        return out

    want = np.full((128, 64), -7.0, np.float32)
    want[:40, :24] = x[:40, :24] + 1
    np.testing.assert_array_equal(k(x), want)


def test_legacy_mask_three_way_and_and_other_truth_tests_refused():
    x = RNG.integers(-100, 100, (128, 64)).astype(np.float32)

    @lnki.jit
    def k(x):
        out = lnl.ndarray((128, 64), lnl.float32, buffer=lnl.shared_hbm)
        t = lnl.load(x)
        r = lisa.memset(shape=(128, 64), value=0.0, dtype=lnl.float32)
        i_p, i_f = lnl.mgrid[0:128, 0:64]
        r[i_p, i_f] = lnl.copy(t[i_p, i_f], mask=(i_p >= 64 and i_f < 48 and i_p < 96))
        lnl.store(out, value=r)
        return out

    want = np.zeros((128, 64), np.float32)
    want[64:96, :48] = x[64:96, :48]
    np.testing.assert_array_equal(k(x), want)

    @lnki.jit
    def with_or(x):
        out = lnl.ndarray((128, 64), lnl.float32, buffer=lnl.shared_hbm)
        i_p, i_f = lnl.mgrid[0:128, 0:64]
        lnl.store(out, value=lnl.copy(lnl.load(x), mask=(i_p < 8 or i_f < 8)))
        return out

    with pytest.raises(NotSupportedError, match="truth value of a mask"):
        with_or(x)


# --------------------------------------------------------------------- sequence_bounds (legacy)
def _sequence_bounds(ids: np.ndarray) -> np.ndarray:
    """(2, n): each position's segment start and end (exclusive); id 0 is padding (n, -1)."""
    n = len(ids)
    lo, hi = np.full(n, n), np.full(n, -1)
    for i, s in enumerate(ids):
        if s != 0:
            same = np.flatnonzero(ids == s)
            lo[i], hi[i] = same[0], same[-1] + 1
    return np.stack([lo, hi]).astype(ids.dtype)


def test_legacy_sequence_bounds_returns_1_2_n():
    ids = np.array([[0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 5, 5, 0, 0, 7, 7]], np.float32)

    @lnki.jit
    def k(ids):
        out = lnl.ndarray((1, 2, 16), lnl.float32, buffer=lnl.shared_hbm)
        b = lisa.sequence_bounds(segment_ids=lnl.load(ids))
        assert tuple(b.shape) == (1, 2, 16)
        lnl.store(out, value=b)
        return out

    np.testing.assert_array_equal(k(ids)[0], _sequence_bounds(ids[0]))


# ---------------------------------------------------------- t[i, j] = v at any partition (legacy)
def test_scalar_assignment_at_any_partition():
    """`t[i, j] = v` element by element at partitions 0..5: partitions other than 0 cannot start a
    one-partition memset (start-partition rule), so those go by DMA; exact integers."""

    @lnki.jit
    def k():
        out = lnl.ndarray((6, 4), lnl.uint32, buffer=lnl.shared_hbm)
        t = lnl.zeros((6, 4), dtype=lnl.uint32)
        for i in lnl.static_range(6):
            for j in lnl.static_range(4):
                t[i, j] = 10 * i + j + 4000000000 * (i == 5)
        lnl.store(out, value=t)
        return out

    want = (10 * np.arange(6)[:, None] + np.arange(4)).astype(np.uint32)
    want[5] += np.uint32(4000000000)
    np.testing.assert_array_equal(k(), want)


# ------------------------------------------------------------------ NKI 0.6 NkiTensor view APIs
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


def test_reshape_dim_infers_minus_one_and_rearrange_tuple_form():
    """HBM views copied out by DMA, against numpy's reshape / transpose of the same data."""
    x = RNG.integers(-1000, 1000, (8, 24)).astype(np.int32)

    @nki.jit
    def k(x):
        a = nl.ndarray((8, 4, 6), nl.int32, buffer=nl.shared_hbm)
        b = nl.ndarray((8, 6, 4), nl.int32, buffer=nl.shared_hbm)
        v = x.reshape_dim(1, (4, -1))
        assert tuple(v.shape) == (8, 4, 6)
        nisa.dma_copy(dst=a, src=v)
        w = x.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4})
        assert tuple(w.shape) == (8, 6, 4)
        nisa.dma_copy(dst=b, src=w)
        return a, b

    a, b = k(x)
    np.testing.assert_array_equal(a, x.reshape(8, 4, 6))
    np.testing.assert_array_equal(b, x.reshape(8, 4, 6).transpose(0, 2, 1))


def test_is_indirect_after_dynamic_select_vector_select_and_scalar_offset():
    x = RNG.integers(-1000, 1000, (8, 16)).astype(np.int32)
    idx = np.array([[5], [1], [7], [2]], np.int32)
    seen = {}

    @nki.jit
    def k(x, idx):
        out = nl.ndarray((4, 16), nl.int32, buffer=nl.shared_hbm)
        one = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=one, src=idx[0:1, 0:1])
        rows = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=idx)
        seen["select"] = x.select(0, one).is_indirect()
        seen["select_static"] = x.select(0, 3).is_indirect()
        seen["ap_scalar_offset"] = x.ap([[16, 1], [1, 16]], 0, scalar_offset=one, indirect_dim=0).is_indirect()
        v = x.vector_select(0, rows)
        seen["vector_select"] = v.is_indirect()
        seen["slice"] = x[0:4, :].is_indirect()
        nisa.dma_copy(dst=out, src=v)
        return out

    np.testing.assert_array_equal(k(x, idx), x[idx[:, 0]])
    assert seen == {
        "select": True,
        "select_static": False,
        "ap_scalar_offset": True,
        "vector_select": True,
        "slice": False,
    }


def test_dynamic_range_is_deprecated_fori_loop_is_not():
    x = RNG.integers(-1000, 1000, (4, 8)).astype(np.int32)

    @nki.jit(cache=False)
    def k(x, use_dynamic):
        out = nl.ndarray((4, 8), nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 8), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        if use_dynamic:
            for _ in nl.dynamic_range(2):
                nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1)
        else:
            nl.fori_loop(0, 2, lambda i: nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1))
        nisa.dma_copy(dst=out, src=t)
        return out

    with pytest.warns(DeprecationWarning, match="dynamic_range is deprecated since NKI 0.6.0.*fori_loop") as w:
        np.testing.assert_array_equal(k(x, True), x + 2)
    # attributed to the kernel's `for ... in nl.dynamic_range(2)` line, not the package
    (dep,) = [m for m in w if issubclass(m.category, DeprecationWarning)]
    assert (dep.filename, dep.lineno) == (__file__, k.__wrapped__.__code__.co_firstlineno + 6)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        np.testing.assert_array_equal(k(x, False), x + 2)


# ----------------------------------------------------- free-dim broadcasting in nl element-wise ops
_INT_OPS = [
    "add", "subtract", "multiply", "maximum", "minimum", "power", "equal", "not_equal", "greater",
    "greater_equal", "less", "less_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and",
    "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "mod", "fmod",
]  # fmt: skip
_FLOAT_OPS = ["add", "subtract", "multiply", "maximum", "minimum", "equal", "greater", "less_equal", "divide"]


def _bcast_kernel(op, swap):
    @nki.jit
    def k(a, b):
        out = nl.ndarray((128, 16), a.dtype, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        nl.store(out, getattr(nl, op)(y, x) if swap else getattr(nl, op)(x, y))
        return out

    return k


def _bcast_case(op, dt, swap):
    a = (np.arange(128 * 16).reshape(128, 16) % 11 + 1).astype(dt)  # [128, 16]
    b = (np.arange(128).reshape(128, 1) % 5 + 1).astype(dt)  # [128, 1]
    if op == "power":
        a, b = a % 4, b % 3
    f = {"mod": np.mod, "fmod": np.fmod}.get(op) or getattr(np, op)
    with np.errstate(all="ignore"):
        exact = f(b.astype(np.int64), a) if swap else f(a.astype(np.int64), b)  # (no wrap-around)
        want = (f(b, a) if swap else f(a, b)).astype(np.float64 if op == "divide" else dt)
    if np.dtype(dt).kind in "iu" and op not in ("left_shift", "right_shift"):
        # the ALU computes in fp32 and casts back saturating (docs/numerics.md: fp32 -> integer)
        want = np.clip(exact, np.iinfo(dt).min, np.iinfo(dt).max).astype(dt)
    return a, b, want


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("dt", [np.int32, np.uint8, np.int16])
@pytest.mark.parametrize("op", _INT_OPS)
def test_free_dim_broadcast_integer_ops_exact(op, dt, swap):
    """[128, 16] op [128, 1] and [128, 1] op [128, 16], against numpy's broadcasting."""
    a, b, want = _bcast_case(op, dt, swap)
    np.testing.assert_array_equal(_bcast_kernel(op, swap)(a, b), want)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("dt", [np.float32, np.float16, "bfloat16"])
@pytest.mark.parametrize("op", _FLOAT_OPS)
def test_free_dim_broadcast_float_ops(op, dt, swap):
    import ml_dtypes

    dt = ml_dtypes.bfloat16 if dt == "bfloat16" else dt
    a, b, want = _bcast_case(op, dt, swap)
    got = _bcast_kernel(op, swap)(a, b)
    if op == "divide":  # fp32 division, one rounding to dt: within one unit in the last place
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2 ** -(np.finfo(dt).nmant))
    else:  # small integers: exact in every float dtype
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


@pytest.mark.parametrize("swap", [False, True])
def test_free_dim_broadcast_where(swap):
    """nl.where with a [P, 1] operand (the condition, x or y), both orders of x and y."""
    a = (np.arange(128 * 16).reshape(128, 16) % 11).astype(np.int32)
    b = (np.arange(128).reshape(128, 1) % 5 + 100).astype(np.int32)
    c = (np.arange(128).reshape(128, 1) % 3 == 0).astype(np.uint8)

    @nki.jit
    def k(a, b, c):
        out = nl.ndarray((3, 128, 16), nl.int32, buffer=nl.shared_hbm)
        x, y, cond = nl.load(a), nl.load(b), nl.load(c)
        big = nl.greater(x, 5)
        nl.store(out[0], nl.where(big, y, x) if swap else nl.where(big, x, y))
        nl.store(out[1], nl.where(cond, y, x) if swap else nl.where(cond, x, y))
        nl.store(out[2], nl.where(cond, x, 7) if swap else nl.where(cond, 7, x))
        return out

    got = k(a, b, c)
    pair = (b, a) if swap else (a, b)
    np.testing.assert_array_equal(got[0], np.where(a > 5, *pair))
    np.testing.assert_array_equal(got[1], np.where(c != 0, *pair))
    np.testing.assert_array_equal(got[2], np.where(c != 0, a, 7) if swap else np.where(c != 0, 7, a))


# ------------------------------------------------- two programs writing overlapping HBM bytes (LNC=2)
def test_two_programs_writing_overlapping_rows_is_a_real_race_explained():
    """Program 0 stores whole rows 0..31, program 1 a column band of the same rows with other
    values: nothing orders the two cores' DMAs, so the band's final bytes depend on which lands
    last. RaceError says it is real on hardware, names both kernel lines and the fix."""
    from trn3emu.errors import RaceError

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        if nl.program_id(0) == 0:
            nl.store(out[0:32, :], t[0:32, :])  # line A
        else:
            u = nl.multiply(t, 2.0)
            nl.store(out[0:32, 16:32], u[0:32, 16:32])  # line B
            nl.store(out[32:128, :], u[32:128, :])
        return out

    with pytest.raises(RaceError) as e:
        k[2](np.ones((128, 64), np.float32))
    msg = str(e.value)
    assert "This race is real on hardware: program 0 and program 1" in msg
    assert "nl.store(out[0:32, :], t[0:32, :])  # line A" in msg
    assert "nl.store(out[0:32, 16:32], u[0:32, 16:32])  # line B" in msg
    assert msg.splitlines()[-1].startswith("fix: the cores write the same bytes") and "nl.program_id(0)" in msg


def test_two_programs_writing_disjoint_parts_run():
    """The fix: program 0 writes the rows outside program 1's band; exact result."""
    a = RNG.integers(-100, 100, (128, 64)).astype(np.float32)

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        if nl.program_id(0) == 0:
            nl.store(out[0:32, 0:16], t[0:32, 0:16])
            nl.store(out[0:32, 32:64], t[0:32, 32:64])
        else:
            u = nl.multiply(t, 2.0)
            nl.store(out[0:32, 16:32], u[0:32, 16:32])
            nl.store(out[32:128, :], u[32:128, :])
        return out

    want = 2 * a
    want[0:32, 0:16], want[0:32, 32:64] = a[0:32, 0:16], a[0:32, 32:64]
    np.testing.assert_array_equal(k[2](a), want)
