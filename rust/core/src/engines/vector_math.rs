//! VectorE elementwise math beyond tensor_tensor / tensor_scalar: scalar_tensor_tensor,
//! exponential (with its running sum in the VectorE accumulators) and reciprocal.

use super::alu::apply;
use super::vector_acc as acc;
use super::vector_rules::{arithmetic, max_free_dims, not_both_psum};
use super::{check_column, same_shape, Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::{Exponential, Reciprocal, ScalarTensorTensor};
use crate::isa::{AluOp, ReduceCmd};
use crate::kernels::exp::exp_map;

impl Semantics for ScalarTensorTensor<'_> {
    fn check(&self) -> Result<()> {
        let (dst, data, o1) = (self.dst, self.data, self.operand1);
        same_shape(data, "data", dst, "dst")?;
        same_shape(data, "data", o1, "operand1")?;
        not_both_psum(data, "data", o1, "operand1")?;
        check_column(self.operand0, "operand0", data.parts)?;
        arithmetic(self.op0, "op0", true)?;
        arithmetic(self.op1, "op1", true)?;
        Ok(())
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        scalar_tensor_tensor(self, ctx)
    }
}

impl Semantics for Exponential<'_> {
    fn check(&self) -> Result<()> {
        check_exponential(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        exponential(self, ctx)
    }
}

impl Semantics for Reciprocal<'_> {
    fn check(&self) -> Result<()> {
        same_shape(self.data, "data", self.dst, "dst")
    }
    /// dst = cast(1 / fp32(data)), the correctly rounded IEEE fp32 division.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let out: Vec<f32> = ctx.read_f32(self.data).iter().map(|v| 1.0 / v).collect();
        ctx.write_f32(self.dst, &out);
        Ok(())
    }
}

/// t = op0(data, operand0) (reverse0: op0(operand0, data)); dst = op1(t, operand1)
/// (reverse1: op1(operand1, t)); fp32.
fn scalar_tensor_tensor(v: &ScalarTensorTensor, ctx: &mut Ctx) -> Result<()> {
    let (dst, data, o1) = (v.dst, v.data, v.operand1);
    let (op0, op1, rev0, rev1) = (v.op0, v.op1, v.reverse0, v.reverse1);
    let n = data.free_size().max(1);
    let c0 = ctx.scalar(v.operand0, data.parts);
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

fn check_exponential(e: &Exponential) -> Result<()> {
    let (dst, src) = (e.dst, e.src);
    same_shape(src, "src", dst, "dst")?;
    max_free_dims(src, "src", 3)?;
    max_free_dims(dst, "dst", 3)?;
    check_column(e.max_value, "max_value", src.parts)?;
    check_column(e.reduce_res, "reduce_res", src.parts)?;
    check_column(e.reduce_init, "reduce_init", src.parts)?;
    if e.reduce_cmd != ReduceCmd::LoadReduce {
        if let Some(v) = e.reduce_init.imm_f32() {
            if v != 0.0 {
                return Err(fail(
                    Value,
                    "reduce_init_without_load_reduce",
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
fn exponential(e: &Exponential, ctx: &mut Ctx) -> Result<()> {
    let (dst, src) = (e.dst, e.src);
    let (p, n) = (src.parts as usize, src.free_size());
    let m = ctx.scalar(e.max_value, src.parts);
    let init = ctx.scalar(e.reduce_init, src.parts);
    let mut out = ctx.read_f32(src);
    for (row, m) in out.chunks_mut(n.max(1)).zip(&m) {
        // vectorised, bit-identical to `((x - m) as f64).exp() as f32` (kernels/exp.rs)
        exp_map(row, |x| x - *m, |x| (x as f64).exp() as f32);
    }
    ctx.write_f32(dst, &out);
    let base = src.start as usize;
    acc::run(ctx, base, e.reduce_cmd, AluOp::Add, &init, &out, n);
    acc::read_out(ctx, e.reduce_res, base, p, false);
    Ok(())
}
