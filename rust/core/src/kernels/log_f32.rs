//! ln in fp32 lanes for the x86 log kernels (log_avx512.rs, log_avx2.rs): the f64 value of
//! log.rs carried as an unevaluated sum of two fp32 values (`hi + lo`, error-free transforms
//! with fused multiply-adds), so a vector holds twice the lanes of the f64 evaluation. The
//! result is kept where `hi` provably is the fp32 rounding of libm's f64 `ln`, else libm is
//! asked (as log.rs).
//!
//! The evaluation, for a positive normal fp32 `y` in the valid range (2^-64 .. 2^64):
//! - `y = 2^k z`, z in [OFF, 2 OFF) with OFF ~ 0.695, z = y 2^-k exactly; z falls in one of
//!   32 sub-intervals of equal width in bits, `j` = the 5 bits above the low 18 of
//!   `bits(z) - OFF`; 1.0 is the middle of sub-interval `CENTRE`, whose `invc` is exactly 1
//!   and `logc` 0. One integer subtraction gives both: `tn = SUB - bits(y)` has -k + 127 in
//!   its exponent field (so `tn & 0x7f80_0000` is 2^-k, `vgetexpps(tn)` is -k) and 31 - j in
//!   the 5 bits above its low 18 (the tables are stored in that reversed order).
//! - `invc[j]` is a multiple of 2^-7 (`INVC_128`, 93/128 .. 182/128) picked so that `r = z
//!   invc - 1` is an fp32 number for every z of sub-interval j (z is a multiple of 2^-24
//!   below 1 and of 2^-23 above, so r is a multiple of 2^-31 or 2^-30, or coarser with invc's
//!   trailing zeros, and each pick keeps |r| within 2^24 of that unit; among those multiples
//!   of 2^-7, the one with the smallest max |r|): then `r = fma(z, invc, -1)` is exact
//!   (`tests::r_is_exact`, every z), |r| <= 2^-5.66 (2^-6 in the centre sub-interval, where
//!   r = z - 1).
//! - `ln y = k ln2 + logc[j] + ln(1 + r)` with `ln2 = LN2_HI + LN2_LO`, `logc = logc_hi +
//!   logc_lo` (hi parts multiples of 2^-18, so `head = k LN2_HI + logc_hi` is one exact fma:
//!   a multiple of 2^-18 below 2^6), `ln(1 + r) = r - r^2/2 + r^3 q(r)`, q the Taylor
//!   polynomial 1/3 - r/4 + r^2/5 - r^3/6 (truncation below |r|^7 / 7).
//! - `hh = -r/2` (exact), `s = head + r` and `s1 = fma(r, hh, s)` rounded; `e0 = (head - s) +
//!   r` is the error of `s` (Fast2Sum: head = 0 or its exponent at least r's,
//!   `tests::head_dominates_r`), `d1 = s - s1` is exact (Sterbenz: r^2/2 <= |s| 2^-5 except in
//!   the centre, where s = r and r^2/2 <= |r| 2^-7), and so is `x = d1 + e0`: for k != 0 both
//!   are multiples of 2^-31 (r's unit; head's 2^-18; s's and s1's ulps, |s| >= 0.33) and |x|
//!   <= 2^-12 + 2 ulps of s below 2^-7; for k = 0 every z is run through by
//!   `tests::k0_steps_are_exact`. Then `e = fma(r, hh, x)` is `head + r - r^2/2 - s1` rounded
//!   once: the rounding errors of `s` and `s1` together. (`x = (head - s1) + r`, two
//!   operations fewer, is not exact next to the centre sub-interval: there |r| exceeds |s1|
//!   when s1 is just below 2^-6.)
//! - the small terms add up in fp32: `a = ((e + k (-LN2_LO)) + logc_lo) + cube q'` with `cube
//!   = (hh r) r` (-r^3/2, rounded twice) and `q' = -2 q` (Horner); `hi = s1 + a` rounded and
//!   `lo` its exact error (Fast2Sum: a is below s1 in exponent, `tests::s1_dominates_a`).
//!
//! The check: `hi + lo` is within `B` of libm's f64 `ln` (itself within 2^-52 relative). If
//! `fma(lo, 1 + EPS, hi) == hi`, then |lo| (1 + EPS) <= h, half the distance from hi to its
//! neighbour on lo's side, so hi + lo is at least max(EPS |lo|, h - |lo|) >= EPS h / (1 + EPS)
//! inside hi's rounding interval: with `B` below that, libm's value rounds to `hi` too. The
//! measured `B` is below 2^-34.5 of the power of two below |ln y| (`tests` below: every input
//! with k = 0, where it is reached, and a spread of the others; 2^-34.58), so EPS = 2^-10 holds for
//! every result that is not a power of two (h is 2^-24 of it); all 2^32 inputs, power-of-two
//! results included, are checked against libm by the ignored test
//! `act_simple::tests::exhaustive_log`. About one lane in 2^10 takes libm (`tests`: 80614 of
//! every 13th input of the range, 8088 of the 2^23 with k = 0).

