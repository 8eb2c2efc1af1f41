//! The AVX2 + FMA path of kernels/exp.rs, written with intrinsics: 8 fp32 elements per step, two
//! f64 vectors of 4. Same contract and same bits as the other paths (every element either passes
//! a rounding check that proves its fp32 result equals libm's f64 formula rounded once, or takes
//! the caller's scalar path). The structure is exp_avx512.rs's (see its module doc for the range
//! rules, the bit test and the fallbacks); what AVX2 lacks is replaced:
//!
//! - no two-register table permute (`vpermt2pd`): the table holds 2^(j/8), j = 0..8, with its
//!   low and high 32-bit halves in two registers, looked up with two `vpermd` (8 dwords each,
//!   indexed by the low 3 bits of each element's `n`) for 8 elements at once and interleaved
//!   back into f64 values. `q = n/8 = round(8 v / ln2) / 8` by adding 1.5 * 2^49 (f64 numbers of
//!   that size are multiples of 1/8; the low bits of the sum's pattern hold n);
//!   `r = v - q ln2` in one fused multiply-add with `LN2` the f64 nearest ln2 (|LN2 - ln2| <
//!   2^-55.2, |q| <= 217: an absolute error below 2^-47.4 in r, plus 2^-57 rounding), so
//!   |r| <= ln2/16 + 2^-40 and `exp(r) = 1 + r p(r)` takes p to degree 5 (one more than the
//!   AVX-512 kernel's with its 16-entry table): truncation below |r|^7/7! e^|r| < 2^-43.9; the
//!   table entries are f64 roundings (2^-53) and the Horner steps, `tab * r` and the final
//!   `fma(tab r, p, tab)` add < 4 * 2^-53: < 2^-43.6 relative in all, inside the AVX-512
//!   kernel's 2^-42.5 budget, so the same bit test (`TH` = 2^13 ulps) and interval check
//!   (`D` = 2^-39) are sound here too. Sigmoid, silu and tanh inherit the AVX-512 analysis with
//!   this smaller exp error.
//! - no `vscalefpd`: the power 2^floor(n/8) is added into the table entry's exponent field as an
//!   integer. The table stores `bits(2^(j/8)) - j << 49`; adding `n << 49` (the low 15 bits of
//!   the shifted sum, which hold n mod 2^15) gives `bits(2^(j/8)) + floor(n/8) << 52`, the f64
//!   2^(j/8) * 2^floor(n/8), exactly, while it stays normal: inputs in [-150, 100] give
//!   floor(n/8) in [-217, 144]. Scaling the table entry instead of the result gives the same
//!   bits (every step stays normal, and power-of-two scaling commutes with rounding). Lanes
//!   outside that range (unclamped inputs in the fast step, NaN) get a meaningless value; the
//!   fast step never trusts them (they are below -87 or NaN) and `fix` clamps, and NaN inputs
//!   stay NaN through `r`.
//! - no mask registers: the bit test runs on the low 32-bit halves of 8 results at once (bits
//!   14..28 of the f64 pattern all lie there) and masks are vector compares turned into bit
//!   masks with `movemask`.

use super::exp::{Affine, Func, POW2_16, TANH_C, TANH_SMALL};
use super::exp_x86::{
    func, D, EXP, EXP_NORMAL_X, EXP_TINY_X, SIGMOID, SILU, SMALL_X, TANH, TH_LOG2,
};
use std::arch::x86_64::*;

/// 1.5 * 2^49: adding it rounds |v| < 2^48 to a multiple of 1/8, 8 times which is held in the
/// low mantissa bits.
const SHIFT: f64 = 844_424_930_131_968.0;
const INV_LN2: f64 = std::f64::consts::LOG2_E;
/// The f64 nearest ln2.
const LN2: f64 = std::f64::consts::LN_2;
/// 2^(j/8), j = 0..8, each the f64 nearest: the even entries of `POW2_16`.
const TABLE: [f64; 8] = {
    let mut t = [0f64; 8];
    let mut j = 0;
    while j < 8 {
        t[j] = POW2_16[2 * j];
        j += 1;
    }
    t
};

