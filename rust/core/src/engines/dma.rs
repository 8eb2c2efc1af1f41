//! DMA transfers: `dma_copy`, `dma_compute` (sums and near-memory read-add-write) and
//! `dma_transpose`, with dynamic offsets and descriptor-generation (DGE) restrictions. Queues and
//! timing live in the machine.

use super::dynamic::{resolve, Resolved};
use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::{dma_compute as dcp, dma_copy as dc, dma_transpose as dt};
use crate::isa::{AluOp, Arg, DType, DgeMode, Engine, Instr, Opcode};
use crate::memory::{Ap, DynKind, Mem};

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::DmaCopy, Opcode::DmaCompute, Opcode::DmaTranspose],
    check,
    exec,
};

fn check(ins: &Instr) -> Result<()> {
    match ins.op {
        Opcode::DmaCopy => check_dma_copy(ins),
        Opcode::DmaCompute => check_dma_compute(ins),
        Opcode::DmaTranspose => check_dma_transpose(ins),
        _ => Ok(()),
    }
}

fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    match ins.op {
        Opcode::DmaCopy => dma_copy(ins, ctx),
        Opcode::DmaCompute => dma_compute(ins, ctx),
        Opcode::DmaTranspose => dma_transpose(ins, ctx),
        _ => Err(err(
            Internal,
            format!("{} is listed but not dispatched", ins.op.spec().name),
        )),
    }
}

fn is_vector(ap: &Ap) -> bool {
    ap.dynamic
        .as_deref()
        .is_some_and(|d| d.kind == DynKind::Vector)
}

fn check_priority(ins: &Instr, i: usize) -> Result<()> {
    if let Arg::I32(p) = ins.arg(i) {
        if !(0..=3).contains(p) {
            return Err(err(Value, format!("priority {p} outside 0..3")).operand("priority"));
        }
    }
    Ok(())
}

/// DGE restrictions shared by copies and transposes: hwdge is triggered only by the sync or
/// scalar sequencer; vector offsets (gather/scatter) need descriptors built at run time (swdge).
fn check_dge(ins: &Instr, dge: Option<u8>, vector: bool) -> Result<()> {
    let dge = dge.unwrap_or(DgeMode::Unknown as u8);
    if dge == DgeMode::Hwdge as u8 && !matches!(ins.engine, Engine::Sync | Engine::Scalar) {
        return Err(err(
            Value,
            format!(
                "hwdge DMAs are triggered only from the sync or scalar engine, not {}",
                ins.engine.name()
            ),
        )
        .operand("dge_mode"));
    }
    if vector && !(dge == DgeMode::Swdge as u8 || dge == DgeMode::Unknown as u8) {
        return Err(err(
            Value,
            "vector_offset gather/scatter needs software descriptor generation (dge_mode swdge or unknown)",
        )
        .operand("dge_mode"));
    }
    Ok(())
}

