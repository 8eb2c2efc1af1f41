"""Conversions: every 8/16-bit code decodes exactly; fp32 -> every float type is bit-identical to
ml_dtypes on a dense structured sample (every exponent, tie, subnormal, NaN and overflow boundary),
both through the raw converter and through real instructions; the documented exceptions
(docs/numerics.md, "Differences from ml_dtypes") are tested as such."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from conftest import Out, assert_bits_equal, e8m0_reference, e8m0_release_dependent, run_op
from trn3emu import _native
from trn3emu.dtypes import pack_x4, unpack_x4

# The references cast NaN / out-of-range values on purpose; numpy's cast warnings are expected.
pytestmark = pytest.mark.filterwarnings(
    "ignore:invalid value encountered in cast", "ignore:overflow encountered in cast"
)

FLOATS = {
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3": ml_dtypes.float8_e4m3,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
}
UINT = {1: np.uint8, 2: np.uint16}


def structured_f32_bits() -> np.ndarray:
    """All 2^20 values of bits 12..31 combined with low-12-bit patterns that hit exact ties,
    just-above / just-below ties and sticky bits for every target (6.3 M inputs)."""
    hi = np.arange(1 << 20, dtype=np.uint32) << 12
    lows = np.array([0, 1, 0x7FF, 0x800, 0x801, 0xFFF], dtype=np.uint32)
    return (hi[:, None] | lows[None, :]).reshape(-1)


@pytest.mark.parametrize("name", list(FLOATS))
def test_every_code_decodes_exactly(name):
    dt = np.dtype(FLOATS[name])
    n = 1 << (8 * dt.itemsize)
    codes = np.arange(n, dtype=np.uint32)
    got = _native.convert_to_f32(name, codes)
    want = codes.astype(UINT[dt.itemsize]).view(dt).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert_bits_equal(got[~nan], want[~nan])  # signed zeros and subnormals included


@pytest.mark.parametrize("name", ["int8", "uint8", "int16", "uint16", "bool"])
def test_every_integer_code_decodes_exactly(name):
    size = 1 if name in ("int8", "uint8", "bool") else 2
    codes = np.arange(1 << (8 * size), dtype=np.uint32)
    got = _native.convert_to_f32(name, codes)
    npdt = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16, "bool": np.uint8}[name]
    want = codes.astype(UINT[size]).view(npdt).astype(np.float32)
    assert_bits_equal(got, want)


@pytest.mark.parametrize("name", list(FLOATS))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_fp32_to_float_matches_ml_dtypes(name):
    u = structured_f32_bits()
    got = _native.convert_from_f32(name, u)
    dt = np.dtype(FLOATS[name])
    want = u.view(np.float32).astype(dt).view(UINT[dt.itemsize]).astype(np.uint32)
    if name == "float16":
        # Documented difference: numpy's float16 cast keeps NaN payload bits; we (like ml_dtypes
        # for every other type) give the canonical quiet NaN 0x7E00 with the sign kept.
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        assert np.array_equal(got[nan], 0x7E00 | ((u[nan] >> 16) & 0x8000))
        want[nan] = got[nan]
    if name == "float8_e8m0fnu":
        # ml_dtypes releases disagree on these inputs; the exhaustive formula test below pins them.
        keep = ~e8m0_release_dependent(u)
        u, got, want = u[keep], got[keep], want[keep]
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} mismatches, first {u[bad[0]]:#010x}: got {got[bad[0]]:#x} want {want[bad[0]]:#x}"


def test_fp32_to_e8m0_against_formula():
    """The structured sample plus every 257th fp32 input (16.7 M) against conftest.e8m0_reference
    (nearest power of two, ties up, underflow to 2^-127, no zero / Inf). All 2^32 inputs are
    checked against a second, f64 formula in rust/core/tests/numerics_exhaustive.rs."""
    strided = (np.arange(1 << 24, dtype=np.uint64) * 257 + 3).astype(np.uint32)
    for u in (structured_f32_bits(), strided):
        got = _native.convert_from_f32("float8_e8m0fnu", u)
        want = e8m0_reference(u)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (
            f"{bad.size} mismatches, first {u[bad[0]]:#010x}: got {got[bad[0]]:#x} want {want[bad[0]]:#x}"
        )


def test_e8m0_reference_is_itself_right():
    """The formula on hand-computed cases (so the exhaustive test cannot pass on a shared mistake)."""
    cases = {
        0x3F800000: 127,  # 1.0
        0x3FBFFFFF: 127,  # just below 1.5
        0x3FC00000: 128,  # 1.5: tie, up
        0x40000000: 128,  # 2.0
        0x00400000: 0,  # 2^-127
        0x00400001: 0,  # nearest is 2^-127
        0x00600000: 1,  # 1.5 * 2^-127: tie, up to 2^-126
        0x00000001: 0,  # far below: no zero, the smallest code
        0x7F000000: 254,  # 2^127
        0x7F400000: 0xFF,  # 1.5 * 2^127 rounds to 2^128: NaN
        0x00000000: 0xFF,
        0x80000000: 0xFF,
        0xBF800000: 0xFF,
        0x7F800000: 0xFF,
        0x7FC00000: 0xFF,
    }
    u = np.array(list(cases), dtype=np.uint32)
    assert e8m0_reference(u).tolist() == list(cases.values())


def test_tf32_is_rne_on_the_low_13_bits():
    u = structured_f32_bits()
    got = _native.convert_from_f32("tfloat32", u)
    finite = (u & 0x7FFFFFFF) <= 0x7F7FFFFF
    want = ((u.astype(np.uint64) + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000).astype(np.uint32)
    assert np.array_equal(got[finite], want[finite])
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    assert np.all(np.isnan(got[nan].view(np.float32)))


@pytest.mark.parametrize("name,mx", [("float8_e4m3", 240.0), ("float8_e4m3fn", 448.0), ("float8_e5m2", 57344.0)])
def test_fp8_saturate_policy(name, mx):
    u = structured_f32_bits()
    x = u.view(np.float32)
    got = _native.convert_from_f32(name, u, saturate=True)
    dt = np.dtype(FLOATS[name])
    finite = np.isfinite(x)
    # Reference: RNE with ml_dtypes, then every finite input whose RNE result overflows -> ±max.
    ref = x.astype(dt)
    over = finite & ~np.isfinite(ref.astype(np.float32))
    sat = np.where(np.signbit(x), -mx, mx).astype(np.float32).astype(dt)
    want = np.where(over, sat, ref).view(np.uint8).astype(np.uint32)
    assert np.array_equal(got[finite], want[finite])
    # Inf / NaN inputs keep their ml_dtypes encoding.
    assert np.array_equal(got[~finite], ref.view(np.uint8).astype(np.uint32)[~finite])


@pytest.mark.parametrize(
    "name,npdt,lo,hi",
    [
        ("int8", np.int8, -128, 127),
        ("uint8", np.uint8, 0, 255),
        ("int16", np.int16, -32768, 32767),
        ("uint16", np.uint16, 0, 65535),
        ("int32", np.int32, -(2**31), 2**31 - 1),
        ("uint32", np.uint32, 0, 2**32 - 1),
    ],
)
def test_fp32_to_int_rne_saturating(name, npdt, lo, hi):
    rng = np.random.default_rng(3)
    ties = np.arange(-300, 300, dtype=np.float32) + 0.5
    big = np.array([3e9, -3e9, 5e9, 1e20, -1e20, np.inf, -np.inf, 2**31, -(2**31), 65535.5, 4294967040.0], np.float32)
    x = np.concatenate([ties, big, rng.normal(0, 1000, 2000).astype(np.float32), [np.nan, -0.0]]).astype(np.float32)
    got = _native.convert_from_f32(name, x.view(np.uint32))
    r = np.clip(np.round(x.astype(np.float64)), lo, hi)  # numpy rounds half to even
    r = np.where(np.isnan(x), 0, r).astype(np.int64)
    want = r.astype(npdt).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[np.dtype(npdt).itemsize]).astype(np.uint32)
    assert np.array_equal(got, want)


EDGE = np.array(
    [
        0.0,
        -0.0,
        1.0,
        -1.0,
        448.0,
        464.0,
        465.0,
        240.0,
        248.0,
        57344.0,
        61440.0,
        65504.0,
        65520.0,
        2.0**-9,
        2.0**-10,
        1.5 * 2.0**-9,
        2.0**-24,
        2.0**-25,
        2.0**-133,
        3.3895314e38,
        3.4e38,
        np.inf,
        -np.inf,
        np.nan,
        1e-45,
        1e-39,
    ],
    np.float32,
)


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float8_e4m3", "float8_e4m3fn", "float8_e5m2"])
def test_output_cast_through_instructions(dev, name):
    """tensor_copy (VectorE) and tensor_scalar (GpSimd) round their fp32 results like ml_dtypes."""
    rng = np.random.default_rng(7)
    bits_ = rng.integers(0, 2**32, size=128 * 64 - EDGE.size, dtype=np.uint32)
    x = np.concatenate([EDGE, bits_.view(np.float32)]).reshape(128, 64)
    dt = FLOATS[name]
    want = x.astype(dt)

    def body(p, a, o1, o2):
        p.tensor_copy(dst=o1, src=a)
        p.tensor_scalar(dst=o2, data=a, op0="multiply", operand0=1.0, engine="gpsimd")

    got1, got2 = run_op(dev, [x], [((128, 64), dt), ((128, 64), dt)], body)
    for got in (got1, got2):
        nan = np.isnan(want.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
        assert_bits_equal(got[~nan], want[~nan])


def test_device_fp8_saturate_through_instruction():
    dev = t3.Device(fp8_overflow="saturate")
    x = np.array([[500.0, -1e6, 300.0, np.inf, 100.0, -470.0, 464.0, 1e30]], np.float32)
    (got,) = run_op(dev, [x], [((1, 8), ml_dtypes.float8_e4m3fn)], lambda p, a, o: p.tensor_copy(dst=o, src=a))
    want = np.array([[448, -448, 288, np.nan, 96, -448, 448, 448]], np.float32).astype(ml_dtypes.float8_e4m3fn)
    assert_bits_equal(got, want)


def test_bad_numerics_options_raise():
    with pytest.raises(t3.EmuError, match="rounding"):
        t3.Device(rounding="up")
    with pytest.raises(t3.EmuError, match="fp8_overflow"):
        t3.Device(fp8_overflow="clip")
    with pytest.raises(t3.EmuError, match="sr_bits"):
        t3.Device(sr_bits=0)


@pytest.mark.parametrize(
    "dt", [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3]
)
def test_transpose_mode_keeps_narrow_dtypes_in_psum(dev, dt):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256 ** np.dtype(dt).itemsize, size=(64, 48), dtype=np.uint64)
    x = x.astype({1: np.uint8, 2: np.uint16}[np.dtype(dt).itemsize]).view(dt)
    eye = np.eye(64, dtype=np.float32).astype(dt)

    def body(p, a, ident, o1, o2):
        p.nc_matmul(dst=o1, stationary=a, moving=ident, is_transpose=True)
        p.nc_transpose(dst=o2, data=a, engine="tensor")

    o1, o2 = run_op(dev, [x, eye], [Out((48, 64), dt, "psum"), Out((48, 64), dt, "psum")], body)
    assert_bits_equal(o1, np.ascontiguousarray(x.T))
    assert_bits_equal(o2, np.ascontiguousarray(x.T))


def test_matmul_non_transpose_rejects_narrow_psum(dev):
    p = t3.Program()
    a = p.sbuf((32, 32), ml_dtypes.bfloat16)
    o = p.psum((32, 32), np.float16)
    with pytest.raises(t3.DtypeError, match="float32 or bfloat16"):
        p.nc_matmul(dst=o, stationary=a, moving=a)


# ------------------------------------------------------------------------------- x4 pack helpers


def test_pack_x4_fp8_bit_layout():
    codes = np.arange(32, dtype=np.uint8).reshape(2, 16)
    vals = codes.view(ml_dtypes.float8_e4m3fn)
    w = pack_x4(vals, "float8_e4m3fn_x4")
    assert w.dtype == np.uint32 and w.shape == (2, 4)
    c = codes.astype(np.uint32).reshape(2, 4, 4)
    want = c[..., 0] | (c[..., 1] << 8) | (c[..., 2] << 16) | (c[..., 3] << 24)
    assert np.array_equal(w, want)
    back = unpack_x4(w, "float8_e4m3fn_x4")
    assert_bits_equal(back, vals)


def test_pack_x4_fp4_bit_layout_and_rounding():
    vals = np.array([[0.5, 1.0, -6.0, 0.25, 7.0, 2.5, -0.0, 3.0]], np.float32)
    w = pack_x4(vals, "float4_e2m1fn_x4")
    assert w.dtype == np.uint16 and w.shape == (1, 2)
    # E2M1 codes: 0.5->1, 1->2, -6->0xF, 0.25->0 (tie to even), 7->7 (saturate), 2.5->4 (2), -0->8, 3->5
    codes = [1, 2, 0xF, 0, 7, 4, 8, 5]
    want = [
        codes[0] | codes[1] << 4 | codes[2] << 8 | codes[3] << 12,
        codes[4] | codes[5] << 4 | codes[6] << 8 | codes[7] << 12,
    ]
    assert w.tolist() == [want]
    back = unpack_x4(w, "float4_e2m1fn_x4").astype(np.float32)
    assert back.tolist() == [[0.5, 1.0, -6.0, 0.0, 6.0, 2.0, -0.0, 3.0]]


def test_pack_x4_rejects_bad_input():
    with pytest.raises(t3.DtypeError):
        pack_x4(np.zeros((2, 3), np.float32), "float8_e5m2_x4")
    with pytest.raises(t3.DtypeError):
        unpack_x4(np.zeros(2, np.uint32), "bfloat16")


@pytest.mark.parametrize("name", list(FLOATS))
def test_every_code_decodes_exactly_through_tensor_copy(dev, name):
    """All 2^8 / 2^16 codes of each type, widened to fp32 by VectorE tensor_copy."""
    dt = np.dtype(FLOATS[name])
    n = 1 << (8 * dt.itemsize)
    x = np.arange(n, dtype=np.uint32).astype(UINT[dt.itemsize]).view(dt).reshape(128, -1)
    (got,) = run_op(dev, [x], [(x.shape, np.float32)], lambda p, a, o: p.tensor_copy(dst=o, src=a))
    want = x.astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert_bits_equal(got[~nan], want[~nan])


@pytest.mark.skipif(
    not __import__("os").environ.get("TRN3EMU_EXHAUSTIVE"),
    reason="all 2^32 fp32 inputs per type (about a minute each): set TRN3EMU_EXHAUSTIVE=1",
)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", list(FLOATS))
def test_fp32_to_float_exhaustive_vs_ml_dtypes(name):
    dt = np.dtype(FLOATS[name])
    chunk = 1 << 24
    for c in range((1 << 32) // chunk):
        u = np.arange(c * chunk, (c + 1) * chunk, dtype=np.uint64).astype(np.uint32)
        got = _native.convert_from_f32(name, u)
        want = u.view(np.float32).astype(dt).view(UINT[dt.itemsize]).astype(np.uint32)
        if name == "float16":  # documented difference 1: canonical NaN
            nan = (u & 0x7FFFFFFF) > 0x7F800000
            want[nan] = 0x7E00 | ((u[nan] >> 16) & 0x8000)
        assert np.array_equal(got, want), f"chunk {c}"


def test_raw_conversion_helpers_reject_bad_arrays_with_project_errors():
    from trn3emu import _native

    bits = np.arange(8, dtype=np.uint32)
    with pytest.raises(t3.ValidationError) as e:
        _native.convert_from_f32("bfloat16", bits[::2])  # not contiguous
    assert e.value.operand == "bits"
    with pytest.raises(t3.ValidationError) as e:
        _native.convert_to_f32("bfloat16", bits, out=np.zeros(16, np.float32)[::2])
    assert e.value.operand == "out"
    with pytest.raises(t3.DtypeError):
        _native.convert_to_f32("bfloat17", bits)
    with pytest.raises(t3.ValidationError) as e:
        _native.Device().hbm_write(0, np.zeros(8, np.uint8)[::2])
    assert e.value.operand == "data"
