//! VectorE reductions along the free dims: tensor_reduce (trailing axes, negate, keepdims) and
//! tensor_scalar_reduce (an elementwise op whose results fold into the VectorE accumulators).

use super::alu::{apply, apply_bits, is_bitwise, reduce_groups};
use super::vector_acc as acc;
use super::vector_rules::{arithmetic, max_free_dims, one_of};
use super::{check_column, same_shape, Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::{TensorReduce, TensorScalarReduce};
use crate::isa::AluOp;
use crate::memory::Ap;

impl Semantics for TensorReduce<'_> {
    fn check(&self) -> Result<()> {
        check_tensor_reduce(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        tensor_reduce(self, ctx)
    }
}

impl Semantics for TensorScalarReduce<'_> {
    fn check(&self) -> Result<()> {
        check_tensor_scalar_reduce(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        tensor_scalar_reduce(self, ctx)
    }
}

/// Operators legal in tensor_reduce (reference §2.2, "reduction-legal").
const REDUCE_OPS: &[AluOp] = &[
    AluOp::Add,
    AluOp::Subtract,
    AluOp::Multiply,
    AluOp::Maximum,
    AluOp::Minimum,
    AluOp::LogicalAnd,
    AluOp::LogicalOr,
    AluOp::LogicalXor,
    AluOp::BitwiseAnd,
    AluOp::BitwiseOr,
    AluOp::BitwiseXor,
];

/// The first reduced axis (1-based over the data's free dims): `axis` must list the trailing
/// free axes k..=ndim in any order, each once (reference §2.6; axis 0, the partition dim, is
/// illegal).
fn first_axis(data: &Ap, axis: &[i32]) -> Result<usize> {
    let nd = data.dims.len();
    let mut axes: Vec<i32> = axis.to_vec();
    axes.sort_unstable();
    let bad = |why: String| Err(fail(Value, "reduce_axis_invalid", why).operand("axis"));
    if axes.is_empty() {
        return bad("axis must list at least one free axis".into());
    }
    if axes[0] < 1 {
        return bad(format!(
            "axis {} is not a free axis (axis 0 is the partition dim; free axes are 1..={nd})",
            axes[0]
        ));
    }
    let k = axes[0] as usize;
    let want: Vec<i32> = (k..=nd).map(|a| a as i32).collect();
    if axes != want {
        return bad(format!(
            "axis must be the trailing free axes k..={nd} of this {}-D data (e.g. [{nd}], or all of 1..={nd}), got {:?}",
            nd + 1,
            axis
        ));
    }
    Ok(k)
}

fn check_tensor_reduce(v: &TensorReduce) -> Result<()> {
    let (dst, data, op) = (v.dst, v.data, v.op);
    one_of(op, REDUCE_OPS, "op")?;
    let k = first_axis(data, v.axis)?;
    let kept: usize = data.dims[..k - 1].iter().map(|d| d.1 as usize).product();
    if dst.parts != data.parts || dst.free_size() != kept {
        return Err(fail(Shape, "reduce_dst_shape",
            format!(
                "dst must have data's {} partitions and {kept} elements per partition (the kept dims of {:?}), got {:?}",
                data.parts,
                data.shape(),
                dst.shape()
            ),
        )
        .operand("dst"));
    }
    if is_bitwise(op) {
        if v.negate {
            return Err(fail(
                Value,
                "reduce_negate_bitwise",
                format!(
                    "negate applies to arithmetic results only, not bitwise {}",
                    op.name()
                ),
            )
            .operand("negate"));
        }
        super::alu::require_integer(op, &[(dst, "dst"), (data, "data")])?;
    }
    Ok(())
}

/// Folds run left to right in free order starting from the first element (so subtract gives
/// x0 - x1 - x2 ...; the hardware order is not public); logical ops start from their identity
/// so single-element results are 1.0 / 0.0 too.
fn tensor_reduce(v: &TensorReduce, ctx: &mut Ctx) -> Result<()> {
    let (dst, data, op) = (v.dst, v.data, v.op);
    let k = first_axis(data, v.axis)?;
    let m: usize = data.dims[k - 1..].iter().map(|d| d.1 as usize).product();
    let groups = data.num_elements() / m.max(1);
    if is_bitwise(op) {
        let x = ctx.read_raw(data);
        let out: Vec<u32> = (0..groups)
            .map(|g| {
                x[g * m..(g + 1) * m]
                    .iter()
                    .copied()
                    .reduce(|a, b| apply_bits(op, a, b))
                    .unwrap_or(0)
            })
            .collect();
        ctx.write_raw(dst, &out);
        return Ok(());
    }
    let negate = v.negate;
    let reduce = |x: &[f32]| -> Vec<f32> {
        match op {
            AluOp::LogicalAnd | AluOp::LogicalOr | AluOp::LogicalXor => {
                let init = if op == AluOp::LogicalAnd { 1.0 } else { 0.0 };
                (0..groups)
                    .map(|g| {
                        x[g * m..(g + 1) * m]
                            .iter()
                            .fold(init, |a, b| apply(op, a, *b))
                    })
                    .collect()
            }
            _ => {
                let mut o = vec![0f32; groups];
                reduce_groups(op, &x[..groups * m], m, &mut o);
                o
            }
        }
    };
    // fp32 row max / min straight from the bytes; on-chip data otherwise decodes into a
    // reused buffer (no whole-tile allocation per instruction)
    let mut out = super::minmax_rows::rows(&ctx.mems, data, op, groups)
        .or_else(|| super::rows::with_f32_direct(&ctx.mems, data, reduce))
        .unwrap_or_else(|| reduce(&ctx.read_f32(data)));
    if negate {
        for v in &mut out {
            *v = -*v;
        }
    }
    ctx.write_f32(dst, &out);
    Ok(())
}

fn check_tensor_scalar_reduce(v: &TensorScalarReduce) -> Result<()> {
    let (dst, data) = (v.dst, v.data);
    same_shape(data, "data", dst, "dst")?;
    max_free_dims(data, "data", 3)?;
    max_free_dims(dst, "dst", 3)?;
    check_column(v.operand0, "operand0", data.parts)?;
    check_column(v.reduce_res, "reduce_res", data.parts)?;
    check_column(v.reduce_init, "reduce_init", data.parts)?;
    arithmetic(v.op0, "op0", true)?;
    one_of(
        v.reduce_op,
        &[AluOp::Add, AluOp::Multiply, AluOp::Maximum, AluOp::Minimum],
        "reduce_op",
    )?;
    if v.reverse0 {
        return Err(fail(
            Value,
            "reverse0_not_supported",
            "tensor_scalar_reduce does not support reverse0=True (reference §2.6)",
        )
        .operand("reverse0"));
    }
    Ok(())
}

fn tensor_scalar_reduce(v: &TensorScalarReduce, ctx: &mut Ctx) -> Result<()> {
    let (dst, data, op0, rop) = (v.dst, v.data, v.op0, v.reduce_op);
    let (p, n) = (data.parts as usize, data.free_size());
    let c0 = ctx.scalar(v.operand0, data.parts);
    let init = ctx.scalar_or(v.reduce_init, data.parts, 0.0);
    let x = ctx.read_f32(data);
    let out: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, v)| apply(op0, *v, c0[i / n.max(1)]))
        .collect();
    ctx.write_f32(dst, &out);
    let base = data.start as usize;
    acc::run(ctx, base, v.reduce_cmd, rop, &init, &out, n);
    acc::read_out(ctx, v.reduce_res, base, p, v.reduce_res_negate);
    Ok(())
}
