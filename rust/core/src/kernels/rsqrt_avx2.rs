//! The AVX2 + FMA path of kernels/rsqrt.rs in fp32 lanes (8 per vector where the f64 step took
//! two halves of 4): the seed `r0` from `vrsqrtps` (relative error at most 1.5 * 2^-12, the
//! documented bound; Intel and AMD tables differ within it), one fp32 Newton step `r1 = r0 +
//! (r0 / 2) (1 - y r0^2)` (relative error below 2^-21.5), then `h = 1 - y r1^2` to 2^-45
//! through error-free products (`y r1 = p + pe` by an fma, `1 - p r1` and `- pe r1` each one
//! rounding of a value below 2^-21) and `1 / sqrt(y) = r1 (1 + h/2 + 3h^2/8 ...)` as `hi + lo`
//! (`hi = r1 + r1 h / 2`, `lo` its rounding error by Fast2Sum): within 2^-43 relative (the
//! dropped 3h^2/8 < 2^-43.4, the roundings < 2^-45, the formula's own f64 value within 2^-52).
//! `hi` is kept where `fma(lo, 1 + 2^-16, hi) == hi` (every value within 2^-41 of it then
//! rounds to `hi`: log_f32.rs's check), else, and for NaN (which reaches `hi`), the formula
//! (about one lane in 2^16).

use super::rsqrt::exact;
use std::arch::x86_64::*;

/// 1 + EPS for the check (module doc).
const ONE_EPS: f32 = 1.0 + 1.0 / 65536.0;

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
    let f = _mm256_set1_ps;
    let (vs, vb) = (f(scale), f(bias));
    let (vlo, vhi) = (f(lo), f(hi));
    let (one, half, one_eps, nan) = (f(1.0), f(0.5), f(ONE_EPS), f(f32::NAN));
    let mut i = 0;
    while i + 8 <= n {
        let y = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(src.add(i)), vs), vb);
        // !(y < lo || y > hi): NaN counts inside (its NaN reaches `h` and the check)
        let inside = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_NLT_UQ>(y, vlo),
            _mm256_cmp_ps::<_CMP_NGT_UQ>(y, vhi),
        );
        let r0 = _mm256_rsqrt_ps(y);
        let h0 = _mm256_fnmadd_ps(_mm256_mul_ps(y, r0), r0, one);
        let r1 = _mm256_fmadd_ps(_mm256_mul_ps(r0, half), h0, r0);
        let p = _mm256_mul_ps(y, r1);
        let pe = _mm256_fmsub_ps(y, r1, p);
        let h = _mm256_fnmadd_ps(pe, r1, _mm256_fnmadd_ps(p, r1, one));
        let corr = _mm256_mul_ps(_mm256_mul_ps(r1, half), h);
        let hi = _mm256_add_ps(r1, corr);
        let lo = _mm256_sub_ps(corr, _mm256_sub_ps(hi, r1));
        let undecided = _mm256_cmp_ps::<_CMP_NEQ_UQ>(_mm256_fmadd_ps(lo, one_eps, hi), hi);
        let out = dst.add(i);
        _mm256_storeu_ps(out, _mm256_blendv_ps(nan, hi, inside));
        let inside = _mm256_movemask_ps(inside);
        let undecided = _mm256_movemask_ps(undecided);
        let redo = if unrestricted {
            (!inside | undecided) & 0xff
        } else {
            inside & undecided
        };
        if redo != 0 {
            let mut ys = [0f32; 8];
            _mm256_storeu_ps(ys.as_mut_ptr(), y);
            super::checked::redo_lanes(&ys, redo as u32, out, exact);
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
