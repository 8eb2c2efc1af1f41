//! ScalarE: `activation`, `activation_reduce` and `activate2`, which share the 128 per-lane
//! accumulator registers (`reduce_regs`, reference §2.5). `activation` also runs on GpSimd (v4,
//! NKI 0.7), without the registers.
//!
//! All arithmetic is fp32; the function itself goes through `act::apply_checked` (f64 formula,
//! one rounding, NaN outside a restricted function's documented range). The registers accumulate
//! the fp32 function results (before the cast to dst), in free-index order — the reference leaves
//! both the order and the fp32-vs-rounded question open; this is the emulator's choice.

use super::act;
use super::alu;
use super::{check_column, same_shape, Ctx, Semantics, TileOperand};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::instr::Scalar;
use crate::isa::ops::{Activate2, Activation, ActivationReduce};
use crate::isa::{ActFn, AluOp, DType, Engine, Instr, ReduceCmd};
use crate::kernels::exp;
use crate::memory::Ap;

impl Semantics for Activation<'_> {
    fn check(&self) -> Result<()> {
        check_activation(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        activation(self, ctx)
    }
}

impl Semantics for ActivationReduce<'_> {
    fn check(&self) -> Result<()> {
        check_activation_reduce(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        activation_reduce(self, ctx)
    }
}

impl Semantics for Activate2<'_> {
    fn check(&self) -> Result<()> {
        check_activate2(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        activate2(self, ctx)
    }
}

/// Rules shared by the three instructions: dst/data shapes, no packed dtypes, (P,1) columns.
fn check_data(ins: &Instr, dst: &Ap, src: &Ap) -> Result<()> {
    same_shape(dst, "dst", src, "data")?;
    for (ap, n) in [(dst, "dst"), (src, "data")] {
        if ap.dtype.is_packed() {
            return Err(fail(
                Dtype,
                "packed_dtype_not_allowed",
                format!(
                    "{} cannot operate on packed MX dtype {}",
                    ins.op.spec().name,
                    ap.dtype.name()
                ),
            )
            .operand(n));
        }
    }
    Ok(())
}

fn check_bias(bias: Option<Scalar>, parts: u32) -> Result<()> {
    check_column(bias, "bias", parts)?;
    if let Some(ap) = bias.tile() {
        if ap.dtype == DType::Tfloat32 {
            return Err(fail(
                Dtype,
                "bias_dtype_tfloat32",
                "bias may be any dtype except tfloat32",
            )
            .operand("bias"));
        }
    }
    Ok(())
}

fn check_reduce_res(res: Option<&Ap>, parts: u32) -> Result<()> {
    if let Some(ap) = res {
        if ap.parts != parts || ap.free_size() != 1 {
            return Err(fail(
                Shape,
                "column_shape",
                format!(
                    "reduce_res must be a ({parts}, 1) tile, got {:?}",
                    ap.shape()
                ),
            )
            .operand("reduce_res"));
        }
    }
    Ok(())
}

/// prelu takes its slope from activate2's relu_param; activation has no such operand.
fn check_no_prelu(f: ActFn) -> Result<()> {
    if f == ActFn::Prelu {
        return Err(fail(
            Value,
            "prelu_needs_activate2",
            "prelu needs a slope (relu_param), which only activate2 takes",
        )
        .operand("op"));
    }
    Ok(())
}

/// Identity of a register reduction: what `reset` / `reset_reduce` load.
fn identity(op: AluOp) -> f32 {
    match op {
        AluOp::Maximum => f32::NEG_INFINITY,
        AluOp::Minimum | AluOp::AbsMin => f32::INFINITY,
        _ => 0.0,
    }
}

