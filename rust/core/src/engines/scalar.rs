//! ScalarE: activation with scale, bias and the accumulator registers.

use super::act;
use super::{check_column, same_shape, Ctx};
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::activation as a;
use crate::isa::Opcode;
use crate::isa::{ActFn, AluOp, Arg, Instr, ReduceCmd};

pub fn check_activation(ins: &Instr) -> Result<()> {
    let dst = ins.ap(a::DST).unwrap();
    let src = ins.ap(a::DATA).unwrap();
    same_shape(dst, "dst", src, "data")?;
    for (ap, n) in [(dst, "dst"), (src, "data")] {
        if ap.dtype.is_packed() {
            return Err(err(
                Dtype,
                format!(
                    "activation cannot operate on packed MX dtype {}",
                    ap.dtype.name()
                ),
            )
            .operand(n));
        }
    }
    check_column(ins.arg(a::BIAS), "bias", src.parts)?;
    check_column(ins.arg(a::SCALE), "scale", src.parts)?;
    if let Arg::Tensor(ap) = ins.arg(a::REDUCE_RES) {
        if ap.parts != src.parts || ap.free_size() != 1 {
            return Err(err(
                Shape,
                format!(
                    "reduce_res must be a ({}, 1) tile, got {:?}",
                    src.parts,
                    ap.shape()
                ),
            )
            .operand("reduce_res"));
        }
    }
    if let Some(op) = ins.enum_val(a::REDUCE_OP) {
        if op != AluOp::Add as u8 {
            return Err(err(Value, "activation reduces with add only").operand("reduce_op"));
        }
    }
    if ins.enum_val(a::REDUCE_CMD) == Some(ReduceCmd::LoadReduce as u8) {
        return Err(
            err(Value, "activation does not take reduce_cmd=load_reduce").operand("reduce_cmd"),
        );
    }
    Ok(())
}

pub fn activation(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(a::DST).unwrap();
    let src = ins.ap(a::DATA).unwrap();
    let f = ActFn::from_u8(ins.enum_val(a::OP).unwrap()).unwrap();
    let p = src.parts as usize;
    let n = src.free_size();
    let scale = ctx.per_partition(ins.arg(a::SCALE), src.parts, 1.0);
    let bias = ctx.per_partition(ins.arg(a::BIAS), src.parts, 0.0);
    let x = ctx.read_f32(src);
    let mut out = vec![0f32; x.len()];
    for r in 0..p {
        for j in 0..n {
            let t = x[r * n + j] * scale[r] + bias[r];
            out[r * n + j] = act::apply(f, t, 0.0);
        }
    }
    ctx.write_f32(dst, &out);
    // Accumulator registers (per lane, fp32, summed in free order over the fp32 results).
    let cmd =
        ReduceCmd::from_u8(ins.enum_val(a::REDUCE_CMD).unwrap_or(0)).unwrap_or(ReduceCmd::Idle);
    let base = src.start as usize;
    for r in 0..p {
        let reg = &mut ctx.state.act_regs[base + r];
        match cmd {
            ReduceCmd::Idle => {}
            ReduceCmd::Reset => *reg = 0.0,
            ReduceCmd::ResetReduce | ReduceCmd::Reduce | ReduceCmd::LoadReduce => {
                let mut acc = if cmd == ReduceCmd::Reduce { *reg } else { 0.0 };
                for v in &out[r * n..(r + 1) * n] {
                    acc += v;
                }
                *reg = acc;
            }
        }
    }
    if let Arg::Tensor(res) = ins.arg(a::REDUCE_RES) {
        let vals: Vec<f32> = (0..p).map(|r| ctx.state.act_regs[base + r]).collect();
        ctx.write_f32(res, &vals);
    }
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::Activation],
    check,
    exec,
};

fn check(ins: &Instr) -> Result<()> {
    match ins.op {
        Opcode::Activation => check_activation(ins),
        _ => Ok(()),
    }
}

fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    match ins.op {
        Opcode::Activation => activation(ins, ctx),
        _ => Err(crate::error::err(
            crate::error::ErrorKind::Internal,
            format!("{} is listed but not dispatched", ins.op.spec().name),
        )),
    }
}
