"""MX: quantize_mx and nc_matmul_mx against an independent numpy implementation of the formulas
(reference §1.6, numerics §2/§4): scale bytes and data bytes exact; matmul bit-exact where every
partial sum is exact, within accumulation-order tolerance otherwise; an MXFP8 kernel end to end."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3

ELEM = {
    "float8_e4m3fn_x4": (ml_dtypes.float8_e4m3fn, 8, 448.0),
    "float8_e5m2_x4": (ml_dtypes.float8_e5m2, 15, 57344.0),
}


# ----------------------------------------------------------------------- independent references


def ref_quantize(x: np.ndarray, dtype: str, rule: str = "nki") -> tuple[np.ndarray, np.ndarray]:
    """(words uint32 [P, F/4], dense scale codes uint8 [P/8, F/4]) from the formulas."""
    el, emax, maxv = ELEM[dtype]
    x = x.astype(np.float32)
    p, f = x.shape
    g = np.abs(x.astype(np.float64)).reshape(p // 8, 8, f // 4, 4)
    amax = g.max(axis=(1, 3))
    _, e = np.frexp(amax)  # amax = m * 2^e, m in [0.5, 1)  =>  floor(log2 amax) = e - 1
    shift = emax - 1 if rule == "nki" else emax
    code = np.where(amax == 0, 0, np.clip(e - 1 + 127 - shift, 0, 254)).astype(np.int64)
    scale = np.exp2(code.astype(np.float64) - 127)
    full = np.repeat(np.repeat(scale, 8, axis=0), 4, axis=1)
    q = np.clip(x.astype(np.float64) / full, -maxv, maxv).astype(np.float32).astype(el)
    words = np.ascontiguousarray(q.view(np.uint8)).reshape(p, f // 4, 4).astype(np.uint32)
    words = words[..., 0] | words[..., 1] << 8 | words[..., 2] << 16 | words[..., 3] << 24
    return words.astype(np.uint32), code.astype(np.uint8)


def place_scales(dense: np.ndarray, parts: int, off: int = 0) -> np.ndarray:
    """Dense [R, F] scale rows -> a [parts, F] tile in the quadrant layout at offset `off`."""
    t = np.zeros((parts, dense.shape[1]), np.uint8)
    for r in range(dense.shape[0]):
        t[off + 32 * (r // 4) + r % 4] = dense[r]
    return t


def decode_words(words: np.ndarray, dtype: str) -> np.ndarray:
    """x4 words [P, F] -> float64 [P, F, 4]."""
    if dtype == "float4_e2m1fn_x4":
        w = words.astype(np.uint16)
        codes = np.stack([(w >> (4 * i)) & 0xF for i in range(4)], axis=-1).astype(np.uint8)
        return codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    el = ELEM[dtype][0]
    b = np.stack([(words >> (8 * i)) & 0xFF for i in range(4)], axis=-1).astype(np.uint8)
    return b.view(el).astype(np.float64)


def ref_matmul(sw, sdt, ss, mw, mdt, ms) -> np.ndarray:
    """dst[m, n] = sum_p sum_q S[p,m,q] 2^(sS[p//8,m]-127) * M[p,n,q] 2^(sM[p//8,n]-127), in f64."""
    S = decode_words(sw, sdt) * np.exp2(np.repeat(ss.astype(np.float64), 8, axis=0) - 127)[..., None]
    M = decode_words(mw, mdt) * np.exp2(np.repeat(ms.astype(np.float64), 8, axis=0) - 127)[..., None]
    return np.einsum("pmq,pnq->mn", S, M)


# ----------------------------------------------------------------------------------- harness


def run_quantize(dev, x, dtype, parts_alloc=None, off=0):
    p_, f = x.shape
    p = t3.Program()
    h = dev.hbm.put(x)
    src = p.sbuf(x.shape, x.dtype)
    p.dma_copy(dst=src, src=h)
    dst = p.sbuf((p_, f // 4), dtype)
    sc_tile = p.sbuf((parts_alloc or p_, f // 4), np.uint8)
    p.memset(dst=sc_tile, value=0)
    p.quantize_mx(dst=dst, src=src, dst_scale=sc_tile[off:] if off else sc_tile)
    ho = dev.hbm.alloc(dst.shape, dtype)  # x4 words come back as raw uint32
    hs = dev.hbm.alloc(sc_tile.shape, np.uint8)
    p.dma_copy(dst=ho, src=dst)
    p.dma_copy(dst=hs, src=sc_tile)
    dev.run(p)
    return dev.hbm.get(ho), dev.hbm.get(hs)


def run_matmul(dev, sw, sdt, ss_tile, mw, mdt, ms_tile, dst_dtype=np.float32, accumulate=False, pre=None, tile=None):
    p = t3.Program()
    words_np = {"float4_e2m1fn_x4": np.uint16}.get(sdt, np.uint32)
    st = p.sbuf(sw.shape, sdt)
    p.dma_copy(dst=st, src=dev.hbm.put(sw.astype(words_np), dtype=sdt))
    mv = p.sbuf(mw.shape, mdt)
    p.dma_copy(dst=mv, src=dev.hbm.put(mw.astype({"float4_e2m1fn_x4": np.uint16}.get(mdt, np.uint32)), dtype=mdt))
    sst = p.sbuf(ss_tile.shape, np.uint8)
    p.dma_copy(dst=sst, src=dev.hbm.put(ss_tile))
    mst = p.sbuf(ms_tile.shape, np.uint8)
    p.dma_copy(dst=mst, src=dev.hbm.put(ms_tile))
    out = p.psum((sw.shape[1], mw.shape[1]), dst_dtype)
    if pre is not None:
        p.memset(dst=out, value=pre)
    kw = {"tile_position": tile[0], "tile_size": tile[1]} if tile else {}
    p.nc_matmul_mx(
        dst=out, stationary=st, moving=mv, stationary_scale=sst, moving_scale=mst, accumulate=accumulate, **kw
    )
    res = p.sbuf(out.shape, dst_dtype)
    p.tensor_copy(dst=res, src=out)
    h = dev.hbm.alloc(out.shape, dst_dtype)
    p.dma_copy(dst=h, src=res)
    dev.run(p)
    return dev.hbm.get(h)


# ------------------------------------------------------------------------------------ quantize


@pytest.mark.parametrize("dtype", list(ELEM))
@pytest.mark.parametrize("rule", ["nki", "ocp"])
@pytest.mark.parametrize("src_dt", [ml_dtypes.bfloat16, np.float16])
def test_quantize_mx_bytes_exact(dtype, rule, src_dt):
    rng = np.random.default_rng(5)
    p_, f = 128, 64
    # Per-group magnitudes spread over many binades, some all-zero groups, subnormal inputs.
    mag = np.exp2(rng.integers(-20, 12, size=(p_ // 8, f // 4))).repeat(8, 0).repeat(4, 1)
    x = (rng.normal(size=(p_, f)) * mag).astype(np.float32)
    x[0:8, 0:4] = 0.0
    x[8:16, 4:8] = -0.0
    if src_dt == np.float16:
        x = np.clip(x, -60000, 60000)
        x[16, 8] = 3e-6  # fp16 subnormal
    x = x.astype(src_dt)
    dev = t3.Device(mx_scale=rule)
    words, scales = run_quantize(dev, x, dtype)
    want_w, want_s = ref_quantize(x.astype(np.float32), dtype, rule)
    assert np.array_equal(scales, place_scales(want_s, p_)), "scale bytes"
    assert np.array_equal(words, want_w), "data bytes"


def test_quantize_mx_scale_offset_and_small_tiles():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(32, 16)).astype(ml_dtypes.bfloat16)
    words, scales = run_quantize(t3.Device(), x, "float8_e4m3fn_x4", parts_alloc=32, off=4)
    want_w, want_s = ref_quantize(x.astype(np.float32), "float8_e4m3fn_x4")
    assert np.array_equal(words, want_w)
    assert np.array_equal(scales, place_scales(want_s, 32, off=4))
    assert not scales[:4].any() and not scales[8:].any()


def test_quantize_mx_nki_rule_never_saturates_ocp_may():
    x = np.zeros((32, 4), np.float32)
    x[0, 0] = 1.8  # the reference's worked example (numerics §2.6): FLOOR clamps 1.8 to 448 * 2^-8
    x[1, 1] = 0.3
    x = x.astype(ml_dtypes.bfloat16)
    for rule, code, top in [("nki", 120, 224.0), ("ocp", 119, 448.0)]:
        words, scales = run_quantize(t3.Device(mx_scale=rule), x, "float8_e4m3fn_x4")
        assert scales[0, 0] == code
        v = decode_words(words, "float8_e4m3fn_x4")
        assert v[0, 0, 0] == top


def test_quantize_mx_rejects_bad_operands():
    p = t3.Program()
    src = p.sbuf((48, 16), ml_dtypes.bfloat16)
    dst = p.sbuf((48, 4), "float8_e4m3fn_x4")
    sc = p.sbuf((48, 4), np.uint8)
    with pytest.raises(t3.ShapeError, match="multiple of 32"):
        p.quantize_mx(dst=dst, src=src, dst_scale=sc)
    src = p.sbuf((32, 16), ml_dtypes.bfloat16)
    dst = p.sbuf((32, 4), "float8_e4m3fn_x4")
    sc = p.sbuf((32, 4), np.uint8)
    with pytest.raises(t3.PartitionError, match="quadrant offset"):
        p.quantize_mx(dst=dst, src=src, dst_scale=sc[2:])
    with pytest.raises(t3.ShapeError, match="one scale per x4 column"):
        p.quantize_mx(dst=dst, src=src, dst_scale=sc[:, 0:2])
    with pytest.raises(t3.DtypeError):
        p.quantize_mx(dst=p.sbuf((32, 4), "float4_e2m1fn_x4"), src=src, dst_scale=sc)


# -------------------------------------------------------------------------------------- matmul


def random_words(rng, shape, dtype, lo=-4, hi=4):
    """x4 words whose elements are small integers (exact in every element type)."""
    vals = rng.integers(lo, hi + 1, size=(*shape, 4)).astype(np.float32)
    if dtype == "float4_e2m1fn_x4":
        vals = np.clip(vals, -4, 4)
        vals[np.abs(vals) == 3] = 2
        c = vals.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).astype(np.uint16) & 0xF
        return c[..., 0] | c[..., 1] << 4 | c[..., 2] << 8 | c[..., 3] << 12
    b = vals.astype(ELEM[dtype][0]).view(np.uint8).astype(np.uint32)
    return b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24


@pytest.mark.parametrize(
    "sdt,mdt",
    [
        ("float8_e4m3fn_x4", "float8_e4m3fn_x4"),
        ("float8_e5m2_x4", "float8_e4m3fn_x4"),
        ("float8_e4m3fn_x4", "float4_e2m1fn_x4"),
        ("float4_e2m1fn_x4", "float4_e2m1fn_x4"),
    ],
)
@pytest.mark.parametrize("parts", [32, 128])
def test_matmul_mx_bit_exact_when_partial_sums_exact(sdt, mdt, parts):
    rng = np.random.default_rng(parts)
    m, n = 64, 96
    sw = random_words(rng, (parts, m), sdt)
    mw = random_words(rng, (parts, n), mdt)
    ss = rng.integers(125, 130, size=(parts // 8, m)).astype(np.uint8)  # 2^-2 .. 2^2
    ms = rng.integers(125, 130, size=(parts // 8, n)).astype(np.uint8)
    got = run_matmul(t3.Device(), sw, sdt, place_scales(ss, parts), mw, mdt, place_scales(ms, parts))
    want = ref_matmul(sw, sdt, ss, mw, mdt, ms)
    assert np.all(np.abs(want) < 2**20) and np.all(want * 16 == np.round(want * 16))  # exact in fp32
    assert np.array_equal(got, want.astype(np.float32))


def test_matmul_mx_bf16_psum_and_accumulate():
    rng = np.random.default_rng(9)
    sdt = mdt = "float8_e4m3fn_x4"
    sw, mw = random_words(rng, (64, 32), sdt), random_words(rng, (64, 48), mdt)
    ss = np.full((8, 32), 127, np.uint8)
    ms = np.full((8, 48), 126, np.uint8)
    want = ref_matmul(sw, sdt, ss, mw, mdt, ms)
    got = run_matmul(t3.Device(), sw, sdt, place_scales(ss, 64), mw, mdt, place_scales(ms, 64), ml_dtypes.bfloat16)
    assert np.array_equal(got.view(np.uint16), want.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16))
    acc = run_matmul(
        t3.Device(), sw, sdt, place_scales(ss, 64), mw, mdt, place_scales(ms, 64), np.float32, True, pre=1.5
    )
    assert np.array_equal(acc, (want + 1.5).astype(np.float32))


def test_matmul_mx_general_values_within_accumulation_tolerance():
    rng = np.random.default_rng(10)
    sdt, mdt = "float8_e5m2_x4", "float8_e4m3fn_x4"
    sb = rng.integers(0, 256, size=(128, 128, 4), dtype=np.uint32)
    sb[(sb & 0x7C) == 0x7C] &= 0x3F  # no Inf/NaN
    mb = rng.integers(0, 256, size=(128, 256, 4), dtype=np.uint32)
    mb[(mb & 0x7F) == 0x7F] = 0x3F
    sw = sb[..., 0] | sb[..., 1] << 8 | sb[..., 2] << 16 | sb[..., 3] << 24
    mw = mb[..., 0] | mb[..., 1] << 8 | mb[..., 2] << 16 | mb[..., 3] << 24
    ss = rng.integers(100, 140, size=(16, 128)).astype(np.uint8)
    ms = rng.integers(100, 140, size=(16, 256)).astype(np.uint8)
    got = run_matmul(t3.Device(), sw, sdt, place_scales(ss, 128), mw, mdt, place_scales(ms, 128))
    want = ref_matmul(sw, sdt, ss, mw, mdt, ms)
    S = np.abs(decode_words(sw, sdt) * np.exp2(np.repeat(ss.astype(float), 8, 0) - 127)[..., None])
    M = np.abs(decode_words(mw, mdt) * np.exp2(np.repeat(ms.astype(float), 8, 0) - 127)[..., None])
    bound = np.einsum("pmq,pnq->mn", S, M) * 128 * 2.0**-24 * 2  # 128 fp32 roundings (one per partition + adds)
    assert np.all(np.abs(got - want) <= bound)


def test_matmul_mx_nan_scale_poisons_block():
    rng = np.random.default_rng(11)
    sdt = mdt = "float8_e4m3fn_x4"
    sw, mw = random_words(rng, (32, 8), sdt), random_words(rng, (32, 8), mdt)
    ss = np.full((4, 8), 127, np.uint8)
    ss[2, 3] = 0xFF
    ms = np.full((4, 8), 127, np.uint8)
    got = run_matmul(t3.Device(), sw, sdt, place_scales(ss, 32), mw, mdt, place_scales(ms, 32))
    assert np.all(np.isnan(got[3])) and not np.any(np.isnan(np.delete(got, 3, axis=0)))


def test_matmul_mx_rejects_bad_operands():
    p = t3.Program()
    st = p.sbuf((32, 3), "float8_e4m3fn_x4")
    mv = p.sbuf((32, 8), "float8_e4m3fn_x4")
    ss = p.sbuf((32, 3), np.uint8)
    ms = p.sbuf((32, 8), np.uint8)
    out = p.psum((3, 8), np.float32)
    with pytest.raises(t3.ShapeError, match="even"):
        p.nc_matmul_mx(dst=out, stationary=st, moving=mv, stationary_scale=ss, moving_scale=ms)
    st = p.sbuf((32, 4), "float8_e4m3fn_x4")
    ss = p.sbuf((32, 4), np.uint8)
    out = p.psum((4, 8), np.float32)
    with pytest.raises(t3.EmuError, match="row tiling"):
        p.nc_matmul_mx(
            dst=out,
            stationary=st,
            moving=mv,
            stationary_scale=ss,
            moving_scale=ms,
            tile_position=(0, 32),
            tile_size=(32, 32),
        )
    with pytest.raises(t3.ShapeError, match="partitions"):
        p.nc_matmul_mx(
            dst=out, stationary=st, moving=p.sbuf((64, 8), "float8_e4m3fn_x4"), stationary_scale=ss, moving_scale=ms
        )


# ----------------------------------------------------------------------- MXFP8 kernel end to end


@pytest.mark.parametrize("dtype", list(ELEM))
def test_mxfp8_kernel_end_to_end(dtype):
    """bf16 A [K, M], B [K, N] -> quantize_mx on device -> nc_matmul_mx -> fp32; vs numpy of the
    quantised math. Logical row k = q * (K/4) + p sits at partition p, quad position q."""
    rng = np.random.default_rng(12)
    K, M, N = 512, 128, 256
    P = K // 4
    A = (rng.normal(size=(K, M)) * np.exp2(rng.integers(-3, 4, size=(1, M)))).astype(ml_dtypes.bfloat16)
    B = rng.normal(size=(K, N)).astype(ml_dtypes.bfloat16)
    # Interleave: src[p, 4j + q] = X[q*P + p, j]
    Ai = np.ascontiguousarray(A.reshape(4, P, M).transpose(1, 2, 0).reshape(P, 4 * M))
    Bi = np.ascontiguousarray(B.reshape(4, P, N).transpose(1, 2, 0).reshape(P, 4 * N))

    dev = t3.Device()
    p = t3.Program()
    a_s = p.sbuf(Ai.shape, ml_dtypes.bfloat16)
    b_s = p.sbuf(Bi.shape, ml_dtypes.bfloat16)
    p.dma_copy(dst=a_s, src=dev.hbm.put(Ai))
    p.dma_copy(dst=b_s, src=dev.hbm.put(Bi))
    aq = p.sbuf((P, M), dtype)
    bq = p.sbuf((P, N), dtype)
    scales = p.sbuf((P, M + N), np.uint8)
    p.quantize_mx(dst=aq, src=a_s, dst_scale=scales[:, 0:M])
    p.quantize_mx(dst=bq, src=b_s, dst_scale=scales[:, M : M + N])
    acc = p.psum((M, N), np.float32)
    p.nc_matmul_mx(
        dst=acc, stationary=aq, moving=bq, stationary_scale=scales[:, 0:M], moving_scale=scales[:, M : M + N]
    )
    res = p.sbuf((M, N), np.float32)
    p.tensor_copy(dst=res, src=acc)
    out = dev.hbm.alloc((M, N), np.float32)
    p.dma_copy(dst=out, src=res)
    dev.run(p)
    got = dev.hbm.get(out)

    wa, sa = ref_quantize(Ai.astype(np.float32), dtype)
    wb, sb = ref_quantize(Bi.astype(np.float32), dtype)
    want = ref_matmul(wa, dtype, sa, wb, dtype, sb)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # And the quantised product approximates the bf16 product (MXFP8 error, loose sanity bound).
    exact = A.astype(np.float64).T @ B.astype(np.float64)
    tol = 0.15 if dtype == "float8_e5m2_x4" else 0.08
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < tol


def test_quantize_mx_dense_scale_tile_for_32_partitions():
    """P <= 32: a dense [P/8, F/4] scale tile is a valid quadrant layout (rows 0..3)."""
    rng = np.random.default_rng(13)
    x = (rng.normal(size=(32, 8)) * 1e-3).astype(np.float16)
    words, scales = run_quantize(t3.Device(), x, "float8_e5m2_x4", parts_alloc=4)
    want_w, want_s = ref_quantize(x.astype(np.float32), "float8_e5m2_x4")
    assert np.array_equal(words, want_w) and np.array_equal(scales, want_s)


def test_matmul_mx_row_tiling_has_no_numerical_effect():
    rng = np.random.default_rng(14)
    sdt = mdt = "float8_e4m3fn_x4"
    sw, mw = random_words(rng, (32, 16), sdt), random_words(rng, (32, 40), mdt)
    ss = rng.integers(125, 130, size=(4, 16)).astype(np.uint8)  # every partial sum exact
    ms = rng.integers(125, 130, size=(4, 40)).astype(np.uint8)
    want = ref_matmul(sw, sdt, ss, mw, mdt, ms).astype(np.float32)
    for tile in [((32, 0), (32, 128)), ((64, 0), (64, 128)), ((0, 0), (128, 128))]:
        got = run_matmul(t3.Device(), sw, sdt, place_scales(ss, 32), mw, mdt, place_scales(ms, 32), tile=tile)
        assert np.array_equal(got, want)


def ref_matmul_in_order(sw, sdt, ss, mw, mdt, ms) -> np.ndarray:
    """The documented order, independently: per partition the exact quad sum (f64 is exact for
    these format pairs) times both block scales (NaN for 0xFF), rounded once to fp32, then the
    fp32 column sum over partitions 0..P-1 from +0.0."""
    S, M = decode_words(sw, sdt), decode_words(mw, mdt)

    def scale(codes):
        v = np.exp2(np.repeat(codes.astype(np.float64), 8, axis=0) - 127)
        v[np.repeat(codes, 8, axis=0) == 0xFF] = np.nan
        return v

    sS, sM = scale(ss), scale(ms)
    acc = np.zeros((sw.shape[1], mw.shape[1]), np.float32)
    with np.errstate(all="ignore"):
        for p in range(sw.shape[0]):
            quad = (S[p][:, None, :] * M[p][None, :, :]).sum(axis=-1)
            term = (quad * (sS[p][:, None] * sM[p][None, :])).astype(np.float32)
            acc = acc + term
    return acc


def random_mx_words(rng, shape, dtype):
    """Random x4 words over every finite code, then NaN (and Inf for e5m2) codes at a few places
    (never in column 0)."""
    if dtype == "float4_e2m1fn_x4":
        return rng.integers(0, 1 << 16, size=shape).astype(np.uint16)
    b = rng.integers(0, 256, size=(*shape, 4)).astype(np.uint32)
    special = (b & 0x7F) >= (0x7C if dtype == "float8_e5m2_x4" else 0x7F)
    b[special] &= 0x3F
    for _ in range(3):
        b[rng.integers(0, shape[0]), rng.integers(1, shape[1]), rng.integers(0, 4)] = rng.choice(
            [0x7C, 0xFC, 0x7F, 0xFF]
        )
    return b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24


@pytest.mark.parametrize(
    "sdt,mdt",
    [
        ("float8_e4m3fn_x4", "float8_e4m3fn_x4"),
        ("float8_e4m3fn_x4", "float4_e2m1fn_x4"),
        ("float4_e2m1fn_x4", "float8_e5m2_x4"),
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_mx_bit_exact_on_random_codes_and_extreme_scales(sdt, mdt, threads):
    """Every code of the element formats, E8M0 scales at both ends (f32 overflow, subnormal and
    zero results), NaN scales, ragged blocks: bit-exact against the in-order reference (NaN where
    it has NaN) on every thread count."""
    rng = np.random.default_rng(15)
    parts, m, n = 64, 42, 100
    sw, mw = random_mx_words(rng, (parts, m), sdt), random_mx_words(rng, (parts, n), mdt)

    def scales(w):
        s = rng.integers(110, 145, size=(parts // 8, w))
        pick = rng.random(s.shape)
        low, high = pick < 0.15, (pick >= 0.15) & (pick < 0.17)
        s[low] = rng.integers(0, 12, size=s.shape)[low]
        s[high] = rng.integers(240, 255, size=s.shape)[high]
        s[:, 0] = rng.integers(50, 56, size=parts // 8)  # output (0, 0): f32-subnormal terms
        s[rng.integers(0, parts // 8), rng.integers(1, w)] = 0xFF
        return s.astype(np.uint8)

    ss, ms = scales(m), scales(n)
    want = ref_matmul_in_order(sw, sdt, ss, mw, mdt, ms)
    t3.set_num_threads(threads)
    try:
        got = run_matmul(t3.Device(), sw, sdt, place_scales(ss, parts), mw, mdt, place_scales(ms, parts))
    finally:
        t3.set_num_threads(0)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))
    # the cases occur: Inf and NaN results, mostly finite ones, a subnormal one
    assert np.isinf(want).any() and 0 < (~ok).sum() < m * n // 2
    assert 0 < abs(want[0, 0]) < np.finfo(np.float32).tiny
