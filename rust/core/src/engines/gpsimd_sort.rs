//! GpSimd `topk`: the K largest bf16 values of a 16-partition "snake" and their indices.

use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::topk as tk;
use crate::isa::{Instr, Opcode};
use crate::memory::Ap;
use std::cmp::Ordering;

const CORE_PARTS: usize = 16;

fn tensor<'a>(ins: &'a Instr, i: usize, name: &str) -> Result<&'a Ap> {
    ins.ap(i)
        .ok_or_else(|| err(Value, format!("{name} must be a tensor")).operand(name.to_string()))
}

pub fn check(ins: &Instr) -> Result<()> {
    let val = tensor(ins, tk::VAL_DST, "val_dst")?;
    let idx = tensor(ins, tk::IDX_DST, "idx_dst")?;
    let src = tensor(ins, tk::SRC, "src")?;
    let n = ins.i32_or(tk::N, 0) as i64;
    let k = val.free_size() as i64;
    for (ap, name) in [(val, "val_dst"), (idx, "idx_dst")] {
        if ap.parts != src.parts {
            return Err(err(
                Shape,
                format!(
                    "src has {} partitions but {name} has {}: they must match",
                    src.parts, ap.parts
                ),
            )
            .operand(name));
        }
    }
    if !(src.parts as usize).is_multiple_of(CORE_PARTS) {
        return Err(err(
            Shape,
            format!(
                "topk needs a multiple of 16 partitions (the snake spans 16), got {}",
                src.parts
            ),
        )
        .operand("src"));
    }
    if idx.free_size() as i64 != k {
        return Err(err(
            Shape,
            format!(
                "idx_dst has {} elements per partition but val_dst has {k}: they must match",
                idx.free_size()
            ),
        )
        .operand("idx_dst"));
    }
    if !(8..65536).contains(&n) {
        return Err(err(Value, format!("n must be in 8..65536, got {n}")).operand("n"));
    }
    if !(1..32768).contains(&k) || k > n {
        return Err(err(
            Shape,
            format!(
                "K (val_dst elements per partition) must be in 1..32768 and <= n = {n}, got {k}"
            ),
        )
        .operand("val_dst"));
    }
    let need = (n + 15) / 16;
    if (src.free_size() as i64) < need {
        return Err(err(
            Shape,
            format!(
                "src needs at least ceil(n/16) = {need} elements per partition for n = {n}, got {}",
                src.free_size()
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

/// One problem per 16-partition group: element e of the snake is at partition 16g + e % 16,
/// column e / 16. The K largest (ties: the lower index wins a place) are written in ascending
/// value order, equal values by ascending index, to every partition of the group: values as
/// the source bf16 bits, indices as uint32.
pub fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let val = tensor(ins, tk::VAL_DST, "val_dst")?;
    let idx = tensor(ins, tk::IDX_DST, "idx_dst")?;
    let src = tensor(ins, tk::SRC, "src")?;
    let n = ins.i32_or(tk::N, 0).max(0) as usize;
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

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::Topk],
    check,
    exec,
};

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::Topk<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
