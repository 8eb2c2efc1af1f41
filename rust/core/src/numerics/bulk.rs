//! Bulk conversions between memory bytes and fp32 / raw words, monomorphised per dtype: the
//! dtype is matched once per run of elements, never per element. A *run* is `n` elements of one
//! dtype, the first at byte `off` of a byte slice, `step` elements apart (1 = contiguous;
//! 0 and negative steps occur in broadcast and reversed access patterns). Callers pass runs of
//! validated access patterns, so every address is inside the slice.
//!
//! The per-element semantics are exactly those of `to_f32` / `from_f32` / `Rounder::from_f32`
//! (tests below compare them on every code or on structured samples).

use super::config::Rounder;
use super::float::{Format, Special, E4M3, E4M3FN, E5M2, FP16};
use super::{bf16_rne, from_f32, to_f32};
use crate::isa::DType;
use std::sync::OnceLock;

#[inline(always)]
fn load<const S: usize>(c: &[u8]) -> u32 {
    match S {
        1 => c[0] as u32,
        2 => u16::from_le_bytes([c[0], c[1]]) as u32,
        _ => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
    }
}

#[inline(always)]
fn store<const S: usize>(c: &mut [u8], v: u32) {
    match S {
        1 => c[0] = v as u8,
        2 => c.copy_from_slice(&(v as u16).to_le_bytes()),
        _ => c.copy_from_slice(&v.to_le_bytes()),
    }
}

/// One run of elements in a byte slice: `n` elements, the first at byte `off`, `step` elements
/// apart; `idx` is the element index (within the instruction's output) of its first element,
/// which drives the stochastic-rounding bits when the run is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub off: usize,
    pub step: isize,
    pub n: usize,
    pub idx: u64,
}

/// A uniform block of runs: `rows` dense runs of `n` elements, `stride` bytes apart (a block
/// of dense rows in partition-major memory), the first at byte `off`; output indices start at
/// `idx` and advance `idx_step` per run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub off: usize,
    pub stride: usize,
    pub n: usize,
    pub rows: usize,
    pub idx: u64,
    pub idx_step: u64,
}

impl Grid {
    fn iter(self) -> impl Iterator<Item = Run> {
        (0..self.rows).map(move |k| Run {
            off: self.off + k * self.stride,
            step: 1,
            n: self.n,
            idx: self.idx + k as u64 * self.idx_step,
        })
    }
}

/// Where a block's elements are: an explicit run list or a uniform grid.
#[derive(Clone, Copy, Debug)]
pub enum Runs<'a> {
    List(&'a [Run]),
    Grid(Grid),
}

#[inline(always)]
fn dec_iter<const S: usize, T>(
    mem: &[u8],
    runs: impl Iterator<Item = Run>,
    out: &mut [T],
    f: &impl Fn(u32) -> T,
) {
    let mut pos = 0;
    for r in runs {
        let out = &mut out[pos..pos + r.n];
        pos += r.n;
        // Short runs take the indexed loop: the slice loop becomes a memcpy call per run.
        if r.step == 1 && r.n >= 16 {
            let src = &mem[r.off..r.off + r.n * S];
            for (o, c) in out.iter_mut().zip(src.chunks_exact(S)) {
                *o = f(load::<S>(c));
            }
        } else {
            let mut p = r.off as isize;
            let d = r.step * S as isize;
            for o in out.iter_mut() {
                let i = p as usize;
                *o = f(load::<S>(&mem[i..i + S]));
                p += d;
            }
        }
    }
}

/// Apply `f` to each loaded element of the runs, filling `out` in order (the one generic loop
/// every decoder shares; the dtype is resolved by the caller, once).
#[inline(always)]
fn dec<const S: usize, T>(mem: &[u8], runs: Runs, out: &mut [T], f: impl Fn(u32) -> T) {
    match runs {
        // One element per run (a column): no per-run loop setup.
        Runs::List(l) if l.len() == out.len() => {
            for (r, o) in l.iter().zip(out.iter_mut()) {
                *o = f(load::<S>(&mem[r.off..r.off + S]));
            }
        }
        Runs::Grid(g) if g.n == 1 => {
            for (k, o) in out.iter_mut().enumerate().take(g.rows) {
                let i = g.off + k * g.stride;
                *o = f(load::<S>(&mem[i..i + S]));
            }
        }
        Runs::List(l) => dec_iter::<S, T>(mem, l.iter().copied(), out, &f),
        Runs::Grid(g) => dec_iter::<S, T>(mem, g.iter(), out, &f),
    }
}

