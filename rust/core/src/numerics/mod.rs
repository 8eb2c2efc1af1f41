//! Dtype conversions. Engines compute in fp32: inputs are decoded to fp32 exactly, results are
//! encoded with round-to-nearest-even (floats) or RNE with saturation (integers).

pub mod bulk;
pub mod config;
pub mod float;
pub mod mx;
pub mod rng;

use crate::isa::DType;
use float::Format;

/// The float format of a float dtype (tf32 lives in a 32-bit container, left-aligned like fp32).
pub fn format_of(dt: DType) -> Option<Format> {
    Some(match dt {
        DType::Bfloat16 => float::BF16,
        DType::Float16 => float::FP16,
        DType::Tfloat32 => float::TF32,
        DType::Float8E4m3 => float::E4M3,
        DType::Float8E4m3fn => float::E4M3FN,
        DType::Float8E5m2 => float::E5M2,
        DType::Float8E8m0fnu => float::E8M0,
        _ => return None,
    })
}

/// Raw element bits (zero-extended to u32) -> fp32 value.
#[inline]
pub fn to_f32(dt: DType, raw: u32) -> f32 {
    match dt {
        DType::Float32 => f32::from_bits(raw),
        DType::Bfloat16 => f32::from_bits(raw << 16),
        DType::Tfloat32 => f32::from_bits(raw & 0xFFFF_E000),
        DType::Int8 => raw as u8 as i8 as f32,
        DType::Int16 => raw as u16 as i16 as f32,
        DType::Int32 => raw as i32 as f32,
        DType::Uint8 | DType::Bool => (raw & 0xFF) as f32,
        DType::Uint16 => (raw & 0xFFFF) as f32,
        DType::Uint32 => raw as f32,
        // Packed MX words have no scalar value; engines reject them before this point.
        DType::Float8E4m3fnX4 | DType::Float8E5m2X4 | DType::Float4E2m1fnX4 => f32::from_bits(raw),
        _ => format_of(dt).map(|f| f.decode(raw)).unwrap_or(f32::NAN),
    }
}

/// Round half to even to an integer, as f64 (exact for every f32).
#[inline]
fn rne(x: f32) -> f64 {
    (x as f64).round_ties_even()
}

#[inline]
fn sat_int(x: f32, lo: f64, hi: f64) -> i64 {
    if x.is_nan() {
        0
    } else {
        rne(x).clamp(lo, hi) as i64
    }
}

/// fp32 value -> raw element bits of `dt`, RNE; integers saturate (NaN -> 0); bool is x != 0.
#[inline]
pub fn from_f32(dt: DType, x: f32) -> u32 {
    match dt {
        DType::Float32 => x.to_bits(),
        DType::Bfloat16 => bf16_rne(x.to_bits()),
        DType::Tfloat32 => float::TF32.encode(x.to_bits()) << 13,
        DType::Int8 => sat_int(x, -128.0, 127.0) as i8 as u8 as u32,
        DType::Int16 => sat_int(x, -32768.0, 32767.0) as i16 as u16 as u32,
        DType::Int32 => sat_int(x, -2147483648.0, 2147483647.0) as i32 as u32,
        DType::Uint8 => sat_int(x, 0.0, 255.0) as u32,
        DType::Uint16 => sat_int(x, 0.0, 65535.0) as u32,
        DType::Uint32 => sat_int(x, 0.0, 4294967295.0) as u32,
        DType::Bool => (x != 0.0) as u32,
        DType::Float8E4m3fnX4 | DType::Float8E5m2X4 | DType::Float4E2m1fnX4 => x.to_bits(),
        _ => format_of(dt).map(|f| f.encode(x.to_bits())).unwrap_or(0),
    }
}

/// fp32 -> bf16 round-to-nearest-even (canonical quiet NaN, sign kept, as ml_dtypes).
#[inline]
pub fn bf16_rne(u: u32) -> u32 {
    // Both results computed and one selected: branch-free, so slice loops vectorise.
    let nan = ((u >> 16) & 0x8000) | 0x7FC0;
    let r = (u.wrapping_add(0x7FFF + ((u >> 16) & 1))) >> 16;
    if u & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        r
    }
}

/// Read element `i` (raw bits) from little-endian bytes.
#[inline]
pub fn load_raw(bytes: &[u8], size: usize, i: usize) -> u32 {
    let o = i * size;
    match size {
        1 => bytes[o] as u32,
        2 => u16::from_le_bytes([bytes[o], bytes[o + 1]]) as u32,
        _ => u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]),
    }
}

