//! Inter-core instructions: LNC=2 `sendrecv` and `core_barrier`, and the device collectives
//! (`all_reduce`, `all_gather`, `reduce_scatter`). Here live only the per-instruction rules;
//! they run as rendezvous between cores in the scheduler (machine/intercore.rs), because their
//! effect needs every participant's instruction at once.

use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p;
use crate::isa::tables::DmaEngine;
use crate::isa::{AluOp, Instr, Opcode};
use crate::machine::NUM_CORES;

/// gpsimd_dma bytes per partition by element size (reference §2.8).
fn gpsimd_dma_limit(elem_bytes: usize) -> usize {
    match elem_bytes {
        1 => 256,
        2 => 512,
        _ => 1024,
    }
}

/// The replica group of a collective: distinct core ids of the device.
pub fn check_group(ins: &Instr, idx: usize) -> Result<()> {
    let cores = ins.ints(idx);
    if cores.is_empty() {
        return Err(err(Value, "the replica group `cores` is empty").operand("cores"));
    }
    for (i, c) in cores.iter().enumerate() {
        if !(0..NUM_CORES as i32).contains(c) {
            return Err(err(
                Value,
                format!(
                    "core {c} in the replica group is not a core of the device (0..{NUM_CORES})"
                ),
            )
            .operand("cores"));
        }
        if cores[..i].contains(c) {
            return Err(err(
                Value,
                format!("core {c} appears twice in the replica group"),
            )
            .operand("cores"));
        }
    }
    Ok(())
}

fn check_reduce_op(ins: &Instr, idx: usize) -> Result<()> {
    match ins.enum_val(idx).and_then(AluOp::from_u8) {
        Some(AluOp::Add | AluOp::Maximum | AluOp::Minimum) => Ok(()),
        _ => Err(err(
            Value,
            "collective reduce_op must be add, maximum or minimum",
        )
        .operand("reduce_op")),
    }
}

fn check(ins: &Instr) -> Result<()> {
    match ins.op {
        Opcode::CoreBarrier => {
            if ins.ints(p::core_barrier::CORES) != [0, 1] {
                return Err(err(
                    Value,
                    format!(
                        "core_barrier cores must be (0, 1): the two ranks of an LNC=2 pair, got {:?}",
                        ins.ints(p::core_barrier::CORES)
                    ),
                )
                .operand("cores"));
            }
            Ok(())
        }
        Opcode::Sendrecv => {
            use p::sendrecv as s;
            let src = ins
                .ap(s::SRC)
                .ok_or_else(|| err(Value, "src is required").operand("src"))?;
            let dst = ins
                .ap(s::DST)
                .ok_or_else(|| err(Value, "dst is required").operand("dst"))?;
            for (name, i) in [
                ("send_to_rank", s::SEND_TO_RANK),
                ("recv_from_rank", s::RECV_FROM_RANK),
            ] {
                if !(0..=1).contains(&ins.i32_or(i, -1)) {
                    return Err(err(
                        Value,
                        format!("sendrecv {name} must be a rank of the LNC=2 pair (0 or 1)"),
                    )
                    .operand(name));
                }
            }
            if ins.i32_or(s::SEND_TO_RANK, 0) != ins.i32_or(s::RECV_FROM_RANK, 0) {
                return Err(err(
                    Value,
                    "sendrecv exchanges with its one peer: send_to_rank must equal recv_from_rank",
                )
                .operand("recv_from_rank"));
            }
            if src.dtype != dst.dtype {
                return Err(err(
                    Dtype,
                    format!(
                        "sendrecv src and dst must have the same dtype ({} vs {})",
                        src.dtype.name(),
                        dst.dtype.name()
                    ),
                )
                .operand("dst"));
            }
            super::same_shape(src, "src", dst, "dst")?;
            if ins.enum_val(s::DMA_ENGINE) == Some(DmaEngine::GpsimdDma as u8) {
                let lim = gpsimd_dma_limit(src.dtype.size());
                let per = src.free_size() * src.dtype.size();
                if per > lim {
                    return Err(err(Shape, format!("sendrecv over gpsimd_dma moves at most {lim} bytes per partition for {}-byte dtypes, src has {per}", src.dtype.size())).operand("src"));
                }
                if ins.engine != crate::isa::Engine::Gpsimd {
                    return Err(err(
                        Value,
                        "sendrecv with dma_engine=gpsimd_dma is issued by GpSimd",
                    )
                    .operand("dma_engine"));
                }
            }
            Ok(())
        }
        Opcode::AllReduce => {
            check_group(ins, p::all_reduce::CORES)?;
            check_reduce_op(ins, p::all_reduce::REDUCE_OP)
        }
        Opcode::AllGather => check_group(ins, p::all_gather::CORES),
        Opcode::ReduceScatter => {
            check_group(ins, p::reduce_scatter::CORES)?;
            check_reduce_op(ins, p::reduce_scatter::REDUCE_OP)
        }
        _ => Ok(()),
    }
}

fn exec(ins: &Instr, _: &mut Ctx) -> Result<()> {
    Err(err(
        Internal,
        format!(
            "{} runs as an inter-core rendezvous in the scheduler, not on one core",
            ins.op.spec().name
        ),
    ))
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[
        Opcode::Sendrecv,
        Opcode::CoreBarrier,
        Opcode::AllReduce,
        Opcode::AllGather,
        Opcode::ReduceScatter,
    ],
    check,
    exec,
};

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::Sendrecv<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::CoreBarrier<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::AllReduce<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::AllGather<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::ReduceScatter<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
