//! The arithmetic of `nc_matmul` (normal and double-row): decode the operand rows straight from
//! SBUF into fp32 (rows split across threads, a row ahead prefetched: SBUF partitions sit
//! 256 KiB apart, a stride the hardware prefetchers do not follow), pack the stationary operand
//! into row panels, then
//! per column panel of the moving operand (in parallel) pack it and run the register-blocked
//! microkernel (kernels/gemm.rs) against every row panel, and hand the `[M, N]` column sums
//! (a [`Product`]) back to the engine for the PSUM write (kernels/psum.rs). A matmul on one
//! thread into contiguous fp32 PSUM rows with a given `accumulate` skips the result buffer:
//! `matmul_in_place` copies or adds each microkernel tile straight into PSUM. Scratch buffers
//! are reused across instructions. Each output element is one thread's fma chain in k order,
//! so thread count and SIMD path never change a bit.

use super::decode::{decode_into, decode_panel, decode_panels, Rows};
use super::gemm::{blocking, grow, micro, Blocking, MAX_TILE};
use super::psum::{Acc, Layout};
use super::simd;
use crate::error::{fail, ErrorKind::Internal, Result};
use crate::isa::DType;
use crate::memory::onchip::Mems;
use crate::memory::Ap;
use crate::par;
use std::cell::RefCell;

#[derive(Default)]
struct Scratch {
    /// Decoded stationary rows, row-major `[K][M]` (the moving operand is decoded per panel).
    rows: Vec<f32>,
    /// Stationary panels `[M / MR][K][MR]`.
    a: Vec<f32>,
    /// Result, panel-major `[N / NR][M][NR]`.
    out: Vec<f32>,
}

thread_local! {
    /// Per issuing thread: decoded rows, stationary panels and the panel-major result.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// Per worker thread: the moving panel being multiplied (K x NR, stays in L1).
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Most logical rows an operand has: every partition, two per partition in double_row.
const MAX_ROWS: usize = 2 * crate::hw::PARTITIONS;

/// An operand's logical rows as byte slices, held on the stack (no allocation per matmul).
struct LogicalRows<'r> {
    rows: [&'r [u8]; MAX_ROWS],
    n: usize,
}

impl<'r> std::ops::Deref for LogicalRows<'r> {
    type Target = [&'r [u8]];
    fn deref(&self) -> &Self::Target {
        &self.rows[..self.n]
    }
}

/// The logical rows of `ap` (partition `r / groups`, part `r % groups`) as byte slices.
fn logical_rows<'r>(rows: &'r Rows, ap: &Ap, groups: usize) -> Result<LogicalRows<'r>> {
    let outside = || {
        fail(
            Internal,
            "operand_row_outside_memory",
            "operand row outside memory",
        )
    };
    let n = ap.parts as usize * groups;
    if n > MAX_ROWS {
        return Err(outside());
    }
    let wb = ap.free_size() / groups * ap.dtype.size();
    let mut out = LogicalRows {
        rows: [&[]; MAX_ROWS],
        n,
    };
    for (r, o) in out.rows[..n].iter_mut().enumerate() {
        *o = rows
            .row(r / groups)?
            .get((r % groups) * wb..(r % groups + 1) * wb)
            .ok_or_else(outside)?;
    }
    Ok(out)
}

/// Columns `j0..j0 + pw` of the row-major `[rows][w]` buffer into `dst` (`[rows][pw]`),
/// zero-padded: one panel. Full panels of the SIMD widths copy as fixed-size arrays (inline
/// moves instead of a memcpy call per 128-byte row).
fn pack_panel(src: &[f32], w: usize, j0: usize, pw: usize, dst: &mut [f32]) {
    let len = pw.min(w.saturating_sub(j0));
    match (pw, len == pw) {
        (32, true) => pack_full::<32>(src, w, j0, dst),
        (16, true) => pack_full::<16>(src, w, j0, dst),
        (8, true) => pack_full::<8>(src, w, j0, dst),
        _ => {
            for (row, out) in src
                .chunks_exact(w.max(1))
                .zip(dst.chunks_exact_mut(pw.max(1)))
            {
                out[..len].copy_from_slice(&row[j0..j0 + len]);
                out[len..].fill(0.0);
            }
        }
    }
}

