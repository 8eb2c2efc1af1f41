//! `maximum` / `minimum` over whole dense fp32 on-chip rows (the flash-attention row max),
//! read straight from the memory's bytes by `kernels::minmax`, with the in-order fold
//! (`alu::reduce_groups`, the general path) for the rows whose result might depend on order.

use super::alu::reduce_groups;
use crate::isa::{AluOp, DType};
use crate::kernels::minmax::{max_f32_le, min_f32_le};
use crate::memory::onchip::Mems;
use crate::memory::{Ap, Mem};

/// One value per partition of `ap` when `op` is maximum or minimum over each whole row of a
/// static, row-contiguous fp32 on-chip pattern (`groups` = rows); `None` otherwise.
pub fn rows(mems: &Mems, ap: &Ap, op: AluOp, groups: usize) -> Option<Vec<f32>> {
    let max = match op {
        AluOp::Maximum => true,
        AluOp::Minimum => false,
        _ => return None,
    };
    let n = ap.free_size();
    if ap.dtype != DType::Float32
        || ap.mem == Mem::Hbm
        || ap.dynamic.is_some()
        || !ap.is_row_contiguous()
        || groups != ap.parts as usize
        || n == 0
    {
        return None;
    }
    let mem = match ap.mem {
        Mem::Sbuf => &*mems.sbuf,
        _ => &*mems.psum,
    };
    let mut out = Vec::with_capacity(groups);
    for r in 0..groups {
        let part = mem.partition(ap.start as usize + r);
        let row = part.get(ap.offset as usize..ap.offset as usize + 4 * n)?;
        let fast = if max {
            max_f32_le(row)
        } else {
            min_f32_le(row)
        };
        out.push(fast.unwrap_or_else(|| {
            let x: Vec<f32> = row
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let mut o = [0f32];
            reduce_groups(op, &x, n, &mut o);
            o[0]
        }));
    }
    Some(out)
}