#[inline(always)]
fn enc_iter<const S: usize, T: Copy>(
    mem: &mut [u8],
    runs: impl Iterator<Item = Run>,
    vals: &[T],
    f: &impl Fn(T) -> u32,
) {
    let mut pos = 0;
    for r in runs {
        let vals = &vals[pos..pos + r.n];
        pos += r.n;
        if r.step == 1 && r.n >= 16 {
            let dst = &mut mem[r.off..r.off + r.n * S];
            for (c, v) in dst.chunks_exact_mut(S).zip(vals) {
                store::<S>(c, f(*v));
            }
        } else {
            let mut p = r.off as isize;
            let d = r.step * S as isize;
            for v in vals {
                let i = p as usize;
                store::<S>(&mut mem[i..i + S], f(*v));
                p += d;
            }
        }
    }
}

/// Store `f(v)` for each value, run by run.
#[inline(always)]
fn enc<const S: usize, T: Copy>(mem: &mut [u8], runs: Runs, vals: &[T], f: impl Fn(T) -> u32) {
    match runs {
        Runs::List(l) if l.len() == vals.len() => {
            for (r, v) in l.iter().zip(vals) {
                store::<S>(&mut mem[r.off..r.off + S], f(*v));
            }
        }
        Runs::Grid(g) if g.n == 1 => {
            for (k, v) in vals.iter().enumerate().take(g.rows) {
                let i = g.off + k * g.stride;
                store::<S>(&mut mem[i..i + S], f(*v));
            }
        }
        Runs::List(l) => enc_iter::<S, T>(mem, l.iter().copied(), vals, &f),
        Runs::Grid(g) => enc_iter::<S, T>(mem, g.iter(), vals, &f),
    }
}

/// `enc` with each element's output index (stochastic rounding needs it).
#[inline(always)]
fn enc_idx<const S: usize>(mem: &mut [u8], runs: Runs, vals: &[f32], f: impl Fn(u64, f32) -> u32) {
    let body = |mem: &mut [u8], runs: &mut dyn Iterator<Item = Run>| {
        let mut pos = 0;
        for r in runs {
            let vals = &vals[pos..pos + r.n];
            pos += r.n;
            let mut p = r.off as isize;
            let d = r.step * S as isize;
            for (k, v) in vals.iter().enumerate() {
                let i = p as usize;
                store::<S>(&mut mem[i..i + S], f(r.idx + k as u64, *v));
                p += d;
            }
        }
    };
    match runs {
        Runs::List(l) => body(mem, &mut l.iter().copied()),
        Runs::Grid(g) => body(mem, &mut g.iter()),
    }
}

fn one(off: usize, step: isize, n: usize, idx: u64) -> [Run; 1] {
    [Run { off, step, n, idx }]
}

/// 256-entry fp32 tables of every 1-byte dtype (built once, from `to_f32`).
fn lut8(dt: DType) -> &'static [f32; 256] {
    static LUTS: OnceLock<Vec<[f32; 256]>> = OnceLock::new();
    let all = LUTS.get_or_init(|| {
        (0..=DType::Bool as u8)
            .map(|c| {
                let mut t = [0f32; 256];
                if let Some(d) = DType::from_u8(c).filter(|d| d.size() == 1) {
                    for (i, v) in t.iter_mut().enumerate() {
                        *v = to_f32(d, i as u32);
                    }
                }
                t
            })
            .collect()
    });
    &all[dt as usize]
}

/// fp16 -> fp32 by bit manipulation; identical to `to_f32(Float16, _)` on all 65536 codes
/// (NaNs become the canonical fp32 quiet NaN with the sign kept).
#[inline(always)]
pub fn fp16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000) << 16;
    let e = (h >> 10) & 0x1F;
    let m = h & 0x3FF;
    let bits = if e == 0x1F {
        if m == 0 {
            0x7F80_0000
        } else {
            0x7FC0_0000
        }
    } else if e == 0 {
        // Subnormal (or zero): m * 2^-24, exact in fp32.
        (m as f32 * f32::from_bits(0x3380_0000)).to_bits()
    } else {
        ((e + 112) << 23) | (m << 13)
    };
    f32::from_bits(sign | bits)
}

