//! GpSimd index scans along a row: `sequence_bounds` (segment start/end of every element) and
//! `nonzero_with_count` (compacted positions of nonzero elements plus their count).

use super::gpsimd::from_i64;
use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::{nonzero_with_count as nz, sequence_bounds as sb};
use crate::isa::{DType, Instr, Opcode};
use crate::memory::Ap;

/// `nonzero_with_count` reads and writes only every 16th partition (one per GpSimd core).
const CORE_PARTS: usize = 16;

fn tensor<'a>(ins: &'a Instr, i: usize, name: &str) -> Result<&'a Ap> {
    ins.ap(i)
        .ok_or_else(|| err(Value, format!("{name} must be a tensor")).operand(name.to_string()))
}

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

pub fn check_sequence_bounds(ins: &Instr) -> Result<()> {
    let dst = tensor(ins, sb::DST, "dst")?;
    let ids = tensor(ins, sb::SEGMENT_IDS, "segment_ids")?;
    for (ap, n) in [(dst, "dst"), (ids, "segment_ids")] {
        if ap.parts != 1 {
            return Err(err(
                Shape,
                format!(
                    "sequence_bounds works on one partition; {n} has {}",
                    ap.parts
                ),
            )
            .operand(n));
        }
    }
    if dst.free_size() != 2 * ids.free_size() {
        return Err(err(
            Shape,
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
/// run; a repeated id after a gap starts a new segment — our choice). Padding (id 0) gets start
/// n and end -1.
pub fn sequence_bounds(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = tensor(ins, sb::DST, "dst")?;
    let ids = tensor(ins, sb::SEGMENT_IDS, "segment_ids")?;
    let k = keys(ctx, ids);
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
    let out: Vec<u32> = starts
        .iter()
        .chain(&ends)
        .map(|&v| from_i64(dst.dtype, v))
        .collect();
    ctx.write_raw(dst, &out);
    Ok(())
}

// ---------------------------------------------------------------------------- nonzero_with_count

pub fn check_nonzero_with_count(ins: &Instr) -> Result<()> {
    let dst = tensor(ins, nz::DST, "dst")?;
    let src = tensor(ins, nz::SRC, "src")?;
    if dst.parts != src.parts {
        return Err(err(
            Shape,
            format!(
                "src has {} partitions but dst has {}: they must match",
                src.parts, dst.parts
            ),
        )
        .operand("dst"));
    }
    if dst.free_size() != src.free_size() + 1 {
        return Err(err(
            Shape,
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

/// Partitions 0, 16, 32, ... of the operands: nonzero positions (+ index_offset) in order, then
/// padding_val, then the count in the last slot (int32, wrapping). Other dst partitions keep
/// their contents.
pub fn nonzero_with_count(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = tensor(ins, nz::DST, "dst")?;
    let src = tensor(ins, nz::SRC, "src")?;
    let off = ins.i32_or(nz::INDEX_OFFSET, 0);
    let pad = ins.i32_or(nz::PADDING_VAL, -1);
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

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::SequenceBounds, Opcode::NonzeroWithCount],
    check,
    exec,
};

fn check(ins: &Instr) -> Result<()> {
    match ins.op {
        Opcode::SequenceBounds => check_sequence_bounds(ins),
        Opcode::NonzeroWithCount => check_nonzero_with_count(ins),
        _ => Ok(()),
    }
}

fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    match ins.op {
        Opcode::SequenceBounds => sequence_bounds(ins, ctx),
        Opcode::NonzeroWithCount => nonzero_with_count(ins, ctx),
        _ => Err(err(
            Internal,
            format!("{} is listed but not dispatched", ins.op.spec().name),
        )),
    }
}

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::SequenceBounds<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::NonzeroWithCount<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
