//! Streaming data paths for the elementwise instructions: block by block (a few short partition
//! rows, or a chunk of one long row; at most `CHUNK` elements), decode the inputs into small
//! reusable scratch buffers, compute, and encode straight into the destination — no whole-tile
//! vectors. `fused_dense` goes further for dense rows with no overlap: one pass from the input
//! bytes to the output bytes.
//!
//! The kernel of a map is a pure per-block closure, so running blocks on several threads later
//! only changes the driver loop (see `blocks_independent`). Results equal the materialising
//! path (read every input, then write): streams are only used when no write can reach an input
//! element that is still to be read (`can_stream`), and stochastic-rounding indices stay
//! row-major over the destination.

use super::Ctx;
use crate::memory::onchip::{Mems, OnChip};
use crate::memory::rows::RowGeom;
use crate::memory::{Ap, Mem};
use crate::numerics::bulk::{
    decode_raw_runs, decode_runs, encode_raw_runs, encode_runs, Grid, Run, Runs,
};
use std::cell::RefCell;

/// Elements per chunk: a few chunks of fp32 stay inside L1.
pub const CHUNK: usize = 2048;

thread_local! {
    static SCRATCH_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static TILE_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_U32: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    static ROW_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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

#[inline]
/// The on-chip memory `dst` (SBUF or PSUM) lives in, writable, and the other one.
pub fn dst_and_other<'m>(mems: &'m mut Mems, dst: Mem) -> (&'m mut OnChip, &'m OnChip) {
    let Mems { sbuf, psum, .. } = mems;
    match dst {
        Mem::Sbuf => (sbuf, psum),
        _ => (psum, sbuf),
    }
}

fn part_mut<'m>(mem: &'m mut OnChip, ap: &Ap, r: usize) -> &'m mut [u8] {
    mem.partition_mut(ap.start as usize + r)
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
        // In place (asked first: the byte ranges below are most of a tiny instruction's check).
        if s.start == dst.start
            && s.offset == dst.offset
            && s.dims == dst.dims
            && s.dtype.size() == dst.dtype.size()
            && dst.is_row_contiguous()
        {
            return true;
        }
        let (a, b) = (row_bytes(s), row_bytes(dst));
        a.1 <= b.0 || b.1 <= a.0
    })
}

/// The block shape of a streamed map: `rows` partition rows of `width` columns at a time, so
/// short rows are batched (a [128, 1] tile is one block) and long rows are cut into chunks.
fn block(parts: usize, free: usize, chunk: usize) -> (usize, usize) {
    if free >= chunk {
        (1, chunk)
    } else {
        ((chunk / free.max(1)).clamp(1, parts.max(1)), free)
    }
}

/// The runs of rows `r0..r0 + rows`, columns `j0..j1` of `ap`, as absolute byte offsets into
/// its memory (`idx` = row-major output index, for stochastic rounding): a uniform grid for
/// dense rows, else a run list built in `list`.
fn block_runs<'l>(
    ap: &Ap,
    g: &RowGeom,
    stride: usize,
    (r0, rows): (usize, usize),
    (j0, j1): (usize, usize),
    list: &'l mut Vec<Run>,
) -> Runs<'l> {
    let es = ap.dtype.size() as i64;
    if g.is_dense() {
        return Runs::Grid(Grid {
            off: ((ap.start as usize + r0) * stride) + ap.offset as usize + j0 * es as usize,
            stride,
            n: j1 - j0,
            rows,
            idx: (r0 * g.free + j0) as u64,
            idx_step: g.free as u64,
        });
    }
    list.clear();
    for r in r0..r0 + rows {
        let base = ((ap.start as usize + r) * stride) as i64 + ap.offset as i64;
        let idx = (r * g.free + j0) as u64;
        g.runs(j0, j1, |o, st, pos, n| {
            list.push(Run {
                off: (base + o * es) as usize,
                step: st as isize,
                n,
                idx: idx + pos as u64,
            })
        });
    }
    Runs::List(list)
}

/// Plan of a streamed map, or `None` when the materialising path is needed.
fn plan<const N: usize>(dst: &Ap, srcs: &[&Ap; N]) -> Option<(RowGeom, [RowGeom; N])> {
    if !can_stream(dst, srcs) {
        return None;
    }
    let gd = RowGeom::new(dst)?;
    let mut gs: [Option<RowGeom>; N] = std::array::from_fn(|_| None);
    for (g, s) in gs.iter_mut().zip(srcs) {
        *g = Some(RowGeom::new(s)?);
    }
    let gs = gs.map(|g| g.unwrap_or_else(|| gd.clone()));
    Some((gd, gs))
}

