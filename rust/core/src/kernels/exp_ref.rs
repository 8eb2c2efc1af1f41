//! Test-only: the activation engine's definitions of exp, sigmoid, silu and tanh (engines/act.rs)
//! written out independently of the kernels: f64 formula on libm, one rounding to fp32, limits at
//! +-inf. Every exp kernel's tests (portable, AVX2, AVX-512) compare against these.

use super::exp::Func;

/// The f64 logistic function on libm's exp (stable form for each sign).
pub fn sig(v: f64) -> f64 {
    if v >= 0.0 {
        1.0 / (1.0 + (-v).exp())
    } else {
        v.exp() / (1.0 + v.exp())
    }
}

/// `f(x)` as act.rs defines it: f64 formula, one rounding, limits at +-inf.
pub fn reference(f: Func, x: f32) -> f32 {
    let v = x as f64;
    match (f, x) {
        (Func::Exp, _) => v.exp() as f32,
        (Func::Sigmoid | Func::Tanh, f32::INFINITY) => 1.0,
        (Func::Sigmoid | Func::Silu, f32::NEG_INFINITY) => 0.0,
        (Func::Silu, f32::INFINITY) => f32::INFINITY,
        (Func::Tanh, f32::NEG_INFINITY) => -1.0,
        (Func::Sigmoid, _) => sig(v) as f32,
        (Func::Silu, _) => (v * sig(v)) as f32,
        (Func::Tanh, _) => v.tanh() as f32,
    }
}
