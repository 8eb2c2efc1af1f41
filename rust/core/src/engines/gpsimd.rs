//! GpSimd: iota, and the affine-pattern helpers it shares with affine_select.

use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::Iota;
use crate::isa::DType;
use crate::numerics;

/// A `[[step, num], ...]` pattern must have positive counts covering `free` elements per partition.
pub fn check_pattern(pat: &[i32], free: usize) -> Result<()> {
    if pat.is_empty() || !pat.len().is_multiple_of(2) {
        return Err(fail(
            Shape,
            "pattern_pairs",
            "pattern needs 1..4 [step, num] pairs",
        )
        .operand("pattern"));
    }
    if pat.chunks(2).any(|c| c[1] <= 0) {
        return Err(fail(
            Shape,
            "pattern_count_positive",
            "pattern counts must be positive",
        )
        .operand("pattern"));
    }
    let n: i64 = pat
        .chunks(2)
        .map(|c| c[1] as i64)
        .fold(1i64, |a, b| a.saturating_mul(b));
    if n != free as i64 {
        return Err(fail(
            Shape,
            "pattern_size_mismatch",
            format!("pattern covers {n} elements per partition but dst has {free}"),
        )
        .operand("pattern"));
    }
    Ok(())
}

/// The pattern's per-element offsets `sum_i idx_i * step_i` (outer to inner), int32 wrapping.
pub fn pattern_offsets(pat: &[i32]) -> Vec<i32> {
    let mut rel = vec![0i32];
    for c in pat.chunks(2) {
        let (step, num) = (c[0], c[1].max(0));
        let mut next = Vec::with_capacity(rel.len() * num as usize);
        for &o in &rel {
            for i in 0..num {
                next.push(o.wrapping_add(i.wrapping_mul(step)));
            }
        }
        rel = next;
    }
    rel
}

/// int32 value -> dst element: integers saturate, floats round (RNE) once from the exact integer.
pub fn from_i64(dt: DType, v: i64) -> u32 {
    match dt {
        DType::Int8 => v.clamp(-128, 127) as i8 as u8 as u32,
        DType::Int16 => v.clamp(-32768, 32767) as i16 as u16 as u32,
        DType::Int32 => v.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32,
        DType::Uint8 => v.clamp(0, 255) as u32,
        DType::Uint16 => v.clamp(0, 65535) as u32,
        DType::Uint32 => v.clamp(0, u32::MAX as i64) as u32,
        DType::Bool => (v != 0) as u32,
        // fp32 itself (and the raw-word packed types): one RNE rounding.
        DType::Float32 | DType::Float8E4m3fnX4 | DType::Float8E5m2X4 | DType::Float4E2m1fnX4 => {
            numerics::from_f32(dt, v as f32)
        }
        _ => numerics::from_f32(dt, to_f32_odd(v)),
    }
}

/// `v` rounded to fp32 toward zero, with the lowest significand bit set when that was inexact
/// (round to odd). A narrower float format (at most 11 significant bits, against fp32's 24)
/// then rounds it exactly as it would round `v` itself: no double rounding through fp32
/// (RNE to fp32 could land on a bf16 tie that `v` is not on). Exact for |v| < 2^24.
fn to_f32_odd(v: i64) -> f32 {
    let mut f = v as f32; // RNE; |v| <= 2^32 keeps it finite and `f as i64` exact
    if (f as i64).unsigned_abs() > v.unsigned_abs() {
        f = f32::from_bits(f.to_bits() - 1); // one ulp toward zero
    }
    if f as i64 != v {
        f = f32::from_bits(f.to_bits() | 1);
    }
    f
}

impl Semantics for Iota<'_> {
    fn check(&self) -> Result<()> {
        check_pattern(self.pattern, self.dst.free_size())
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let dst = self.dst;
        let off = self.offset.value(&ctx.regs[..]);
        let cm = self.channel_multiplier;
        let rel = pattern_offsets(self.pattern);
        let mut out = Vec::with_capacity(dst.num_elements());
        for p in 0..dst.parts as i32 {
            let base = off.wrapping_add(p.wrapping_mul(cm));
            for &o in &rel {
                out.push(from_i64(dst.dtype, base.wrapping_add(o) as i64));
            }
        }
        ctx.write_raw(dst, &out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `v` rounded to `p` significant bits, ties to even, in exact integer arithmetic.
    fn round_int(v: i64, p: u32) -> i64 {
        let a = v.unsigned_abs();
        let bits = 64 - a.leading_zeros();
        if bits <= p {
            return v;
        }
        let ulp = 1u64 << (bits - p);
        let (q, r) = (a / ulp, a % ulp);
        let up = r > ulp / 2 || (r == ulp / 2 && q % 2 == 1);
        let m = (q + up as u64) * ulp;
        if v < 0 {
            -(m as i64)
        } else {
            m as i64
        }
    }

    #[test]
    fn integers_round_once_into_bf16() {
        // 2^24 + 2^16 + 1 is just above a bf16 midpoint; RNE to fp32 first lands on the
        // midpoint (2^24 + 2^16) and the tie then goes down to 2^24.
        let tricky = (1i64 << 24) + (1 << 16) + 1;
        let got = f32::from_bits(from_i64(DType::Bfloat16, tricky) << 16);
        assert_eq!(got as i64, (1 << 24) + (1 << 17));
        for base in [1i64 << 24, 3 << 25, 1 << 30, -(5 << 26)] {
            for d in -70_000..70_000i64 {
                let v = base + d * 3;
                let got = f32::from_bits(from_i64(DType::Bfloat16, v) << 16);
                assert_eq!(got as i64, round_int(v, 8), "v = {v}");
            }
        }
        for v in -3000..3000i64 {
            assert_eq!(to_f32_odd(v), v as f32); // small integers stay exact
        }
    }
}
