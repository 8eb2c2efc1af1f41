//! VectorE selection: tensor_copy_predicated, range_select and select_reduce (the latter two
//! with a running maximum in the VectorE accumulators).

use super::alu::apply;
use super::vector_acc as acc;
use super::vector_rules::{alu_req, not_both_psum, one_of};
use super::{check_column, same_shape, Ctx};
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::{
    range_select as rs, select_reduce as sr, tensor_copy_predicated as tcp,
};
use crate::isa::{AluOp, Arg, Instr, Opcode};
use crate::numerics;

/// A predicate element is true when its raw bits are non-zero.
fn predicate(ctx: &Ctx, ap: &crate::memory::Ap, reverse: bool) -> Vec<bool> {
    ctx.read_raw(ap)
        .iter()
        .map(|b| (*b != 0) != reverse)
        .collect()
}

pub fn check_tensor_copy_predicated(ins: &Instr) -> Result<()> {
    let dst = ins.ap(tcp::DST).unwrap();
    let pred = ins.ap(tcp::PREDICATE).unwrap();
    // Only partitions and elements per partition must agree (ranks may differ; hazard list 0.6).
    same_shape(dst, "dst", pred, "predicate")?;
    if let Arg::Tensor(src) = ins.arg(tcp::SRC) {
        same_shape(dst, "dst", src, "src")?;
        not_both_psum(src, "src", pred, "predicate")?;
        if src.dtype != dst.dtype {
            return Err(err(
                Dtype,
                format!(
                    "src and dst must have the same dtype (a bit copy), got {} and {}",
                    src.dtype.name(),
                    dst.dtype.name()
                ),
            )
            .operand("src"));
        }
    }
    Ok(())
}

/// Where (predicate != 0) != reverse_pred: dst = src (bit copy; a scalar src is cast to dst's
/// dtype, an integer immediate exactly for integer dtypes); elsewhere dst keeps its bits.
pub fn tensor_copy_predicated(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(tcp::DST).unwrap();
    let pred = ins.ap(tcp::PREDICATE).unwrap();
    let sel = predicate(ctx, pred, ins.bool_or(tcp::REVERSE_PRED, false));
    let mut out = ctx.read_raw(dst);
    let src: Vec<u32> = match ins.arg(tcp::SRC) {
        Arg::Tensor(s) => ctx.read_raw(s),
        Arg::I32(v) if dst.dtype.is_integer() => vec![*v as u32; out.len()],
        a => vec![numerics::from_f32(dst.dtype, a.imm_f32().unwrap_or(0.0)); out.len()],
    };
    for ((o, s), t) in out.iter_mut().zip(&src).zip(&sel) {
        if *t {
            *o = *s;
        }
    }
    ctx.write_raw(dst, &out);
    Ok(())
}

/// FP32_MIN, the only fill range_select documents (-inf is accepted too: NKI's own default).
const FP32_MIN: f32 = -3.4028235e38;

pub fn check_range_select(ins: &Instr) -> Result<()> {
    let dst = ins.ap(rs::DST).unwrap();
    let x = ins.ap(rs::ON_TRUE_TILE).unwrap();
    same_shape(x, "on_true_tile", dst, "dst")?;
    check_column(ins.arg(rs::BOUND0), "bound0", x.parts)?;
    check_column(ins.arg(rs::BOUND1), "bound1", x.parts)?;
    check_column(ins.arg(rs::REDUCE_RES), "reduce_res", x.parts)?;
    let cmps = [
        AluOp::Equal,
        AluOp::Less,
        AluOp::LessEqual,
        AluOp::Greater,
        AluOp::GreaterEqual,
    ];
    one_of(alu_req(ins, rs::COMP_OP0, "comp_op0")?, &cmps, "comp_op0")?;
    one_of(alu_req(ins, rs::COMP_OP1, "comp_op1")?, &cmps, "comp_op1")?;
    one_of(
        alu_req(ins, rs::REDUCE_OP, "reduce_op")?,
        &[AluOp::Maximum],
        "reduce_op",
    )?;
    acc::no_load_reduce(ins, rs::REDUCE_CMD)?;
    let fill = ins.f32_or(rs::ON_FALSE_VALUE, FP32_MIN);
    if fill != FP32_MIN && fill != f32::NEG_INFINITY {
        return Err(err(
            Value,
            format!("on_false_value must be -3.4028235e38 (FP32_MIN) or -inf, got {fill}"),
        )
        .operand("on_false_value"));
    }
    let start = ins.i32_or(rs::RANGE_START, 0) as i64;
    let last = start + x.free_size() as i64;
    if start.abs() > 1 << 24 || last.abs() > 1 << 24 {
        return Err(err(
            Value,
            format!("range_start + free index must stay within +-2^24 (compared in fp32), got {start}..{last}"),
        )
        .operand("range_start"));
    }
    Ok(())
}

