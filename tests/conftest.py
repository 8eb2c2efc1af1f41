"""Shared fixtures and helpers for the instruction tests.

Every test builds a program the way a kernel would: inputs go into HBM, `dma_copy` moves them into
SBUF tiles, the instruction under test runs, and the result travels back out through SBUF and HBM.
Expected values always come from an independent numpy / ml_dtypes reference in the test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from hypothesis import settings

# CI replays the same examples every run; locally hypothesis explores.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

BF16 = ml_dtypes.bfloat16
FP8_E4M3 = ml_dtypes.float8_e4m3
FP8_E4M3FN = ml_dtypes.float8_e4m3fn
FP8_E5M2 = ml_dtypes.float8_e5m2


@pytest.fixture
def dev() -> t3.Device:
    """A fresh device (zeroed SBUF/PSUM/HBM)."""
    return t3.Device()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240917)


class Out:
    """An output tile spec for `run_op`: shape, dtype and memory ('sbuf' or 'psum')."""

    def __init__(self, shape, dtype, mem: str = "sbuf", fill=None) -> None:
        self.shape, self.dtype, self.mem, self.fill = tuple(shape), dtype, mem, fill


def run_op(
    dev: t3.Device,
    inputs: Sequence[np.ndarray],
    outputs: Sequence[Out | tuple],
    body: Callable[..., None],
) -> list[np.ndarray]:
    """Run one program: HBM -> SBUF for every input, `body(p, *in_tiles, *out_tiles)`, tiles -> HBM.

    Outputs are `Out(shape, dtype, mem, fill)` or `(shape, dtype)`. PSUM outputs come back through a
    same-dtype `tensor_copy` to SBUF (bit-exact). `fill` memsets an output tile first. Returns the
    outputs as numpy arrays (ml_dtypes for bf16/fp8).
    """
    p = t3.Program()
    in_tiles = []
    for a in inputs:
        a = np.asarray(a)
        if a.ndim == 1:
            a = a.reshape(-1, 1)
        h = dev.hbm.put(a)
        t = p.sbuf(a.shape, a.dtype)
        p.dma_copy(dst=t, src=h)
        in_tiles.append(t)
    outs = [o if isinstance(o, Out) else Out(*o) for o in outputs]
    out_tiles = []
    for o in outs:
        t = p.psum(o.shape, o.dtype) if o.mem == "psum" else p.sbuf(o.shape, o.dtype)
        if o.fill is not None:
            p.memset(dst=t, value=o.fill)
        out_tiles.append(t)
    body(p, *in_tiles, *out_tiles)
    handles = []
    for t in out_tiles:
        if t.mem == "psum":
            s = p.sbuf(t.shape, t.dtype)
            p.tensor_copy(dst=s, src=t)
            t = s
        h = dev.hbm.alloc(t.shape, t.dtype)
        p.dma_copy(dst=h, src=t)
        handles.append(h)
    dev.run(p)
    return [dev.hbm.get(h) for h in handles]


def param_id(v) -> str:
    """Readable pytest ids: dtype names for numpy / ml_dtypes types, str() otherwise."""
    if isinstance(v, type) and issubclass(v, np.generic):
        return np.dtype(v).name
    return str(v)


def bits(a: np.ndarray) -> np.ndarray:
    """Raw bit patterns of an array (unsigned integers of the same width), for bit-exact checks."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Bit-for-bit equality (so NaN payloads and signed zeros count), with a useful message."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    g, w = bits(got), bits(want)
    bad = np.argwhere(g != w)
    assert bad.size == 0, (
        f"{len(bad)} of {g.size} elements differ; first at {tuple(bad[0])}: "
        f"got {got[tuple(bad[0])]!r} ({g[tuple(bad[0])]:#x}), want {want[tuple(bad[0])]!r} ({w[tuple(bad[0])]:#x})"
    )


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def random_bits(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Uniformly random bit patterns viewed as `dtype` (every code, NaN payloads included)."""
    dt = np.dtype(dtype)
    raw = rng.integers(0, 256, size=(*shape, dt.itemsize), dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def e8m0_reference(u: np.ndarray) -> np.ndarray:
    """fp32 bits -> float8_e8m0fnu codes by the documented rule (docs/numerics.md), written from
    values, not bits: the nearest power 2^k (k in -127..127) to x, a tie (x = 1.5 * 2^k) going to
    the larger; below 2^-127 the smallest code 0 (there is no zero); 0, negatives, ±Inf, NaN and
    results beyond 2^127 -> NaN (0xFF)."""
    x = u.view(np.float32)
    m, e = np.frexp(x)  # x = m * 2^e, m in [0.5, 1): x lies in [2^(e-1), 2^e)
    k = e.astype(np.int64) - 1 + (m >= np.float32(0.75))  # 0.75 * 2^e is the midpoint 1.5 * 2^(e-1)
    code = np.maximum(k + 127, 0)
    bad = ~np.isfinite(x) | (x <= 0) | (code > 254)
    return np.where(bad, 0xFF, code).astype(np.uint32)


def e8m0_release_dependent(u: np.ndarray) -> np.ndarray:
    """Inputs where the ml_dtypes releases the package allows disagree with each other
    (docs/numerics.md): exact ties 1.5 * 2^k (0.5 rounds them to the even code, 0.6+ up) and
    (2^-127, 1.5 * 2^-127) (0.6 gives 2^-126, 0.5 and 0.7 the nearest, 2^-127)."""
    a = u & np.uint32(0x7FFFFFFF)
    tie = (u >> 31 == 0) & (a >= 0x00800000) & (a < 0x7F800000) & ((a & 0x7FFFFF) == 0x400000)
    band = (a > 0x00400000) & (a < 0x00600000) & (u >> 31 == 0)
    return tie | band
