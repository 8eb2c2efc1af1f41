//! OCP MX helpers shared by `quantize_mx` and `nc_matmul_mx`: the block-scale rule, the
//! quadrant scale layout, and exact rounding of wide integer sums to fp32.

use super::config::MxScaleRule;
use super::float::{Format, E2M1, E4M3FN, E5M2};
use crate::isa::DType;

/// Element format of an x4 dtype and the number of elements per word.
pub fn x4_element(dt: DType) -> Option<(Format, u32)> {
    match dt {
        DType::Float8E4m3fnX4 => Some((E4M3FN, 8)),
        DType::Float8E5m2X4 => Some((E5M2, 8)),
        DType::Float4E2m1fnX4 => Some((E2M1, 4)),
        _ => None,
    }
}

/// Code of element `q` (0..4) of an x4 word.
#[inline]
pub fn x4_code(word: u32, q: u32, bits: u32) -> u32 {
    (word >> (bits * q)) & ((1 << bits) - 1)
}

/// Emax of an MX element type (exponent of its largest normal): e4m3fn 8, e5m2 15, e2m1 2.
pub fn emax(f: Format) -> i32 {
    if f == E4M3FN {
        8
    } else if f == E5M2 {
        15
    } else {
        2
    }
}

/// E8M0 scale code of a group with maximum magnitude `amax` (fp32), by the integer exponent
/// field (floor(log2 amax) for normal amax; f32 subnormal amax gives field 0, which clamps to
/// code 0 exactly as the true floor would). All-zero group -> code 0 (2^-127). Inf/NaN in the
/// group -> 0xFF (NaN scale, OCP / torchao behaviour).
pub fn scale_code(amax: f32, elem: Format, rule: MxScaleRule) -> u32 {
    if !amax.is_finite() {
        return 0xFF;
    }
    let field = ((amax.to_bits() >> 23) & 0xFF) as i32;
    if field == 0 {
        return 0;
    }
    let shift = match rule {
        MxScaleRule::Nki => emax(elem) - 1,
        MxScaleRule::Ocp => emax(elem),
    };
    (field - shift).clamp(0, 254) as u32
}

/// `fmt.encode(y)` (RNE) for a finite `y` with |y| at most `fmt`'s largest finite value, by
/// integer arithmetic on the fp32 bits: normal results round the mantissa in place (a carry
/// moves into the exponent), subnormal ones round on the grid of the smallest subnormal by one
/// fp32 addition (`|y| + 2^(24 - bias - mbits)`, whose ulp is that grid step). The quantize_mx
/// fast path; equal to the general converter on that domain (tested).
#[inline(always)]
pub fn encode_in_range_rne(fmt: Format, y: f32) -> u32 {
    let (m, b) = (fmt.mbits, fmt.bias);
    let u = y.to_bits();
    let sign = (u >> 31) << (fmt.ebits + m);
    let a = u & 0x7FFF_FFFF;
    let min_normal = ((128 - b) as u32) << 23; // 2^(1 - b)
    let code = if a >= min_normal {
        let r = a + ((1 << (22 - m)) - 1) + ((a >> (23 - m)) & 1);
        (r >> (23 - m)) - (((127 - b) as u32) << m)
    } else {
        let magic = f32::from_bits(((151 - b - m as i32) as u32) << 23); // 2^(24 - b - m)
        (f32::from_bits(a) + magic).to_bits() - magic.to_bits()
    };
    sign | code
}

/// 2^(code - 127) as f64 (code 0xFF -> NaN).
pub fn scale_value(code: u32) -> f64 {
    if code & 0xFF == 0xFF {
        f64::NAN
    } else {
        // 2^(c - 127) for c in 0..=254 is a normal f64: its bits are the biased exponent alone.
        f64::from_bits((((code & 0xFF) as u64) + 1023 - 127) << 52)
    }
}

/// Partition (relative to the scale tile's first partition) of scale row `r` = data partition
/// group p / 8: `32 * (r / 4) + r % 4` (4 scale rows per 32-partition quadrant).
#[inline]
pub fn scale_partition(r: u32) -> u32 {
    32 * (r / 4) + r % 4
}

/// Partitions a scale tile must span for `data_parts` data partitions.
pub fn scale_parts_needed(data_parts: u32) -> u32 {
    let rows = data_parts.div_ceil(8).max(1);
    scale_partition(rows - 1) + 1
}

