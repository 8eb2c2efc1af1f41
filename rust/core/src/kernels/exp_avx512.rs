//! The AVX-512 path of kernels/exp.rs, written with intrinsics: 16 fp32 elements per step, two
//! f64 vectors of 8. Same contract and same bits as the portable path (every element either
//! passes a rounding check that proves its fp32 result equals libm's f64 formula rounded once,
//! or takes the caller's scalar path), with a cheaper exp and a cheaper check:
//!
//! - exp(v), v clamped to [-150, 100]: `n = round(16 v / ln2)` (the 1.5 * 2^52 shift),
//!   `r = v - n ln2/16` with a Cody-Waite split (`LN2_16_HI` has 41 significant bits and |n| <=
//!   3463 < 2^12, so `fma(-n, LN2_16_HI, v)` is exact: both terms are multiples of 2^-45 when
//!   n != 0 and |r| < 2^-5), `exp(v) = 2^(n/16) * exp(r)` with 2^(j/16), j = n mod 16, from a
//!   16-entry table (one `vpermt2pd`) and `exp(r)` the degree-6 Taylor polynomial: |r| <=
//!   ln2/32 + 2^-40 gives a truncation error below |r|^7/7! e^|r| < 2^-50.9, the table entries are
//!   f64 roundings (2^-53) and the Horner steps and the product add < 10 * 2^-53: < 2^-49
//!   relative in all. The power 2^floor(n/16) is applied exactly by `vscalefpd` (results stay
//!   normal f64: e^-150 > 2^-217). The same bound keeps exp.rs's interval check (2^-44) valid
//!   for the lanes handed to it.
//! - the check: with libm's f64 result also within 2^-52 relative, the exact f64 values either
//!   side lie within 2^-48.5 relative of `y`, i.e. within 2^(52 - 48.5 + 1) < 23 f64 ulps of it.
//!   For |y| in the fp32 normal range (>= 2^-126) the fp32 rounding of y is certain when its 29
//!   low mantissa bits are more than `TH` = 512 ulps away from the half-way pattern 2^28 (no
//!   rounding midpoint within reach; overflow to inf is the same midpoint test at the top of the
//!   range, and values >= 2^128 round to inf either way). Below 2^-151 the result is +-0 whatever
//!   the error. Other lanes (fp32 subnormal results, NaN, rare near-midpoint values) go to the
//!   interval check of exp.rs and then, if still undecided, to the caller's scalar function.
//! - sigmoid / silu divide with `vdivpd` (exact rounding) after the exp above: the same < 2^-48
//!   budget as exp.rs's error analysis for these formulas, within the check's reach.
//! - tanh: both of exp.rs's branches on every lane, blended on |x| < 1/8: `(1 - e) / (1 + e)`
//!   with the exp above (< 3.96 * 2^-49 + 3 * 2^-53 < 2^-46.8 relative) and the Taylor
//!   polynomial (< 2^-50): within 2^(52 - 46.8 + 1) < 74 ulps of the exact value, inside `TH`.

use super::exp::{Func, TANH_C, TANH_SMALL};
use std::arch::x86_64::*;

