//! GpSimd gathers along each partition's own free dimension: `local_gather` (per 16-partition
//! GpSimd core, a shared index list of contiguous runs) and `nc_n_gather` (per-partition indices).
//! Dtypes are never converted: dst elements are the source's bits.

use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::{local_gather as lg, nc_n_gather as ng};
use crate::isa::{Arg, Instr, Opcode};
use crate::memory::Ap;

/// Partitions served by one GpSimd core.
const CORE_PARTS: u32 = 16;
/// Indices one GpSimd core can hold for `local_gather`.
const MAX_INDICES_PER_CORE: i64 = 4096;

fn tensor<'a>(ins: &'a Instr, i: usize, name: &str) -> Result<&'a Ap> {
    ins.ap(i)
        .ok_or_else(|| err(Value, format!("{name} must be a tensor")).operand(name.to_string()))
}

fn same_dtype(dst: &Ap, src: &Ap, src_name: &str) -> Result<()> {
    if dst.dtype != src.dtype {
        return Err(err(
            Dtype,
            format!(
                "dst dtype {} must equal {src_name} dtype {} (gathers do not convert)",
                dst.dtype.name(),
                src.dtype.name()
            ),
        )
        .operand("dst"));
    }
    if dst.dtype.is_packed() {
        return Err(err(
            Dtype,
            format!("cannot gather packed MX dtype {}", dst.dtype.name()),
        )
        .operand("dst"));
    }
    Ok(())
}

