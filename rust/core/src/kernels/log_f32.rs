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
//! - `r = z invc[j] - 1 = rh + pl` exactly: `ph = z invc` rounded, `pl` its error (one fma),
//!   `rh = ph - 1` (Sterbenz). |rh| <= 2^-6 (1 + 2^-6); pl = 0 in the centre interval.
//! - `ln y = k ln2 + logc[j] + ln(1 + r)` with `ln2 = LN2_HI + LN2_LO`, `logc = logc_hi +
//!   logc_lo` (hi parts multiples of 2^-18, so `head = k LN2_HI + logc_hi` is one exact fma:
//!   a multiple of 2^-18 below 2^6), `ln(1 + r) = rh - rh^2/2 + rh^3 q(rh) + pl (1 - rh +
//!   rh^2)` (Taylor to r^6; pl's own square and pl rh^3 are below 2^-43).
//! - `s = head + rh` and `s1 = s - rh^2/2` keep their rounding errors exactly (Fast2Sum, as
//!   head is 0 or not below rh in exponent; the product's error through an fma); the small
//!   terms (those errors, pl's, `k LN2_LO`, `logc_lo`, the cubic tail) add up in fp32,
//!   smallest first; `hi = s1 + a` rounded and `lo` its exact error (Fast2Sum).
//!
//! The check: `hi + lo` is within `B` of libm's f64 `ln` (itself within 2^-52 relative). If
//! `fma(lo, 1 + EPS, hi) == hi`, then |lo| (1 + EPS) <= h, half the distance from hi to its
//! neighbour on lo's side, so hi + lo is at least max(EPS |lo|, h - |lo|) >= EPS h / (1 + EPS)
//! inside hi's rounding interval: with `B` below that, libm's value rounds to `hi` too. The
//! measured `B` is below 2^-34.3 of the power of two below |ln y| (`tests` below: the cubic
//! tail's and the small terms' roundings where |r| ~ 2^-6 and |ln y| ~ 2^-6), so EPS = 2^-10
//! holds for every result that is not a power of two (h is 2^-24 of it); all 2^32 inputs,
//! power-of-two results included, are checked against libm by the ignored test
//! `act_simple::tests::exhaustive_log`. About one lane in 2^10 takes libm.

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

/// The 32-entry tables, entry `31 - j` for sub-interval `j`: invc (fp32 near 1 / the
/// sub-interval's centre), logc_hi + logc_lo (-ln invc, hi a multiple of 2^-18), built by
/// the compiler.
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
        let lo = OFF + (j as u32) * (1 << 18);
        let hi = lo + (1 << 18);
        let e = 31 - j;
        if j == CENTRE {
            t.invc[e] = 1.0;
        } else {
            // the centre in value (both ends in one binade here)
            let c = (f32::from_bits(lo) as f64 + f32::from_bits(hi) as f64) * 0.5;
            let v = (1.0 / c) as f32;
            let l = -ln_const(v as f64);
            let h = grain(l);
            t.invc[e] = v;
            t.logc_hi[e] = h as f32;
            t.logc_lo[e] = (l - h) as f32;
        }
        j += 1;
    }
    t
}

pub static TABLES: Tables = tables();
/// ln2 = LN2_HI + LN2_LO (+ < 2^-44): LN2_HI a multiple of 2^-18.
pub const LN2_HI: f32 = grain(std::f64::consts::LN_2) as f32;
pub const LN2_LO: f32 = (std::f64::consts::LN_2 - grain(std::f64::consts::LN_2)) as f32;
/// q(r) = 1/3 - r/4 + r^2/5 - r^3/6 (Estrin: (Q0 + Q1 r) + r^2 (Q2 + Q3 r)).
pub const Q: [f32; 4] = [1.0 / 3.0, -0.25, 0.2, -1.0 / 6.0];
/// 1 + EPS for the check (module doc).
pub const ONE_EPS: f32 = 1.0 + 1.0 / 1024.0;

/// The constants of `dw_ln!` as vectors of the caller's width.
pub struct Consts<V> {
    pub one: V,
    pub mhalf: V,
    pub nln2h: V,
    pub nln2l: V,
    pub q: [V; 4],
}

