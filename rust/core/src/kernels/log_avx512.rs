//! The AVX-512 path of kernels/log.rs, written with intrinsics: 16 fp32 lanes per step in one
//! vector, log_f32.rs's double-fp32 evaluation (three 32-entry tables in `vpermt2ps`, ~40
//! vector operations per 16 lanes where the f64 evaluation took ~58 per two halves of 8)
//! and its check (`fma(lo, 1 + EPS, hi) == hi`); libm's `ln` for the lanes it rejects (about
//! one in 2^10) and NaN inputs, whose NaN reaches `hi` through `z = y 2^-k` (`vscalefps`).

use super::log::exact;
use super::log_f32::{dw_ln, is_identity, Consts, ONE_EPS, SUB, TABLES};
use std::arch::x86_64::*;

/// `dst[i] = ln(src[i] * scale + bias)` as log.rs's `map` (same bits).
///
/// # Safety
/// The host has AVX-512F and FMA; `src` and `dst` are valid for `n` fp32 values (unaligned),
/// equal or disjoint.
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn map(src: *const f32, dst: *mut f32, n: usize, aff: (f32, f32), range: (f32, f32)) {
    if is_identity(aff) {
        map_with::<false>(src, dst, n, aff, range)
    } else {
        map_with::<true>(src, dst, n, aff, range)
    }
}

#[inline(always)]
unsafe fn map_with<const AFFINE: bool>(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    (scale, bias): (f32, f32),
    (lo, hi): (f32, f32),
) {
    let t = &TABLES;
    let ld = |p: &[f32; 32]| {
        (
            _mm512_loadu_ps(p.as_ptr()),
            _mm512_loadu_ps(p.as_ptr().add(16)),
        )
    };
    let (inv0, inv1) = ld(&t.invc);
    let (lch0, lch1) = ld(&t.logc_hi);
    let (lcl0, lcl1) = ld(&t.logc_lo);
    let f = _mm512_set1_ps;
    let c = Consts::new(|v| f(v));
    let one_eps = f(ONE_EPS);
    let (vs, vb) = (f(scale), f(bias));
    let (vlo, vhi) = (f(lo), f(hi));
    let sub = _mm512_set1_epi32(SUB as i32);
    let nan = f(f32::NAN);
    let mut i = 0;
    while i + 16 <= n {
        let mut y = _mm512_loadu_ps(src.add(i));
        if AFFINE {
            y = _mm512_add_ps(_mm512_mul_ps(y, vs), vb);
        }
        // !(y < lo || y > hi): NaN counts inside (and is flagged by the check below)
        let inside = _mm512_mask_cmp_ps_mask::<_CMP_NGT_UQ>(
            _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(y, vlo),
            y,
            vhi,
        );
        let tn = _mm512_sub_epi32(sub, _mm512_castps_si512(y));
        // -k, z = y 2^-k (exact; NaN for a NaN y), the table entry in tn's bits 18..22
        let kn = _mm512_getexp_ps(_mm512_castsi512_ps(tn));
        let z = _mm512_scalef_ps(y, kn);
        let j = _mm512_srli_epi32::<18>(tn);
        let invc = _mm512_permutex2var_ps(inv0, j, inv1);
        let lch = _mm512_permutex2var_ps(lch0, j, lch1);
        let lcl = _mm512_permutex2var_ps(lcl0, j, lcl1);
        let (h, l) = dw_ln!(
            (
                _mm512_add_ps,
                _mm512_sub_ps,
                _mm512_mul_ps,
                _mm512_fmadd_ps,
                _mm512_fmsub_ps
            ),
            &c,
            kn,
            z,
            (invc, lch, lcl)
        );
        let far = _mm512_fmadd_ps(l, one_eps, h);
        // in-range lanes whose rounding is not decided, NaN inputs (h NaN) among them
        let redo = _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(inside, far, h);
        let out = dst.add(i);
        _mm512_storeu_ps(out, _mm512_mask_blend_ps(inside, nan, h));
        if redo != 0 {
            let mut ys = [0f32; 16];
            _mm512_storeu_ps(ys.as_mut_ptr(), y);
            super::checked::redo_lanes(&ys, redo as u32, out, exact);
        }
        i += 16;
    }
    // the last n mod 16 values, log.rs's generic loop
    super::log::map(src.add(i), dst.add(i), n - i, (scale, bias), (lo, hi));
}

#[cfg(test)]
mod tests {
    /// libm's bits, and the scalar model's `hi` where its check keeps it.
    #[test]
    fn matches_the_scalar_model() {
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
            // SAFETY: AVX-512F and FMA checked; the slices hold the values they pass
            super::super::log_f32::check_kernel(|x, d, aff, r| unsafe {
                super::map(x.as_ptr(), d.as_mut_ptr(), x.len(), aff, r)
            });
        }
    }
}
