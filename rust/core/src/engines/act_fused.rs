//! ScalarE `activation` from fp32 source rows straight into the destination, one pass per row
//! (`rows::fused_dense`; bf16 and other unpacked sources too when the rows split over the host
//! threads, each row decoded into fp32 first): the function reads the source bytes (the fast kernels of
//! kernels/exp.rs with the affine step in their loop; other functions after a decode of the
//! row), its fp32 results land in a small per-thread buffer, which is encoded into dst (any
//! unpacked dtype, with the context's rounder and the row-major element index, as
//! `rows::map_f32` does) and, for the register reductions, summed. No decode into scratch
//! blocks, no copy of the inputs, no whole-tile buffers.
//!
//! Same bits as the block paths (scalar.rs `activate_streamed`, act_stream.rs): per element the
//! same fp32 affine step and the same function (`act::apply_affine_slice`'s contract), the same
//! encoder per element, and each register adds its row's fp32 results in free-index order.
//! `GROUP` rows' results are kept so their add chains advance together.

use super::{act, act_simple, rows, Ctx};
use crate::isa::{ActFn, DType};
use crate::kernels::{exp, rowsum};
use crate::memory::Ap;
use crate::numerics::bulk::{decode_runs, encode_runs, Grid, Runs};
use std::cell::RefCell;
use std::sync::Mutex;

/// Rows whose register sums advance together (independent fp32 add chains).
const GROUP: usize = rowsum::ROWS;