/// Decode runs of `dt` elements to fp32 (into `out`, in run order).
pub fn decode_runs(dt: DType, mem: &[u8], runs: Runs, out: &mut [f32]) {
    match dt {
        DType::Float32 => dec::<4, _>(mem, runs, out, f32::from_bits),
        DType::Bfloat16 => dec::<2, _>(mem, runs, out, |r| f32::from_bits(r << 16)),
        DType::Float16 => dec::<2, _>(mem, runs, out, fp16_to_f32),
        DType::Tfloat32 => dec::<4, _>(mem, runs, out, |r| f32::from_bits(r & 0xFFFF_E000)),
        DType::Int16 => dec::<2, _>(mem, runs, out, |r| to_f32(DType::Int16, r)),
        DType::Uint16 => dec::<2, _>(mem, runs, out, |r| to_f32(DType::Uint16, r)),
        DType::Int32 => dec::<4, _>(mem, runs, out, |r| to_f32(DType::Int32, r)),
        DType::Uint32 => dec::<4, _>(mem, runs, out, |r| to_f32(DType::Uint32, r)),
        d if d.size() == 1 => {
            let t = lut8(d);
            dec::<1, _>(mem, runs, out, |r| t[(r & 0xFF) as usize])
        }
        d if d.size() == 2 => dec::<2, _>(mem, runs, out, |r| to_f32(d, r)),
        d => dec::<4, _>(mem, runs, out, |r| to_f32(d, r)),
    }
}

/// Decode one run of `dt` elements to fp32.
pub fn decode_run(dt: DType, mem: &[u8], off: usize, step: isize, out: &mut [f32]) {
    decode_runs(dt, mem, Runs::List(&one(off, step, out.len(), 0)), out)
}

/// Decode runs of `dt` elements to raw 32-bit words (int8/int16 sign-extended, as
/// `numerics::raw_all`).
pub fn decode_raw_runs(dt: DType, mem: &[u8], runs: Runs, out: &mut [u32]) {
    match dt {
        DType::Int8 => dec::<1, _>(mem, runs, out, |r| r as u8 as i8 as i32 as u32),
        DType::Int16 => dec::<2, _>(mem, runs, out, |r| r as u16 as i16 as i32 as u32),
        d => match d.size() {
            1 => dec::<1, _>(mem, runs, out, |r| r),
            2 => dec::<2, _>(mem, runs, out, |r| r),
            _ => dec::<4, _>(mem, runs, out, |r| r),
        },
    }
}

/// Decode one run of raw words.
pub fn decode_raw_run(dt: DType, mem: &[u8], off: usize, step: isize, out: &mut [u32]) {
    decode_raw_runs(dt, mem, Runs::List(&one(off, step, out.len(), 0)), out)
}

/// Store raw 32-bit words truncated to `dt`'s width, run by run.
pub fn encode_raw_runs(dt: DType, mem: &mut [u8], runs: Runs, vals: &[u32]) {
    match dt.size() {
        1 => enc::<1, _>(mem, runs, vals, |v| v),
        2 => enc::<2, _>(mem, runs, vals, |v| v),
        _ => enc::<4, _>(mem, runs, vals, |v| v),
    }
}

/// Store one run of raw words.
pub fn encode_raw_run(dt: DType, mem: &mut [u8], off: usize, step: isize, vals: &[u32]) {
    encode_raw_runs(dt, mem, Runs::List(&one(off, step, vals.len(), 0)), vals)
}

/// Fill a run with one raw value.
pub fn fill_raw_run(dt: DType, mem: &mut [u8], off: usize, step: isize, n: usize, v: u32) {
    let size = dt.size();
    if step == 1 {
        let dst = &mut mem[off..off + n * size];
        match size {
            1 => dst.fill(v as u8),
            2 => dst
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(&(v as u16).to_le_bytes())),
            _ => dst
                .chunks_exact_mut(4)
                .for_each(|c| c.copy_from_slice(&v.to_le_bytes())),
        }
        return;
    }
    let mut p = off as isize;
    for _ in 0..n {
        let i = p as usize;
        match size {
            1 => mem[i] = v as u8,
            2 => mem[i..i + 2].copy_from_slice(&(v as u16).to_le_bytes()),
            _ => mem[i..i + 4].copy_from_slice(&v.to_le_bytes()),
        }
        p += step * size as isize;
    }
}

