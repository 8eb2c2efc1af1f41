//! Vectorised loops for the ScalarE functions whose f64 formula (`act::apply_checked`) has a
//! short branch-free form with the same bits: abs, relu, square, sqrt, reciprocal, rsqrt and log.
//!
//! Why the forms are exact: for an fp32 `y`, `y * y`, `1 / y` and `sqrt(y)` computed in f64 and
//! rounded once to fp32 equal the fp32 operations, because f64's 53 bits are at least 2 * 24 + 2
//! (double rounding is innocuous for +, -, *, / and sqrt; Figueroa, "When is double rounding
//! innocuous?", 1995), and the ranges keep subnormals and overflow out (square's subnormal
//! and overflowing results are those of the one rounding too: the f64 product is exact). abs
//! and relu move bits. rsqrt and log keep their f64 values (`1 / sqrt`, libm's `ln`), reached
//! through a cheaper approximation that is kept only where it provably rounds the same
//! (kernels/rsqrt.rs, kernels/log.rs; log has its own AVX-512 and AVX2 kernels).
//! The range checks are the same fp32 comparisons (`act::valid_range` bounds rounded to fp32,
//! powers of two, exact); out of range gives the canonical quiet NaN, a NaN input its own NaN.
//!
//! NaN payloads: every caller applies the fp32 affine step first (`x * scale + bias`), whose
//! multiply quiets a signalling NaN, so each function sees quiet NaNs only, which the fp32
//! forms pass through as the f64 formulas do (abs clears the sign, as f64 abs does).
//!
//! The loop is compiled three times (AVX-512F, AVX2, baseline) and picked by `simd::path()`;
//! every form is IEEE operations with no fused multiply-add, so all paths give the same bits.

use super::act;
use crate::isa::ActFn;
use crate::kernels::simd;
#[cfg(any(target_arch = "x86_64", test))]
use crate::kernels::simd::Path;
use crate::kernels::{log, rsqrt};
#[cfg(target_arch = "x86_64")]
use crate::kernels::{log_avx2, log_avx512, rsqrt_avx2, rsqrt_avx512};

/// A function with a vectorised form here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Simple {
    Abs,
    Relu,
    Square,
    Sqrt,
    Reciprocal,
    Rsqrt,
    Log,
    /// The ALU's rsqrt: the same formula on every input (no valid range, no affine step).
    RsqrtUnrestricted,
}

/// The vectorised form of `f`, if it has one.
pub fn kernel(f: ActFn) -> Option<Simple> {
    Some(match f {
        ActFn::Abs => Simple::Abs,
        ActFn::Relu => Simple::Relu,
        ActFn::Square => Simple::Square,
        ActFn::Sqrt => Simple::Sqrt,
        ActFn::Reciprocal => Simple::Reciprocal,
        ActFn::Rsqrt => Simple::Rsqrt,
        ActFn::Log => Simple::Log,
        _ => return None,
    })
}

/// `act::valid_range(f)` rounded to fp32 (as `apply_checked` compares), or the whole line.
fn bounds(f: ActFn) -> (f32, f32) {
    match act::valid_range(f) {
        Some((lo, hi)) => (lo as f32, hi as f32),
        None => (f32::NEG_INFINITY, f32::INFINITY),
    }
}

