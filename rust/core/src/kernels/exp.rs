//! fp32 `exp` (and `sigmoid`, `silu`, `tanh`) over slices, bit-identical to the emulator's
//! definition `(x as f64).exp() as f32` (libm's f64 exp rounded once to fp32; engines/act.rs,
//! which also holds the sigmoid / silu f64 formulas and `(x as f64).tanh() as f32`) but several
//! times faster.
//!
//! Per element: a fast f64 exp `y` with a proven relative error, then a rounding check. With
//! `D = 2^-44` comfortably above (this error + libm's), libm's f64 result lies in
//! `[y(1-D), y(1+D)]`; when both ends round to the same fp32 value, so does libm's result
//! (rounding is monotone), and that value is returned. Otherwise (the exact value is within
//! ~2^-44 relative of an fp32 rounding midpoint: 730 of the 2^32 - 2^24 non-NaN inputs; also
//! NaN) the element takes the caller's scalar path. So every SIMD path gives the same bits by
//! construction.
//!
//! The fast exps: exp_portable.rs (f64 lanes in plain Rust, a 2048-entry table: < 2^-50
//! relative; for exp itself an fp32-lane first try, exp_f32.rs, with a check of its own that
//! sends about one lane in 2^9 to the f64 lanes), exp_avx2.rs and exp_avx512.rs (intrinsics;
//! < 2^-42.5, with a cheaper bit test first and a narrower interval for the rest, exp_x86.rs);
//! each module derives its bound. libm's exp is within 1 ulp (2^-52).

use super::simd;

/// Relative half-width of the interval that must round to one fp32 value (see the module doc).
const D: f64 = 1.0 / (1u64 << 44) as f64;
/// 2^(j/16), j = 0..16, each the f64 nearest (the x86 kernels' tables too).
pub(super) const POW2_16: [f64; 16] = [
    1.0,
    1.0442737824274138,
    1.0905077326652577,
    1.1387886347566916,
    1.189207115002721,
    1.241857812073484,
    1.2968395546510096,
    1.3542555469368927,
    std::f64::consts::SQRT_2,
    1.4768261459394993,
    1.5422108254079407,
    1.6104903319492543,
    1.681792830507429,
    1.7562521603732995,
    1.8340080864093424,
    1.9152065613971474,
];

/// Below this |x| tanh takes its Taylor polynomial, above it `(1 - e) / (1 + e)`, e = exp(-2|x|).
pub(super) const TANH_SMALL: f64 = 0.125;
/// tanh(x) / x = sum of `TANH_C[k] x^2k` (Taylor, k = 0..=6; the coefficients alternate in sign
/// and decrease, so the first omitted term, 0.00146 x^14 <= 2^-51.4 for |x| < 1/8, bounds the
/// truncation).
pub(super) const TANH_C: [f64; 7] = [
    1.0,
    -1.0 / 3.0,
    2.0 / 15.0,
    -17.0 / 315.0,
    62.0 / 2835.0,
    -1382.0 / 155925.0,
    21844.0 / 6081075.0,
];

/// The functions with a fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    Exp,
    Sigmoid,
    Silu,
    Tanh,
}

/// The affine step before the function, `x * scale + bias` in fp32 (two roundings, as
/// `act::apply_affine_slice`), for the SIMD kernels, which apply it in vectors and skip the
/// operations that cannot change the result (`ops`).
#[derive(Clone, Copy)]
pub struct Affine {
    pub scale: f32,
    pub bias: f32,
}

impl Affine {
    /// `x * 1 + -0`: no step.
    pub const IDENTITY: Affine = Affine {
        scale: 1.0,
        bias: -0.0,
    };

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) fn scalar(self, x: f32) -> f32 {
        x * self.scale + self.bias
    }

    /// Whether the multiply and the add are needed for `f`: `* 1` is exact (a signalling NaN
    /// would be quieted, but the kernels recompute NaN lanes from the input in their scalar
    /// fallback), `+ -0.0` is exact, and `+ 0.0` only turns -0 into +0, where exp and sigmoid
    /// agree.
    #[inline(always)]
    pub(super) fn ops(self, f: Func) -> (bool, bool) {
        let mul = self.scale != 1.0;
        let add = !(self.bias == 0.0
            && (self.bias.is_sign_negative() || f == Func::Exp || f == Func::Sigmoid));
        (mul, add)
    }
}