/// Write element `i` (raw bits) as little-endian bytes.
#[inline]
pub fn store_raw(bytes: &mut [u8], size: usize, i: usize, v: u32) {
    let o = i * size;
    match size {
        1 => bytes[o] = v as u8,
        2 => bytes[o..o + 2].copy_from_slice(&(v as u16).to_le_bytes()),
        _ => bytes[o..o + 4].copy_from_slice(&v.to_le_bytes()),
    }
}

/// fp32 bits -> raw bits of `dt` for a slice, with a tight loop per dtype (the conversion
/// benchmark measures this).
pub fn convert_from_f32_slice(dt: DType, src: &[u32], dst: &mut [u32]) {
    match dt {
        DType::Bfloat16 => {
            for (o, u) in dst.iter_mut().zip(src) {
                *o = bf16_rne(*u);
            }
        }
        DType::Float16 | DType::Float8E4m3 | DType::Float8E4m3fn | DType::Float8E5m2 => {
            // Resolve the format once, outside the loop; the bit-arithmetic RNE encoder.
            match format_of(dt).and_then(|f| bulk::FastEnc::new(f, false)) {
                Some(fe) => {
                    for (o, u) in dst.iter_mut().zip(src) {
                        *o = fe.encode(*u);
                    }
                }
                None => {
                    for (o, u) in dst.iter_mut().zip(src) {
                        *o = from_f32(dt, f32::from_bits(*u));
                    }
                }
            }
        }
        _ => {
            for (o, u) in dst.iter_mut().zip(src) {
                *o = from_f32(dt, f32::from_bits(*u));
            }
        }
    }
}

/// Raw bits of `dt` -> fp32 for a slice; 8-bit types go through a 256-entry table.
pub fn convert_to_f32_slice(dt: DType, src: &[u32], dst: &mut [f32]) {
    if dt.size() == 1 {
        // A fixed-size table: `c & 0xFF` indexes it without a bounds check.
        let mut lut = [0f32; 256];
        for (c, v) in lut.iter_mut().enumerate() {
            *v = to_f32(dt, c as u32);
        }
        for (o, c) in dst.iter_mut().zip(src) {
            *o = lut[(*c & 0xFF) as usize];
        }
    } else {
        for (o, c) in dst.iter_mut().zip(src) {
            *o = to_f32(dt, *c);
        }
    }
}

/// Decode a packed byte buffer of `dt` elements into fp32.
pub fn decode_all(dt: DType, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; bytes.len() / dt.size()];
    bulk::decode_run(dt, bytes, 0, 1, &mut out);
    out
}

/// Encode fp32 values into a packed byte buffer of `dt` elements (RNE / saturating).
pub fn encode_all(dt: DType, vals: &[f32]) -> Vec<u8> {
    config::Rounder::default().encode_all(dt, vals)
}

/// Raw element bits (integers sign- or zero-extended to 32 bits) for bitwise ops.
pub fn raw_all(dt: DType, bytes: &[u8]) -> Vec<u32> {
    let mut out = vec![0u32; bytes.len() / dt.size()];
    bulk::decode_raw_run(dt, bytes, 0, 1, &mut out);
    out
}

/// Truncate 32-bit raw values to `dt`'s width into a byte buffer.
pub fn unraw_all(dt: DType, vals: &[u32]) -> Vec<u8> {
    let mut out = vec![0u8; vals.len() * dt.size()];
    bulk::encode_raw_run(dt, &mut out, 0, 1, vals);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_saturation_and_rne() {
        assert_eq!(from_f32(DType::Int8, 127.5), 127);
        assert_eq!(from_f32(DType::Int8, -200.0) as u8 as i8, -128);
        assert_eq!(from_f32(DType::Int32, 2.5), 2);
        assert_eq!(from_f32(DType::Int32, 3.5), 4);
        assert_eq!(from_f32(DType::Int32, -2.5) as i32, -2);
        assert_eq!(from_f32(DType::Uint8, -3.0), 0);
        assert_eq!(from_f32(DType::Uint32, 1e20), u32::MAX);
        assert_eq!(from_f32(DType::Int32, f32::NAN), 0);
        assert_eq!(from_f32(DType::Int32, 3e9) as i32, i32::MAX);
    }

    #[test]
    fn bf16_nan_canonical() {
        assert_eq!(
            from_f32(DType::Bfloat16, f32::from_bits(0xFF80_0001)),
            0xFFC0
        );
        assert_eq!(
            from_f32(DType::Bfloat16, f32::from_bits(0x7F80_0000)),
            0x7F80
        );
        assert_eq!(bf16_rne(0x3F80_8000), 0x3F80); // tie to even
        assert_eq!(bf16_rne(0x3F81_8000), 0x3F82);
    }
}
