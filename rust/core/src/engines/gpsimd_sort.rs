//! GpSimd `topk`: the K largest bf16 values of a 16-partition "snake" and their indices.

use super::gpsimd_gather::same_parts;
use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::Topk;
use std::cmp::Ordering;

const CORE_PARTS: usize = 16;

/// n in 8..65536, K in 1..32768 and <= n, and src holds the n-element snake.
fn check_sizes(t: &Topk) -> Result<()> {
    let n = t.n as i64;
    let k = t.val_dst.free_size() as i64;
    if !(8..65536).contains(&n) {
        return Err(fail(
            Value,
            "topk_n_range",
            format!("n must be in 8..65536, got {n}"),
        )
        .operand("n"));
    }
    if !(1..32768).contains(&k) || k > n {
        return Err(fail(
            Shape,
            "topk_k_range",
            format!(
                "K (val_dst elements per partition) must be in 1..32768 and <= n = {n}, got {k}"
            ),
        )
        .operand("val_dst"));
    }
    let need = (n + 15) / 16;
    if (t.src.free_size() as i64) < need {
        return Err(fail(
            Shape,
            "topk_src_too_small",
            format!(
                "src needs at least ceil(n/16) = {need} elements per partition for n = {n}, got {}",
                t.src.free_size()
            ),
        )
        .operand("src"));
    }
    Ok(())
}

/// Total order used for ranking: by value, NaN above +inf (our choice; undocumented).
fn rank(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

impl Semantics for Topk<'_> {
    fn check(&self) -> Result<()> {
        let (val, idx, src) = (self.val_dst, self.idx_dst, self.src);
        same_parts(src, "src", val, "val_dst")?;
        same_parts(src, "src", idx, "idx_dst")?;
        if !(src.parts as usize).is_multiple_of(CORE_PARTS) {
            return Err(fail(
                Shape,
                "gpsimd_core_partitions",
                format!(
                    "topk needs a multiple of 16 partitions (the snake spans 16), got {}",
                    src.parts
                ),
            )
            .operand("src"));
        }
        if idx.free_size() != val.free_size() {
            return Err(fail(
                Shape,
                "free_size_mismatch",
                format!(
                    "idx_dst has {} elements per partition but val_dst has {}: they must match",
                    idx.free_size(),
                    val.free_size()
                ),
            )
            .operand("idx_dst"));
        }
        check_sizes(self)
    }

    /// One problem per 16-partition group: element e of the snake is at partition 16g + e % 16,
    /// column e / 16. The K largest (ties: the lower index wins a place) are written in
    /// ascending value order, equal values by ascending index, to every partition of the group:
    /// values as the source bf16 bits, indices as uint32.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (val, idx, src) = (self.val_dst, self.idx_dst, self.src);
        let n = self.n.max(0) as usize;
        let k = val.free_size();
        let f = src.free_size();
        let raw = ctx.read_raw(src);
        let x = ctx.read_f32(src);
        let mut vals = Vec::with_capacity(val.num_elements());
        let mut idxs = Vec::with_capacity(idx.num_elements());
        for g in 0..src.parts as usize / CORE_PARTS {
            let at = |e: usize| (g * CORE_PARTS + e % CORE_PARTS) * f + e / CORE_PARTS;
            let mut order: Vec<usize> = (0..n).collect();
            // Descending by value, ascending index among equals; keep K.
            order.sort_by(|&a, &b| rank(x[at(b)], x[at(a)]).then(a.cmp(&b)));
            order.truncate(k);
            order.sort_by(|&a, &b| rank(x[at(a)], x[at(b)]).then(a.cmp(&b)));
            for _ in 0..CORE_PARTS {
                vals.extend(order.iter().map(|&e| raw[at(e)]));
                idxs.extend(order.iter().map(|&e| e as u32));
            }
        }
        ctx.write_raw(val, &vals);
        ctx.write_raw(idx, &idxs);
        Ok(())
    }
}
