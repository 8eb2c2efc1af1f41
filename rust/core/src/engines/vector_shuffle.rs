//! VectorE nc_stream_shuffle: a cross-partition move inside each 32-partition quadrant through
//! the VectorE reshape banks (reference §1.7, §2.6).

use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::NcStreamShuffle;
use crate::memory::Ap;

const QUADRANT: u32 = 32;
/// A mask entry that leaves its dst partition unchanged.
pub const KEEP: i32 = 255;

/// 32 entries, each a quadrant-relative source partition or KEEP.
fn check_mask(mask: &[i32]) -> Result<()> {
    if mask.len() != QUADRANT as usize {
        return Err(fail(
            Value,
            "shuffle_mask_length",
            format!("shuffle_mask must have 32 entries, got {}", mask.len()),
        )
        .operand("shuffle_mask"));
    }
    if let Some(m) = mask.iter().find(|m| !(0..32).contains(*m) && **m != KEEP) {
        return Err(fail(
            Value,
            "shuffle_mask_entry",
            format!("shuffle_mask entries must be 0..=31 or 255 (keep), got {m}"),
        )
        .operand("shuffle_mask"));
    }
    Ok(())
}

/// src and dst start on a boundary of the active partition span (32, 64 or 128 partitions).
fn check_starts(src: &Ap, dst: &Ap) -> Result<()> {
    let active = src.parts.max(dst.parts).div_ceil(QUADRANT) * QUADRANT;
    let starts: &[u32] = match active {
        32 => &[0, 32, 64, 96],
        64 => &[0, 64],
        _ => &[0],
    };
    for (ap, name) in [(src, "src"), (dst, "dst")] {
        if !starts.contains(&ap.start) {
            return Err(fail(
                Value,
                "stream_shuffle_start_partition",
                format!(
                    "with {active} active partitions the {name} start partition must be one of {starts:?}, got {}",
                    ap.start
                ),
            )
            .operand(name));
        }
    }
    Ok(())
}

impl Semantics for NcStreamShuffle<'_> {
    fn check(&self) -> Result<()> {
        let (dst, src) = (self.dst, self.src);
        if dst.dtype != src.dtype || dst.free_size() != src.free_size() {
            return Err(fail(
                Shape,
                "stream_shuffle_operand_mismatch",
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
        let mask = self.shuffle_mask;
        check_mask(mask)?;
        check_starts(src, dst)?;
        // Every dst partition written must take a partition src actually has.
        for d in 0..dst.parts {
            let m = mask[(d % QUADRANT) as usize];
            if m != KEEP {
                let s = d / QUADRANT * QUADRANT + m as u32;
                if s >= src.parts {
                    return Err(fail(
                        Shape,
                        "shuffle_mask_source_partition",
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
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (dst, src) = (self.dst, self.src);
        let mask = self.shuffle_mask;
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
}
