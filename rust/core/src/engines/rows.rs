//! Streaming row-wise data paths for the elementwise instructions: for each partition row, in
//! chunks of at most `CHUNK` elements, decode the inputs into small reusable scratch buffers,
//! compute, and encode straight into the destination — no whole-tile vectors.
//!
//! The kernel of a map is a pure per-(row, chunk) closure, so running rows on several threads
//! later only changes the driver loop. Results equal the materialising path (read every input,
//! then write): streams are only used when no write can reach an input element that is still to
//! be read (`can_stream`), and stochastic-rounding indices stay row-major over the destination.

use super::Ctx;
use crate::memory::onchip::{Mems, OnChip};
use crate::memory::rows::RowGeom;
use crate::memory::{Ap, Mem};
use crate::numerics::bulk::{decode_raw_run, decode_run, encode_raw_run, encode_run};
use std::cell::RefCell;

/// Elements per chunk: a few chunks of fp32 stay inside L1.
pub const CHUNK: usize = 2048;

thread_local! {
    static SCRATCH_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_U32: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

fn onchip<'m>(mems: &'m Mems, m: Mem) -> &'m OnChip {
    match m {
        Mem::Sbuf => mems.sbuf,
        _ => mems.psum,
    }
}

fn onchip_mut<'m>(mems: &'m mut Mems, m: Mem) -> &'m mut OnChip {
    match m {
        Mem::Sbuf => mems.sbuf,
        _ => mems.psum,
    }
}

/// Bytes of the partition holding row `r` of an on-chip pattern.
#[inline]
fn part<'m>(mem: &'m OnChip, ap: &Ap, r: usize) -> &'m [u8] {
    let p = ap.start as usize + r;
    &mem.bytes[p * mem.part_bytes..(p + 1) * mem.part_bytes]
}

#[inline]
fn part_mut<'m>(mem: &'m mut OnChip, ap: &Ap, r: usize) -> &'m mut [u8] {
    let p = ap.start as usize + r;
    &mut mem.bytes[p * mem.part_bytes..(p + 1) * mem.part_bytes]
}

/// Byte offset in the partition of element offset `eoff` (validated patterns stay in bounds).
#[inline]
fn byte(ap: &Ap, eoff: i64) -> usize {
    (ap.offset as i64 + eoff * ap.dtype.size() as i64) as usize
}

fn static_onchip(ap: &Ap) -> bool {
    ap.mem != Mem::Hbm && ap.dynamic.is_none()
}

/// Bytes each row touches, relative to the partition start.
fn row_bytes(ap: &Ap) -> (i128, i128) {
    let (lo, hi) = ap.row_byte_range();
    (ap.offset as i128 + lo, ap.offset as i128 + hi)
}

/// True when streaming `srcs -> dst` row by row and chunk by chunk gives the same result as
/// reading every input first: each input is in another memory, or touches other partitions or
/// bytes, or its overlapping rows were read in earlier rows (dst starts at a lower partition),
/// or it is exactly the dense destination (in place: each chunk is read before it is written).
pub fn can_stream(dst: &Ap, srcs: &[&Ap]) -> bool {
    if !static_onchip(dst) {
        return false;
    }
    srcs.iter().all(|s| {
        if !static_onchip(s) {
            return false;
        }
        if s.mem != dst.mem
            || s.start >= dst.start + dst.parts
            || dst.start >= s.start + s.parts
            || dst.start < s.start
        {
            return true;
        }
        let (a, b) = (row_bytes(s), row_bytes(dst));
        if a.1 <= b.0 || b.1 <= a.0 {
            return true;
        }
        s.start == dst.start
            && s.offset == dst.offset
            && s.dims == dst.dims
            && s.dtype.size() == dst.dtype.size()
            && dst.is_row_contiguous()
    })
}

