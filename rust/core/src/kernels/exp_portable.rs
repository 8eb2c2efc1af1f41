//! The portable path of kernels/exp.rs (no instruction-set intrinsics: what aarch64 hosts run,
//! and x86 hosts without AVX2 + FMA): plain Rust in fixed chunks of `W` lanes that LLVM
//! vectorises for the target's baseline (SSE2 on x86-64, NEON on aarch64: two f64 lanes per
//! register). Same contract and same bits as the x86 kernels: every element either passes the
//! interval check (`exp::certain`: its fp32 result provably equals act.rs's f64 formula rounded
//! once) or takes the caller's scalar path, here from a cold per-chunk `fix` (730 of the 2^32 -
//! 2^24 non-NaN exp inputs, and NaN).
//!
//! The fast exp: clamp x to [-150, 100] (outside, fp32 exp is +0 / +inf, and the clamped value
//! gives the same), `x = (n/2048) ln2 + r` with `n = round(2048 x / ln2)` (round-to-nearest by
//! adding 1.5 * 2^41: f64 numbers of that size are multiples of 1/2048) and a Cody-Waite split
//! of ln2 (`q * LN2_HI`, q = n/2048, and `x - q * LN2_HI` are exact: |n| < 2^19, LN2_HI has 32
//! significant bits, both are multiples of 2^-43 when n != 0, where x is an fp32 >= ln2/4096 in
//! magnitude, and their difference is below 2^-12), so |r| <= ln2/4096 + 2^-60 with an absolute
//! error below 2^-64. `exp(x) = 2^(j/2048) 2^floor(n/2048) exp(r)`, j = n mod 2048: `TABLE`
//! holds 2^(j/2048) within 2^-51 relative (built at compile time from `POW2_16`, see `table`)
//! with `j << 41` subtracted from its bits, and adding `n << 41` (the low 23 bits of the sum's
//! pattern hold n) scales it exactly by 2^floor(n/2048) (every result stays a normal f64:
//! floor(n/2048) >= -217). `exp(r) = 1 + r p(r)`, p(r) = 1 + r/2 + r^2/6: truncation <= r^4/4!
//! e^|r| < 2^-54.6; the table (2^-51), the final add (2^-53) and the rest (`tab * r`, Horner,
//! damped by |r| < 2^-12) give < 2^-50.4 in all, with or without fused multiply-adds (aarch64
//! fuses: `FMA`). A 2048-entry table (16 KiB) instead of 16 entries and a degree-6 polynomial:
//! the two-lane f64 arithmetic is bound by its multiply/add ports (~5 cycles per element for exp
//! on SSE2), and the table gather costs the same scalar loads at any size (16 → 256 → 2048
//! entries, degree 6 → 4 → 3: exp 1.47 → 1.27 → 1.05 ms on [128, 4096], SSE2, Xeon 2.6 GHz).
//!
//! Exp itself tries fp32 lanes first (exp_f32.rs: four to a register instead of two, each
//! lane proven or flagged; `run`'s chunks of 16): the flagged lanes (about one in 2^9, and
//! those outside [-87.33, 88.7]) are settled by `redo_exp`, +0 / +inf beyond the limits, the
//! others by the f64 evaluation here, lane by lane when a chunk has at most two, else as two
//! chunks (masked inputs such as -inf cost no more than before). [128, 4096] exp 1.20-1.33 →
//! 0.75-0.76 ms (Intel Xeon, SSE2 baseline, 2026-12-07).
//!
//! Why a chunk loop instead of a per-element loop: the decision mask is built as `u32` lanes and
//! reduced with AND (a `bool` array compiled to byte stores reloaded as one word, a failed store
//! forward costing a quarter of the time), and the rare undecided lanes leave the loop for a
//! cold function so the hot loop stays straight-line.

use super::exp::{certain, Affine, Func, POW2_16, TANH_C, TANH_SMALL};
use super::exp_f32;

/// Lanes per chunk: 4 f64 registers of 2 (4, 8 and 16 measured within noise on SSE2).
const W: usize = 8;
/// log2 of the table size.
const TB: u32 = 11;
const N: usize = 1 << TB;
/// Below this exp rounds to +0 in fp32 (e^-150 < 2^-216), above it to +inf (e^100 > 2^144).
pub(super) const X_MIN: f32 = -150.0;
pub(super) const X_MAX: f32 = 100.0;
/// 1.5 * 2^41: adding it rounds a |v| < 2^40 to a multiple of 1/2048, 2048 times which is held
/// in the low mantissa bits.
const SHIFT: f64 = 1.5 * (1u64 << (52 - TB)) as f64;
const INV_LN2: f64 = std::f64::consts::LOG2_E;
/// ln 2 truncated to 32 significant bits (0x1.62e42feep-1), and the f64 nearest the rest.
const LN2_HI: f64 = 0.693_147_180_369_123_8;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;

