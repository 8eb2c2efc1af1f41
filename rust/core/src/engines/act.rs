//! Scalar-engine activation functions. The hardware evaluates piecewise polynomials that are not
//! public; the emulator evaluates each function in f64 and rounds once to fp32 (documented in
//! docs/numerics.md), so results are deterministic and within an ulp or two of the exact value.

use crate::isa::ActFn;
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
