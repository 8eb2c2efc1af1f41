//! DMA transfers (the data movement; queues and timing live in the machine).

use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::dma_copy as dc;
use crate::isa::Opcode;
use crate::isa::{DgeMode, Instr};

pub fn check_dma_copy(ins: &Instr) -> Result<()> {
    let dst = ins.ap(dc::DST).unwrap();
    let src = ins.ap(dc::SRC).unwrap();
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
    if let Some(p) = match ins.arg(dc::PRIORITY) {
        crate::isa::Arg::I32(p) => Some(*p),
        _ => None,
    } {
        if !(0..=3).contains(&p) {
            return Err(err(Value, format!("priority {p} outside 0..3")).operand("priority"));
        }
    }
    Ok(())
}

pub fn dma_copy(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(dc::DST).unwrap();
    let src = ins.ap(dc::SRC).unwrap();
    if dst.dtype == src.dtype {
        let raw = ctx.mems.gather(src);
        ctx.mems.scatter(dst, &raw);
    } else {
        let v = ctx.read_f32(src);
        ctx.write_f32(dst, &v);
    }
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::DmaCopy],
    check,
    exec,
};

fn check(ins: &Instr) -> Result<()> {
    match ins.op {
        Opcode::DmaCopy => check_dma_copy(ins),
        _ => Ok(()),
    }
}

fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    match ins.op {
        Opcode::DmaCopy => dma_copy(ins, ctx),
        _ => Err(crate::error::err(
            crate::error::ErrorKind::Internal,
            format!("{} is listed but not dispatched", ins.op.spec().name),
        )),
    }
}
