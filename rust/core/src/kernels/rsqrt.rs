//! 1 / sqrt for ScalarE's `rsqrt` (act_simple.rs): the fp32 result of the f64 formula
//! `1 / sqrt(y)` rounded once, reached without the f64 square root and division.
//!
//! The evaluation, for y in the valid range 2^-87 .. 2^97 (positive normal fp32): the fp32
//! seed `r = 1 / sqrt(y)` (two fp32 roundings: |r sqrt(y) - 1| < 2^-22.9), then one Newton step
//! in f64, `r (3/2 - (y/2 r) r)` (`y/2` exact in fp32, `y/2 r` exact in f64, a 24 by 24 bit
//! product; the other three operations one f64 rounding each, together below 2^-51.6): the
//! step's truncation 3/2 (r sqrt(y) - 1)^2 < 2^-45.2, within 2^-45.1 relative of 1 / sqrt(y),
//! the f64 formula within 2^-52.4 of it, under 2^8 f64 ulps apart. The check (checked.rs)
//! keeps lanes at least 2^TH_LOG2 ulps from a midpoint (about one lane in 2^19). (A bit-pattern seed with
//! two fp32 Newton steps and a second-order f64 step was slower on every path: fp32 `sqrt` and
//! `/` are pipelined on current x86 cores.)
//!
//! Every step is IEEE fp32 / f64 arithmetic without fused multiply-adds: the same bits on every
//! path (and the check makes the result libm's in any case). The loop is plain code over
//! chunks of 16 lanes that LLVM vectorises (SSE2 / NEON on the portable path); a chunk with a
//! flagged lane is redone lane by lane.

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
    r * (1.5 - ((0.5 * y) as f64 * r) * r)
}

/// `approx` rounded to fp32 and its near-midpoint flag: the evaluation without fused
/// multiply-adds (x86's baseline has none), two f64 lanes to a 128-bit vector.
#[inline(always)]
pub fn lane_f64(y: f32) -> (f32, u32) {
    let r = approx(y);
    (r as f32, checked::near_midpoint(r, TH_LOG2))
}

/// Where `lane_fma`'s flag is raised: |d| above h (1 - 2^-TH_FMA) (its doc: 2^-19.3 h needed,
/// 2^-18.3 h below a power of two).
pub const TH_FMA: u32 = 16;

/// The same in fp32 lanes with fused multiply-adds (aarch64's baseline has them: the portable
/// path there): `r = 1 / sqrt(y)` as above (|e| = |1 - y r^2| < 2^-21.9), e nearly exactly
/// (`p + pl = y r`, pl by a fused multiply-subtract, exact; `(1 - p r) - pl r` in two fused
/// steps, each one rounding of a value below 2^-21.8: within 2^-45.5 of e), `c = (r e) / 2`
/// (the series `r (1 - e)^(-1/2) - r` less its 3/8 e^2 term, < 2^-45.2 relative, and the
/// product's rounding, 2^-46.9): |r + c - 1 / sqrt(y)| < 2^-44.3 r. Then `res = fl(r + c)` and
/// its exact error `d = (r + c) - res` (Fast2Sum: |c| << r); h half an ulp of res and r <
/// 2^25 h, so 1 / sqrt(y) lies within 2^-19.3 h of `res + d`: where |d| <= h (1 - 2^-TH_FMA)
/// no midpoint lies between and `res` is its rounding. h comes from the exponent of the fp32
/// below `res` (below a power of two the half ulp is half as large); the compare is on bit
/// patterns (|d| and the threshold are positive floats). rsqrt_avx2.rs evaluates the same from a
/// `vrsqrtps` seed and an fp32 Newton step (its check: log_f32.rs's fma test).
#[inline(always)]
pub fn lane_fma(y: f32) -> (f32, u32) {
    let r = 1.0 / y.sqrt();
    let p = y * r;
    let pl = y.mul_add(r, -p);
    let e = (-pl).mul_add(r, (-p).mul_add(r, 1.0));
    let c = (r * e) * 0.5;
    let res = r + c;
    let d = c - (res - r);
    let thr = (res.to_bits().wrapping_sub(1) & 0x7f80_0000)
        .wrapping_sub((24 << 23) + (1 << (24 - TH_FMA)));
    let near = ((d.to_bits() & 0x7fff_ffff) as i32 > thr as i32) as u32;
    (res, near)
}