/// True when the blocks of a streamed map are independent of each other (no input byte is
/// written by any block, except an exactly in-place dense destination), so the block loop of
/// `drive` may run on several threads. `can_stream` alone also admits a destination that
/// starts at a lower partition than an overlapping input, which is only correct in row order.
pub fn blocks_independent(dst: &Ap, srcs: &[&Ap]) -> bool {
    can_stream(dst, srcs)
        && srcs.iter().all(|s| {
            let same_place = s.start == dst.start
                && s.offset == dst.offset
                && s.dims == dst.dims
                && s.dtype.size() == dst.dtype.size();
            let (a, b) = (row_bytes(s), row_bytes(dst));
            s.mem != dst.mem
                || s.start >= dst.start + dst.parts
                || dst.start >= s.start + s.parts
                || a.1 <= b.0
                || b.1 <= a.0
                || same_place
        })
}

/// The block loop shared by `map_f32` and `map_raw`: for each block, `read(k, runs, buf)` fills
/// input k, `compute` runs the kernel, `write(runs, out)` stores the result. Each block reads
/// through a shared borrow of the memories, computes with a pure kernel into its own scratch,
/// then writes only its own destination rows (which lie in their own partitions); with
/// `blocks_independent`, running blocks on host threads (per-thread scratch, write-back per
/// partition chunk) gives the same bytes.
#[allow(clippy::too_many_arguments)]
fn drive<T: Copy + Default, const N: usize>(
    mems: &mut Mems,
    dst: &Ap,
    srcs: &[&Ap; N],
    (gd, gs): (RowGeom, [RowGeom; N]),
    chunk: usize,
    scratch: &mut Vec<T>,
    read: impl Fn(&Ap, &[u8], Runs, &mut [T]),
    mut write: impl FnMut(&Ap, &mut [u8], Runs, &[T]),
    kernel: impl Fn(usize, usize, usize, usize, [&[T]; N], &mut [T]),
) {
    let parts = dst.parts as usize;
    let free = gd.free;
    let (rows_per, width) = block(parts, free, chunk);
    let cap = rows_per * width;
    if scratch.len() < (N + 1) * cap {
        scratch.resize((N + 1) * cap, T::default());
    }
    let (out, ins) = scratch.split_at_mut(cap);
    // Run lists only for non-dense patterns (dense ones are grids): allocated on first use.
    let mut runs = Vec::new();
    let mut r0 = 0;
    while r0 < parts {
        let rows = rows_per.min(parts - r0);
        let mut j0 = 0;
        while j0 < free {
            let j1 = (j0 + width).min(free);
            let n = rows * (j1 - j0);
            for (k, (s, g)) in srcs.iter().zip(&gs).enumerate() {
                let mem = onchip(mems, s.mem);
                let rs = block_runs(s, g, mem.stride(), (r0, rows), (j0, j1), &mut runs);
                read(s, mem.raw(), rs, &mut ins[k * cap..k * cap + n]);
            }
            let views: [&[T]; N] = std::array::from_fn(|k| &ins[k * cap..k * cap + n]);
            kernel(r0, rows, j0, j1 - j0, views, &mut out[..n]);
            let mem = onchip_mut(mems, dst.mem);
            let rs = block_runs(dst, &gd, mem.stride(), (r0, rows), (j0, j1), &mut runs);
            write(dst, mem.raw_mut(), rs, &out[..n]);
            j0 = j1;
        }
        r0 += rows;
    }
}

/// `dst = kernel(srcs)` in fp32, streamed block by block. `kernel(first row, rows, first column,
/// width, input blocks, output block)`, blocks row-major `[rows, width]`. Returns false (and
/// does nothing) when the patterns need the materialising path.
pub fn map_f32<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    kernel: impl Fn(usize, usize, usize, usize, [&[f32]; N], &mut [f32]),
) -> bool {
    map_f32_grouped(ctx, dst, srcs, 1, kernel)
}

/// `map_f32` with blocks of at least `min_rows` whole rows when that many rows of up to
/// `CHUNK` elements fit (for kernels that interleave work across rows); otherwise `map_f32`'s.
pub fn map_f32_grouped<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    min_rows: usize,
    kernel: impl Fn(usize, usize, usize, usize, [&[f32]; N], &mut [f32]),
) -> bool {
    let Some(p) = plan(dst, &srcs) else {
        return false;
    };
    let free = dst.free_size();
    let chunk = if free <= CHUNK {
        CHUNK.max(min_rows * free).min(4 * CHUNK)
    } else {
        CHUNK
    };
    let rounder = ctx.rounder;
    SCRATCH_F32.with(|cell| {
        let mut scratch = cell.borrow_mut();
        drive(
            &mut ctx.mems,
            dst,
            &srcs,
            p,
            chunk,
            &mut scratch,
            |s, mem, runs, buf| decode_runs(s.dtype, mem, runs, buf),
            |d, mem, runs, out| encode_runs(&rounder, d.dtype, mem, runs, out),
            kernel,
        )
    });
    true
}

