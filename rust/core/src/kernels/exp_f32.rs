//! The portable path's first try at `exp` (exp_portable.rs): fp32 lanes, four to a 128-bit
//! register (SSE2 on x86-64, NEON on aarch64) where the f64 evaluation gets two, in plain Rust
//! over chunks of `W` lanes that LLVM vectorises. Each lane either proves its fp32 result equal
//! to act.rs's `(x as f64).exp() as f32` or raises a flag; exp_portable.rs redoes the flagged
//! lanes with its f64 evaluation (and that one's scalar fallback), so the bits are those of the
//! f64 path by construction.
//!
//! The evaluation, for n in [N_MIN, N_MAX] (x in [LO, HI]: results normal fp32, |n| < 2^18):
//! `n = round(x K)`, K = 2048 / ln2 (an fp32 multiply, then round-to-nearest by adding 1.5 *
//! 2^23: |x K - n| <= 1/2 + 2^-5 for the multiply's rounding), `r = x - n C`, C = ln2 / 2048 in
//! four parts (Cody-Waite: C1, C2, C3 of at most 6 significant bits, so `n Ci` is exact for
//! |n| < 2^18 and the first three differences are exact, each a multiple of the coarser of its
//! operands' quanta below 2^24 of them; C4 the fp32 rest, |n C4| < 2^-14, its product and
//! difference rounded once: |r error| < 2^-36.4 with the parts' sum within 2^-59.9 of C),
//! |r| <= 2^-12.45.
//! `exp(x) = 2^k 2^(j/2048) e^r` with n = 2048 k + j; `T` holds 2^(j/2048) as `th + tl` (`th`
//! the fp32 nearest, `tl` the fp32 nearest the rest: within 2^-46). `s = th q + tl` with `q = r +
//! r^2/2` (truncation r^3/6 < 2^-39.9), `res = th + s` and the rounding error of that add,
//! `e = s - (res - th)` (Fast2Sum: exact, |s| < th). The error of `res + e` against `T e^r`,
//! for th in [1, 2): r's (< 2^-36.4, times th e^r < 2: 2^-35.4), q's rounding and truncation
//! (2^-36.8, times th: 2^-35.8), the roundings of `th q` and s (|s| < 2^-11.4: 2^-36 each) and
//! `tl q` left out (2^-36.4): E < 2^-33.57 (the test measures 2^-33.9); for j = 0 (th = 1, tl =
//! 0, the only case with res < 1) only r's and q's: < 2^-35.6. The exact value lies within
//! |e| + E of res: where that is below half an ulp of res on e's side, res is its rounding, and
//! (libm's f64 exp within 2^-52 of it) the reference's too. `res` lies in [1 - 2^-12.4, 2): the
//! threshold is that half ulp (of the binade below where e < 0 and res is a power of two) times
//! (1 - 2^-TH), a margin of 2^-(24 + TH) = 2^-33 for res >= 1 (2^-34 below 1). About one lane in
//! 2^TH is flagged. The power 2^k is added to res's exponent bits (exact: the result is a normal
//! fp32 there). Lanes with n outside [N_MIN, N_MAX], read from the bits that hold it, are
//! flagged too (NaN, infinite and large inputs among them).
//!
//! No fused multiply-adds (x86's baseline has none; on aarch64 LLVM does not contract plain
//! Rust `a * b + c`): the same bits on every host.

use super::exp::POW2_16;

/// Lanes per chunk: four 128-bit registers of fp32.
pub(super) const W: usize = 16;
/// The n of the lanes evaluated here: |n| < 2^18 and, with |x K - n| <= 1/2 + 2^-5, x in
/// [LO, HI], where the results are normal fp32 (e^LO > 2^-126).
const N_MIN: i32 = -258_000;
const N_MAX: i32 = 262_000;
const _: () = assert!(N_MAX < 1 << 18 && N_MIN > -(1 << 18));
#[cfg(test)]
const LO: f32 = -87.325;
#[cfg(test)]
const HI: f32 = 88.68;
/// Below this the reference rounds to +0 (e^x < 2^-150), above that to +inf (e^x > 2^128).
const ZERO_BELOW: f32 = -103.98;
const INF_ABOVE: f32 = 88.73;
/// 2048 / ln2 (the fp32 nearest) and 1.5 * 2^23 (adding it rounds |v| < 2^22 to an integer).
const K: f32 = 2_954.639_4;
const M: f32 = 12_582_912.0;
/// ln2 / 2048 = C1 + C2 + C3 + C4 (module doc): 0x1.6p-12, 0x1.7p-19, 0x1.08p-26 and the fp32
/// nearest the rest.
const C1: f32 = 3.356_933_6e-4;
const C2: f32 = 2.741_813_7e-6;
const C3: f32 = 1.536_682_2e-8;
const C4: f32 = 2.319_006_4e-10;
/// The margin below half an ulp, 2^-TH of it (module doc).
const TH: u32 = 9;