impl<V> Consts<V> {
    /// The constants broadcast by `set1` (once per call).
    pub fn new(set1: impl Fn(f32) -> V) -> Self {
        Consts {
            one: set1(1.0),
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
/// logc_hi, logc_lo)` and `Consts` to `(hi, lo)`, with the caller's vector operations
/// `(add, sub, mul, fmadd, fmsub)`.
macro_rules! dw_ln {
    (($add:ident, $sub:ident, $mul:ident, $fma:ident, $fms:ident), $c:expr, $kn:expr, $z:expr,
     ($invc:expr, $lch:expr, $lcl:expr)) => {{
        let (c, kn, z, invc) = ($c, $kn, $z, $invc);
        let ph = $mul(z, invc);
        let pl = $fms(z, invc, ph);
        let rh = $sub(ph, c.one);
        let head = $fma(kn, c.nln2h, $lch);
        let s = $add(head, rh);
        let e0 = $add($sub(head, s), rh);
        let hh = $mul(rh, c.mhalf);
        let s1 = $fma(rh, hh, s);
        let e1 = $fma(rh, hh, $sub(s, s1));
        let rr = $mul(rh, rh);
        let u = $sub(rr, rh);
        let q = $fma(rr, $fma(rh, c.q[3], c.q[2]), $fma(rh, c.q[1], c.q[0]));
        let cube = $mul(rr, rh);
        let mut a = $add(e0, e1);
        a = $fma(pl, u, a);
        a = $add(a, pl);
        a = $fma(kn, c.nln2l, a);
        a = $add(a, $lcl);
        a = $fma(cube, q, a);
        let h = $add(s1, a);
        (h, $sub(a, $sub(h, s1)))
    }};
}
pub(super) use dw_ln;

/// The evaluation above for one lane with the fp32 operations the kernels use, in the same
/// order (`f32::mul_add` is the fma): `(hi, lo)`. The kernels' reference in tests; for y
/// outside the range some value.
#[cfg(test)]
pub fn approx(y: f32) -> (f32, f32) {
    let tn = SUB.wrapping_sub(y.to_bits());
    let kn = ((tn >> 23) & 0xff) as f32 - 127.0;
    let z = y * f32::from_bits(tn & 0x7f80_0000);
    let e = ((tn >> 18) & 31) as usize;
    let (invc, lch, lcl) = (TABLES.invc[e], TABLES.logc_hi[e], TABLES.logc_lo[e]);
    let ph = z * invc;
    let pl = z.mul_add(invc, -ph);
    let rh = ph - 1.0;
    let head = kn.mul_add(-LN2_HI, lch);
    let s = head + rh;
    let e0 = (head - s) + rh;
    let hh = rh * -0.5;
    let s1 = rh.mul_add(hh, s);
    let e1 = rh.mul_add(hh, s - s1);
    let rr = rh * rh;
    let u = rr - rh;
    let q = rr.mul_add(rh.mul_add(Q[3], Q[2]), rh.mul_add(Q[1], Q[0]));
    let cube = rr * rh;
    let mut a = e0 + e1;
    a = pl.mul_add(u, a);
    a += pl;
    a = kn.mul_add(-LN2_LO, a);
    a += lcl;
    a = cube.mul_add(q, a);
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
        let l2 = std::f64::consts::LN_2;
        assert!((LN2_HI as f64 + LN2_LO as f64 - l2).abs() < 2f64.powi(-44));
        // 1.0 is the middle of the centre sub-interval
        let lo = OFF + CENTRE as u32 * (1 << 18);
        assert_eq!(0x3f80_0000 - lo, 0x3f80_0000 + (1 << 17) - (lo + (1 << 17)));
        assert!(lo < 0x3f80_0000 && 0x3f80_0000 < lo + (1 << 18));
    }

    /// Fast2Sum's condition for `s = head + rh`: head = 0 or its exponent at least rh's.
    #[test]
    fn head_dominates_rh() {
        for j in 0..32 {
            if j == CENTRE {
                continue;
            }
            let lo = OFF + j as u32 * (1 << 18);
            let h = TABLES.logc_hi[31 - j];
            for zb in [lo, lo + (1 << 18) - 1] {
                let rh = f32::from_bits(zb) * TABLES.invc[31 - j] - 1.0;
                assert!(rh.abs() <= 2f32.powi(-6) * (1.0 + 2f32.powi(-6)), "j {j}");
                let exp = |v: f32| (v.to_bits() >> 23) & 0xff;
                assert!(exp(h.abs()) >= exp(rh.abs()), "j {j}");
            }
        }
    }

    /// The error bound of the module doc on every 7th fp32 of the binades around 1 (where it
    /// is reached) and every 997th of the range, against libm's f64 ln: relative to the power
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
        (0x3f00_0000..0x4000_0000).step_by(7).for_each(&mut check);
        (0x1f80_0000..=0x5f80_0000)
            .step_by(997)
            .for_each(&mut check);
        assert!(worst < 2f64.powi(-34) * 0.8, "worst 2^{}", worst.log2());
    }
}