/// `dst = kernel(srcs)` on raw 32-bit words (integers sign-extended as `read_raw`), streamed.
pub fn map_raw<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    kernel: impl Fn(usize, usize, usize, usize, [&[u32]; N], &mut [u32]),
) -> bool {
    let Some(p) = plan(dst, &srcs) else {
        return false;
    };
    SCRATCH_U32.with(|cell| {
        let mut scratch = cell.borrow_mut();
        drive(
            &mut ctx.mems,
            dst,
            &srcs,
            p,
            CHUNK,
            &mut scratch,
            |s, mem, runs, buf| decode_raw_runs(s.dtype, mem, runs, buf),
            |d, mem, runs, out| encode_raw_runs(d.dtype, mem, runs, out),
            kernel,
        )
    });
    true
}

/// Same-dtype copy of raw element bytes, streamed (dense rows of whole bytes: one row copy
/// each, `fused_dense_par`: the rows on the host threads from 1 MiB written); false when the
/// materialising path is needed.
pub fn copy_same(ctx: &mut Ctx, dst: &Ap, src: &Ap) -> bool {
    if dst.dtype != src.dtype {
        return false;
    }
    if !dst.dtype.is_packed()
        && fused_dense_par(ctx, dst, [src], stream_work(dst), |_, [x], out| {
            out.copy_from_slice(x)
        })
    {
        return true;
    }
    map_raw(ctx, dst, [src], |_, _, _, _, [x], out| {
        out.copy_from_slice(x)
    })
}

/// Decode a whole static on-chip pattern (row-major) with `dec`, without a byte copy: one
/// dtype dispatch for all rows (a uniform grid when rows are dense). `None` if not applicable.
fn read_direct<T: Copy + Default>(
    mems: &Mems,
    ap: &Ap,
    dec: impl FnOnce(crate::isa::DType, &[u8], Runs, &mut [T]),
) -> Option<Vec<T>> {
    if !static_onchip(ap) {
        return None;
    }
    let g = RowGeom::new(ap)?;
    let (parts, f) = (ap.parts as usize, g.free);
    let mut out = vec![T::default(); parts * f];
    let mem = onchip(mems, ap.mem);
    let mut list = Vec::new();
    let runs = block_runs(ap, &g, mem.stride(), (0, parts), (0, f), &mut list);
    dec(ap.dtype, mem.raw(), runs, &mut out);
    Some(out)
}

/// Store row-major values into a whole static on-chip pattern with `enc` (element i = output
/// index i, for stochastic rounding); false if not applicable.
fn write_direct<T>(
    mems: &mut Mems,
    ap: &Ap,
    vals: &[T],
    enc: impl FnOnce(crate::isa::DType, &mut [u8], Runs, &[T]),
) -> bool {
    if !static_onchip(ap) {
        return false;
    }
    let Some(g) = RowGeom::new(ap) else {
        return false;
    };
    let (parts, f) = (ap.parts as usize, g.free);
    if vals.len() != parts * f {
        return false;
    }
    let mem = onchip_mut(mems, ap.mem);
    let mut list = Vec::new();
    let runs = block_runs(ap, &g, mem.stride(), (0, parts), (0, f), &mut list);
    enc(ap.dtype, mem.raw_mut(), runs, vals);
    true
}

/// A whole static on-chip pattern decoded to fp32 (row-major).
pub fn read_f32_direct(mems: &Mems, ap: &Ap) -> Option<Vec<f32>> {
    read_direct(mems, ap, decode_runs)
}

/// `f` of a whole static on-chip pattern decoded to fp32 (row-major, as `read_f32_direct`) in a
/// per-thread buffer reused across calls: no allocation and no zeroing once it has grown.
/// `None` if not applicable (or the buffer is in use further up the stack).
pub fn with_f32_direct<R>(mems: &Mems, ap: &Ap, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if !static_onchip(ap) {
        return None;
    }
    let g = RowGeom::new(ap)?;
    let n = ap.parts as usize * g.free;
    TILE_F32.with(|cell| {
        let mut buf = cell.try_borrow_mut().ok()?;
        if buf.len() < n {
            buf.resize(n, 0.0);
        }
        let mem = onchip(mems, ap.mem);
        let mut list = Vec::new();
        let runs = block_runs(
            ap,
            &g,
            mem.stride(),
            (0, ap.parts as usize),
            (0, g.free),
            &mut list,
        );
        decode_runs(ap.dtype, mem.raw(), runs, &mut buf[..n]);
        Some(f(&buf[..n]))
    })
}

