//! 1 / sqrt for ScalarE's `rsqrt` (act_simple.rs): the fp32 result of the f64 formula
//! `1 / sqrt(y)` rounded once, reached without the f64 square root and division.
//!
//! The evaluation, for y in the valid range 2^-87 .. 2^97 (positive normal fp32): the fp32
//! seed `r = 1 / sqrt(y)` (two fp32 roundings: |r sqrt(y) - 1| < 2^-22.9), then one Newton step
//! in f64, `h = 1 - y r^2` (`y r` exact, a 24 by 24 bit product; |h| < 2^-21.9, absolute error
//! 2^-53), `1 / sqrt(y) = r (1 - h)^(-1/2) = r (1 + h/2 + 3h^2/8 + ...)` kept to the h term:
//! truncation < 3/8 h^2 (1 + 2^-20) < 2^-45.2, the f64 roundings < 2^-51.5: within 2^-45.1
//! relative of 1 / sqrt(y), the f64 formula within 2^-52.4 of it, under 2^8 f64 ulps apart.
//! The check (checked.rs) keeps lanes at least 2^TH_LOG2 ulps from a midpoint (about one lane
//! in 2^19). (A bit-pattern seed with two fp32 Newton steps and a second-order f64 step was
//! slower on every path: fp32 `sqrt` and `/` are pipelined on current x86 cores.)
//!
//! Every step is IEEE fp32 / f64 arithmetic without fused multiply-adds: the same bits on every
//! path (and the check makes the result libm's in any case).

use super::checked;

/// The valid range of the activation, 2^-87 .. 2^97: positive normal fp32 inputs with normal
/// fp32 results, where the approximations hold.
pub const RANGE: (f32, f32) = (f32::from_bits(0x1400_0000), f32::from_bits(0x7000_0000));

/// The near-midpoint half-width, log2 of f64 ulps (module doc: 2^7.9 + 1 needed).
pub const TH_LOG2: u32 = 9;

/// 1 / sqrt(y) within 2^-45.1 relative for y in [2^-87, 2^97] (module doc); some value
/// elsewhere.
#[inline(always)]
pub fn approx(y: f32) -> f64 {
    let r = (1.0 / y.sqrt()) as f64;
    let h = 1.0 - (y as f64 * r) * r;
    r + (r * h) * 0.5
}

/// The f64 formula (act.rs's `apply`) rounded once.
#[inline(never)]
#[cold]
pub fn exact(y: f32) -> f32 {
    (1.0 / (y as f64).sqrt()) as f32
}

/// `dst[i] = rsqrt(src[i] * scale + bias)` (act::apply_checked's: NaN outside `[lo, hi]`, a NaN
/// input's own NaN) over `n` values, generic code the callers compile per SIMD path.
///
/// # Safety
/// `src` and `dst` valid for `n` fp32 values (unaligned), either equal or disjoint.
#[inline(always)]
pub unsafe fn map(src: *const f32, dst: *mut f32, n: usize, aff: (f32, f32), range: (f32, f32)) {
    let f = (approx, TH_LOG2, exact);
    // SAFETY: the caller's
    unsafe { checked::map(src, dst, n, aff, range, f, None::<fn(f32) -> f32>) }
}

/// `dst[i] = 1 / sqrt(src[i])` in f64 rounded once for every fp32 input (the ALU's `rsqrt`,
/// alu.rs's `apply`: no range; inputs outside 2^-87 .. 2^97, zeros, negatives and NaN take the
/// formula itself).
///
/// # Safety
/// `src` and `dst` valid for `n` fp32 values (unaligned), either equal or disjoint.
#[inline(always)]
pub unsafe fn map_unrestricted(src: *const f32, dst: *mut f32, n: usize) {
    let range = RANGE;
    let f = (approx, TH_LOG2, exact);
    // SAFETY: the caller's
    unsafe { checked::map(src, dst, n, (1.0, -0.0), range, f, Some(exact)) }
}

/// `map` (`unrestricted` false) or `map_unrestricted` (then `aff` and `range` are unused): the
/// intrinsics kernels' last values.
///
/// # Safety
/// As `map`.
#[inline(always)]
pub unsafe fn map_either(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    aff: (f32, f32),
    range: (f32, f32),
    unrestricted: bool,
) {
    // SAFETY: the caller's
    unsafe {
        if unrestricted {
            map_unrestricted(src, dst, n)
        } else {
            map(src, dst, n, aff, range)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error bound on every 61st fp32 of the range, against 1 / sqrt in f64 (itself within
    /// 2^-52.4).
    #[test]
    fn approx_is_within_its_error_bound() {
        let mut worst = 0f64;
        for b in (0x1400_0000u32..0x7000_0000).step_by(61) {
            let y = f32::from_bits(b);
            let want = 1.0 / (y as f64).sqrt();
            worst = worst.max(((approx(y) - want) / want).abs());
        }
        assert!(worst < 2f64.powi(-45), "worst {}", worst.log2());
    }
}
