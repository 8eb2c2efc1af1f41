//! GpSimd `tensor_partition_reduce`: reduce across the partition dimension into one partition.

use super::alu;
use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::tensor_partition_reduce as r;
use crate::isa::{AluOp, Instr, Opcode};
use crate::memory::Ap;

fn tensor<'a>(ins: &'a Instr, i: usize, name: &str) -> Result<&'a Ap> {
    ins.ap(i)
        .ok_or_else(|| err(Value, format!("{name} must be a tensor")).operand(name.to_string()))
}

const OPS: &[AluOp] = &[
    AluOp::Add,
    AluOp::Average,
    AluOp::Maximum,
    AluOp::BitwiseOr,
    AluOp::BitwiseAnd,
];

fn op_of(ins: &Instr) -> Result<AluOp> {
    match ins.enum_val(r::OP).and_then(AluOp::from_u8) {
        Some(op) if OPS.contains(&op) => Ok(op),
        other => Err(err(
            Value,
            format!(
                "tensor_partition_reduce op must be add, average, maximum, bitwise_or or bitwise_and, got {}",
                other.map(|o| o.name()).unwrap_or("none")
            ),
        )
        .operand("op")),
    }
}

pub fn check(ins: &Instr) -> Result<()> {
    let dst = tensor(ins, r::DST, "dst")?;
    let src = tensor(ins, r::DATA, "data")?;
    let op = op_of(ins)?;
    if dst.parts != 1 {
        return Err(err(
            Shape,
            format!("dst must have 1 partition, got {}", dst.parts),
        )
        .operand("dst"));
    }
    if dst.free_size() != src.free_size() {
        return Err(err(
            Shape,
            format!(
                "dst has {} elements per partition but data has {}: they must match",
                dst.free_size(),
                src.free_size()
            ),
        )
        .operand("dst"));
    }
    for (ap, n) in [(dst, "dst"), (src, "data")] {
        if ap.dtype.is_packed() {
            return Err(err(
                Dtype,
                format!(
                    "tensor_partition_reduce cannot operate on packed MX dtype {}",
                    ap.dtype.name()
                ),
            )
            .operand(n));
        }
        if alu::is_bitwise(op) && !ap.dtype.is_integer() {
            return Err(err(
                Dtype,
                format!(
                    "bitwise {} needs integer dtypes, {n} is {}",
                    op.name(),
                    ap.dtype.name()
                ),
            )
            .operand(n));
        }
    }
    Ok(())
}

/// Arithmetic: fp32, partition order 0 -> P-1 (order unspecified by the docs; our choice);
/// average = fp32 sum / P. Bitwise: raw integer bits.
pub fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = tensor(ins, r::DST, "dst")?;
    let src = tensor(ins, r::DATA, "data")?;
    let op = op_of(ins)?;
    let n = src.free_size();
    let p = src.parts as usize;
    if alu::is_bitwise(op) {
        let x = ctx.read_raw(src);
        let mut acc = x[..n].to_vec();
        for row in x.chunks(n.max(1)).skip(1) {
            for (a, v) in acc.iter_mut().zip(row) {
                *a = alu::apply_bits(op, *a, *v);
            }
        }
        ctx.write_raw(dst, &acc);
        return Ok(());
    }
    let x = ctx.read_f32(src);
    let mut acc = x[..n].to_vec();
    let step = if op == AluOp::Maximum {
        AluOp::Maximum
    } else {
        AluOp::Add
    };
    for row in x.chunks(n.max(1)).skip(1) {
        for (a, v) in acc.iter_mut().zip(row) {
            *a = alu::apply(step, *a, *v);
        }
    }
    if op == AluOp::Average {
        for a in &mut acc {
            *a /= p as f32;
        }
    }
    ctx.write_f32(dst, &acc);
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::TensorPartitionReduce],
    check,
    exec,
};

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::TensorPartitionReduce<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