/// Raw words of a whole static on-chip pattern (row-major).
pub fn read_raw_direct(mems: &Mems, ap: &Ap) -> Option<Vec<u32>> {
    read_direct(mems, ap, decode_raw_runs)
}

/// Encode row-major fp32 values into a static on-chip pattern; false if not applicable.
pub fn write_f32_direct(ctx: &mut Ctx, ap: &Ap, vals: &[f32]) -> bool {
    let rounder = ctx.rounder;
    write_direct(&mut ctx.mems, ap, vals, |dt, mem, runs, v| {
        encode_runs(&rounder, dt, mem, runs, v)
    })
}

/// Store row-major raw words into a static on-chip pattern; false if not applicable.
pub fn write_raw_direct(mems: &mut Mems, ap: &Ap, vals: &[u32]) -> bool {
    write_direct(mems, ap, vals, encode_raw_runs)
}

/// Fill a static on-chip pattern with one raw value; false if not applicable.
pub fn fill_raw(mems: &mut Mems, ap: &Ap, v: u32) -> bool {
    if !static_onchip(ap) {
        return false;
    }
    let mem = onchip_mut(mems, ap.mem);
    if ap.is_row_contiguous() {
        // dense rows: one mutable view (one dirty-range update), each row's bytes at once
        let (stride, n) = (mem.stride(), ap.free_size());
        let first = ap.start as usize * stride + ap.offset as usize;
        let raw = mem.raw_mut();
        for r in 0..ap.parts as usize {
            crate::numerics::bulk::fill_raw_run(ap.dtype, raw, first + r * stride, 1, n, v);
        }
        return true;
    }
    let Some(g) = RowGeom::new(ap) else {
        return false;
    };
    for r in 0..ap.parts as usize {
        let p = part_mut(mem, ap, r);
        g.runs(0, g.free, |o, st, _, cnt| {
            crate::numerics::bulk::fill_raw_run(ap.dtype, p, byte(ap, o), st as isize, cnt, v)
        });
    }
    true
}

/// Where the rows of a dense on-chip pattern sit in its memory's host buffer (partitions
/// `stride` bytes apart), computed once per instruction rather than per row.
#[derive(Clone, Copy)]
struct Dense {
    first: usize,
    stride: usize,
    len: usize,
}

impl Dense {
    fn new(ap: &Ap, stride: usize) -> Self {
        Dense {
            first: ap.start as usize * stride + ap.offset as usize,
            stride,
            len: ap.free_size() * ap.dtype.size(),
        }
    }

    /// The byte range of row `r`.
    fn row(self, r: usize) -> std::ops::Range<usize> {
        let lo = self.first + r * self.stride;
        lo..lo + self.len
    }
}

/// Split `raw` into the mutable `d` and shared views of `srcs`, when every source is disjoint
/// from `d` (sources may overlap each other).
/// A destination row and the source rows that live in the same buffer.
type Split<'m, const N: usize> = (&'m mut [u8], [Option<&'m [u8]>; N]);

fn split_around<const N: usize>(
    raw: &mut [u8],
    d: std::ops::Range<usize>,
    srcs: [Option<std::ops::Range<usize>>; N],
) -> Option<Split<'_, N>> {
    let (lo, rest) = raw.split_at_mut(d.start);
    let (dm, hi) = rest.split_at_mut(d.len());
    let (lo, hi): (&[u8], &[u8]) = (lo, hi);
    let mut out: [Option<&[u8]>; N] = [None; N];
    for (o, s) in out.iter_mut().zip(srcs) {
        let Some(s) = s else { continue };
        *o = Some(if s.end <= d.start {
            &lo[s]
        } else if s.start >= d.end {
            &hi[s.start - d.end..s.end - d.end]
        } else {
            return None;
        });
    }
    Some((dm, out))
}

/// Shortest destination row (bytes) the fused map runs in place.
const IN_PLACE_MIN_BYTES: usize = 1024;

/// Fused map over dense rows: `kernel(row, input row bytes, dst row bytes)`
/// reads the inputs straight from memory and writes the destination in one pass. Only when no
/// input overlaps the destination (then order cannot matter) or an input is exactly the
/// destination's row of at least `IN_PLACE_MIN_BYTES` (in place: that row is copied first, so
/// the kernel reads the old values);
/// false (and nothing done) otherwise.
pub fn fused_dense<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    kernel: impl Fn(usize, [&[u8]; N], &mut [u8]),
) -> bool {
    let old = std::cell::RefCell::new(Vec::new());
    fused_dense_min(ctx, dst, srcs, IN_PLACE_MIN_BYTES, |r, views, out| {
        if views.iter().all(Option::is_some) {
            return kernel(r, views.map(|v| v.unwrap_or_default()), out);
        }
        // in place: the kernel reads a copy of the old row
        let mut old = old.borrow_mut();
        old.clear();
        old.extend_from_slice(out);
        let old: &[u8] = &old;
        kernel(r, views.map(|v| v.unwrap_or(old)), out)
    })
}

