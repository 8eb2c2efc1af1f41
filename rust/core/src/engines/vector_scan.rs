//! VectorE scans along the flattened free dim of each partition: tensor_tensor_scan (a two-input
//! recurrence) and tensor_scalar_cumulative (an inclusive scan through the VectorE accumulators).

use super::alu::apply;
use super::vector_acc as acc;
use super::vector_rules::{arithmetic, not_both_psum, one_of};
use super::{check_column, same_shape, Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::{TensorScalarCumulative, TensorTensorScan};
use crate::isa::{AluOp, ReduceCmd};

impl Semantics for TensorTensorScan<'_> {
    fn check(&self) -> Result<()> {
        let (dst, d0, d1) = (self.dst, self.data0, self.data1);
        same_shape(d0, "data0", d1, "data1")?;
        same_shape(d0, "data0", dst, "dst")?;
        not_both_psum(d0, "data0", d1, "data1")?;
        check_column(self.initial, "initial", d0.parts)?;
        arithmetic(self.op0, "op0", false)?;
        arithmetic(self.op1, "op1", false)?;
        Ok(())
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        tensor_tensor_scan(self, ctx)
    }
}

impl Semantics for TensorScalarCumulative<'_> {
    fn check(&self) -> Result<()> {
        check_tensor_scalar_cumulative(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        tensor_scalar_cumulative(self, ctx)
    }
}

/// r[-1] = initial; t = op0(data0[i], r[i-1]) (reverse0: op0(r[i-1], data0[i]));
/// r[i] = op1(t, data1[i]) (reverse1: op1(data1[i], t)); fp32 carry, dst[i] = cast(r[i]).
fn tensor_tensor_scan(v: &TensorTensorScan, ctx: &mut Ctx) -> Result<()> {
    let (dst, d0, d1) = (v.dst, v.data0, v.data1);
    let (op0, op1, rev0, rev1) = (v.op0, v.op1, v.reverse0, v.reverse1);
    let (p, n) = (d0.parts as usize, d0.free_size());
    let init = ctx.scalar(v.initial, d0.parts);
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

fn check_tensor_scalar_cumulative(v: &TensorScalarCumulative) -> Result<()> {
    let (dst, src) = (v.dst, v.src);
    same_shape(src, "src", dst, "dst")?;
    check_column(v.imm0, "imm0", src.parts)?;
    check_column(v.imm1, "imm1", src.parts)?;
    arithmetic(v.op0, "op0", true)?;
    one_of(
        v.op1,
        &[
            AluOp::Add,
            AluOp::Subtract,
            AluOp::Multiply,
            AluOp::Maximum,
            AluOp::Minimum,
        ],
        "op1",
    )?;
    match v.reduce_cmd {
        ReduceCmd::ResetReduce | ReduceCmd::Reduce => {}
        ReduceCmd::LoadReduce => {
            if v.imm1.is_none() {
                return Err(
                    fail(Value, "load_reduce_without_initial_value", "reduce_cmd=load_reduce loads imm1, which is missing")
                        .operand("imm1"),
                );
            }
        }
        c => {
            return Err(fail(Value, "cumulative_reduce_cmd",
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
fn tensor_scalar_cumulative(v: &TensorScalarCumulative, ctx: &mut Ctx) -> Result<()> {
    let (dst, src, op0, op1, cmd) = (v.dst, v.src, v.op0, v.op1, v.reduce_cmd);
    let (p, n) = (src.parts as usize, src.free_size());
    let imm0 = ctx.scalar(v.imm0, src.parts);
    let imm1 = ctx.scalar_or(v.imm1, src.parts, 0.0);
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
