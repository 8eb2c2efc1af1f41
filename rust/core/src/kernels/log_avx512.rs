//! The AVX-512 path of kernels/log.rs, written with intrinsics: 16 fp32 elements per step, two
//! f64 vectors of 8, the same evaluation with a 16-entry table (`TB` = 4, one `vpermt2pd` per
//! table: |r| <= 2^-5 (1 + 2^-7)) and the Taylor series to r^7 (truncation < |r|^7 / 8 <
//! 2^-37.8; fused multiply-adds, the rounding as log.rs's): within 2^-37.5 relative of ln,
//! 2^15.5 f64 ulps plus libm's 1, so lanes within 2^17 of the midpoint pattern take libm's
//! `ln` (about one element in 2^11), as do NaN inputs.

use super::log::{exact, table, LN2, OFF};
use std::arch::x86_64::*;

const N: usize = 16;
static TABLE: ([f64; N], [f64; N]) = table::<N>();
/// ln(1 + r) = r + r^2 (C[0] + C[1] r + ... + C[5] r^5).
const C: [f64; 6] = [-0.5, 1.0 / 3.0, -0.25, 0.2, -1.0 / 6.0, 1.0 / 7.0];
/// The near-midpoint half-width, log2 of f64 ulps (module doc).
pub const TH_LOG2: u32 = 17;

/// `dst[i] = ln(src[i] * scale + bias)` as log.rs's `map` (same bits).
///
/// # Safety
/// The host has AVX-512F and FMA; `src` and `dst` are valid for `n` fp32 values (unaligned),
/// equal or disjoint.
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn map(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    (scale, bias): (f32, f32),
    (lo, hi): (f32, f32),
) {
    let t0 = _mm512_loadu_pd(TABLE.0.as_ptr());
    let t1 = _mm512_loadu_pd(TABLE.0.as_ptr().add(8));
    let l0 = _mm512_loadu_pd(TABLE.1.as_ptr());
    let l1 = _mm512_loadu_pd(TABLE.1.as_ptr().add(8));
    let c = C.map(|v| _mm512_set1_pd(v));
    let (one, ln2) = (_mm512_set1_pd(1.0), _mm512_set1_pd(LN2));
    let (vs, vb) = (_mm512_set1_ps(scale), _mm512_set1_ps(bias));
    let (vlo, vhi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
    let off = _mm512_set1_epi32(OFF as i32);
    let expo = _mm512_set1_epi32(0xff80_0000u32 as i32);
    let bias_mid = _mm512_set1_epi64((1 << 28) + (1 << TH_LOG2));
    let mid_mask = _mm512_set1_epi64((1 << 29) - (1 << (TH_LOG2 + 1)));
    let nan = _mm512_set1_ps(f32::NAN);
    // ln of 8 f64 lanes: z (in [OFF, 2 OFF)), k, table index (low 4 bits); the far-lane mask
    let half = |z: __m512d, k: __m512d, i: __m512i| {
        let invc = _mm512_permutex2var_pd(t0, i, t1);
        let logc = _mm512_permutex2var_pd(l0, i, l1);
        let r = _mm512_fmsub_pd(z, invc, one);
        let r2 = _mm512_mul_pd(r, r);
        let mut p = _mm512_fmadd_pd(c[5], r, c[4]);
        p = _mm512_fmadd_pd(p, r, c[3]);
        p = _mm512_fmadd_pd(p, r, c[2]);
        p = _mm512_fmadd_pd(p, r, c[1]);
        p = _mm512_fmadd_pd(p, r, c[0]);
        let v = _mm512_add_pd(_mm512_fmadd_pd(k, ln2, logc), _mm512_fmadd_pd(r2, p, r));
        let t = _mm512_add_epi64(_mm512_castpd_si512(v), bias_mid);
        (v, _mm512_test_epi64_mask(t, mid_mask))
    };
    let lo8 = |v: __m512i| _mm512_castsi512_si256(v);
    let hi8 = |v: __m512i| _mm512_extracti64x4_epi64::<1>(v);
    let mut i = 0;
    while i + 16 <= n {
        let y = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(src.add(i)), vs), vb);
        // !(y < lo || y > hi): NaN counts inside
        let inside =
            _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(y, vlo) & _mm512_cmp_ps_mask::<_CMP_NGT_UQ>(y, vhi);
        let ix = _mm512_castps_si512(y);
        let tmp = _mm512_sub_epi32(ix, off);
        let k = _mm512_cvtepi32_ps(_mm512_srai_epi32::<23>(tmp));
        let iz = _mm512_sub_epi32(ix, _mm512_and_si512(tmp, expo));
        let idx = _mm512_srli_epi32::<{ 23 - 4 }>(tmp);
        let (z, k) = (_mm512_castsi512_ps(iz), _mm512_castps_si512(k));
        let z = _mm512_castps_si512(z);
        let (v0, f0) = half(
            _mm512_cvtps_pd(_mm256_castsi256_ps(lo8(z))),
            _mm512_cvtps_pd(_mm256_castsi256_ps(lo8(k))),
            _mm512_cvtepu32_epi64(lo8(idx)),
        );
        let (v1, f1) = half(
            _mm512_cvtps_pd(_mm256_castsi256_ps(hi8(z))),
            _mm512_cvtps_pd(_mm256_castsi256_ps(hi8(k))),
            _mm512_cvtepu32_epi64(hi8(idx)),
        );
        let far = f0 as u16 | (f1 as u16) << 8;
        let r = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(v0))),
            _mm256_castps_pd(_mm512_cvtpd_ps(v1)),
        ));
        let out = dst.add(i);
        _mm512_storeu_ps(out, _mm512_mask_blend_ps(inside, nan, r));
        // in-range lanes near a midpoint, and NaN inputs (which fail `far`'s test or not)
        let isnan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(y, y);
        let redo = inside & (!far | isnan);
        if redo != 0 {
            let mut ys = [0f32; 16];
            _mm512_storeu_ps(ys.as_mut_ptr(), y);
            super::checked::redo_lanes(&ys, redo as u32, out, exact);
        }
        i += 16;
    }
    // the last n mod step values, log.rs's generic loop
    super::log::map(src.add(i), dst.add(i), n - i, (scale, bias), (lo, hi));
}
