//! What the two x86 exp kernels (exp_avx2.rs, exp_avx512.rs) share: the thresholds of their
//! decision tests and the function codes they are instantiated for. Kept in one place because
//! both kernels must decide the same lanes to give the same bits (exp_avx512.rs's module doc
//! derives the figures).

use super::exp::Func;

/// log2 of the distance (f64 ulps) from the fp32 half-way pattern below which a lane is not
/// decided by the bit test.
pub(super) const TH_LOG2: u32 = 13;
/// Half-width of the interval check for the lanes the bit test leaves.
pub(super) const D: f64 = 1.0 / (1u64 << 39) as f64;
/// exp inputs from which the result is an fp32 normal for sure (e^-87 > 2^-126 (1 + 2^-40)), and
/// below which it rounds to +0 for sure (e^-104 < 2^-150 (1 - 2^-40)).
pub(super) const EXP_NORMAL_X: f32 = -87.0;
pub(super) const EXP_TINY_X: f32 = -104.0;
/// Sigmoid's result is an fp32 normal from x >= -87 on too (e^-87 / (1 + e^-87) > 2^-126);
/// silu's when also |x| >= `SMALL_X` = 2^-100 (|silu(x)| >= |x| / 4 for |x| <= 1, > 2^-120 for
/// x in [-87, -1]); tanh's for |x| >= 2^-100, and below that tanh(x) rounds to x itself (the
/// relative distance x^2 / 3 < 2^-200 is far inside half an fp32 spacing), which is the value
/// the Taylor branch gives exactly (`fma(x z, p, x)` with |x z p| < 2^-300 < ulp(x) / 2).
pub(super) const SMALL_X: f32 = f32::from_bits(0x0d80_0000); // 2^-100

/// Function codes: the kernels' loops are generic over a `const F: u8` so each function gets
/// its own straight-line loop.
pub(super) const EXP: u8 = 0;
pub(super) const SIGMOID: u8 = 1;
pub(super) const SILU: u8 = 2;
pub(super) const TANH: u8 = 3;

pub(super) fn func(code: u8) -> Func {
    match code {
        EXP => Func::Exp,
        SIGMOID => Func::Sigmoid,
        SILU => Func::Silu,
        _ => Func::Tanh,
    }
}