/// The 32-bit halves (`high` or low) of the table's entries with `j << 49` subtracted (module
/// doc: adding `n << 49` then scales entry j by 2^floor(n/8)).
const fn table_dwords(high: bool) -> [i32; 8] {
    let mut out = [0i32; 8];
    let mut j = 0;
    while j < 8 {
        let b = TABLE[j].to_bits() - ((j as u64) << 49);
        out[j] = (if high { b >> 32 } else { b & 0xffff_ffff }) as u32 as i32;
        j += 1;
    }
    out
}
const TAB_LO: [i32; 8] = table_dwords(false);
const TAB_HI: [i32; 8] = table_dwords(true);

/// The constants of one run, loaded once (kept in registers across the loop).
#[derive(Clone, Copy)]
struct K {
    tab_lo: __m256i,
    tab_hi: __m256i,
    lo: __m256d,
    hi: __m256d,
    shift: __m256d,
    inv: __m256d,
    ln2: __m256d,
    c: [__m256d; 5],
    one: __m256d,
    sign: __m256d,
    bias: __m256i,
    mid_mask: __m256i,
    min_normal: __m256d,
    tiny: __m256d,
    hi32: __m256,
    sign32: __m256,
    normal_x: __m256,
    tiny_x: __m256,
    small_x: __m256,
}

#[inline(always)]
unsafe fn k() -> K {
    let s = _mm256_set1_pd;
    K {
        tab_lo: _mm256_loadu_si256(TAB_LO.as_ptr() as *const __m256i),
        tab_hi: _mm256_loadu_si256(TAB_HI.as_ptr() as *const __m256i),
        lo: s(-150.0),
        hi: s(100.0),
        shift: s(SHIFT),
        inv: s(INV_LN2),
        ln2: s(LN2),
        c: [
            s(1.0 / 720.0),
            s(1.0 / 120.0),
            s(1.0 / 24.0),
            s(1.0 / 6.0),
            s(0.5),
        ],
        one: s(1.0),
        sign: s(-0.0),
        // the bit test on the low 32 bits of the f64 pattern (exp_avx512.rs's `far`)
        bias: _mm256_set1_epi32((1 << 28) + (1 << TH_LOG2)),
        mid_mask: _mm256_set1_epi32((1 << 29) - (1 << (TH_LOG2 + 1))),
        min_normal: s(f64::from_bits(0x3810_0000_0000_0000)), // 2^-126
        tiny: s(f64::from_bits(0x3680_0000_0000_0000)),       // 2^-151
        hi32: _mm256_set1_ps(100.0),
        sign32: _mm256_set1_ps(-0.0),
        normal_x: _mm256_set1_ps(EXP_NORMAL_X),
        tiny_x: _mm256_set1_ps(EXP_TINY_X),
        small_x: _mm256_set1_ps(SMALL_X),
    }
}

/// e^v0, e^v1 (elements 0..4 and 4..8) for lanes in [-150, 100] (module doc; other lanes give
/// some value, never trusted; NaN stays NaN).
#[inline(always)]
unsafe fn exp2x(k: &K, v0: __m256d, v1: __m256d) -> (__m256d, __m256d) {
    let t0 = _mm256_fmadd_pd(v0, k.inv, k.shift);
    let t1 = _mm256_fmadd_pd(v1, k.inv, k.shift);
    let r0 = _mm256_fnmadd_pd(_mm256_sub_pd(t0, k.shift), k.ln2, v0); // q = n / 8, exact
    let r1 = _mm256_fnmadd_pd(_mm256_sub_pd(t1, k.shift), k.ln2, v1);
    // the low dwords of t0, t1 (n mod 8 in their low 3 bits), in the order 0 1 4 5 | 2 3 6 7
    let idx = _mm256_castps_si256(_mm256_shuffle_ps::<0x88>(
        _mm256_castpd_ps(t0),
        _mm256_castpd_ps(t1),
    ));
    let lo = _mm256_permutevar8x32_epi32(k.tab_lo, idx);
    let hi = _mm256_permutevar8x32_epi32(k.tab_hi, idx);
    // interleaving the halves restores the order 0 1 2 3 and 4 5 6 7; + n << 49 scales
    let (b0, b1) = (_mm256_castpd_si256(t0), _mm256_castpd_si256(t1));
    let s0 = _mm256_add_epi64(_mm256_unpacklo_epi32(lo, hi), _mm256_slli_epi64::<49>(b0));
    let s1 = _mm256_add_epi64(_mm256_unpackhi_epi32(lo, hi), _mm256_slli_epi64::<49>(b1));
    (
        poly(k, r0, _mm256_castsi256_pd(s0)),
        poly(k, r1, _mm256_castsi256_pd(s1)),
    )
}

