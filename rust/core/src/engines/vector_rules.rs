//! Operand rules shared by the VectorE instruction modules (reference §2.0, §2.2).

use super::alu::{is_bitwise, is_elementwise, is_unary};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::AluOp;
use crate::memory::{Ap, Mem};

/// Two-input VectorE instructions read at most one input from PSUM.
pub fn not_both_psum(a: &Ap, an: &str, b: &Ap, bn: &str) -> Result<()> {
    if a.mem == Mem::Psum && b.mem == Mem::Psum {
        return Err(fail(
            MemorySpace,
            "psum_both_inputs",
            format!("at most one of {an} and {bn} may be in PSUM (both are)"),
        )
        .operand(bn.to_string()));
    }
    Ok(())
}

/// An arithmetic (fp32) elementwise operator: not bitwise, not the partition-only `average`.
pub fn arithmetic(op: AluOp, name: &str, allow_unary: bool) -> Result<()> {
    if is_bitwise(op) || !is_elementwise(op) || (!allow_unary && is_unary(op)) {
        return Err(fail(
            Value,
            "alu_op_not_arithmetic",
            format!(
                "{name} must be a{} arithmetic ALU operator, got {}",
                if allow_unary { "n" } else { " binary" },
                op.name()
            ),
        )
        .operand(name.to_string()));
    }
    Ok(())
}

/// `op` must be one of `allowed`.
pub fn one_of(op: AluOp, allowed: &[AluOp], name: &str) -> Result<()> {
    if !allowed.contains(&op) {
        let names: Vec<_> = allowed.iter().map(|o| o.name()).collect();
        return Err(fail(
            Value,
            "alu_op_not_allowed",
            format!(
                "{name} must be one of {}, got {}",
                names.join(", "),
                op.name()
            ),
        )
        .operand(name.to_string()));
    }
    Ok(())
}

/// Elements per partition of an operand must lie in lo..=hi.
pub fn free_in(ap: &Ap, name: &str, lo: usize, hi: usize) -> Result<()> {
    let f = ap.free_size();
    if f < lo || f > hi {
        return Err(fail(
            Shape,
            "free_size_out_of_range",
            format!("{name} must have {lo}..={hi} elements per partition, got {f}"),
        )
        .operand(name.to_string()));
    }
    Ok(())
}

/// An operand with exactly `n` elements per partition on the same partitions count as `parts`.
pub fn exact_shape(ap: &Ap, name: &str, parts: u32, n: usize) -> Result<()> {
    if ap.parts != parts || ap.free_size() != n {
        return Err(fail(
            Shape,
            "exact_shape_mismatch",
            format!(
                "{name} must be ({parts}, {n}) (partitions, elements per partition), got {:?}",
                ap.shape()
            ),
        )
        .operand(name.to_string()));
    }
    Ok(())
}

/// An operand may have at most `n` free dims (rank n + 1 with the partition dim).
pub fn max_free_dims(ap: &Ap, name: &str, n: usize) -> Result<()> {
    if ap.dims.len() > n {
        return Err(fail(
            Shape,
            "too_many_free_dims",
            format!(
                "{name} may have at most {n} free dims (rank {}), got shape {:?}",
                n + 1,
                ap.shape()
            ),
        )
        .operand(name.to_string()));
    }
    Ok(())
}
