//! The AVX-512 path of kernels/exp.rs, written with intrinsics: 16 fp32 elements per step, two
//! f64 vectors of 8. Same contract and same bits as the portable path (every element either
//! passes a rounding check that proves its fp32 result equals libm's f64 formula rounded once,
//! or takes the caller's scalar path), with a cheaper exp and a cheaper check:
//!
//! - exp(v), v <= 100 (the caller clamps; lanes below -150 are never trusted, see below):
//!   `q = n/16 = round(16 v / ln2) / 16` by adding 1.5 * 2^48 to v / ln2 (f64 numbers of that
//!   size are multiples of 1/16, and the low mantissa bits of the sum hold 2^51 + n),
//!   `r = v - q ln2` in one fused multiply-add with `LN2` the f64 nearest ln2 (|LN2 - ln2| <=
//!   2^-54 and |q| <= 217 < 2^7.8: an absolute error below 2^-46.2 in r, plus the fma's
//!   rounding 2^-59),
//!   `exp(v) = 2^(n/16) * exp(r)` with 2^(j/16), j = n mod 16, from a 16-entry table (one
//!   `vpermt2pd`) and `exp(r) = 1 + r p(r)`, p the degree-4 Taylor polynomial of (e^r - 1)/r:
//!   |r| <= ln2/32 + 2^-40 gives a truncation error below |r|^6/6! e^|r| < 2^-42.6, the table
//!   entries are f64 roundings (2^-53) and the Horner steps, `tab * r` and the final
//!   `fma(tab r, p, tab)` add < 4 * 2^-53: < 2^-42.5 relative in all. The power
//!   2^floor(n/16) is applied exactly by `vscalefpd` (results stay normal f64: e^-150 > 2^-217).
//! - the check: with libm's f64 result also within 2^-52 relative, the exact f64 values either
//!   side lie within 2^-42.5 + 2^-52 relative of `y`, i.e. within 2^10.6 f64 ulps of it (an
//!   ulp is at least 2^-53 |y|). For |y| in the fp32 normal range (>= 2^-126) the fp32 rounding
//!   of y is certain when its 29 low mantissa bits are at least `TH` = 2^13 ulps away from the
//!   half-way pattern 2^28 (no rounding midpoint within reach; overflow to inf is the same
//!   midpoint test at the top of the range, and values >= 2^128 round to inf either way). exp
//!   takes its range from the fp32 input instead: x >= -87 gives a normal result
//!   (e^-87 > 2^-126 (1 + 2^-40)), and below -104 the result rounds to +0 whatever the error.
//!   exp lanes with inputs below -104 are then stored as +0 in the loop (`tiny_zero`: masked
//!   scores in attention kernels are all such). Other lanes (fp32 subnormal results, NaN,
//!   inputs in [-104, -87), rare near-midpoint values; for sigmoid, silu and tanh also their
//!   inputs below -87) are
//!   evaluated again with the input clamped to [-150, 100], decided there when possible, else
//!   by an interval check of half-width `D` = 2^-39 (exp.rs's `certain` with a wider interval:
//!   the error here is larger than the portable path's), and then, if still undecided, by the
//!   caller's scalar function.
//! - sigmoid / silu divide with `vdivpd` (exact rounding) after the exp above: exp.rs's error
//!   analysis for these formulas with this exp's 2^-42.5 gives < 2^-42.4 (silu: one more
//!   rounding), within 2^10.7 ulps together with the reference's own < 2^-51.
//! - tanh: both of exp.rs's branches on every lane, blended on |x| < 1/8: `(1 - e) / (1 + e)`
//!   with the exp above (< 3.96 * 2^-42.5 + 3 * 2^-53 < 2^-40.5 relative) and the Taylor
//!   polynomial of tanh(x) / x to the x^10 term (the series alternates with decreasing terms:
//!   the first omitted one, 21844/6081075 x^12 < 2^-44.1 for |x| < 1/8, bounds the
//!   truncation; with the roundings < 2^-44): within 2^(53 - 40.5) + 4 < 2^12.6 ulps of the
//!   reference (libm's tanh is within 2 ulps), inside `TH`.
//! - sigmoid, silu and tanh take their range from the input as exp does (`SMALL_X`).
//!
//! Per 16 elements the common case (every lane decided) is straight-line code with no call, so
//! the constants stay in registers; the affine step `x * scale + bias` before the function is
//! applied in fp32 vectors (two roundings, as `act::apply_affine_slice`), skipped where it
//! cannot change the result (`Affine`).

use super::exp::{Affine, Func, POW2_16, TANH_C, TANH_SMALL};
use super::exp_x86::{
    func, D, EXP, EXP_NORMAL_X, EXP_TINY_X, SIGMOID, SILU, SMALL_X, TANH, TH_LOG2,
};
use std::arch::x86_64::*;