/// 1.5 * 2^52: adding it rounds |v| < 2^51 to an integer held in the low mantissa bits.
const SHIFT: f64 = 6755399441055744.0;
const INV_LN2_16: f64 = 23.083120654223414;
/// ln2 / 16 truncated to 41 significant bits, and the f64 nearest the rest.
const LN2_16_HI: f64 = 0.043321698784978935;
const LN2_16_LO: f64 = 1.7647056601894736e-14;
/// 2^(j/16), j = 0..16, each the f64 nearest.
const TABLE: [f64; 16] = [
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
/// Distance (f64 ulps) from the fp32 half-way pattern below which a lane is not decided here.
const TH: i64 = 512;
/// exp inputs from which the result is an fp32 normal for sure (e^-87 > 2^-126 (1 + 2^-40)), and
/// below which it rounds to +0 for sure (e^-104 < 2^-150 (1 - 2^-40)): exp decides its range
/// from the fp32 input, 16 lanes at a time, instead of from each f64 result.
const EXP_NORMAL_X: f32 = -87.0;
const EXP_TINY_X: f32 = -104.0;

/// The constants of one run, loaded once (kept in registers across the loop).
#[derive(Clone, Copy)]
struct K {
    t0: __m512d,
    t1: __m512d,
    lo: __m512d,
    hi: __m512d,
    shift: __m512d,
    inv: __m512d,
    ln_hi: __m512d,
    ln_lo: __m512d,
    sixteenth: __m512d,
    c: [__m512d; 6],
    one: __m512d,
    bias: __m512i,
    low29: __m512i,
    two_th: __m512i,
    min_normal: __m512d,
    tiny: __m512d,
    lo32: __m512,
    hi32: __m512,
    normal_x: __m512,
    tiny_x: __m512,
}

#[inline(always)]
unsafe fn k() -> K {
    let s = _mm512_set1_pd;
    K {
        t0: _mm512_loadu_pd(TABLE.as_ptr()),
        t1: _mm512_loadu_pd(TABLE.as_ptr().add(8)),
        lo: s(-150.0),
        hi: s(100.0),
        shift: s(SHIFT),
        inv: s(INV_LN2_16),
        ln_hi: s(LN2_16_HI),
        ln_lo: s(LN2_16_LO),
        sixteenth: s(0.0625),
        c: [
            s(1.0 / 720.0),
            s(1.0 / 120.0),
            s(1.0 / 24.0),
            s(1.0 / 6.0),
            s(0.5),
            s(1.0),
        ],
        one: s(1.0),
        bias: _mm512_set1_epi64((1 << 28) + TH),
        low29: _mm512_set1_epi64((1 << 29) - 1),
        two_th: _mm512_set1_epi64(2 * TH),
        min_normal: s(f64::from_bits(0x3810_0000_0000_0000)), // 2^-126
        tiny: s(f64::from_bits(0x3680_0000_0000_0000)),       // 2^-151
        lo32: _mm512_set1_ps(-150.0),
        hi32: _mm512_set1_ps(100.0),
        normal_x: _mm512_set1_ps(EXP_NORMAL_X),
        tiny_x: _mm512_set1_ps(EXP_TINY_X),
    }
}

/// e^v for v in [-150, 100] (the caller clamps; NaN stays NaN).
#[inline(always)]
unsafe fn exp8(k: &K, v: __m512d) -> __m512d {
    let t = _mm512_fmadd_pd(v, k.inv, k.shift);
    let n = _mm512_sub_pd(t, k.shift);
    let r = _mm512_fnmadd_pd(n, k.ln_hi, v);
    let r = _mm512_fnmadd_pd(n, k.ln_lo, r);
    let ti = _mm512_castpd_si512(t);
    let tab = _mm512_permutex2var_pd(k.t0, ti, k.t1);
    let mut p = k.c[0];
    for c in &k.c[1..] {
        p = _mm512_fmadd_pd(p, r, *c);
    }
    p = _mm512_fmadd_pd(p, r, k.one);
    // tab * p * 2^floor(n / 16) (n / 16 is exact)
    _mm512_scalef_pd(_mm512_mul_pd(tab, p), _mm512_mul_pd(n, k.sixteenth))
}

/// `max(lo, min(hi, v))` keeping NaN (the second operand is returned when one is NaN).
#[inline(always)]
unsafe fn clamp(k: &K, v: __m512d) -> __m512d {
    _mm512_max_pd(k.lo, _mm512_min_pd(k.hi, v))
}

/// Lanes of `y` more than `TH` ulps from an fp32 rounding midpoint (module doc); only meaningful
/// where the fp32 result is normal.
#[inline(always)]
unsafe fn far(k: &K, y: __m512d) -> __mmask8 {
    let bits = _mm512_castpd_si512(y);
    // (low 29 bits - (2^28 - TH)) mod 2^29 > 2 TH  <=>  |low 29 bits - 2^28| > TH
    let m = _mm512_and_si512(_mm512_add_epi64(bits, k.bias), k.low29);
    _mm512_cmpgt_epi64_mask(m, k.two_th)
}

/// Lanes whose fp32 rounding of `y` is certain (module doc).
#[inline(always)]
unsafe fn certain(k: &K, y: __m512d) -> __mmask8 {
    let far = far(k, y);
    let ay = _mm512_abs_pd(y);
    let normal = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(ay, k.min_normal);
    let tiny = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(ay, k.tiny);
    (far & normal) | tiny
}

/// sigmoid of the f64 lanes `a` (a NaN stays NaN): e = exp(-|a|), (a >= 0 ? 1 : e) / (1 + e).
#[inline(always)]
unsafe fn sigmoid8(k: &K, a: __m512d) -> __m512d {
    let sign = _mm512_castpd_si512(_mm512_set1_pd(-0.0));
    let na = _mm512_castsi512_pd(_mm512_or_si512(_mm512_castpd_si512(a), sign));
    let e = exp8(k, _mm512_max_pd(k.lo, na));
    let one = k.one;
    let pos = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(a, _mm512_setzero_pd());
    let num = _mm512_mask_blend_pd(pos, e, one);
    _mm512_div_pd(num, _mm512_add_pd(one, e))
}

/// tanh of the f64 lanes `a` (exp.rs's `tanh_f64`; NaN stays NaN): both branches, blended.
#[inline(always)]
unsafe fn tanh8(k: &K, a: __m512d) -> __m512d {
    let sign = _mm512_castpd_si512(_mm512_set1_pd(-0.0));
    let bits = _mm512_castpd_si512(a);
    let abs = _mm512_castsi512_pd(_mm512_andnot_si512(sign, bits));
    let e = exp8(
        k,
        _mm512_max_pd(k.lo, _mm512_mul_pd(abs, _mm512_set1_pd(-2.0))),
    );
    let big = _mm512_div_pd(_mm512_sub_pd(k.one, e), _mm512_add_pd(k.one, e));
    let z = _mm512_mul_pd(abs, abs);
    let mut p = _mm512_set1_pd(TANH_C[6]);
    for c in TANH_C[1..6].iter().rev() {
        p = _mm512_fmadd_pd(p, z, _mm512_set1_pd(*c));
    }
    let small = _mm512_fmadd_pd(_mm512_mul_pd(abs, z), p, abs);
    let is_small = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(abs, _mm512_set1_pd(TANH_SMALL));
    let t = _mm512_castpd_si512(_mm512_mask_blend_pd(is_small, big, small));
    _mm512_castsi512_pd(_mm512_or_si512(t, _mm512_and_si512(bits, sign)))
}

/// The f64 result of `f` on 8 fp32 inputs and the lanes whose fp32 rounding is certain.
#[inline(always)]
unsafe fn eval(f: Func, k: &K, x: __m256) -> (__m512d, __mmask8) {
    let a = _mm512_cvtps_pd(x);
    let y = match f {
        Func::Exp => exp8(k, clamp(k, a)), // (step takes exp 16 lanes at a time)
        Func::Sigmoid => sigmoid8(k, a),
        Func::Silu => {
            // below -150 the clamped sigmoid is not accurate, but |x| e^x < 2^-200 there: -0
            let y = _mm512_mul_pd(a, sigmoid8(k, a));
            let low = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(a, k.lo);
            let y = _mm512_mask_blend_pd(low, y, _mm512_set1_pd(-0.0));
            // -inf (limit +0) to the scalar path via NaN
            let ninf = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(a, _mm512_set1_pd(f64::NEG_INFINITY));
            _mm512_mask_blend_pd(ninf, y, _mm512_set1_pd(f64::NAN))
        }
        Func::Tanh => tanh8(k, a),
    };
    (y, certain(k, y))
}

/// exp of 16 fp32 lanes: clamped and range-checked in fp32, evaluated as two f64 halves; the
/// mask of lanes whose fp32 rounding is certain (`EXP_NORMAL_X`, `EXP_TINY_X`; NaN fails both).
#[inline(always)]
unsafe fn exp16(k: &K, x: __m512) -> (__m512d, __m512d, u16) {
    let xc = _mm512_max_ps(k.lo32, _mm512_min_ps(k.hi32, x)); // NaN stays NaN
    let h = _mm512_castps_pd(xc);
    let y0 = exp8(
        k,
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_castpd512_pd256(h))),
    );
    let y1 = exp8(
        k,
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(h))),
    );
    let far = far(k, y0) as u16 | (far(k, y1) as u16) << 8;
    let normal = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, k.normal_x);
    let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, k.tiny_x);
    (y0, y1, (far & normal) | tiny)
}