/// Round-to-nearest-even fp32 -> fp16/fp8 by bit arithmetic, equal to `Format::encode_full`
/// with no random bits for the IEEE-like and "fn" formats (tests compare them).
#[derive(Clone, Copy, Debug)]
pub struct FastEnc {
    /// fp32 magnitude bits at and above which a finite value overflows.
    over: u32,
    /// fp32 bits of the target's smallest normal.
    min_normal: u32,
    /// fp32 value whose ulp is the target's subnormal step (adding it rounds to that step).
    magic: f32,
    shift: u32,
    rebias: u32,
    sign_shift: u32,
    nan: u32,
    overflow: u32,
    max_finite: u32,
    saturate: bool,
}

impl FastEnc {
    /// `None` for formats the bit trick does not cover (E8M0, finite-only).
    pub const fn new(f: Format, saturate: bool) -> Option<FastEnc> {
        if !matches!(f.special, Special::Ieee | Special::Fn) || f.mbits >= 23 || f.mbits == 0 {
            return None;
        }
        let max_code = match f.special {
            Special::Ieee => (((1u32 << f.ebits) - 1) << f.mbits) - 1,
            _ => (1u32 << (f.ebits + f.mbits)) - 2,
        };
        // fp32 bits of the largest finite (a normal number of the format).
        let e = (max_code >> f.mbits) as i32 - f.bias + 127;
        let m_bits = ((e as u32) << 23) | ((max_code & ((1 << f.mbits) - 1)) << (23 - f.mbits));
        // Half an ulp above the largest finite; a tie there rounds up only from an odd code.
        let half = m_bits + (1 << (22 - f.mbits));
        let over = if max_code & 1 == 0 { half + 1 } else { half };
        let nan = match f.special {
            Special::Ieee => (((1u32 << f.ebits) - 1) << f.mbits) | (1 << (f.mbits - 1)),
            _ => (1u32 << (f.ebits + f.mbits)) - 1,
        };
        let overflow = match f.special {
            Special::Ieee => ((1u32 << f.ebits) - 1) << f.mbits,
            _ => nan,
        };
        Some(FastEnc {
            over,
            min_normal: ((128 - f.bias) as u32) << 23,
            magic: f32::from_bits(((24 - f.bias - f.mbits as i32 + 127) as u32) << 23),
            shift: 23 - f.mbits,
            rebias: ((127 - f.bias) as u32) << f.mbits,
            sign_shift: 31 - f.ebits - f.mbits,
            nan,
            overflow,
            max_finite: max_code,
            saturate,
        })
    }

    const fn must(f: Format) -> FastEnc {
        match FastEnc::new(f, false) {
            Some(e) => e,
            None => panic!("format not covered by FastEnc"),
        }
    }
    pub const FP16: FastEnc = FastEnc::must(FP16);
    pub const E4M3: FastEnc = FastEnc::must(E4M3);
    pub const E4M3FN: FastEnc = FastEnc::must(E4M3FN);
    pub const E5M2: FastEnc = FastEnc::must(E5M2);

    #[inline(always)]
    pub fn encode(&self, u: u32) -> u32 {
        let a = u & 0x7FFF_FFFF;
        let sign = (u >> 31) << (31 - self.sign_shift);
        if a >= self.over {
            return sign
                | if a > 0x7F80_0000 {
                    self.nan
                } else if self.saturate && a != 0x7F80_0000 {
                    self.max_finite
                } else {
                    self.overflow
                };
        }
        if a < self.min_normal {
            let y = f32::from_bits(a) + self.magic;
            return sign | (y.to_bits() - self.magic.to_bits());
        }
        let sh = self.shift;
        let r = a + ((1 << (sh - 1)) - 1) + ((a >> sh) & 1);
        sign | ((r >> sh) - self.rebias)
    }
}

