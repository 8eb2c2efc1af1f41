"""XORWOW random numbers (rng, rand2, set_rng_seed, rand_set_state / rand_get_state, dropout)
against an independent Python implementation of Marsaglia's recurrence and of the documented
lane / state / word-order choices (docs/numerics.md, "Random numbers")."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3

M32 = 0xFFFFFFFF


def xorwow(state: list[int]) -> int:
    """One step on [x0..x4, d] (x0 newest, x4 oldest); returns the output (Marsaglia 2003)."""
    t = state[4]
    s = state[0]
    t ^= t >> 2
    t = (t ^ (t << 1)) & M32
    t ^= s ^ ((s << 4) & M32)
    state[1:5] = state[0:4]
    state[0] = t
    state[5] = (state[5] + 362437) & M32
    return (t + state[5]) & M32


def ref_draws(states: np.ndarray, parts: int, free: int, per_lane: int) -> np.ndarray:
    """states [P, per_lane*6] -> outputs [parts, free]: element j of lane p uses state j % per_lane."""
    st = [[list(map(int, states[p, 6 * k : 6 * k + 6])) for k in range(per_lane)] for p in range(states.shape[0])]
    out = np.zeros((parts, free), np.uint64)
    for p in range(parts):
        for j in range(free):
            out[p, j] = xorwow(st[p][j % per_lane])
    final = np.array([[w for k in range(per_lane) for w in st[p][k]] for p in range(states.shape[0])], np.uint32)
    return out.astype(np.uint32), final


def load_states(p, dev, states, engine):
    h = dev.hbm.put(states)
    t = p.sbuf(states.shape, np.uint32)
    p.dma_copy(dst=t, src=h)
    p.rand_set_state(src_seeds=t, engine=engine)


def fetch(p, dev, tile):
    h = dev.hbm.alloc(tile.shape, tile.dtype)
    p.dma_copy(dst=h, src=tile)
    return h


@pytest.mark.parametrize("engine,per_lane", [("vector", 4), ("gpsimd", 1)])
def test_rng_matches_reference_xorwow(engine, per_lane):
    rng = np.random.default_rng(1)
    states = rng.integers(1, 2**32, size=(128, 6 * per_lane), dtype=np.uint32)
    dev = t3.Device()
    p = t3.Program()
    load_states(p, dev, states, engine)
    out = p.sbuf((128, 10), np.uint32)
    out8 = p.sbuf((128, 6), np.int8)
    p.rng(dst=out, engine=engine)
    p.rng(dst=out8, engine=engine)
    st = p.sbuf((128, 6 * per_lane), np.uint32)
    p.rand_get_state(dst=st, engine=engine)
    h1, h2, h3 = fetch(p, dev, out), fetch(p, dev, out8), fetch(p, dev, st)
    dev.run(p)
    want1, s1 = ref_draws(states, 128, 10, per_lane)
    want2, s2 = ref_draws(s1, 128, 6, per_lane)
    assert np.array_equal(dev.hbm.get(h1), want1)
    assert np.array_equal(dev.hbm.get(h2), (want2 & 0xFF).astype(np.uint8).view(np.int8))  # low bits kept
    assert np.array_equal(dev.hbm.get(h3), s2)


def test_state_save_restore_is_exact_and_persists_across_runs():
    dev = t3.Device()
    p = t3.Program()
    st = p.sbuf((128, 24), np.uint32)
    p.rand_get_state(dst=st, engine="vector")  # NKI's default engine for the state ops is gpsimd
    a = p.sbuf((128, 16), np.uint32)
    p.rng(dst=a)
    p.rand_set_state(src_seeds=st, engine="vector")
    b = p.sbuf((128, 16), np.uint32)
    p.rng(dst=b)
    ha, hb, hs = fetch(p, dev, a), fetch(p, dev, b), fetch(p, dev, st)
    dev.run(p)
    assert np.array_equal(dev.hbm.get(ha), dev.hbm.get(hb))
    want, after = ref_draws(dev.hbm.get(hs), 128, 16, 4)
    assert np.array_equal(dev.hbm.get(ha), want)
    # The state persists into the next run.
    p2 = t3.Program()
    c = p2.sbuf((128, 24), np.uint32)
    p2.rand_get_state(dst=c, engine="vector")
    hc = fetch(p2, dev, c)
    dev.run(p2)
    assert np.array_equal(dev.hbm.get(hc), after)


def test_set_rng_seed_reproduces_and_differs():
    def draw(seed, dev=None):
        dev = dev or t3.Device()
        p = t3.Program()
        s = p.sbuf((1, 1), np.uint32)
        p.dma_copy(dst=s, src=dev.hbm.put(np.array([[seed]], np.uint32)))
        p.set_rng_seed(src_seeds=s)
        o = p.sbuf((128, 32), np.uint32)
        p.rng(dst=o)
        h = fetch(p, dev, o)
        dev.run(p)
        return dev.hbm.get(h)

    a, b, c = draw(7), draw(7, t3.Device(seed=99)), draw(8)
    assert np.array_equal(a, b)  # the seed instruction fully determines the state
    assert np.count_nonzero(a != c) > 4000
    # Lanes and the 4 states per lane are decorrelated: no repeated values across the tile.
    assert np.unique(a).size == a.size


def test_rand2_uniform_in_range_and_formula():
    rng = np.random.default_rng(2)
    states = rng.integers(1, 2**32, size=(128, 24), dtype=np.uint32)
    lo = np.linspace(-3, 1, 128, dtype=np.float32).reshape(128, 1)
    dev = t3.Device()
    p = t3.Program()
    load_states(p, dev, states, "vector")
    lt = p.sbuf((128, 1), np.float32)
    p.dma_copy(dst=lt, src=dev.hbm.put(lo))
    o = p.sbuf((128, 512), np.float32)
    p.rand2(dst=o, min=lt, max=5.0)
    ob = p.sbuf((128, 512), ml_dtypes.bfloat16)
    p.rand2(dst=ob, min=0.0, max=1.0)
    h, hb = fetch(p, dev, o), fetch(p, dev, ob)
    dev.run(p)
    bits, s1 = ref_draws(states, 128, 512, 4)
    u = (bits >> 8).astype(np.float32) * np.float32(2.0**-24)
    want = (lo + (np.float32(5.0) - lo) * u).astype(np.float32)
    got = dev.hbm.get(h)
    assert np.array_equal(got, want)
    assert np.all(got >= lo) and np.all(got <= 5.0)
    bits2, _ = ref_draws(s1, 128, 512, 4)
    u2 = (bits2 >> 8).astype(np.float32) * np.float32(2.0**-24)
    assert np.array_equal(dev.hbm.get(hb).view(np.uint16), u2.astype(ml_dtypes.bfloat16).view(np.uint16))
    # Uniformity: mean and variance of u over 65536 draws.
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005


def test_dropout_mask_matches_reference():
    rng = np.random.default_rng(3)
    states = rng.integers(1, 2**32, size=(128, 24), dtype=np.uint32)
    x = rng.normal(size=(128, 256)).astype(ml_dtypes.bfloat16)
    probs = np.linspace(0, 1, 128, dtype=np.float32).reshape(128, 1)
    dev = t3.Device()
    p = t3.Program()
    load_states(p, dev, states, "vector")
    xt = p.sbuf(x.shape, ml_dtypes.bfloat16)
    p.dma_copy(dst=xt, src=dev.hbm.put(x))
    pt = p.sbuf((128, 1), np.float32)
    p.dma_copy(dst=pt, src=dev.hbm.put(probs))
    o = p.sbuf(x.shape, ml_dtypes.bfloat16)
    p.dropout(dst=o, data=xt, prob=pt)
    o2 = p.sbuf(x.shape, ml_dtypes.bfloat16)
    p.dropout(dst=o2, data=xt, prob=0.3)
    h, h2 = fetch(p, dev, o), fetch(p, dev, o2)
    dev.run(p)
    bits, s1 = ref_draws(states, 128, 256, 4)
    u = (bits >> 8).astype(np.float32) * np.float32(2.0**-24)
    want = np.where(u < probs, np.zeros_like(x), x)
    got = dev.hbm.get(h)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    assert np.all(got[0] == x[0]) and np.all(got[127].astype(np.float32) == 0)  # prob 0 / prob 1
    bits2, _ = ref_draws(s1, 128, 256, 4)
    u2 = (bits2 >> 8).astype(np.float32) * np.float32(2.0**-24)
    got2 = dev.hbm.get(h2)
    assert np.array_equal(got2.view(np.uint16), np.where(u2 < np.float32(0.3), np.zeros_like(x), x).view(np.uint16))
    frac = np.mean(u2 < 0.3)
    assert abs(frac - 0.3) < 5 * np.sqrt(0.3 * 0.7 / u2.size)


def test_rng_operand_errors():
    p = t3.Program()
    with pytest.raises(t3.ShapeError, match=r"\(P, 24\)"):
        p.rand_set_state(src_seeds=p.sbuf((128, 6), np.uint32), engine="vector")
    with pytest.raises(t3.ShapeError, match=r"\(P, 6\)"):
        p.rand_get_state(dst=p.sbuf((128, 24), np.uint32), engine="gpsimd")
    with pytest.raises(t3.ShapeError, match=r"\[1, 1\]"):
        p.set_rng_seed(src_seeds=p.sbuf((1, 2), np.uint32))
    with pytest.raises(t3.EmuError, match="min"):
        p.rand2(dst=p.sbuf((4, 4), np.float32), min=2.0, max=1.0)
    with pytest.raises(t3.EmuError, match="prob"):
        x = p.sbuf((4, 4), np.float32)
        p.dropout(dst=x, data=x, prob=1.5)
    with pytest.raises(t3.MemorySpaceError):
        p.rng(dst=p.psum((4, 4), np.uint32), engine="gpsimd")