/// 16 elements in place (already through `pre`); returns the mask of decided lanes and, when
/// some are not, every lane's f64 value.
#[inline(always)]
unsafe fn step(f: Func, k: &K, xs: &mut [f32; 16], ys: &mut [f64; 16]) -> u16 {
    let p = xs.as_mut_ptr();
    let (y0, y1, ok) = if f == Func::Exp {
        exp16(k, _mm512_loadu_ps(p))
    } else {
        let (y0, ok0) = eval(f, k, _mm256_loadu_ps(p));
        let (y1, ok1) = eval(f, k, _mm256_loadu_ps(p.add(8)));
        (y0, y1, ok0 as u16 | (ok1 as u16) << 8)
    };
    _mm256_storeu_ps(p, _mm512_cvtpd_ps(y0));
    _mm256_storeu_ps(p.add(8), _mm512_cvtpd_ps(y1));
    if ok != u16::MAX {
        _mm512_storeu_pd(ys.as_mut_ptr(), y0);
        _mm512_storeu_pd(ys.as_mut_ptr().add(8), y1);
    }
    ok
}

/// 16 inputs (through `pre` already) to 16 results; undecided lanes below `n` through the
/// interval check and then `slow` (counted in `fallbacks`).
#[inline(always)]
unsafe fn block(
    f: Func,
    k: &K,
    ins: [f32; 16],
    n: usize,
    slow: &impl Fn(f32) -> f32,
    fallbacks: &mut usize,
) -> [f32; 16] {
    let mut xs = ins;
    let mut ys = [0f64; 16];
    let ok = step(f, k, &mut xs, &mut ys);
    if ok != u16::MAX {
        for i in 0..n {
            if ok >> i & 1 == 0 {
                let (r, sure) = super::exp::certain(ys[i]);
                xs[i] = if sure {
                    r
                } else {
                    *fallbacks += 1;
                    slow(ins[i])
                };
            }
        }
    }
    xs
}

