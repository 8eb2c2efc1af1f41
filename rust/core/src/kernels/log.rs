//! ln for ScalarE's `log` (act_simple.rs): the fp32 result of libm's f64 `ln` rounded once,
//! reached through a table-driven f64 evaluation that is kept only where its fp32 rounding is
//! provably the same, per lane, with no division.
//!
//! The evaluation (as libm's own `log`): an in-range input y (a positive normal fp32, 2^-64 ..
//! 2^64) is `2^k z` with z in [OFF, 2 OFF) (OFF ~ 0.703; z's bits are y's with k taken out of
//! the exponent, exact), and z falls in one of 2^TB sub-intervals of equal width in bits
//! (index `i` = bits TB above the 23 - TB low ones of `bits(y) - OFF`). `invc[i]` is an fp32
//! near 1 / (the sub-interval's centre), exactly 1 for the one holding 1.0 (which sits in the
//! middle of it); so `r = z invc - 1` is exact in f64 (24 + 24 bit product, then Sterbenz) and
//! |r| <= 2^-(TB + 1) (1 + 2^-7). `ln y = k ln2 + logc[i] + ln(1 + r)`, `logc[i] = -ln invc[i]`
//! (f64, within 2^-51 relative: `ln_const`), ln(1 + r) by its Taylor series to r^D: truncation
//! < |r|^D / (D + 1) relative. Rounding: `k * LN2 + logc` and the final sum stay within a few
//! f64 ulps (|k ln2| >= 2 |logc + ln(1 + r)| when k != 0, and for k = 0 the two terms never
//! cancel by more than a factor ~2: z's sub-interval is away from 1 unless `logc` is 0, where
//! the result is `r + r^2 p` with relative error ~2^-52). For 1.0 the result is exactly 0.
//!
//! The check (exp_avx512.rs's): with libm's f64 `ln` within 1 ulp, the two f64 values differ by
//! at most `ERR` relative, i.e. 2^(53 + log2 ERR) + 1 f64 ulps; the fp32 rounding of `y` is then
//! the same as libm's unless y's 29 low mantissa bits lie within 2^TH_LOG2 of the rounding
//! midpoint pattern 2^28 (every result is an fp32 normal: |ln y| >= 2^-24.1 for y != 1). Near
//! lanes (about 2^(TH_LOG2 - 28) of inputs) and NaN inputs take libm's `ln`.

use super::checked;

/// z's offset: fp32 bits of ~0.7002, placed so that 1.0 is inside its sub-interval, in the
/// middle of it in bits for `TB` = 8.
pub const OFF: u32 = 0x3f33_4000;

/// The f64 nearest ln2.
pub const LN2: f64 = std::f64::consts::LN_2;

/// ln(v) for v in [0.7, 1.42], computed by the compiler: 2 atanh(s), s = (v - 1) / (v + 1)
/// (|s| < 0.18), the odd series to s^39 (truncation < 2^-90), within a few f64 ulps.
pub(crate) const fn ln_const(v: f64) -> f64 {
    let s = (v - 1.0) / (v + 1.0);
    let z = s * s;
    let mut p = 0.0;
    let mut k = 39;
    while k >= 1 {
        p = p * z + 1.0 / k as f64;
        k -= 2;
    }
    2.0 * s * p
}

/// The sub-interval tables for `TB` bits: (invc, logc) per index, built by the compiler (the
/// same on every host).
pub const fn table<const N: usize>() -> ([f64; N], [f64; N]) {
    let tb = N.trailing_zeros();
    let w = 1u32 << (23 - tb);
    let mut invc = [0.0; N];
    let mut logc = [0.0; N];
    let mut i = 0;
    while i < N {
        let lo = OFF + i as u32 * w;
        let hi = lo + w;
        if lo <= 0x3f80_0000 && 0x3f80_0000 < hi {
            invc[i] = 1.0;
            logc[i] = 0.0;
        } else {
            // the centre in value (both ends in one binade here)
            let c = (f32::from_bits(lo) as f64 + f32::from_bits(hi) as f64) * 0.5;
            let v = (1.0 / c) as f32 as f64;
            invc[i] = v;
            logc[i] = -ln_const(v);
        }
        i += 1;
    }
    (invc, logc)
}