fn pack_full<const PW: usize>(src: &[f32], w: usize, j0: usize, dst: &mut [f32]) {
    let (panel, _) = dst.as_chunks_mut::<PW>();
    for (row, out) in src.chunks_exact(w.max(1)).zip(panel) {
        if let Some(seg) = row
            .get(j0..j0 + PW)
            .and_then(|s| <&[f32; PW]>::try_from(s).ok())
        {
            *out = *seg;
        }
    }
}

/// The `[M, N]` column sums of one matmul, held in this thread's scratch (given back when
/// dropped, so the buffers are reused by the next instruction).
pub struct Product {
    s: Scratch,
    m: usize,
    n: usize,
    nr: usize,
    work: usize,
}

impl Product {
    /// The result in the gemm's panel-major layout, for the PSUM write.
    pub fn acc(&self) -> Acc<'_> {
        Acc {
            data: &self.s.out,
            m: self.m,
            n: self.n,
            nr: self.nr,
            work: self.work,
        }
    }
}

impl Drop for Product {
    fn drop(&mut self) {
        let s = std::mem::take(&mut self.s);
        SCRATCH.with(|c| c.replace(s));
    }
}

/// `acc[m, n] = fma-chain over logical rows` of stationary `[K, groups*M]` and moving
/// `[K, groups*N]` (logical row `groups*k + l`), read from `mems`.
pub fn matmul(mems: &Mems, st: &Ap, mv: &Ap, groups: usize) -> Result<Product> {
    let path = simd::path();
    let nr = blocking(path).nr;
    // The scratch leaves the thread-local while in use (the engine writes PSUM from it).
    let mut s = SCRATCH.with(|c| c.take());
    let (m, n) = (st.free_size() / groups, mv.free_size() / groups);
    let r = compute(path, mems, st, mv, groups, &mut s);
    let prod = Product {
        s,
        m,
        n,
        nr,
        work: 2 * st.parts as usize * groups * m * n,
    };
    r.map(|()| prod)
}

/// The shape and blocking of one matmul.
#[derive(Clone, Copy)]
struct Dims {
    k: usize,
    m: usize,
    n: usize,
    mr: usize,
    nr: usize,
    work: usize,
}

impl Dims {
    fn new(path: simd::Path, st: &Ap, mv: &Ap, groups: usize) -> Self {
        let Blocking { mr, nr } = blocking(path);
        let (k, m, n) = (
            st.parts as usize * groups,
            st.free_size() / groups,
            mv.free_size() / groups,
        );
        Dims {
            k,
            m,
            n,
            mr,
            nr,
            work: 2 * k * m * n,
        }
    }
}

/// Packs the stationary operand, then runs column panels of the moving operand in parallel:
/// each task decodes its `K x NR` panel and multiplies every row block against it, writing
/// `s.out` in panel-major layout `[N / NR][M][NR]`.
fn compute(
    path: simd::Path,
    mems: &Mems,
    st: &Ap,
    mv: &Ap,
    groups: usize,
    s: &mut Scratch,
) -> Result<()> {
    let d = Dims::new(path, st, mv, groups);
    prepare(mems, st, groups, &d, s)?;
    let mrows = Rows::new(mems, mv);
    let mrows = logical_rows(&mrows, mv, groups)?;
    let (
        Dims {
            k, m, n, mr, nr, ..
        },
        mb,
    ) = (d, d.m.div_ceil(d.mr));
    let moving = (&*mrows, mv.dtype);
    let a = &s.a[..mb * k * mr];
    grow(&mut s.out, n.div_ceil(nr) * m * nr);
    let nb = n.div_ceil(nr);
    par::for_each_chunk_mut(&mut s.out[..nb * m * nr], m * nr, d.work, |jb, out| {
        column_panel(path, &d, a, moving, jb, |ib, rows_here, tile| {
            out[ib * mr * nr..(ib * mr + rows_here) * nr].copy_from_slice(&tile[..rows_here * nr]);
        })
    });
    Ok(())
}