/// `tab * e^r` as `tab + tab r p(r)`, p(r) = 1 + r/2 + r^2/6 + r^3/24 + r^4/120 + r^5/720.
#[inline(always)]
unsafe fn poly(k: &K, r: __m256d, tab: __m256d) -> __m256d {
    let mut p = _mm256_fmadd_pd(k.c[0], r, k.c[1]);
    p = _mm256_fmadd_pd(p, r, k.c[2]);
    p = _mm256_fmadd_pd(p, r, k.c[3]);
    p = _mm256_fmadd_pd(p, r, k.c[4]);
    p = _mm256_fmadd_pd(p, r, k.one);
    _mm256_fmadd_pd(_mm256_mul_pd(tab, r), p, tab)
}

/// `max(lo, min(hi, v))` keeping NaN (the second operand is returned when one is NaN).
#[inline(always)]
unsafe fn clamp(k: &K, v: __m256d) -> __m256d {
    _mm256_max_pd(k.lo, _mm256_min_pd(k.hi, v))
}

/// All-ones in the lanes (natural order 0..8) of `y0`, `y1` less than 2^TH_LOG2 ulps from an
/// fp32 rounding midpoint (exp_avx512.rs's `far`, negated). Bits 14..28 of the f64 pattern and
/// the carries into them lie in the low 32 bits, tested for 8 lanes at once.
#[inline(always)]
unsafe fn near(k: &K, y0: __m256d, y1: __m256d) -> __m256 {
    let low = _mm256_shuffle_ps::<0x88>(_mm256_castpd_ps(y0), _mm256_castpd_ps(y1));
    let c = _mm256_add_epi32(_mm256_castps_si256(low), k.bias);
    let m = _mm256_cmpeq_epi32(_mm256_and_si256(c, k.mid_mask), _mm256_setzero_si256());
    // 0 1 4 5 | 2 3 6 7 back to 0..8: swap the middle 64-bit quarters
    _mm256_castsi256_ps(_mm256_permute4x64_epi64::<0xd8>(m))
}

/// The lane masks of two 4-lane compares as 8 bits.
#[inline(always)]
unsafe fn bits(m0: __m256d, m1: __m256d) -> u8 {
    (_mm256_movemask_pd(m0) | _mm256_movemask_pd(m1) << 4) as u8
}

/// The bit mask of lanes whose fp32 rounding of `y0`, `y1` is certain (exp_avx512.rs's
/// `certain`).
#[inline(always)]
unsafe fn certain(k: &K, y0: __m256d, y1: __m256d) -> u8 {
    let (a0, a1) = (_mm256_andnot_pd(k.sign, y0), _mm256_andnot_pd(k.sign, y1));
    let normal = bits(
        _mm256_cmp_pd::<_CMP_GE_OQ>(a0, k.min_normal),
        _mm256_cmp_pd::<_CMP_GE_OQ>(a1, k.min_normal),
    );
    let tiny = bits(
        _mm256_cmp_pd::<_CMP_LT_OQ>(a0, k.tiny),
        _mm256_cmp_pd::<_CMP_LT_OQ>(a1, k.tiny),
    );
    let far = !(_mm256_movemask_ps(near(k, y0, y1)) as u8);
    (normal & far) | tiny
}

