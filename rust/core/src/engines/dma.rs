//! DMA transfers: `dma_copy`, `dma_compute` (sums and near-memory read-add-write) and
//! `dma_transpose`, with dynamic offsets and descriptor-generation (DGE) restrictions. Queues and
//! timing live in the machine.

use super::dynamic::{resolve, Resolved};
use super::{Ctx, Semantics};
use crate::error::{fail, try_vec, EmuError, ErrorKind::*, Result};
use crate::isa::ops;
use crate::isa::tables::OobMode;
use crate::isa::{AluOp, DType, DgeMode, Engine, Instr, Opcode};
use crate::memory::{Ap, DynKind, DynSrc, Mem};

fn is_vector(ap: &Ap) -> bool {
    ap.dynamic
        .as_deref()
        .is_some_and(|d| d.kind == DynKind::Vector)
}

fn check_priority(priority: Option<i32>) -> Result<()> {
    if let Some(p) = priority {
        if !(0..=3).contains(&p) {
            return Err(fail(
                Value,
                "dma_priority_range",
                format!("priority {p} outside 0..3"),
            )
            .operand("priority"));
        }
    }
    Ok(())
}

/// DGE restrictions shared by copies and transposes: hwdge is triggered only by the sync or
/// scalar sequencer; vector offsets (gather/scatter) need descriptors built at run time (swdge).
fn check_dge(engine: Engine, dge: DgeMode, vector: bool) -> Result<()> {
    if dge == DgeMode::Hwdge && !matches!(engine, Engine::Sync | Engine::Scalar) {
        return Err(fail(
            Value,
            "hwdge_trigger_engine",
            format!(
                "hwdge DMAs are triggered only from the sync or scalar engine, not {}",
                engine.name()
            ),
        )
        .operand("dge_mode"));
    }
    if vector && !matches!(dge, DgeMode::Swdge | DgeMode::Unknown) {
        return Err(fail(
            Value,
            "vector_offset_needs_swdge",
            "vector_offset gather/scatter needs software descriptor generation (dge_mode swdge or unknown)",
        )
        .operand("dge_mode"));
    }
    Ok(())
}

