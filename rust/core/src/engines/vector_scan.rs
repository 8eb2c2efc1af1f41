//! VectorE scans along the flattened free dim of each partition: tensor_tensor_scan (a two-input
//! recurrence) and tensor_scalar_cumulative (an inclusive scan through the VectorE accumulators).

use super::alu::apply;
use super::vector_acc as acc;
use super::vector_rules::{alu_req, arithmetic, not_both_psum, one_of};
use super::{check_column, same_shape, Ctx};
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::{tensor_scalar_cumulative as tsc, tensor_tensor_scan as tts};
use crate::isa::{AluOp, Arg, Instr, Opcode, ReduceCmd};

pub fn check_tensor_tensor_scan(ins: &Instr) -> Result<()> {
    let dst = ins.ap(tts::DST).unwrap();
    let d0 = ins.ap(tts::DATA0).unwrap();
    let d1 = ins.ap(tts::DATA1).unwrap();
    same_shape(d0, "data0", d1, "data1")?;
    same_shape(d0, "data0", dst, "dst")?;
    not_both_psum(d0, "data0", d1, "data1")?;
    check_column(ins.arg(tts::INITIAL), "initial", d0.parts)?;
    arithmetic(alu_req(ins, tts::OP0, "op0")?, "op0", false)?;
    arithmetic(alu_req(ins, tts::OP1, "op1")?, "op1", false)?;
    Ok(())
}

/// r[-1] = initial; t = op0(data0[i], r[i-1]) (reverse0: op0(r[i-1], data0[i]));
/// r[i] = op1(t, data1[i]) (reverse1: op1(data1[i], t)); fp32 carry, dst[i] = cast(r[i]).
pub fn tensor_tensor_scan(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(tts::DST).unwrap();
    let d0 = ins.ap(tts::DATA0).unwrap();
    let d1 = ins.ap(tts::DATA1).unwrap();
    let op0 = alu_req(ins, tts::OP0, "op0")?;
    let op1 = alu_req(ins, tts::OP1, "op1")?;
    let rev0 = ins.bool_or(tts::REVERSE0, false);
    let rev1 = ins.bool_or(tts::REVERSE1, false);
    let (p, n) = (d0.parts as usize, d0.free_size());
    let init = ctx.per_partition(ins.arg(tts::INITIAL), d0.parts, 0.0);
    let a = ctx.read_f32(d0);
    let b = ctx.read_f32(d1);
    let mut out = vec![0f32; a.len()];
    for (r, start) in init.iter().enumerate().take(p) {
        let mut acc = *start;
        for j in r * n..(r + 1) * n {
            let t = if rev0 {
                apply(op0, acc, a[j])
            } else {
                apply(op0, a[j], acc)
            };
            acc = if rev1 {
                apply(op1, b[j], t)
            } else {
                apply(op1, t, b[j])
            };
            out[j] = acc;
        }
    }
    ctx.write_f32(dst, &out);
    Ok(())
}

pub fn check_tensor_scalar_cumulative(ins: &Instr) -> Result<()> {
    let dst = ins.ap(tsc::DST).unwrap();
    let src = ins.ap(tsc::SRC).unwrap();
    same_shape(src, "src", dst, "dst")?;
    check_column(ins.arg(tsc::IMM0), "imm0", src.parts)?;
    check_column(ins.arg(tsc::IMM1), "imm1", src.parts)?;
    arithmetic(alu_req(ins, tsc::OP0, "op0")?, "op0", true)?;
    one_of(
        alu_req(ins, tsc::OP1, "op1")?,
        &[
            AluOp::Add,
            AluOp::Subtract,
            AluOp::Multiply,
            AluOp::Maximum,
            AluOp::Minimum,
        ],
        "op1",
    )?;
    match acc::reduce_cmd(ins, tsc::REDUCE_CMD) {
        ReduceCmd::ResetReduce | ReduceCmd::Reduce => {}
        ReduceCmd::LoadReduce => {
            if matches!(ins.arg(tsc::IMM1), Arg::Absent) {
                return Err(
                    err(Value, "reduce_cmd=load_reduce loads imm1, which is missing")
                        .operand("imm1"),
                );
            }
        }
        c => {
            return Err(err(
                Value,
                format!(
                    "tensor_scalar_cumulative scans through the accumulator: reduce_cmd must be reset_reduce, reduce or load_reduce, got {}",
                    c.name()
                ),
            )
            .operand("reduce_cmd"))
        }
    }
    Ok(())
}

/// reg = start (reset_reduce: identity of op1; reduce: the lane's accumulator; load_reduce:
/// imm1); for each element reg = op1(op0(src[i], imm0), reg), dst[i] = cast(reg). The final reg
/// stays in the accumulator. For subtract this is x' - reg, as the reference writes it (§6.6).
pub fn tensor_scalar_cumulative(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(tsc::DST).unwrap();
    let src = ins.ap(tsc::SRC).unwrap();
    let op0 = alu_req(ins, tsc::OP0, "op0")?;
    let op1 = alu_req(ins, tsc::OP1, "op1")?;
    let cmd = acc::reduce_cmd(ins, tsc::REDUCE_CMD);
    let (p, n) = (src.parts as usize, src.free_size());
    let imm0 = ctx.per_partition(ins.arg(tsc::IMM0), src.parts, 0.0);
    let imm1 = ctx.per_partition(ins.arg(tsc::IMM1), src.parts, 0.0);
    let x = ctx.read_f32(src);
    let mut out = vec![0f32; x.len()];
    let base = src.start as usize;
    for r in 0..p {
        let reg0 = ctx.state.vec_acc.get(base + r).copied().unwrap_or(0.0);
        let mut reg = acc::start_value(cmd, reg0, op1, imm1[r]);
        for j in r * n..(r + 1) * n {
            reg = apply(op1, apply(op0, x[j], imm0[r]), reg);
            out[j] = reg;
        }
        if let Some(slot) = ctx.state.vec_acc.get_mut(base + r) {
            *slot = reg;
        }
    }
    ctx.write_f32(dst, &out);
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::TensorTensorScan, Opcode::TensorScalarCumulative],
    check: |ins| match ins.op {
        Opcode::TensorTensorScan => check_tensor_tensor_scan(ins),
        _ => check_tensor_scalar_cumulative(ins),
    },
    exec: |ins, ctx| match ins.op {
        Opcode::TensorTensorScan => tensor_tensor_scan(ins, ctx),
        _ => tensor_scalar_cumulative(ins, ctx),
    },
};

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::TensorTensorScan<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::TensorScalarCumulative<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