/// `nc_matmul` straight into an fp32 PSUM tile: true when done (the microkernel tiles copied
/// or added into `dst`'s rows as they come, kernels/psum.rs `TileSink`), false (nothing
/// written) when the write needs the staged result (`matmul` + the engine's write): another
/// layout, `accumulate=None`, a moving operand that is not dense SBUF rows, or a matmul large
/// enough to split across host threads (whose column panels would share PSUM rows). The same
/// bits either way.
pub fn matmul_in_place(
    mems: &mut Mems,
    words: &mut [u64],
    (st, mv, groups): (&Ap, &Ap, usize),
    dst: &Ap,
    mode: Option<bool>,
) -> Result<bool> {
    let path = simd::path();
    let d = Dims::new(path, st, mv, groups);
    let nb = d.n.div_ceil(d.nr);
    if mode.is_none()
        || super::psum::layout(dst) != Layout::F32Rows
        || par::would_split(nb, d.work)
        || Rows::direct(mems.sbuf, mv).is_none()
    {
        return Ok(false);
    }
    SCRATCH.with(|c| {
        let Ok(mut s) = c.try_borrow_mut() else {
            return Ok(false);
        };
        let s = &mut *s;
        prepare(mems, st, groups, &d, s)?;
        // the operands are SBUF, the result PSUM: read one while writing the other
        let Some(mrows) = Rows::direct(&*mems.sbuf, mv) else {
            return Ok(false);
        };
        let mrows = logical_rows(&mrows, mv, groups)?;
        let Some(mut sink) = super::psum::tile_sink(mode, &mut *mems.psum, words, dst) else {
            return Ok(false);
        };
        let (Dims { k, n, mr, nr, .. }, mb) = (d, d.m.div_ceil(d.mr));
        let a = &s.a[..mb * k * mr];
        for jb in 0..nb {
            let cols = nr.min(n - jb * nr);
            column_panel(
                path,
                &d,
                a,
                (&mrows, mv.dtype),
                jb,
                |ib, rows_here, tile| sink.put((ib * mr, rows_here), (jb * nr, cols), tile, nr),
            );
        }
        Ok(true)
    })
}

/// The stationary operand's row panels into `s.a`: decoded straight into them in one pass
/// (kernels/decode.rs `decode_panels`), or (other panel widths) its rows decoded into
/// `s.rows` (`[K][M]`, a row ahead prefetched) and then packed: two parallel passes.
fn prepare(mems: &Mems, st: &Ap, groups: usize, d: &Dims, s: &mut Scratch) -> Result<()> {
    let (k, m, mr) = (d.k, d.m, d.mr);
    let mb = m.div_ceil(mr);
    let srows = Rows::new(mems, st);
    let srows = logical_rows(&srows, st, groups)?;
    grow(&mut s.a, mb * k * mr);
    if decode_panels(st.dtype, &srows, m, mr, &mut s.a[..mb * k * mr]) {
        return Ok(());
    }
    grow(&mut s.rows, k * m);
    let dt = st.dtype;
    par::for_each_chunk_mut(&mut s.rows[..k * m], m, d.work, |r, out| {
        if let Some(next) = srows.get(r + 1) {
            simd::prefetch(next);
        }
        if let Some(row) = srows.get(r) {
            decode_into(dt, row, out);
        }
    });
    let arows = &s.rows[..k * m];
    grow(&mut s.a, mb * k * mr);
    par::for_each_chunk_mut(&mut s.a[..mb * k * mr], k * mr, d.work, |ib, panel| {
        pack_panel(arows, m, ib * mr, mr, panel)
    });
    Ok(())
}

/// Column panel `jb`: decode its `K x NR` moving panel straight from the operand's rows into
/// this thread's `PANEL` (it stays in L1; the next panel's bytes prefetched) and run every
/// row block against it, handing each tile to `emit(ib, rows, tile)` (`tile` row-major
/// `[MR][NR]`, its first `rows` rows real).
fn column_panel(
    path: simd::Path,
    d: &Dims,
    a: &[f32],
    (rows, dt): (&[&[u8]], DType),
    jb: usize,
    mut emit: impl FnMut(usize, usize, &[f32]),
) {
    let Dims {
        k, m, n, mr, nr, ..
    } = *d;
    PANEL.with(|p| {
        let mut p = p.borrow_mut();
        grow(&mut p, k * nr);
        let panel = &mut p[..k * nr];
        let j0 = jb * nr;
        decode_panel(dt, &rows[..k], (j0, nr.min(n - j0)), panel, nr);
        let mut tile = [0f32; MAX_TILE];
        for ib in 0..m.div_ceil(mr) {
            micro(
                path,
                k,
                &a[ib * k * mr..(ib + 1) * k * mr],
                panel,
                &mut tile[..mr * nr],
            );
            emit(ib, mr.min(m - ib * mr), &tile[..mr * nr]);
        }
    })
}