/// `dst[i] = f(src[i] * scale + bias)` over `n` values, `f` the function `apply_checked` gives.
#[inline(always)]
fn run(k: Simple, src: *const f32, dst: *mut f32, n: usize, (scale, bias): (f32, f32)) {
    #[inline(always)]
    fn each(
        src: *const f32,
        dst: *mut f32,
        n: usize,
        (scale, bias): (f32, f32),
        g: impl Fn(f32) -> f32,
    ) {
        for i in 0..n {
            // SAFETY: the callers pass pointers valid for n (unaligned) values; src may be dst
            // (each value is read before it is written, at the same index).
            unsafe {
                let y = src.add(i).read_unaligned() * scale + bias;
                dst.add(i).write_unaligned(g(y));
            }
        }
    }
    let nan = f32::NAN;
    let (lo, hi) = bounds(match k {
        Simple::Sqrt => ActFn::Sqrt,
        Simple::Reciprocal => ActFn::Reciprocal,
        Simple::Rsqrt => ActFn::Rsqrt,
        Simple::Log => ActFn::Log,
        _ => ActFn::Copy,
    });
    let range = |v: f32| !(v < lo || v > hi);
    match k {
        Simple::Abs => each(src, dst, n, (scale, bias), |y| y.abs()),
        Simple::Relu => each(src, dst, n, (scale, bias), |y| {
            if y > 0.0 || y.is_nan() {
                y
            } else {
                0.0
            }
        }),
        Simple::Square => each(src, dst, n, (scale, bias), |y| y * y),
        Simple::Sqrt => each(src, dst, n, (scale, bias), |y| {
            if range(y) {
                y.sqrt()
            } else {
                nan
            }
        }),
        Simple::Reciprocal => each(src, dst, n, (scale, bias), |y| {
            if range(y.abs()) {
                1.0 / y
            } else {
                nan
            }
        }),
        // SAFETY (these three): run's callers pass pointers valid for n values, equal or disjoint
        Simple::Rsqrt => unsafe { rsqrt::map(src, dst, n, (scale, bias), (lo, hi)) },
        Simple::Log => unsafe { log::map(src, dst, n, (scale, bias), (lo, hi)) },
        Simple::RsqrtUnrestricted => unsafe { rsqrt::map_unrestricted(src, dst, n) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn run_avx512(k: Simple, src: *const f32, dst: *mut f32, n: usize, aff: (f32, f32)) {
    run(k, src, dst, n, aff)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_avx2(k: Simple, src: *const f32, dst: *mut f32, n: usize, aff: (f32, f32)) {
    run(k, src, dst, n, aff)
}

/// # Safety
/// `src` and `dst` valid for `n` fp32 values (unaligned), either equal or disjoint.
unsafe fn dispatch(k: Simple, src: *const f32, dst: *mut f32, n: usize, aff: (f32, f32)) {
    match simd::path() {
        // SAFETY: simd::path() only names paths this host supports
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 if k == Simple::Log => unsafe {
            log_avx512::map(src, dst, n, aff, bounds(ActFn::Log))
        },
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 if k == Simple::Rsqrt => unsafe {
            rsqrt_avx512::map(src, dst, n, aff, bounds(ActFn::Rsqrt), false)
        },
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 if k == Simple::RsqrtUnrestricted => unsafe {
            rsqrt_avx512::map(src, dst, n, aff, rsqrt::RANGE, true)
        },
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { run_avx512(k, src, dst, n, aff) },
        #[cfg(target_arch = "x86_64")]
        Path::Avx2Fma if k == Simple::Rsqrt => unsafe {
            rsqrt_avx2::map(src, dst, n, aff, bounds(ActFn::Rsqrt), false)
        },
        #[cfg(target_arch = "x86_64")]
        Path::Avx2Fma if k == Simple::RsqrtUnrestricted => unsafe {
            rsqrt_avx2::map(src, dst, n, aff, rsqrt::RANGE, true)
        },
        #[cfg(target_arch = "x86_64")]
        Path::Avx2Fma if k == Simple::Log => unsafe {
            log_avx2::map(src, dst, n, aff, bounds(ActFn::Log))
        },

        #[cfg(target_arch = "x86_64")]
        Path::Avx2Fma => unsafe { run_avx2(k, src, dst, n, aff) },
        _ => run(k, src, dst, n, aff),
    }
}

/// `v[i] = apply_checked(f, fl32(fl32(v[i] * scale) + bias), 0)` for `k = kernel(f)`.
pub fn map_affine(k: Simple, v: &mut [f32], aff: (f32, f32)) {
    let p = v.as_mut_ptr();
    // SAFETY: in place over v's own values
    unsafe { dispatch(k, p, p, v.len(), aff) }
}

/// `map_affine` from little-endian fp32 bytes into fp32 values (`src` holds `dst.len()`).
pub fn map_affine_into(k: Simple, src: &[u8], dst: &mut [f32], aff: (f32, f32)) {
    assert_eq!(src.len(), 4 * dst.len());
    // SAFETY: src holds dst.len() fp32 values and is disjoint from dst (borrowed mutably)
    unsafe {
        dispatch(
            k,
            src.as_ptr() as *const f32,
            dst.as_mut_ptr(),
            dst.len(),
            aff,
        )
    }
}

/// The ALU's `rsqrt` (alu.rs's `apply`: `1 / sqrt` in f64 rounded once, any input) from `src`
/// into `dst` (`n` fp32 values each).
///
/// # Safety
/// `src` and `dst` valid for `n` fp32 values (unaligned), either equal or disjoint.
pub unsafe fn alu_rsqrt(src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: the caller's
    unsafe { dispatch(Simple::RsqrtUnrestricted, src, dst, n, (1.0, -0.0)) }
}

/// `map_affine` from little-endian fp32 bytes to fp32 bytes (equal lengths, multiples of 4).
pub fn map_affine_bytes(k: Simple, src: &[u8], dst: &mut [u8], aff: (f32, f32)) {
    assert_eq!(src.len(), dst.len());
    let (s, d) = (src.as_ptr() as *const f32, dst.as_mut_ptr() as *mut f32);
    // SAFETY: both hold len / 4 fp32 values and are disjoint (dst is borrowed mutably)
    unsafe { dispatch(k, s, d, src.len() / 4, aff) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path (the host's and the narrower ones) against `apply_checked` on all fp32
    /// exponents, signs and a spread of mantissas, NaNs quieted by the affine step included.
    #[test]
    fn simple_forms_give_the_bits_of_apply_checked() {
        let xs: Vec<f32> = (0..=0x1ffu32)
            .flat_map(|e| {
                [0, 1, 0x2a_aaab, 0x40_0000, 0x55_5555, 0x7f_ffff]
                    .map(move |m| f32::from_bits(e << 23 | m))
            })
            .collect();
        for k in [
            ActFn::Abs,
            ActFn::Relu,
            ActFn::Square,
            ActFn::Sqrt,
            ActFn::Reciprocal,
            ActFn::Rsqrt,
            ActFn::Log,
        ] {
            for aff in [(1.0, -0.0), (-0.5, 0.25), (3.0, 0.0)] {
                let want: Vec<u32> = xs
                    .iter()
                    .map(|&x| act::apply_checked(k, x * aff.0 + aff.1, 0.0).to_bits())
                    .collect();
                for p in [Path::Portable, Path::Avx2Fma, Path::Avx512] {
                    if !simd::host_supports(p) {
                        continue;
                    }
                    simd::set_limit(Some(p));
                    let mut v = xs.clone();
                    map_affine(kernel(k).unwrap(), &mut v, aff);
                    simd::set_limit(None);
                    let got: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(got, want, "{k:?} {aff:?} {p:?}");
                }
            }
        }
    }

    /// A bracketed shortcut against the f64 formula on every `step`-th fp32 bit pattern of
    /// `[a, b)` (the valid range and beyond both edges), on every path the host has.
    fn sweep(f: ActFn, (a, b): (u32, u32), step: usize) {
        let xs: Vec<f32> = (a..b).step_by(step).map(f32::from_bits).collect();
        let want: Vec<u32> = xs
            .iter()
            .map(|&x| act::apply_checked(f, x, 0.0).to_bits())
            .collect();
        for p in [Path::Portable, Path::Avx2Fma, Path::Avx512] {
            if !simd::host_supports(p) {
                continue;
            }
            simd::set_limit(Some(p));
            let mut v = xs.clone();
            map_affine(kernel(f).unwrap(), &mut v, (1.0, -0.0));
            simd::set_limit(None);
            let bad = v
                .iter()
                .zip(&want)
                .filter(|(g, w)| g.to_bits() != **w)
                .count();
            assert_eq!(bad, 0, "{f:?} {p:?}: {bad} of {} differ", xs.len());
        }
    }

    /// rsqrt: 2^-96 .. 2^98 (bits); log: 2^-72 .. 2^72
    const RSQRT: (u32, u32) = (0x2f80_0000, 0x7080_0000);
    const LOG: (u32, u32) = (0x1b80_0000, 0x6380_0000);

    #[test]
    fn bracketed_shortcuts_match_the_f64_formulas() {
        sweep(ActFn::Rsqrt, RSQRT, 997);
        sweep(ActFn::Log, LOG, 997);
        // ln near 1, where the result is small: every input from 1 - 2^-10 to 1 + 2^-10
        sweep(ActFn::Log, (0x3f7f_c000, 0x3f80_2000), 1);
    }

    /// Every one of the 2^32 fp32 bit patterns (NaNs, both signs, out of range included), in
    /// blocks of 2^24, through `run` on every path the host has (or only the path named by
    /// `TRN3EMU_EXHAUSTIVE_PATH`), against `want`'s bits; returns the mismatches.
    fn sweep_all(want: impl Fn(f32) -> f32, run: impl Fn(&mut [f32])) -> usize {
        let only = std::env::var("TRN3EMU_EXHAUSTIVE_PATH").ok();
        let only = only.map(|n| simd::parse(&n).expect("TRN3EMU_EXHAUSTIVE_PATH: a path name"));
        let mut bad = 0;
        for block in 0..256u32 {
            let xs: Vec<f32> = (block << 24..=(block << 24 | 0xff_ffff))
                .map(f32::from_bits)
                .collect();
            let want: Vec<u32> = xs.iter().map(|&x| want(x).to_bits()).collect();
            for p in [Path::Portable, Path::Avx2Fma, Path::Avx512] {
                if !simd::host_supports(p) || only.is_some_and(|o| o != p) {
                    continue;
                }
                simd::set_limit(Some(p));
                let mut v = xs.clone();
                run(&mut v);
                simd::set_limit(None);
                let b = v
                    .iter()
                    .zip(&want)
                    .filter(|(g, w)| g.to_bits() != **w)
                    .count();
                if b != 0 {
                    eprintln!("{p:?} block {block:#x}: {b} mismatches");
                }
                bad += b;
            }
        }
        bad
    }

    /// `sweep_all` of an activation function against `apply_checked`.
    fn sweep_activation(f: ActFn) -> usize {
        sweep_all(
            |x| act::apply_checked(f, x * 1.0 + -0.0, 0.0),
            |v| map_affine(kernel(f).unwrap(), v, (1.0, -0.0)),
        )
    }

    /// The ALU's rsqrt (tensor_scalar) on all 2^32 inputs against alu.rs's `apply`
    /// (`cargo test --release -p trn3emu-core --lib exhaustive_alu_rsqrt -- --ignored`).
    #[test]
    #[ignore]
    fn exhaustive_alu_rsqrt() {
        use crate::engines::alu::apply;
        use crate::isa::AluOp;
        let bad = sweep_all(
            |x| apply(AluOp::Rsqrt, x, 0.0),
            // SAFETY: in place over v's own values
            |v| unsafe { alu_rsqrt(v.as_ptr(), v.as_mut_ptr(), v.len()) },
        );
        assert_eq!(bad, 0);
    }

    /// All 2^32 inputs of rsqrt (as `exhaustive_log`).
    #[test]
    #[ignore]
    fn exhaustive_rsqrt() {
        assert_eq!(sweep_activation(ActFn::Rsqrt), 0);
    }

    /// Every fp32 input through the portable rsqrt's `lane_fma` loop (what aarch64 runs), as the
    /// activation (NaN outside the valid range) and as the ALU's rsqrt (any input), against their
    /// f64 formulas (`cargo test --release -p trn3emu-core --lib exhaustive_rsqrt_fma -- --ignored`).
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore]
    fn exhaustive_rsqrt_fma() {
        use crate::engines::alu;
        use crate::isa::AluOp;
        use crate::kernels::rsqrt::map_fma_for_tests;
        if !std::arch::is_x86_feature_detected!("fma") {
            return;
        }
        let range = act::valid_range(ActFn::Rsqrt).unwrap();
        let range = (range.0 as f32, range.1 as f32);
        let mut bad = [0usize; 2];
        for block in 0..256u32 {
            let xs: Vec<f32> = (block << 24..=(block << 24 | 0xff_ffff))
                .map(f32::from_bits)
                .collect();
            for (k, unrestricted) in [false, true].into_iter().enumerate() {
                let mut v = xs.clone();
                // SAFETY: the host has FMA (checked above)
                unsafe { map_fma_for_tests(&mut v, range, unrestricted) };
                bad[k] += v
                    .iter()
                    .zip(&xs)
                    .filter(|(g, &x)| {
                        let w = if unrestricted {
                            alu::apply(AluOp::Rsqrt, x, 0.0)
                        } else {
                            act::apply_checked(ActFn::Rsqrt, x, 0.0)
                        };
                        g.to_bits() != w.to_bits()
                    })
                    .count();
            }
        }
        assert_eq!(bad, [0, 0]);
    }

    /// All 2^32 inputs of log (`cargo test --release -p trn3emu-core --lib exhaustive_log --
    /// --ignored`, about a minute).
    #[test]
    #[ignore]
    fn exhaustive_log() {
        assert_eq!(sweep_activation(ActFn::Log), 0);
    }

    /// Every fp32 input of the ranges (`cargo test --release -p trn3emu-core --lib
    /// exhaustive_bracketed -- --ignored`, a few minutes).
    #[test]
    #[ignore]
    fn exhaustive_bracketed() {
        sweep(ActFn::Rsqrt, RSQRT, 1);
        sweep(ActFn::Log, LOG, 1);
    }
}
