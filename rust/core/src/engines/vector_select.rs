//! VectorE selection: tensor_copy_predicated, range_select and select_reduce (the latter two
//! with a running maximum in the VectorE accumulators).

use super::alu::apply;
use super::vector_acc as acc;
use super::vector_rules::{not_both_psum, one_of};
use super::{check_column, same_shape, Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::instr::{Imm, Scalar};
use crate::isa::ops::{RangeSelect, SelectReduce, TensorCopyPredicated};
use crate::isa::{AluOp, ReduceCmd};
use crate::memory::Ap;
use crate::numerics;

/// range_select / select_reduce fold their output rows into the VectorE accumulators with
/// maximum (lanes from `base`) and copy them to `reduce_res` when given.
fn running_max(
    ctx: &mut Ctx,
    base: usize,
    cmd: ReduceCmd,
    out: &[f32],
    (p, n): (usize, usize),
    res: Option<&Ap>,
) {
    acc::run(ctx, base, cmd, AluOp::Maximum, &vec![0.0; p], out, n);
    acc::read_out(ctx, res, base, p, false);
}

/// A predicate element is true when its raw bits are non-zero.
fn predicate(ctx: &Ctx, ap: &Ap, reverse: bool) -> Vec<bool> {
    ctx.read_raw(ap)
        .iter()
        .map(|b| (*b != 0) != reverse)
        .collect()
}

impl Semantics for TensorCopyPredicated<'_> {
    fn check(&self) -> Result<()> {
        let (dst, pred) = (self.dst, self.predicate);
        // Only partitions and elements per partition must agree (ranks may differ; hazard list 0.6).
        same_shape(dst, "dst", pred, "predicate")?;
        if let Scalar::Tile(src) = self.src {
            same_shape(dst, "dst", src, "src")?;
            not_both_psum(src, "src", pred, "predicate")?;
            if src.dtype != dst.dtype {
                return Err(fail(
                    Dtype,
                    "dtype_mismatch",
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

    /// Where (predicate != 0) != reverse_pred: dst = src (bit copy; a scalar src is cast to
    /// dst's dtype, an integer immediate exactly for integer dtypes); elsewhere dst keeps its
    /// bits.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let dst = self.dst;
        let sel = predicate(ctx, self.predicate, self.reverse_pred);
        let mut out = ctx.read_raw(dst);
        let src: Vec<u32> = match self.src {
            Scalar::Tile(s) => ctx.read_raw(s),
            Scalar::Imm(Imm::I32(v)) if dst.dtype.is_integer() => vec![v as u32; out.len()],
            Scalar::Imm(i) => vec![numerics::from_f32(dst.dtype, i.f32()); out.len()],
        };
        for ((o, s), t) in out.iter_mut().zip(&src).zip(&sel) {
            if *t {
                *o = *s;
            }
        }
        ctx.write_raw(dst, &out);
        Ok(())
    }
}

/// FP32_MIN, the only fill range_select documents (-inf is accepted too: NKI's own default).
const FP32_MIN: f32 = -3.4028235e38;

/// The comparisons range_select accepts against its bounds.
const RANGE_CMPS: [AluOp; 5] = [
    AluOp::Equal,
    AluOp::Less,
    AluOp::LessEqual,
    AluOp::Greater,
    AluOp::GreaterEqual,
];

impl Semantics for RangeSelect<'_> {
    fn check(&self) -> Result<()> {
        let x = self.on_true_tile;
        same_shape(x, "on_true_tile", self.dst, "dst")?;
        check_column(self.bound0, "bound0", x.parts)?;
        check_column(self.bound1, "bound1", x.parts)?;
        if let Some(res) = self.reduce_res {
            check_column(res, "reduce_res", x.parts)?;
        }
        one_of(self.comp_op0, &RANGE_CMPS, "comp_op0")?;
        one_of(self.comp_op1, &RANGE_CMPS, "comp_op1")?;
        one_of(self.reduce_op, &[AluOp::Maximum], "reduce_op")?;
        acc::forbid_load_reduce(self.ins, self.reduce_cmd)?;
        let fill = self.on_false_value.f32();
        if fill != FP32_MIN && fill != f32::NEG_INFINITY {
            return Err(fail(
                Value,
                "range_select_fill_value",
                format!("on_false_value must be -3.4028235e38 (FP32_MIN) or -inf, got {fill}"),
            )
            .operand("on_false_value"));
        }
        let start = self.range_start as i64;
        let last = start + x.free_size() as i64;
        if start.abs() > 1 << 24 || last.abs() > 1 << 24 {
            return Err(fail(
                Value,
                "range_select_index_range",
                format!("range_start + free index must stay within +-2^24 (compared in fp32), got {start}..{last}"),
            )
            .operand("range_start"));
        }
        Ok(())
    }

    /// idx = range_start + j (fp32); keep x where comp_op0(idx, bound0) and comp_op1(idx,
    /// bound1), else the fill; the accumulator takes the running maximum of the fp32 results.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let x = self.on_true_tile;
        let (c0, c1) = (self.comp_op0, self.comp_op1);
        let fill = self.on_false_value.f32();
        let start = self.range_start as i64;
        let (p, n) = (x.parts as usize, x.free_size());
        let b0 = ctx.read_f32(self.bound0);
        let b1 = ctx.read_f32(self.bound1);
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
        ctx.write_f32(self.dst, &out);
        running_max(
            ctx,
            x.start as usize,
            self.reduce_cmd,
            &out,
            (p, n),
            self.reduce_res,
        );
        Ok(())
    }
}

impl Semantics for SelectReduce<'_> {
    fn check(&self) -> Result<()> {
        let t = self.on_true;
        // Only partitions and elements per partition must agree (ranks may differ; hazard list 0.6).
        same_shape(t, "on_true", self.dst, "dst")?;
        same_shape(t, "on_true", self.predicate, "predicate")?;
        not_both_psum(t, "on_true", self.predicate, "predicate")?;
        check_column(self.on_false, "on_false", t.parts)?;
        if let Some(res) = self.reduce_res {
            check_column(res, "reduce_res", t.parts)?;
        }
        one_of(self.reduce_op, &[AluOp::Maximum], "reduce_op")?;
        acc::forbid_load_reduce(self.ins, self.reduce_cmd)
    }

    /// dst = pred ? on_true : on_false (through fp32, cast to dst); running max of the fp32
    /// results.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let t = self.on_true;
        let (p, n) = (t.parts as usize, t.free_size());
        let sel = predicate(ctx, self.predicate, self.reverse_pred);
        let f = ctx.scalar(self.on_false, t.parts);
        let v = ctx.read_f32(t);
        let out: Vec<f32> = v
            .iter()
            .zip(&sel)
            .enumerate()
            .map(|(i, (v, s))| if *s { *v } else { f[i / n.max(1)] })
            .collect();
        ctx.write_f32(self.dst, &out);
        running_max(
            ctx,
            t.start as usize,
            self.reduce_cmd,
            &out,
            (p, n),
            self.reduce_res,
        );
        Ok(())
    }
}