/// The fp32 rounding of `y` when it is certain, and whether it is.
#[inline(always)]
pub(super) fn certain(y: f64) -> (f32, bool) {
    let lo = (y * (1.0 - D)) as f32;
    let hi = (y * (1.0 + D)) as f32;
    (lo, lo == hi) // false for NaN
}

/// `v[i] = f(pre(v[i]))` with `pre` the fp32 step before the function (affine, subtraction)
/// and `slow` the caller's scalar `f`, used for the elements the fast path cannot decide; on
/// finite inputs it must equal act.rs's f64 formula rounded to fp32 (`(x as f64).exp() as f32`
/// for exp). Returns how many elements took `slow`.
pub fn map(
    f: Func,
    v: &mut [f32],
    pre: impl Fn(f32) -> f32 + Copy,
    slow: impl Fn(f32) -> f32 + Copy,
) -> usize {
    match simd::path() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the path is only chosen when the host has the features (simd::path).
        simd::Path::Avx512 => unsafe { super::exp_avx512::map(f, v, pre, slow) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 + FMA.
        simd::Path::Avx2Fma => unsafe { super::exp_avx2::map(f, v, pre, slow) },
        _ => {
            let p = v.as_mut_ptr();
            // SAFETY: src = dst = v.
            unsafe { super::exp_portable::map_raw(f, p, p, v.len(), pre, slow) }
        }
    }
}

/// `dst[i] = f(src[i] * scale + bias)` over `len` fp32 values on the host's kernel, or None
/// (the callers then take their own loops) on a big-endian host, where the byte callers' fp32
/// values are not in the host's order.
///
/// # Safety
/// `src` and `dst` valid for `len` (unaligned) fp32 values, equal or disjoint.
#[inline(always)]
unsafe fn simd_affine(
    f: Func,
    aff: Affine,
    src: *const f32,
    dst: *mut f32,
    len: usize,
    slow: impl Fn(f32) -> f32,
) -> Option<usize> {
    match simd::path() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the path is only chosen when the host has the features (simd::path); the
        // pointers as the caller guarantees.
        simd::Path::Avx512 => {
            Some(unsafe { super::exp_avx512::map_affine_raw(f, aff, src, dst, len, slow) })
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 + FMA.
        simd::Path::Avx2Fma => {
            Some(unsafe { super::exp_avx2::map_affine_raw(f, aff, src, dst, len, slow) })
        }
        // SAFETY: the pointers as the caller guarantees.
        _ if cfg!(target_endian = "little") => {
            Some(unsafe { super::exp_portable::map_affine_raw(f, aff, src, dst, len, slow) })
        }
        _ => None,
    }
}