/// sigmoid of the f64 lanes (NaN stays NaN): e = exp(-|a|), (a >= 0 ? 1 : e) / (1 + e).
#[inline(always)]
unsafe fn sigmoid2x(k: &K, a0: __m256d, a1: __m256d) -> (__m256d, __m256d) {
    let na0 = _mm256_max_pd(k.lo, _mm256_or_pd(a0, k.sign));
    let na1 = _mm256_max_pd(k.lo, _mm256_or_pd(a1, k.sign));
    let (e0, e1) = exp2x(k, na0, na1);
    let zero = _mm256_setzero_pd();
    let num0 = _mm256_blendv_pd(e0, k.one, _mm256_cmp_pd::<_CMP_GE_OQ>(a0, zero));
    let num1 = _mm256_blendv_pd(e1, k.one, _mm256_cmp_pd::<_CMP_GE_OQ>(a1, zero));
    (
        _mm256_div_pd(num0, _mm256_add_pd(k.one, e0)),
        _mm256_div_pd(num1, _mm256_add_pd(k.one, e1)),
    )
}

/// tanh of the f64 lanes (exp.rs's `tanh_f64`; NaN stays NaN): both branches, blended.
#[inline(always)]
unsafe fn tanh2x(k: &K, a0: __m256d, a1: __m256d) -> (__m256d, __m256d) {
    let (abs0, abs1) = (_mm256_andnot_pd(k.sign, a0), _mm256_andnot_pd(k.sign, a1));
    let m2 = _mm256_set1_pd(-2.0);
    let (e0, e1) = exp2x(
        k,
        _mm256_max_pd(k.lo, _mm256_mul_pd(abs0, m2)),
        _mm256_max_pd(k.lo, _mm256_mul_pd(abs1, m2)),
    );
    (tanh_blend(k, a0, abs0, e0), tanh_blend(k, a1, abs1, e1))
}

/// tanh of `a` (|a| = `abs`) from e = exp(-2|a|): `(1 - e) / (1 + e)` or, below 1/8, the Taylor
/// polynomial of tanh(x) / x to the z^5 term (exp_avx512.rs's module doc), with a's sign. A
/// function, not a closure: a closure would not inherit the caller's target features and its
/// intrinsics would become calls.
#[inline(always)]
unsafe fn tanh_blend(k: &K, a: __m256d, abs: __m256d, e: __m256d) -> __m256d {
    let big = _mm256_div_pd(_mm256_sub_pd(k.one, e), _mm256_add_pd(k.one, e));
    let z = _mm256_mul_pd(abs, abs);
    let mut p = _mm256_set1_pd(TANH_C[5]);
    for c in TANH_C[1..5].iter().rev() {
        p = _mm256_fmadd_pd(p, z, _mm256_set1_pd(*c));
    }
    let small = _mm256_fmadd_pd(_mm256_mul_pd(abs, z), p, abs);
    let is_small = _mm256_cmp_pd::<_CMP_LT_OQ>(abs, _mm256_set1_pd(TANH_SMALL));
    let t = _mm256_blendv_pd(big, small, is_small);
    _mm256_or_pd(t, _mm256_and_pd(a, k.sign))
}

/// silu from x and sigmoid(x) for every input: below -150 the clamped sigmoid is not accurate,
/// but |x| e^x < 2^-200 there: -0; -inf (limit +0) goes to the scalar path via NaN.
#[inline(always)]
unsafe fn silu_limits(k: &K, a: __m256d, s: __m256d) -> __m256d {
    let y = _mm256_mul_pd(a, s);
    let low = _mm256_cmp_pd::<_CMP_LT_OQ>(a, k.lo);
    let y = _mm256_blendv_pd(y, k.sign, low);
    let ninf = _mm256_cmp_pd::<_CMP_EQ_OQ>(a, _mm256_set1_pd(f64::NEG_INFINITY));
    _mm256_blendv_pd(y, _mm256_set1_pd(f64::NAN), ninf)
}