/// `fused_dense` with the rows split over the host threads (`par`) when `work` (operations in
/// all) makes it worthwhile and every input shares no byte with the destination or (rows of
/// at least `IN_PLACE_MIN_BYTES`, as `fused_dense`) is exactly it: then every row reads only
/// bytes no other row writes (an in-place row is copied first by the thread that owns it), so
/// rows may run in any order and on any thread, with the same bits. Otherwise (overlapping,
/// one thread, small) `fused_dense`.
pub fn fused_dense_par<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    work: usize,
    kernel: impl Fn(usize, [&[u8]; N], &mut [u8]) + Sync + Send,
) -> bool {
    fused_dense_par_groups(ctx, dst, srcs, work, 1, kernel)
}

/// `fused_dense_par` handing out rows in groups of `group` (row `g * group` on): a group's
/// rows run on one thread in order, as they do on one thread (the register sums of
/// act_fused.rs add a whole group's rows together).
pub fn fused_dense_par_groups<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    work: usize,
    group: usize,
    kernel: impl Fn(usize, [&[u8]; N], &mut [u8]) + Sync + Send,
) -> bool {
    let in_place = dst.free_size() * dst.dtype.size() >= IN_PLACE_MIN_BYTES;
    if crate::par::would_split(dst.parts as usize, work)
        && splittable(dst, &srcs, in_place)
        && rows_par(ctx, dst, srcs, (work, group), |r, views, out| {
            if views.iter().all(Option::is_some) {
                return kernel(r, views.map(|v| v.unwrap_or_default()), out);
            }
            // in place: the kernel reads a copy of the old row (this thread's row only)
            let old = out.to_vec();
            kernel(r, views.map(|v| v.unwrap_or(&old)), out)
        })
    {
        return true;
    }
    fused_dense(ctx, dst, srcs, kernel)
}

/// `fused_dense_any` (in place allowed) with the rows split over the host threads as
/// `fused_dense_par`: an input that is exactly the destination (same partitions, same bytes)
/// reaches the kernel as None and is read by the one thread that writes that row; every other
/// input shares no byte with the destination. Otherwise `fused_dense_any`.
pub fn fused_dense_any_par<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    work: usize,
    kernel: impl Fn(usize, [Option<&[u8]>; N], &mut [u8]) + Sync + Send,
) -> bool {
    if crate::par::would_split(dst.parts as usize, work)
        && splittable(dst, &srcs, true)
        && rows_par(ctx, dst, srcs, (work, 1), &kernel)
    {
        return true;
    }
    fused_dense_any(ctx, dst, srcs, kernel)
}

/// `map_f32` for any unpacked dtypes with the rows split over the host threads: each thread
/// decodes its source rows into fp32 (an input that is exactly the destination is decoded before
/// the row is written), runs `kernel(row, inputs, out)` on the row and encodes the fp32 results
/// into the destination row with the context's rounder and the row-major element index (as
/// `map_f32` numbers them), so the bits, stochastic rounding included, do not depend on the
/// thread count. Only when `work` makes the split worthwhile and the patterns are `splittable`;
/// false (nothing done) otherwise, for the caller's one-thread paths.
pub fn map_f32_rows_par<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    work: usize,
    kernel: impl Fn(usize, [&[f32]; N], &mut [f32]) + Sync + Send,
) -> bool {
    let w = dst.free_size();
    if dst.dtype.is_packed()
        || srcs
            .iter()
            .any(|s| s.dtype.is_packed() || s.free_size() != w)
        || !crate::par::would_split(dst.parts as usize, work)
        || !splittable(dst, &srcs, true)
    {
        return false;
    }
    let (rounder, dt) = (ctx.rounder, dst.dtype);
    let sdt = srcs.map(|s| s.dtype);
    let grid = |stride: usize, idx: u64| {
        Runs::Grid(Grid {
            off: 0,
            stride,
            n: w,
            rows: 1,
            idx,
            idx_step: w as u64,
        })
    };
    rows_par(ctx, dst, srcs, (work, 1), |r, views, out| {
        ROW_F32.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < (N + 1) * w {
                buf.resize((N + 1) * w, 0.0);
            }
            let (res, ins) = buf.split_at_mut(w);
            for (i, v) in views.iter().enumerate() {
                let x: &[u8] = v.unwrap_or(out);
                decode_runs(sdt[i], x, grid(x.len(), 0), &mut ins[i * w..(i + 1) * w]);
            }
            let ins: &[f32] = ins;
            kernel(r, std::array::from_fn(|i| &ins[i * w..(i + 1) * w]), res);
            encode_runs(&rounder, dt, out, grid(out.len(), (r * w) as u64), res);
        })
    })
}

