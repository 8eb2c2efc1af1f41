//! Elementwise maps over column operands: fp32 patterns of one element per partition (a
//! `[P, 1]` tile) read and written in one strided pass through the partitions — each row's
//! inputs loaded, the kernel applied, the result stored — with no block planning, scratch
//! buffers or per-row calls. Tiny instructions on columns are dominated by that overhead
//! (issue 17: tiny-instruction dispatch).
//!
//! Results equal the materialising path (read every input, then write) under the same rule as
//! the streamed maps (`rows::can_stream`: an input overlapping the destination is exactly it,
//! or its overlapping rows were read in earlier rows); fp32 stores need no rounding.

use super::rows::{can_stream, dst_and_other};
use super::Ctx;
use crate::isa::DType;
use crate::memory::{Ap, Mem};

/// A static on-chip fp32 pattern of one element per partition.
#[inline]
fn is_column(a: &Ap) -> bool {
    a.mem != Mem::Hbm && a.dynamic.is_none() && a.dtype == DType::Float32 && a.free_size() == 1
}

#[cfg(test)]
fn load(mem: &[u8], at: usize) -> f32 {
    let b: [u8; 4] = mem[at..at + 4].try_into().unwrap_or([0; 4]);
    f32::from_le_bytes(b)
}

/// `dst[r] = kernel(r, [src_k[r]])` for every partition row `r` of the column operands, in
/// row order; false (and nothing done) unless `dst` and every source are fp32 columns of the
/// same partition count that may stream (`rows::can_stream`).
#[inline]
pub fn map_column_f32<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    kernel: impl Fn(usize, [f32; N]) -> f32,
) -> bool {
    if !is_column(dst)
        || !srcs.iter().all(|s| is_column(s) && s.parts == dst.parts)
        || !can_stream(dst, &srcs)
    {
        return false;
    }
    let (dmem, other) = dst_and_other(&mut ctx.mems, dst.mem);
    let (sd, so) = (dmem.stride(), other.stride());
    // Byte position of row 0 (the element at offset 0 of every free dim) and the row step, per
    // source, and whether it lives in the destination's memory.
    let at = |a: &Ap, stride: usize| a.start as usize * stride + a.offset as usize;
    let mut place = [(false, 0usize, 0usize); N];
    for (p, s) in place.iter_mut().zip(srcs) {
        let same = s.mem == dst.mem;
        let stride = if same { sd } else { so };
        *p = (same, at(s, stride), stride);
    }
    let d0 = at(dst, sd);
    let oraw = other.raw();
    let draw = dmem.raw_mut();
    let rows = dst.parts as usize;
    // Every row's 4 bytes checked once, up front (the last row is the furthest): the row loop
    // then reads and writes through raw pointers, with no per-row bounds checks (a [128, 1]
    // instruction is little more than this loop).
    let last = |p0: usize, stride: usize| p0 + (rows.max(1) - 1) * stride + 4;
    let fits = last(d0, sd) <= draw.len()
        && place.iter().all(|&(same, p0, stride)| {
            last(p0, stride) <= if same { draw.len() } else { oraw.len() }
        });
    if !fits {
        return false; // (not reached for validated operands: the checked paths report it)
    }
    let (dptr, optr) = (draw.as_mut_ptr(), oraw.as_ptr());
    for r in 0..rows {
        let mut x = [0f32; N];
        for (v, &(same, p0, stride)) in x.iter_mut().zip(&place) {
            let base = if same { dptr as *const u8 } else { optr };
            // SAFETY: p0 + r * stride + 4 <= len for r < rows (checked above); unaligned read.
            *v = unsafe { (base.add(p0 + r * stride) as *const f32).read_unaligned() };
        }
        let y = kernel(r, x);
        // SAFETY: d0 + r * sd + 4 <= draw.len() (checked above); `draw` is borrowed mutably,
        // so nothing else writes it; unaligned write.
        unsafe { (dptr.add(d0 + r * sd) as *mut f32).write_unaligned(y) };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::EngineState;
    use crate::memory::onchip::{Mems, OnChip};
    use crate::numerics::config::Rounder;
    use crate::numerics::rng::RngStates;

    fn col(mem: Mem, start: u32, parts: u32, offset: u64) -> Ap {
        Ap {
            mem,
            dtype: DType::Float32,
            start,
            parts,
            pstep: 0,
            offset,
            dims: vec![(1, 1)],
            dynamic: None,
        }
    }

    /// `f` with an engine context over `sbuf` and `psum` (a fresh HBM, state, PRNG and registers).
    fn with_ctx<R>(sbuf: &mut OnChip, psum: &mut OnChip, f: impl FnOnce(&mut Ctx) -> R) -> R {
        let mut hbm = crate::memory::hbm::Hbm::new();
        let mut state = EngineState::default();
        let mut rng = RngStates::seeded(0);
        let mut regs = [0u32; crate::isa::instr::NUM_REGISTERS as usize];
        let mut ctx = Ctx {
            mems: Mems {
                sbuf,
                psum,
                hbm: &mut hbm,
            },
            state: &mut state,
            rng: &mut rng,
            rounder: Rounder::default(),
            regs: &mut regs,
            jump: None,
        };
        f(&mut ctx)
    }

    #[test]
    fn columns_map_in_place_across_memories_and_refuse_the_rest() {
        let mut sbuf = OnChip::sbuf();
        let mut psum = OnChip::psum();
        for p in 0..128 {
            sbuf.partition_mut(p)[8..12].copy_from_slice(&(p as f32).to_le_bytes());
            psum.partition_mut(p)[0..4].copy_from_slice(&(2.0f32 * p as f32).to_le_bytes());
        }
        with_ctx(&mut sbuf, &mut psum, |ctx| {
            let a = col(Mem::Sbuf, 0, 128, 8);
            let b = col(Mem::Psum, 0, 128, 0);
            // in place, with a source in the other memory
            assert!(map_column_f32(ctx, &a, [&a, &b], |_, [x, y]| x + y));
            // a destination above an overlapping source is refused (row order would differ)
            let up = col(Mem::Sbuf, 1, 64, 8);
            let down = col(Mem::Sbuf, 0, 64, 8);
            assert!(!map_column_f32(ctx, &up, [&down], |_, [x]| x));
            // ... one below it streams: row r reads partition r + 1 before row r + 1 writes it
            assert!(map_column_f32(ctx, &down, [&up], |r, [x]| x + r as f32));
            // two elements per partition, or another dtype: refused
            let mut wide = a.clone();
            wide.dims = vec![(1, 2)];
            assert!(!map_column_f32(ctx, &wide, [&wide], |_, [x]| x));
            let mut bf = a.clone();
            bf.dtype = DType::Bfloat16;
            assert!(!map_column_f32(ctx, &bf, [&bf], |_, [x]| x));
            let got: Vec<f32> = (0..128)
                .map(|p| load(ctx.mems.sbuf.partition(p), 8))
                .collect();
            // after the first map every row p holds 3p; rows 0..64 then took row p + 1 plus p
            let want: Vec<f32> = (0..128)
                .map(|p| {
                    let v = 3.0 * p as f32;
                    if p < 64 {
                        3.0 * (p + 1) as f32 + p as f32
                    } else {
                        v
                    }
                })
                .collect();
            assert_eq!(got, want);
        });
    }

    #[test]
    fn columns_at_the_last_bytes_of_every_partition_map() {
        // the up-front bounds check must admit a column ending at the last byte of partition 127
        let mut sbuf = OnChip::sbuf();
        let mut psum = OnChip::psum();
        let (sb, pb) = (sbuf.part_bytes, psum.part_bytes);
        for p in 0..128 {
            psum.partition_mut(p)[pb - 4..].copy_from_slice(&(p as f32 * 0.5).to_le_bytes());
        }
        with_ctx(&mut sbuf, &mut psum, |ctx| {
            let dst = col(Mem::Sbuf, 0, 128, (sb - 4) as u64);
            let src = col(Mem::Psum, 0, 128, (pb - 4) as u64);
            assert!(map_column_f32(ctx, &dst, [&src], |r, [x]| x + r as f32));
            let got: Vec<f32> = (0..128)
                .map(|p| load(ctx.mems.sbuf.partition(p), sb - 4))
                .collect();
            let want: Vec<f32> = (0..128).map(|p| p as f32 * 1.5).collect();
            assert_eq!(got, want);
        });
    }
}