/// idx = range_start + j (fp32); keep x where comp_op0(idx, bound0) and comp_op1(idx, bound1),
/// else the fill; the accumulator takes the running maximum of the fp32 results.
pub fn range_select(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(rs::DST).unwrap();
    let x = ins.ap(rs::ON_TRUE_TILE).unwrap();
    let c0 = alu_req(ins, rs::COMP_OP0, "comp_op0")?;
    let c1 = alu_req(ins, rs::COMP_OP1, "comp_op1")?;
    let fill = ins.f32_or(rs::ON_FALSE_VALUE, FP32_MIN);
    let start = ins.i32_or(rs::RANGE_START, 0) as i64;
    let (p, n) = (x.parts as usize, x.free_size());
    let b0 = ctx.per_partition(ins.arg(rs::BOUND0), x.parts, 0.0);
    let b1 = ctx.per_partition(ins.arg(rs::BOUND1), x.parts, 0.0);
    let v = ctx.read_f32(x);
    let out: Vec<f32> = v
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let (r, j) = (i / n.max(1), i % n.max(1));
            let idx = (start + j as i64) as f32;
            let keep = apply(c0, idx, b0[r]) != 0.0 && apply(c1, idx, b1[r]) != 0.0;
            if keep {
                *v
            } else {
                fill
            }
        })
        .collect();
    ctx.write_f32(dst, &out);
    let base = x.start as usize;
    let cmd = acc::reduce_cmd(ins, rs::REDUCE_CMD);
    acc::run(ctx, base, cmd, AluOp::Maximum, &vec![0.0; p], &out, n);
    acc::read_out(ctx, ins.arg(rs::REDUCE_RES), base, p, false);
    Ok(())
}

pub fn check_select_reduce(ins: &Instr) -> Result<()> {
    let dst = ins.ap(sr::DST).unwrap();
    let pred = ins.ap(sr::PREDICATE).unwrap();
    let t = ins.ap(sr::ON_TRUE).unwrap();
    // Only partitions and elements per partition must agree (ranks may differ; hazard list 0.6).
    same_shape(t, "on_true", dst, "dst")?;
    same_shape(t, "on_true", pred, "predicate")?;
    not_both_psum(t, "on_true", pred, "predicate")?;
    check_column(ins.arg(sr::ON_FALSE), "on_false", t.parts)?;
    check_column(ins.arg(sr::REDUCE_RES), "reduce_res", t.parts)?;
    one_of(
        alu_req(ins, sr::REDUCE_OP, "reduce_op")?,
        &[AluOp::Maximum],
        "reduce_op",
    )?;
    acc::no_load_reduce(ins, sr::REDUCE_CMD)
}

/// dst = pred ? on_true : on_false (through fp32, cast to dst); running max of the fp32 results.
pub fn select_reduce(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(sr::DST).unwrap();
    let pred = ins.ap(sr::PREDICATE).unwrap();
    let t = ins.ap(sr::ON_TRUE).unwrap();
    let (p, n) = (t.parts as usize, t.free_size());
    let sel = predicate(ctx, pred, ins.bool_or(sr::REVERSE_PRED, false));
    let f = ctx.per_partition(ins.arg(sr::ON_FALSE), t.parts, 0.0);
    let v = ctx.read_f32(t);
    let out: Vec<f32> = v
        .iter()
        .zip(&sel)
        .enumerate()
        .map(|(i, (v, s))| if *s { *v } else { f[i / n.max(1)] })
        .collect();
    ctx.write_f32(dst, &out);
    let base = t.start as usize;
    let cmd = acc::reduce_cmd(ins, sr::REDUCE_CMD);
    acc::run(ctx, base, cmd, AluOp::Maximum, &vec![0.0; p], &out, n);
    acc::read_out(ctx, ins.arg(sr::REDUCE_RES), base, p, false);
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[
        Opcode::TensorCopyPredicated,
        Opcode::RangeSelect,
        Opcode::SelectReduce,
    ],
    check: |ins| match ins.op {
        Opcode::TensorCopyPredicated => check_tensor_copy_predicated(ins),
        Opcode::RangeSelect => check_range_select(ins),
        _ => check_select_reduce(ins),
    },
    exec: |ins, ctx| match ins.op {
        Opcode::TensorCopyPredicated => tensor_copy_predicated(ins, ctx),
        Opcode::RangeSelect => range_select(ins, ctx),
        _ => select_reduce(ins, ctx),
    },
};

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::TensorCopyPredicated<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::RangeSelect<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::SelectReduce<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
