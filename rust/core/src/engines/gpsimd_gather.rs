//! GpSimd gathers along each partition's own free dimension: `local_gather` (per 16-partition
//! GpSimd core, a shared index list of contiguous runs) and `nc_n_gather` (per-partition indices).
//! Dtypes are never converted: dst elements are the source's bits.

use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::{LocalGather, NcNGather};
use crate::memory::Ap;

/// Partitions served by one GpSimd core.
const CORE_PARTS: u32 = 16;
/// Indices one GpSimd core can hold for `local_gather`.
const MAX_INDICES_PER_CORE: i64 = 4096;

fn same_dtype(dst: &Ap, src: &Ap, src_name: &str) -> Result<()> {
    if dst.dtype != src.dtype {
        return Err(fail(
            Dtype,
            "dtype_mismatch",
            format!(
                "dst dtype {} must equal {src_name} dtype {} (gathers do not convert)",
                dst.dtype.name(),
                src.dtype.name()
            ),
        )
        .operand("dst"));
    }
    if dst.dtype.is_packed() {
        return Err(fail(
            Dtype,
            "packed_dtype_not_allowed",
            format!("cannot gather packed MX dtype {}", dst.dtype.name()),
        )
        .operand("dst"));
    }
    Ok(())
}

/// `a` and `b` have the same partition count.
pub(super) fn same_parts(a: &Ap, an: &str, b: &Ap, bn: &str) -> Result<()> {
    if a.parts != b.parts {
        return Err(fail(
            Shape,
            "partition_count_mismatch",
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

/// (num_elem_per_idx, num_valid_indices) after defaults (all indices of the 16 partitions).
fn local_params(g: &LocalGather) -> (i64, i64) {
    let e = g.num_elem_per_idx as i64;
    let all = CORE_PARTS as i64 * g.index.free_size() as i64;
    (e, g.num_valid_indices.map_or(all, |v| v as i64))
}

/// num_elem_per_idx a power of two up to 32; num_valid_indices within the index block and a
/// core's capacity; dst holds exactly the gathered runs.
fn check_local_counts(g: &LocalGather) -> Result<()> {
    let (e, valid) = local_params(g);
    if ![1, 2, 4, 8, 16, 32].contains(&e) {
        return Err(fail(
            Value,
            "local_gather_elem_per_idx",
            format!("num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, got {e}"),
        )
        .operand("num_elem_per_idx"));
    }
    let all = CORE_PARTS as i64 * g.index.free_size() as i64;
    if valid < 1 || valid > all {
        return Err(fail(
            Value,
            "local_gather_valid_indices",
            format!("num_valid_indices must be in 1..={all} (16 partitions x index columns), got {valid}"),
        )
        .operand("num_valid_indices"));
    }
    if valid > MAX_INDICES_PER_CORE {
        return Err(fail(
            Shape,
            "local_gather_core_indices",
            format!("a GpSimd core holds at most {MAX_INDICES_PER_CORE} indices, got {valid}"),
        )
        .operand("num_valid_indices"));
    }
    if g.dst.free_size() as i64 != valid * e {
        return Err(fail(
            Shape,
            "free_size_mismatch",
            format!(
                "dst has {} elements per partition but num_valid_indices * num_elem_per_idx = {valid} * {e} = {}",
                g.dst.free_size(),
                valid * e
            ),
        )
        .operand("dst"));
    }
    Ok(())
}

impl Semantics for LocalGather<'_> {
    fn check(&self) -> Result<()> {
        let (dst, src, index) = (self.dst, self.src_buffer, self.index);
        same_dtype(dst, src, "src_buffer")?;
        same_parts(src, "src_buffer", index, "index")?;
        same_parts(src, "src_buffer", dst, "dst")?;
        if src.parts % CORE_PARTS != 0 {
            return Err(fail(
                Shape,
                "gpsimd_core_partitions",
                format!(
                    "local_gather needs a multiple of 16 partitions (one GpSimd core each), got {}",
                    src.parts
                ),
            )
            .operand("src_buffer"));
        }
        check_local_counts(self)
    }

    /// Group g (partitions 16g..16g+16 of the operands) reads its index block column by column
    /// (partition-first), keeps the first `valid` offsets, and every partition p of the group
    /// gets `dst[p, j, e] = src[p, idx_j + e]`. An offset run past the row is an error
    /// (hardware: undefined).
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (dst, src, index) = (self.dst, self.src_buffer, self.index);
        let (e, valid) = local_params(self);
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
                return Err(fail(
                    Address,
                    "gather_index_out_of_range",
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
}

// ----------------------------------------------------------------------------------- nc_n_gather

impl Semantics for NcNGather<'_> {
    fn check(&self) -> Result<()> {
        let (dst, data, indices) = (self.dst, self.data, self.indices);
        same_dtype(dst, data, "data")?;
        same_parts(data, "data", indices, "indices")?;
        same_parts(data, "data", dst, "dst")?;
        if dst.free_size() != indices.free_size() {
            return Err(fail(
                Shape,
                "free_size_mismatch",
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
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (data, indices) = (self.data, self.indices);
        let s = data.free_size();
        let k = indices.free_size();
        let x = ctx.read_raw(data);
        let idx = ctx.read_raw(indices);
        let mut out = Vec::with_capacity(idx.len());
        for (n, &i) in idx.iter().enumerate() {
            let p = n / k.max(1);
            if i as usize >= s {
                return Err(fail(
                    Address,
                    "gather_index_out_of_range",
                    format!(
                        "indices[{p}, {}] = {i} is outside data's {s} elements per partition",
                        n % k.max(1)
                    ),
                )
                .operand("indices"));
            }
            out.push(x[p * s + i as usize]);
        }
        ctx.write_raw(self.dst, &out);
        Ok(())
    }
}
