//! GpSimd `affine_select`: keep a tile where an affine function of (partition, free index)
//! compares true with 0, fill elsewhere (causal masks).

use super::gpsimd::{check_pattern, pattern_offsets};
use super::{same_shape, Ctx};
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::affine_select as s;
use crate::isa::{AluOp, Instr, Opcode};
use crate::memory::Ap;
use crate::numerics;

fn tensor<'a>(ins: &'a Instr, i: usize, name: &str) -> Result<&'a Ap> {
    ins.ap(i)
        .ok_or_else(|| err(Value, format!("{name} must be a tensor")).operand(name.to_string()))
}

/// The comparison against 0, on the exact int32 affine value.
fn compare(op: AluOp, v: i32) -> Option<bool> {
    Some(match op {
        AluOp::Equal => v == 0,
        AluOp::NotEqual => v != 0,
        AluOp::GreaterEqual => v >= 0,
        AluOp::Greater => v > 0,
        AluOp::LessEqual => v <= 0,
        AluOp::Less => v < 0,
        _ => return None,
    })
}

fn cmp_op(ins: &Instr) -> Result<AluOp> {
    let op = ins
        .enum_val(s::CMP_OP)
        .and_then(AluOp::from_u8)
        .unwrap_or(AluOp::Equal);
    match compare(op, 0) {
        Some(_) => Ok(op),
        None => Err(err(
            Value,
            format!(
                "cmp_op must be a comparison (equal, not_equal, greater_equal, greater, less_equal, less), got {}",
                op.name()
            ),
        )
        .operand("cmp_op")),
    }
}

pub fn check_affine_select(ins: &Instr) -> Result<()> {
    let dst = tensor(ins, s::DST, "dst")?;
    let on_true = tensor(ins, s::ON_TRUE_TILE, "on_true_tile")?;
    same_shape(dst, "dst", on_true, "on_true_tile")?;
    for (ap, n) in [(dst, "dst"), (on_true, "on_true_tile")] {
        if ap.dtype.is_packed() {
            return Err(err(
                Dtype,
                format!(
                    "affine_select cannot operate on packed MX dtype {}",
                    ap.dtype.name()
                ),
            )
            .operand(n));
        }
    }
    check_pattern(ins.ints(s::PATTERN), dst.free_size())?;
    cmp_op(ins)?;
    Ok(())
}

/// Same dtype: the selected on_true elements are copied bit-exactly; otherwise through fp32.
/// The fill is `on_false_value` (fp32) rounded to dst's dtype.
pub fn affine_select(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = tensor(ins, s::DST, "dst")?;
    let on_true = tensor(ins, s::ON_TRUE_TILE, "on_true_tile")?;
    let op = cmp_op(ins)?;
    let rel = pattern_offsets(ins.ints(s::PATTERN));
    let off = ins.i32_or_reg(s::OFFSET, 0, &ctx.regs[..]);
    let cm = ins.i32_or(s::CHANNEL_MULTIPLIER, 0);
    let fill = numerics::from_f32(dst.dtype, ins.f32_or(s::ON_FALSE_VALUE, 0.0));
    let src: Vec<u32> = if on_true.dtype == dst.dtype {
        ctx.read_raw(on_true)
    } else {
        ctx.read_f32(on_true)
            .into_iter()
            .map(|v| numerics::from_f32(dst.dtype, v))
            .collect()
    };
    let n = rel.len();
    let mut out = src;
    for (p, row) in out.chunks_mut(n.max(1)).enumerate() {
        let base = off.wrapping_add((p as i32).wrapping_mul(cm));
        for (v, &o) in row.iter_mut().zip(&rel) {
            if compare(op, base.wrapping_add(o)) != Some(true) {
                *v = fill;
            }
        }
    }
    ctx.write_raw(dst, &out);
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::AffineSelect],
    check: check_affine_select,
    exec: affine_select,
};

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::AffineSelect<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