/// 1.5 * 2^48: adding it rounds |v| < 2^47 to a multiple of 1/16, 16 times which is held in
/// the low mantissa bits.
const SHIFT: f64 = 422212465065984.0;
const INV_LN2: f64 = std::f64::consts::LOG2_E;
/// The f64 nearest ln2.
const LN2: f64 = std::f64::consts::LN_2;
/// 2^(j/16), j = 0..16, each the f64 nearest.
const TABLE: [f64; 16] = POW2_16;

/// The constants of one run, loaded once (kept in registers across the loop).
#[derive(Clone, Copy)]
struct K {
    t0: __m512d,
    t1: __m512d,
    lo: __m512d,
    hi: __m512d,
    shift: __m512d,
    inv: __m512d,
    ln2: __m512d,
    c: [__m512d; 4],
    one: __m512d,
    bias: __m512i,
    mid_mask: __m512i,
    min_normal: __m512d,
    tiny: __m512d,
    hi32: __m512,
    normal_x: __m512,
    tiny_x: __m512,
    small_x: __m512,
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
        inv: s(INV_LN2),
        ln2: s(LN2),
        c: [s(1.0 / 120.0), s(1.0 / 24.0), s(1.0 / 6.0), s(0.5)],
        one: s(1.0),
        bias: _mm512_set1_epi64((1 << 28) + (1 << TH_LOG2)),
        // bits TH_LOG2 + 1 ..= 28
        mid_mask: _mm512_set1_epi64((1 << 29) - (1 << (TH_LOG2 + 1))),
        min_normal: s(f64::from_bits(0x3810_0000_0000_0000)), // 2^-126
        tiny: s(f64::from_bits(0x3680_0000_0000_0000)),       // 2^-151
        hi32: _mm512_set1_ps(100.0),
        normal_x: _mm512_set1_ps(EXP_NORMAL_X),
        tiny_x: _mm512_set1_ps(EXP_TINY_X),
        small_x: _mm512_set1_ps(SMALL_X),
    }
}

/// e^v for v <= 100 (module doc; lanes below -150 give some finite or NaN value, never trusted).
#[inline(always)]
unsafe fn exp8(k: &K, v: __m512d) -> __m512d {
    let t = _mm512_fmadd_pd(v, k.inv, k.shift);
    let q = _mm512_sub_pd(t, k.shift); // n / 16, exact
    let r = _mm512_fnmadd_pd(q, k.ln2, v);
    let tab = _mm512_permutex2var_pd(k.t0, _mm512_castpd_si512(t), k.t1);
    // p(r) = 1 + r/2 + r^2/6 + r^3/24 + r^4/120, e^r ~ 1 + r p(r)
    let mut p = _mm512_fmadd_pd(k.c[0], r, k.c[1]);
    p = _mm512_fmadd_pd(p, r, k.c[2]);
    p = _mm512_fmadd_pd(p, r, k.c[3]);
    p = _mm512_fmadd_pd(p, r, k.one);
    let y = _mm512_fmadd_pd(_mm512_mul_pd(tab, r), p, tab);
    // y * 2^floor(n / 16)
    _mm512_scalef_pd(y, q)
}

/// `max(lo, min(hi, v))` keeping NaN (the second operand is returned when one is NaN).
#[inline(always)]
unsafe fn clamp(k: &K, v: __m512d) -> __m512d {
    _mm512_max_pd(k.lo, _mm512_min_pd(k.hi, v))
}

/// Lanes (among `m`) of `y` at least 2^TH_LOG2 ulps from an fp32 rounding midpoint (module
/// doc); only meaningful where the fp32 result is normal. With c = low 29 bits + 2^28 + 2^TH
/// (mod 2^29), the near lanes are those with bits TH+1..=28 of c all zero.
#[inline(always)]
unsafe fn far(k: &K, m: __mmask8, y: __m512d) -> __mmask8 {
    let c = _mm512_add_epi64(_mm512_castpd_si512(y), k.bias);
    _mm512_mask_test_epi64_mask(m, c, k.mid_mask)
}