use super::log::ln_const;

/// z's offset: fp32 bits of ~0.6953, so that 1.0 is the middle of sub-interval `CENTRE`.
pub const OFF: u32 = 0x3f32_0000;
/// `bits(y) + (0x3f80_0000 - OFF)` has k + 127 in its exponent field and `bits(z) - OFF` in
/// its mantissa; `SUB - bits(y)` is that subtracted from 0x7f7f_ffff: -k + 127 in the exponent
/// field (no borrow), the mantissa's complement in the low 23 bits.
pub const SUB: u32 = 0x7f7f_ffff - (0x3f80_0000 - OFF);
/// The sub-interval holding 1.0 (invc 1, logc 0).
pub const CENTRE: usize = 19;
/// Granularity of the hi parts (`LN2_HI`, `logc_hi`): 2^-18.
const GRAIN: f64 = 262144.0;

/// `invc[j] * 128` for sub-interval j (module doc: r = z invc - 1 exact in fp32 over the
/// sub-interval, max |r| smallest among such multiples of 2^-7).
pub const INVC_128: [u8; 32] = [
    182, 178, 174, 170, 168, 164, 160, 158, 154, 152, 148, 146, 144, 142, 138, 136, 134, 132, 130,
    128, 124, 120, 117, 114, 110, 108, 105, 102, 100, 98, 95, 93,
];

/// `v` rounded to a multiple of 1 / GRAIN (|v| < 1; const: no `f64::round` in const fn).
const fn grain(v: f64) -> f64 {
    let s = v * GRAIN;
    let t = if s < 0.0 {
        -((-s + 0.5) as i64)
    } else {
        (s + 0.5) as i64
    };
    t as f64 / GRAIN
}

/// The 32-entry tables, entry `31 - j` for sub-interval `j`: invc (`INVC_128[j] / 128`),
/// logc_hi + logc_lo (-ln invc, hi a multiple of 2^-18), built by the compiler.
pub struct Tables {
    pub invc: [f32; 32],
    pub logc_hi: [f32; 32],
    pub logc_lo: [f32; 32],
}

const fn tables() -> Tables {
    let mut t = Tables {
        invc: [0.0; 32],
        logc_hi: [0.0; 32],
        logc_lo: [0.0; 32],
    };
    let mut j = 0;
    while j < 32 {
        let e = 31 - j;
        let v = INVC_128[j] as f64 / 128.0;
        let l = -ln_const(v);
        let h = grain(l);
        t.invc[e] = v as f32;
        t.logc_hi[e] = h as f32;
        t.logc_lo[e] = (l - h) as f32;
        j += 1;
    }
    t
}

pub static TABLES: Tables = tables();
/// ln2 = LN2_HI + LN2_LO (+ < 2^-44): LN2_HI a multiple of 2^-18.
pub const LN2_HI: f32 = grain(std::f64::consts::LN_2) as f32;
pub const LN2_LO: f32 = (std::f64::consts::LN_2 - grain(std::f64::consts::LN_2)) as f32;
/// q'(r) = -2 q(r) = -2/3 + r/2 - 2r^2/5 + r^3/3 (Horner from the r^3 coefficient): the tail
/// `r^3 q(r)` is `(-r^3/2) q'(r)`.
pub const Q: [f32; 4] = [-2.0 / 3.0, 0.5, -0.4, 1.0 / 3.0];
/// 1 + EPS for the check (module doc).
pub const ONE_EPS: f32 = 1.0 + 1.0 / 1024.0;

