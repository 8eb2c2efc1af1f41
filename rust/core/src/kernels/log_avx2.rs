//! The AVX2 + FMA path of kernels/log.rs, written with intrinsics: 8 fp32 elements per step, two
//! f64 vectors of 4, log.rs's evaluation (its 256-entry table, read with `vgatherdpd`, and
//! degree-4 Taylor series) with fused multiply-adds (the same error bound: the fusions only
//! drop roundings) and its midpoint check (`TH_LOG2`), libm's `ln` for near lanes and NaN.

use super::log::{exact, table_ptrs, C, LN2, OFF, TB, TH_LOG2};
use std::arch::x86_64::*;

/// `dst[i] = ln(src[i] * scale + bias)` as log.rs's `map` (same bits).
///
/// # Safety
/// The host has AVX2 and FMA; `src` and `dst` are valid for `n` fp32 values (unaligned),
/// equal or disjoint.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn map(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    (scale, bias): (f32, f32),
    (lo, hi): (f32, f32),
) {
    let (tinv, tlog) = table_ptrs();
    let c = C.map(|v| _mm256_set1_pd(v));
    let (one, ln2) = (_mm256_set1_pd(1.0), _mm256_set1_pd(LN2));
    let (vs, vb) = (_mm256_set1_ps(scale), _mm256_set1_ps(bias));
    let (vlo, vhi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    let off = _mm256_set1_epi32(OFF as i32);
    let expo = _mm256_set1_epi32(0xff80_0000u32 as i32);
    let imask = _mm256_set1_epi32((1 << TB) - 1);
    let bias_mid = _mm256_set1_epi64x((1 << 28) + (1 << TH_LOG2));
    let mid_mask = _mm256_set1_epi64x((1 << 29) - (1 << (TH_LOG2 + 1)));
    let nan = _mm256_set1_ps(f32::NAN);
    let zero = _mm256_setzero_si256();
    // ln of 4 f64 lanes: z, k, table index; the near-lane mask (all ones where near)
    let half = |z: __m256d, k: __m256d, i: __m128i| {
        let invc = _mm256_i32gather_pd::<8>(tinv, i);
        let logc = _mm256_i32gather_pd::<8>(tlog, i);
        let r = _mm256_fmsub_pd(z, invc, one);
        let r2 = _mm256_mul_pd(r, r);
        let p = _mm256_fmadd_pd(c[2], r, c[1]);
        let p = _mm256_fmadd_pd(p, r, c[0]);
        let v = _mm256_add_pd(_mm256_fmadd_pd(k, ln2, logc), _mm256_fmadd_pd(r2, p, r));
        let t = _mm256_and_si256(_mm256_add_epi64(_mm256_castpd_si256(v), bias_mid), mid_mask);
        (v, _mm256_cmpeq_epi64(t, zero))
    };
    let mut i = 0;
    while i + 8 <= n {
        let y = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(src.add(i)), vs), vb);
        // !(y < lo || y > hi): NaN counts inside
        let out_of = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_LT_OQ>(y, vlo),
            _mm256_cmp_ps::<_CMP_GT_OQ>(y, vhi),
        );
        let ix = _mm256_castps_si256(y);
        let tmp = _mm256_sub_epi32(ix, off);
        let k = _mm256_cvtepi32_ps(_mm256_srai_epi32::<23>(tmp));
        let z = _mm256_castsi256_ps(_mm256_sub_epi32(ix, _mm256_and_si256(tmp, expo)));
        let idx = _mm256_and_si256(_mm256_srli_epi32::<{ 23 - TB as i32 }>(tmp), imask);
        let (v0, n0) = half(
            _mm256_cvtps_pd(_mm256_castps256_ps128(z)),
            _mm256_cvtps_pd(_mm256_castps256_ps128(k)),
            _mm256_castsi256_si128(idx),
        );
        let (v1, n1) = half(
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(z)),
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(k)),
            _mm256_extracti128_si256::<1>(idx),
        );
        let r = _mm256_set_m128(_mm256_cvtpd_ps(v1), _mm256_cvtpd_ps(v0));
        _mm256_storeu_ps(dst.add(i), _mm256_blendv_ps(r, nan, out_of));
        // near lanes (as 64-bit masks, one bit per f64 lane) and NaN inputs, in range
        let near = _mm256_movemask_pd(_mm256_castsi256_pd(n0))
            | _mm256_movemask_pd(_mm256_castsi256_pd(n1)) << 4;
        let isnan = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(y, y));
        let redo = (near | isnan) & !_mm256_movemask_ps(out_of);
        if redo != 0 {
            let mut ys = [0f32; 8];
            _mm256_storeu_ps(ys.as_mut_ptr(), y);
            super::checked::redo_lanes(&ys, redo as u32, dst.add(i), exact);
        }
        i += 8;
    }
    // the last n mod step values, log.rs's generic loop
    super::log::map(src.add(i), dst.add(i), n - i, (scale, bias), (lo, hi));
}