/// `dst = kernel(srcs)` in fp32, streamed. `kernel(row, first column, input chunks, output
/// chunk)`. Returns false (and does nothing) when the patterns need the materialising path.
pub fn map_f32<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    kernel: impl Fn(usize, usize, [&[f32]; N], &mut [f32]),
) -> bool {
    if !can_stream(dst, &srcs) {
        return false;
    }
    let Some(gd) = RowGeom::new(dst) else {
        return false;
    };
    let mut gs = Vec::with_capacity(N);
    for s in srcs {
        match RowGeom::new(s) {
            Some(g) => gs.push(g),
            None => return false,
        }
    }
    let free = gd.free;
    let chunk = free.min(CHUNK);
    let rounder = ctx.rounder;
    SCRATCH_F32.with(|cell| {
        let mut scratch = cell.borrow_mut();
        if scratch.len() < (N + 1) * chunk {
            scratch.resize((N + 1) * chunk, 0.0);
        }
        let (out, ins) = scratch.split_at_mut(chunk);
        for r in 0..dst.parts as usize {
            let mut j0 = 0;
            while j0 < free {
                let j1 = (j0 + chunk).min(free);
                let n = j1 - j0;
                for (k, (s, g)) in srcs.iter().zip(&gs).enumerate() {
                    let buf = &mut ins[k * chunk..k * chunk + n];
                    let mem = part(onchip(&ctx.mems, s.mem), s, r);
                    g.runs(j0, j1, |o, st, pos, cnt| {
                        decode_run(
                            s.dtype,
                            mem,
                            byte(s, o),
                            st as isize,
                            &mut buf[pos..pos + cnt],
                        )
                    });
                }
                let views: [&[f32]; N] = std::array::from_fn(|k| &ins[k * chunk..k * chunk + n]);
                kernel(r, j0, views, &mut out[..n]);
                let mem = part_mut(onchip_mut(&mut ctx.mems, dst.mem), dst, r);
                let base = (r * free + j0) as u64;
                gd.runs(j0, j1, |o, st, pos, cnt| {
                    encode_run(
                        &rounder,
                        dst.dtype,
                        mem,
                        byte(dst, o),
                        st as isize,
                        &out[pos..pos + cnt],
                        base + pos as u64,
                    )
                });
                j0 = j1;
            }
        }
    });
    true
}

/// `dst = kernel(srcs)` on raw 32-bit words (integers sign-extended as `read_raw`), streamed.
pub fn map_raw<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    kernel: impl Fn(usize, usize, [&[u32]; N], &mut [u32]),
) -> bool {
    if !can_stream(dst, &srcs) {
        return false;
    }
    let Some(gd) = RowGeom::new(dst) else {
        return false;
    };
    let mut gs = Vec::with_capacity(N);
    for s in srcs {
        match RowGeom::new(s) {
            Some(g) => gs.push(g),
            None => return false,
        }
    }
    let free = gd.free;
    let chunk = free.min(CHUNK);
    SCRATCH_U32.with(|cell| {
        let mut scratch = cell.borrow_mut();
        if scratch.len() < (N + 1) * chunk {
            scratch.resize((N + 1) * chunk, 0);
        }
        let (out, ins) = scratch.split_at_mut(chunk);
        for r in 0..dst.parts as usize {
            let mut j0 = 0;
            while j0 < free {
                let j1 = (j0 + chunk).min(free);
                let n = j1 - j0;
                for (k, (s, g)) in srcs.iter().zip(&gs).enumerate() {
                    let buf = &mut ins[k * chunk..k * chunk + n];
                    let mem = part(onchip(&ctx.mems, s.mem), s, r);
                    g.runs(j0, j1, |o, st, pos, cnt| {
                        decode_raw_run(
                            s.dtype,
                            mem,
                            byte(s, o),
                            st as isize,
                            &mut buf[pos..pos + cnt],
                        )
                    });
                }
                let views: [&[u32]; N] = std::array::from_fn(|k| &ins[k * chunk..k * chunk + n]);
                kernel(r, j0, views, &mut out[..n]);
                let mem = part_mut(onchip_mut(&mut ctx.mems, dst.mem), dst, r);
                gd.runs(j0, j1, |o, st, pos, cnt| {
                    encode_raw_run(
                        dst.dtype,
                        mem,
                        byte(dst, o),
                        st as isize,
                        &out[pos..pos + cnt],
                    )
                });
                j0 = j1;
            }
        }
    });
    true
}

