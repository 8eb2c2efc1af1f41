//! Scalar-engine activation functions. The hardware evaluates piecewise polynomials that are not
//! public; the emulator evaluates each function in f64 and rounds once to fp32 (documented in
//! docs/numerics.md), so results are deterministic and within an ulp or two of the exact value.

use super::act_simple;
use crate::isa::ActFn;
use crate::kernels::exp;
use std::f64::consts::{FRAC_2_SQRT_PI, PI, SQRT_2};

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn softplus(x: f64) -> f64 {
    if x > 30.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `f(x)` with `alpha` the prelu slope.
#[inline]
pub fn apply(f: ActFn, x: f32, alpha: f32) -> f32 {
    let v = x as f64;
    let r = match f {
        ActFn::Copy | ActFn::Bypass => return x,
        ActFn::Square => v * v,
        ActFn::Sigmoid => sigmoid(v),
        ActFn::Relu => return if x > 0.0 || x.is_nan() { x } else { 0.0 },
        ActFn::Prelu => {
            if v > 0.0 {
                v
            } else {
                v * alpha as f64
            }
        }
        ActFn::Gelu => 0.5 * v * (1.0 + libm::erf(v / SQRT_2)),
        ActFn::GeluDx => {
            0.5 * (1.0 + libm::erf(v / SQRT_2)) + v * (-0.5 * v * v).exp() / (2.0 * PI).sqrt()
        }
        ActFn::GeluApprxTanh => {
            0.5 * v * (1.0 + ((2.0 / PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
        }
        ActFn::GeluApprxSigmoid => v * sigmoid(1.702 * v),
        ActFn::GeluApprxSigmoidDx => {
            let s = sigmoid(1.702 * v);
            s + 1.702 * v * s * (1.0 - s)
        }
        ActFn::Silu => v * sigmoid(v),
        ActFn::SiluDx => {
            let s = sigmoid(v);
            s * (1.0 + v * (1.0 - s))
        }
        ActFn::Tanh => v.tanh(),
        ActFn::Softplus => softplus(v),
        ActFn::Mish => v * softplus(v).tanh(),
        ActFn::Erf => libm::erf(v),
        ActFn::ErfDx => FRAC_2_SQRT_PI * (-v * v).exp(),
        ActFn::Exp => v.exp(),
        ActFn::Sign => {
            if v > 0.0 {
                1.0
            } else if v < 0.0 {
                -1.0
            } else {
                v
            }
        }
        ActFn::Abs => v.abs(),
        ActFn::Log => v.ln(),
        ActFn::Sin => v.sin(),
        ActFn::Arctan => v.atan(),
        ActFn::Sqrt => v.sqrt(),
        ActFn::Rsqrt => 1.0 / v.sqrt(),
        ActFn::Reciprocal => 1.0 / v,
    };
    r as f32
}

/// The documented valid input range of a restricted function (reference §2.3), or `None` when the
/// function is valid on all of [-inf, inf]. For `reciprocal` the range is on |x|.
pub fn valid_range(f: ActFn) -> Option<(f64, f64)> {
    let p = |e: i32| 2f64.powi(e);
    Some(match f {
        ActFn::Log => (p(-64), p(64)),
        ActFn::Sin => (-std::f64::consts::PI, std::f64::consts::PI),
        ActFn::Arctan => (-std::f64::consts::FRAC_PI_2, std::f64::consts::FRAC_PI_2),
        ActFn::Sqrt => (p(-116), p(118)),
        ActFn::Rsqrt => (p(-87), p(97)),
        ActFn::Reciprocal => (p(-42), p(42)),
        _ => return None,
    })
}

/// The value an unrestricted function takes at +inf (`positive`) or -inf: its limit, so that
/// the f64 formulas never produce `inf * 0` there (the functions are documented valid on
/// [-inf, inf]). Zero limits are +0.0 (an emulator choice).
fn limit_at_inf(f: ActFn, positive: bool, alpha: f32) -> Option<f32> {
    let inf = f32::INFINITY;
    Some(match (f, positive) {
        (ActFn::Copy | ActFn::Bypass, p) => {
            if p {
                inf
            } else {
                -inf
            }
        }
        (ActFn::Square | ActFn::Abs, _) => inf,
        (ActFn::Prelu, true) => inf,
        (ActFn::Prelu, false) => {
            if alpha == 0.0 {
                0.0
            } else {
                -inf * alpha
            }
        }
        (
            ActFn::Relu
            | ActFn::Gelu
            | ActFn::GeluApprxTanh
            | ActFn::GeluApprxSigmoid
            | ActFn::Silu
            | ActFn::Softplus
            | ActFn::Mish
            | ActFn::Exp,
            p,
        ) => {
            if p {
                inf
            } else {
                0.0
            }
        }
        (ActFn::Sigmoid | ActFn::GeluDx | ActFn::GeluApprxSigmoidDx | ActFn::SiluDx, p) => {
            if p {
                1.0
            } else {
                0.0
            }
        }
        (ActFn::Tanh | ActFn::Erf | ActFn::Sign, p) => {
            if p {
                1.0
            } else {
                -1.0
            }
        }
        (ActFn::ErfDx, _) => 0.0,
        _ => return None,
    })
}

/// `f(x)` as the ScalarE evaluates it: inside the documented range the f64 formula of `apply`
/// (limits at +-inf), outside it a quiet NaN. The hardware gives "invalid output" there (e.g. sin
/// has no range reduction); the emulator makes that invalidity visible instead of returning a
/// plausible value. Range bounds are compared after rounding them to fp32 (so fp32(pi) is in
/// sin's range).
#[inline]
pub fn apply_checked(f: ActFn, x: f32, alpha: f32) -> f32 {
    if let Some((lo, hi)) = valid_range(f) {
        let v = if f == ActFn::Reciprocal { x.abs() } else { x };
        // NaN fails both comparisons and stays NaN through `apply`.
        if v < lo as f32 || v > hi as f32 {
            return f32::NAN;
        }
    } else if x.is_infinite() {
        if let Some(l) = limit_at_inf(f, x > 0.0, alpha) {
            return l;
        }
    }
    apply(f, x, alpha)
}

/// The functions kernels/exp.rs evaluates fast, giving the bits of `apply_checked`.
pub fn fast_kernel(f: ActFn) -> Option<exp::Func> {
    match f {
        ActFn::Exp => Some(exp::Func::Exp),
        ActFn::Sigmoid => Some(exp::Func::Sigmoid),
        ActFn::Silu => Some(exp::Func::Silu),
        ActFn::Tanh => Some(exp::Func::Tanh),
        _ => None,
    }
}

/// Rows shorter than this are batched: the fp32 affine step per row, then the function over the
/// whole block in one call (a [128, 1] column is one kernel call, not 128).
pub const SHORT_ROW: usize = 16;

/// `out[k * w + j] = apply_checked(f, fl32(fl32(x[k * w + j] * scale[k]) + bias[k]), 0)` for the
/// rows of a block (`x` and `out` row-major with rows of `w`): `apply_affine_slice` per row, or
/// for rows shorter than `SHORT_ROW` the affine step on every element first and the function
/// over the whole block (same fp32 operations, same bits).
pub fn apply_affine_rows(
    f: ActFn,
    x: &[f32],
    out: &mut [f32],
    w: usize,
    scale: &[f32],
    bias: &[f32],
) {
    let w = w.max(1);
    if w >= SHORT_ROW {
        out.copy_from_slice(x);
        for (k, row) in out.chunks_exact_mut(w).enumerate() {
            apply_affine_slice(f, row, scale[k], bias[k]);
        }
        return;
    }
    for (k, (o, i)) in out.chunks_exact_mut(w).zip(x.chunks_exact(w)).enumerate() {
        let (s, b) = (scale[k], bias[k]);
        for (o, i) in o.iter_mut().zip(i) {
            *o = *i * s + b;
        }
    }
    match fast_kernel(f) {
        Some(k) => {
            exp::map_affine(k, out, (1.0, -0.0), |x| apply_checked(f, x, 0.0));
        }
        // x * 1 + -0 is x for every fp32 x: the affine step is already done
        None => match act_simple::kernel(f) {
            Some(k) => act_simple::map_affine(k, out, (1.0, -0.0)),
            None => out.iter_mut().for_each(|v| *v = apply_checked(f, *v, 0.0)),
        },
    }
}

/// `v[i] = apply_checked(f, fl32(fl32(v[i] * scale) + bias), 0)`, with the function resolved
/// once per slice for the common functions (the per-element `match` folds away), exp, sigmoid,
/// silu and tanh on the fast kernel, abs, relu, square, sqrt, reciprocal and rsqrt in the
/// vectorised loops of act_simple.rs.
pub fn apply_affine_slice(f: ActFn, v: &mut [f32], scale: f32, bias: f32) {
    #[inline(always)]
    fn each(v: &mut [f32], scale: f32, bias: f32, g: impl Fn(f32) -> f32) {
        for x in v.iter_mut() {
            *x = g(*x * scale + bias);
        }
    }
    if let Some(k) = fast_kernel(f) {
        // vectorised, bit-identical to the `apply_checked` path it falls back to
        exp::map_affine(k, v, (scale, bias), |x| apply_checked(f, x, 0.0));
        return;
    }
    if let Some(k) = act_simple::kernel(f) {
        act_simple::map_affine(k, v, (scale, bias));
        return;
    }
    macro_rules! mono {
        ($($f:ident),*) => {
            match f {
                $(ActFn::$f => each(v, scale, bias, |x| apply_checked(ActFn::$f, x, 0.0)),)*
                f => each(v, scale, bias, |x| apply_checked(f, x, 0.0)),
            }
        };
    }
    mono!(Copy, Bypass, Gelu, GeluApprxTanh);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restricted_functions_are_nan_outside_their_range_only() {
        let pi = std::f32::consts::PI;
        assert!(apply_checked(ActFn::Sin, 9.0, 0.0).is_nan());
        assert!((apply_checked(ActFn::Sin, pi, 0.0)).abs() < 1e-6); // fp32(pi) is in range
        assert!(apply_checked(ActFn::Log, 0.0, 0.0).is_nan());
        assert_eq!(apply_checked(ActFn::Log, 1.0, 0.0), 0.0);
        assert!(apply_checked(ActFn::Sqrt, 0.0, 0.0).is_nan());
        assert_eq!(apply_checked(ActFn::Sqrt, 4.0, 0.0), 2.0);
        assert!(apply_checked(ActFn::Reciprocal, 2f32.powi(43), 0.0).is_nan());
        assert_eq!(apply_checked(ActFn::Reciprocal, -4.0, 0.0), -0.25);
        assert!(apply_checked(ActFn::Rsqrt, f32::INFINITY, 0.0).is_nan());
    }

    #[test]
    fn infinite_inputs_give_limits() {
        let (inf, ninf) = (f32::INFINITY, f32::NEG_INFINITY);
        assert_eq!(apply_checked(ActFn::Gelu, ninf, 0.0).to_bits(), 0);
        assert_eq!(apply_checked(ActFn::Silu, inf, 0.0), inf);
        assert_eq!(apply_checked(ActFn::SiluDx, inf, 0.0), 1.0);
        assert_eq!(apply_checked(ActFn::Tanh, ninf, 0.0), -1.0);
        assert_eq!(apply_checked(ActFn::Prelu, ninf, 0.5), ninf);
        assert_eq!(apply_checked(ActFn::Prelu, ninf, 0.0), 0.0);
        assert!(apply_checked(ActFn::Exp, f32::NAN, 0.0).is_nan());
    }
}
