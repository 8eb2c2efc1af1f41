//! GpSimd `tensor_partition_reduce`: reduce across the partition dimension into one partition.

use super::alu;
use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::TensorPartitionReduce;
use crate::isa::AluOp;

const OPS: &[AluOp] = &[
    AluOp::Add,
    AluOp::Average,
    AluOp::Maximum,
    AluOp::BitwiseOr,
    AluOp::BitwiseAnd,
];

fn check_op(op: AluOp) -> Result<()> {
    if !OPS.contains(&op) {
        return Err(fail(
            Value,
            "alu_op_not_allowed",
            format!(
                "tensor_partition_reduce op must be add, average, maximum, bitwise_or or bitwise_and, got {}",
                op.name()
            ),
        )
        .operand("op"));
    }
    Ok(())
}

impl Semantics for TensorPartitionReduce<'_> {
    fn check(&self) -> Result<()> {
        let (dst, src, op) = (self.dst, self.data, self.op);
        check_op(op)?;
        if dst.parts != 1 {
            return Err(fail(
                Shape,
                "partition_reduce_dst_parts",
                format!("dst must have 1 partition, got {}", dst.parts),
            )
            .operand("dst"));
        }
        if dst.free_size() != src.free_size() {
            return Err(fail(
                Shape,
                "free_size_mismatch",
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
                return Err(fail(
                    Dtype,
                    "packed_dtype_not_allowed",
                    format!(
                        "tensor_partition_reduce cannot operate on packed MX dtype {}",
                        ap.dtype.name()
                    ),
                )
                .operand(n));
            }
            if alu::is_bitwise(op) && !ap.dtype.is_integer() {
                return Err(fail(
                    Dtype,
                    "bitwise_needs_integer",
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
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (dst, src, op) = (self.dst, self.data, self.op);
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
}