/// Apply `cmd` to the registers of lanes `base..base+p` with `op` over rows of `out` (n per row).
fn accumulate(ctx: &mut Ctx, base: usize, out: &[f32], n: usize, cmd: ReduceCmd, op: AluOp) {
    let p = out.len().checked_div(n).unwrap_or(0);
    if op == AluOp::Add
        && matches!(cmd, ReduceCmd::Reduce | ReduceCmd::ResetReduce)
        && base + p <= ctx.state.act_regs.len()
    {
        // Eight lanes' sums advance together: each lane still adds in free-index order, but
        // the eight dependency chains overlap instead of waiting on one fp32 add at a time.
        let regs = &mut ctx.state.act_regs[base..base + p];
        if cmd == ReduceCmd::ResetReduce {
            regs.fill(0.0);
        }
        for (g, accs) in regs.chunks_mut(8).enumerate() {
            let rows = &out[g * 8 * n..(g * 8 + accs.len()) * n];
            let mut a = [0f32; 8];
            a[..accs.len()].copy_from_slice(accs);
            let init = a;
            if accs.len() == 8 {
                for j in 0..n {
                    for (k, ak) in a.iter_mut().enumerate() {
                        *ak += rows[k * n + j];
                    }
                }
            } else {
                for (k, ak) in a.iter_mut().enumerate().take(accs.len()) {
                    for v in &rows[k * n..(k + 1) * n] {
                        *ak += *v;
                    }
                }
            }
            accs.copy_from_slice(&a[..accs.len()]);
            crate::kernels::rowsum::fix_nan_sums(accs, &init, rows, n);
        }
        return;
    }
    for r in 0..p {
        let Some(reg) = ctx.state.act_regs.get_mut(base + r) else {
            continue;
        };
        let mut acc = match cmd {
            ReduceCmd::Idle => continue,
            ReduceCmd::Reset => {
                *reg = identity(op);
                continue;
            }
            ReduceCmd::Reduce => *reg,
            ReduceCmd::ResetReduce | ReduceCmd::LoadReduce => identity(op),
        };
        let (init, row) = (acc, &out[r * n..(r + 1) * n]);
        for &v in row {
            acc = alu::apply(op, acc, v);
        }
        if op == AluOp::Add && acc.is_nan() {
            acc = crate::kernels::rowsum::sticky_nan_sum(init, row); // (one NaN rule on every path)
        }
        *reg = acc;
    }
}

/// Copy the registers of the data's lanes to a `(P, 1)` reduce_res (after dst is written, so a
/// reduce_res aliasing dst ends up holding the register values).
fn read_out(ctx: &mut Ctx, res: Option<&Ap>, base: usize, parts: usize) {
    if let Some(res) = res {
        let vals: Vec<f32> = (0..parts)
            .map(|r| ctx.state.act_regs.get(base + r).copied().unwrap_or(0.0))
            .collect();
        ctx.write_f32(res, &vals);
    }
}

/// `out = f(data * scale + bias)` for every element, fp32.
fn activate(
    ctx: &Ctx,
    f: ActFn,
    src: &Ap,
    scale: Scalar,
    bias: Option<Scalar>,
) -> (Vec<f32>, usize) {
    let n = src.free_size();
    let scale = ctx.scalar(scale, src.parts);
    let bias = ctx.scalar_or(bias, src.parts, 0.0);
    let mut x = ctx.read_f32(src);
    // Rows on host threads when configured (each row's bits do not depend on it).
    let per_elem = if matches!(f, ActFn::Copy | ActFn::Bypass) {
        1
    } else {
        16
    };
    crate::par::for_each_row(&mut x, n.max(1), n * per_elem, |r, row| {
        act::apply_affine_slice(f, row, scale[r], bias[r])
    });
    (x, n)
}

/// `activation` without register traffic, streamed block by block into dst; false when the
/// patterns need the materialising path.
fn activate_streamed(
    ctx: &mut Ctx,
    f: ActFn,
    dst: &Ap,
    src: &Ap,
    scale: Scalar,
    bias: Option<Scalar>,
) -> bool {
    let scale = ctx.scalar(scale, src.parts);
    let bias = ctx.scalar_or(bias, src.parts, 0.0);
    // fp32 in and out, dense rows (not short ones: those batch below), no overlap, a fast
    // kernel: one pass through memory.
    if let Some(k) = act::fast_kernel(f).filter(|_| {
        dst.dtype == DType::Float32
            && src.dtype == DType::Float32
            && src.free_size() >= act::SHORT_ROW
    }) {
        // rows split over the host threads when large: an element costs about as much as 16
        // multiply-adds of a matmul (the par threshold's unit)
        let work = (src.parts as usize * src.free_size()).saturating_mul(16);
        let (scale, bias) = (&scale, &bias);
        let fused = super::rows::fused_dense_par(ctx, dst, [src], work, |r, [x], out| {
            let (s, b) = (scale[r], bias[r]);
            exp::map_affine_bytes(k, x, out, (s, b), |x| act::apply_checked(f, x, 0.0));
        });
        if fused {
            return true;
        }
    }
    // the same for the functions with a vectorised form (act_simple.rs), a few operations per
    // element
    if let Some(k) = super::act_simple::kernel(f).filter(|_| {
        dst.dtype == DType::Float32
            && src.dtype == DType::Float32
            && src.free_size() >= act::SHORT_ROW
    }) {
        let work = (src.parts as usize * src.free_size()).saturating_mul(4);
        let (scale, bias) = (&scale, &bias);
        let fused = super::rows::fused_dense_par(ctx, dst, [src], work, |r, [x], out| {
            super::act_simple::map_affine_bytes(k, x, out, (scale[r], bias[r]));
        });
        if fused {
            return true;
        }
    }
    if super::act_stream::copy_fused(ctx, f, (dst, src), &scale, &bias)
        || super::act_fused::activate(ctx, f, (dst, src), (&scale, &bias), None)
    {
        return true;
    }
    super::rows::map_f32(ctx, dst, [src], |r0, rows, _, w, [x], out| {
        let (s, b) = (&scale[r0..r0 + rows], &bias[r0..r0 + rows]);
        act::apply_affine_rows(f, x, out, w, s, b);
    })
}