/// The table for the generic (portable) evaluation: 256 entries, |r| <= 2^-9 (1 + 2^-7).
pub const TB: u32 = 8;
const N: usize = 1 << TB;
static TABLE: ([f64; N], [f64; N]) = table::<N>();

/// ln(1 + r) = r + r^2 (C[0] + C[1] r + ...): Taylor coefficients -1/2, 1/3, ..., to r^D.
pub const D: usize = 4;
pub const C: [f64; D - 1] = [-0.5, 1.0 / 3.0, -0.25];

/// The relative error bound of `approx` against ln: truncation |r|^D / (D + 1) (< 2^-38.2)
/// plus rounding (< 2^-50).
pub const ERR_LOG2: i32 = -38;
/// Lanes whose 29 low result bits lie within 2^TH_LOG2 of 2^28 go to libm: 2^(53 + ERR_LOG2)
/// ulps of approximation error, 1 of libm's, with margin (about one lane in 2^12).
pub const TH_LOG2: u32 = 16;

/// ln(y) within 2^ERR_LOG2 relative for a positive normal fp32 y (module doc); some value for
/// other y (never kept: the callers check the range).
#[inline(always)]
pub fn approx(y: f32) -> f64 {
    let ix = y.to_bits();
    let tmp = ix.wrapping_sub(OFF);
    let i = ((tmp >> (23 - TB)) as usize) & (N - 1);
    let k = (tmp as i32) >> 23;
    let z = f32::from_bits(ix.wrapping_sub(tmp & 0xff80_0000)) as f64;
    let (invc, logc) = (TABLE.0[i], TABLE.1[i]);
    let r = z * invc - 1.0;
    let r2 = r * r;
    let mut p = C[D - 2];
    for c in C[..D - 2].iter().rev() {
        p = p * r + c;
    }
    (k as f64 * LN2 + logc) + (r + r2 * p)
}

/// libm's result (the f64 formula act.rs's `apply` gives, rounded once).
#[inline(never)]
#[cold]
pub fn exact(y: f32) -> f32 {
    (y as f64).ln() as f32
}

/// `dst[i] = ln(src[i] * scale + bias)` (act::apply_checked's `log`: NaN outside `[lo, hi]`,
/// a NaN input's own NaN) over `n` values, generic code the callers compile per SIMD path.
///
/// # Safety
/// `src` and `dst` valid for `n` fp32 values (unaligned), either equal or disjoint.
#[inline(always)]
pub unsafe fn map(src: *const f32, dst: *mut f32, n: usize, aff: (f32, f32), range: (f32, f32)) {
    let f = (approx, TH_LOG2, exact);
    // SAFETY: the caller's
    unsafe { checked::map(src, dst, n, aff, range, f, None::<fn(f32) -> f32>) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_entries_are_short_and_their_logs_accurate() {
        fn check<const M: usize>(t: &([f64; M], [f64; M])) {
            for i in 0..M {
                let (v, l) = (t.0[i], t.1[i]);
                assert_eq!(v, v as f32 as f64, "invc[{i}] has more than 24 bits");
                let want = -v.ln();
                assert!((l - want).abs() <= want.abs() * 2f64.powi(-50), "logc[{i}]");
            }
            assert_eq!(t.0.iter().filter(|&&v| v == 1.0).count(), 1);
        }
        check(&TABLE);
    }

    /// The error bound on a spread of inputs: every mantissa step of 2^7 over the binades
    /// around 1 and both range ends, against libm's ln (itself within 2^-52).
    #[test]
    fn approx_is_within_its_error_bound() {
        let mut worst = 0f64;
        for e in (-64..64).filter(|e: &i32| e.abs() <= 2 || e.abs() >= 62) {
            for m in (0..1u32 << 23).step_by(1 << 7) {
                let y = f32::from_bits((((e + 127) as u32) << 23) | m);
                let want = (y as f64).ln();
                if want == 0.0 {
                    assert_eq!(approx(y), 0.0);
                    continue;
                }
                worst = worst.max(((approx(y) - want) / want).abs());
            }
        }
        assert!(worst < 2f64.powi(ERR_LOG2), "worst {}", worst.log2());
    }
}
