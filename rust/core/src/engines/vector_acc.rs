//! The VectorE per-lane accumulator registers (reference §1.7): one fp32 per lane (= partition),
//! shared by exponential, range_select, select_reduce, tensor_scalar_reduce and
//! tensor_scalar_cumulative, driven by `reduce_cmd` (reference §2.1):
//! idle leaves them alone, reset loads the reduction's identity, reduce folds onto the current
//! value, reset_reduce resets then folds, load_reduce loads the instruction's initial value then
//! folds. Lanes are the partitions of the instruction's main input. The reference says VectorE
//! `idle` "may still clobber" them; the emulator leaves them untouched (a documented choice).

use super::alu::apply;
use super::{Ctx, TileOperand};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::{AluOp, Instr, ReduceCmd};

/// The value a reset loads: the identity of the reduction (add/subtract 0, multiply 1,
/// maximum -inf, minimum +inf).
pub fn identity(op: AluOp) -> f32 {
    match op {
        AluOp::Multiply => 1.0,
        AluOp::Maximum => f32::NEG_INFINITY,
        AluOp::Minimum => f32::INFINITY,
        _ => 0.0,
    }
}

/// The register value a fold starts from under `cmd` (idle/reduce keep the register).
pub fn start_value(cmd: ReduceCmd, reg: f32, op: AluOp, init: f32) -> f32 {
    match cmd {
        ReduceCmd::Idle | ReduceCmd::Reduce => reg,
        ReduceCmd::Reset | ReduceCmd::ResetReduce => identity(op),
        ReduceCmd::LoadReduce => init,
    }
}

/// Run `cmd` on the lanes `base..base+p`: row r of `vals` (n fp32 values, free order) is folded
/// into lane base+r with `acc = op(acc, v)`. `init[r]` is lane r's load_reduce value.
pub fn run(
    ctx: &mut Ctx,
    base: usize,
    cmd: ReduceCmd,
    op: AluOp,
    init: &[f32],
    vals: &[f32],
    n: usize,
) {
    let p = init.len();
    for r in 0..p {
        let Some(reg) = ctx.state.vec_acc.get_mut(base + r) else {
            continue;
        };
        let mut acc = start_value(cmd, *reg, op, init[r]);
        if matches!(
            cmd,
            ReduceCmd::Reduce | ReduceCmd::ResetReduce | ReduceCmd::LoadReduce
        ) {
            for v in &vals[r * n..(r + 1) * n] {
                acc = apply(op, acc, *v);
            }
        }
        *reg = acc;
    }
}

/// Write lanes `base..base+p` to the (P,1) `reduce_res` operand (if given), optionally negated
/// (the register itself is not changed).
pub fn read_out(ctx: &mut Ctx, res: impl TileOperand, base: usize, p: usize, negate: bool) {
    if let Some(ap) = res.tile() {
        let vals: Vec<f32> = (0..p)
            .map(|r| {
                let v = ctx.state.vec_acc.get(base + r).copied().unwrap_or(0.0);
                if negate {
                    -v
                } else {
                    v
                }
            })
            .collect();
        ctx.write_f32(ap, &vals);
    }
}

/// Instructions without an initial-value operand cannot load_reduce.
pub fn forbid_load_reduce(ins: &Instr, cmd: ReduceCmd) -> Result<()> {
    if cmd == ReduceCmd::LoadReduce {
        return Err(fail(
            Value,
            "load_reduce_without_initial_value",
            format!(
                "{} has no initial-value operand, so reduce_cmd=load_reduce is not allowed",
                ins.op.spec().name
            ),
        )
        .operand("reduce_cmd"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_pick_the_start_value() {
        let (reg, init) = (5.0, 7.0);
        assert_eq!(start_value(ReduceCmd::Idle, reg, AluOp::Add, init), 5.0);
        assert_eq!(start_value(ReduceCmd::Reduce, reg, AluOp::Add, init), 5.0);
        assert_eq!(
            start_value(ReduceCmd::LoadReduce, reg, AluOp::Add, init),
            7.0
        );
        assert_eq!(
            start_value(ReduceCmd::ResetReduce, reg, AluOp::Multiply, init),
            1.0
        );
        assert_eq!(
            start_value(ReduceCmd::Reset, reg, AluOp::Maximum, init),
            f32::NEG_INFINITY
        );
        assert_eq!(identity(AluOp::Minimum), f32::INFINITY);
        assert_eq!(identity(AluOp::Subtract), 0.0);
    }
}