/// Lanes whose fp32 rounding of `y` is certain (module doc).
#[inline(always)]
unsafe fn certain(k: &K, y: __m512d) -> __mmask8 {
    let ay = _mm512_abs_pd(y);
    let normal = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(ay, k.min_normal);
    let tiny = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(ay, k.tiny);
    far(k, normal, y) | tiny
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
    // tanh(x) / x to the z^5 term (module doc)
    let mut p = _mm512_set1_pd(TANH_C[5]);
    for c in TANH_C[1..5].iter().rev() {
        p = _mm512_fmadd_pd(p, z, _mm512_set1_pd(*c));
    }
    let small = _mm512_fmadd_pd(_mm512_mul_pd(abs, z), p, abs);
    let is_small = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(abs, _mm512_set1_pd(TANH_SMALL));
    let t = _mm512_castpd_si512(_mm512_mask_blend_pd(is_small, big, small));
    _mm512_castsi512_pd(_mm512_or_si512(t, _mm512_and_si512(bits, sign)))
}

/// The f64 result of `f` on 8 f64 lanes (fp32 values), every input handled (exp clamped).
#[inline(always)]
unsafe fn eval(f: Func, k: &K, a: __m512d) -> __m512d {
    match f {
        Func::Exp => exp8(k, clamp(k, a)),
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
    }
}

#[inline(always)]
unsafe fn halves(x: __m512) -> (__m512d, __m512d) {
    let h = _mm512_castps_pd(x);
    (
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_castpd512_pd256(h))),
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(h))),
    )
}

/// 16 inputs (through the affine step) to 16 fp32 results at `out`; returns the mask of lanes
/// decided (the others hold some value and go to `fix`).
#[inline(always)]
unsafe fn step(f: Func, k: &K, x: __m512, out: *mut f32) -> u16 {
    // The lanes whose result is an fp32 normal for sure, from the input (module doc); NaN
    // fails every ordered compare. Lanes outside go to `fix`, so the formulas here need not
    // handle them (no clamp below, no limits).
    let from_normal = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, k.normal_x);
    let ax = _mm512_abs_ps(x);
    let (y0, y1, normal, exact) = match f {
        Func::Exp => {
            let (a0, a1) = halves(_mm512_min_ps(k.hi32, x));
            (exp8(k, a0), exp8(k, a1), from_normal, 0)
        }
        Func::Sigmoid => {
            let (a0, a1) = halves(x);
            (sigmoid8(k, a0), sigmoid8(k, a1), from_normal, 0)
        }
        Func::Silu => {
            let (a0, a1) = halves(x);
            // (no closure here: it would not inherit the caller's target features)
            let (y0, y1) = (
                _mm512_mul_pd(a0, sigmoid8(k, a0)),
                _mm512_mul_pd(a1, sigmoid8(k, a1)),
            );
            let big = _mm512_mask_cmp_ps_mask::<_CMP_GE_OQ>(from_normal, ax, k.small_x);
            (y0, y1, big, 0)
        }
        Func::Tanh => {
            let (a0, a1) = halves(x);
            let big = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(ax, k.small_x);
            let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(ax, k.small_x);
            (tanh8(k, a0), tanh8(k, a1), big, tiny)
        }
    };
    let ok = far(k, normal as u8, y0) as u16 | (far(k, (normal >> 8) as u8, y1) as u16) << 8;
    _mm256_storeu_ps(out, _mm512_cvtpd_ps(y0));
    _mm256_storeu_ps(out.add(8), _mm512_cvtpd_ps(y1));
    ok | exact
}

/// The lanes `step` left undecided (`ok` clear, below `n`): evaluated again on every input
/// (`eval`), decided by the bit test or the interval check when possible, else `slow(xs[i])`.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f,fma")]
unsafe fn fix(
    f: Func,
    xs: &[f32; 16],
    ok: u16,
    n: usize,
    out: *mut f32,
    slow: &impl Fn(f32) -> f32,
) -> usize {
    let k = k();
    let x = _mm512_loadu_ps(xs.as_ptr());
    let (a0, a1) = halves(x);
    let (y0, y1) = (eval(f, &k, a0), eval(f, &k, a1));
    let mut sure = certain(&k, y0) as u16 | (certain(&k, y1) as u16) << 8;
    if f == Func::Exp {
        // below EXP_TINY_X the result is +0 whatever the error
        sure |= _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, k.tiny_x);
    }
    let mut ys = [0f64; 16];
    _mm512_storeu_pd(ys.as_mut_ptr(), y0);
    _mm512_storeu_pd(ys.as_mut_ptr().add(8), y1);
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

/// exp lanes left undecided by `step` whose input is below `EXP_TINY_X`: +0 whatever the error
/// (what `fix` decides for them too), stored here without `fix`'s re-evaluation (the masked
/// lanes of flash attention's `exp(s - max)` are all such). Returns the decided lanes.
#[inline(always)]
unsafe fn tiny_zero<const F: u8>(k: &K, x: __m512, ok: u16, out: *mut f32) -> u16 {
    if F != EXP || ok == u16::MAX {
        return ok;
    }
    let tiny = _mm512_mask_cmp_ps_mask::<_CMP_LT_OQ>(!ok, x, k.tiny_x);
    _mm512_mask_storeu_ps(out, tiny, _mm512_setzero_ps());
    ok | tiny
}