/// Encode fp32 values as `dt` under `rd`, run by run (each run's `idx` is the output index of
/// its first element: stochastic-rounding bits are drawn per output index).
pub fn encode_runs(rd: &Rounder, dt: DType, mem: &mut [u8], runs: Runs, vals: &[f32]) {
    let sr = !rd.is_default();
    match dt {
        DType::Float32 => enc::<4, _>(mem, runs, vals, |v| v.to_bits()),
        DType::Bfloat16 if !sr => match runs {
            Runs::Grid(g) if g.n >= 16 => {
                // dense rows: each row one run through the wide loop below
                for (r, v) in g.iter().zip(vals.chunks_exact(g.n)) {
                    bf16_dense(&mut mem[r.off..r.off + 2 * r.n], v);
                }
            }
            _ => enc::<2, _>(mem, runs, vals, |v| bf16_rne(v.to_bits())),
        },
        DType::Float16 if !sr => {
            let fe = FastEnc::FP16;
            enc::<2, _>(mem, runs, vals, |v| fe.encode(v.to_bits()))
        }
        DType::Float8E4m3 | DType::Float8E4m3fn | DType::Float8E5m2 if !sr => {
            let fe = match dt {
                DType::Float8E4m3 => FastEnc::E4M3,
                DType::Float8E4m3fn => FastEnc::E4M3FN,
                _ => FastEnc::E5M2,
            };
            enc::<1, _>(mem, runs, vals, |v| fe.encode(v.to_bits()))
        }
        DType::Int8 | DType::Uint8 | DType::Bool => {
            enc::<1, _>(mem, runs, vals, |v| from_f32(dt, v))
        }
        DType::Int32 => enc::<4, _>(mem, runs, vals, |v| from_f32(DType::Int32, v)),
        _ => match dt.size() {
            1 => enc_idx::<1>(mem, runs, vals, |i, v| rd.from_f32(dt, v, i)),
            2 => enc_idx::<2>(mem, runs, vals, |i, v| rd.from_f32(dt, v, i)),
            _ => enc_idx::<4>(mem, runs, vals, |i, v| rd.from_f32(dt, v, i)),
        },
    }
}

/// `bf16_rne` of a dense run into little-endian bytes: the same integer steps, compiled for
/// AVX-512 (16 lanes, `vpmovdw`) where the host has it; the baseline build only vectorises them
/// 4 lanes wide with SSE2 shuffles (~4x slower on the bf16 outputs of activations and copies).
fn bf16_dense(dst: &mut [u8], vals: &[f32]) {
    #[inline(always)]
    fn each(dst: &mut [u8], vals: &[f32]) {
        for (c, v) in dst.chunks_exact_mut(2).zip(vals) {
            c.copy_from_slice(&(bf16_rne(v.to_bits()) as u16).to_le_bytes());
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn wide(dst: &mut [u8], vals: &[f32]) {
            each(dst, vals)
        }
        if std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the host has the features (checked just above).
            return unsafe { wide(dst, vals) };
        }
    }
    each(dst, vals)
}