fn same_parts(a: &Ap, an: &str, b: &Ap, bn: &str) -> Result<()> {
    if a.parts != b.parts {
        return Err(err(
            Shape,
            format!(
                "{an} has {} partitions but {bn} has {}: they must match",
                a.parts, b.parts
            ),
        )
        .operand(bn.to_string()));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------- local_gather

/// (num_elem_per_idx, num_valid_indices) after defaults.
fn local_params(ins: &Instr, index: &Ap) -> (i64, i64) {
    let e = ins.i32_or(lg::NUM_ELEM_PER_IDX, 1) as i64;
    let all = CORE_PARTS as i64 * index.free_size() as i64;
    let valid = match ins.arg(lg::NUM_VALID_INDICES) {
        Arg::I32(v) => *v as i64,
        _ => all,
    };
    (e, valid)
}

pub fn check_local_gather(ins: &Instr) -> Result<()> {
    let dst = tensor(ins, lg::DST, "dst")?;
    let src = tensor(ins, lg::SRC_BUFFER, "src_buffer")?;
    let index = tensor(ins, lg::INDEX, "index")?;
    same_dtype(dst, src, "src_buffer")?;
    same_parts(src, "src_buffer", index, "index")?;
    same_parts(src, "src_buffer", dst, "dst")?;
    if src.parts % CORE_PARTS != 0 {
        return Err(err(
            Shape,
            format!(
                "local_gather needs a multiple of 16 partitions (one GpSimd core each), got {}",
                src.parts
            ),
        )
        .operand("src_buffer"));
    }
    let (e, valid) = local_params(ins, index);
    if ![1, 2, 4, 8, 16, 32].contains(&e) {
        return Err(err(
            Value,
            format!("num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, got {e}"),
        )
        .operand("num_elem_per_idx"));
    }
    let all = CORE_PARTS as i64 * index.free_size() as i64;
    if valid < 1 || valid > all {
        return Err(err(
            Value,
            format!("num_valid_indices must be in 1..={all} (16 partitions x index columns), got {valid}"),
        )
        .operand("num_valid_indices"));
    }
    if valid > MAX_INDICES_PER_CORE {
        return Err(err(
            Shape,
            format!("a GpSimd core holds at most {MAX_INDICES_PER_CORE} indices, got {valid}"),
        )
        .operand("num_valid_indices"));
    }
    if dst.free_size() as i64 != valid * e {
        return Err(err(
            Shape,
            format!(
                "dst has {} elements per partition but num_valid_indices * num_elem_per_idx = {valid} * {e} = {}",
                dst.free_size(),
                valid * e
            ),
        )
        .operand("dst"));
    }
    Ok(())
}

/// Group g (partitions 16g..16g+16 of the operands) reads its index block column by column
/// (partition-first), keeps the first `valid` offsets, and every partition p of the group gets
/// `dst[p, j, e] = src[p, idx_j + e]`. An offset run past the row is an error (hardware: undefined).
pub fn local_gather(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = tensor(ins, lg::DST, "dst")?;
    let src = tensor(ins, lg::SRC_BUFFER, "src_buffer")?;
    let index = tensor(ins, lg::INDEX, "index")?;
    let (e, valid) = local_params(ins, index);
    let (e, valid) = (e as usize, valid as usize);
    let s = src.free_size();
    let k = index.free_size();
    let x = ctx.read_raw(src);
    let idx = ctx.read_raw(index);
    let g16 = CORE_PARTS as usize;
    let mut out = vec![0u32; dst.num_elements()];
    for g in 0..(src.parts as usize / g16) {
        let list: Vec<usize> = (0..valid)
            .map(|j| idx[(g * g16 + j % g16) * k + j / g16] as usize)
            .collect();
        if let Some((j, &bad)) = list.iter().enumerate().find(|(_, &i)| i + e > s) {
            return Err(err(
                Address,
                format!(
                    "index {j} of partitions {}..{} is {bad}: a run of {e} elements from it passes the {s} elements of src_buffer's row",
                    g * g16,
                    (g + 1) * g16
                ),
            )
            .operand("index"));
        }
        for p in g * g16..(g + 1) * g16 {
            let row = &x[p * s..(p + 1) * s];
            let o = &mut out[p * valid * e..(p + 1) * valid * e];
            for (j, &i) in list.iter().enumerate() {
                o[j * e..(j + 1) * e].copy_from_slice(&row[i..i + e]);
            }
        }
    }
    ctx.write_raw(dst, &out);
    Ok(())
}

// ----------------------------------------------------------------------------------- nc_n_gather

pub fn check_nc_n_gather(ins: &Instr) -> Result<()> {
    let dst = tensor(ins, ng::DST, "dst")?;
    let data = tensor(ins, ng::DATA, "data")?;
    let indices = tensor(ins, ng::INDICES, "indices")?;
    same_dtype(dst, data, "data")?;
    same_parts(data, "data", indices, "indices")?;
    same_parts(data, "data", dst, "dst")?;
    if dst.free_size() != indices.free_size() {
        return Err(err(
            Shape,
            format!(
                "dst has {} elements per partition but indices has {}: they must match",
                dst.free_size(),
                indices.free_size()
            ),
        )
        .operand("dst"));
    }
    Ok(())
}

/// `dst[p, i] = flat(data[p])[indices[p, i]]`; an index outside the row is an error.
pub fn nc_n_gather(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = tensor(ins, ng::DST, "dst")?;
    let data = tensor(ins, ng::DATA, "data")?;
    let indices = tensor(ins, ng::INDICES, "indices")?;
    let s = data.free_size();
    let k = indices.free_size();
    let x = ctx.read_raw(data);
    let idx = ctx.read_raw(indices);
    let mut out = Vec::with_capacity(idx.len());
    for (n, &i) in idx.iter().enumerate() {
        let p = n / k.max(1);
        if i as usize >= s {
            return Err(err(
                Address,
                format!(
                    "indices[{p}, {}] = {i} is outside data's {s} elements per partition",
                    n % k.max(1)
                ),
            )
            .operand("indices"));
        }
        out.push(x[p * s + i as usize]);
    }
    ctx.write_raw(dst, &out);
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::LocalGather, Opcode::NcNGather],
    check,
    exec,
};

fn check(ins: &Instr) -> Result<()> {
    match ins.op {
        Opcode::LocalGather => check_local_gather(ins),
        Opcode::NcNGather => check_nc_n_gather(ins),
        _ => Ok(()),
    }
}

fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    match ins.op {
        Opcode::LocalGather => local_gather(ins, ctx),
        Opcode::NcNGather => nc_n_gather(ins, ctx),
        _ => Err(err(
            Internal,
            format!("{} is listed but not dispatched", ins.op.spec().name),
        )),
    }
}

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::LocalGather<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::NcNGather<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