/// `dst[i] = f(pre(src[i]))` over little-endian fp32 bytes (equal lengths, multiples of 4),
/// with `map`'s contract: one pass from the input bytes to the output bytes.
pub fn map_bytes(
    f: Func,
    src: &[u8],
    dst: &mut [u8],
    pre: impl Fn(f32) -> f32 + Copy,
    slow: impl Fn(f32) -> f32 + Copy,
) -> usize {
    match simd::path() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the path is only chosen when the host has the features (simd::path).
        simd::Path::Avx512 => {
            return unsafe { super::exp_avx512::map_bytes(f, src, dst, pre, slow) }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 + FMA.
        simd::Path::Avx2Fma => {
            return unsafe { super::exp_avx2::map_bytes(f, src, dst, pre, slow) }
        }
        _ if cfg!(target_endian = "little") => {
            assert_eq!(src.len(), dst.len());
            let (s, d) = (src.as_ptr() as *const f32, dst.as_mut_ptr() as *mut f32);
            // SAFETY: both hold len / 4 (unaligned) fp32 values in the host's order and are
            // disjoint (one is borrowed mutably).
            return unsafe { super::exp_portable::map_raw(f, s, d, src.len() / 4, pre, slow) };
        }
        _ => {}
    }
    let mut buf = [0f32; 256];
    let mut fallbacks = 0;
    for (s, d) in src.chunks(4 * buf.len()).zip(dst.chunks_mut(4 * buf.len())) {
        let v = &mut buf[..s.len() / 4];
        for (x, e) in v.iter_mut().zip(s.chunks_exact(4)) {
            *x = f32::from_le_bytes(e.try_into().unwrap());
        }
        fallbacks += map(f, v, pre, slow);
        for (o, y) in d.chunks_exact_mut(4).zip(v.iter()) {
            o.copy_from_slice(&y.to_le_bytes());
        }
    }
    fallbacks
}

/// `v[i] = f(v[i] * scale + bias)` (the fp32 multiply and add rounded separately, as
/// `act::apply_affine_slice`), `map`'s contract with that `pre`; the kernels leave out the
/// operations that cannot change the result (`Affine::ops`).
pub fn map_affine(
    f: Func,
    v: &mut [f32],
    (scale, bias): (f32, f32),
    slow: impl Fn(f32) -> f32 + Copy,
) -> usize {
    let p = v.as_mut_ptr();
    // SAFETY: src = dst = v.
    if let Some(n) = unsafe { simd_affine(f, Affine { scale, bias }, p, p, v.len(), slow) } {
        return n;
    }
    map(f, v, |x| x * scale + bias, slow)
}

/// `map_affine` from little-endian fp32 bytes to fp32 bytes (equal lengths, multiples of 4):
/// one pass from the input bytes to the output bytes.
pub fn map_affine_bytes(
    f: Func,
    src: &[u8],
    dst: &mut [u8],
    (scale, bias): (f32, f32),
    slow: impl Fn(f32) -> f32 + Copy,
) -> usize {
    assert_eq!(src.len(), dst.len());
    let (s, d) = (src.as_ptr() as *const f32, dst.as_mut_ptr() as *mut f32);
    let aff = Affine { scale, bias };
    // SAFETY: both slices hold len / 4 (unaligned) fp32 values and are disjoint (one is
    // borrowed mutably).
    if let Some(n) = unsafe { simd_affine(f, aff, s, d, src.len() / 4, slow) } {
        return n;
    }
    map_bytes(f, src, dst, |x| x * scale + bias, slow)
}

/// `map_affine` from little-endian fp32 bytes into fp32 values (`src` holds `dst.len()`
/// values).
pub fn map_affine_into(
    f: Func,
    src: &[u8],
    dst: &mut [f32],
    (scale, bias): (f32, f32),
    slow: impl Fn(f32) -> f32 + Copy,
) -> usize {
    assert_eq!(src.len(), 4 * dst.len());
    let (s, d) = (src.as_ptr() as *const f32, dst.as_mut_ptr());
    // SAFETY: src holds dst.len() (unaligned) fp32 values and is disjoint from dst (borrowed
    // mutably).
    if let Some(n) = unsafe { simd_affine(f, Affine { scale, bias }, s, d, dst.len(), slow) } {
        return n;
    }
    for (v, e) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *v = f32::from_le_bytes([e[0], e[1], e[2], e[3]]);
    }
    map(f, dst, |x| x * scale + bias, slow)
}

