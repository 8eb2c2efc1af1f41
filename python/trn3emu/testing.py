"""Golden-model helpers: compare kernel outputs with numpy references and explain mismatches.

`assert_close(actual, expected)` passes when every element satisfies the chosen rule and
otherwise raises an AssertionError listing the worst elements (index, values, |diff|, ULP distance
in the actual array's dtype, bit patterns):

- mode="allclose": |a - b| <= atol + rtol * |b|   (numpy.allclose)
- mode="max":      |a - b| <= atol + rtol * max|b| (range-relative, as nki-library's maxAllClose)

Default tolerances depend on the dtype of `actual` (DEFAULT_TOLERANCES). Exact dtypes (integers,
bool) default to 0/0. NaNs compare equal to NaNs at the same place (equal_nan=True).

Arrays may be numpy, torch CPU tensors, JAX arrays or anything with `__dlpack__` / `__array__`
(`trn3emu.interop`). `run_kernel(kernel, reference, *arrays)` runs a kernel, computes the reference on the same inputs
and asserts closeness. `fill_uninitialized(byte)` makes every kernel run start with SBUF/PSUM
filled with that byte (0xFF -> NaN in every float dtype), to expose reads of memory no
instruction wrote, as the vendor's simulator does with NaN sentinels.
"""

from __future__ import annotations

import contextlib
import os

import ml_dtypes
import numpy as np

from . import interop

#: dtype name -> (rtol, atol) used when none are given.
DEFAULT_TOLERANCES = {
    "float32": (1e-5, 1e-6),
    "tfloat32": (1e-3, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1e-2, 1e-5),
    "float8_e4m3": (1.25e-1, 1e-3),
    "float8_e4m3fn": (1.25e-1, 1e-3),
    "float8_e5m2": (2.5e-1, 1e-3),
    "float8_e8m0fnu": (0.0, 0.0),
    "float64": (1e-7, 1e-9),
}

_FILL: list = [None]


def default_fill():
    """The byte fresh on-chip memory is filled with for kernel runs (None: zeros).

    Set by `fill_uninitialized`, else by the environment: TRN3EMU_NKI_FILL=0xff (any int literal).
    """
    if _FILL[0] is not None:
        return _FILL[0]
    env = os.environ.get("TRN3EMU_NKI_FILL")
    return int(env, 0) if env else None


@contextlib.contextmanager
def fill_uninitialized(byte: int | None = 0xFF):
    """Within the block, kernels start with every SBUF/PSUM byte = `byte` (0xFF: NaN floats)."""
    prev = _FILL[0]
    _FILL[0] = byte
    try:
        yield
    finally:
        _FILL[0] = prev


def _host(x) -> np.ndarray:
    """`x` as numpy: torch / JAX / DLPack arrays through `trn3emu.interop` (bf16 and fp8 bit-exact)."""
    return interop.to_numpy(x) if interop.is_array(x) else np.asarray(x)


def tolerances(dtype) -> tuple[float, float]:
    """(rtol, atol) for a dtype (exact for integer and bool dtypes)."""
    dt = np.dtype(dtype)
    if dt.kind in "iub":
        return 0.0, 0.0
    return DEFAULT_TOLERANCES.get(dt.name, (1e-5, 1e-6))


def _eps(dt) -> float:
    """The spacing of dtype `dt` at 1.0 (0 for exact dtypes)."""
    dt = np.dtype(dt)
    if dt.kind in "iub":
        return 0.0
    try:
        return float(ml_dtypes.finfo(dt).eps)
    except (TypeError, ValueError):
        return 0.0


def default_atol(dtype, expected) -> float:
    """The atol used when none is given: the dtype's table atol, or max(one ulp of `dtype`, a
    quarter of its default rtol) times the largest finite |expected|, whichever is more. An
    element near zero of a sum (a matmul output, a softmax's centred logits) carries the rounding
    of the sum's large terms, not of its own small value: a reference summed in another order
    (numpy's fp32 matmul), or a bf16 output of it, differs there by about an ulp of the output's
    scale while |expected| * rtol is ~0 (a bf16 [1024, 512] matmul with K = 2048: 2 elements
    failed the table atol; fp32 outputs: thousands)."""
    rtol, base = tolerances(dtype)
    e = np.abs(np.asarray(expected, np.float64))
    e = e[np.isfinite(e)]
    scale = float(e.max()) if e.size else 0.0
    return max(base, max(_eps(dtype), rtol / 4) * scale)