/// The value `mag * 2^e` (with sign) rounded once to fp32, round to nearest even; an exact zero
/// gives +0.0. Used to turn exact integer partial sums into fp32.
pub fn round_wide_to_f32(neg: bool, mag: u128, e: i32) -> f32 {
    if mag == 0 {
        return 0.0;
    }
    let lead = 127 - mag.leading_zeros() as i32;
    let q = (lead + e).max(-126); // exponent of the target binade (subnormals clamp)
    let shift = (q - 23) - e; // bits to drop
    let sig: u128 = if shift <= 0 {
        mag << (-shift) as u32
    } else if shift > 127 {
        0
    } else {
        let kept = mag >> shift;
        let rem = mag & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        kept + (rem > half || (rem == half && kept & 1 == 1)) as u128
    };
    let biased = (q + 126) as i64; // (q - 1 + bias): the implicit bit of `sig` adds the last 1
    let bits = (biased << 23) as i128 + sig as i128;
    let mag32 = if bits >= 0x7F80_0000 {
        0x7F80_0000u32
    } else {
        bits as u32
    };
    f32::from_bits(mag32 | ((neg as u32) << 31))
}

/// An MX element as an integer multiple of 2^-16 (exact for e4m3fn, e5m2 and e2m1 finite
/// values); None for Inf/NaN.
#[inline]
pub fn element_units(f: Format, code: u32) -> Option<i64> {
    let v = f.decode(code);
    if v.is_finite() {
        Some((v as f64 * 65536.0) as i64)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn in_range_rne_encoder_equals_the_general_one() {
        // every 97th fp32 bit pattern and every bf16 value with |y| <= max finite, both signs
        for (f, top) in [(E4M3FN, 0x7E), (E5M2, 0x7B), (E2M1, 0x7)] {
            let maxv = f.decode(top);
            let mut n = 0;
            let bf16 = (0..1u32 << 16).map(|h| h << 16);
            for u in (0..u32::MAX / 97).map(|k| k * 97).chain(bf16) {
                let y = f32::from_bits(u);
                if y.is_nan() || y.abs() > maxv {
                    continue;
                }
                n += 1;
                assert_eq!(encode_in_range_rne(f, y), f.encode(u), "{f:?} {y:e}");
            }
            assert!(n > 1000, "{f:?}: {n}");
        }
    }
    use super::*;

    #[test]
    fn wide_rounding() {
        assert_eq!(round_wide_to_f32(false, 3, 0), 3.0);
        assert_eq!(round_wide_to_f32(true, 1, -149), -f32::from_bits(1));
        assert_eq!(round_wide_to_f32(false, 1, -150), 0.0); // tie to even -> 0
        assert_eq!(round_wide_to_f32(false, 3, -151), f32::from_bits(1)); // 0.75 ulp -> 1
        assert_eq!(round_wide_to_f32(false, (1 << 24) + 1, 0), 16777216.0); // tie -> even
        assert_eq!(round_wide_to_f32(false, (1 << 24) + 3, 0), 16777220.0);
        assert_eq!(round_wide_to_f32(false, 1, 128), f32::INFINITY);
        assert_eq!(round_wide_to_f32(false, u128::MAX, 0), 2f32.powi(127) * 2.0);
        for v in [1.5f32, 1e-40, 3e38, 0.1] {
            let b = v.to_bits();
            let (m, e) = if b >> 23 == 0 {
                (b as u128, -149)
            } else {
                (
                    ((b & 0x7F_FFFF) | 0x80_0000) as u128,
                    (b >> 23) as i32 - 150,
                )
            };
            assert_eq!(round_wide_to_f32(false, m << 40, e - 40), v);
        }
    }

    #[test]
    fn scale_values_are_the_powers_of_two() {
        for c in 0..255u32 {
            assert_eq!(scale_value(c), 2f64.powi(c as i32 - 127), "{c}");
        }
        assert!(scale_value(0xFF).is_nan());
    }

    #[test]
    fn scales() {
        // amax 1.0 -> floor(log2) = 0; NKI: 0 - 7 = -7 -> code 120; OCP: -8 -> 119.
        assert_eq!(scale_code(1.0, E4M3FN, MxScaleRule::Nki), 120);
        assert_eq!(scale_code(1.0, E4M3FN, MxScaleRule::Ocp), 119);
        assert_eq!(scale_code(0.0, E4M3FN, MxScaleRule::Nki), 0);
        assert_eq!(scale_code(f32::NAN, E5M2, MxScaleRule::Nki), 0xFF);
        assert_eq!(scale_parts_needed(128), 100);
        assert_eq!(scale_parts_needed(32), 4);
    }
}