/// The constants of `dw_ln!` as vectors of the caller's width.
pub struct Consts<V> {
    pub mone: V,
    pub mhalf: V,
    pub nln2h: V,
    pub nln2l: V,
    pub q: [V; 4],
}

impl<V> Consts<V> {
    /// The constants broadcast by `set1` (once per call).
    pub fn new(set1: impl Fn(f32) -> V) -> Self {
        Consts {
            mone: set1(-1.0),
            mhalf: set1(-0.5),
            nln2h: set1(-LN2_HI),
            nln2l: set1(-LN2_LO),
            q: Q.map(&set1),
        }
    }
}

/// Whether a kernel may skip the affine step `y * scale + bias`: y * 1 + 0 only quiets NaNs
/// (which `exact` quiets too) and turns -0 into +0 (out of the range either way).
pub fn is_identity((scale, bias): (f32, f32)) -> bool {
    scale == 1.0 && bias == 0.0
}

/// The evaluation after the table look-up, written once for both x86 kernels (the same
/// operations in the same order as `approx`): from `-k`, `z`, the table values `(invc,
/// logc_hi, logc_lo)` and `Consts` to `(s1, a)` (`hi = s1 + a`), with the caller's vector
/// operations `(add, sub, mul, fmadd)`.
macro_rules! dw_ln {
    (($add:ident, $sub:ident, $mul:ident, $fma:ident), $c:expr, $kn:expr, $z:expr,
     ($invc:expr, $lch:expr, $lcl:expr)) => {{
        let (c, kn, z) = ($c, $kn, $z);
        let r = $fma(z, $invc, c.mone);
        let head = $fma(kn, c.nln2h, $lch);
        let hh = $mul(r, c.mhalf);
        let s = $add(head, r);
        let s1 = $fma(r, hh, s);
        let e = $fma(r, hh, $add($sub(s, s1), $add($sub(head, s), r)));
        let cube = $mul($mul(hh, r), r);
        let q = $fma($fma($fma(c.q[3], r, c.q[2]), r, c.q[1]), r, c.q[0]);
        let mut a = $fma(kn, c.nln2l, e);
        a = $add(a, $lcl);
        a = $fma(cube, q, a);
        (s1, a)
    }};
}
pub(super) use dw_ln;

/// The evaluation above for one lane with the fp32 operations the kernels use, in the same
/// order (`f32::mul_add` is the fma): `(s1, a)`. For y outside the range some value.
#[cfg(test)]
fn steps(y: f32) -> (f32, f32) {
    let tn = SUB.wrapping_sub(y.to_bits());
    let kn = ((tn >> 23) & 0xff) as f32 - 127.0;
    let z = y * f32::from_bits(tn & 0x7f80_0000);
    let e = ((tn >> 18) & 31) as usize;
    let (invc, lch, lcl) = (TABLES.invc[e], TABLES.logc_hi[e], TABLES.logc_lo[e]);
    let r = z.mul_add(invc, -1.0);
    let head = kn.mul_add(-LN2_HI, lch);
    let hh = r * -0.5;
    let s = head + r;
    let s1 = r.mul_add(hh, s);
    let e = r.mul_add(hh, (s - s1) + ((head - s) + r));
    let cube = (hh * r) * r;
    let q = Q[3].mul_add(r, Q[2]).mul_add(r, Q[1]).mul_add(r, Q[0]);
    let mut a = kn.mul_add(-LN2_LO, e);
    a += lcl;
    a = cube.mul_add(q, a);
    (s1, a)
}

/// `steps` to `(hi, lo)`: the kernels' reference in tests.
#[cfg(test)]
pub fn approx(y: f32) -> (f32, f32) {
    let (s1, a) = steps(y);
    let hi = s1 + a;
    (hi, a - (hi - s1))
}