/// Same-dtype copy of raw element bytes, streamed; false when the materialising path is needed.
pub fn copy_same(ctx: &mut Ctx, dst: &Ap, src: &Ap) -> bool {
    if dst.dtype != src.dtype {
        return false;
    }
    map_raw(ctx, dst, [src], |_, _, [x], out| out.copy_from_slice(x))
}

/// Decode a whole static on-chip pattern into fp32 (row-major), without a byte copy.
pub fn read_f32_direct(mems: &Mems, ap: &Ap) -> Option<Vec<f32>> {
    if !static_onchip(ap) {
        return None;
    }
    let g = RowGeom::new(ap)?;
    let f = g.free;
    let mut out = vec![0f32; ap.parts as usize * f];
    let mem = onchip(mems, ap.mem);
    for (r, row) in out.chunks_exact_mut(f.max(1)).enumerate() {
        let p = part(mem, ap, r);
        g.runs(0, f, |o, st, pos, cnt| {
            decode_run(
                ap.dtype,
                p,
                byte(ap, o),
                st as isize,
                &mut row[pos..pos + cnt],
            )
        });
    }
    Some(out)
}

/// Raw words of a whole static on-chip pattern (row-major).
pub fn read_raw_direct(mems: &Mems, ap: &Ap) -> Option<Vec<u32>> {
    if !static_onchip(ap) {
        return None;
    }
    let g = RowGeom::new(ap)?;
    let f = g.free;
    let mut out = vec![0u32; ap.parts as usize * f];
    let mem = onchip(mems, ap.mem);
    for (r, row) in out.chunks_exact_mut(f.max(1)).enumerate() {
        let p = part(mem, ap, r);
        g.runs(0, f, |o, st, pos, cnt| {
            decode_raw_run(
                ap.dtype,
                p,
                byte(ap, o),
                st as isize,
                &mut row[pos..pos + cnt],
            )
        });
    }
    Some(out)
}

/// Encode row-major fp32 values into a static on-chip pattern; false if not applicable.
pub fn write_f32_direct(ctx: &mut Ctx, ap: &Ap, vals: &[f32]) -> bool {
    if !static_onchip(ap) {
        return false;
    }
    let Some(g) = RowGeom::new(ap) else {
        return false;
    };
    let f = g.free;
    let rounder = ctx.rounder;
    let mem = onchip_mut(&mut ctx.mems, ap.mem);
    for (r, row) in vals
        .chunks_exact(f.max(1))
        .enumerate()
        .take(ap.parts as usize)
    {
        let p = part_mut(mem, ap, r);
        let base = (r * f) as u64;
        g.runs(0, f, |o, st, pos, cnt| {
            encode_run(
                &rounder,
                ap.dtype,
                p,
                byte(ap, o),
                st as isize,
                &row[pos..pos + cnt],
                base + pos as u64,
            )
        });
    }
    true
}

/// Store row-major raw words into a static on-chip pattern; false if not applicable.
pub fn write_raw_direct(mems: &mut Mems, ap: &Ap, vals: &[u32]) -> bool {
    if !static_onchip(ap) {
        return false;
    }
    let Some(g) = RowGeom::new(ap) else {
        return false;
    };
    let f = g.free;
    let mem = onchip_mut(mems, ap.mem);
    for (r, row) in vals
        .chunks_exact(f.max(1))
        .enumerate()
        .take(ap.parts as usize)
    {
        let p = part_mut(mem, ap, r);
        g.runs(0, f, |o, st, pos, cnt| {
            encode_raw_run(ap.dtype, p, byte(ap, o), st as isize, &row[pos..pos + cnt])
        });
    }
    true
}

/// Fill a static on-chip pattern with one raw value; false if not applicable.
pub fn fill_raw(mems: &mut Mems, ap: &Ap, v: u32) -> bool {
    if !static_onchip(ap) {
        return false;
    }
    let Some(g) = RowGeom::new(ap) else {
        return false;
    };
    let mem = onchip_mut(mems, ap.mem);
    for r in 0..ap.parts as usize {
        let p = part_mut(mem, ap, r);
        g.runs(0, g.free, |o, st, _, cnt| {
            crate::numerics::bulk::fill_raw_run(ap.dtype, p, byte(ap, o), st as isize, cnt, v)
        });
    }
    true
}
