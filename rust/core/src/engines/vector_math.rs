//! VectorE elementwise math beyond tensor_tensor / tensor_scalar: scalar_tensor_tensor,
//! exponential (with its running sum in the VectorE accumulators) and reciprocal.

use super::alu::apply;
use super::vector_acc as acc;
use super::vector_rules::{alu_req, arithmetic, max_free_dims, not_both_psum};
use super::{check_column, same_shape, Ctx};
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::{exponential as ex, reciprocal as rc, scalar_tensor_tensor as stt};
use crate::isa::{AluOp, Instr, Opcode, ReduceCmd};
use crate::kernels::exp::exp_map;

pub fn check_scalar_tensor_tensor(ins: &Instr) -> Result<()> {
    let dst = ins.ap(stt::DST).unwrap();
    let data = ins.ap(stt::DATA).unwrap();
    let o1 = ins.ap(stt::OPERAND1).unwrap();
    same_shape(data, "data", dst, "dst")?;
    same_shape(data, "data", o1, "operand1")?;
    not_both_psum(data, "data", o1, "operand1")?;
    check_column(ins.arg(stt::OPERAND0), "operand0", data.parts)?;
    arithmetic(alu_req(ins, stt::OP0, "op0")?, "op0", true)?;
    arithmetic(alu_req(ins, stt::OP1, "op1")?, "op1", true)?;
    Ok(())
}

/// t = op0(data, operand0) (reverse0: op0(operand0, data)); dst = op1(t, operand1)
/// (reverse1: op1(operand1, t)); fp32.
pub fn scalar_tensor_tensor(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(stt::DST).unwrap();
    let data = ins.ap(stt::DATA).unwrap();
    let o1 = ins.ap(stt::OPERAND1).unwrap();
    let op0 = alu_req(ins, stt::OP0, "op0")?;
    let op1 = alu_req(ins, stt::OP1, "op1")?;
    let rev0 = ins.bool_or(stt::REVERSE0, false);
    let rev1 = ins.bool_or(stt::REVERSE1, false);
    let n = data.free_size().max(1);
    let c0 = ctx.per_partition(ins.arg(stt::OPERAND0), data.parts, 0.0);
    let x = ctx.read_f32(data);
    let y = ctx.read_f32(o1);
    let out: Vec<f32> = x
        .iter()
        .zip(&y)
        .enumerate()
        .map(|(i, (x, y))| {
            let k = c0[i / n];
            let t = if rev0 {
                apply(op0, k, *x)
            } else {
                apply(op0, *x, k)
            };
            if rev1 {
                apply(op1, *y, t)
            } else {
                apply(op1, t, *y)
            }
        })
        .collect();
    ctx.write_f32(dst, &out);
    Ok(())
}

pub fn check_exponential(ins: &Instr) -> Result<()> {
    let dst = ins.ap(ex::DST).unwrap();
    let src = ins.ap(ex::SRC).unwrap();
    same_shape(src, "src", dst, "dst")?;
    max_free_dims(src, "src", 3)?;
    max_free_dims(dst, "dst", 3)?;
    check_column(ins.arg(ex::MAX_VALUE), "max_value", src.parts)?;
    check_column(ins.arg(ex::REDUCE_RES), "reduce_res", src.parts)?;
    check_column(ins.arg(ex::REDUCE_INIT), "reduce_init", src.parts)?;
    if acc::reduce_cmd(ins, ex::REDUCE_CMD) != ReduceCmd::LoadReduce {
        if let Some(v) = ins.arg(ex::REDUCE_INIT).imm_f32() {
            if v != 0.0 {
                return Err(err(
                    Value,
                    format!("reduce_init ({v}) is only used by reduce_cmd=load_reduce and must otherwise be 0.0"),
                )
                .operand("reduce_init"));
            }
        }
    }
    Ok(())
}

/// dst = exp(src - max_value): the subtraction in fp32, exp evaluated in f64 and rounded once to
/// fp32 (the hardware's approximation is not public), cast to dst. The accumulator sums the
/// fp32 values before the dst cast (reference §6.5 leaves this open).
pub fn exponential(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(ex::DST).unwrap();
    let src = ins.ap(ex::SRC).unwrap();
    let (p, n) = (src.parts as usize, src.free_size());
    let m = ctx.per_partition(ins.arg(ex::MAX_VALUE), src.parts, 0.0);
    let init = ctx.per_partition(ins.arg(ex::REDUCE_INIT), src.parts, 0.0);
    let mut out = ctx.read_f32(src);
    for (row, m) in out.chunks_mut(n.max(1)).zip(&m) {
        // vectorised, bit-identical to `((x - m) as f64).exp() as f32` (kernels/exp.rs)
        exp_map(row, |x| x - *m, |x| (x as f64).exp() as f32);
    }
    ctx.write_f32(dst, &out);
    let base = src.start as usize;
    let cmd = acc::reduce_cmd(ins, ex::REDUCE_CMD);
    acc::run(ctx, base, cmd, AluOp::Add, &init, &out, n);
    acc::read_out(ctx, ins.arg(ex::REDUCE_RES), base, p, false);
    Ok(())
}

pub fn check_reciprocal(ins: &Instr) -> Result<()> {
    same_shape(
        ins.ap(rc::DATA).unwrap(),
        "data",
        ins.ap(rc::DST).unwrap(),
        "dst",
    )
}

/// dst = cast(1 / fp32(data)), the correctly rounded IEEE fp32 division.
pub fn reciprocal(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(rc::DST).unwrap();
    let data = ins.ap(rc::DATA).unwrap();
    let out: Vec<f32> = ctx.read_f32(data).iter().map(|v| 1.0 / v).collect();
    ctx.write_f32(dst, &out);
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[
        Opcode::ScalarTensorTensor,
        Opcode::Exponential,
        Opcode::Reciprocal,
    ],
    check: |ins| match ins.op {
        Opcode::ScalarTensorTensor => check_scalar_tensor_tensor(ins),
        Opcode::Exponential => check_exponential(ins),
        _ => check_reciprocal(ins),
    },
    exec: |ins, ctx| match ins.op {
        Opcode::ScalarTensorTensor => scalar_tensor_tensor(ins, ctx),
        Opcode::Exponential => exponential(ins, ctx),
        _ => reciprocal(ins, ctx),
    },
};

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::ScalarTensorTensor<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::Exponential<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::Reciprocal<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