fn same_rows(a: &Ap, an: &str, b: &Ap, bn: &str) -> Result<()> {
    if a.parts != b.parts || a.free_size() != b.free_size() {
        return Err(err(
            Shape,
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

pub fn check_dma_copy(ins: &Instr) -> Result<()> {
    let (Some(dst), Some(src)) = (ins.ap(dc::DST), ins.ap(dc::SRC)) else {
        return Ok(());
    };
    if dst.num_elements() != src.num_elements() {
        return Err(err(
            Shape,
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
            return Err(err(
                Dtype,
                format!(
                    "DMA cannot cast packed MX dtypes ({} -> {})",
                    src.dtype.name(),
                    dst.dtype.name()
                ),
            )
            .operand("dst"));
        }
        if ins.enum_val(dc::DGE_MODE) == Some(DgeMode::Hwdge as u8) {
            return Err(err(
                Dtype,
                "hwdge DMA moves raw bytes: dst and src dtypes must be equal",
            )
            .operand("dst"));
        }
    }
    check_priority(ins, dc::PRIORITY)?;
    let vector = is_vector(dst) || is_vector(src);
    check_dge(ins, ins.enum_val(dc::DGE_MODE), vector)?;
    if vector {
        same_rows(src, "src", dst, "dst")?;
    }
    Ok(())
}

/// Copy `src` to `dst` (static patterns): raw bytes for equal dtypes, else through fp32.
/// Fast paths first: HBM <-> on-chip dense rows as slices, on-chip streams (which fall back
/// themselves when dst overlaps a source row not yet read); else gather then scatter.
fn copy(ctx: &mut Ctx, dst: &Ap, src: &Ap) {
    if dst.dtype == src.dtype {
        if ctx.mems.copy_dense_hbm(dst, src) || super::rows::copy_same(ctx, dst, src) {
            return;
        }
        let raw = ctx.mems.gather(src);
        ctx.mems.scatter(dst, &raw);
    } else {
        if super::rows::cast_dense_hbm(ctx, dst, src)
            || super::rows::map_f32(ctx, dst, [src], |_, _, _, _, [x], out| {
                out.copy_from_slice(x)
            })
        {
            return;
        }
        let v = ctx.read_f32(src);
        ctx.write_f32(dst, &v);
    }
}

fn skip_oob(ins: &Instr, i: usize) -> bool {
    ins.enum_val(i) == Some(crate::isa::tables::OobMode::Skip as u8)
}

pub fn dma_copy(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let (Some(dst), Some(src)) = (ins.ap(dc::DST), ins.ap(dc::SRC)) else {
        return Ok(());
    };
    let skip = skip_oob(ins, dc::OOB_MODE);
    let d = resolve(ctx, dst, skip).map_err(|e| e.operand("dst"))?;
    let s = resolve(ctx, src, skip).map_err(|e| e.operand("src"))?;
    match (d, s) {
        (Resolved::Skip, _) | (_, Resolved::Skip) => {}
        (Resolved::Whole(d), Resolved::Whole(s)) => copy(ctx, &d, &s),
        (d, s) => {
            for (d, s) in d.into_rows().into_iter().zip(s.into_rows()) {
                if let (Some(d), Some(s)) = (d, s) {
                    copy(ctx, &d, &s);
                }
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------- dma_compute

const SRCS: std::ops::Range<usize> = dcp::SRC0..dcp::SRC0 + 16;

/// Parameter indices of the given sources, in order.
fn sources(ins: &Instr) -> Vec<usize> {
    SRCS.filter(|i| ins.ap(*i).is_some()).collect()
}

/// The dst's parameter index when one source is the dst itself (read-add-write), else None.
pub fn rmw_target(ins: &Instr) -> Option<usize> {
    let dst = ins.ap(dcp::DST)?;
    sources(ins)
        .iter()
        .any(|i| ins.ap(*i) == Some(dst))
        .then_some(dcp::DST)
}

fn check_dma_compute(ins: &Instr) -> Result<()> {
    let Some(dst) = ins.ap(dcp::DST) else {
        return Ok(());
    };
    let srcs = sources(ins);
    let gap = SRCS.take_while(|i| ins.ap(*i).is_some()).count();
    if gap != srcs.len() {
        return Err(err(
            Value,
            format!(
                "srcs must be given in order without gaps: src{gap} is missing but a later source is present"
            ),
        )
        .operand(format!("src{gap}")));
    }
    if ins.enum_val(dcp::REDUCE_OP) != Some(AluOp::Add as u8) {
        return Err(err(Value, "dma_compute supports reduce_op=add only").operand("reduce_op"));
    }
    if ins.f32_or(dcp::SCALE, 1.0).to_bits() != 1.0f32.to_bits() {
        return Err(err(
            Value,
            "dma_compute has no scale mode: every scale must be 1.0 (NKI 0.4 removed the additive scale)",
        )
        .operand("scale"));
    }
    if !ins.bool_or(dcp::UNIQUE_INDICES, true) {
        return Err(err(
            Value,
            "unique_indices must be True: duplicate scatter indices would be lost updates in the DMA",
        )
        .operand("unique_indices"));
    }
    for &i in &srcs {
        let Some(s) = ins.ap(i) else { continue };
        if s.num_elements() != dst.num_elements() {
            return Err(err(
                Shape,
                format!(
                    "every source has dst's element count: {} has {} ({:?}), dst {} ({:?})",
                    ins.op.spec().params[i].name,
                    s.num_elements(),
                    s.shape(),
                    dst.num_elements(),
                    dst.shape()
                ),
            )
            .operand(ins.op.spec().params[i].name));
        }
    }
    let rmw = rmw_target(ins).is_some();
    if rmw && dst.mem == Mem::Sbuf {
        for &i in &srcs {
            let s = ins.ap(i).map(|a| a.dtype).unwrap_or(dst.dtype);
            if s != dst.dtype || !matches!(dst.dtype, DType::Bfloat16 | DType::Float32) {
                return Err(err(
                    Dtype,
                    format!(
                        "SBUF read-add-write (B += A) needs bf16 or fp32 on both sides, same dtype; got dst {} and {} {}",
                        dst.dtype.name(),
                        ins.op.spec().params[i].name,
                        s.name()
                    ),
                )
                .operand(ins.op.spec().params[i].name));
            }
        }
    }
    let vector = is_vector(dst) || srcs.iter().any(|i| ins.ap(*i).is_some_and(is_vector));
    if vector {
        if srcs.len() != 2 || !rmw {
            return Err(err(
                Value,
                "vector_offset dma_compute is scatter-add (dst_hbm[idx] += src_sbuf) or gather-add (dst_sbuf += src_hbm[idx]): exactly 2 sources, one of them dst",
            )
            .operand("src0"));
        }
        for &i in &srcs {
            if let Some(s) = ins.ap(i) {
                same_rows(dst, "dst", s, ins.op.spec().params[i].name)?;
            }
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

pub fn dma_compute(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let Some(dst) = ins.ap(dcp::DST) else {
        return Ok(());
    };
    let skip = skip_oob(ins, dcp::OOB_MODE);
    let mut all = vec![resolve(ctx, dst, skip).map_err(|e| e.operand("dst"))?];
    for i in sources(ins) {
        let Some(s) = ins.ap(i) else { continue };
        let name = ins.op.spec().params[i].name;
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

fn terr(msg: String, operand: &str) -> crate::error::EmuError {
    err(Shape, msg).operand(operand.to_string())
}

fn check_dma_transpose(ins: &Instr) -> Result<()> {
    let (Some(dst), Some(src)) = (ins.ap(dt::DST), ins.ap(dt::SRC)) else {
        return Ok(());
    };
    check_priority(ins, dt::PRIORITY)?;
    if dst.dtype != src.dtype {
        return Err(err(
            Dtype,
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
            format!("dma_transpose takes a 2-, 3- or 4-D src, got {s:?}"),
            "src",
        )
    })?;
    if let Arg::Ints(given) = ins.arg(dt::AXES) {
        if given.as_slice() != axes {
            return Err(err(
                Value,
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
            format!("src.shape[-1] = {last} exceeds 128 (DMA transpose limit)"),
            "src",
        ));
    }
    let want: Vec<usize> = axes.iter().map(|a| s[*a as usize]).collect();
    if dst.shape() != want {
        return Err(terr(
            format!(
                "dst shape {:?} must equal the permuted src shape {want:?} (src {s:?}, axes {axes:?})",
                dst.shape()
            ),
            "dst",
        ));
    }
    let dge = ins.enum_val(dt::DGE_MODE).unwrap_or(0);
    // The DGE forms move 2-byte elements (API); 4-byte ones only with dge_mode unknown, where
    // the compiler picks the mechanism (the arch guide allows 4-byte DMA transposes).
    if src.dtype.size() != 2 && (is_vector(src) || dge == DgeMode::Hwdge as u8) {
        return Err(err(
            Dtype,
            format!(
                "{} dma_transpose moves 2-byte elements, got {} (4-byte dtypes only with dge_mode unknown)",
                if is_vector(src) { "indirect (swdge)" } else { "hwdge" },
                src.dtype.name()
            ),
        )
        .operand("src"));
    }
    if is_vector(src) {
        check_dge(ins, Some(dge), true)?;
        if s[0] % 16 != 0 {
            return Err(terr(
                format!(
                    "indirect (swdge) dma_transpose needs src.shape[0] % 16 == 0, got {}",
                    s[0]
                ),
                "src",
            ));
        }
        if s.len() == 4 && s[1] != 1 && s[2] != 1 {
            return Err(terr(
                format!("indirect 4-D dma_transpose needs shape[1] or shape[2] == 1, got {s:?}"),
                "src",
            ));
        }
        if let Some(crate::memory::DynSrc::Tile(t)) = src.dynamic.as_deref().map(|d| &d.src) {
            let (i0, i1) = (t.parts as usize, t.free_size());
            if t.dtype != DType::Uint32 || t.dims.len() != 1 {
                return Err(err(
                    Dtype,
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
                    format!(
                        "indirect dma_transpose indices need shape[0] in 16..=128, a multiple of 16, and exactly 128 when shape[1] > 1; got {:?}",
                        t.shape()
                    ),
                    "src",
                ));
            }
        }
    } else {
        if dge == DgeMode::Swdge as u8 || dge == DgeMode::None as u8 {
            return Err(err(
                Value,
                "a direct dma_transpose runs on the hardware DGE (dge_mode hwdge or unknown); swdge is the indirect form with src.ap(vector_offset=...)",
            )
            .operand("dge_mode"));
        }
        check_dge(ins, Some(dge), false)?;
        // The HWDGE shape rules bind only when hwdge is asked for: with `unknown` the compiler
        // may lower to a descriptor DMA (public kernels transpose 128x128 SBUF tiles that way).
        if dge != DgeMode::Hwdge as u8 {
            return Ok(());
        }
        if s.len() == 2 && s[0] != 16 {
            return Err(terr(
                format!(
                    "hwdge 2-D dma_transpose needs src.shape[0] == 16, got {}",
                    s[0]
                ),
                "src",
            ));
        }
        if s.len() > 2 {
            let ok = [1, 2, 4, 8, 16].contains(&s[0]) && (s[0] * s[s.len() - 2]) % 16 == 0;
            if !ok {
                return Err(terr(
                    format!(
                        "hwdge {}-D dma_transpose needs src.shape[0] in {{1,2,4,8,16}} and (shape[0]*shape[-2]) % 16 == 0, got {s:?}",
                        s.len()
                    ),
                    "src",
                ));
            }
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

pub fn dma_transpose(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let (Some(dst), Some(src)) = (ins.ap(dt::DST), ins.ap(dt::SRC)) else {
        return Ok(());
    };
    let skip = skip_oob(ins, dt::OOB_MODE);
    let s_shape = src.shape();
    let Some(axes) = default_axes(s_shape.len()) else {
        return Ok(());
    };
    let es = src.dtype.size();
    let row_elems = src.free_size();
    let n = src.num_elements();
    let (data, valid) = match resolve(ctx, src, skip).map_err(|e| e.operand("src"))? {
        Resolved::Skip => return Ok(()),
        Resolved::Whole(a) => (ctx.mems.gather(&a), vec![true; src.parts as usize]),
        Resolved::Rows(rows) => {
            let mut data = vec![0u8; n * es];
            let mut valid = vec![false; rows.len()];
            for (r, a) in rows.iter().enumerate() {
                if let Some(a) = a {
                    let b = ctx.mems.gather(a);
                    data[r * row_elems * es..(r + 1) * row_elems * es].copy_from_slice(&b);
                    valid[r] = true;
                }
            }
            (data, valid)
        }
    };
    let dst = match resolve(ctx, dst, skip).map_err(|e| e.operand("dst"))? {
        Resolved::Whole(a) => a,
        _ => return Ok(()),
    };
    let d_shape: Vec<usize> = axes.iter().map(|a| s_shape[*a as usize]).collect();
    let s_st = strides(&s_shape);
    // Skipped source rows leave the dst elements they would have written unchanged.
    let mut out = if valid.iter().all(|v| *v) {
        vec![0u8; n * es]
    } else {
        ctx.mems.gather(&dst)
    };
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
    ctx.mems.scatter(&dst, &out);
    Ok(())
}

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::DmaCopy<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::DmaCompute<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::DmaTranspose<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
