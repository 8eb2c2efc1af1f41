"""The legacy dialect's tracing fast paths against the general ones: `nl.<binary op>` of two
on-chip tiles of one shape (`language._binary_tiles`) must give the instructions (operands, order,
labels) and the values of the general `_binary` path, which these tests force by turning the fast
path off; and both must match numpy."""

import ml_dtypes
import numpy as np
import pytest
import trn3emu.nki as tn
import trn3emu.nki.language as language
from trn3emu.errors import NotSupportedError

BF16 = ml_dtypes.bfloat16
tn.install()

import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.isa as lisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402


def _traced(k, args, fast: bool, monkeypatch):
    """(outputs, instruction listing of every program) of a fresh trace of `k`."""
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(language, "_binary_tiles", lambda *a: None)
        k.cache_clear()
        out = k(*args)
        text = [p.to_text() for p in k.last_programs]
    return out, text


def _same_both_ways(k, args, monkeypatch):
    fast, fast_text = _traced(k, args, True, monkeypatch)
    slow, slow_text = _traced(k, args, False, monkeypatch)
    assert fast_text == slow_text
    for a, b in zip(fast if isinstance(fast, tuple) else (fast,), slow if isinstance(slow, tuple) else (slow,)):
        np.testing.assert_array_equal(a, b)
    return fast


@lnki.jit
def _mixed(a, b, c):
    # promotion (bf16 + fp32), dtype=, a [P, 1] column, a scalar, fused and aliasing assignments,
    # an fp32 result written into a bf16 tile, a comparison's result in arithmetic
    out = nl.ndarray(b.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    ta, tb, tc = nl.load(a), nl.load(b), nl.load(c)
    s = nl.add(ta, tb)
    d = nl.multiply(ta, ta, dtype=nl.float32)
    e = nl.subtract(s, tc)
    f = nl.maximum(e, 0.5)
    acc = nl.ndarray(b.shape, dtype=nl.float32, buffer=nl.sbuf)
    acc[...] = nl.add(d, f)
    acc[...] = nl.multiply(acc, tb)
    h = nl.greater(acc, tb)
    t16 = nl.ndarray(b.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    t16[...] = nl.add(acc, nl.add(h, acc))
    nl.store(out, value=nl.add(t16, acc))
    return out


def test_binary_ops_of_tiles_match_the_general_path_and_numpy(monkeypatch):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((128, 48)).astype(BF16)
    b = rng.standard_normal((128, 48)).astype(np.float32)
    c = rng.standard_normal((128, 1)).astype(np.float32)
    got = _same_both_ways(_mixed, (a, b, c), monkeypatch)
    af = a.astype(np.float32)
    acc = (af * af + np.maximum(af + b - c, np.float32(0.5))) * b
    t16 = (acc + ((acc > b).astype(np.float32) + acc)).astype(BF16).astype(np.float32)
    np.testing.assert_allclose(got, t16 + acc, rtol=1e-6, atol=1e-6)


@lnki.jit
def _rope(x, cos, sin):
    # the bench's legacy RoPE: pending loads and results used by the next op, stores of pending results
    heads, seq, d = x.shape
    h2 = d // 2
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for s in nl.affine_range(seq // 128):
        pos = slice(s * 128, (s + 1) * 128)
        tc, ts = nl.load(cos[pos, :]), nl.load(sin[pos, :])
        for h in nl.affine_range(heads):
            x1 = nl.load(x[h, pos, 0:h2])
            x2 = nl.load(x[h, pos, h2:d])
            nl.store(out[h, pos, 0:h2], value=nl.subtract(nl.multiply(x1, tc), nl.multiply(x2, ts)))
            nl.store(out[h, pos, h2:d], value=nl.add(nl.multiply(x2, tc), nl.multiply(x1, ts)))
    return out


def test_rope_matches_the_general_path_and_numpy(monkeypatch):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 256, 32)).astype(np.float32)
    cos, sin = (rng.standard_normal((256, 16)).astype(np.float32) for _ in range(2))
    got = _same_both_ways(_rope, (x, cos, sin), monkeypatch)
    x1, x2 = x[..., :16], x[..., 16:]
    np.testing.assert_array_equal(got, np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1))


