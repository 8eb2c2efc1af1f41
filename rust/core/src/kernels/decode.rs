//! Operand rows straight from SBUF/PSUM bytes into fp32, for the matmul packers: no gathered
//! byte copy when a row is contiguous, and table look-ups for the narrow float formats.
//! Decoding is exact (every matmul input dtype embeds in fp32), so it is `numerics::to_f32`
//! element for element, just faster.

use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::DType;
use crate::memory::onchip::Mems;
use crate::memory::{Ap, Mem};
use crate::numerics::to_f32;
use std::sync::OnceLock;

/// Decode packed little-endian elements of `dt` into `out` (same element count). The dtype is
/// resolved once per call and the loop runs with the widest vector instructions the host has
/// (the same exact conversion on every path).
pub fn decode_into(dt: DType, bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match super::simd::path() {
        // SAFETY: simd::path reports a path only when the host has its features.
        super::simd::Path::Avx512 => return unsafe { decode_avx512(dt, bytes, out) },
        super::simd::Path::Avx2Fma => return unsafe { decode_avx2(dt, bytes, out) },
        super::simd::Path::Portable => {}
    }
    decode_body(dt, bytes, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_avx2(dt: DType, bytes: &[u8], out: &mut [f32]) {
    decode_body(dt, bytes, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn decode_avx512(dt: DType, bytes: &[u8], out: &mut [f32]) {
    decode_body(dt, bytes, out)
}

#[inline(always)]
fn decode_body(dt: DType, bytes: &[u8], out: &mut [f32]) {
    match dt {
        DType::Float32 => convert::<4>(bytes, out, |c| f32::from_le_bytes(*c)),
        DType::Tfloat32 => convert::<4>(bytes, out, |c| {
            f32::from_bits(u32::from_le_bytes(*c) & 0xFFFF_E000)
        }),
        DType::Bfloat16 => convert::<2>(bytes, out, |c| {
            f32::from_bits((u16::from_le_bytes(*c) as u32) << 16)
        }),
        DType::Float16 => {
            let t = lut16();
            convert::<2>(bytes, out, |c| {
                t.get(u16::from_le_bytes(*c) as usize)
                    .copied()
                    .unwrap_or(f32::NAN)
            })
        }
        DType::Float8E4m3 | DType::Float8E4m3fn | DType::Float8E5m2 => {
            let slot = match dt {
                DType::Float8E4m3 => 0,
                DType::Float8E4m3fn => 1,
                _ => 2,
            };
            let t = lut8(slot, dt);
            convert::<1>(bytes, out, |c| t[c[0] as usize])
        }
        d => match d.size() {
            1 => convert::<1>(bytes, out, |c| to_f32(d, c[0] as u32)),
            2 => convert::<2>(bytes, out, |c| to_f32(d, u16::from_le_bytes(*c) as u32)),
            _ => convert::<4>(bytes, out, |c| to_f32(d, u32::from_le_bytes(*c))),
        },
    }
}

/// Elements of `ES` bytes through `conv`, as many as both sides hold.
#[inline(always)]
fn convert<const ES: usize>(bytes: &[u8], out: &mut [f32], conv: impl Fn(&[u8; ES]) -> f32) {
    let (chunks, _) = bytes.as_chunks::<ES>();
    for (o, c) in out.iter_mut().zip(chunks) {
        *o = conv(c);
    }
}

fn lut16() -> &'static [f32] {
    static T: OnceLock<Vec<f32>> = OnceLock::new();
    T.get_or_init(|| (0..65536u32).map(|c| to_f32(DType::Float16, c)).collect())
}

/// 256-entry tables for the 1-byte float formats matmul takes (built once each).
fn lut8(slot: usize, d: DType) -> &'static [f32; 256] {
    static T: [OnceLock<[f32; 256]>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    T[slot % 3].get_or_init(|| std::array::from_fn(|c| to_f32(d, c as u32)))
}

/// The rows of a (validated) on-chip AP as raw bytes: borrowed from memory when each row is
/// contiguous, else gathered once.
pub enum Rows<'m> {
    Direct {
        bytes: &'m [u8],
        /// Host bytes between partitions (`OnChip::stride`, padded).
        stride: usize,
        start: usize,
        offset: usize,
        len: usize,
    },
    Gathered {
        bytes: Vec<u8>,
        len: usize,
    },
}

impl<'m> Rows<'m> {
    pub fn new(mems: &'m Mems, ap: &Ap) -> Self {
        let len = ap.free_size() * ap.dtype.size();
        let mem = match ap.mem {
            Mem::Sbuf => Some(&*mems.sbuf),
            Mem::Psum => Some(&*mems.psum),
            _ => None,
        };
        match mem {
            Some(m) if ap.is_row_contiguous() && ap.dynamic.is_none() => Rows::Direct {
                bytes: m.raw(),
                stride: m.stride(),
                start: ap.start as usize,
                offset: ap.offset as usize,
                len,
            },
            _ => Rows::Gathered {
                bytes: mems.gather(ap),
                len,
            },
        }
    }

    /// Bytes of row `r`.
    pub fn row(&self, r: usize) -> Result<&[u8]> {
        let got = match self {
            Rows::Direct {
                bytes,
                stride,
                start,
                offset,
                len,
            } => {
                let at = (start + r) * stride + offset;
                bytes.get(at..at + len)
            }
            Rows::Gathered { bytes, len } => bytes.get(r * len..(r + 1) * len),
        };
        got.ok_or_else(|| {
            fail(
                Internal,
                "operand_row_outside_memory",
                format!("operand row {r} outside memory"),
            )
        })
    }
}