fn same_rows(a: &Ap, an: &str, b: &Ap, bn: &str) -> Result<()> {
    if a.parts != b.parts || a.free_size() != b.free_size() {
        return Err(fail(
            Shape,
            "vector_offset_rows_mismatch",
            format!(
                "a vector_offset moves whole rows: {an} {:?} and {bn} {:?} need the same rows and elements per row",
                a.shape(),
                b.shape()
            ),
        )
        .operand(bn.to_string()));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------- dma_copy

impl Semantics for ops::DmaCopy<'_> {
    fn check(&self) -> Result<()> {
        let (dst, src) = (self.dst, self.src);
        if dst.num_elements() != src.num_elements() {
            return Err(fail(
                Shape,
                "dma_element_count_mismatch",
                format!(
                    "dst has {} elements but src has {} ({:?} vs {:?})",
                    dst.num_elements(),
                    src.num_elements(),
                    dst.shape(),
                    src.shape()
                ),
            )
            .operand("dst"));
        }
        if dst.dtype != src.dtype {
            if dst.dtype.is_packed() || src.dtype.is_packed() {
                return Err(fail(
                    Dtype,
                    "dma_packed_cast",
                    format!(
                        "DMA cannot cast packed MX dtypes ({} -> {})",
                        src.dtype.name(),
                        dst.dtype.name()
                    ),
                )
                .operand("dst"));
            }
            if self.dge_mode == DgeMode::Hwdge {
                return Err(fail(
                    Dtype,
                    "hwdge_dtype_mismatch",
                    "hwdge DMA moves raw bytes: dst and src dtypes must be equal",
                )
                .operand("dst"));
            }
        }
        check_priority(self.priority)?;
        let vector = is_vector(dst) || is_vector(src);
        check_dge(self.ins.engine, self.dge_mode, vector)?;
        if vector {
            same_rows(src, "src", dst, "dst")?;
        }
        Ok(())
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let skip = self.oob_mode == OobMode::Skip;
        let d = resolve(ctx, self.dst, skip).map_err(|e| e.operand("dst"))?;
        let s = resolve(ctx, self.src, skip).map_err(|e| e.operand("src"))?;
        match (d, s) {
            (Resolved::Skip, _) | (_, Resolved::Skip) => {}
            (Resolved::Whole(d), Resolved::Whole(s)) => copy(ctx, &d, &s)?,
            (d, s) => {
                for (d, s) in d.into_rows().into_iter().zip(s.into_rows()) {
                    if let (Some(d), Some(s)) = (d, s) {
                        copy(ctx, &d, &s)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Copy `src` to `dst` (static patterns): raw bytes for equal dtypes, else through fp32.
/// Fast paths first: HBM <-> on-chip dense rows as slices, on-chip streams (which fall back
/// themselves when dst overlaps a source row not yet read); else gather then scatter (a
/// staging buffer the host cannot allocate is a `ResourceError`, not an abort).
fn copy(ctx: &mut Ctx, dst: &Ap, src: &Ap) -> Result<()> {
    if dst.dtype == src.dtype {
        if ctx.mems.copy_dense_hbm(dst, src) || super::rows::copy_same(ctx, dst, src) {
            return Ok(());
        }
        let raw = ctx.mems.try_gather(src).map_err(|e| e.operand("src"))?;
        ctx.mems
            .try_scatter(dst, &raw)
            .map_err(|e| e.operand("dst"))?;
    } else {
        let work = super::rows::stream_work(dst);
        if super::rows::cast_dense_hbm(ctx, dst, src)
            || super::rows::map_f32_rows_par(ctx, dst, [src], work, |_, [x], out| {
                out.copy_from_slice(x)
            })
            || super::rows::map_f32(ctx, dst, [src], |_, _, _, _, [x], out| {
                out.copy_from_slice(x)
            })
        {
            return Ok(());
        }
        let v = ctx.read_f32(src);
        ctx.write_f32(dst, &v);
    }
    Ok(())
}

// ------------------------------------------------------------------------------- dma_compute

impl<'a> ops::DmaCompute<'a> {
    /// The 16 source slots (src0 ..= src15), given or not.
    fn slots(&self) -> [Option<&'a Ap>; 16] {
        [
            Some(self.src0),
            self.src1,
            self.src2,
            self.src3,
            self.src4,
            self.src5,
            self.src6,
            self.src7,
            self.src8,
            self.src9,
            self.src10,
            self.src11,
            self.src12,
            self.src13,
            self.src14,
            self.src15,
        ]
    }

    /// The given sources with their operand names, in order.
    fn sources(&self) -> Vec<(String, &'a Ap)> {
        self.slots()
            .into_iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (format!("src{i}"), s)))
            .collect()
    }

    /// One source is the dst itself: a read-add-write (B += A).
    pub fn is_rmw(&self) -> bool {
        self.slots().into_iter().flatten().any(|s| s == self.dst)
    }
}

/// The dst's parameter index when `ins` is a `dma_compute` whose dst is also one of its
/// sources (read-add-write), else None.
pub fn rmw_target(ins: &Instr) -> Option<usize> {
    if ins.op != Opcode::DmaCompute || !ops::DmaCompute::view(ins).ok()?.is_rmw() {
        return None;
    }
    ins.op.spec().params.iter().position(|p| p.access.writes())
}

fn check_compute_operands(v: &ops::DmaCompute) -> Result<()> {
    let slots = v.slots();
    let given = slots.iter().filter(|s| s.is_some()).count();
    let gap = slots.iter().take_while(|s| s.is_some()).count();
    if gap != given {
        return Err(fail(
            Value,
            "dma_compute_source_gap",
            format!(
                "srcs must be given in order without gaps: src{gap} is missing but a later source is present"
            ),
        )
        .operand(format!("src{gap}")));
    }
    if v.reduce_op != AluOp::Add {
        return Err(fail(
            Value,
            "dma_compute_reduce_op",
            "dma_compute supports reduce_op=add only",
        )
        .operand("reduce_op"));
    }
    if v.scale.f32().to_bits() != 1.0f32.to_bits() {
        return Err(fail(
            Value,
            "dma_compute_scale",
            "dma_compute has no scale mode: every scale must be 1.0 (NKI 0.4 removed the additive scale)",
        )
        .operand("scale"));
    }
    if !v.unique_indices {
        return Err(fail(
            Value,
            "dma_compute_unique_indices",
            "unique_indices must be True: duplicate scatter indices would be lost updates in the DMA",
        )
        .operand("unique_indices"));
    }
    Ok(())
}

fn check_compute_sources(v: &ops::DmaCompute) -> Result<()> {
    let dst = v.dst;
    let srcs = v.sources();
    for (name, s) in &srcs {
        if s.num_elements() != dst.num_elements() {
            return Err(fail(
                Shape,
                "dma_element_count_mismatch",
                format!(
                    "every source has dst's element count: {name} has {} ({:?}), dst {} ({:?})",
                    s.num_elements(),
                    s.shape(),
                    dst.num_elements(),
                    dst.shape()
                ),
            )
            .operand(name.clone()));
        }
    }
    let rmw = v.is_rmw();
    if rmw && dst.mem == Mem::Sbuf {
        for (name, s) in &srcs {
            if s.dtype != dst.dtype || !matches!(dst.dtype, DType::Bfloat16 | DType::Float32) {
                return Err(fail(
                    Dtype,
                    "sbuf_rmw_dtype",
                    format!(
                        "SBUF read-add-write (B += A) needs bf16 or fp32 on both sides, same dtype; got dst {} and {name} {}",
                        dst.dtype.name(),
                        s.dtype.name()
                    ),
                )
                .operand(name.clone()));
            }
        }
    }
    let vector = is_vector(dst) || srcs.iter().any(|(_, s)| is_vector(s));
    if vector {
        if srcs.len() != 2 || !rmw {
            return Err(fail(
                Value,
                "vector_offset_dma_compute_form",
                "vector_offset dma_compute is scatter-add (dst_hbm[idx] += src_sbuf) or gather-add (dst_sbuf += src_hbm[idx]): exactly 2 sources, one of them dst",
            )
            .operand("src0"));
        }
        for (name, s) in &srcs {
            same_rows(dst, "dst", s, name)?;
        }
    }
    Ok(())
}

/// dst = src0 + src1 + ... in fp32 (source order), cast once to dst. Every source is read
/// before dst is written, so a source that is dst reads the old value (B += A).
fn sum_into(ctx: &mut Ctx, dst: &Ap, srcs: &[Ap]) {
    let mut acc = ctx.read_f32(&srcs[0]);
    for s in &srcs[1..] {
        for (a, b) in acc.iter_mut().zip(ctx.read_f32(s)) {
            *a += b;
        }
    }
    ctx.write_f32(dst, &acc);
}

impl Semantics for ops::DmaCompute<'_> {
    fn check(&self) -> Result<()> {
        check_compute_operands(self)?;
        check_compute_sources(self)
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let skip = self.oob_mode == OobMode::Skip;
        let mut all = vec![resolve(ctx, self.dst, skip).map_err(|e| e.operand("dst"))?];
        for (name, s) in self.sources() {
            all.push(resolve(ctx, s, skip).map_err(|e| e.operand(name))?);
        }
        if all.iter().any(|r| matches!(r, Resolved::Skip)) || all.len() < 2 {
            return Ok(());
        }
        if all.iter().all(|r| matches!(r, Resolved::Whole(_))) {
            let aps: Vec<Ap> = all
                .into_iter()
                .filter_map(|r| match r {
                    Resolved::Whole(a) => Some(a),
                    _ => None,
                })
                .collect();
            sum_into(ctx, &aps[0], &aps[1..]);
            return Ok(());
        }
        let rows: Vec<Vec<Option<Ap>>> = all.into_iter().map(|r| r.into_rows()).collect();
        let n = rows.iter().map(|r| r.len()).min().unwrap_or(0);
        for r in 0..n {
            let row: Option<Vec<Ap>> = rows.iter().map(|v| v[r].clone()).collect();
            if let Some(row) = row {
                sum_into(ctx, &row[0], &row[1..]);
            }
        }
        Ok(())
    }
}

// ----------------------------------------------------------------------------- dma_transpose

/// The documented permutation for each rank.
fn default_axes(rank: usize) -> Option<&'static [i32]> {
    match rank {
        2 => Some(&[1, 0]),
        3 => Some(&[2, 1, 0]),
        4 => Some(&[3, 1, 2, 0]),
        _ => None,
    }
}

fn terr(rule: &'static str, msg: String, operand: &str) -> EmuError {
    fail(Shape, rule, msg).operand(operand.to_string())
}

/// Dtypes, rank, axes and the permuted dst shape (every form).
fn check_transpose_shape(v: &ops::DmaTranspose) -> Result<()> {
    let (dst, src) = (v.dst, v.src);
    if dst.dtype != src.dtype {
        return Err(fail(
            Dtype,
            "dma_transpose_dtype_mismatch",
            format!(
                "dma_transpose moves raw elements: dst {} and src {} must have the same dtype",
                dst.dtype.name(),
                src.dtype.name()
            ),
        )
        .operand("dst"));
    }
    let s = src.shape();
    let axes = default_axes(s.len()).ok_or_else(|| {
        terr(
            "dma_transpose_rank",
            format!("dma_transpose takes a 2-, 3- or 4-D src, got {s:?}"),
            "src",
        )
    })?;
    if let Some(given) = v.axes {
        if given != axes {
            return Err(fail(
                Value,
                "dma_transpose_axes",
                format!(
                    "axes {given:?} is not the documented permutation for a {}-D src ({axes:?}; 2-D (1,0), 3-D (2,1,0), 4-D (3,1,2,0))",
                    s.len()
                ),
            )
            .operand("axes"));
        }
    }
    let last = s[s.len() - 1];
    if last > 128 {
        return Err(terr(
            "dma_transpose_last_dim_too_large",
            format!("src.shape[-1] = {last} exceeds 128 (DMA transpose limit)"),
            "src",
        ));
    }
    let want: Vec<usize> = axes.iter().map(|a| s[*a as usize]).collect();
    if dst.shape() != want {
        return Err(terr(
            "dma_transpose_dst_shape",
            format!(
                "dst shape {:?} must equal the permuted src shape {want:?} (src {s:?}, axes {axes:?})",
                dst.shape()
            ),
            "dst",
        ));
    }
    Ok(())
}

/// The indirect (swdge, `vector_offset`) form's shape and index-tile rules.
fn check_transpose_indirect(v: &ops::DmaTranspose) -> Result<()> {
    let src = v.src;
    let s = src.shape();
    check_dge(v.ins.engine, v.dge_mode, true)?;
    if !s[0].is_multiple_of(16) {
        return Err(terr(
            "indirect_dma_transpose_rows",
            format!(
                "indirect (swdge) dma_transpose needs src.shape[0] % 16 == 0, got {}",
                s[0]
            ),
            "src",
        ));
    }
    if s.len() == 4 && s[1] != 1 && s[2] != 1 {
        return Err(terr(
            "indirect_dma_transpose_4d_shape",
            format!("indirect 4-D dma_transpose needs shape[1] or shape[2] == 1, got {s:?}"),
            "src",
        ));
    }
    if let Some(DynSrc::Tile(t)) = src.dynamic.as_deref().map(|d| &d.src) {
        let (i0, i1) = (t.parts as usize, t.free_size());
        if t.dtype != DType::Uint32 || t.dims.len() != 1 {
            return Err(fail(
                Dtype,
                "indirect_dma_transpose_index_dtype",
                format!(
                    "indirect dma_transpose indices are a 2-D uint32 SBUF tile, got {} {:?}",
                    t.dtype.name(),
                    t.shape()
                ),
            )
            .operand("src"));
        }
        if !(16..=128).contains(&i0) || i0 % 16 != 0 || (i1 > 1 && i0 != 128) {
            return Err(terr(
                "indirect_dma_transpose_index_shape",
                format!(
                    "indirect dma_transpose indices need shape[0] in 16..=128, a multiple of 16, and exactly 128 when shape[1] > 1; got {:?}",
                    t.shape()
                ),
                "src",
            ));
        }
    }
    Ok(())
}

/// The direct form runs on the hardware DGE; its shape rules bind when hwdge is asked for.
fn check_transpose_direct(v: &ops::DmaTranspose) -> Result<()> {
    let s = v.src.shape();
    if matches!(v.dge_mode, DgeMode::Swdge | DgeMode::None) {
        return Err(fail(
            Value,
            "direct_dma_transpose_dge_mode",
            "a direct dma_transpose runs on the hardware DGE (dge_mode hwdge or unknown); swdge is the indirect form with src.ap(vector_offset=...)",
        )
        .operand("dge_mode"));
    }
    check_dge(v.ins.engine, v.dge_mode, false)?;
    // With `unknown` the compiler may lower to a descriptor DMA (public kernels transpose
    // 128x128 SBUF tiles that way): the HWDGE shape rules do not apply.
    if v.dge_mode != DgeMode::Hwdge {
        return Ok(());
    }
    if s.len() == 2 && s[0] != 16 {
        return Err(terr(
            "hwdge_dma_transpose_shape",
            format!(
                "hwdge 2-D dma_transpose needs src.shape[0] == 16, got {}",
                s[0]
            ),
            "src",
        ));
    }
    if s.len() > 2 {
        let ok = [1, 2, 4, 8, 16].contains(&s[0]) && (s[0] * s[s.len() - 2]).is_multiple_of(16);
        if !ok {
            return Err(terr(
                "hwdge_dma_transpose_shape",
                format!(
                    "hwdge {}-D dma_transpose needs src.shape[0] in {{1,2,4,8,16}} and (shape[0]*shape[-2]) % 16 == 0, got {s:?}",
                    s.len()
                ),
                "src",
            ));
        }
    }
    Ok(())
}

/// Row-major strides of a shape.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut st = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * shape[i + 1];
    }
    st
}

/// The source bytes, row-major, and which source rows were read (`oob_mode=skip` leaves the
/// others out); `None` when the whole transfer is skipped.
fn transpose_source(ctx: &Ctx, src: &Ap, skip: bool) -> Result<Option<(Vec<u8>, Vec<bool>)>> {
    let es = src.dtype.size();
    let row_bytes = src.free_size() * es;
    Ok(Some(
        match resolve(ctx, src, skip).map_err(|e| e.operand("src"))? {
            Resolved::Skip => return Ok(None),
            Resolved::Whole(a) => (
                ctx.mems.try_gather(&a).map_err(|e| e.operand("src"))?,
                vec![true; src.parts as usize],
            ),
            Resolved::Rows(rows) => {
                let n = src.num_elements() * es;
                let mut data =
                    try_vec(n, 0u8, "a DMA transpose buffer").map_err(|e| e.operand("src"))?;
                let mut valid = vec![false; rows.len()];
                for (r, a) in rows.iter().enumerate() {
                    if let Some(a) = a {
                        let b = ctx.mems.try_gather(a).map_err(|e| e.operand("src"))?;
                        data[r * row_bytes..(r + 1) * row_bytes].copy_from_slice(&b);
                        valid[r] = true;
                    }
                }
                (data, valid)
            }
        },
    ))
}

impl Semantics for ops::DmaTranspose<'_> {
    fn check(&self) -> Result<()> {
        check_priority(self.priority)?;
        check_transpose_shape(self)?;
        let src = self.src;
        // The DGE forms move 2-byte elements (API); 4-byte ones only with dge_mode unknown,
        // where the compiler picks the mechanism (the arch guide allows 4-byte DMA transposes).
        if src.dtype.size() != 2 && (is_vector(src) || self.dge_mode == DgeMode::Hwdge) {
            return Err(fail(
                Dtype,
                "dma_transpose_element_size",
                format!(
                    "{} dma_transpose moves 2-byte elements, got {} (4-byte dtypes only with dge_mode unknown)",
                    if is_vector(src) { "indirect (swdge)" } else { "hwdge" },
                    src.dtype.name()
                ),
            )
            .operand("src"));
        }
        if is_vector(src) {
            check_transpose_indirect(self)
        } else {
            check_transpose_direct(self)
        }
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let src = self.src;
        let skip = self.oob_mode == OobMode::Skip;
        let s_shape = src.shape();
        let Some(axes) = default_axes(s_shape.len()) else {
            return Ok(());
        };
        let es = src.dtype.size();
        let row_elems = src.free_size();
        let n = src.num_elements();
        let Some((data, valid)) = transpose_source(ctx, src, skip)? else {
            return Ok(());
        };
        let dst = match resolve(ctx, self.dst, skip).map_err(|e| e.operand("dst"))? {
            Resolved::Whole(a) => a,
            _ => return Ok(()),
        };
        let d_shape: Vec<usize> = axes.iter().map(|a| s_shape[*a as usize]).collect();
        let s_st = strides(&s_shape);
        // Skipped source rows leave the dst elements they would have written unchanged.
        let mut out = if valid.iter().all(|v| *v) {
            try_vec(n * es, 0u8, "a DMA transpose buffer")
        } else {
            ctx.mems.try_gather(&dst)
        }
        .map_err(|e| e.operand("dst"))?;
        let mut idx = vec![0usize; d_shape.len()];
        for j in 0..n {
            let mut sl = 0usize;
            for (t, i) in idx.iter().enumerate() {
                sl += i * s_st[axes[t] as usize];
            }
            if valid[sl / row_elems] {
                out[j * es..(j + 1) * es].copy_from_slice(&data[sl * es..(sl + 1) * es]);
            }
            for t in (0..idx.len()).rev() {
                idx[t] += 1;
                if idx[t] < d_shape[t] {
                    break;
                }
                idx[t] = 0;
            }
        }
        ctx.mems
            .try_scatter(&dst, &out)
            .map_err(|e| e.operand("dst"))?;
        Ok(())
    }
}