/// 2^(j/2048) as `POW2_16[j >> 7] * e^((j & 127) ln2 / 2048)`, the second factor by its Taylor
/// series to a^12/12! (a < 0.0434: truncation < 2^-90; evaluated in f64 within ~1.1 ulp, every
/// Horner step damped by a), the product rounded once: within 2 ulps (2^-51 relative; the test
/// checks each entry against libm's exp2). Bits with `j << 41` subtracted (module doc). Computed
/// by the compiler: the same table on every host.
static TABLE: [u64; N] = table();

const fn table() -> [u64; N] {
    let mut out = [0u64; N];
    let mut j = 0;
    while j < N {
        out[j] = (POW2_16[j >> 7] * pow2_fraction(j)).to_bits() - ((j as u64) << (52 - TB));
        j += 1;
    }
    out
}

/// `e^((j & 127) ln2 / 2048)` by its Taylor series (`TABLE`'s doc), for j < 2048.
pub(super) const fn pow2_fraction(j: usize) -> f64 {
    let a = (j & 127) as f64 * (std::f64::consts::LN_2 / N as f64);
    let mut p = 1.0;
    let mut k = 12;
    while k > 0 {
        p = 1.0 + p * a / k as f64;
        k -= 1;
    }
    p
}

/// Whether `madd` fuses: on aarch64 a fused multiply-add is one instruction of the baseline; on
/// x86 without FMA it would be a library call.
const FMA: bool = cfg!(target_arch = "aarch64");

