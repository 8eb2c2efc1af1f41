//! ScalarE `activation` / `activation_reduce` with the add reduction into the accumulator
//! registers, streamed: each block of rows is decoded into scratch, passed through the function
//! (`act::apply_affine_slice`), summed into the registers and encoded into dst, with no
//! whole-tile buffers (the materialising path in scalar.rs allocates, decodes, encodes and sums
//! the whole tile in separate passes). Same bits: the function is per element, each register
//! still adds its row's fp32 results in free-index order (blocks visit a row's columns in
//! order), and streaming is only used where `rows::map_f32` gives the materialising result.

use super::{act, rows, Ctx};
use crate::isa::instr::Scalar;
use crate::isa::{ActFn, ReduceCmd};
use crate::memory::Ap;
use std::cell::RefCell;

/// Rows whose sums advance together (independent fp32 add chains, as `scalar::accumulate`).
const GROUP: usize = 8;

/// `dst = f(src * scale + bias)` with the fp32 results summed into the registers of lanes
/// `src.start..` (`cmd` reduce or reset_reduce). False (nothing done) for other commands, when
/// the registers do not cover the lanes, when the materialising path would split the rows
/// across host threads (unless act_fused's one pass, which splits too, applies), or when the
/// patterns cannot stream.
pub fn activate_reduce(
    ctx: &mut Ctx,
    f: ActFn,
    (dst, src): (&Ap, &Ap),
    scale: Scalar,
    bias: Option<Scalar>,
    cmd: ReduceCmd,
) -> bool {
    let (base, parts, n) = (src.start as usize, src.parts as usize, src.free_size());
    let per_elem = if matches!(f, ActFn::Copy | ActFn::Bypass) {
        1
    } else {
        16
    };
    if !matches!(cmd, ReduceCmd::Reduce | ReduceCmd::ResetReduce)
        || base + parts > ctx.state.act_regs.len()
    {
        return false;
    }
    let split = crate::par::would_split(parts, n * per_elem * parts);
    let scale = ctx.scalar(scale, src.parts);
    let bias = ctx.scalar_or(bias, src.parts, 0.0);
    let mut sums = if cmd == ReduceCmd::Reduce {
        ctx.state.act_regs[base..base + parts].to_vec()
    } else {
        vec![0.0; parts]
    };
    // fp32 source rows: one pass from the source bytes (act_fused.rs; rows split over the host
    // threads in groups when large)
    if super::act_fused::activate(ctx, f, (dst, src), (&scale, &bias), Some(&mut sums)) {
        ctx.state.act_regs[base..base + parts].copy_from_slice(&sums);
        return true;
    }
    if split {
        return false; // the materialising path splits the function's rows
    }
    let sums = RefCell::new(sums);
    let streamed = rows::map_f32_grouped(ctx, dst, [src], GROUP, |r0, rows, _, w, [x], out| {
        let (s, b) = (&scale[r0..r0 + rows], &bias[r0..r0 + rows]);
        act::apply_affine_rows(f, x, out, w, s, b);
        add_rows(&mut sums.borrow_mut()[r0..r0 + rows], out, w);
    });
    if streamed {
        ctx.state.act_regs[base..base + parts].copy_from_slice(&sums.into_inner());
    }
    streamed
}

/// `sums[k] += out[k * w + j]` for j in order, `GROUP` rows at a time.
fn add_rows(sums: &mut [f32], out: &[f32], w: usize) {
    for (g, s) in sums.chunks_mut(GROUP).enumerate() {
        let rows = &out[g * GROUP * w..(g * GROUP + s.len()) * w];
        let init: [f32; GROUP] = std::array::from_fn(|k| s.get(k).copied().unwrap_or(0.0));
        add_group(s, rows, w);
        crate::kernels::rowsum::fix_nan_sums(s, &init, rows, w);
    }
}

/// One group's chains (`add_rows`).
fn add_group(s: &mut [f32], rows: &[f32], w: usize) {
    if s.len() == GROUP {
        let mut a = [0f32; GROUP];
        a.copy_from_slice(s);
        for j in 0..w {
            for (k, ak) in a.iter_mut().enumerate() {
                *ak += rows[k * w + j];
            }
        }
        s.copy_from_slice(&a);
    } else {
        for (k, ak) in s.iter_mut().enumerate() {
            for v in &rows[k * w..(k + 1) * w] {
                *ak += *v;
            }
        }
    }
}

/// `copy` / `bypass` from fp32 to fp32 over dense rows: `dst = src * scale + bias` in one pass
/// from the source bytes to the destination bytes (`rows::fused_dense`; the same fp32 multiply
/// and add as `act::apply_affine_slice`, whose copy returns its input unchanged; rows split over
/// the host threads as `rows::fused_dense_par`). False when not applicable.
pub fn copy_fused(
    ctx: &mut Ctx,
    f: ActFn,
    (dst, src): (&Ap, &Ap),
    scale: &[f32],
    bias: &[f32],
) -> bool {
    use crate::isa::DType::Float32;
    if !matches!(f, ActFn::Copy | ActFn::Bypass) || dst.dtype != Float32 || src.dtype != Float32 {
        return false;
    }
    // a streamed pass: rows on the host threads from 1 MiB written (`par::STREAM_WORK_PER_BYTE`)
    let work =
        (dst.parts as usize * dst.free_size() * 4).saturating_mul(crate::par::STREAM_WORK_PER_BYTE);
    rows::fused_dense_par(ctx, dst, [src], work, |r, [x], out| {
        let (s, b) = (scale[r], bias[r]);
        for (o, i) in out.chunks_exact_mut(4).zip(x.chunks_exact(4)) {
            let v = f32::from_le_bytes([i[0], i[1], i[2], i[3]]);
            o.copy_from_slice(&(v * s + b).to_le_bytes());
        }
    })
}
