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

/// Elements `j0..j0 + len` of every row (packed little-endian `dt`) into `out`, row `k` at
/// `out[k * w..k * w + len]` with its other `w - len` lanes zeroed: one `K x w` panel of the
/// matmul's moving operand, decoded straight from SBUF (no whole-operand fp32 copy). Each
/// row's next `len` elements (the next panel's) are prefetched: partition rows sit apart at a
/// stride the hardware prefetchers do not follow.
pub fn decode_panel(
    dt: DType,
    rows: &[&[u8]],
    (j0, len): (usize, usize),
    out: &mut [f32],
    w: usize,
) {
    #[cfg(target_arch = "x86_64")]
    match super::simd::path() {
        // SAFETY: simd::path reports a path only when the host has its features.
        super::simd::Path::Avx512 => return unsafe { panel_avx512(dt, rows, (j0, len), out, w) },
        super::simd::Path::Avx2Fma => return unsafe { panel_avx2(dt, rows, (j0, len), out, w) },
        super::simd::Path::Portable => {}
    }
    panel_body(dt, rows, (j0, len), out, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn panel_avx2(dt: DType, rows: &[&[u8]], cols: (usize, usize), out: &mut [f32], w: usize) {
    panel_body(dt, rows, cols, out, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn panel_avx512(dt: DType, rows: &[&[u8]], cols: (usize, usize), out: &mut [f32], w: usize) {
    panel_body(dt, rows, cols, out, w)
}

#[inline(always)]
fn panel_body(dt: DType, rows: &[&[u8]], (j0, len): (usize, usize), out: &mut [f32], w: usize) {
    let es = dt.size();
    let len = len.min(w);
    for (row, o) in rows.iter().zip(out.chunks_exact_mut(w.max(1))) {
        if let Some(next) = row.get((j0 + len) * es..((j0 + 3 * len) * es).min(row.len())) {
            super::simd::prefetch(next);
        }
        let (o, pad) = o.split_at_mut(len);
        if let Some(src) = row.get(j0 * es..(j0 + len) * es) {
            decode_body(dt, src, o);
        }
        pad.fill(0.0);
    }
}

/// The rows of a `[K, M]` operand (`rows`, packed little-endian `dt`) decoded into row panels
/// `[M / mr][K][mr]`, zero-padded: the matmul's packed stationary operand in one pass (each row
/// decoded once into a stack buffer, then stored `mr` elements per panel; the next row
/// prefetched), with no row-major fp32 copy in between. False (nothing written) for `M` above
/// 128 or a panel width other than the gemm's (8, 6, 4).
pub fn decode_panels(dt: DType, rows: &[&[u8]], m: usize, mr: usize, out: &mut [f32]) -> bool {
    if m > 128 || out.len() < m.div_ceil(mr.max(1)) * rows.len() * mr {
        return false;
    }
    match mr {
        8 => panels_any::<8>(dt, rows, m, out),
        6 => panels_any::<6>(dt, rows, m, out),
        4 => panels_any::<4>(dt, rows, m, out),
        _ => return false,
    }
    true
}

fn panels_any<const MR: usize>(dt: DType, rows: &[&[u8]], m: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match super::simd::path() {
        // SAFETY: simd::path reports a path only when the host has its features.
        super::simd::Path::Avx512 => return unsafe { panels_avx512::<MR>(dt, rows, m, out) },
        super::simd::Path::Avx2Fma => return unsafe { panels_avx2::<MR>(dt, rows, m, out) },
        super::simd::Path::Portable => {}
    }
    panels_body::<MR>(dt, rows, m, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn panels_avx2<const MR: usize>(dt: DType, rows: &[&[u8]], m: usize, out: &mut [f32]) {
    panels_body::<MR>(dt, rows, m, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn panels_avx512<const MR: usize>(dt: DType, rows: &[&[u8]], m: usize, out: &mut [f32]) {
    panels_body::<MR>(dt, rows, m, out)
}

/// Rows decoded before they are stored: a panel's rows for one group are then written as one
/// contiguous run (row by row, each row's pieces would land `K * MR` floats apart, a 4 KiB
/// multiple for K = 128, all in one L1 set).
const GROUP_ROWS: usize = 8;

#[inline(always)]
fn panels_body<const MR: usize>(dt: DType, rows: &[&[u8]], m: usize, out: &mut [f32]) {
    let (k, mb) = (rows.len(), m.div_ceil(MR));
    // M <= 128 (checked), padded up to whole panels with zeros
    let mut tmp = [[0f32; 128 + 8]; GROUP_ROWS];
    for (g, group) in rows.chunks(GROUP_ROWS).enumerate() {
        let k0 = g * GROUP_ROWS;
        for (i, row) in group.iter().enumerate() {
            if let Some(next) = rows.get(k0 + i + GROUP_ROWS) {
                super::simd::prefetch(next);
            }
            decode_body(dt, row, &mut tmp[i][..m]);
        }
        for ib in 0..mb {
            let at = (ib * k + k0) * MR;
            let Some(o) = out.get_mut(at..at + group.len() * MR) else {
                continue;
            };
            for (o, t) in o.as_chunks_mut::<MR>().0.iter_mut().zip(&tmp) {
                if let Some(b) = t.get(ib * MR..ib * MR + MR) {
                    o.copy_from_slice(b);
                }
            }
        }
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
    /// The rows of `ap` borrowed from `mem` (the memory `ap` names), when each row is
    /// contiguous and static; else `None`.
    pub fn direct(mem: &'m crate::memory::onchip::OnChip, ap: &Ap) -> Option<Self> {
        (ap.mem != Mem::Hbm && ap.is_row_contiguous() && ap.dynamic.is_none()).then(|| {
            Rows::Direct {
                bytes: mem.raw(),
                stride: mem.stride(),
                start: ap.start as usize,
                offset: ap.offset as usize,
                len: ap.free_size() * ap.dtype.size(),
            }
        })
    }

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
