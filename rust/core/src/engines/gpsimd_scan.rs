//! GpSimd index scans along a row: `sequence_bounds` (segment start/end of every element) and
//! `nonzero_with_count` (compacted positions of nonzero elements plus their count).

use super::gpsimd::from_i64;
use super::gpsimd_gather::same_parts;
use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::{NonzeroWithCount, SequenceBounds};
use crate::isa::DType;
use crate::memory::Ap;

/// `nonzero_with_count` reads and writes only every 16th partition (one per GpSimd core).
const CORE_PARTS: usize = 16;

/// Whether each element is nonzero / which value it holds, exactly: int32 by its bits, fp32 by
/// value (so -0.0 is zero and NaN is nonzero).
fn keys(ctx: &Ctx, ap: &Ap) -> Vec<(bool, u32)> {
    if ap.dtype == DType::Int32 {
        ctx.read_raw(ap).into_iter().map(|v| (v != 0, v)).collect()
    } else {
        ctx.read_f32(ap)
            .into_iter()
            .map(|v| {
                let key = if v == 0.0 { 0 } else { v.to_bits() };
                (v != 0.0, key)
            })
            .collect()
    }
}

// ------------------------------------------------------------------------------- sequence_bounds

impl Semantics for SequenceBounds<'_> {
    fn check(&self) -> Result<()> {
        let (dst, ids) = (self.dst, self.segment_ids);
        for (ap, n) in [(dst, "dst"), (ids, "segment_ids")] {
            if ap.parts != 1 {
                return Err(fail(
                    Shape,
                    "sequence_bounds_one_partition",
                    format!(
                        "sequence_bounds works on one partition; {n} has {}",
                        ap.parts
                    ),
                )
                .operand(n));
            }
        }
        if dst.free_size() != 2 * ids.free_size() {
            return Err(fail(
                Shape,
                "sequence_bounds_dst_size",
                format!(
                    "dst must be (1, 2, n) = {} elements for n = {} segment ids, got {}",
                    2 * ids.free_size(),
                    ids.free_size(),
                    dst.free_size()
                ),
            )
            .operand("dst"));
        }
        Ok(())
    }

    /// Segments are maximal runs of equal nonzero ids (the docs assume each id is one contiguous
    /// run; a repeated id after a gap starts a new segment — our choice). Padding (id 0) gets
    /// start n and end -1.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let k = keys(ctx, self.segment_ids);
        let n = k.len();
        let mut starts = vec![n as i64; n];
        let mut ends = vec![-1i64; n];
        let mut i = 0;
        while i < n {
            let mut j = i + 1;
            while j < n && k[j].1 == k[i].1 {
                j += 1;
            }
            if k[i].0 {
                for t in i..j {
                    starts[t] = i as i64;
                    ends[t] = j as i64;
                }
            }
            i = j;
        }
        let dst = self.dst;
        let out: Vec<u32> = starts
            .iter()
            .chain(&ends)
            .map(|&v| from_i64(dst.dtype, v))
            .collect();
        ctx.write_raw(dst, &out);
        Ok(())
    }
}

// ---------------------------------------------------------------------------- nonzero_with_count

impl Semantics for NonzeroWithCount<'_> {
    fn check(&self) -> Result<()> {
        let (dst, src) = (self.dst, self.src);
        same_parts(src, "src", dst, "dst")?;
        if dst.free_size() != src.free_size() + 1 {
            return Err(fail(
                Shape,
                "nonzero_dst_size",
                format!(
                    "dst needs T + 1 = {} elements per partition for T = {} src elements, got {}",
                    src.free_size() + 1,
                    src.free_size(),
                    dst.free_size()
                ),
            )
            .operand("dst"));
        }
        Ok(())
    }

    /// Partitions 0, 16, 32, ... of the operands: nonzero positions (+ index_offset) in order,
    /// then padding_val, then the count in the last slot (int32, wrapping). Other dst partitions
    /// keep their contents.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (dst, src) = (self.dst, self.src);
        let (off, pad) = (self.index_offset, self.padding_val);
        let t = src.free_size();
        let k = keys(ctx, src);
        let mut out = ctx.read_raw(dst);
        for p in (0..src.parts as usize).step_by(CORE_PARTS) {
            let row = &k[p * t..(p + 1) * t];
            let o = &mut out[p * (t + 1)..(p + 1) * (t + 1)];
            let mut c = 0usize;
            for (i, (nonzero, _)) in row.iter().enumerate() {
                if *nonzero {
                    o[c] = (i as i32).wrapping_add(off) as u32;
                    c += 1;
                }
            }
            for v in &mut o[c..t] {
                *v = pad as u32;
            }
            o[t] = c as u32;
        }
        ctx.write_raw(dst, &out);
        Ok(())
    }
}