// ------------------------------------------------------------------------------------ activation

fn check_activation(v: &Activation) -> Result<()> {
    let (ins, dst, src) = (v.ins, v.dst, v.data);
    check_data(ins, dst, src)?;
    check_no_prelu(v.op)?;
    check_bias(v.bias, src.parts)?;
    check_column(v.scale, "scale", src.parts)?;
    check_reduce_res(v.reduce_res, src.parts)?;
    if let Some(op) = v.reduce_op {
        if op != AluOp::Add {
            return Err(fail(Value, "activation_reduce_op_add_only",
                "activation reduces with add only (the reduce registers can only sum; use activate2 for max/min)",
            )
            .operand("reduce_op"));
        }
    }
    if v.reduce_cmd == ReduceCmd::LoadReduce {
        return Err(fail(
            Value,
            "load_reduce_without_initial_value",
            "activation does not take reduce_cmd=load_reduce",
        )
        .operand("reduce_cmd"));
    }
    if ins.engine == Engine::Gpsimd {
        let uses_regs =
            v.reduce_cmd != ReduceCmd::Idle || v.reduce_res.is_some() || v.reduce_op.is_some();
        if uses_regs {
            return Err(fail(Value, "act_registers_scalar_only",
                "the accumulator registers exist only on ScalarE: activation on GpSimd takes reduce_cmd=idle and no reduce_op / reduce_res",
            )
            .operand("reduce_cmd"));
        }
    }
    Ok(())
}

fn activation(v: &Activation, ctx: &mut Ctx) -> Result<()> {
    let (dst, src, f, cmd) = (v.dst, v.data, v.op, v.reduce_cmd);
    if cmd == ReduceCmd::Idle
        && v.reduce_res.is_none()
        && activate_streamed(ctx, f, dst, src, v.scale, v.bias)
    {
        return Ok(());
    }
    let base = src.start as usize;
    if !super::act_stream::activate_reduce(ctx, f, (dst, src), v.scale, v.bias, cmd) {
        let (out, n) = activate(ctx, f, src, v.scale, v.bias);
        ctx.write_f32(dst, &out);
        accumulate(ctx, base, &out, n, cmd, AluOp::Add);
    }
    read_out(ctx, v.reduce_res, base, src.parts as usize);
    Ok(())
}

// ----------------------------------------------------------------------------- activation_reduce

fn check_activation_reduce(v: &ActivationReduce) -> Result<()> {
    let (ins, dst, src) = (v.ins, v.dst, v.data);
    check_data(ins, dst, src)?;
    check_no_prelu(v.op)?;
    check_bias(v.bias, src.parts)?;
    check_column(v.scale, "scale", src.parts)?;
    check_reduce_res(Some(v.reduce_res), src.parts)?;
    if v.reduce_op != AluOp::Add {
        return Err(fail(Value, "activation_reduce_op_add_only",
            "activation_reduce reduces with add only (the reduce registers can only sum; use activate2 for max/min)",
        )
        .operand("reduce_op"));
    }
    Ok(())
}

/// = activation(..., reduce_cmd=reset_reduce, reduce_res).
fn activation_reduce(v: &ActivationReduce, ctx: &mut Ctx) -> Result<()> {
    let (dst, src) = (v.dst, v.data);
    let base = src.start as usize;
    let cmd = ReduceCmd::ResetReduce;
    if !super::act_stream::activate_reduce(ctx, v.op, (dst, src), v.scale, v.bias, cmd) {
        let (out, n) = activate(ctx, v.op, src, v.scale, v.bias);
        ctx.write_f32(dst, &out);
        accumulate(ctx, base, &out, n, cmd, AluOp::Add);
    }
    read_out(ctx, Some(v.reduce_res), base, src.parts as usize);
    Ok(())
}

// ------------------------------------------------------------------------------------- activate2

/// The (op0, op1) pairs the ScalarE pre-activation stage accepts (reference §2.5).
const ACTIVATE2_PAIRS: &[(AluOp, AluOp)] = &[
    (AluOp::Multiply, AluOp::Add),
    (AluOp::Multiply, AluOp::Subtract),
    (AluOp::Multiply, AluOp::Bypass),
    (AluOp::Add, AluOp::Bypass),
    (AluOp::Subtract, AluOp::Bypass),
    (AluOp::Bypass, AluOp::Bypass),
];