/// The f64 result of `f` on 8 f64 lanes (fp32 values), every input handled (exp clamped).
#[inline(always)]
unsafe fn eval(f: Func, k: &K, a0: __m256d, a1: __m256d) -> (__m256d, __m256d) {
    match f {
        Func::Exp => exp2x(k, clamp(k, a0), clamp(k, a1)),
        Func::Sigmoid => sigmoid2x(k, a0, a1),
        Func::Silu => {
            let (s0, s1) = sigmoid2x(k, a0, a1);
            (silu_limits(k, a0, s0), silu_limits(k, a1, s1))
        }
        Func::Tanh => tanh2x(k, a0, a1),
    }
}

#[inline(always)]
unsafe fn halves(x: __m256) -> (__m256d, __m256d) {
    (
        _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
        _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)),
    )
}

/// 8 inputs (through the affine step) to 8 fp32 results at `out`; returns the mask of lanes
/// decided (the others hold some value and go to `fix`).
#[inline(always)]
unsafe fn step(f: Func, k: &K, x: __m256, out: *mut f32) -> u8 {
    // the lanes whose result is an fp32 normal for sure, from the input (exp_avx512.rs's
    // module doc); NaN fails every ordered compare
    let from_normal = _mm256_cmp_ps::<_CMP_GE_OQ>(x, k.normal_x);
    let ax = _mm256_andnot_ps(k.sign32, x);
    let (y0, y1, normal, exact) = match f {
        Func::Exp => {
            let (a0, a1) = halves(_mm256_min_ps(k.hi32, x));
            let (y0, y1) = exp2x(k, a0, a1);
            (y0, y1, from_normal, 0)
        }
        Func::Sigmoid => {
            let (a0, a1) = halves(x);
            let (y0, y1) = sigmoid2x(k, a0, a1);
            (y0, y1, from_normal, 0)
        }
        Func::Silu => {
            let (a0, a1) = halves(x);
            let (s0, s1) = sigmoid2x(k, a0, a1);
            let big = _mm256_cmp_ps::<_CMP_GE_OQ>(ax, k.small_x);
            (
                _mm256_mul_pd(a0, s0),
                _mm256_mul_pd(a1, s1),
                _mm256_and_ps(from_normal, big),
                0,
            )
        }
        Func::Tanh => {
            let (a0, a1) = halves(x);
            let (y0, y1) = tanh2x(k, a0, a1);
            let big = _mm256_cmp_ps::<_CMP_GE_OQ>(ax, k.small_x);
            let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(ax, k.small_x);
            (y0, y1, big, _mm256_movemask_ps(tiny) as u8)
        }
    };
    let ok = _mm256_movemask_ps(_mm256_andnot_ps(near(k, y0, y1), normal)) as u8;
    let y = _mm256_set_m128(_mm256_cvtpd_ps(y1), _mm256_cvtpd_ps(y0));
    _mm256_storeu_ps(out, y);
    ok | exact
}

/// The lanes `step` left undecided (`ok` clear, below `n`): evaluated again on every input
/// (`eval`), decided by the bit test or the interval check when possible, else `slow(xs[i])`.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn fix(
    f: Func,
    xs: &[f32; 8],
    ok: u8,
    n: usize,
    out: *mut f32,
    slow: &impl Fn(f32) -> f32,
) -> usize {
    let k = k();
    let x = _mm256_loadu_ps(xs.as_ptr());
    let (a0, a1) = halves(x);
    let (y0, y1) = eval(f, &k, a0, a1);
    let mut sure = certain(&k, y0, y1);
    if f == Func::Exp {
        // below EXP_TINY_X the result is +0 whatever the error
        sure |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, k.tiny_x)) as u8;
    }
    let mut ys = [0f64; 8];
    _mm256_storeu_pd(ys.as_mut_ptr(), y0);
    _mm256_storeu_pd(ys.as_mut_ptr().add(4), y1);
    let mut fallbacks = 0;
    for i in 0..n {
        if ok >> i & 1 != 0 {
            continue;
        }
        let y = ys[i];
        let (lo, hi) = ((y * (1.0 - D)) as f32, (y * (1.0 + D)) as f32);
        let v = if sure >> i & 1 != 0 {
            y as f32
        } else if lo == hi {
            lo
        } else {
            fallbacks += 1;
            slow(xs[i])
        };
        out.add(i).write_unaligned(v);
    }
    fallbacks
}