/// The `par` work of a memory-bound pass writing `dst` (rows split from 1 MiB written).
pub fn stream_work(dst: &Ap) -> usize {
    (dst.parts as usize * dst.free_size() * dst.dtype.size())
        .saturating_mul(crate::par::STREAM_WORK_PER_BYTE)
}

/// Whether `srcs -> dst` may run row by row on any thread: static dense on-chip rows, each
/// input in another memory, other partitions or other bytes than every destination row, or
/// (`in_place`) exactly the destination.
fn splittable(dst: &Ap, srcs: &[&Ap], in_place: bool) -> bool {
    let exact = |s: &Ap| {
        s.mem == dst.mem
            && s.start == dst.start
            && s.parts == dst.parts
            && row_bytes(s) == row_bytes(dst)
    };
    let apart = |s: &Ap| {
        let (a, b) = (row_bytes(s), row_bytes(dst));
        s.mem != dst.mem
            || s.start >= dst.start + dst.parts
            || dst.start >= s.start + s.parts
            || a.1 <= b.0
            || b.1 <= a.0
    };
    std::iter::once(dst)
        .chain(srcs.iter().copied())
        .all(|a| static_onchip(a) && a.is_row_contiguous())
        && srcs.iter().all(|s| apart(s) || (in_place && exact(s)))
}

/// The rows of a `splittable` `srcs -> dst` on the host threads, `group` consecutive rows per
/// task (in order), an input that is exactly the destination given as None; false (nothing
/// done) if a row falls outside the buffers.
fn rows_par<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    (work, group): (usize, usize),
    kernel: impl Fn(usize, [Option<&[u8]>; N], &mut [u8]) + Sync + Send,
) -> bool {
    let parts = dst.parts as usize;
    let (dmem, other) = dst_and_other(&mut ctx.mems, dst.mem);
    let (stride_d, stride_o) = (dmem.stride(), other.stride());
    let dg = Dense::new(dst, stride_d);
    let sg = srcs.map(|s| Dense::new(s, if s.mem == dst.mem { stride_d } else { stride_o }));
    let same = srcs.map(|s| s.mem == dst.mem);
    let (other, draw) = (other.raw(), dmem.raw_mut());
    // validated patterns stay in bounds; checked here once since the rows below are raw
    let last = parts.saturating_sub(1);
    if parts == 0
        || dg.row(last).end > draw.len()
        || (0..N).any(|i| sg[i].row(last).end > if same[i] { draw.len() } else { other.len() })
    {
        return false;
    }
    let base = RawBytes(draw.as_mut_ptr());
    let one = |r: usize| {
        let d = dg.row(r);
        // SAFETY: in bounds (checked above); destination rows are disjoint (one partition
        // each) and each row runs once, so `out` aliases nothing another row touches; a
        // same-memory input row is either this very row (passed as None, never aliased) or
        // lies in bytes no destination row covers (`splittable`), so reading it while other
        // rows are written is sound.
        let out = unsafe { std::slice::from_raw_parts_mut(base.at(d.start), d.len()) };
        let views: [Option<&[u8]>; N] = std::array::from_fn(|i| {
            let g = sg[i].row(r);
            if !same[i] {
                Some(&other[g])
            } else if g == d {
                None
            } else {
                // SAFETY: as above.
                Some(unsafe { std::slice::from_raw_parts(base.at(g.start), g.len()) })
            }
        });
        kernel(r, views, out)
    };
    let group = group.max(1);
    crate::par::for_each_index(parts.div_ceil(group), work, |g| {
        for r in g * group..((g + 1) * group).min(parts) {
            one(r)
        }
    });
    true
}

/// The destination memory's base pointer, shared by the threads of `fused_dense_par` (each
/// derives disjoint rows from it).
#[derive(Clone, Copy)]
struct RawBytes(*mut u8);
// SAFETY: only used by `rows_par`, whose rows never alias a written byte.
unsafe impl Send for RawBytes {}
// SAFETY: as above.
unsafe impl Sync for RawBytes {}

impl RawBytes {
    /// The pointer `off` bytes in (a method, so closures capture the whole Sync wrapper).
    ///
    /// # Safety
    /// `off` within the memory the pointer came from.
    unsafe fn at(self, off: usize) -> *mut u8 {
        self.0.add(off)
    }
}

