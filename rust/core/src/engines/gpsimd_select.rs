//! GpSimd `affine_select`: keep a tile where an affine function of (partition, free index)
//! compares true with 0, fill elsewhere (causal masks).

use super::gpsimd::{check_pattern, pattern_offsets};
use super::{same_shape, Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::AffineSelect;
use crate::isa::AluOp;
use crate::numerics;

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

impl Semantics for AffineSelect<'_> {
    fn check(&self) -> Result<()> {
        let (dst, on_true) = (self.dst, self.on_true_tile);
        same_shape(dst, "dst", on_true, "on_true_tile")?;
        for (ap, n) in [(dst, "dst"), (on_true, "on_true_tile")] {
            if ap.dtype.is_packed() {
                return Err(fail(
                    Dtype,
                    "packed_dtype_not_allowed",
                    format!(
                        "affine_select cannot operate on packed MX dtype {}",
                        ap.dtype.name()
                    ),
                )
                .operand(n));
            }
        }
        check_pattern(self.pattern, dst.free_size())?;
        if compare(self.cmp_op, 0).is_none() {
            return Err(fail(
                Value,
                "alu_op_not_allowed",
                format!(
                    "cmp_op must be a comparison (equal, not_equal, greater_equal, greater, less_equal, less), got {}",
                    self.cmp_op.name()
                ),
            )
            .operand("cmp_op"));
        }
        Ok(())
    }

    /// Same dtype: the selected on_true elements are copied bit-exactly; otherwise through fp32.
    /// The fill is `on_false_value` (fp32) rounded to dst's dtype.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (dst, on_true, op) = (self.dst, self.on_true_tile, self.cmp_op);
        let rel = pattern_offsets(self.pattern);
        let off = self.offset.value(&ctx.regs[..]);
        let cm = self.channel_multiplier;
        let fill = numerics::from_f32(dst.dtype, self.on_false_value.f32());
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
}