/// exp lanes below `EXP_TINY_X` (never decided by `step`: it needs inputs >= -87): +0 whatever
/// the error, stored here without `fix` (the masked scores of attention kernels are all such).
/// Returns the decided lanes.
#[inline(always)]
unsafe fn tiny_zero<const F: u8>(k: &K, x: __m256, ok: u8, out: *mut f32) -> u8 {
    if F != EXP || ok == u8::MAX {
        return ok;
    }
    let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, k.tiny_x);
    _mm256_maskstore_ps(out, _mm256_castps_si256(tiny), _mm256_setzero_ps());
    ok | _mm256_movemask_ps(tiny) as u8
}

super::exp_x86::loop_drivers! {
    width: 8,
    mask: u8,
    vector: __m256,
    features: "avx2,fma",
    host: "AVX2 and FMA",
    ops: (_mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_mul_ps, _mm256_add_ps),
    prefetch: [512], [],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::exp_ref::{affine_inputs, reference, sig};
    use crate::kernels::simd::{host_supports, Path};

    /// The worst relative error of a kernel on 8 f64 lanes against `reference` over `xs`
    /// (inputs where the reference is 0 skipped). Needs a host with AVX2 and FMA.
    fn worst_relative(
        xs: &[f64],
        kernel: impl Fn(&K, __m256d, __m256d) -> (__m256d, __m256d),
        reference: impl Fn(f64) -> f64,
    ) -> f64 {
        let mut worst = 0f64;
        // SAFETY: the callers check the host has AVX2 and FMA.
        let k = unsafe { k() };
        for c in xs.chunks_exact(8) {
            let mut y = [0f64; 8];
            // SAFETY: as above; `c` and `y` hold 8 lanes.
            unsafe {
                let a = (
                    _mm256_loadu_pd(c.as_ptr()),
                    _mm256_loadu_pd(c.as_ptr().add(4)),
                );
                let (y0, y1) = kernel(&k, a.0, a.1);
                _mm256_storeu_pd(y.as_mut_ptr(), y0);
                _mm256_storeu_pd(y.as_mut_ptr().add(4), y1);
            }
            for (x, y) in c.iter().zip(y) {
                let r = reference(*x);
                if r != 0.0 {
                    worst = worst.max(((y - r) / r).abs());
                }
            }
        }
        worst
    }

    #[test]
    fn table_holds_the_powers_with_the_index_taken_out() {
        // 2^(j/8) against 2^j = (2^(j/8))^8 computed in f64, and the j << 49 adjustment
        for j in 0..8 {
            let t = TABLE[j];
            assert!(
                (t.powi(8) / 2f64.powi(j as i32) - 1.0).abs() < 1e-15,
                "entry {j}"
            );
            let b = ((TAB_HI[j] as u32 as u64) << 32) | TAB_LO[j] as u32 as u64;
            assert_eq!(b + ((j as u64) << 49), t.to_bits(), "entry {j}");
        }
    }

    #[test]
    fn fast_exp_is_within_its_error_bound() {
        // the 2^-43.6 of the module doc (inside the bit test's budget), against libm, on a dense
        // sweep of [-150, 100] (the trusted and the clamped range), around r = +-ln2/16 and at
        // the ends of the scaling range
        if !host_supports(Path::Avx2Fma) {
            return;
        }
        let m = 4_000_000;
        let xs: Vec<f64> = (0..=m)
            .map(|i| (-150.0 + 250.0 * i as f64 / m as f64) as f32 as f64)
            .chain((0..8000u32).map(|i| f32::from_bits(0x3d31_6a48 - 4000 + i) as f64)) // ~ln2/16
            .chain((0..8000u32).map(|i| -f32::from_bits(0x3d31_6a48 - 4000 + i) as f64))
            .chain([-150.0, 100.0, -149.99998, 99.99999, 0.0, -0.0])
            .collect();
        // SAFETY: the host has AVX2 and FMA (checked above).
        let worst = worst_relative(&xs, |k, a, b| unsafe { exp2x(k, a, b) }, f64::exp);
        eprintln!("AVX2 exp: worst relative error 2^{:.2}", worst.log2());
        assert!(worst < 2f64.powf(-43.6), "worst relative error {worst:e}");
        assert!(worst > 2f64.powi(-50), "suspiciously exact: {worst:e}");
    }

    #[test]
    fn fast_sigmoid_and_tanh_are_within_their_error_bounds() {
        // the AVX-512 kernel's budgets (sigmoid < 2^-42.4, tanh < 2^-40.5) hold with this exp
        if !host_supports(Path::Avx2Fma) {
            return;
        }
        let m = 2_000_000;
        let xs: Vec<f64> = (0..=m)
            .map(|i| (-40.0 + 80.0 * i as f64 / m as f64) as f32 as f64)
            .chain((0..400_000u32).map(|i| f32::from_bits(0x3df0_0000 + i) as f64)) // ~1/8
            .chain((0..400_000u32).map(|i| f32::from_bits(0x3800_0000 + 40 * i) as f64))
            .collect();
        // SAFETY: the host has AVX2 and FMA (checked above).
        let ws = worst_relative(&xs, |k, a, b| unsafe { sigmoid2x(k, a, b) }, sig);
        let wt = worst_relative(&xs, |k, a, b| unsafe { tanh2x(k, a, b) }, f64::tanh);
        eprintln!("AVX2 sigmoid 2^{:.2}, tanh 2^{:.2}", ws.log2(), wt.log2());
        assert!(ws < 2f64.powf(-42.4) && ws > 0.0, "sigmoid {ws:e}");
        assert!(wt < 2f64.powf(-40.5) && wt > 0.0, "tanh {wt:e}");
    }

    #[test]
    fn affine_step_matches_the_scalar_formula_for_every_variant() {
        // scale 1 / other, bias -0 / +0 / other (the skipped operations), signed zeros, NaN,
        // +-inf, huge values, the tiny-exp store, a remainder (3016 = 188 * 16 + 8), in place
        // and from unaligned bytes
        if !host_supports(Path::Avx2Fma) {
            return;
        }
        let xs = affine_inputs();
        for f in [Func::Exp, Func::Sigmoid, Func::Silu, Func::Tanh] {
            for (s, b) in [
                (1.0, -0.0),
                (1.0, 0.0),
                (1.0, 0.5),
                (-2.0, 0.0),
                (0.5, -0.0),
            ] {
                let want: Vec<u32> = xs
                    .iter()
                    .map(|x| reference(f, x * s + b).to_bits())
                    .collect();
                let slow = |x: f32| reference(f, x);
                let aff = Affine { scale: s, bias: b };
                let mut v = xs.clone();
                let p = v.as_mut_ptr();
                // SAFETY: the host has AVX2 and FMA; src = dst = v.
                unsafe { map_affine_raw(f, aff, p, p, v.len(), slow) };
                let got: Vec<u32> = v.iter().map(|y| y.to_bits()).collect();
                let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
                let mut out = vec![0u8; bytes.len() + 1];
                // SAFETY: as above.
                unsafe { map_bytes(f, &bytes, &mut out[1..], |x| x * s + b, slow) };
                let got_b: Vec<u32> = out[1..]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                for (i, x) in xs.iter().enumerate() {
                    let (w, g, gb) = (want[i], got[i], got_b[i]);
                    let nan = f32::from_bits(w).is_nan();
                    let same = |g: u32| g == w || (nan && f32::from_bits(g).is_nan());
                    assert!(same(g), "{f:?} ({s}, {b}) x={x:e}: {g:#x} want {w:#x}");
                    assert!(
                        same(gb),
                        "{f:?} ({s}, {b}) bytes x={x:e}: {gb:#x} want {w:#x}"
                    );
                }
            }
        }
    }
}
