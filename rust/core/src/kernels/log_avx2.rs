//! The AVX2 + FMA path of kernels/log.rs, written with intrinsics: 8 fp32 lanes per step,
//! log_f32.rs's double-fp32 evaluation as on AVX-512 (the same `dw_ln!`, so the same `hi`
//! and check), its three 32-entry tables read with permutes (`Table32`), -k and 2^-k from
//! `tn`'s exponent bits (z = y 2^-k, NaN for a NaN y); libm's `ln` for the lanes the check
//! rejects and NaN inputs.

use super::log::exact;
use super::log_f32::{dw_ln, is_identity, Consts, ONE_EPS, SUB, TABLES};
use std::arch::x86_64::*;

/// `dst[i] = ln(src[i] * scale + bias)` as log.rs's `map` (same bits).
///
/// # Safety
/// The host has AVX2 and FMA; `src` and `dst` are valid for `n` fp32 values (unaligned),
/// equal or disjoint.
#[target_feature(enable = "avx2,fma")]
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
    let f = _mm256_set1_ps;
    let c = Consts::new(|v| f(v));
    let one_eps = f(ONE_EPS);
    let (vs, vb) = (f(scale), f(bias));
    let (vlo, vhi) = (f(lo), f(hi));
    let i32s = _mm256_set1_epi32;
    let (sub, m31, e127, expo) = (i32s(SUB as i32), i32s(31), i32s(127), i32s(0x7f80_0000));
    let nan = f(f32::NAN);
    let tabs = [
        Table32::new(&t.invc),
        Table32::new(&t.logc_hi),
        Table32::new(&t.logc_lo),
    ];
    let mut i = 0;
    while i + 8 <= n {
        let mut y = _mm256_loadu_ps(src.add(i));
        if AFFINE {
            y = _mm256_add_ps(_mm256_mul_ps(y, vs), vb);
        }
        // y < lo || y > hi (NaN is not out: the check below flags it)
        let out_of = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_LT_OQ>(y, vlo),
            _mm256_cmp_ps::<_CMP_GT_OQ>(y, vhi),
        );
        let tn = _mm256_sub_epi32(sub, _mm256_castps_si256(y));
        // -k (tn's exponent field is -k + 127), 2^-k, z = y 2^-k; the table entry
        let kn = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32::<23>(tn), e127));
        let z = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_and_si256(tn, expo)));
        let j = _mm256_and_si256(_mm256_srli_epi32::<18>(tn), m31);
        // bits 3 and 4 of j in the sign bits, for the blends
        let (b3, b4) = (
            _mm256_castsi256_ps(_mm256_slli_epi32::<28>(j)),
            _mm256_castsi256_ps(_mm256_slli_epi32::<27>(j)),
        );
        let invc = tabs[0].lookup(j, b3, b4);
        let lch = tabs[1].lookup(j, b3, b4);
        let lcl = tabs[2].lookup(j, b3, b4);
        let (s1, a) = dw_ln!(
            (_mm256_add_ps, _mm256_sub_ps, _mm256_mul_ps, _mm256_fmadd_ps),
            &c,
            kn,
            z,
            (invc, lch, lcl)
        );
        // hi = s1 + a, lo its exact error (Fast2Sum)
        let h = _mm256_add_ps(s1, a);
        let l = _mm256_sub_ps(a, _mm256_sub_ps(h, s1));
        let far = _mm256_fmadd_ps(l, one_eps, h);
        // in-range lanes whose rounding is not decided, NaN inputs (h NaN) among them
        let undecided = _mm256_cmp_ps::<_CMP_NEQ_UQ>(far, h);
        let redo = _mm256_movemask_ps(_mm256_andnot_ps(out_of, undecided));
        let out = dst.add(i);
        _mm256_storeu_ps(out, _mm256_blendv_ps(h, nan, out_of));
        if redo != 0 {
            let mut ys = [0f32; 8];
            _mm256_storeu_ps(ys.as_mut_ptr(), y);
            super::checked::redo_lanes(&ys, redo as u32, out, exact);
        }
        i += 8;
    }
    // the last n mod 8 values, log.rs's generic loop
    super::log::map(src.add(i), dst.add(i), n - i, (scale, bias), (lo, hi));
}

/// A 32-entry fp32 table in four registers, read with four `vpermps` and three blends: AMD
/// Zen 3 runs `vgatherdps` microcoded (the gathers made this kernel 0.5 of numpy's AVX2 log
/// there); every x86 core with AVX2 runs a `vpermps` in one cycle.
struct Table32([__m256; 4]);

impl Table32 {
    #[inline(always)]
    unsafe fn new(t: &[f32; 32]) -> Self {
        Table32([0, 8, 16, 24].map(|k| _mm256_loadu_ps(t.as_ptr().add(k))))
    }

    /// Entry `j` (0..32) of each lane; `b3` / `b4` hold bits 3 / 4 of `j` in their sign bits.
    #[inline(always)]
    unsafe fn lookup(&self, j: __m256i, b3: __m256, b4: __m256) -> __m256 {
        let [t0, t1, t2, t3] = self.0;
        let p = |t| _mm256_permutevar8x32_ps(t, j);
        let lo = _mm256_blendv_ps(p(t0), p(t1), b3);
        let hi = _mm256_blendv_ps(p(t2), p(t3), b3);
        _mm256_blendv_ps(lo, hi, b4)
    }
}

#[cfg(test)]
mod tests {
    /// libm's bits, and the scalar model's `hi` where its check keeps it.
    #[test]
    fn matches_the_scalar_model() {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA checked; the slices hold the values they pass
            super::super::log_f32::check_kernel(|x, d, aff, r| unsafe {
                super::map(x.as_ptr(), d.as_mut_ptr(), x.len(), aff, r)
            });
        }
    }
}