/// `fused_dense` running in place on rows of any length, for elementwise kernels (Vector
/// tensor_scalar / tensor_tensor): an input given to the kernel as None is the destination row
/// itself, which the kernel must read element by element before writing (no copy is made).
pub fn fused_dense_any<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    kernel: impl Fn(usize, [Option<&[u8]>; N], &mut [u8]),
) -> bool {
    fused_dense_min(ctx, dst, srcs, 0, kernel)
}

fn fused_dense_min<const N: usize>(
    ctx: &mut Ctx,
    dst: &Ap,
    srcs: [&Ap; N],
    in_place_min: usize,
    kernel: impl Fn(usize, [Option<&[u8]>; N], &mut [u8]),
) -> bool {
    if !std::iter::once(dst)
        .chain(srcs)
        .all(|a| static_onchip(a) && a.is_row_contiguous())
        || !can_stream(dst, &srcs)
    {
        return false;
    }
    let (dmem, other) = dst_and_other(&mut ctx.mems, dst.mem);
    let stride_d = dmem.stride();
    let stride_o = other.stride();
    let dg = Dense::new(dst, stride_d);
    let sg = srcs.map(|s| Dense::new(s, if s.mem == dst.mem { stride_d } else { stride_o }));
    // Check every row first, so a refusal leaves memory untouched.
    let mut in_place = false;
    for r in 0..dst.parts as usize {
        let d = dg.row(r);
        for (s, g) in srcs.iter().zip(sg) {
            if s.mem == dst.mem {
                let x = g.row(r);
                // in place only for long rows: the per-row copy and split cost more than
                // the block path's batched decode for short ones
                if x == d && d.len() >= in_place_min {
                    in_place = true;
                } else if x.start < d.end && d.start < x.end {
                    return false;
                }
            }
        }
    }
    if in_place {
        return fused_in_place(dmem, other, dst, (&srcs, dg, sg), kernel);
    }
    for r in 0..dst.parts as usize {
        let d = dg.row(r);
        let same: [Option<std::ops::Range<usize>>; N] =
            std::array::from_fn(|i| (srcs[i].mem == dst.mem).then(|| sg[i].row(r)));
        let Some((out, mine)) = split_around(dmem.raw_mut(), d, same) else {
            return false;
        };
        let mut views: [Option<&[u8]>; N] = [None; N];
        for ((v, m), g) in views.iter_mut().zip(mine).zip(sg) {
            *v = Some(m.unwrap_or_else(|| &other.raw()[g.row(r)]));
        }
        kernel(r, views, out);
    }
    true
}

/// `fused_dense` when some input is exactly the destination's row: the kernel gets None for
/// that input (rows were checked: every other same-memory input is disjoint).
fn fused_in_place<const N: usize>(
    dmem: &mut OnChip,
    other: &OnChip,
    dst: &Ap,
    (srcs, dg, sg): (&[&Ap; N], Dense, [Dense; N]),
    kernel: impl Fn(usize, [Option<&[u8]>; N], &mut [u8]),
) -> bool {
    for r in 0..dst.parts as usize {
        let d = dg.row(r);
        let rows: [Option<std::ops::Range<usize>>; N] =
            std::array::from_fn(|i| (srcs[i].mem == dst.mem).then(|| sg[i].row(r)));
        let same = rows.clone().map(|x| x.filter(|x| *x != d));
        let Some((out, mine)) = split_around(dmem.raw_mut(), d.clone(), same) else {
            return false;
        };
        let mut views: [Option<&[u8]>; N] = [None; N];
        for (((v, m), g), x) in views.iter_mut().zip(mine).zip(sg).zip(&rows) {
            *v = match (m, x) {
                (Some(m), _) => Some(m),
                (None, Some(x)) if *x == d => None,
                _ => Some(&other.raw()[g.row(r)]),
            };
        }
        kernel(r, views, out);
    }
    true
}