/// `v[i] = f(pre(v[i]))` (exp.rs's `map` contract). Returns how many elements took `slow`.
///
/// # Safety
/// The host must have AVX-512F and FMA.
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn map(
    f: Func,
    v: &mut [f32],
    pre: impl Fn(f32) -> f32,
    slow: impl Fn(f32) -> f32,
) -> usize {
    match f {
        Func::Exp => map_in::<EXP>(v, pre, slow),
        Func::Sigmoid => map_in::<SIGMOID>(v, pre, slow),
        Func::Silu => map_in::<SILU>(v, pre, slow),
        Func::Tanh => map_in::<TANH>(v, pre, slow),
    }
}

const EXP: u8 = 0;
const SIGMOID: u8 = 1;
const SILU: u8 = 2;
const TANH: u8 = 3;

fn func(code: u8) -> Func {
    match code {
        EXP => Func::Exp,
        SIGMOID => Func::Sigmoid,
        SILU => Func::Silu,
        _ => Func::Tanh,
    }
}

#[inline(always)]
unsafe fn map_in<const F: u8>(
    v: &mut [f32],
    pre: impl Fn(f32) -> f32,
    slow: impl Fn(f32) -> f32,
) -> usize {
    let f = func(F);
    let k = k();
    let mut fallbacks = 0;
    let mut chunks = v.chunks_exact_mut(16);
    for c in &mut chunks {
        let c: &mut [f32; 16] = c.try_into().unwrap();
        *c = block(f, &k, c.map(&pre), 16, &slow, &mut fallbacks);
    }
    let rest = chunks.into_remainder();
    let n = rest.len();
    if n > 0 {
        let mut xs = [0f32; 16];
        for (x, e) in xs.iter_mut().zip(rest.iter()) {
            *x = pre(*e);
        }
        rest.copy_from_slice(&block(f, &k, xs, n, &slow, &mut fallbacks)[..n]);
    }
    fallbacks
}

/// `dst[i] = f(pre(src[i]))` over little-endian fp32 bytes (equal lengths, multiples of 4).
///
/// # Safety
/// The host must have AVX-512F and FMA.
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn map_bytes(
    f: Func,
    src: &[u8],
    dst: &mut [u8],
    pre: impl Fn(f32) -> f32,
    slow: impl Fn(f32) -> f32,
) -> usize {
    match f {
        Func::Exp => bytes_in::<EXP>(src, dst, pre, slow),
        Func::Sigmoid => bytes_in::<SIGMOID>(src, dst, pre, slow),
        Func::Silu => bytes_in::<SILU>(src, dst, pre, slow),
        Func::Tanh => bytes_in::<TANH>(src, dst, pre, slow),
    }
}

#[inline(always)]
unsafe fn bytes_in<const F: u8>(
    src: &[u8],
    dst: &mut [u8],
    pre: impl Fn(f32) -> f32,
    slow: impl Fn(f32) -> f32,
) -> usize {
    let f = func(F);
    let k = k();
    let mut fallbacks = 0;
    let mut si = src.chunks_exact(64);
    let mut di = dst.chunks_exact_mut(64);
    for (s, d) in (&mut si).zip(&mut di) {
        let s: &[u8; 64] = s.try_into().unwrap();
        let xs: [f32; 16] = std::array::from_fn(|i| {
            pre(f32::from_le_bytes(s[4 * i..4 * i + 4].try_into().unwrap()))
        });
        let ys = block(f, &k, xs, 16, &slow, &mut fallbacks);
        for (o, y) in d.chunks_exact_mut(4).zip(ys) {
            o.copy_from_slice(&y.to_le_bytes());
        }
    }
    let (s, d) = (si.remainder(), di.into_remainder());
    let n = s.len() / 4;
    if n > 0 {
        let mut xs = [0f32; 16];
        for (x, e) in xs.iter_mut().zip(s.chunks_exact(4)) {
            *x = pre(f32::from_le_bytes(e.try_into().unwrap()));
        }
        let ys = block(f, &k, xs, n, &slow, &mut fallbacks);
        for (o, y) in d.chunks_exact_mut(4).zip(ys) {
            o.copy_from_slice(&y.to_le_bytes());
        }
    }
    fallbacks
}
