//! Runtime resolution of dynamic access patterns (`scalar_offset`, `vector_offset`): the
//! static pattern an instruction actually touches, or which rows it skips (`oob_mode=skip`).

use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::DType;
use crate::memory::{Ap, DynKind, DynSrc, Mem};

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
    err(
        Address,
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
                return Err(err(Value, "vector_offset needs an index tile"));
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