/// The lane evaluation of this target's portable path: fp32 with fused multiply-adds where the
/// baseline has them (aarch64), else f64.
#[inline(always)]
fn lane(y: f32) -> (f32, u32) {
    #[cfg(target_arch = "aarch64")]
    return lane_fma(y);
    #[cfg(not(target_arch = "aarch64"))]
    return lane_f64(y);
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
    // SAFETY: the caller's
    unsafe { map_chunks(src, dst, n, aff, range, false, lane) }
}

/// `dst[i] = 1 / sqrt(src[i])` in f64 rounded once for every fp32 input (the ALU's `rsqrt`,
/// alu.rs's `apply`: no range; inputs outside 2^-87 .. 2^97, zeros, negatives and NaN take the
/// formula itself).
///
/// # Safety
/// `src` and `dst` valid for `n` fp32 values (unaligned), either equal or disjoint.
#[inline(always)]
pub unsafe fn map_unrestricted(src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: the caller's
    unsafe { map_chunks(src, dst, n, (1.0, -0.0), RANGE, true, lane) }
}

/// `map` (`unrestricted` false: NaN outside `[lo, hi]`) or `map_unrestricted` (the formula
/// outside `[lo, hi]`, which is then `RANGE`) with `lane` the evaluation: chunks of 16 lanes
/// (8 measured 9 % slower on SSE2), the flags `u32` lanes OR-reduced, the rare flagged chunk
/// and the last n mod 16 values lane by lane.
///
/// # Safety
/// As `map`.
#[inline(always)]
unsafe fn map_chunks(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    (scale, bias): (f32, f32),
    (lo, hi): (f32, f32),
    unrestricted: bool,
    lane: impl Fn(f32) -> (f32, u32),
) {
    const W: usize = 16;
    let load = |i: usize| {
        // SAFETY: i < n; the callers pass pointers valid for n (unaligned) values
        unsafe { src.add(i).read_unaligned() * scale + bias }
    };
    let one = |y: f32| {
        if !(y < lo || y > hi) {
            let (r, near) = lane(y);
            if near != 0 || y.is_nan() {
                exact(y)
            } else {
                r
            }
        } else if unrestricted {
            exact(y)
        } else {
            f32::NAN
        }
    };
    let mut i = 0;
    while i + W <= n {
        let mut out = [0f32; W];
        let mut any = 0u32;
        for (j, o) in out.iter_mut().enumerate() {
            let y = load(i + j);
            let inside = !((y < lo) | (y > hi));
            let (r, near) = lane(y);
            any |= ((near | y.is_nan() as u32) & inside as u32) | (!inside & unrestricted) as u32;
            *o = if inside { r } else { f32::NAN };
        }
        if any != 0 {
            // the rare chunk with a flagged lane: each lane again, one at a time
            for (j, o) in out.iter_mut().enumerate() {
                *o = one(load(i + j));
            }
        }
        for (j, o) in out.iter().enumerate() {
            // SAFETY: i + j < n; src == dst is read above before this write
            unsafe { dst.add(i + j).write_unaligned(*o) };
        }
        i += W;
    }
    for j in i..n {
        let r = one(load(j));
        // SAFETY: j < n
        unsafe { dst.add(j).write_unaligned(r) };
    }
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

/// `map_chunks` with `lane_fma` (aarch64's portable path) over `v` in place, compiled here with
/// x86's fused multiply-adds (IEEE fma: the same bits as aarch64's), within `range` unless
/// `unrestricted` (RANGE); for `engines::act_simple`'s exhaustive test `exhaustive_rsqrt_fma`.
///
/// # Safety
/// The host must have FMA.
#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "fma")]
pub(crate) unsafe fn map_fma_for_tests(v: &mut [f32], range: (f32, f32), unrestricted: bool) {
    let p = v.as_mut_ptr();
    let range = if unrestricted { RANGE } else { range };
    // SAFETY: in place over v's own values
    unsafe { map_chunks(p, p, v.len(), (1.0, -0.0), range, unrestricted, lane_fma) }
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

    /// `lane_fma` on every 997th fp32 of the valid range: where it raises no flag, the f64
    /// formula's bits (fused multiply-adds by x86's FMA where the host has it, else libm's).
    #[test]
    fn lane_fma_unflagged_lanes_are_exact() {
        let (mut kept, mut bad) = (0usize, 0usize);
        for b in (0x1400_0000u32..=0x7000_0000).step_by(997) {
            let y = f32::from_bits(b);
            let (r, near) = lane_fma(y);
            if near == 0 {
                kept += 1;
                bad += (r.to_bits() != exact(y).to_bits()) as usize;
            }
        }
        assert_eq!(bad, 0);
        // the flag is rare (about one lane in 2^16)
        assert!(kept + 100 > 1_548_148, "{kept}");
    }
}