super::exp_x86::loop_drivers! {
    width: 16,
    mask: u16,
    vector: __m512,
    features: "avx512f,fma",
    host: "AVX-512F and FMA",
    ops: (_mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_mul_ps, _mm512_add_ps),
    prefetch: [512, 528], [512],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::exp_ref::{affine_inputs, reference, sig};
    use crate::kernels::simd::{host_supports, Path};

    /// The worst relative error of an 8-lane kernel against `reference` over `xs` (inputs
    /// where the reference is 0 skipped). Needs a host with AVX-512F.
    fn worst_relative(
        xs: &[f64],
        kernel: impl Fn(&K, __m512d) -> __m512d,
        reference: impl Fn(f64) -> f64,
    ) -> f64 {
        let mut worst = 0f64;
        // SAFETY: the callers check the host has AVX-512F.
        let k = unsafe { k() };
        for c in xs.chunks_exact(8) {
            let mut y = [0f64; 8];
            // SAFETY: as above; `c` and `y` hold 8 lanes.
            unsafe { _mm512_storeu_pd(y.as_mut_ptr(), kernel(&k, _mm512_loadu_pd(c.as_ptr()))) };
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
    fn fast_exp_is_within_its_error_bound() {
        // the 2^-42.5 the bit test's threshold relies on (module doc), against libm, on a dense
        // sweep of the inputs the check trusts ([-87, 100]) and the clamped ones
        if !host_supports(Path::Avx512) {
            return;
        }
        let m = 4_000_000;
        let xs: Vec<f64> = (0..=m)
            .map(|i| (-150.0 + 250.0 * i as f64 / m as f64) as f32 as f64)
            .chain((0..4000u32).map(|i| f32::from_bits(0x3cb1_6a48 + i) as f64)) // ~ln2/32
            .collect();
        // SAFETY: the host has AVX-512F (checked above).
        let worst = worst_relative(&xs, |k, a| unsafe { exp8(k, a) }, f64::exp);
        eprintln!("AVX-512 exp: worst relative error 2^{:.2}", worst.log2());
        assert!(worst < 2f64.powf(-42.5), "worst relative error {worst:e}");
        assert!(worst > 2f64.powi(-48), "suspiciously exact: {worst:e}");
    }

    #[test]
    fn fast_sigmoid_and_tanh_are_within_their_error_bounds() {
        // the budgets of the module doc against the f64 formulas on libm (sigmoid < 2^-42.4,
        // tanh < 2^-40.5), on dense sweeps including both tanh branches around 1/8
        if !host_supports(Path::Avx512) {
            return;
        }
        let m = 2_000_000;
        let xs: Vec<f64> = (0..=m)
            .map(|i| (-40.0 + 80.0 * i as f64 / m as f64) as f32 as f64)
            .chain((0..400_000u32).map(|i| f32::from_bits(0x3df0_0000 + i) as f64)) // ~1/8
            .chain((0..400_000u32).map(|i| f32::from_bits(0x3800_0000 + 40 * i) as f64))
            .collect();
        // SAFETY: the host has AVX-512F (checked above).
        let ws = worst_relative(&xs, |k, a| unsafe { sigmoid8(k, a) }, sig);
        let wt = worst_relative(&xs, |k, a| unsafe { tanh8(k, a) }, f64::tanh);
        eprintln!(
            "AVX-512 sigmoid 2^{:.2}, tanh 2^{:.2}",
            ws.log2(),
            wt.log2()
        );
        assert!(ws < 2f64.powf(-42.4) && ws > 0.0, "sigmoid {ws:e}");
        assert!(wt < 2f64.powf(-40.5) && wt > 0.0, "tanh {wt:e}");
    }

    #[test]
    fn affine_step_matches_the_scalar_formula_for_every_variant() {
        // scale 1 / other, bias -0 / +0 / other (the skipped operations), signed zeros (+0 bias
        // turns -0 into +0: tanh and silu see it), NaN, +-inf, huge values, a remainder, in
        // place and from bytes
        if !host_supports(Path::Avx512) {
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
                let mut v = xs.clone();
                crate::kernels::exp::map_affine(f, &mut v, (s, b), slow);
                let got: Vec<u32> = v.iter().map(|y| y.to_bits()).collect();
                let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
                // an odd offset: unaligned fp32 values
                let mut out = vec![0u8; bytes.len() + 1];
                crate::kernels::exp::map_affine_bytes(f, &bytes, &mut out[1..], (s, b), slow);
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
