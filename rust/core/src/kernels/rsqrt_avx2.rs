//! The AVX2 + FMA path of kernels/rsqrt.rs, in fp32 lanes (8 a step; the f64 Newton step of
//! rsqrt.rs took two 4-lane halves and their conversions).
//!
//! For y in the valid range (normal fp32, normal results), z = 1 / sqrt(y):
//! - `r0 = vrsqrtps(y)`: |r0 / z - 1| <= 1.5 * 2^-12 (the documented bound; Intel and AMD
//!   tables differ within it), so |e0| = |1 - y r0^2| < 2^-10.4;
//! - one fp32 Newton step `r1 = r0 + (r0 e0) / 2`, e0 from `1 - (y r0) r0`: truncation
//!   3/8 e0^2 < 2^-22.2 and the roundings (2^-24 from `y r0`, 2^-24 from r1) leave
//!   |r1 / z - 1| < 2^-21.6, so |e1| = |1 - y r1^2| < 2^-20.6;
//! - e1 nearly exactly: `p + pl = y r1` (pl by a fused multiply-subtract, exact), then
//!   `(1 - p r1) - pl r1` in two fused steps, each one rounding of a value below 2^-20.4:
//!   within 2^-44.4 of e1;
//! - `c = (r1 e1) / 2` (the series `r1 (1 - e1)^(-1/2) - r1` less its 3/8 e1^2 term, < 2^-42.4
//!   relative, and the product's rounding, 2^-45.5): |r1 + c - z| < 2^-42 r1;
//! - `res = fl(r1 + c)` and its exact error `d = (r1 + c) - res` (Fast2Sum: |c| << r1); h half
//!   an ulp of res, r1 < 2^25 h, so the true value lies within 2^-17 h of `res + d`: where
//!   |d| <= h (1 - 2^-TH) no midpoint lies between and `res` is the rounding of z. h comes from
//!   the exponent of the fp32 below `res` (for a power of two the smaller half ulp below it);
//!   the compare is on bit patterns (|d| and the threshold are positive floats).
//!
//! Flagged lanes (about one in 2^14) and NaN inputs take the f64 formula (rsqrt.rs's `exact`),
//! out of the hot loop. Same bits as rsqrt.rs on every input (the exhaustive tests).

use super::rsqrt::exact;
use std::arch::x86_64::*;

/// The near-midpoint margin: lanes with |d| above h (1 - 2^-TH) take the formula (module doc:
/// 2^-17 h needed, 2^-16 h below a power of two).
pub const TH: u32 = 14;

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
    let (one, half) = (_mm256_set1_ps(1.0), _mm256_set1_ps(0.5));
    let exp_mask = _mm256_set1_epi32(0x7f80_0000);
    // h (1 - 2^-TH) as bits: the exponent field less 24 binades, less 2^(24 - TH)
    let thr_off = _mm256_set1_epi32((24 << 23) + (1 << (24 - TH)));
    let abs_mask = _mm256_set1_epi32(0x7fff_ffff);
    let ones = _mm256_set1_epi32(1);
    let nan = _mm256_set1_ps(f32::NAN);
    let mut i = 0;
    while i + 8 <= n {
        let y = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(src.add(i)), vs), vb);
        // lo <= y <= hi (NaN fails: it goes to the formula below)
        let inside = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(y, vlo),
            _mm256_cmp_ps::<_CMP_LE_OQ>(y, vhi),
        );
        let r0 = _mm256_rsqrt_ps(y);
        let e0 = _mm256_fnmadd_ps(_mm256_mul_ps(y, r0), r0, one);
        let r1 = _mm256_fmadd_ps(_mm256_mul_ps(r0, e0), half, r0);
        let p = _mm256_mul_ps(y, r1);
        let pl = _mm256_fmsub_ps(y, r1, p);
        let e1 = _mm256_fnmadd_ps(pl, r1, _mm256_fnmadd_ps(p, r1, one));
        let c = _mm256_mul_ps(_mm256_mul_ps(r1, e1), half);
        let res = _mm256_add_ps(r1, c);
        let d = _mm256_sub_ps(c, _mm256_sub_ps(res, r1));
        let below = _mm256_sub_epi32(_mm256_castps_si256(res), ones);
        let thr = _mm256_sub_epi32(_mm256_and_si256(below, exp_mask), thr_off);
        let ad = _mm256_and_si256(_mm256_castps_si256(d), abs_mask);
        let near = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(ad, thr)));
        _mm256_storeu_ps(dst.add(i), _mm256_blendv_ps(nan, res, inside));
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
