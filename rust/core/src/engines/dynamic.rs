//! Runtime resolution of dynamic access patterns (`scalar_offset`, `vector_offset`): the
//! static pattern an instruction actually touches, or which rows it skips (`oob_mode=skip`).

use super::Ctx;
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops;
use crate::isa::spec::{Access, ParamSpec};
use crate::isa::DType;
use crate::isa::{Arg, Engine, Instr, Opcode};
use crate::memory::{Ap, DynKind, DynSrc, Dynamic, Mem};

/// A dynamic pattern after reading its offsets.
pub enum Resolved {
    /// The whole access is skipped (scalar offset out of bounds, `oob_mode=skip`).
    Skip,
    /// One static pattern.
    Whole(Ap),
    /// One single-row pattern per row; `None` rows are skipped.
    Rows(Vec<Option<Ap>>),
}

impl Resolved {
    /// Per-row patterns (a whole pattern split into its rows).
    pub fn into_rows(self) -> Vec<Option<Ap>> {
        match self {
            Resolved::Skip => Vec::new(),
            Resolved::Whole(ap) => rows_of(&ap).into_iter().map(Some).collect(),
            Resolved::Rows(v) => v,
        }
    }
}

/// A static pattern split into single-row patterns, in row order.
pub fn rows_of(ap: &Ap) -> Vec<Ap> {
    (0..ap.parts)
        .map(|r| {
            let mut a = ap.clone();
            a.parts = 1;
            match ap.mem {
                Mem::Hbm => {
                    a.offset = ap.row_base(r) as u64;
                    a.pstep = 0;
                }
                _ => a.start = ap.start + r,
            }
            a
        })
        .collect()
}

fn tile_values(ctx: &Ctx, t: &Ap) -> Vec<i64> {
    ctx.read_raw(t)
        .into_iter()
        .map(|v| match t.dtype {
            DType::Int32 => v as i32 as i64,
            _ => v as i64,
        })
        .collect()
}

fn oob(index: i64, bound: u32, what: &str) -> crate::error::EmuError {
    fail(
        Address,
        "dynamic_offset_out_of_bounds",
        format!("{what} {index} is outside 0..{bound} (oob_mode=error; oob_mode=skip skips it)"),
    )
}

/// Resolve `ap` against the registers and memory of `ctx`. Registers are signed 32-bit.
pub fn resolve(ctx: &Ctx, ap: &Ap, skip: bool) -> Result<Resolved> {
    let Some(d) = ap.dynamic.as_deref() else {
        return Ok(Resolved::Whole(ap.clone()));
    };
    let bound = d.bound as i64;
    match d.kind {
        // Compute-operand indirection is resolved by `resolve_indirect` (validation keeps it off DMAs).
        DynKind::Indirect | DynKind::Columns => Ok(Resolved::Whole(ap.clone())),
        DynKind::Scalar => {
            let v = match &d.src {
                DynSrc::Reg(r) => ctx.regs.get(*r as usize).map(|x| *x as i32 as i64),
                DynSrc::Tile(t) => tile_values(ctx, t).first().copied(),
            }
            .unwrap_or(0);
            if (0..bound).contains(&v) {
                Ok(Resolved::Whole(ap.at_index(v)?))
            } else if skip {
                Ok(Resolved::Skip)
            } else {
                Err(oob(v, d.bound, "scalar_offset"))
            }
        }
        DynKind::Vector => {
            let DynSrc::Tile(t) = &d.src else {
                return Err(fail(
                    Value,
                    "index_needs_tile",
                    "vector_offset needs an index tile",
                ));
            };
            let vals = tile_values(ctx, t);
            let (tp, tf) = (t.parts as usize, t.free_size());
            let es = ap.dtype.size() as i128;
            let mut rows = Vec::with_capacity(ap.parts as usize);
            for r in 0..ap.parts as usize {
                let v = vals.get((r % tp) * tf + r / tp).copied().unwrap_or(-1);
                if !(0..bound).contains(&v) {
                    if skip {
                        rows.push(None);
                        continue;
                    }
                    return Err(oob(v, d.bound, &format!("vector_offset of row {r}")));
                }
                let mut a = ap.clone();
                a.dynamic = None;
                a.parts = 1;
                a.pstep = 0;
                let off = ap.offset as i128 + v as i128 * d.step as i128 * es;
                a.offset = u64::try_from(off).map_err(|_| oob(v, d.bound, "vector_offset"))?;
                rows.push(Some(a));
            }
            Ok(Resolved::Rows(rows))
        }
    }
}

// ------------------------------------------------------------------------ tensor indirection

/// Elements per index column: index element i sits at `[i % G, i / G]` of the index view.
pub fn group(engine: Engine) -> usize {
    if engine == Engine::Tensor {
        32
    } else {
        16
    }
}

/// Whether `ins` has an indirect operand (`resolve_indirect_operands` has work).
pub fn has_indirect(ins: &Instr) -> bool {
    ins.args.iter().any(|a| a.tensor().is_some_and(is_indirect))
}

fn is_indirect(ap: &Ap) -> bool {
    ap.dynamic
        .as_deref()
        .is_some_and(|d| d.kind == DynKind::Indirect)
}

fn index_tile(ap: &Ap) -> Option<&Ap> {
    match ap.dynamic.as_deref().map(|d| &d.src) {
        Some(DynSrc::Tile(t)) => Some(t),
        _ => None,
    }
}