/// Converting copy between HBM and on-chip memory when both patterns have dense rows (a DMA
/// cast): each row streams through two small scratch buffers in `CHUNK`-element pieces
/// (HBM bytes -> fp32 -> on-chip bytes, or the reverse). The memories cannot overlap, so this
/// equals reading everything first. Element index (for the rounder) = row-major position.
pub fn cast_dense_hbm(ctx: &mut Ctx, dst: &Ap, src: &Ap) -> bool {
    let dense = |a: &Ap| a.dynamic.is_none() && a.is_row_contiguous();
    if dst.parts != src.parts
        || dst.free_size() != src.free_size()
        || !dense(dst)
        || !dense(src)
        || (dst.mem == Mem::Hbm) == (src.mem == Mem::Hbm)
        || dst.dtype.is_packed()
        || src.dtype.is_packed()
    {
        return false;
    }
    let (parts, f) = (src.parts as usize, src.free_size());
    let (ss, ds) = (src.dtype.size(), dst.dtype.size());
    let rounder = ctx.rounder;
    let mut bytes = vec![0u8; CHUNK.min(f) * ss.max(ds)];
    SCRATCH_F32.with(|cell| {
        let mut vals = cell.borrow_mut();
        if vals.len() < CHUNK.min(f) {
            vals.resize(CHUNK.min(f), 0.0);
        }
        let Mems { sbuf, psum, hbm } = &mut ctx.mems;
        for r in 0..parts {
            let mut j0 = 0;
            while j0 < f {
                let n = CHUNK.min(f - j0);
                let v = &mut vals[..n];
                let idx = (r * f + j0) as u64;
                if src.mem == Mem::Hbm {
                    let b = &mut bytes[..n * ss];
                    hbm.read(src.row_base(r as u32) as u64 + (j0 * ss) as u64, b);
                    decode_runs(
                        src.dtype,
                        b,
                        Runs::List(&[Run {
                            off: 0,
                            step: 1,
                            n,
                            idx,
                        }]),
                        v,
                    );
                    let mem: &mut OnChip = if dst.mem == Mem::Sbuf { sbuf } else { psum };
                    let off =
                        (dst.start as usize + r) * mem.stride() + dst.offset as usize + j0 * ds;
                    let runs = [Run {
                        off,
                        step: 1,
                        n,
                        idx,
                    }];
                    encode_runs(&rounder, dst.dtype, mem.raw_mut(), Runs::List(&runs), v);
                } else {
                    let mem: &OnChip = if src.mem == Mem::Sbuf { sbuf } else { psum };
                    let off =
                        (src.start as usize + r) * mem.stride() + src.offset as usize + j0 * ss;
                    decode_runs(
                        src.dtype,
                        mem.raw(),
                        Runs::List(&[Run {
                            off,
                            step: 1,
                            n,
                            idx,
                        }]),
                        v,
                    );
                    let b = &mut bytes[..n * ds];
                    encode_runs(
                        &rounder,
                        dst.dtype,
                        b,
                        Runs::List(&[Run {
                            off: 0,
                            step: 1,
                            n,
                            idx,
                        }]),
                        v,
                    );
                    hbm.write(dst.row_base(r as u32) as u64 + (j0 * ds) as u64, b);
                }
                j0 += n;
            }
        }
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::DType;

    fn ap(start: u32, parts: u32, offset: u64, n: u32) -> Ap {
        Ap {
            mem: Mem::Sbuf,
            dtype: DType::Float32,
            start,
            parts,
            pstep: 0,
            offset,
            dims: vec![(1, n)],
            dynamic: None,
        }
    }

    #[test]
    fn stream_and_parallel_rules() {
        let a = ap(0, 64, 0, 16);
        // exactly in place: both
        assert!(can_stream(&a, &[&a]) && blocks_independent(&a, &[&a]));
        // other bytes of the same partitions: both
        let b = ap(0, 64, 64, 16);
        assert!(can_stream(&b, &[&a]) && blocks_independent(&b, &[&a]));
        // dst one partition below an overlapping source: row order only
        let lower = ap(0, 64, 0, 16);
        let src = ap(1, 64, 0, 16);
        assert!(can_stream(&lower, &[&src]) && !blocks_independent(&lower, &[&src]));
        // dst one partition above: neither (a later source row is overwritten first)
        assert!(!can_stream(&src, &[&lower]));
        // shifted by one element in the same partitions: neither
        let shifted = ap(0, 64, 4, 16);
        assert!(!can_stream(&shifted, &[&a]) && !can_stream(&a, &[&shifted]));
    }

    #[test]
    fn dense_rows_fold_to_one_segment() {
        let mut x = ap(0, 1, 0, 1);
        x.dims = vec![(8, 4), (1, 8)];
        let g = RowGeom::new(&x).unwrap_or_else(|| panic!("static pattern"));
        assert!(g.is_dense() && g.inner == 32);
        x.dims = vec![(16, 4), (1, 8)];
        let g = RowGeom::new(&x).unwrap_or_else(|| panic!("static pattern"));
        assert!(!g.is_dense() && g.inner == 8);
        let mut seen = Vec::new();
        g.runs(6, 20, |o, st, pos, n| seen.push((o, st, pos, n)));
        assert_eq!(seen, vec![(6, 1, 0, 2), (16, 1, 2, 8), (32, 1, 10, 4)]);
    }
}
