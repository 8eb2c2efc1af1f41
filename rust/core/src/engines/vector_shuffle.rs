//! VectorE nc_stream_shuffle: a cross-partition move inside each 32-partition quadrant through
//! the VectorE reshape banks (reference §1.7, §2.6).

use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::nc_stream_shuffle as ss;
use crate::isa::{Instr, Opcode};

const QUADRANT: u32 = 32;
/// A mask entry that leaves its dst partition unchanged.
pub const KEEP: i32 = 255;

pub fn check_nc_stream_shuffle(ins: &Instr) -> Result<()> {
    let dst = ins.ap(ss::DST).unwrap();
    let src = ins.ap(ss::SRC).unwrap();
    if dst.dtype != src.dtype || dst.free_size() != src.free_size() {
        return Err(err(
            Shape,
            format!(
                "src and dst must have the same dtype and elements per partition, got {} x {} and {} x {}",
                src.dtype.name(),
                src.free_size(),
                dst.dtype.name(),
                dst.free_size()
            ),
        )
        .operand("dst"));
    }
    let mask = ins.ints(ss::SHUFFLE_MASK);
    if mask.len() != QUADRANT as usize {
        return Err(err(
            Value,
            format!("shuffle_mask must have 32 entries, got {}", mask.len()),
        )
        .operand("shuffle_mask"));
    }
    if let Some(m) = mask.iter().find(|m| !(0..32).contains(*m) && **m != KEEP) {
        return Err(err(
            Value,
            format!("shuffle_mask entries must be 0..=31 or 255 (keep), got {m}"),
        )
        .operand("shuffle_mask"));
    }
    let active = src.parts.max(dst.parts).div_ceil(QUADRANT) * QUADRANT;
    let starts: &[u32] = match active {
        32 => &[0, 32, 64, 96],
        64 => &[0, 64],
        _ => &[0],
    };
    for (ap, name) in [(src, "src"), (dst, "dst")] {
        if !starts.contains(&ap.start) {
            return Err(err(
                Value,
                format!(
                    "with {active} active partitions the {name} start partition must be one of {starts:?}, got {}",
                    ap.start
                ),
            )
            .operand(name));
        }
    }
    // Every dst partition written must take a partition src actually has.
    for d in 0..dst.parts {
        let m = mask[(d % QUADRANT) as usize];
        if m != KEEP {
            let s = d / QUADRANT * QUADRANT + m as u32;
            if s >= src.parts {
                return Err(err(
                    Shape,
                    format!("shuffle_mask[{}] = {m} sends src partition {s} to dst partition {d}, but src has {} partitions", d % QUADRANT, src.parts),
                )
                .operand("shuffle_mask"));
            }
        }
    }
    Ok(())
}

/// dst row d (quadrant q = d / 32, i = d % 32) = src row 32q + mask[i], bit-exact; rows with
/// mask 255 are not written at all. All of src is read before dst is written, so in-place
/// shuffles work.
pub fn nc_stream_shuffle(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(ss::DST).unwrap();
    let src = ins.ap(ss::SRC).unwrap();
    let mask = ins.ints(ss::SHUFFLE_MASK);
    let row = src.free_size() * src.dtype.size();
    let s = ctx.mems.gather(src);
    for d in 0..dst.parts {
        let m = mask.get((d % QUADRANT) as usize).copied().unwrap_or(KEEP);
        if m == KEEP {
            continue;
        }
        let from = (d / QUADRANT * QUADRANT) as usize + m as usize;
        if let Some(bytes) = s.get(from * row..(from + 1) * row) {
            let mut one = dst.clone();
            one.start = dst.start + d;
            one.parts = 1;
            ctx.mems.scatter(&one, bytes);
        }
    }
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::NcStreamShuffle],
    check: check_nc_stream_shuffle,
    exec: nc_stream_shuffle,
};

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::NcStreamShuffle<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