/// Encode one run of fp32 values; `idx0` is the output index of `vals[0]`.
pub fn encode_run(
    rd: &Rounder,
    dt: DType,
    mem: &mut [u8],
    off: usize,
    step: isize,
    vals: &[f32],
    idx0: u64,
) {
    encode_runs(
        rd,
        dt,
        mem,
        Runs::List(&one(off, step, vals.len(), idx0)),
        vals,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::config::{Fp8Overflow, NumericsConfig};

    #[test]
    fn bf16_dense_grid_matches_the_scalar_rounding() {
        // rows of 37 (the wide loop and its tail), 3 rows 100 bytes apart; every rounding case:
        // ties both ways, NaNs with payloads, infinities, subnormals, values rounding to inf
        let mut s = 0x1234_5678u32;
        let mut vals: Vec<f32> = (0..111)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                f32::from_bits(s)
            })
            .collect();
        let specials = [
            0x7F80_0001,
            0xFFC0_1234,
            0x7F80_0000,
            0x0000_8000,
            0x3F81_8000,
            0x3F80_8000,
        ];
        for (v, b) in vals
            .iter_mut()
            .zip(specials.iter().chain(&[0x7F7F_FFFF, 0x0001_7FFF]))
        {
            *v = f32::from_bits(*b);
        }
        let mut mem = vec![0xAAu8; 300];
        let g = Grid {
            off: 10,
            stride: 100,
            n: 37,
            rows: 3,
            idx: 0,
            idx_step: 37,
        };
        encode_runs(
            &Rounder::default(),
            DType::Bfloat16,
            &mut mem,
            Runs::Grid(g),
            &vals,
        );
        for r in 0..3 {
            for j in 0..37 {
                let o = 10 + r * 100 + 2 * j;
                let got = u16::from_le_bytes([mem[o], mem[o + 1]]) as u32;
                assert_eq!(got, bf16_rne(vals[r * 37 + j].to_bits()), "row {r} col {j}");
            }
            assert_eq!(mem[10 + r * 100 + 74], 0xAA); // nothing past the row
        }
    }

    #[test]
    fn fp16_decode_matches_all_codes() {
        for c in 0..=0xFFFFu32 {
            assert_eq!(
                fp16_to_f32(c).to_bits(),
                to_f32(DType::Float16, c).to_bits(),
                "{c:#x}"
            );
        }
    }

    fn samples() -> impl Iterator<Item = u32> {
        // Every top-16-bit pattern with tie, sticky and boundary low bits of every target width.
        let lows = [
            0u32, 1, 0xFFFF, 0x8000, 0x7FFF, 0x8001, 0x1000, 0x0FFF, 0x1001, 0x2000, 0x3000,
        ];
        (0..=0xFFFFu32).flat_map(move |hi| {
            lows.into_iter().flat_map(move |lo| {
                [
                    (hi << 16) | lo,
                    (hi << 16) | (lo << 4),
                    (hi << 16) | (lo >> 4),
                ]
            })
        })
    }

    #[test]
    fn fast_encoder_matches_general() {
        for f in [FP16, E4M3, E4M3FN, E5M2] {
            for sat in [false, true] {
                let fe = FastEnc::new(f, sat).unwrap();
                for u in samples() {
                    assert_eq!(fe.encode(u), f.encode_full(u, 0, 0, sat), "{f:?} {u:#x}");
                }
            }
        }
    }

    #[test]
    fn runs_match_scalar_conversions() {
        let vals: Vec<f32> = samples().step_by(97).map(f32::from_bits).collect();
        let rne = Rounder::default();
        let sr = Rounder::new(
            NumericsConfig {
                rounding: crate::numerics::config::RoundMode::Stochastic,
                fp8_overflow: Fp8Overflow::Saturate,
                ..Default::default()
            },
            1,
            2,
            3,
            true,
        );
        for c in 0..=DType::Bool as u8 {
            let dt = DType::from_u8(c).unwrap();
            let s = dt.size();
            for rd in [rne, sr] {
                // Reversed strided run (step -2) into a buffer, then decoded back.
                let n = vals.len();
                let mut mem = vec![0u8; (2 * n) * s];
                encode_run(&rd, dt, &mut mem, (2 * n - 2) * s, -2, &vals, 5);
                let mut back = vec![0f32; n];
                decode_run(dt, &mem, (2 * n - 2) * s, -2, &mut back);
                let mut raw = vec![0u32; n];
                decode_raw_run(dt, &mem, (2 * n - 2) * s, -2, &mut raw);
                for (k, v) in vals.iter().enumerate() {
                    let mut want = rd.from_f32(dt, *v, 5 + k as u64);
                    if s < 4 {
                        want &= (1u32 << (8 * s)) - 1; // stores keep the dtype's width
                    }
                    let got = crate::numerics::load_raw(&mem, s, 2 * n - 2 - 2 * k);
                    assert_eq!(got, want, "{dt:?} {:#x}", v.to_bits());
                    assert_eq!(back[k].to_bits(), to_f32(dt, want).to_bits(), "{dt:?}");
                    let ext = match dt {
                        DType::Int8 => want as u8 as i8 as i32 as u32,
                        DType::Int16 => want as u16 as i16 as i32 as u32,
                        _ => want,
                    };
                    assert_eq!(raw[k], ext, "{dt:?}");
                }
            }
        }
    }
}