/// 2^(j/2048) as `[th, tl]` (module doc), from exp_portable.rs's f64 table (within 2 ulps of
/// 2^(j/2048): its error, 2^-51, is below the split's 2^-47). Built by the compiler.
/// One 8-byte word an entry (`th` in the low half), so a lane's lookup is one load.
static T: [u64; 2048] = table();

const fn table() -> [u64; 2048] {
    let mut out = [0u64; 2048];
    let mut j = 0;
    while j < 2048 {
        let t = POW2_16[j >> 7] * super::exp_portable::pow2_fraction(j);
        let th = t as f32;
        let tl = (t - th as f64) as f32;
        out[j] = th.to_bits() as u64 | (tl.to_bits() as u64) << 32;
        j += 1;
    }
    out
}

/// Entry j of `T` as `[th, tl]`.
#[inline(always)]
fn entry(j: u32) -> [f32; 2] {
    let w = T[(j & 2047) as usize];
    [f32::from_bits(w as u32), f32::from_bits((w >> 32) as u32)]
}

/// One lane of `chunk` (for the tests): `exp(x)` as an fp32 and 1 where it is not proven to be
/// the reference's bits (or n is outside [N_MIN, N_MAX]), else 0.
#[cfg(test)]
fn lane(x: f32) -> (f32, u32) {
    let (res, e, b) = parts(x);
    decide(res, e, b)
}

/// The result and flag of a lane from `parts`.
#[inline(always)]
fn decide(res: f32, e: f32, b: u32) -> (f32, u32) {
    // half an ulp on e's side of res: a power of two res less one is in the binade below
    let below = res.to_bits().wrapping_sub(e.to_bits() >> 31);
    let thr = (below & 0x7f80_0000).wrapping_sub((24 << 23) + (1 << (24 - TH)));
    let near = ((e.to_bits() & 0x7fff_ffff) as i32 > thr as i32) as u32;
    // n from b's bits (NaN, infinite and large x leave the range too): x needs no register
    let n = (b as i32).wrapping_sub(0x4b40_0000);
    let inside = (N_MIN..=N_MAX).contains(&n);
    // 2^k into the exponent: (b >> 11) << 23 is k << 23 modulo 2^32 (M's bits 0x4b40_0000
    // shifted so leave nothing)
    let y = f32::from_bits(res.to_bits().wrapping_add((b >> 11) << 23));
    (y, near | (!inside) as u32)
}

/// `(res, e, b)` of the module doc: `res + e` within E of `exp(x) / 2^k`, `b` the bits that
/// hold n.
#[cfg(test)]
fn parts(x: f32) -> (f32, f32, u32) {
    let (r, b) = reduce(x);
    let (res, e) = finish(r, entry(b));
    (res, e, b)
}

/// `r` and the bits `b` holding n (module doc).
#[inline(always)]
fn reduce(x: f32) -> (f32, u32) {
    let t = x * K + M;
    let nf = t - M;
    let r = ((x - nf * C1) - nf * C2) - nf * C3;
    (r - nf * C4, t.to_bits())
}

/// `res = th + s` and its rounding error `e` (module doc).
#[inline(always)]
fn finish(r: f32, [th, tl]: [f32; 2]) -> (f32, f32) {
    let q = r + (r * 0.5) * r;
    let s = th * q + tl;
    let res = th + s;
    (res, s - (res - th))
}

/// `out[i] = exp(xs[i])` where `flags[i]` is 0; returns how many lanes are flagged.
#[inline(always)]
pub(super) fn chunk(xs: &[f32; W], out: &mut [f32; W], flags: &mut [u32; W]) -> u32 {
    // three passes: the reduction and the finish vectorise whole; the lookups between them are
    // one 8-byte load a lane
    let mut r = [0f32; W];
    let mut b = [0u32; W];
    let mut j = [0u32; W];
    for i in 0..W {
        (r[i], b[i]) = reduce(xs[i]);
        j[i] = b[i] & 2047; // masked in vectors: the lookups only move lanes out
    }
    let mut t = [[0f32; 2]; W];
    for i in 0..W {
        t[i] = entry(j[i]);
    }
    for i in 0..W {
        let (res, e) = finish(r[i], t[i]);
        (out[i], flags[i]) = decide(res, e, b[i]);
    }
    flags.iter().sum()
}

/// The flagged lanes whose reference is +0 (x below ZERO_BELOW, -inf included) or +inf (above
/// INF_ABOVE): set and unflagged (masked or clamped inputs take no f64 work). Returns how many
/// stay flagged.
#[inline(always)]
pub(super) fn settle_limits(xs: &[f32; W], out: &mut [f32; W], flags: &mut [u32; W]) -> u32 {
    for i in 0..W {
        let (x, f) = (xs[i], flags[i]);
        let zero = x < ZERO_BELOW;
        let inf = x > INF_ABOVE;
        out[i] = if zero {
            0.0
        } else if inf {
            f32::INFINITY
        } else {
            out[i]
        };
        flags[i] = f & !(zero | inf) as u32;
    }
    flags.iter().sum()
}

