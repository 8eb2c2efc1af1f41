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

/// The affine-step tests' inputs: 3000 values across the functions' ranges, then signed zeros,
/// NaN, +-inf, huge values and the thresholds (exp underflow, the tiny-exp store, tanh's edges).
pub fn affine_inputs() -> Vec<f32> {
    let mut xs: Vec<f32> = (0..3000).map(|i| (i as f32 - 1500.0) * 0.0731).collect();
    xs.extend([
        0.0,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        -1e30,
    ]);
    xs.extend([
        -87.5, -104.5, -160.0, 88.7, 1e-40, -1e-40, 0.125, -0.125, 17.0,
    ]);
    xs
}