/// `map(Func::Exp, ..)`.
pub fn exp_map(
    v: &mut [f32],
    pre: impl Fn(f32) -> f32 + Copy,
    slow: impl Fn(f32) -> f32 + Copy,
) -> usize {
    map(Func::Exp, v, pre, slow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::exp_portable::{self, exp_f64, tanh_f64, X_MAX, X_MIN};
    use crate::kernels::simd::Path;

    fn libm(x: f32) -> f32 {
        (x as f64).exp() as f32
    }

    /// The paths this host can run.
    fn paths() -> Vec<Path> {
        [Path::Portable, Path::Avx2Fma, Path::Avx512]
            .into_iter()
            .filter(|p| simd::host_supports(*p))
            .collect()
    }

    /// Run the kernel for `f` on `xs` on the path `p`, with `want` as the fallback; compare
    /// bitwise with `want`. Returns (mismatches, fallbacks).
    fn check_with(p: Path, f: Func, xs: &[f32], want: fn(f32) -> f32) -> (usize, usize) {
        let mut v = xs.to_vec();
        let n = match p {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => unsafe { crate::kernels::exp_avx512::map(f, &mut v, |x| x, want) },
            #[cfg(target_arch = "x86_64")]
            Path::Avx2Fma => unsafe { crate::kernels::exp_avx2::map(f, &mut v, |x| x, want) },
            _ => {
                let p = v.as_mut_ptr();
                // SAFETY: src = dst = v.
                unsafe { exp_portable::map_raw(f, p, p, v.len(), |x| x, want) }
            }
        };
        let bad = xs
            .iter()
            .zip(&v)
            .filter(|(x, y)| want(**x).to_bits() != y.to_bits())
            .count();
        (bad, n)
    }

    fn check_on(p: Path, xs: &[f32]) -> (usize, usize) {
        check_with(p, Func::Exp, xs, libm)
    }

    /// Every `stride`-th bit pattern, plus a dense linear sweep of [-104, 89], the neighbourhoods
    /// of the overflow / subnormal / underflow thresholds, and the specials.
    fn inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (0..=u32::MAX / 4099)
            .map(|k| f32::from_bits(k * 4099))
            .collect();
        let m = 2_000_000;
        xs.extend((0..=m).map(|k| (-104.0 + 193.0 * k as f64 / m as f64) as f32));
        for t in [
            88.722_84f32,
            -87.336_55,
            -103.278_93,
            -103.972_08,
            1e-30,
            1.0,
            -1.0,
        ] {
            let b = t.to_bits() as i64;
            xs.extend((b - 20_000..b + 20_000).map(|b| f32::from_bits(b as u32)));
        }
        xs.extend([
            0.0,
            -0.0,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7fa0_0001), // signalling NaN with a payload
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            X_MIN,
            X_MAX,
            88.0,
            89.0,
            -104.0,
        ]);
        xs
    }

    #[test]
    fn matches_libm_bitwise_on_every_path() {
        let xs = inputs();
        assert!(xs.len() > 2_000_000);
        let nans = xs.iter().filter(|x| x.is_nan()).count();
        for p in paths() {
            let (bad, fallbacks) = check_on(p, &xs);
            assert_eq!(bad, 0, "{p:?}: {bad} of {} differ from libm", xs.len());
            // NaNs always take the scalar path; of the rest ~1e-6 are expected to, while a broken
            // fast path (always ambiguous) would send everything there
            let others = fallbacks - nans;
            eprintln!(
                "{p:?}: {others} fallbacks of {} non-NaN inputs",
                xs.len() - nans
            );
            assert!(others < 200, "{p:?}: {others} fallbacks of {}", xs.len());
        }
    }

    #[test]
    fn fast_exp_is_within_its_error_bound() {
        // the bound the rounding check relies on, measured against libm on finite in-range inputs
        let mut worst = 0f64;
        for x in inputs() {
            if !(X_MIN..=X_MAX).contains(&x) {
                continue;
            }
            let l = (x as f64).exp();
            for y in [exp_f64::<false>(x), exp_f64::<true>(x)] {
                worst = worst.max(((y - l) / l).abs());
            }
        }
        eprintln!("portable exp: worst relative error 2^{:.2}", worst.log2());
        // the module doc's 2^-50 (the check's D = 2^-44 leaves room)
        assert!(worst < 2f64.powi(-50), "worst relative error {worst:e}");
        assert!(worst > 0.0);
    }

    #[test]
    fn pre_and_fallback_are_applied_in_order() {
        // pre runs before exp on every element, including the remainder after whole chunks;
        // slow is only called for elements the fast path cannot decide (here: NaN)
        let xs: Vec<f32> = (0..37).map(|k| k as f32 * 0.25 - 4.0).collect();
        let mut v = xs.clone();
        v[5] = f32::NAN;
        v[36] = f32::NAN;
        let n = exp_map(&mut v, |x| x * 2.0 + 1.0, |_| -7.0);
        assert_eq!(n, 2);
        for (k, (x, y)) in xs.iter().zip(&v).enumerate() {
            let want = if k == 5 || k == 36 {
                -7.0
            } else {
                libm(x * 2.0 + 1.0)
            };
            assert_eq!(y.to_bits(), want.to_bits(), "element {k}");
        }
    }

    /// The activation engine's definitions (engines/act.rs), written out here: f64 formula, one
    /// rounding, limits at +-inf.
    fn sigmoid64(v: f64) -> f64 {
        if v >= 0.0 {
            1.0 / (1.0 + (-v).exp())
        } else {
            v.exp() / (1.0 + v.exp())
        }
    }

    fn sigmoid_ref(x: f32) -> f32 {
        match x {
            f32::INFINITY => 1.0,
            f32::NEG_INFINITY => 0.0,
            _ => sigmoid64(x as f64) as f32,
        }
    }

    fn silu_ref(x: f32) -> f32 {
        match x {
            f32::INFINITY => f32::INFINITY,
            f32::NEG_INFINITY => 0.0,
            _ => (x as f64 * sigmoid64(x as f64)) as f32,
        }
    }

    /// act.rs's tanh: libm's f64 tanh rounded once, +-1 at +-inf.
    fn tanh_ref(x: f32) -> f32 {
        match x {
            f32::INFINITY => 1.0,
            f32::NEG_INFINITY => -1.0,
            _ => (x as f64).tanh() as f32,
        }
    }

    /// Inputs for tanh: `inputs()` plus dense sweeps around the branch point 1/8, the range
    /// where tanh leaves 1.0 (|x| ~ 9) and small magnitudes.
    fn tanh_inputs() -> Vec<f32> {
        let mut xs = inputs();
        for t in [
            0.125f32, -0.125, 9.010_913, -9.010_913, 1e-4, 2e-13, 0.5, 3.0,
        ] {
            let b = t.to_bits() as i64;
            xs.extend((b - 200_000..b + 200_000).map(|b| f32::from_bits(b as u32)));
        }
        xs
    }

    #[test]
    fn tanh_matches_libm_bitwise_on_every_path() {
        let xs = tanh_inputs();
        let nans = xs.iter().filter(|x| x.is_nan()).count();
        for p in paths() {
            let (bad, fallbacks) = check_with(p, Func::Tanh, &xs, tanh_ref);
            assert_eq!(bad, 0, "{p:?} tanh: {bad} of {} differ", xs.len());
            let others = fallbacks - nans;
            eprintln!("{p:?} tanh: {others} fallbacks of {}", xs.len());
            assert!(others < 400, "{p:?} tanh: {others} fallbacks");
        }
    }

    #[test]
    fn fast_tanh_is_within_its_error_bound() {
        // the bound the rounding check relies on (module doc of tanh_f64), against libm
        let mut worst = 0f64;
        for x in tanh_inputs() {
            if !x.is_finite() || x == 0.0 {
                continue;
            }
            let l = (x as f64).tanh();
            for y in [tanh_f64::<false>(x), tanh_f64::<true>(x)] {
                worst = worst.max(((y - l) / l).abs());
            }
        }
        assert!(worst < 2f64.powi(-45), "worst relative error {worst:e}");
        assert!(worst > 0.0);
    }

    #[test]
    fn sigmoid_and_silu_match_their_f64_formulas_bitwise() {
        let xs = inputs();
        // for |x| < 2^-124 silu(x) = x/2 (1 + x/2 + ...) where x/2 is an fp32 subnormal
        // rounding midpoint for odd x: inherently undecidable from an approximation, half of
        // those fall back
        let undecidable = |x: &f32| x.abs() < 2f32.powi(-124);
        let decidable: Vec<f32> = xs.iter().copied().filter(|x| !undecidable(x)).collect();
        for p in paths() {
            for (f, want) in [
                (Func::Sigmoid, sigmoid_ref as fn(f32) -> f32),
                (Func::Silu, silu_ref),
            ] {
                let (bad, _) = check_with(p, f, &xs, want);
                assert_eq!(bad, 0, "{p:?} {f:?}: {bad} of {} differ", xs.len());
                let (_, fallbacks) = check_with(p, f, &decidable, want);
                let others = fallbacks - decidable.iter().filter(|x| x.is_nan()).count();
                eprintln!("{p:?} {f:?}: {others} fallbacks of {}", decidable.len());
                assert!(others < 400, "{p:?} {f:?}: {others} fallbacks");
            }
        }
    }

    /// The paths an exhaustive test runs: every path the host has, or only the one named by
    /// `TRN3EMU_EXHAUSTIVE_PATH` (`simd::parse` names).
    fn exhaustive_paths() -> Vec<Path> {
        let only = std::env::var("TRN3EMU_EXHAUSTIVE_PATH").ok();
        let only = only.map(|n| simd::parse(&n).expect("TRN3EMU_EXHAUSTIVE_PATH: a path name"));
        paths()
            .into_iter()
            .filter(|p| only.is_none_or(|o| o == *p))
            .collect()
    }

    /// All 2^32 inputs on every path (release: `cargo test --release -p trn3emu-core --
    /// --ignored exhaustive`; one path: `TRN3EMU_EXHAUSTIVE_PATH=portable`).
    #[test]
    #[ignore]
    fn exhaustive_matches_libm() {
        for p in exhaustive_paths() {
            let (mut bad, mut fallbacks) = (0usize, 0usize);
            let block = 1u64 << 24;
            let mut start = 0u64;
            while start < 1u64 << 32 {
                let xs: Vec<f32> = (start..start + block)
                    .map(|b| f32::from_bits(b as u32))
                    .collect();
                let (b, f) = check_on(p, &xs);
                bad += b;
                fallbacks += f;
                start += block;
            }
            eprintln!("{p:?}: {bad} mismatches, {fallbacks} fallbacks of 2^32");
            assert_eq!(bad, 0);
        }
    }

    /// Sigmoid, silu and tanh on all 2^32 inputs, on every path the host has (release,
    /// `--ignored`; one path: `TRN3EMU_EXHAUSTIVE_PATH`).
    #[test]
    #[ignore]
    fn exhaustive_sigmoid_silu_tanh() {
        for p in exhaustive_paths() {
            exhaustive_functions(p);
        }
    }

    fn exhaustive_functions(p: Path) {
        for (f, want) in [
            (Func::Sigmoid, sigmoid_ref as fn(f32) -> f32),
            (Func::Silu, silu_ref),
            (Func::Tanh, tanh_ref),
        ] {
            let (mut bad, mut fallbacks) = (0usize, 0usize);
            let block = 1u64 << 24;
            let mut start = 0u64;
            while start < 1u64 << 32 {
                let xs: Vec<f32> = (start..start + block)
                    .map(|b| f32::from_bits(b as u32))
                    .collect();
                let (b, n) = check_with(p, f, &xs, want);
                bad += b;
                fallbacks += n;
                start += block;
            }
            eprintln!("{p:?} {f:?}: {bad} mismatches, {fallbacks} fallbacks of 2^32");
            assert_eq!(bad, 0);
        }
    }
}