/// The reference's +0 or +inf where x is beyond the limits (`settle_limits`), else None.
#[inline(always)]
pub(super) fn limit(x: f32) -> Option<f32> {
    if x < ZERO_BELOW {
        Some(0.0)
    } else if x > INF_ABOVE {
        Some(f32::INFINITY)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timing of the portable exp on [128, 4096] (release, `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn time_portable_exp() {
        let xs: Vec<f32> = (0..128 * 4096)
            .map(|i| ((i as f32 * 0.618_034).fract() - 0.5) * 8.0)
            .collect();
        let mut v = xs.clone();
        let mut best = f64::MAX;
        for _ in 0..200 {
            v.copy_from_slice(&xs);
            let p = v.as_mut_ptr();
            let t0 = std::time::Instant::now();
            // SAFETY: src = dst = v.
            let n = unsafe {
                super::super::exp_portable::map_raw(
                    super::super::exp::Func::Exp,
                    p,
                    p,
                    xs.len(),
                    |x| x,
                    |x| (x as f64).exp() as f32,
                )
            };
            best = best.min(t0.elapsed().as_secs_f64());
            std::hint::black_box(n);
        }
        eprintln!("portable exp [128, 4096]: best {:.3} ms", best * 1e3);
    }

    fn libm(x: f32) -> f32 {
        (x as f64).exp() as f32
    }

    #[test]
    fn constants_are_the_documented_parts() {
        // C1..C3 have at most 6 significant bits, the sum is ln2 / 2048 within 2^-59, K and M
        assert_eq!(C1, f32::from_bits(0x39b0_0000));
        assert_eq!(C2.to_bits() & 0x3_ffff, 0);
        assert_eq!(C3.to_bits() & 0x3_ffff, 0);
        let c = std::f64::consts::LN_2 / 2048.0;
        let sum = C1 as f64 + C2 as f64 + C3 as f64 + C4 as f64;
        assert!((sum - c).abs() < 2f64.powi(-59), "{:e}", sum - c);
        assert_eq!(K, (2048.0 / std::f64::consts::LN_2) as f32);
        assert_eq!(M, 1.5 * (1u32 << 23) as f32);
        assert!((LO as f64).exp() > 2f64.powi(-126));
        assert!(LO as f64 * (K as f64) < N_MIN as f64 - 0.6);
        assert!(HI as f64 * (K as f64) > N_MAX as f64 + 0.6);
        assert!(((ZERO_BELOW as f64).exp() as f32) == 0.0);
        assert!(((INF_ABOVE as f64).exp() as f32) == f32::INFINITY);
    }

    #[test]
    fn table_pairs_hold_the_powers() {
        for j in 0..2048 {
            let [th, tl] = entry(j as u32);
            let want = (j as f64 / 2048.0).exp2();
            let got = th as f64 + tl as f64;
            assert!(((got - want) / want).abs() < 2f64.powi(-46), "entry {j}");
            assert_eq!(th, want as f32, "entry {j}");
        }
    }

    /// `res + e` against libm's exp scaled by 2^-k, on every 7th fp32 of [LO, HI]: within the
    /// module doc's E (res in [1 - 2^-12.4, 2)), and the unflagged lanes equal libm's rounding.
    #[test]
    fn error_bound_and_unflagged_bits() {
        let (mut worst, mut flagged, mut total) = (0f64, 0usize, 0usize);
        let mut check = |x: f32| {
            let (y, f) = lane(x);
            total += 1;
            flagged += f as usize;
            if f == 0 {
                assert_eq!(y.to_bits(), libm(x).to_bits(), "x = {x:e}");
            }
            let (res, e, b) = parts(x);
            let k = (b >> 11) as i32 - (0x4b40_0000 >> 11);
            let exact = (x as f64).exp() * 2f64.powi(-k);
            worst = worst.max((res as f64 + e as f64 - exact).abs());
        };
        for b in (0x8000_0000u32..=LO.to_bits()).step_by(7) {
            check(f32::from_bits(b));
        }
        for b in (0u32..=HI.to_bits()).step_by(7) {
            check(f32::from_bits(b));
        }
        eprintln!(
            "exp_f32: {flagged} of {total} flagged, worst |res + e - exp(x) / 2^k| 2^{:.2}",
            worst.log2()
        );
        // the flag rate the margin predicts, 2^-TH, with room; res is within half an ulp
        assert!((flagged as f64) < 2.0 * total as f64 * 2f64.powi(-(TH as i32)));
        assert!(worst < 2f64.powi(-33), "2^{}", worst.log2());
    }
}