const ACTIVATE2_REDUCE: &[AluOp] = &[
    AluOp::Add,
    AluOp::Maximum,
    AluOp::Minimum,
    AluOp::AbsMax,
    AluOp::AbsMin,
];

fn check_activate2(v: &Activate2) -> Result<()> {
    let (ins, dst, src) = (v.ins, v.dst, v.data);
    check_data(ins, dst, src)?;
    for (s, n) in [
        (v.imm0, "imm0"),
        (v.imm1, "imm1"),
        (v.relu_param, "relu_param"),
    ] {
        check_column(s, n, src.parts)?;
    }
    if let (Scalar::Tile(t0), Scalar::Tile(t1)) = (v.imm0, v.imm1) {
        if t0.dtype != t1.dtype {
            return Err(fail(
                Dtype,
                "activate2_imm_dtype_mismatch",
                format!(
                    "imm0 and imm1 tiles must have the same dtype ({} vs {})",
                    t0.dtype.name(),
                    t1.dtype.name()
                ),
            )
            .operand("imm1"));
        }
    }
    let (op0, op1) = (v.op0, v.op1);
    if !ACTIVATE2_PAIRS.contains(&(op0, op1)) {
        return Err(fail(Value, "activate2_op_pair",
            format!(
                "activate2 does not support (op0, op1) = ({}, {}); allowed: (multiply, add), (multiply, subtract), \
                 (multiply, bypass), (add, bypass), (subtract, bypass), (bypass, bypass)",
                op0.name(),
                op1.name()
            ),
        )
        .operand("op0"));
    }
    check_reduce_res(v.reduce_res, src.parts)?;
    let cmd = v.reduce_cmd;
    match v.reduce_op {
        Some(op) if !ACTIVATE2_REDUCE.contains(&op) => {
            return Err(fail(
                Value,
                "activate2_reduce_op",
                format!(
                    "activate2 reduce_op must be add, maximum, minimum, abs_max or abs_min, got {}",
                    op.name()
                ),
            )
            .operand("reduce_op"))
        }
        None if cmd != ReduceCmd::Idle => {
            return Err(fail(
                Value,
                "reduce_cmd_needs_reduce_op",
                format!(
                    "reduce_cmd={} needs a reduce_op (add, maximum, minimum, abs_max, abs_min)",
                    cmd.name()
                ),
            )
            .operand("reduce_op"))
        }
        _ => {}
    }
    if cmd == ReduceCmd::LoadReduce {
        return Err(fail(
            Value,
            "load_reduce_without_initial_value",
            "activate2 does not take reduce_cmd=load_reduce",
        )
        .operand("reduce_cmd"));
    }
    Ok(())
}

fn activate2(v: &Activate2, ctx: &mut Ctx) -> Result<()> {
    let (dst, src, f) = (v.dst, v.data, v.op);
    let (op0, op1, rev0, rev1) = (v.op0, v.op1, v.reverse0, v.reverse1);
    let parts = src.parts;
    let n = src.free_size();
    let imm0 = ctx.scalar(v.imm0, parts);
    let imm1 = ctx.scalar(v.imm1, parts);
    let alpha = ctx.scalar(v.relu_param, parts);
    let stage = |op: AluOp, rev: bool, v: f32, k: f32| -> f32 {
        match (op, rev) {
            (AluOp::Bypass, _) => v,
            (_, false) => alu::apply(op, v, k),
            (_, true) => alu::apply(op, k, v),
        }
    };
    let fast = act::fast_kernel(f);
    let mut out = ctx.read_f32(src);
    for (r, row) in out.chunks_mut(n.max(1)).enumerate() {
        if let Some(k) = fast {
            // the fast kernel (bit-identical to apply_checked, kernels/exp.rs)
            let pre = |v: f32| stage(op1, rev1, stage(op0, rev0, v, imm0[r]), imm1[r]);
            exp::map(k, row, pre, |t| act::apply_checked(f, t, 0.0));
            continue;
        }
        for v in row {
            let t = stage(op0, rev0, *v, imm0[r]);
            let t = stage(op1, rev1, t, imm1[r]);
            *v = act::apply_checked(f, t, alpha[r]);
        }
    }
    ctx.write_f32(dst, &out);
    let base = src.start as usize;
    let rop = v.reduce_op.unwrap_or(AluOp::Add);
    accumulate(ctx, base, &out, n, v.reduce_cmd, rop);
    read_out(ctx, v.reduce_res, base, parts as usize);
    Ok(())
}