/// `a * b + c`, fused or with two roundings (`FMA`; the error bounds hold for both, and the tests
/// check both).
#[inline(always)]
fn madd<const FUSED: bool>(a: f64, b: f64, c: f64) -> f64 {
    if FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// The fast f64 exp of an fp32 input, clamped to [X_MIN, X_MAX] (NaN stays NaN).
#[inline(always)]
pub(super) fn exp_f64<const FUSED: bool>(x: f32) -> f64 {
    exp_clamped::<FUSED>(x.clamp(X_MIN, X_MAX)) // NaN stays NaN
}

/// `exp_f64` of an input already in [X_MIN, X_MAX] (or NaN).
#[inline(always)]
fn exp_clamped<const FUSED: bool>(c: f32) -> f64 {
    let v = c as f64;
    let t = madd::<FUSED>(v, INV_LN2, SHIFT);
    let q = t - SHIFT; // n / 2048, exact
    let r = madd::<FUSED>(-q, LN2_LO, v - q * LN2_HI);
    let b = t.to_bits();
    let tab = f64::from_bits(TABLE[(b & (N as u64 - 1)) as usize].wrapping_add(b << (52 - TB)));
    let p = madd::<FUSED>(madd::<FUSED>(r, 1.0 / 6.0, 0.5), r, 1.0);
    madd::<FUSED>(tab * r, p, tab)
}

/// act.rs's sigmoid formula on the fast exp: `1 / (1 + e^-x)` for x >= 0, else `e^x / (1 + e^x)`
/// (one division: the numerator is selected). The exp error changes the result by at most the
/// same relative amount (d/de of either form, times e / s, is at most 1 in magnitude), and the
/// add and divide round twice: < 2^-50 + 2^-52 relative. Inputs below -150 give e^-150 / (1 +
/// e^-150) <= 2^-216 where the true value is smaller still; both round to fp32 +0.
/// `c` is `exp_arg(x)`, e^c = e^-|x| (computed by the caller in a pass of its own).
#[inline(always)]
fn sigmoid_f64<const FUSED: bool>(x: f32, c: f32) -> f64 {
    let e = exp_clamped::<FUSED>(c);
    let num = if x >= 0.0 { 1.0 } else { e };
    num / (1.0 + e)
}

/// `x * sigmoid(x)` (act.rs's silu); one more rounding. Below -150 the clamped sigmoid is not
/// accurate, but there |x| e^x < 150 e^-150 < 2^-200, so the f64 formula rounds to fp32 -0 (also
/// where libm's e^x underflows: x * 0 = -0); -inf (limit +0) goes to the scalar path via NaN.
#[inline(always)]
fn silu_f64<const FUSED: bool>(x: f32, c: f32) -> f64 {
    // computed on every input, then selected: branch-free, so the loop vectorises
    let y = x as f64 * sigmoid_f64::<FUSED>(x, c);
    let low = if x == f32::NEG_INFINITY {
        f64::NAN
    } else {
        -0.0
    };
    if x < X_MIN {
        low
    } else {
        y
    }
}

/// act.rs's tanh (libm's f64 tanh) from the fast exp. For |x| >= 1/8, `(1 - e) / (1 + e)` with
/// e = exp(-2|x|) (-2|x| is exact in fp32; overflow to -inf is clamped like any exp input):
/// an exp error of relative size d moves the result by `2e / (1 - e^2) d` <= 3.96 d at |x| = 1/8
/// (smaller above), plus three roundings: < 2^-47 relative with this exp's 2^-50.4, within the
/// check's 2^-44 with libm's own error (< 2 ulp). Below 1/8 the odd Taylor polynomial (see
/// `TANH_C`): truncation < 2^-51.4, roundings < 2^-51 relative. The sign is copied from x, so
/// -0 stays -0 and tanh stays odd; NaN stays NaN (the caller's scalar path).
#[inline(always)]
pub(super) fn tanh_f64<const FUSED: bool>(x: f32) -> f64 {
    let a = (x as f64).abs();
    // both branches on every input, then selected: branch-free, so the loop vectorises
    let z = a * a;
    let mut p = TANH_C[6];
    for c in TANH_C[1..6].iter().rev() {
        p = madd::<FUSED>(p, z, *c);
    }
    let small = madd::<FUSED>(a * z, p, a);
    let e = exp_f64::<FUSED>(-2.0 * x.abs());
    let big = (1.0 - e) / (1.0 + e);
    let t = if a < TANH_SMALL { small } else { big };
    t.copysign(x as f64)
}

/// Sigmoid's and silu's exp argument, -|x| clamped (exact). `chunk` computes it for the whole
/// chunk in one fp32 pass before the f64 work: four lanes per SSE2 register instead of the two
/// the f64 lanes around it would give (sigmoid 1.61 → 1.38 ms, silu 2.04 → 1.88 on [128, 4096]).
#[inline(always)]
fn exp_arg(x: f32) -> f32 {
    (-x.abs()).clamp(X_MIN, X_MAX)
}

/// The f64 value of `f` (a `Func` as a const: one straight-line loop per function) at x, with
/// `c = exp_arg(x)` for sigmoid and silu.
#[inline(always)]
fn eval<const F: u8, const FUSED: bool>(x: f32, c: f32) -> f64 {
    match F {
        EXP => exp_f64::<FUSED>(x),
        SIGMOID => sigmoid_f64::<FUSED>(x, c),
        SILU => silu_f64::<FUSED>(x, c),
        _ => tanh_f64::<FUSED>(x),
    }
}

const EXP: u8 = 0;
const SIGMOID: u8 = 1;
const SILU: u8 = 2;
const TANH: u8 = 3;

/// The lanes `chunk` left undecided (`ok[i] == 0`): `slow(xs[i])`. Returns how many.
#[cold]
#[inline(never)]
fn fix(xs: &[f32; W], out: &mut [f32; W], ok: &[u32; W], slow: &impl Fn(f32) -> f32) -> usize {
    let mut n = 0;
    for i in 0..W {
        if ok[i] == 0 {
            out[i] = slow(xs[i]);
            n += 1;
        }
    }
    n
}

/// The lanes exp_f32.rs flagged: the limits (+0, +inf) set there, then the rest by the f64
/// evaluation, lane by lane when few (one lane in ~2^8 is flagged for its rounding), else as two
/// chunks of `W`. Returns how many lanes took `slow`.
#[cold]
#[inline(never)]
fn redo_exp(
    xs: &[f32; exp_f32::W],
    out: &mut [f32; exp_f32::W],
    flags: &mut [u32; exp_f32::W],
    slow: &impl Fn(f32) -> f32,
) -> usize {
    let mut left = flags.iter().sum::<u32>();
    if left > 2 {
        left = exp_f32::settle_limits(xs, out, flags);
    }
    if left > 2 {
        let mut n = 0;
        for h in 0..exp_f32::W / W {
            let part = |a: &[f32; exp_f32::W]| -> [f32; W] { a[h * W..][..W].try_into().unwrap() };
            let mut o = [0f32; W];
            n += chunk::<EXP, FMA>(&part(xs), &mut o, slow);
            out[h * W..][..W].copy_from_slice(&o);
        }
        return n;
    }
    let mut n = 0;
    for i in 0..exp_f32::W {
        if flags[i] != 0 {
            if let Some(y) = exp_f32::limit(xs[i]) {
                out[i] = y;
                continue;
            }
            let (y, sure) = certain(exp_f64::<FMA>(xs[i]));
            out[i] = if sure {
                y
            } else {
                n += 1;
                slow(xs[i])
            };
        }
    }
    n
}

/// `out[i] = f(xs[i])` for one chunk; returns how many lanes took `slow`.
#[inline(always)]
fn chunk<const F: u8, const FUSED: bool>(
    xs: &[f32; W],
    out: &mut [f32; W],
    slow: &impl Fn(f32) -> f32,
) -> usize {
    let mut c = [0f32; W];
    if F == SIGMOID || F == SILU {
        for i in 0..W {
            c[i] = exp_arg(xs[i]);
        }
    }
    let mut ok = [0u32; W];
    for i in 0..W {
        let (y, sure) = certain(eval::<F, FUSED>(xs[i], c[i]));
        out[i] = y;
        ok[i] = if sure { u32::MAX } else { 0 };
    }
    if ok.iter().fold(u32::MAX, |a, &b| a & b) == 0 {
        fix(xs, out, &ok, slow)
    } else {
        0
    }
}

/// `dst[i] = f(pre(src[i]))` over `len` values; the whole chunks are read before they are
/// written, so `dst` may be `src`.
///
/// # Safety
/// `src` and `dst` valid for `len` (unaligned) fp32 values, equal or disjoint.
#[inline(always)]
unsafe fn run<const F: u8>(
    src: *const f32,
    dst: *mut f32,
    len: usize,
    pre: impl Fn(f32) -> f32,
    slow: &impl Fn(f32) -> f32,
) -> usize {
    let mut fallbacks = 0;
    let mut i = 0;
    if F == EXP {
        const W32: usize = exp_f32::W;
        while i + W32 <= len {
            // SAFETY: i + W32 <= len (the caller's bounds).
            let raw = unsafe { (src.add(i) as *const [f32; W32]).read_unaligned() };
            let xs = raw.map(&pre);
            let mut out = [0f32; W32];
            let mut flags = [0u32; W32];
            if exp_f32::chunk(&xs, &mut out, &mut flags) != 0 {
                fallbacks += redo_exp(&xs, &mut out, &mut flags, slow);
            }
            // SAFETY: as above.
            unsafe { (dst.add(i) as *mut [f32; W32]).write_unaligned(out) };
            i += W32;
        }
    }
    while i + W <= len {
        // SAFETY: i + W <= len (the caller's bounds).
        let raw = unsafe { (src.add(i) as *const [f32; W]).read_unaligned() };
        let mut out = [0f32; W];
        fallbacks += chunk::<F, FMA>(&raw.map(&pre), &mut out, slow);
        // SAFETY: as above.
        unsafe { (dst.add(i) as *mut [f32; W]).write_unaligned(out) };
        i += W;
    }
    if i < len {
        // the rest padded with 0 (decided for every function)
        let mut xs = [0f32; W];
        for (j, x) in xs.iter_mut().enumerate().take(len - i) {
            // SAFETY: i + j < len.
            *x = pre(unsafe { src.add(i + j).read_unaligned() });
        }
        let mut out = [0f32; W];
        fallbacks += chunk::<F, FMA>(&xs, &mut out, slow);
        for (j, y) in out.iter().enumerate().take(len - i) {
            // SAFETY: as above.
            unsafe { dst.add(i + j).write_unaligned(*y) };
        }
    }
    fallbacks
}

/// `dst[i] = f(pre(src[i]))` over `len` fp32 values (exp.rs's `map` contract). Returns how many
/// elements took `slow`.
///
/// # Safety
/// `src` and `dst` valid for `len` (unaligned) fp32 values, equal or disjoint.
pub(super) unsafe fn map_raw(
    f: Func,
    src: *const f32,
    dst: *mut f32,
    len: usize,
    pre: impl Fn(f32) -> f32,
    slow: impl Fn(f32) -> f32,
) -> usize {
    // SAFETY: the caller's.
    unsafe {
        match f {
            Func::Exp => run::<EXP>(src, dst, len, pre, &slow),
            Func::Sigmoid => run::<SIGMOID>(src, dst, len, pre, &slow),
            Func::Silu => run::<SILU>(src, dst, len, pre, &slow),
            Func::Tanh => run::<TANH>(src, dst, len, pre, &slow),
        }
    }
}

/// `dst[i] = f(src[i] * scale + bias)` (the fp32 multiply and add rounded separately), the
/// operations `Affine::ops` drops left out.
///
/// # Safety
/// As `map_raw`.
pub(super) unsafe fn map_affine_raw(
    f: Func,
    aff: Affine,
    src: *const f32,
    dst: *mut f32,
    len: usize,
    slow: impl Fn(f32) -> f32,
) -> usize {
    let (s, b) = (aff.scale, aff.bias);
    // SAFETY: the caller's.
    unsafe {
        match aff.ops(f) {
            (false, false) => map_raw(f, src, dst, len, |x| x, slow),
            (false, true) => map_raw(f, src, dst, len, |x| x + b, slow),
            (true, false) => map_raw(f, src, dst, len, |x| x * s, slow),
            (true, true) => map_raw(f, src, dst, len, |x| x * s + b, slow),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::exp_ref::{affine_inputs, reference};

    #[test]
    fn every_entry_point_matches_the_scalar_formula() {
        // the affine variants (scale 1 / other, bias -0 / +0 / other: the dropped operations),
        // in place and from unaligned bytes into another buffer, a remainder (3016 = 377 * 8,
        // then 3019 with 3 left), signed zeros, NaN, +-inf, huge and tiny inputs; the fallback
        // count is the NaN lanes plus the few undecidable ones
        let xs = affine_inputs();
        for len in [xs.len(), xs.len() + 3] {
            let xs: Vec<f32> = xs.iter().cycle().take(len).copied().collect();
            for f in [Func::Exp, Func::Sigmoid, Func::Silu, Func::Tanh] {
                for (s, b) in [
                    (1.0, -0.0),
                    (1.0, 0.0),
                    (1.0, 0.5),
                    (-2.0, 0.0),
                    (0.5, -0.0),
                ] {
                    let want: Vec<f32> = xs.iter().map(|x| reference(f, x * s + b)).collect();
                    let slow = |x: f32| reference(f, x);
                    let mut v = xs.clone();
                    let p = v.as_mut_ptr();
                    let aff = Affine { scale: s, bias: b };
                    // SAFETY: src = dst = v.
                    let n = unsafe { map_affine_raw(f, aff, p, p, v.len(), slow) };
                    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
                    let mut out = vec![0u8; bytes.len() + 1];
                    let (src, dst) = (bytes[..].as_ptr() as *const f32, out[1..].as_mut_ptr());
                    // SAFETY: both hold len unaligned fp32 values (little-endian host), disjoint.
                    let nb = unsafe { map_raw(f, src, dst as *mut f32, len, |x| x * s + b, slow) };
                    let got_b: Vec<f32> = out[1..]
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    for (i, x) in xs.iter().enumerate() {
                        let w = want[i];
                        let same =
                            |g: f32| g.to_bits() == w.to_bits() || (w.is_nan() && g.is_nan());
                        assert!(same(v[i]), "{f:?} ({s}, {b}) x={x:e}: {} want {w}", v[i]);
                        assert!(
                            same(got_b[i]),
                            "{f:?} ({s}, {b}) bytes x={x:e}: {}",
                            got_b[i]
                        );
                    }
                    let nans = xs.iter().filter(|x| x.is_nan()).count();
                    assert!(n >= nans && n < nans + 8, "{f:?} ({s}, {b}): {n} fallbacks");
                    assert_eq!(n, nb, "{f:?} ({s}, {b})");
                }
            }
        }
    }

    #[test]
    fn table_holds_the_powers_within_two_ulps() {
        // against libm's exp2 (within 1 ulp itself), and the j << 41 adjustment undone; the
        // entries at multiples of 128 are POW2_16's (the f64 nearest)
        for j in 0..N {
            let t = f64::from_bits(TABLE[j] + ((j as u64) << (52 - TB)));
            let want = (j as f64 / N as f64).exp2();
            let ulps = (t.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 2, "entry {j}: {t:e} vs {want:e} ({ulps} ulps)");
            if j % 128 == 0 {
                assert_eq!(t, POW2_16[j / 128], "entry {j}");
            }
        }
    }

    #[test]
    fn scaling_covers_the_clamped_range() {
        // n = round(2048 v / ln2) at the clamp ends: the scaled table entry stays a normal f64
        // and equals 2^(n/2048) within the table's error
        for v in [X_MIN, X_MAX, -149.99998, 99.99999, -0.0001, 0.0001] {
            let t = (v as f64).mul_add(INV_LN2, SHIFT);
            let n = (t - SHIFT) * N as f64;
            let b = t.to_bits();
            let s = f64::from_bits(TABLE[(b & (N as u64 - 1)) as usize].wrapping_add(b << 41));
            assert!(s.is_normal(), "{v}");
            assert!(
                (s / (n / N as f64).exp2() - 1.0).abs() < 1e-15,
                "{v}: {s:e}"
            );
        }
    }
}