/// The quadrant and operand rules of tensor indirection for operand `prm` of `ins` (the
/// generic checks already refused operands isa.toml does not mark `indirect`).
pub fn check_indirect(ins: &Instr, prm: &ParamSpec, ap: &Ap) -> Result<()> {
    let Some(t) = index_tile(ap) else {
        return Err(fail(
            Value,
            "index_needs_tile",
            "tensor indirection needs an index tile",
        ));
    };
    let g = group(ins.engine);
    let n = ap.free_size();
    let need_p = n.min(g);
    let need_f = n.div_ceil(g);
    if (t.parts as usize) < need_p || t.free_size() < need_f {
        return Err(fail(
            Shape,
            "indirect_index_too_small",
            format!(
                "{n} indirect elements on {} read index[i % {g}, i // {g}]: the index view needs >= {need_p} partitions and >= {need_f} columns, got {:?}",
                ins.engine.name(),
                t.shape()
            ),
        ));
    }
    if prm.access.writes() {
        check_indirect_dst(ins, ap, t)?;
    } else if t.start != ap.start {
        return Err(fail(
            Partition,
            "indirect_input_index_partition",
            format!(
                "an indirect input starts on the same partition as its index: input at {}, index at {}",
                ap.start, t.start
            ),
        ));
    }
    if ins.engine == Engine::Tensor {
        check_indirect_tensor_engine(ins, prm, ap)?;
    }
    Ok(())
}

/// An indirect dst (scatter): its index starts where the first indirect input's does, and
/// ScalarE cannot scatter into PSUM.
fn check_indirect_dst(ins: &Instr, ap: &Ap, t: &Ap) -> Result<()> {
    let main = ins
        .op
        .spec()
        .params
        .iter()
        .zip(&ins.args)
        .find(|(q, _)| q.indirect && q.access == Access::Read)
        .and_then(|(_, a)| a.tensor());
    if let Some(m) = main {
        let want = index_tile(m).map(|x| x.start).unwrap_or(m.start);
        if t.start != want {
            return Err(fail(
                Partition,
                "indirect_dst_index_partition",
                format!(
                    "an indirect dst's index starts on the same partition as the input ({want}), not {}",
                    t.start
                ),
            ));
        }
    }
    if ins.engine == Engine::Scalar && ap.mem == Mem::Psum {
        return Err(fail(
            MemorySpace,
            "indirect_scatter_into_psum",
            "ScalarE cannot scatter (indirect dst) into PSUM",
        ));
    }
    Ok(())
}

/// TensorE: indirect inputs are fp16 / bf16 / fp8; a matmul's indirection excludes transpose
/// mode on `moving` and PE tiling.
fn check_indirect_tensor_engine(ins: &Instr, prm: &ParamSpec, ap: &Ap) -> Result<()> {
    let pe_dtype = matches!(
        ap.dtype,
        DType::Float16
            | DType::Bfloat16
            | DType::Float8E4m3
            | DType::Float8E4m3fn
            | DType::Float8E5m2
    );
    if !pe_dtype && !prm.access.writes() {
        return Err(fail(
            Dtype,
            "tensor_indirect_dtype",
            "TensorE indirect operands must be fp16, bf16 or fp8",
        ));
    }
    if ins.op != Opcode::NcMatmul {
        return Ok(());
    }
    let mm = ops::NcMatmul::view(ins)?;
    if mm.is_transpose && is_indirect(mm.moving) {
        return Err(fail(
            Value,
            "indirect_moving_transpose",
            "moving cannot be indirect in transpose mode",
        )
        .operand("moving"));
    }
    if mm.tile_position.iter().any(|x| *x != 0) {
        return Err(fail(
            Value,
            "indirect_tile_position",
            "tensor indirection is incompatible with PE tiling: tile_position must be (0, 0)",
        ));
    }
    Ok(())
}

/// The instruction with every indirect operand resolved to its explicit columns.
pub fn resolve_indirect_operands(ins: &Instr, ctx: &Ctx) -> Result<Option<Instr>> {
    if !has_indirect(ins) {
        return Ok(None);
    }
    let g = group(ins.engine);
    let mut out = ins.clone();
    let spec = ins.op.spec();
    for (i, a) in out.args.iter_mut().enumerate() {
        let Arg::Tensor(ap) = a else { continue };
        let Some(d) = ap
            .dynamic
            .as_deref()
            .filter(|d| d.kind == DynKind::Indirect)
        else {
            continue;
        };
        let Some(t) = index_tile(ap) else { continue };
        let vals = tile_values(ctx, t);
        let tf = t.free_size();
        let mut cols = Vec::with_capacity(ap.free_size());
        for e in 0..ap.free_size() {
            let v = vals.get((e % g) * tf + e / g).copied().unwrap_or(-1);
            if !(0..d.bound as i64).contains(&v) {
                return Err(fail(
                    Address,
                    "indirect_index_out_of_bounds",
                    format!("indirect index {v} (element {e}) is outside 0..{}", d.bound),
                )
                .operand(spec.params[i].name));
            }
            cols.push(v);
        }
        let resolved = Dynamic {
            kind: DynKind::Columns,
            src: d.src.clone(),
            step: d.step,
            bound: d.bound,
            cols,
        };
        ap.dynamic = Some(Box::new(resolved));
    }
    Ok(Some(out))
}
