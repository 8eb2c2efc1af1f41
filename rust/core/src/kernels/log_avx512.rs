//! The AVX-512 path of kernels/log.rs, written with intrinsics: 16 fp32 lanes per vector, four
//! vectors a step, log_f32.rs's double-fp32 evaluation (three 32-entry tables in `vpermt2ps`,
//! ~34 vector operations per 16 lanes with the range test, the check, the load and the store;
//! ~41 before `r` became one exact fma, 58 for the f64 evaluation per two halves of 8) and its
//! check (`fma(lo, 1 + EPS, hi) == hi`); libm's `ln` for the lanes it rejects (about one in
//! 2^10) and NaN inputs, whose NaN reaches `hi` through `z = y 2^-k` (`vscalefps`). Lanes
//! outside the range get their NaN from the merge-masked final add.

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
    // one vector of 16 lanes: (hi, NaN outside the range; the lanes to redo)
    macro_rules! step {
        ($y:expr) => {{
            let y = $y;
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
            let (s1, a) = dw_ln!(
                (_mm512_add_ps, _mm512_sub_ps, _mm512_mul_ps, _mm512_fmadd_ps),
                &c,
                kn,
                z,
                (invc, lch, lcl)
            );
            // hi = s1 + a, NaN outside the range; lo its exact error (Fast2Sum)
            let h = _mm512_mask_add_ps(nan, inside, s1, a);
            let l = _mm512_sub_ps(a, _mm512_sub_ps(h, s1));
            let far = _mm512_fmadd_ps(l, one_eps, h);
            // in-range lanes whose rounding is not decided, NaN inputs (h NaN) among them
            (h, _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(inside, far, h))
        }};
    }
    macro_rules! load {
        ($i:expr) => {{
            let y = _mm512_loadu_ps(src.add($i));
            if AFFINE {
                _mm512_add_ps(_mm512_mul_ps(y, vs), vb)
            } else {
                y
            }
        }};
    }
    macro_rules! redo {
        ($y:expr, $redo:expr, $out:expr) => {
            if $redo != 0 {
                let mut ys = [0f32; 16];
                _mm512_storeu_ps(ys.as_mut_ptr(), $y);
                super::checked::redo_lanes(&ys, $redo as u32, $out, exact);
            }
        };
    }
    let mut i = 0;
    // four vectors a step (all read before any is written: src may be dst)
    while i + 64 <= n {
        let ys = [load!(i), load!(i + 16), load!(i + 32), load!(i + 48)];
        let r = [step!(ys[0]), step!(ys[1]), step!(ys[2]), step!(ys[3])];
        let out = dst.add(i);
        if (r[0].1 | r[1].1 | r[2].1 | r[3].1) == 0 {
            for (k, (h, _)) in r.iter().enumerate() {
                _mm512_storeu_ps(out.add(16 * k), *h);
            }
        } else {
            redo4(ys, r, out);
        }
        i += 64;
    }
    while i + 16 <= n {
        let y = load!(i);
        let (h, r) = step!(y);
        _mm512_storeu_ps(dst.add(i), h);
        redo!(y, r, dst.add(i));
        i += 16;
    }
    // the last n mod 16 values, log.rs's generic loop
    super::log::map(src.add(i), dst.add(i), n - i, (scale, bias), (lo, hi));
}

/// The rare step with lanes to redo: the four vectors' `hi`, then libm for those lanes.
///
/// # Safety
/// AVX-512F; `out` valid for 64 fp32 values.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f")]
unsafe fn redo4(ys: [__m512; 4], r: [(__m512, u16); 4], out: *mut f32) {
    for (k, &(h, m)) in r.iter().enumerate() {
        _mm512_storeu_ps(out.add(16 * k), h);
        if m != 0 {
            let mut v = [0f32; 16];
            _mm512_storeu_ps(v.as_mut_ptr(), ys[k]);
            super::checked::redo_lanes(&v, m as u32, out.add(16 * k), exact);
        }
    }
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
