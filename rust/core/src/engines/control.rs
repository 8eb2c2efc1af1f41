//! Sequencer instructions: `nop`, the 64 registers of each engine's sequencer
//! (move / load / store, NKI 0.7 scalar_load / scalar_store, arithmetic) and `branch`.
//!
//! Registers are 32-bit words. Loads read the element's raw bits: signed integer dtypes are
//! sign-extended, every other dtype zero-extended (floats keep their bit pattern). Stores
//! truncate to the destination's width.

use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p;
use crate::isa::{AluOp, Arg, Instr, Opcode};

pub const MODULE: super::Module = super::Module {
    opcodes: &[
        Opcode::Nop,
        Opcode::RegisterMove,
        Opcode::RegisterLoad,
        Opcode::RegisterStore,
        Opcode::ScalarLoad,
        Opcode::ScalarStore,
        Opcode::RegisterOp,
        Opcode::Branch,
    ],
    check,
    exec,
};

fn reg(ins: &Instr, i: usize) -> usize {
    match ins.arg(i) {
        Arg::Reg(r) => *r as usize,
        _ => 0,
    }
}

fn one_element(ins: &Instr, i: usize, name: &str) -> Result<()> {
    if let Some(ap) = ins.ap(i) {
        if ap.num_elements() != 1 {
            return Err(err(
                Shape,
                format!(
                    "{} moves one element: {name} must have exactly 1 element, got shape {:?}",
                    ins.op.spec().name,
                    ap.shape()
                ),
            )
            .operand(name.to_string()));
        }
    }
    Ok(())
}

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

fn check(ins: &Instr) -> Result<()> {
    match ins.op {
        Opcode::RegisterLoad => one_element(ins, p::register_load::SRC, "src"),
        Opcode::RegisterStore => one_element(ins, p::register_store::DST, "dst"),
        Opcode::ScalarLoad => one_element(ins, p::scalar_load::SRC, "src"),
        Opcode::ScalarStore => one_element(ins, p::scalar_store::DST, "dst"),
        Opcode::RegisterOp => {
            let op = ins.enum_val(p::register_op::OP).unwrap_or(0);
            if !REG_OPS.iter().any(|o| *o as u8 == op) {
                return Err(err(
                    Value,
                    "register_op supports add, subtract, multiply, bitwise_and, bitwise_or, bitwise_xor, left_shift, right_shift",
                )
                .operand("op"));
            }
            Ok(())
        }
        Opcode::Branch => {
            let always = ins.enum_val(p::branch::CMP) == Some(0);
            if !always && matches!(ins.arg(p::branch::REG), Arg::Absent) {
                return Err(err(
                    Value,
                    "a conditional branch compares a register: reg is required",
                )
                .operand("reg"));
            }
            if ins.i32_or(p::branch::TARGET, 0) < 0 {
                return Err(
                    err(Value, "branch target must be an instruction index >= 0").operand("target"),
                );
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn load(ctx: &mut Ctx, ins: &Instr, dst: usize, src: usize) {
    if let Some(ap) = ins.ap(src) {
        let v = ctx.read_raw(ap).first().copied().unwrap_or(0);
        ctx.regs[reg(ins, dst)] = v;
    }
}

fn store(ctx: &mut Ctx, ins: &Instr, dst: usize, src: usize) {
    if let Some(ap) = ins.ap(dst) {
        let v = ctx.regs[reg(ins, src)];
        ctx.write_raw(ap, &[v]);
    }
}

/// `cmp(a, b)` on signed 32-bit values; `cmp` is the position in the `cmp_op` enum.
pub fn compare(cmp: u8, a: i32, b: i32) -> bool {
    match cmp {
        1 => a == b,
        2 => a != b,
        3 => a < b,
        4 => a <= b,
        5 => a > b,
        6 => a >= b,
        _ => true,
    }
}

fn alu(op: u8, a: u32, b: u32) -> u32 {
    match op {
        x if x == AluOp::Add as u8 => a.wrapping_add(b),
        x if x == AluOp::Subtract as u8 => a.wrapping_sub(b),
        x if x == AluOp::Multiply as u8 => a.wrapping_mul(b),
        x if x == AluOp::BitwiseAnd as u8 => a & b,
        x if x == AluOp::BitwiseOr as u8 => a | b,
        x if x == AluOp::BitwiseXor as u8 => a ^ b,
        x if x == AluOp::LeftShift as u8 => a.wrapping_shl(b),
        x if x == AluOp::RightShift as u8 => a.wrapping_shr(b),
        _ => a,
    }
}

fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    match ins.op {
        Opcode::Nop => {}
        Opcode::RegisterMove => {
            ctx.regs[reg(ins, p::register_move::DST)] = ins.i32_or(p::register_move::SRC, 0) as u32;
        }
        Opcode::RegisterLoad => load(ctx, ins, p::register_load::DST, p::register_load::SRC),
        Opcode::ScalarLoad => load(ctx, ins, p::scalar_load::DST, p::scalar_load::SRC),
        Opcode::RegisterStore => store(ctx, ins, p::register_store::DST, p::register_store::SRC),
        Opcode::ScalarStore => store(ctx, ins, p::scalar_store::DST, p::scalar_store::VALUE),
        Opcode::RegisterOp => {
            let a = ctx.regs[reg(ins, p::register_op::SRC)];
            let b = ins.i32_or(p::register_op::IMM, 0) as u32;
            let op = ins.enum_val(p::register_op::OP).unwrap_or(0);
            ctx.regs[reg(ins, p::register_op::DST)] = alu(op, a, b);
        }
        Opcode::Branch => {
            let cmp = ins.enum_val(p::branch::CMP).unwrap_or(0);
            let a = ctx.regs[reg(ins, p::branch::REG)] as i32;
            if compare(cmp, a, ins.i32_or(p::branch::IMM, 0)) {
                ctx.jump = Some(ins.i32_or(p::branch::TARGET, 0) as u32);
            }
        }
        _ => {
            return Err(err(
                Internal,
                format!("{} is listed but not dispatched", ins.op.spec().name),
            ))
        }
    }
    Ok(())
}

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::Nop<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::RegisterMove<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::RegisterLoad<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::RegisterStore<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::ScalarLoad<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::ScalarStore<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::RegisterOp<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::Branch<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
