//! The AVX-512 path of kernels/rsqrt.rs: 16 fp32 elements per step, the seed from `vrsqrt14ps`
//! (relative error below 2^-14, Intel's bound) instead of fp32 `sqrt` and `/` (both long on the
//! one AVX-512 divide unit), then in two f64 vectors of 8 `h = 1 - y r^2` (`y r` exact, one
//! rounding in the fused `1 - (y r) r`: |h| < 2^-12.9) and `r (1 + h/2 + 3h^2/8)`: truncation
//! below 5/16 |h|^3 (1 + 2^-12) < 2^-40.6, the fused roundings below 2^-52.9; with the f64
//! formula's own two roundings, within 2^12.5 f64 ulps of its value: lanes within 2^TH_LOG2 of
//! the fp32 rounding midpoint (about one in 2^14) and NaN inputs take the formula (checked.rs's
//! test). `vrsqrt14ps` differs between CPU models only within that bound: same bits everywhere.

use super::rsqrt::exact;
use std::arch::x86_64::*;

/// The near-midpoint half-width, log2 of f64 ulps (module doc).
pub const TH_LOG2: u32 = 14;

/// `dst[i] = rsqrt(src[i] * scale + bias)` as rsqrt.rs's `map` (same bits) or, with
/// `unrestricted`, as its `map_unrestricted` (lanes outside `[lo, hi]` by the formula, not NaN).
///
/// # Safety
/// The host has AVX-512F and FMA; `src` and `dst` are valid for `n` fp32 values (unaligned),
/// equal or disjoint. `[lo, hi]` lies within rsqrt's valid range (normal fp32 results).
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn map(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    (scale, bias): (f32, f32),
    (lo, hi): (f32, f32),
    unrestricted: bool,
) {
    let (vs, vb) = (_mm512_set1_ps(scale), _mm512_set1_ps(bias));
    let (vlo, vhi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
    let (one, c1, c2) = (
        _mm512_set1_pd(1.0),
        _mm512_set1_pd(0.5),
        _mm512_set1_pd(0.375),
    );
    let bias_mid = _mm512_set1_epi64((1 << 28) + (1 << TH_LOG2));
    let mid_mask = _mm512_set1_epi64((1 << 29) - (1 << (TH_LOG2 + 1)));
    let nan = _mm512_set1_ps(f32::NAN);
    let half = |y: __m512d, r: __m512d| {
        let h = _mm512_fnmadd_pd(_mm512_mul_pd(y, r), r, one);
        let q = _mm512_fmadd_pd(h, c2, c1);
        let v = _mm512_fmadd_pd(_mm512_mul_pd(r, h), q, r);
        let t = _mm512_add_epi64(_mm512_castpd_si512(v), bias_mid);
        (v, _mm512_test_epi64_mask(t, mid_mask))
    };
    let lo8 = |v: __m512| _mm512_castps512_ps256(v);
    let hi8 = |v: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let mut i = 0;
    while i + 16 <= n {
        let y = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(src.add(i)), vs), vb);
        // lo <= y <= hi (NaN fails: it goes to `fix` below)
        let inside =
            _mm512_cmp_ps_mask::<_CMP_GE_OQ>(y, vlo) & _mm512_cmp_ps_mask::<_CMP_LE_OQ>(y, vhi);
        let r = _mm512_rsqrt14_ps(y);
        let (v0, f0) = half(_mm512_cvtps_pd(lo8(y)), _mm512_cvtps_pd(lo8(r)));
        let (v1, f1) = half(_mm512_cvtps_pd(hi8(y)), _mm512_cvtps_pd(hi8(r)));
        let far = f0 as u16 | (f1 as u16) << 8;
        let res = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(v0))),
            _mm256_castps_pd(_mm512_cvtpd_ps(v1)),
        ));
        let out = dst.add(i);
        _mm512_storeu_ps(out, _mm512_mask_blend_ps(inside, nan, res));
        // near lanes, NaN inputs, and (unrestricted) every lane outside the range
        let redo = if unrestricted {
            !(inside & far)
        } else {
            let isnan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(y, y);
            (inside & !far) | isnan
        };
        if redo != 0 {
            let mut ys = [0f32; 16];
            _mm512_storeu_ps(ys.as_mut_ptr(), y);
            super::checked::redo_lanes(&ys, redo as u32, out, exact);
        }
        i += 16;
    }
    // the last n mod 16 values, rsqrt.rs's generic loop
    super::rsqrt::map_either(
        src.add(i),
        dst.add(i),
        n - i,
        (scale, bias),
        (lo, hi),
        unrestricted,
    );
}
