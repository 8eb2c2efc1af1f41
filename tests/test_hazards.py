"""The simulator-fix hazard list (reference nki-kernels.md §4.4) items not covered next to their
instruction's tests: one named test per item, `test_hazard_<version>_<what>`, each against a
numpy or hand-computed reference. (The others: `grep -rn "def test_hazard" tests/`.)"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
import trn3emu.nki as tn
from conftest import BF16, Out, assert_bits_equal, run_op

F32 = np.float32
tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

# ------------------------------------------------------------------------------ nc_matmul shapes


def small_ints(rng, shape, dtype=BF16):
    """Small integers: every product and partial sum is exact in fp32, so results are bit-exact."""
    return rng.integers(-4, 5, size=shape).astype(F32).astype(dtype)


def test_hazard_0_4_nc_matmul_3d_operands_keep_all_dims(dev, rng):
    """stationary [K, 2, 8] and moving [K, 4, 6] flatten their free dims (M = 16, N = 24); a 3-D
    dst [16, 4, 6] gets every element (0.4 fix: dims were dropped)."""
    K = 32
    a = small_ints(rng, (K, 2, 8))
    b = small_ints(rng, (K, 4, 6))
    want = np.einsum("kxy,kuv->xyuv", a.astype(np.float64), b.astype(np.float64)).reshape(16, 4, 6).astype(F32)
    (got,) = run_op(
        dev,
        [a.reshape(K, 16), b.reshape(K, 24)],
        [Out((16, 24), F32, "psum")],
        lambda p, x, y, o: p.nc_matmul(
            dst=o.reshape((16, 4, 6)), stationary=x.reshape((K, 2, 8)), moving=y.reshape((K, 4, 6))
        ),
    )
    assert_bits_equal(got.reshape(16, 4, 6), want)


def test_hazard_0_5_nc_matmul_conv_pattern_gt2d_operands(dev, rng):
    """A 3x3 'valid' conv as 9 accumulating matmuls whose moving operand is a strided 3-D window
    [Cin, Ho, Wo] of the input [Cin, H, W], into a 3-D PSUM tile [Cout, Ho, Wo]."""
    cin, cout, H, W = 8, 16, 6, 7
    ho, wo = H - 2, W - 2
    x = small_ints(rng, (cin, H, W))
    w = small_ints(rng, (cin, 3, 3, cout))
    want = np.zeros((cout, ho, wo))
    for dy in range(3):
        for dx in range(3):
            want += np.einsum(
                "co,chw->ohw", w[:, dy, dx].astype(np.float64), x[:, dy : dy + ho, dx : dx + wo].astype(np.float64)
            )

    def body(p, xt, wt, o):
        x3 = xt.reshape((cin, H, W))
        w3 = wt.reshape((cin, 9, cout))
        o3 = o.reshape((cout, ho, wo))
        for t in range(9):
            dy, dx = divmod(t, 3)
            p.nc_matmul(dst=o3, stationary=w3[:, t, :], moving=x3[:, dy : dy + ho, dx : dx + wo], accumulate=t > 0)

    (got,) = run_op(dev, [x.reshape(cin, H * W), w.reshape(cin, 9 * cout)], [Out((cout, ho * wo), F32, "psum")], body)
    assert_bits_equal(got.reshape(cout, ho, wo), want.astype(F32))


def test_hazard_0_6_overlapping_psum_accumulation_conv_pattern(dev, rng):
    """accumulate=None: a second matmul whose dst overlaps the first's accumulates on the overlap and
    overwrites elsewhere; PSUM columns no matmul touched keep their memset value."""
    K, M = 16, 8
    a1, a2 = small_ints(rng, (K, M)), small_ints(rng, (K, M))
    b1, b2 = small_ints(rng, (K, 8)), small_ints(rng, (K, 8))
    r1 = (a1.astype(np.float64).T @ b1.astype(np.float64)).astype(F32)
    r2 = (a2.astype(np.float64).T @ b2.astype(np.float64)).astype(F32)
    want = np.full((M, 16), 100.0, F32)  # memset is not a matmul write: the first matmul overwrites it
    want[:, 0:8] = r1
    want[:, 4:12] = np.concatenate([r1[:, 4:8] + r2[:, 0:4], r2[:, 4:8]], axis=1)

    def body(p, x1, x2, y1, y2, o):
        p.nc_matmul(dst=o[:, 0:8], stationary=x1, moving=y1)
        p.nc_matmul(dst=o[:, 4:12], stationary=x2, moving=y2)

    with pytest.warns(t3.AccumulateWarning, match="nc_matmul #"):
        (got,) = run_op(dev, [a1, a2, b1, b2], [Out((M, 16), F32, "psum", fill=100.0)], body)
    assert_bits_equal(got, want)


def test_hazard_0_6_warning_on_accumulate_patterns_that_fail_on_hardware():
    """The 0.6 simulator warns on accumulate patterns hardware cannot do. Here: an accumulate=None
    matmul whose dst is partly matmul-written (one hardware flag cannot add on part and overwrite
    the rest) warns with AccumulateWarning; fresh, fully-written and explicit-flag dsts do not."""
    import warnings

    p = t3.Program()
    a, b = p.sbuf((16, 8), BF16), p.sbuf((16, 8), BF16)
    o = p.psum((8, 16), F32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p.nc_matmul(dst=o[:, 0:8], stationary=a, moving=b)  # fresh: overwrite
        p.nc_matmul(dst=o[:, 0:8], stationary=a, moving=b)  # fully written: accumulate
        p.nc_matmul(dst=o[:, 4:12], stationary=a, moving=b, accumulate=True)  # explicit flag
    n = len(p)
    with pytest.warns(t3.AccumulateWarning) as rec:
        p.nc_matmul(dst=o[:, 8:16], stationary=a, moving=b)  # 8:12 written, 12:16 fresh
    assert len(rec) == 1 and f"#{n}" in str(rec[0].message)
    assert rec[0].filename == __file__  # points at the kernel's line
    o2 = p.psum((8, 16), F32)
    p.nc_matmul(dst=o2[:, 0:8], stationary=a, moving=b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(t3.AccumulateWarning):
            p.nc_matmul(dst=o2[:, 4:12], stationary=a, moving=b)
    assert len(p) == n + 2  # refused under warnings-as-errors: not appended


def test_hazard_0_6_double_row_result_size(dev, rng):
    """double_row [K, 2, M] x [K, 2, N] writes exactly [M, N] (not [2M, N] / [M, 2N]): the columns
    next to it keep their value, and a dst of the doubled size is refused."""
    K, M, N = 32, 8, 16
    fp8 = ml_dtypes.float8_e4m3fn
    a = small_ints(rng, (K, 2, M), fp8)
    b = small_ints(rng, (K, 2, N), fp8)
    want = np.full((M, 2 * N), -1.0, F32)
    want[:, :N] = np.einsum("kli,klj->ij", a.astype(np.float64), b.astype(np.float64))
    (got,) = run_op(
        dev,
        [a.reshape(K, 2 * M), b.reshape(K, 2 * N)],
        [Out((M, 2 * N), F32, "psum", fill=-1.0)],
        lambda p, x, y, o: p.nc_matmul(
            dst=o[:, 0:N], stationary=x.reshape((K, 2, M)), moving=y.reshape((K, 2, N)), perf_mode="double_row"
        ),
    )
    assert_bits_equal(got, want)
    p = t3.Program()
    x, y = p.sbuf((K, 2 * M), fp8), p.sbuf((K, 2 * N), fp8)
    with pytest.raises(t3.ShapeError):
        p.nc_matmul(
            dst=p.psum((M, 2 * N), F32),
            stationary=x.reshape((K, 2, M)),
            moving=y.reshape((K, 2, N)),
            perf_mode="double_row",
        )


# ------------------------------------------------------------------------------------------ MX
X4_ELEM = {
    "float8_e4m3fn_x4": ml_dtypes.float8_e4m3fn,
    "float8_e5m2_x4": ml_dtypes.float8_e5m2,
    "float4_e2m1fn_x4": ml_dtypes.float4_e2m1fn,
}


def pack_x4(vals: np.ndarray, dtype: str) -> np.ndarray:
    """[P, F, 4] exactly representable floats -> x4 words (element q in byte / nibble q)."""
    codes = vals.astype(X4_ELEM[dtype]).view(np.uint8)
    if dtype == "float4_e2m1fn_x4":
        c = codes.astype(np.uint16) & 0xF
        return c[..., 0] | c[..., 1] << 4 | c[..., 2] << 8 | c[..., 3] << 12
    c = codes.astype(np.uint32)
    return c[..., 0] | c[..., 1] << 8 | c[..., 2] << 16 | c[..., 3] << 24


def scale_tile(dense: np.ndarray, parts: int, off: int) -> np.ndarray:
    """Dense scale rows r (one per 8 partitions) at partition off + 32*(r//4) + r%4 (quadrant layout)."""
    t = np.zeros((parts, dense.shape[1]), np.uint8)
    for r in range(dense.shape[0]):
        t[off + 32 * (r // 4) + r % 4] = dense[r]
    return t


def run_quantize(dev, x, sc_parts, off):
    p = t3.Program()
    src = p.sbuf(x.shape, x.dtype)
    p.dma_copy(dst=src, src=dev.hbm.put(x))
    dst = p.sbuf((x.shape[0], x.shape[1] // 4), "float8_e4m3fn_x4")
    sc = p.sbuf((sc_parts, x.shape[1] // 4), np.uint8)
    p.memset(dst=sc, value=0)
    p.quantize_mx(dst=dst, src=src, dst_scale=sc[off:] if off else sc)
    hw, hs = dev.hbm.alloc(dst.shape, "float8_e4m3fn_x4"), dev.hbm.alloc(sc.shape, np.uint8)
    p.dma_copy(dst=hw, src=dst)
    p.dma_copy(dst=hs, src=sc)
    dev.run(p)
    return dev.hbm.get(hw), dev.hbm.get(hs)


def test_hazard_0_4_quantize_mx_writes_float8_e4m3fn_x4(dev, rng):
    """Every 8x4 group has |max| in [128, 256): the NKI rule gives scale 2^0 (code 127), so the data
    bytes are the inputs themselves as float8_e4m3fn, four per little-endian word."""
    P, F = 32, 16
    v = rng.choice(np.array([0, 1, -2, 3.5, -12, 40, 96, -104], F32), size=(P, F))
    v.reshape(P // 8, 8, F // 4, 4)[:, 0, :, 0] = 176.0  # one element of every group sets the max
    words, scales = run_quantize(dev, v.astype(BF16), P, 0)
    assert_bits_equal(words, pack_x4(v.reshape(P, F // 4, 4), "float8_e4m3fn_x4").astype(np.uint32))
    assert_bits_equal(scales, scale_tile(np.full((P // 8, F // 4), 127, np.uint8), P, 0))


@pytest.mark.parametrize("dtype", list(X4_ELEM))
def test_hazard_0_4_mx_x4_dtypes_usable_on_trn3(dtype):
    """Each x4 dtype round-trips HBM <-> SBUF bit-exactly and multiplies on nc_matmul_mx on the
    (trn3) device; unit scales and small integers make the product exact."""
    dev = t3.Device()
    rng = np.random.default_rng(3)
    P, M, N = 32, 8, 12
    sv = rng.choice(np.array([0, 1, -1, 2, -4, 0.5], F32), size=(P, M, 4))
    mv = rng.choice(np.array([0, 1, -1, 2, -3, 1.5], F32), size=(P, N, 4))
    sw, mw = pack_x4(sv, dtype), pack_x4(mv, dtype)
    want = np.einsum("pmq,pnq->mn", sv.astype(np.float64), mv.astype(np.float64)).astype(F32)
    ones = scale_tile(np.full((P // 8, max(M, N)), 127, np.uint8), P, 0)
    p = t3.Program()
    st, mt = p.sbuf((P, M), dtype), p.sbuf((P, N), dtype)
    p.dma_copy(dst=st, src=dev.hbm.put(sw, dtype=dtype))
    p.dma_copy(dst=mt, src=dev.hbm.put(mw, dtype=dtype))
    back = dev.hbm.alloc((P, M), dtype)
    p.dma_copy(dst=back, src=st)
    sc = p.sbuf(ones.shape, np.uint8)
    p.dma_copy(dst=sc, src=dev.hbm.put(ones))
    acc = p.psum((M, N), F32)
    p.nc_matmul_mx(dst=acc, stationary=st, moving=mt, stationary_scale=sc[:, 0:M], moving_scale=sc[:, 0:N])
    res = p.sbuf((M, N), F32)
    p.tensor_copy(dst=res, src=acc)
    out = dev.hbm.alloc((M, N), F32)
    p.dma_copy(dst=out, src=res)
    dev.run(p)
    assert np.array_equal(dev.hbm.get(back), sw)
    assert_bits_equal(dev.hbm.get(out), want)


@pytest.mark.parametrize("off", [4, 8, 12])
def test_hazard_0_6_sliced_mx_scale_buffers(dev, off):
    """quantize_mx and nc_matmul_mx with scale operands that are slices starting at partition 4/8/12
    of a larger tile: quantize writes only rows off..off+3, matmul reads its scales from there."""
    P, F = 32, 8
    rng = np.random.default_rng(off)
    codes = rng.integers(124, 131, size=(P // 8, F // 4))  # one power of two per 8x4 group
    mant = rng.choice(np.array([1, -1.5, 1.75, -1.25, 0.5], F32), size=(P, F))
    x = mant * np.exp2(np.repeat(np.repeat(codes - 127 + 8, 8, 0), 4, 1)).astype(F32)
    x.reshape(P // 8, 8, F // 4, 4)[:, 0, :, 0] = np.exp2(codes - 119.0) * 1.75  # the group max
    words, scales = run_quantize(dev, x.astype(BF16), 32, off)
    # NKI rule (e4m3fn, emax 8): code = floor(log2 max) + 127 - 7.
    want_codes = (np.floor(np.log2(np.abs(x).reshape(P // 8, 8, F // 4, 4).max(axis=(1, 3)))) + 127 - 7).astype(
        np.uint8
    )
    assert_bits_equal(scales, scale_tile(want_codes, 32, off))
    q = (x / np.repeat(np.repeat(np.exp2(want_codes.astype(np.float64) - 127), 8, 0), 4, 1)).astype(F32)
    assert_bits_equal(words, pack_x4(q.reshape(P, F // 4, 4), "float8_e4m3fn_x4").astype(np.uint32))

    # nc_matmul_mx reading scales from the same kind of slice.
    M, N = F // 4, 6
    mv = rng.choice(np.array([0, 1, -2, 0.5], F32), size=(P, N, 4))
    ms = np.full((P // 8, N), 126, np.uint8)  # 2^-1
    want = np.einsum(
        "pmq,pnq->mn", q.reshape(P, M, 4) * np.repeat(np.exp2(want_codes - 127.0), 8, 0)[..., None], mv * 0.5
    ).astype(F32)
    p = t3.Program()
    st, mt = p.sbuf((P, M), "float8_e4m3fn_x4"), p.sbuf((P, N), "float8_e4m3fn_x4")
    p.dma_copy(dst=st, src=dev.hbm.put(words, dtype="float8_e4m3fn_x4"))
    p.dma_copy(dst=mt, src=dev.hbm.put(pack_x4(mv, "float8_e4m3fn_x4"), dtype="float8_e4m3fn_x4"))
    ss, mst = p.sbuf((32, M), np.uint8), p.sbuf((32, N), np.uint8)
    p.dma_copy(dst=ss, src=dev.hbm.put(scale_tile(want_codes, 32, off)))
    p.dma_copy(dst=mst, src=dev.hbm.put(scale_tile(ms, 32, off)))
    acc = p.psum((M, N), F32)
    p.nc_matmul_mx(dst=acc, stationary=st, moving=mt, stationary_scale=ss[off:], moving_scale=mst[off:])
    res = p.sbuf((M, N), F32)
    p.tensor_copy(dst=res, src=acc)
    out = dev.hbm.alloc((M, N), F32)
    p.dma_copy(dst=out, src=res)
    dev.run(p)
    assert_bits_equal(dev.hbm.get(out), want)


# ------------------------------------------------------------------------------ NKI front end


def _binary_kernel(fn):
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        y = nl.ndarray(b.shape, b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=b)
        nisa.dma_copy(dst=out, src=fn(x, y))
        return out

    return kernel


def test_hazard_0_4_nl_logical_and_through_frontend():
    """nl.logical_and lowers to tensor_tensor(logical_and): 1.0 where both are nonzero (NaN counts
    as nonzero, -0.0 as zero), else 0.0."""
    a = np.array([[0, 1, 2, -3.5, 0, np.nan, -0.0, 7]], F32).repeat(4, 0)
    b = np.array([[0, 0, 5, 1, -2, 1, 1, np.inf]], F32).repeat(4, 0)
    k = _binary_kernel(nl.logical_and)
    got = k(a, b)
    assert_bits_equal(got, np.logical_and(a != 0, b != 0).astype(F32))
    assert "op=logical_and" in k.last_programs[0].to_text()


def test_hazard_nl_divide_is_lowered_to_vector_tensor_tensor_divide(rng):
    """nl.divide is not an activation function; the front end lowers it to VectorE
    tensor_tensor(op=divide), which is correctly rounded fp32 division (= numpy float32 /)."""
    a = rng.standard_normal((8, 32)).astype(F32)
    b = rng.standard_normal((8, 32)).astype(F32)
    b[0, :4] = [0.0, -0.0, np.inf, 3.0]
    a[0, :4] = [1.0, 1.0, 2.0, 0.0]
    k = _binary_kernel(nl.divide)
    with np.errstate(divide="ignore"):
        want = a / b
    assert_bits_equal(k(a, b), want)
    assert "tensor_tensor.vector" in k.last_programs[0].to_text()


def test_hazard_nl_copy_int32_above_2_pow_24():
    """The hardware compiler lowers nl.copy through the ScalarE fp32 path (lossy for |int32| > 2^24).
    This front end lowers it to VectorE tensor_copy, a bit-exact copy for same-dtype int32 — so
    kernels get exact values here; the lossy ScalarE path is `activation(copy)` (see
    test_hazard_activation_copy_int32_is_fp32_lossy)."""

    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=out, src=nl.copy(t))
        return out

    a = np.array([[2**24 + 1, 2**31 - 1, -(2**24) - 3, 7, -(2**31), 123456789]], np.int32).repeat(2, 0)
    assert_bits_equal(kernel(a), a)
    assert "tensor_copy.vector" in kernel.last_programs[0].to_text()


# ---------------------------------------------------------------------------------- selects


@pytest.mark.parametrize("dt", [F32, BF16])
def test_hazard_range_select_default_on_false_value(dev, rng, dt):
    """Without on_false_value the fill is FP32_MIN (-3.4028235e38, what the compiler forces); cast
    to bf16 it rounds to -inf (NKI's documented default). The max read-out ignores the fill."""
    P, F = 8, 16
    x = rng.standard_normal((P, F)).astype(F32)
    lo = np.arange(P, dtype=F32).reshape(P, 1)
    hi = lo + 5

    def body(p, xt, lo_t, hi_t, o, r):
        p.range_select(
            dst=o, on_true_tile=xt, comp_op0="greater_equal", comp_op1="less", bound0=lo_t, bound1=hi_t, reduce_res=r
        )

    got, red = run_op(dev, [x, lo, hi], [((P, F), dt), ((P, 1), F32)], body)
    j = np.arange(F)[None, :]
    keep = (j >= lo) & (j < hi)
    want = np.where(keep, x, np.float32(-3.4028235e38)).astype(dt)
    assert_bits_equal(got, want)
    if dt == BF16:
        assert np.all(np.isneginf(got[~keep].astype(F32)))
    assert_bits_equal(red, np.where(keep, x, -np.inf).max(axis=1, keepdims=True).astype(F32))


# ------------------------------------------------------------------ register offsets, warnings


def _register_offset_program(dev, x, reg_init):
    """gpsimd: r = reg_init; iota(offset=r); affine_select(offset=r). Returns (program, out handles)."""
    P, F = x.shape
    p = t3.Program()
    xt = p.sbuf((P, F), F32)
    p.dma_copy(dst=xt, src=dev.hbm.put(x))
    o1, o2 = p.sbuf((P, F), np.int32), p.sbuf((P, F), F32)
    r = p.register_alloc(init=reg_init, engine="gpsimd")
    p.iota(dst=o1, pattern=[[1, F]], offset=r, channel_multiplier=F, engine="gpsimd")
    p.affine_select(
        dst=o2,
        pattern=[[-1, F]],
        channel_multiplier=1,
        on_true_tile=xt,
        on_false_value=0.0,
        cmp_op="greater_equal",
        offset=r,
        engine="gpsimd",
    )
    h1, h2 = dev.hbm.alloc((P, F), np.int32), dev.hbm.alloc((P, F), F32)
    p.dma_copy(dst=h1, src=o1)
    p.dma_copy(dst=h2, src=o2)
    return p, h1, h2


@pytest.mark.parametrize("via", ["program", "text", "binary"])
def test_hazard_0_4_iota_affine_select_dynamic_register_offset(rng, via):
    """0.4 fix: iota / affine_select take their offset from a register of the issuing engine
    (GpSimd), read at run time; the operand survives the text and binary round trips."""
    P, F = 8, 16
    x = rng.standard_normal((P, F)).astype(F32)
    for init in (5, -7):
        dev = t3.Device()
        p, h1, h2 = _register_offset_program(dev, x, init)
        assert "offset=r0" in p.to_text()
        if via == "text":
            p = t3.Program.from_text(p.to_text(), sync="auto")
        elif via == "binary":
            p = t3.Program.decode(p.encode(), sync="auto")
        dev.run(p)
        val = init + F * np.arange(P)[:, None] + np.arange(F)[None, :]
        assert_bits_equal(dev.hbm.get(h1), val.astype(np.int32))
        keep = init + np.arange(P)[:, None] - np.arange(F)[None, :] >= 0
        assert_bits_equal(dev.hbm.get(h2), np.where(keep, x, F32(0)))


def test_hazard_0_4_register_offset_only_where_the_isa_allows_it():
    """A register is refused for a plain i32 operand (channel_multiplier), naming the operand;
    an out-of-range register in text is refused too."""
    p = t3.Program()
    o = p.sbuf((4, 8), np.int32)
    r = p.register_alloc()
    with pytest.raises(t3.EmuError, match="channel_multiplier"):
        p.iota(dst=o, pattern=[[1, 8]], offset=0, channel_multiplier=r)
    with pytest.raises(t3.EmuError):
        t3.Program.from_text(".core 0\niota.gpsimd dst=sbuf:int32[0:4]+0[[1,8]] pattern=[[1,8]] offset=r99\n")
