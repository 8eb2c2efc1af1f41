//! The AVX2 + FMA path of kernels/rsqrt.rs (rsqrt_avx512.rs's structure): the seed from
//! `vrsqrtps` (relative error at most 1.5 * 2^-12, the documented bound; Intel and AMD tables
//! differ within it), so |h| = |1 - y r^2| < 2^-10.4 and the f64 step keeps the h^3 term:
//! `r (1 + h/2 + 3h^2/8 + 5h^3/16)`, truncation below 35/128 |h|^4 (1 + 2^-9) < 2^-43.4, the
//! fused roundings below 2^-52.9: within 2^9.7 f64 ulps of the formula's value with its own
//! roundings; lanes within 2^TH_LOG2 of the fp32 rounding midpoint (about one in 2^17) and NaN
//! take the formula.

use super::rsqrt::exact;
use std::arch::x86_64::*;

/// The near-midpoint half-width, log2 of f64 ulps (module doc).
pub const TH_LOG2: u32 = 11;

/// `dst[i] = rsqrt(src[i] * scale + bias)` as rsqrt.rs's `map` (same bits) or, with
/// `unrestricted`, as its `map_unrestricted`.
///
/// # Safety
/// The host has AVX2 and FMA; `src` and `dst` are valid for `n` fp32 values (unaligned),
/// equal or disjoint. `[lo, hi]` lies within rsqrt's valid range (normal fp32 results).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn map(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    (scale, bias): (f32, f32),
    (lo, hi): (f32, f32),
    unrestricted: bool,
) {
    let (vs, vb) = (_mm256_set1_ps(scale), _mm256_set1_ps(bias));
    let (vlo, vhi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    let c = [0.5, 0.375, 0.3125].map(|v| _mm256_set1_pd(v));
    let one = _mm256_set1_pd(1.0);
    let bias_mid = _mm256_set1_epi64x((1 << 28) + (1 << TH_LOG2));
    let mid_mask = _mm256_set1_epi64x((1 << 29) - (1 << (TH_LOG2 + 1)));
    let nan = _mm256_set1_ps(f32::NAN);
    let zero = _mm256_setzero_si256();
    let half = |y: __m256d, r: __m256d| {
        let h = _mm256_fnmadd_pd(_mm256_mul_pd(y, r), r, one);
        let q = _mm256_fmadd_pd(_mm256_fmadd_pd(h, c[2], c[1]), h, c[0]);
        let v = _mm256_fmadd_pd(_mm256_mul_pd(r, h), q, r);
        let t = _mm256_and_si256(_mm256_add_epi64(_mm256_castpd_si256(v), bias_mid), mid_mask);
        (v, _mm256_cmpeq_epi64(t, zero))
    };
    let mut i = 0;
    while i + 8 <= n {
        let y = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(src.add(i)), vs), vb);
        // lo <= y <= hi (NaN fails: it goes to `fix` below)
        let inside = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(y, vlo),
            _mm256_cmp_ps::<_CMP_LE_OQ>(y, vhi),
        );
        let r = _mm256_rsqrt_ps(y);
        let (v0, n0) = half(
            _mm256_cvtps_pd(_mm256_castps256_ps128(y)),
            _mm256_cvtps_pd(_mm256_castps256_ps128(r)),
        );
        let (v1, n1) = half(
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(y)),
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(r)),
        );
        let res = _mm256_set_m128(_mm256_cvtpd_ps(v1), _mm256_cvtpd_ps(v0));
        _mm256_storeu_ps(dst.add(i), _mm256_blendv_ps(nan, res, inside));
        let near = _mm256_movemask_pd(_mm256_castsi256_pd(n0))
            | _mm256_movemask_pd(_mm256_castsi256_pd(n1)) << 4;
        let inside = _mm256_movemask_ps(inside);
        let redo = if unrestricted {
            !inside | near
        } else {
            let isnan = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(y, y));
            (inside & near) | isnan
        } & 0xff;
        if redo != 0 {
            let mut ys = [0f32; 8];
            _mm256_storeu_ps(ys.as_mut_ptr(), y);
            super::checked::redo_lanes(&ys, redo as u32, dst.add(i), exact);
        }
        i += 8;
    }
    // the last n mod 8 values, rsqrt.rs's generic loop
    super::rsqrt::map_either(
        src.add(i),
        dst.add(i),
        n - i,
        (scale, bias),
        (lo, hi),
        unrestricted,
    );
}
