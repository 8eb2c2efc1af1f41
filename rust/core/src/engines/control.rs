//! Sequencer instructions: `nop`, the 64 registers of each engine's sequencer
//! (move / load / store, NKI 0.7 scalar_load / scalar_store, arithmetic: `register_op` with an
//! immediate, `register_alu` with a register or an immediate) and `branch`.
//!
//! Registers are 32-bit words. Loads read the element's raw bits: signed integer dtypes are
//! sign-extended, every other dtype zero-extended (floats keep their bit pattern). Stores
//! truncate to the destination's width.

use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops;
use crate::isa::tables::CmpOp;
use crate::isa::{AluOp, Instr};
use crate::memory::Ap;

/// A register load / store moves exactly one element.
fn one_element(ins: &Instr, ap: &Ap, name: &str) -> Result<()> {
    if ap.num_elements() != 1 {
        return Err(fail(
            Shape,
            "register_transfer_one_element",
            format!(
                "{} moves one element: {name} must have exactly 1 element, got shape {:?}",
                ins.op.spec().name,
                ap.shape()
            ),
        )
        .operand(name.to_string()));
    }
    Ok(())
}

/// The ALU operators of the sequencer (`register_op`).
const REG_OPS: &[AluOp] = &[
    AluOp::Add,
    AluOp::Subtract,
    AluOp::Multiply,
    AluOp::BitwiseAnd,
    AluOp::BitwiseOr,
    AluOp::BitwiseXor,
    AluOp::LeftShift,
    AluOp::RightShift,
];

/// Load the raw bits of `src`'s single element into register `dst`.
fn load(ctx: &mut Ctx, dst: u8, src: &Ap) {
    let v = ctx.read_raw(src).first().copied().unwrap_or(0);
    ctx.regs[dst as usize] = v;
}

/// Store register `src` into `dst`'s single element.
fn store(ctx: &mut Ctx, dst: &Ap, src: u8) {
    let v = ctx.regs[src as usize];
    ctx.write_raw(dst, &[v]);
}

/// `cmp(a, b)` on signed 32-bit values.
pub fn compare(cmp: CmpOp, a: i32, b: i32) -> bool {
    match cmp {
        CmpOp::Always => true,
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
    }
}

/// The sequencer ALU on 32-bit words (wrapping); operators outside `REG_OPS` pass `a` through
/// (`check` refuses them).
fn alu(op: AluOp, a: u32, b: u32) -> u32 {
    match op {
        AluOp::Add => a.wrapping_add(b),
        AluOp::Subtract => a.wrapping_sub(b),
        AluOp::Multiply => a.wrapping_mul(b),
        AluOp::BitwiseAnd => a & b,
        AluOp::BitwiseOr => a | b,
        AluOp::BitwiseXor => a ^ b,
        AluOp::LeftShift => a.wrapping_shl(b),
        AluOp::RightShift => a.wrapping_shr(b),
        _ => a,
    }
}

impl Semantics for ops::Nop<'_> {
    fn check(&self) -> Result<()> {
        Ok(())
    }
    fn exec(&self, _ctx: &mut Ctx) -> Result<()> {
        Ok(())
    }
}

impl Semantics for ops::RegisterMove<'_> {
    fn check(&self) -> Result<()> {
        Ok(())
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        ctx.regs[self.dst as usize] = self.src as u32;
        Ok(())
    }
}

impl Semantics for ops::RegisterLoad<'_> {
    fn check(&self) -> Result<()> {
        one_element(self.ins, self.src, "src")
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        load(ctx, self.dst, self.src);
        Ok(())
    }
}

impl Semantics for ops::ScalarLoad<'_> {
    fn check(&self) -> Result<()> {
        one_element(self.ins, self.src, "src")
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        load(ctx, self.dst, self.src);
        Ok(())
    }
}

impl Semantics for ops::RegisterStore<'_> {
    fn check(&self) -> Result<()> {
        one_element(self.ins, self.dst, "dst")
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        store(ctx, self.dst, self.src);
        Ok(())
    }
}

impl Semantics for ops::ScalarStore<'_> {
    fn check(&self) -> Result<()> {
        one_element(self.ins, self.dst, "dst")
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        store(ctx, self.dst, self.value);
        Ok(())
    }
}

impl Semantics for ops::RegisterOp<'_> {
    fn check(&self) -> Result<()> {
        if !REG_OPS.contains(&self.op) {
            return Err(fail(
                Value,
                "register_op_not_supported",
                "register_op supports add, subtract, multiply, bitwise_and, bitwise_or, bitwise_xor, left_shift, right_shift",
            )
            .operand("op"));
        }
        Ok(())
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let a = ctx.regs[self.src as usize];
        ctx.regs[self.dst as usize] = alu(self.op, a, self.imm as u32);
        Ok(())
    }
}