thread_local! {
    static ROWS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A non-fp32 source row decoded into fp32, and those values' bytes (`with_f32_row`).
    static SRC: RefCell<(Vec<f32>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Row `x` of `dt` decoded into `buf`'s first `w` values (exact: every unpacked dtype widens
/// into fp32 without rounding), handed to `f` as fp32 bytes; fp32 rows as they are.
fn with_f32_row<R>(dt: DType, x: &[u8], w: usize, f: impl FnOnce(&[u8]) -> R) -> R {
    if dt == DType::Float32 {
        return f(x);
    }
    SRC.with(|cell| {
        let (vals, bytes) = &mut *cell.borrow_mut();
        vals.resize(w, 0.0);
        bytes.resize(4 * w, 0);
        let grid = Grid {
            off: 0,
            stride: x.len(),
            n: w,
            rows: 1,
            idx: 0,
            idx_step: 0,
        };
        decode_runs(dt, x, Runs::Grid(grid), vals);
        for (b, v) in bytes.chunks_exact_mut(4).zip(vals.iter()) {
            b.copy_from_slice(&v.to_le_bytes());
        }
        f(bytes)
    })
}

/// `dst = f(src * scale + bias)` row by row for an fp32 `src` (another unpacked dtype, such as
/// bf16, is decoded into fp32 per row, exactly, when the rows split) with dense rows of at least
/// `act::SHORT_ROW` elements (shorter ones are batched better by the block paths); with `sums`
/// (one per row) each row's fp32 results are added to its entry in order. False (nothing done)
/// when not applicable: a packed source or destination, a non-fp32 source whose rows would not
/// split over the host threads, patterns `fused_dense` refuses.
pub fn activate(
    ctx: &mut Ctx,
    f: ActFn,
    (dst, src): (&Ap, &Ap),
    (scale, bias): (&[f32], &[f32]),
    sums: Option<&mut [f32]>,
) -> bool {
    let w = src.free_size();
    if src.dtype.is_packed() || dst.dtype.is_packed() || w < act::SHORT_ROW {
        return false;
    }
    let (parts, dt, rounder, sdt) = (src.parts as usize, dst.dtype, ctx.rounder, src.dtype);
    let (fast, simple) = (act::fast_kernel(f), act_simple::kernel(f));
    // row r's fp32 results into `row` from its fp32 source bytes `x`
    let f32_row = |r: usize, x: &[u8], row: &mut [f32]| {
        let (s, b) = (scale[r], bias[r]);
        match (fast, simple) {
            (Some(kern), _) => {
                exp::map_affine_into(kern, x, row, (s, b), |t| act::apply_checked(f, t, 0.0));
            }
            // copy / bypass return their input (`apply_checked`): the affine step is the
            // whole function, done in the decode pass (the same two fp32 roundings)
            (None, _) if matches!(f, ActFn::Copy | ActFn::Bypass) => {
                for (v, e) in row.iter_mut().zip(x.chunks_exact(4)) {
                    *v = f32::from_le_bytes([e[0], e[1], e[2], e[3]]) * s + b;
                }
            }
            (None, Some(k)) => act_simple::map_affine_into(k, x, row, (s, b)),
            (None, None) => {
                for (v, e) in row.iter_mut().zip(x.chunks_exact(4)) {
                    *v = f32::from_le_bytes([e[0], e[1], e[2], e[3]]);
                }
                act::apply_affine_slice(f, row, s, b);
            }
        }
    };
    // row r's fp32 results into `row` (a non-fp32 source row decoded first), encoded into its
    // destination bytes `out`
    let one_row = |r: usize, x: &[u8], out: &mut [u8], row: &mut [f32]| {
        with_f32_row(sdt, x, w, |x| f32_row(r, x, row));
        let grid = Grid {
            off: 0,
            stride: out.len(),
            n: w,
            rows: 1,
            idx: (r * w) as u64,
            idx_step: w as u64,
        };
        encode_runs(&rounder, dt, out, Runs::Grid(grid), row);
    };
    // rows on the host threads when large (each row read, computed and encoded by one thread,
    // element index = row-major position, so the bits and the stochastic rounding do not
    // depend on the thread count); the larger of the function's cost (as scalar.rs's fp32
    // paths) and a streamed pass's per byte
    let per_elem = match (fast, simple) {
        _ if matches!(f, ActFn::Copy | ActFn::Bypass) => 1,
        (None, Some(_)) => 4,
        _ => 16,
    };
    let work = (parts * w)
        .saturating_mul(per_elem)
        .max((parts * w * dt.size()).saturating_mul(crate::par::STREAM_WORK_PER_BYTE));
    // a non-fp32 source (bf16) only when its rows split: on one thread the block paths
    // (scalar.rs, act_stream.rs) decode it in batches, with the same bits
    if sdt != DType::Float32 && !crate::par::would_split(parts, work) {
        return false;
    }
    let Some(sums) = sums else {
        return rows::fused_dense_par(ctx, dst, [src], work, |r, [x], out| {
            ROWS.with(|cell| {
                let mut buf = cell.borrow_mut();
                if buf.len() < w {
                    buf.resize(w, 0.0);
                }
                one_row(r, x, out, &mut buf[..w]);
            })
        });
    };
    // register sums: `GROUP` rows' add chains advance together, so rows go to the threads a
    // group at a time (the same groups, chains and bits as on one thread)
    let sums = Mutex::new(sums);
    rows::fused_dense_par_groups(ctx, dst, [src], work, GROUP, |r, [x], out| {
        ROWS.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < GROUP * w {
                buf.resize(GROUP * w, 0.0);
            }
            let k = r % GROUP;
            one_row(r, x, out, &mut buf[k * w..(k + 1) * w]);
            if k == GROUP - 1 || r + 1 == parts {
                let mut sums = sums.lock().unwrap_or_else(|e| e.into_inner());
                add_rows(&mut sums[r - k..=r], &buf[..(k + 1) * w], w);
            }
        })
    })
}

/// `sums[k] += rows[k * w + j]` for j in order, the rows' chains interleaved
/// (kernels/rowsum.rs for a whole group).
fn add_rows(sums: &mut [f32], rows: &[f32], w: usize) {
    if let Ok(s) = <&mut [f32; GROUP]>::try_from(&mut *sums) {
        rowsum::add_rows_16(s, rows, w);
        return;
    }
    let init = sums.to_vec();
    for (k, ak) in sums.iter_mut().enumerate() {
        for v in &rows[k * w..(k + 1) * w] {
            *ak += *v;
        }
    }
    rowsum::fix_nan_sums(sums, &init, rows, w);
}
