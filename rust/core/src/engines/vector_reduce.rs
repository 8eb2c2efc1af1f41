//! VectorE reductions along the free dims: tensor_reduce (trailing axes, negate, keepdims) and
//! tensor_scalar_reduce (an elementwise op whose results fold into the VectorE accumulators).

use super::alu::{apply, apply_bits, is_bitwise, reduce_groups};
use super::vector_acc as acc;
use super::vector_rules::{alu_req, arithmetic, max_free_dims, one_of};
use super::{check_column, same_shape, Ctx};
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::{tensor_reduce as tr, tensor_scalar_reduce as tsr};
use crate::isa::{AluOp, Instr, Opcode};

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
fn first_axis(ins: &Instr) -> Result<usize> {
    let data = ins.ap(tr::DATA).unwrap();
    let nd = data.dims.len();
    let mut axes: Vec<i32> = ins.ints(tr::AXIS).to_vec();
    axes.sort_unstable();
    let bad = |why: String| Err(err(Value, why).operand("axis"));
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
            ins.ints(tr::AXIS)
        ));
    }
    Ok(k)
}

pub fn check_tensor_reduce(ins: &Instr) -> Result<()> {
    let dst = ins.ap(tr::DST).unwrap();
    let data = ins.ap(tr::DATA).unwrap();
    let op = alu_req(ins, tr::OP, "op")?;
    one_of(op, REDUCE_OPS, "op")?;
    let k = first_axis(ins)?;
    let kept: usize = data.dims[..k - 1].iter().map(|d| d.1 as usize).product();
    if dst.parts != data.parts || dst.free_size() != kept {
        return Err(err(
            Shape,
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
        if ins.bool_or(tr::NEGATE, false) {
            return Err(err(
                Value,
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
pub fn tensor_reduce(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(tr::DST).unwrap();
    let data = ins.ap(tr::DATA).unwrap();
    let op = alu_req(ins, tr::OP, "op")?;
    let k = first_axis(ins)?;
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
    let negate = ins.bool_or(tr::NEGATE, false);
    let x = ctx.read_f32(data);
    let mut out: Vec<f32> = match op {
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
    };
    if negate {
        for v in &mut out {
            *v = -*v;
        }
    }
    ctx.write_f32(dst, &out);
    Ok(())
}

pub fn check_tensor_scalar_reduce(ins: &Instr) -> Result<()> {
    let dst = ins.ap(tsr::DST).unwrap();
    let data = ins.ap(tsr::DATA).unwrap();
    same_shape(data, "data", dst, "dst")?;
    max_free_dims(data, "data", 3)?;
    max_free_dims(dst, "dst", 3)?;
    check_column(ins.arg(tsr::OPERAND0), "operand0", data.parts)?;
    check_column(ins.arg(tsr::REDUCE_RES), "reduce_res", data.parts)?;
    check_column(ins.arg(tsr::REDUCE_INIT), "reduce_init", data.parts)?;
    arithmetic(alu_req(ins, tsr::OP0, "op0")?, "op0", true)?;
    one_of(
        alu_req(ins, tsr::REDUCE_OP, "reduce_op")?,
        &[AluOp::Add, AluOp::Multiply, AluOp::Maximum, AluOp::Minimum],
        "reduce_op",
    )?;
    if ins.bool_or(tsr::REVERSE0, false) {
        return Err(err(
            Value,
            "tensor_scalar_reduce does not support reverse0=True (reference §2.6)",
        )
        .operand("reverse0"));
    }
    Ok(())
}

pub fn tensor_scalar_reduce(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(tsr::DST).unwrap();
    let data = ins.ap(tsr::DATA).unwrap();
    let op0 = alu_req(ins, tsr::OP0, "op0")?;
    let rop = alu_req(ins, tsr::REDUCE_OP, "reduce_op")?;
    let (p, n) = (data.parts as usize, data.free_size());
    let c0 = ctx.per_partition(ins.arg(tsr::OPERAND0), data.parts, 0.0);
    let init = ctx.per_partition(ins.arg(tsr::REDUCE_INIT), data.parts, 0.0);
    let x = ctx.read_f32(data);
    let out: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, v)| apply(op0, *v, c0[i / n.max(1)]))
        .collect();
    ctx.write_f32(dst, &out);
    let base = data.start as usize;
    acc::run(
        ctx,
        base,
        acc::reduce_cmd(ins, tsr::REDUCE_CMD),
        rop,
        &init,
        &out,
        n,
    );
    let neg = ins.bool_or(tsr::REDUCE_RES_NEGATE, false);
    acc::read_out(ctx, ins.arg(tsr::REDUCE_RES), base, p, neg);
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::TensorReduce, Opcode::TensorScalarReduce],
    check: |ins| match ins.op {
        Opcode::TensorReduce => check_tensor_reduce(ins),
        _ => check_tensor_scalar_reduce(ins),
    },
    exec: |ins, ctx| match ins.op {
        Opcode::TensorReduce => tensor_reduce(ins, ctx),
        _ => tensor_scalar_reduce(ins, ctx),
    },
};

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::TensorReduce<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::TensorScalarReduce<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