/// The operators of `register_alu`: `REG_OPS` plus division, extrema and comparisons.
const REG_ALU_OPS: &[AluOp] = &[
    AluOp::Add,
    AluOp::Subtract,
    AluOp::Multiply,
    AluOp::Divide,
    AluOp::Maximum,
    AluOp::Minimum,
    AluOp::Equal,
    AluOp::NotEqual,
    AluOp::GreaterEqual,
    AluOp::Greater,
    AluOp::LessEqual,
    AluOp::Less,
    AluOp::BitwiseAnd,
    AluOp::BitwiseOr,
    AluOp::BitwiseXor,
    AluOp::LeftShift,
    AluOp::RightShift,
];

/// `register_alu`'s operator on 32-bit words read as signed or unsigned. Division rounds toward
/// zero; x / 0 is all ones and i32::MIN / -1 wraps to i32::MIN (RISC-V M: the sequencer does not trap).
pub fn alu2(op: AluOp, a: u32, b: u32, unsigned: bool) -> u32 {
    let (sa, sb) = (a as i32, b as i32);
    let lt = if unsigned { a < b } else { sa < sb };
    let eq = a == b;
    match op {
        AluOp::Divide => {
            if b == 0 {
                u32::MAX
            } else if unsigned {
                a / b
            } else {
                sa.wrapping_div(sb) as u32
            }
        }
        AluOp::Maximum => {
            if lt {
                b
            } else {
                a
            }
        }
        AluOp::Minimum => {
            if lt {
                a
            } else {
                b
            }
        }
        AluOp::Equal => eq as u32,
        AluOp::NotEqual => (!eq) as u32,
        AluOp::Less => lt as u32,
        AluOp::LessEqual => (lt || eq) as u32,
        AluOp::Greater => (!lt && !eq) as u32,
        AluOp::GreaterEqual => (!lt) as u32,
        _ => alu(op, a, b),
    }
}

impl Semantics for ops::RegisterAlu<'_> {
    fn check(&self) -> Result<()> {
        if !REG_ALU_OPS.contains(&self.op) {
            return Err(fail(
                Value,
                "register_alu_not_supported",
                "register_alu supports add, subtract, multiply, divide, maximum, minimum, equal, not_equal, \
                 greater_equal, greater, less_equal, less, bitwise_and, bitwise_or, bitwise_xor, left_shift, right_shift",
            )
            .operand("op"));
        }
        Ok(())
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let a = ctx.regs[self.src0 as usize];
        let b = self.src1.value(&ctx.regs[..]) as u32;
        ctx.regs[self.dst as usize] = alu2(self.op, a, b, self.unsigned);
        Ok(())
    }
}

impl Semantics for ops::Branch<'_> {
    fn check(&self) -> Result<()> {
        if self.cmp != CmpOp::Always && self.reg.is_none() {
            return Err(fail(
                Value,
                "branch_needs_register",
                "a conditional branch compares a register: reg is required",
            )
            .operand("reg"));
        }
        if self.target < 0 {
            return Err(fail(
                Value,
                "branch_target_negative",
                "branch target must be an instruction index >= 0",
            )
            .operand("target"));
        }
        Ok(())
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        // An unconditional branch has no register; `compare` ignores the value then.
        let a = self.reg.map_or(0, |r| ctx.regs[r as usize] as i32);
        if compare(self.cmp, a, self.imm) {
            ctx.jump = Some(self.target as u32);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::alu2;
    use crate::isa::AluOp;

    /// The reference: Rust's own integer arithmetic on the signed / unsigned reading.
    #[test]
    fn alu2_matches_integer_arithmetic_at_the_edges() {
        let vals: [i32; 8] = [0, 1, -1, 7, -7, i32::MAX, i32::MIN, 100_000];
        for &a in &vals {
            for &b in &vals {
                let (ua, ub) = (a as u32, b as u32);
                let s = |op| alu2(op, ua, ub, false);
                let u = |op| alu2(op, ua, ub, true);
                assert_eq!(s(AluOp::Add), a.wrapping_add(b) as u32);
                assert_eq!(s(AluOp::Multiply), a.wrapping_mul(b) as u32);
                assert_eq!(s(AluOp::Less), (a < b) as u32);
                assert_eq!(u(AluOp::Less), (ua < ub) as u32);
                assert_eq!(s(AluOp::GreaterEqual), (a >= b) as u32);
                assert_eq!(u(AluOp::Maximum), ua.max(ub));
                assert_eq!(s(AluOp::Minimum), a.min(b) as u32);
                let want = if b == 0 {
                    u32::MAX
                } else {
                    a.wrapping_div(b) as u32
                };
                assert_eq!(s(AluOp::Divide), want, "{a} / {b}");
                let want = ua.checked_div(ub).unwrap_or(u32::MAX);
                assert_eq!(u(AluOp::Divide), want, "{ua} / {ub}");
            }
        }
        assert_eq!(
            alu2(AluOp::Divide, i32::MIN as u32, u32::MAX, false),
            i32::MIN as u32
        );
    }
}