/// A kernel's `map` (called as `run(src, dst, aff, range)`) against libm's bits on a spread
/// of inputs in and around the range, NaNs and both signs included, with and without the
/// affine step, and against `approx`'s `hi` wherever its check keeps it.
#[cfg(test)]
pub fn check_kernel(run: impl Fn(&[f32], &mut [f32], (f32, f32), (f32, f32))) {
    let range = (2f32.powi(-64), 2f32.powi(64));
    let mut xs: Vec<f32> = (0..=u32::MAX).step_by(4099).map(f32::from_bits).collect();
    xs.extend((0x3f7f_0000..0x3f81_0000).step_by(3).map(f32::from_bits));
    for aff in [(1.0, 0.0), (0.5, 0.25), (1.0, -0.0)] {
        let mut got = vec![0f32; xs.len()];
        run(&xs, &mut got, aff, range);
        for (x, g) in xs.iter().zip(&got) {
            let y = x * aff.0 + aff.1;
            if y < range.0 || y > range.1 {
                assert_eq!(g.to_bits(), f32::NAN.to_bits(), "{x:e}");
                continue;
            }
            assert_eq!(
                g.to_bits(),
                ((y as f64).ln() as f32).to_bits(),
                "{x:e} {aff:?}"
            );
            let (h, l) = approx(y);
            if !y.is_nan() && l.mul_add(ONE_EPS, h) == h {
                assert_eq!(g.to_bits(), h.to_bits(), "{x:e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fp32 bits of the sub-interval ends (first and last value of sub-interval j).
    fn ends(j: usize) -> (u32, u32) {
        let lo = OFF + j as u32 * (1 << 18);
        (lo, lo + (1 << 18) - 1)
    }

    #[test]
    fn tables_give_an_exact_head_and_accurate_logs() {
        let t = &TABLES;
        for j in 0..32 {
            let (v, h, l) = (t.invc[j] as f64, t.logc_hi[j] as f64, t.logc_lo[j] as f64);
            assert_eq!(h, grain(h), "logc_hi[{j}] off the grain");
            let want = -v.ln();
            assert!((h + l - want).abs() <= 2f64.powi(-44), "logc[{j}]");
            // k LN2_HI + logc_hi exact in fp32 for every k of the range (one fma)
            for k in -64..=64 {
                let e = k as f64 * LN2_HI as f64 + h;
                assert_eq!(e, e as f32 as f64, "head k {k} j {j}");
            }
        }
        assert_eq!(t.invc[31 - CENTRE], 1.0);
        assert_eq!((t.logc_hi[31 - CENTRE], t.logc_lo[31 - CENTRE]), (0.0, 0.0));
        let l2 = std::f64::consts::LN_2;
        assert!((LN2_HI as f64 + LN2_LO as f64 - l2).abs() < 2f64.powi(-44));
        // 1.0 is the middle of the centre sub-interval
        let (lo, hi) = ends(CENTRE);
        assert_eq!(0x3f80_0000 - lo, hi + 1 - 0x3f80_0000);
    }

    /// `r = fma(z, invc, -1)` is exact for every z of every sub-interval (against f64, where
    /// the product and the difference are exact), and |r| <= 2^-5.66.
    #[test]
    fn r_is_exact() {
        let mut worst = 0f64;
        for (j, &m) in INVC_128.iter().enumerate() {
            let v = TABLES.invc[31 - j];
            assert_eq!(v * 128.0, m as f32);
            let (lo, hi) = ends(j);
            for b in lo..=hi {
                let z = f32::from_bits(b);
                let r = z as f64 * v as f64 - 1.0;
                assert_eq!(r, z.mul_add(v, -1.0) as f64, "j {j} z {b:#x}");
                worst = worst.max(r.abs());
            }
        }
        assert!(worst <= 2f64.powi(-5) * 0.795, "max |r| 2^{}", worst.log2());
    }

    /// Fast2Sum's condition for `(head - s) + r`: head = 0 or its exponent at least r's.
    #[test]
    fn head_dominates_r() {
        for j in 0..32 {
            if j == CENTRE {
                continue;
            }
            let (lo, hi) = ends(j);
            let h = TABLES.logc_hi[31 - j];
            for zb in [lo, hi] {
                let r = f32::from_bits(zb).mul_add(TABLES.invc[31 - j], -1.0);
                let exp = |v: f32| (v.to_bits() >> 23) & 0xff;
                assert!(exp(h.abs()) >= exp(r.abs()), "j {j}");
            }
        }
    }

    /// The steps the module doc calls exact, `s - s1`, `(head - s) + r` and their sum, on
    /// every z with k = 0 (y = z; the other k have larger s, s1 and head, see the module doc),
    /// against f64 (where all three are exact).
    #[test]
    fn k0_steps_are_exact() {
        for b in OFF..OFF + (1 << 23) {
            let y = f32::from_bits(b);
            let tn = SUB.wrapping_sub(b);
            let e = ((tn >> 18) & 31) as usize;
            let r = y.mul_add(TABLES.invc[e], -1.0);
            let head = TABLES.logc_hi[e];
            let s = head + r;
            let s1 = r.mul_add(r * -0.5, s);
            let (d1, e0) = (s - s1, (head - s) + r);
            assert_eq!(d1 as f64, s as f64 - s1 as f64, "s - s1 at {b:#x}");
            let e0_exact = head as f64 + r as f64 - s as f64;
            assert_eq!(e0 as f64, e0_exact, "(head - s) + r at {b:#x}");
            assert_eq!((d1 + e0) as f64, d1 as f64 + e0_exact, "sum at {b:#x}");
        }
    }

    /// Fast2Sum's condition for `hi = s1 + a`: s1 = 0 = a, or s1's exponent at least a's
    /// (every z with k = 0, and the ends of the range).
    #[test]
    fn s1_dominates_a() {
        let exp = |v: f32| (v.to_bits() >> 23) & 0xff;
        let mut check = |b: u32| {
            let (s1, a) = steps(f32::from_bits(b));
            assert!(exp(s1) >= exp(a) || (s1, a) == (0.0, 0.0), "{b:#x}");
        };
        (OFF..OFF + (1 << 23)).for_each(&mut check);
        (0x1f80_0000..=0x5f80_0000)
            .step_by(997)
            .for_each(&mut check);
    }

    /// The error bound of the module doc on every input with k = 0 (where it is reached) and
    /// every 97th fp32 of the rest of the range, against libm's f64 ln: relative to the power
    /// of two below |ln y|, below 2^-34.3 (EPS = 2^-10 needs < 2^-34 for results that are not
    /// powers of two).
    #[test]
    fn approx_is_within_its_error_bound() {
        let mut worst = 0f64;
        let mut check = |b: u32| {
            let y = f32::from_bits(b);
            let want = (y as f64).ln();
            let (hi, lo) = approx(y);
            if want == 0.0 {
                assert_eq!((hi, lo), (0.0, 0.0));
                return;
            }
            let p2 = f32::from_bits(hi.to_bits() & 0x7f80_0000) as f64;
            worst = worst.max((hi as f64 + lo as f64 - want).abs() / p2);
        };
        (OFF..OFF + (1 << 23)).for_each(&mut check);
        (0x1f80_0000..=0x5f80_0000).step_by(97).for_each(&mut check);
        assert!(worst < 2f64.powi(-34) * 0.8, "worst 2^{}", worst.log2());
    }

    /// The check's rejections (lanes sent to libm): about one in 2^10, on every 13th input of
    /// the range and on every input with k = 0.
    #[test]
    fn rejections_are_rare() {
        let rejected = |b: &u32| {
            let (h, l) = approx(f32::from_bits(*b));
            l.mul_add(ONE_EPS, h) != h
        };
        let all = (0x1f80_0000..0x5f80_0000u32).step_by(13);
        let (n, k0) = (all.len(), 1usize << 23);
        let bad = all.filter(rejected).count();
        let bad_k0 = (OFF..OFF + (1 << 23)).filter(rejected).count();
        assert!(
            bad * 512 < n && bad_k0 * 512 < k0,
            "{bad} of {n}, {bad_k0} of {k0}"
        );
    }
}