@lnki.jit
def _shapes(a, v):
    # 3-D tiles, a 1-D vector (a result padded to [P, 1]), a masked op, a value-returning nisa
    # result as an operand, a comparison of an int tile
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    out_v = nl.ndarray(v.shape, dtype=v.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    u = lisa.tensor_tensor(t, t, op=nl.add)
    w = nl.multiply(nl.add(t, u), t)
    i_p, i_x, i_y = nl.mgrid[0:128, 0:4, 0:8]
    m = nl.subtract(w, t, mask=(i_p < 100))
    nl.store(out, value=nl.add(m, w))
    tv = nl.load(v)
    nl.store(out_v, value=nl.multiply(tv, tv))
    return out, out_v


def test_other_shapes_match_the_general_path(monkeypatch):
    rng = np.random.default_rng(7)
    a = rng.integers(-8, 8, (128, 4, 8)).astype(np.float32)
    v = rng.integers(-8, 8, (128,)).astype(np.float32)
    got, got_v = _same_both_ways(_shapes, (a, v), monkeypatch)
    w = (a + 2 * a) * a
    np.testing.assert_array_equal(got[:100], (w - a)[:100] + w[:100])
    np.testing.assert_array_equal(got_v, v * v)


@pytest.mark.parametrize("bad", ["shape", "keyword"])
def test_fast_path_errors_are_the_general_paths(monkeypatch, bad):
    @lnki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        r = nl.add(ta, tb) if bad == "shape" else nl.add(ta, ta, dtyp=nl.float32)
        nl.store(out, value=r)
        return out

    a = np.ones((128, 64), np.float32)
    b = np.ones((128, 32), np.float32)
    errors = []
    for fast in (True, False):
        with pytest.raises(Exception) as e:
            _traced(k, (a, b), fast, monkeypatch)
        errors.append((type(e.value), str(e.value), getattr(e.value, "__notes__", None)))
    assert errors[0] == errors[1]


@lnki.jit
def _isa_forms(a, b):
    # value-returning nisa calls in several call forms, each form bound once and then reused
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[0] // 128):
        rows = slice(i * 128, (i + 1) * 128)
        x, y = nl.load(a[rows]), nl.load(b[rows])
        s = lisa.tensor_tensor(x, y, op=nl.add)
        d = lisa.tensor_tensor(data2=y, op=nl.subtract, data1=x)
        m = lisa.tensor_tensor(s, data2=d, op=nl.multiply)
        nl.store(out[rows], value=lisa.tensor_scalar(m, nl.multiply, 2.0))
    return out


def test_legacy_isa_call_forms_bound_once_match_numpy():
    rng = np.random.default_rng(8)
    a, b = (rng.integers(-8, 8, (384, 32)).astype(np.float32) for _ in range(2))
    _isa_forms.cache_clear()
    np.testing.assert_array_equal(_isa_forms(a, b), (a + b) * (a - b) * 2)


def test_legacy_isa_bad_call_form_fails_every_time():
    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        for _ in nl.affine_range(2):
            try:
                lisa.tensor_tensor(t, t, op=nl.add, data3=t)
            except Exception as e:  # (the same refusal on the second call of the form)
                errors.append((type(e), str(e)))
        nl.store(out, value=t)
        return out

    errors = []
    k(np.ones((128, 8), np.float32))
    assert len(errors) == 2 and errors[0] == errors[1] and "call form" in errors[0][1]


def test_a_pending_results_missing_attribute_is_named_at_the_launch():
    """A legacy result not issued yet (`Pending`) keeps its own attribute hook (it issues the
    result when `_t` is read); a misspelt attribute still gets the front end's error, as on a
    plain tile (`_kernel.tile_attribute_error`), and `getattr`'s default still applies."""
    seen = []

    @lnki.jit
    def k(a):
        t = nl.exp(nl.load(a))
        seen.append(getattr(t, "no_such", "default"))
        return t.shpae

    with pytest.raises(NotSupportedError, match=r"NkiTensor.shpae; did you mean `shape`") as ei:
        k(np.zeros((2, 2), np.float32))
    assert isinstance(ei.value, AttributeError)
    assert seen == ["default"]