def _bits(x: np.ndarray) -> np.ndarray:
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize]
    return np.ascontiguousarray(x).view(u)


def _ordered(x: np.ndarray) -> np.ndarray:
    """Float bit patterns mapped to integers that order like the values (ULP arithmetic)."""
    signed = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[x.dtype.itemsize]
    v = np.ascontiguousarray(x).view(signed).astype(np.int64)
    mag = np.int64((1 << (8 * x.dtype.itemsize - 1)) - 1)
    return np.where(v < 0, -(v & mag), v)


def ulp_distance(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Distance in units in the last place of actual's dtype (expected cast to that dtype first)."""
    a = _host(actual)
    if a.dtype.kind not in "fV" and not _is_ml_float(a.dtype):
        return np.abs(a.astype(np.int64) - _host(expected).astype(np.int64))
    e = _host(expected).astype(np.float64).astype(a.dtype)
    return np.abs(_ordered(a) - _ordered(e))


def _is_ml_float(dt) -> bool:
    return dt in (
        np.dtype(ml_dtypes.bfloat16),
        np.dtype(ml_dtypes.float8_e4m3),
        np.dtype(ml_dtypes.float8_e4m3fn),
        np.dtype(ml_dtypes.float8_e5m2),
        np.dtype(ml_dtypes.float8_e8m0fnu),
    )


def compare(actual, expected, rtol=None, atol=None, mode: str = "allclose", equal_nan: bool = True):
    """(ok, bad_mask, diff, bound) for the chosen rule; see the module docstring."""
    a = _host(actual)
    e = _host(expected)
    if a.shape != e.shape:
        raise AssertionError(f"shape mismatch: actual {a.shape}, expected {e.shape}")
    r0, a0 = tolerances(a.dtype)
    rtol = r0 if rtol is None else rtol
    af, ef = a.astype(np.float64), e.astype(np.float64)
    atol = default_atol(a.dtype, ef) if atol is None else atol
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(af - ef)
    if mode == "allclose":
        bound = atol + rtol * np.abs(ef)
    elif mode == "max":
        finite = np.abs(ef[np.isfinite(ef)])
        bound = np.full(ef.shape, atol + rtol * (finite.max() if finite.size else 0.0))
    else:
        raise ValueError(f"mode must be 'allclose' or 'max', got {mode!r}")
    with np.errstate(invalid="ignore"):
        any_inf = np.isinf(af) | np.isinf(ef)
        ok_el = (diff <= bound) & ~any_inf
        ok_el |= any_inf & (af == ef)
        if equal_nan:
            ok_el |= np.isnan(af) & np.isnan(ef)
    bad = ~ok_el
    return not bad.any(), bad, diff, bound


def report(actual, expected, bad, diff, worst: int = 5) -> str:
    """The worst mismatching elements as text."""
    a = _host(actual)
    e = _host(expected)
    idx = np.flatnonzero(bad.ravel())
    d = np.where(np.isnan(diff), np.inf, diff).ravel()
    order = idx[np.argsort(-d[idx], kind="stable")][:worst]
    ulps = ulp_distance(a, e).ravel() if a.dtype.itemsize <= 8 else None
    ea = e.astype(np.float64).astype(a.dtype) if (a.dtype.kind == "f" or _is_ml_float(a.dtype)) else e
    lines = [f"{idx.size} of {a.size} elements differ ({100.0 * idx.size / max(a.size, 1):.3g}%); worst:"]
    for flat in order:
        i = np.unravel_index(flat, a.shape)
        av, ev = a.ravel()[flat], e.ravel()[flat]
        u = "" if ulps is None else f" ulp={ulps[flat]}"
        bits = f" bits actual=0x{int(_bits(a).ravel()[flat]):x} expected=0x{int(_bits(np.asarray(ea)).ravel()[flat]):x}"
        lines.append(
            f"  at {tuple(int(x) for x in i)}: actual={float(av)!r} expected={float(ev)!r} "
            f"|diff|={float(d[flat]):.6g}{u}{bits}"
        )
    return "\n".join(lines)


def assert_close(actual, expected, rtol=None, atol=None, mode: str = "allclose", equal_nan=True, worst=5):
    """Assert closeness (see module docstring); the error lists the worst elements."""
    ok, bad, diff, _ = compare(actual, expected, rtol, atol, mode, equal_nan)
    if not ok:
        a = _host(actual)
        r0, a0 = tolerances(a.dtype)
        rule = "|a-b| <= atol + rtol*|b|" if mode == "allclose" else "|a-b| <= atol + rtol*max|b|"
        used = default_atol(a.dtype, _host(expected)) if atol is None else atol
        raise AssertionError(
            f"arrays not close ({rule}, rtol={r0 if rtol is None else rtol}, atol={used:.3g}, "
            f"dtype {a.dtype})\n" + report(actual, expected, bad, diff, worst) + _advice(a, _host(expected), bad)
        )


def _advice(a: np.ndarray, e: np.ndarray, bad: np.ndarray) -> str:
    """What to do about a failure: which tolerance or reference to use."""
    af = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        fresh_nan = bool((np.isnan(af) & ~np.isnan(e.astype(np.float64)) & bad).any())
    if fresh_nan and default_fill() is not None:
        return (
            f"\nfix: NaN where the reference is finite, with on-chip memory filled 0x{default_fill():02X} "
            "(fill_uninitialized, on by default in run_kernel): the kernel left these elements unwritten or "
            "computed them from memory nothing wrote; write every output element (or run_kernel(..., "
            "fill=None) to compare against zero-filled memory)"
        )
    if e.dtype == np.float32 and _eps(a.dtype) > _eps(np.float32):
        return (
            f"\nfix: for a {a.dtype} result, compute the reference in float64 (e.g. "
            "`a.astype(np.float64) @ b.astype(np.float64)`): an fp32 reference carries its own rounding; "
            "or pass rtol=/atol= (mode='max' compares against max|expected|, nki-library's rule)"
        )
    return (
        "\nfix: if the difference is rounding, pass rtol=/atol= for this comparison (mode='max' compares "
        "against max|expected|, nki-library's rule); a float64 reference removes the reference's own rounding"
    )


def run_kernel(kernel, reference, *arrays, rtol=None, atol=None, mode="allclose", grid=None, fill=0xFF, **kwargs):
    """Run `kernel` (optionally `kernel[grid]`) on arrays (numpy, torch, JAX, ...), compare with `reference(*arrays)`.

    Several outputs (tuples) are compared pairwise. Returns the kernel's outputs. The run starts
    with on-chip memory and the kernel's HBM outputs filled with `fill` (0xFF: NaN in every float
    dtype, `fill_uninitialized`), so an output element never written, or one computed from memory
    nothing wrote, fails the comparison as NaN; `fill=None` keeps the fill in force (default
    zeros). A `fill_uninitialized` block or TRN3EMU_NKI_FILL around the call take precedence.
    """
    ref = reference(*[a.copy() if isinstance(a, np.ndarray) else a for a in arrays], **kwargs)
    run = kernel if grid is None else kernel[grid]
    fresh = fill is not None and default_fill() is None
    with fill_uninitialized(fill) if fresh else contextlib.nullcontext():
        out = run(*arrays, **kwargs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        refs = ref if isinstance(ref, (tuple, list)) else (ref,)
        if len(outs) != len(refs):
            raise AssertionError(f"kernel returned {len(outs)} outputs, reference {len(refs)}")
        for o, r in zip(outs, refs):
            assert_close(o, _host(r), rtol, atol, mode)  # (in the block: its advice names the fill)
    return out
