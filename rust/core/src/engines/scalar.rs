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
use super::{check_column, same_shape, Ctx};
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::{activate2 as a2, activation as a, activation_reduce as ar};
use crate::isa::{ActFn, AluOp, Arg, DType, Engine, Instr, Opcode, ReduceCmd};
use crate::kernels::exp;
use crate::memory::Ap;

fn tensor<'a>(ins: &'a Instr, i: usize, name: &str) -> Result<&'a Ap> {
    ins.ap(i)
        .ok_or_else(|| err(Value, format!("{name} must be a tensor")).operand(name.to_string()))
}

fn act_fn(ins: &Instr, i: usize) -> Result<ActFn> {
    ins.enum_val(i)
        .and_then(ActFn::from_u8)
        .ok_or_else(|| err(Value, "op must be an activation function").operand("op"))
}

fn alu_op(ins: &Instr, i: usize) -> Option<AluOp> {
    ins.enum_val(i).and_then(AluOp::from_u8)
}

fn reduce_cmd(ins: &Instr, i: usize) -> ReduceCmd {
    ins.enum_val(i)
        .and_then(ReduceCmd::from_u8)
        .unwrap_or(ReduceCmd::Idle)
}

/// Rules shared by the three instructions: dst/data shapes, no packed dtypes, (P,1) columns.
fn check_data(ins: &Instr, dst: &Ap, src: &Ap) -> Result<()> {
    same_shape(dst, "dst", src, "data")?;
    for (ap, n) in [(dst, "dst"), (src, "data")] {
        if ap.dtype.is_packed() {
            return Err(err(
                Dtype,
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

fn check_bias(ins: &Instr, i: usize, parts: u32) -> Result<()> {
    check_column(ins.arg(i), "bias", parts)?;
    if let Arg::Tensor(ap) = ins.arg(i) {
        if ap.dtype == DType::Tfloat32 {
            return Err(err(Dtype, "bias may be any dtype except tfloat32").operand("bias"));
        }
    }
    Ok(())
}

fn check_reduce_res(ins: &Instr, i: usize, parts: u32) -> Result<()> {
    if let Arg::Tensor(ap) = ins.arg(i) {
        if ap.parts != parts || ap.free_size() != 1 {
            return Err(err(
                Shape,
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
        return Err(err(
            Value,
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
        for &v in &out[r * n..(r + 1) * n] {
            acc = alu::apply(op, acc, v);
        }
        *reg = acc;
    }
}

/// Copy the registers of the data's lanes to a `(P, 1)` reduce_res (after dst is written, so a
/// reduce_res aliasing dst ends up holding the register values).
fn read_out(ctx: &mut Ctx, res: &Arg, base: usize, parts: usize) {
    if let Arg::Tensor(res) = res {
        let vals: Vec<f32> = (0..parts)
            .map(|r| ctx.state.act_regs.get(base + r).copied().unwrap_or(0.0))
            .collect();
        ctx.write_f32(res, &vals);
    }
}

/// `out = f(data * scale + bias)` for every element, fp32.
fn activate(ctx: &Ctx, f: ActFn, src: &Ap, scale: &Arg, bias: &Arg) -> (Vec<f32>, usize) {
    let n = src.free_size();
    let scale = ctx.per_partition(scale, src.parts, 1.0);
    let bias = ctx.per_partition(bias, src.parts, 0.0);
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
fn activate_streamed(ctx: &mut Ctx, f: ActFn, dst: &Ap, src: &Ap, scale: &Arg, bias: &Arg) -> bool {
    let scale = ctx.per_partition(scale, src.parts, 1.0);
    let bias = ctx.per_partition(bias, src.parts, 0.0);
    super::rows::map_f32(ctx, dst, [src], |r0, _, _, w, [x], out| {
        out.copy_from_slice(x);
        for (k, row) in out.chunks_exact_mut(w.max(1)).enumerate() {
            act::apply_affine_slice(f, row, scale[r0 + k], bias[r0 + k]);
        }
    })
}

// ------------------------------------------------------------------------------------ activation

pub fn check_activation(ins: &Instr) -> Result<()> {
    let dst = tensor(ins, a::DST, "dst")?;
    let src = tensor(ins, a::DATA, "data")?;
    check_data(ins, dst, src)?;
    check_no_prelu(act_fn(ins, a::OP)?)?;
    check_bias(ins, a::BIAS, src.parts)?;
    check_column(ins.arg(a::SCALE), "scale", src.parts)?;
    check_reduce_res(ins, a::REDUCE_RES, src.parts)?;
    if let Some(op) = ins.enum_val(a::REDUCE_OP) {
        if op != AluOp::Add as u8 {
            return Err(err(
                Value,
                "activation reduces with add only (the reduce registers can only sum; use activate2 for max/min)",
            )
            .operand("reduce_op"));
        }
    }
    if reduce_cmd(ins, a::REDUCE_CMD) == ReduceCmd::LoadReduce {
        return Err(
            err(Value, "activation does not take reduce_cmd=load_reduce").operand("reduce_cmd"),
        );
    }
    if ins.engine == Engine::Gpsimd {
        let uses_regs = reduce_cmd(ins, a::REDUCE_CMD) != ReduceCmd::Idle
            || !matches!(ins.arg(a::REDUCE_RES), Arg::Absent)
            || !matches!(ins.arg(a::REDUCE_OP), Arg::Absent);
        if uses_regs {
            return Err(err(
                Value,
                "the accumulator registers exist only on ScalarE: activation on GpSimd takes reduce_cmd=idle and no reduce_op / reduce_res",
            )
            .operand("reduce_cmd"));
        }
    }
    Ok(())
}

pub fn activation(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = tensor(ins, a::DST, "dst")?;
    let src = tensor(ins, a::DATA, "data")?;
    let f = act_fn(ins, a::OP)?;
    let cmd = reduce_cmd(ins, a::REDUCE_CMD);
    if cmd == ReduceCmd::Idle
        && matches!(ins.arg(a::REDUCE_RES), Arg::Absent)
        && activate_streamed(ctx, f, dst, src, ins.arg(a::SCALE), ins.arg(a::BIAS))
    {
        return Ok(());
    }
    let (out, n) = activate(ctx, f, src, ins.arg(a::SCALE), ins.arg(a::BIAS));
    ctx.write_f32(dst, &out);
    let base = src.start as usize;
    accumulate(ctx, base, &out, n, cmd, AluOp::Add);
    read_out(ctx, ins.arg(a::REDUCE_RES), base, src.parts as usize);
    Ok(())
}

// ----------------------------------------------------------------------------- activation_reduce

pub fn check_activation_reduce(ins: &Instr) -> Result<()> {
    let dst = tensor(ins, ar::DST, "dst")?;
    let src = tensor(ins, ar::DATA, "data")?;
    check_data(ins, dst, src)?;
    check_no_prelu(act_fn(ins, ar::OP)?)?;
    check_bias(ins, ar::BIAS, src.parts)?;
    check_column(ins.arg(ar::SCALE), "scale", src.parts)?;
    tensor(ins, ar::REDUCE_RES, "reduce_res")?;
    check_reduce_res(ins, ar::REDUCE_RES, src.parts)?;
    if alu_op(ins, ar::REDUCE_OP) != Some(AluOp::Add) {
        return Err(err(
            Value,
            "activation_reduce reduces with add only (the reduce registers can only sum; use activate2 for max/min)",
        )
        .operand("reduce_op"));
    }
    Ok(())
}

/// = activation(..., reduce_cmd=reset_reduce, reduce_res).
pub fn activation_reduce(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = tensor(ins, ar::DST, "dst")?;
    let src = tensor(ins, ar::DATA, "data")?;
    let f = act_fn(ins, ar::OP)?;
    let (out, n) = activate(ctx, f, src, ins.arg(ar::SCALE), ins.arg(ar::BIAS));
    ctx.write_f32(dst, &out);
    let base = src.start as usize;
    accumulate(ctx, base, &out, n, ReduceCmd::ResetReduce, AluOp::Add);
    read_out(ctx, ins.arg(ar::REDUCE_RES), base, src.parts as usize);
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

pub fn check_activate2(ins: &Instr) -> Result<()> {
    let dst = tensor(ins, a2::DST, "dst")?;
    let src = tensor(ins, a2::DATA, "data")?;
    check_data(ins, dst, src)?;
    act_fn(ins, a2::OP)?;
    for (i, n) in [
        (a2::IMM0, "imm0"),
        (a2::IMM1, "imm1"),
        (a2::RELU_PARAM, "relu_param"),
    ] {
        check_column(ins.arg(i), n, src.parts)?;
    }
    if let (Arg::Tensor(t0), Arg::Tensor(t1)) = (ins.arg(a2::IMM0), ins.arg(a2::IMM1)) {
        if t0.dtype != t1.dtype {
            return Err(err(
                Dtype,
                format!(
                    "imm0 and imm1 tiles must have the same dtype ({} vs {})",
                    t0.dtype.name(),
                    t1.dtype.name()
                ),
            )
            .operand("imm1"));
        }
    }
    let op0 = alu_op(ins, a2::OP0).unwrap_or(AluOp::Bypass);
    let op1 = alu_op(ins, a2::OP1).unwrap_or(AluOp::Bypass);
    if !ACTIVATE2_PAIRS.contains(&(op0, op1)) {
        return Err(err(
            Value,
            format!(
                "activate2 does not support (op0, op1) = ({}, {}); allowed: (multiply, add), (multiply, subtract), \
                 (multiply, bypass), (add, bypass), (subtract, bypass), (bypass, bypass)",
                op0.name(),
                op1.name()
            ),
        )
        .operand("op0"));
    }
    check_reduce_res(ins, a2::REDUCE_RES, src.parts)?;
    let cmd = reduce_cmd(ins, a2::REDUCE_CMD);
    match alu_op(ins, a2::REDUCE_OP) {
        Some(op) if !ACTIVATE2_REDUCE.contains(&op) => {
            return Err(err(
                Value,
                format!(
                    "activate2 reduce_op must be add, maximum, minimum, abs_max or abs_min, got {}",
                    op.name()
                ),
            )
            .operand("reduce_op"))
        }
        None if cmd != ReduceCmd::Idle => {
            return Err(err(
                Value,
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
        return Err(
            err(Value, "activate2 does not take reduce_cmd=load_reduce").operand("reduce_cmd")
        );
    }
    Ok(())
}

pub fn activate2(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = tensor(ins, a2::DST, "dst")?;
    let src = tensor(ins, a2::DATA, "data")?;
    let f = act_fn(ins, a2::OP)?;
    let op0 = alu_op(ins, a2::OP0).unwrap_or(AluOp::Bypass);
    let op1 = alu_op(ins, a2::OP1).unwrap_or(AluOp::Bypass);
    let (rev0, rev1) = (
        ins.bool_or(a2::REVERSE0, false),
        ins.bool_or(a2::REVERSE1, false),
    );
    let parts = src.parts;
    let n = src.free_size();
    let imm0 = ctx.per_partition(ins.arg(a2::IMM0), parts, 0.0);
    let imm1 = ctx.per_partition(ins.arg(a2::IMM1), parts, 0.0);
    let alpha = ctx.per_partition(ins.arg(a2::RELU_PARAM), parts, 0.0);
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
    let rop = alu_op(ins, a2::REDUCE_OP).unwrap_or(AluOp::Add);
    accumulate(ctx, base, &out, n, reduce_cmd(ins, a2::REDUCE_CMD), rop);
    read_out(ctx, ins.arg(a2::REDUCE_RES), base, parts as usize);
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[
        Opcode::Activation,
        Opcode::ActivationReduce,
        Opcode::Activate2,
    ],
    check,
    exec,
};

fn check(ins: &Instr) -> Result<()> {
    match ins.op {
        Opcode::Activation => check_activation(ins),
        Opcode::ActivationReduce => check_activation_reduce(ins),
        Opcode::Activate2 => check_activate2(ins),
        _ => Ok(()),
    }
}

fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    match ins.op {
        Opcode::Activation => activation(ins, ctx),
        Opcode::ActivationReduce => activation_reduce(ins, ctx),
        Opcode::Activate2 => activate2(ins, ctx),
        _ => Err(err(
            Internal,
            format!("{} is listed but not dispatched", ins.op.spec().name),
        )),
    }
}

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::Activation<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::ActivationReduce<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::Activate2<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
