//! Inter-core instructions: LNC=2 `sendrecv` and `core_barrier`, and the device collectives
//! (`all_reduce`, `all_gather`, `reduce_scatter`).
//!
//! Their effect needs every participant's instruction at once, so the scheduler drives them as
//! a rendezvous (machine/intercore.rs): it holds each participant's stream until the whole
//! group has arrived, then calls [`perform`] here with every rank's instruction and the device
//! memories, and prices the group with `CostModel::collective_ps`. The data semantics live
//! only here. `Semantics::exec` of a collective is the group of one: the same [`perform`] with
//! the issuing core as the only rank (what a collective does when it runs on one core alone).

use super::{alu, Ctx, Semantics};
use crate::cost::CollectiveKind;
use crate::error::{fail, EmuError, ErrorKind::*, Result};
use crate::isa::ops;
use crate::isa::tables::DmaEngine;
use crate::isa::{AluOp, Engine, Instr, Opcode};
use crate::memory::onchip::Mems;
use crate::memory::{Ap, NUM_CORES};
use crate::numerics;
use crate::numerics::config::Rounder;

/// gpsimd_dma bytes per partition by element size (reference §2.8).
fn gpsimd_dma_limit(elem_bytes: usize) -> usize {
    match elem_bytes {
        1 => 256,
        2 => 512,
        _ => 1024,
    }
}

/// The replica group of a collective: distinct core ids of the device.
fn check_group(cores: &[i32]) -> Result<()> {
    if cores.is_empty() {
        return Err(fail(
            Value,
            "replica_group_empty",
            "the replica group `cores` is empty",
        )
        .operand("cores"));
    }
    for (i, c) in cores.iter().enumerate() {
        if !(0..NUM_CORES as i32).contains(c) {
            return Err(fail(
                Value,
                "replica_group_core_out_of_range",
                format!(
                    "core {c} in the replica group is not a core of the device (0..{NUM_CORES})"
                ),
            )
            .operand("cores"));
        }
        if cores[..i].contains(c) {
            return Err(fail(
                Value,
                "replica_group_duplicate_core",
                format!("core {c} appears twice in the replica group"),
            )
            .operand("cores"));
        }
    }
    Ok(())
}

fn check_reduce_op(op: AluOp) -> Result<()> {
    match op {
        AluOp::Add | AluOp::Maximum | AluOp::Minimum => Ok(()),
        _ => Err(fail(
            Value,
            "collective_reduce_op",
            "collective reduce_op must be add, maximum or minimum",
        )
        .operand("reduce_op")),
    }
}

/// The group of one: `perform` with the issuing core as the only rank.
fn exec_alone(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let rounder = ctx.rounder;
    perform(
        &[Rank { core: 0, ins }],
        &mut OneCore(&mut ctx.mems),
        &rounder,
    )
    .map(|_| ())
    .map_err(|e| e.error)
}

impl Semantics for ops::CoreBarrier<'_> {
    fn check(&self) -> Result<()> {
        if self.cores != [0, 1] {
            return Err(fail(
                Value,
                "core_barrier_cores",
                format!(
                    "core_barrier cores must be (0, 1): the two ranks of an LNC=2 pair, got {:?}",
                    self.cores
                ),
            )
            .operand("cores"));
        }
        Ok(())
    }
    /// Driven as a rendezvous by the scheduler (module docs); alone it moves no data.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        exec_alone(self.ins, ctx)
    }
}

impl Semantics for ops::Sendrecv<'_> {
    fn check(&self) -> Result<()> {
        for (name, v) in [
            ("send_to_rank", self.send_to_rank),
            ("recv_from_rank", self.recv_from_rank),
        ] {
            if !(0..=1).contains(&v) {
                return Err(fail(
                    Value,
                    "sendrecv_rank_out_of_range",
                    format!("sendrecv {name} must be a rank of the LNC=2 pair (0 or 1)"),
                )
                .operand(name));
            }
        }
        if self.send_to_rank != self.recv_from_rank {
            return Err(fail(
                Value,
                "sendrecv_peer_mismatch",
                "sendrecv exchanges with its one peer: send_to_rank must equal recv_from_rank",
            )
            .operand("recv_from_rank"));
        }
        let (src, dst) = (self.src, self.dst);
        if src.dtype != dst.dtype {
            return Err(fail(
                Dtype,
                "sendrecv_dtype_mismatch",
                format!(
                    "sendrecv src and dst must have the same dtype ({} vs {})",
                    src.dtype.name(),
                    dst.dtype.name()
                ),
            )
            .operand("dst"));
        }
        super::same_shape(src, "src", dst, "dst")?;
        if self.dma_engine == DmaEngine::GpsimdDma {
            let lim = gpsimd_dma_limit(src.dtype.size());
            let per = src.free_size() * src.dtype.size();
            if per > lim {
                return Err(fail(Shape, "gpsimd_dma_partition_bytes", format!("sendrecv over gpsimd_dma moves at most {lim} bytes per partition for {}-byte dtypes, src has {per}", src.dtype.size())).operand("src"));
            }
            if self.ins.engine != Engine::Gpsimd {
                return Err(fail(
                    Value,
                    "gpsimd_dma_issuer",
                    "sendrecv with dma_engine=gpsimd_dma is issued by GpSimd",
                )
                .operand("dma_engine"));
            }
        }
        Ok(())
    }
    /// Driven as a rendezvous by the scheduler (module docs); alone its peer is itself.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        exec_alone(self.ins, ctx)
    }
}

impl Semantics for ops::AllReduce<'_> {
    fn check(&self) -> Result<()> {
        check_group(self.cores)?;
        check_reduce_op(self.reduce_op)
    }
    /// Driven as a rendezvous by the scheduler (module docs).
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        exec_alone(self.ins, ctx)
    }
}

impl Semantics for ops::AllGather<'_> {
    fn check(&self) -> Result<()> {
        check_group(self.cores)
    }
    /// Driven as a rendezvous by the scheduler (module docs).
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        exec_alone(self.ins, ctx)
    }
}

impl Semantics for ops::ReduceScatter<'_> {
    fn check(&self) -> Result<()> {
        check_group(self.cores)?;
        check_reduce_op(self.reduce_op)
    }
    /// Driven as a rendezvous by the scheduler (module docs).
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        exec_alone(self.ins, ctx)
    }
}

/// How a collective meets its peers: its replica group (core ids in rank order) and its pipe
/// (`sendrecv`'s pipe_id; 0 for the others).
pub struct Meeting {
    pub cores: Vec<u8>,
    pub pipe: i32,
}

/// The meeting of collective `ins` issued on `core` (an LNC=2 instruction meets its pair).
pub fn meeting(ins: &Instr, core: u8) -> Result<Meeting> {
    let pair = || vec![core & !1, core | 1];
    let group = |cores: &[i32]| cores.iter().map(|c| *c as u8).collect();
    Ok(match ins.op {
        Opcode::Sendrecv => Meeting {
            cores: pair(),
            pipe: ops::Sendrecv::view(ins)?.pipe_id,
        },
        Opcode::AllReduce => Meeting {
            cores: group(ops::AllReduce::view(ins)?.cores),
            pipe: 0,
        },
        Opcode::AllGather => Meeting {
            cores: group(ops::AllGather::view(ins)?.cores),
            pipe: 0,
        },
        Opcode::ReduceScatter => Meeting {
            cores: group(ops::ReduceScatter::view(ins)?.cores),
            pipe: 0,
        },
        _ => Meeting {
            cores: pair(),
            pipe: 0,
        },
    })
}

/// The device memories a collective reaches: every core's SBUF and PSUM, and the shared HBM.
pub trait DeviceMems {
    /// The memories as core `core` sees them.
    fn core(&mut self, core: u8) -> Mems<'_>;
}

/// One core's memories, as the whole device of the group of one.
struct OneCore<'m, 'a>(&'m mut Mems<'a>);

impl DeviceMems for OneCore<'_, '_> {
    fn core(&mut self, _: u8) -> Mems<'_> {
        Mems {
            sbuf: &mut *self.0.sbuf,
            psum: &mut *self.0.psum,
            hbm: &mut *self.0.hbm,
        }
    }
}

/// A participant of a collective: its core and its instruction.
#[derive(Clone, Copy)]
pub struct Rank<'a> {
    pub core: u8,
    pub ins: &'a Instr,
}

/// An error found in one rank's instruction (`rank` indexes the ranks given to `perform`).
#[derive(Debug)]
pub struct RankError {
    pub rank: usize,
    pub error: EmuError,
}

/// What a completed collective moved, for the cost model.
#[derive(Clone, Copy, Debug)]
pub struct Moved {
    pub kind: CollectiveKind,
    /// Bytes of one rank's src.
    pub src_bytes: u64,
}

/// One rank's operands of a data-moving collective.
struct Operands<'a> {
    src: &'a Ap,
    dst: &'a Ap,
    reduce_op: Option<AluOp>,
}

fn operands(ins: &Instr) -> Result<(CollectiveKind, Option<Operands<'_>>)> {
    let data = |src, dst, reduce_op| {
        Some(Operands {
            src,
            dst,
            reduce_op,
        })
    };
    Ok(match ins.op {
        Opcode::Sendrecv => {
            let v = ops::Sendrecv::view(ins)?;
            (CollectiveKind::Exchange, data(v.src, v.dst, None))
        }
        Opcode::AllGather => {
            let v = ops::AllGather::view(ins)?;
            (CollectiveKind::Gather, data(v.src, v.dst, None))
        }
        Opcode::ReduceScatter => {
            let v = ops::ReduceScatter::view(ins)?;
            let r = Some(v.reduce_op);
            (CollectiveKind::ReduceScatter, data(v.src, v.dst, r))
        }
        Opcode::AllReduce => {
            let v = ops::AllReduce::view(ins)?;
            (
                CollectiveKind::Reduce,
                data(v.src, v.dst, Some(v.reduce_op)),
            )
        }
        Opcode::CoreBarrier => {
            ops::CoreBarrier::view(ins)?;
            (CollectiveKind::Barrier, None)
        }
        op => {
            return Err(fail(
                Value,
                "not_a_collective",
                format!("{} is not an inter-core instruction", op.spec().name),
            ))
        }
    })
}

/// Perform a collective whose whole group has arrived: `ranks` in rank order (all the same
/// instruction), `dev` the device memories, `rounder` the casts of reducing collectives (like
/// DMA casts: round to nearest even; the device's fp8 overflow policy applies). Every rank's
/// src is read before any dst is written, so in-place collectives see the inputs.
pub fn perform(
    ranks: &[Rank],
    dev: &mut dyn DeviceMems,
    rounder: &Rounder,
) -> std::result::Result<Moved, RankError> {
    let mut kind = CollectiveKind::Barrier;
    let mut all = Vec::with_capacity(ranks.len());
    for (k, r) in ranks.iter().enumerate() {
        let (kd, o) = operands(r.ins).map_err(|error| RankError { rank: k, error })?;
        kind = kd;
        all.extend(o);
    }
    if all.len() != ranks.len() || ranks.is_empty() {
        return Ok(Moved { kind, src_bytes: 0 });
    }
    agree(ranks, &all, kind)?;
    let src_bytes = move_data(ranks, &all, kind, dev, rounder);
    Ok(Moved { kind, src_bytes })
}

/// Every rank's operands must agree with the first's (same reduce_op, src element count and
/// dtype), and each dst must hold its share.
fn agree(
    ranks: &[Rank],
    all: &[Operands],
    kind: CollectiveKind,
) -> std::result::Result<(), RankError> {
    let n = ranks.len();
    let name = ranks[0].ins.op.spec().name;
    let (first, core0) = (&all[0], ranks[0].core);
    let first_elems = first.src.num_elements();
    for (k, (r, o)) in ranks.iter().zip(all).enumerate() {
        let at = |error: EmuError| RankError { rank: k, error };
        if o.reduce_op != first.reduce_op {
            return Err(at(fail(
                Value,
                "collective_reduce_op_mismatch",
                format!("{name}: every rank must use the same reduce_op as core {core0}"),
            )
            .operand("reduce_op")));
        }
        if o.src.num_elements() != first_elems {
            return Err(at(fail(
                Shape,
                "collective_src_shape_mismatch",
                format!(
                    "{name}: every rank's src must have the same shape: core {} sends {:?} but core {core0} sends {:?}",
                    r.core,
                    o.src.shape(),
                    first.src.shape()
                ),
            )
            .operand("src")));
        }
        if o.src.dtype != first.src.dtype {
            return Err(at(fail(
                Dtype,
                "collective_src_dtype_mismatch",
                format!(
                    "{name}: every rank's src must have the same dtype: core {} sends {} but core {core0} sends {}",
                    r.core,
                    o.src.dtype.name(),
                    first.src.dtype.name()
                ),
            )
            .operand("src")));
        }
        let want = match kind {
            CollectiveKind::Gather => first_elems * n,
            CollectiveKind::ReduceScatter => {
                if first_elems % n != 0 {
                    return Err(at(fail(Shape, "reduce_scatter_indivisible", format!("reduce_scatter: src has {first_elems} elements, not divisible by the {n} ranks")).operand("src")));
                }
                first_elems / n
            }
            _ => first_elems,
        };
        if o.dst.num_elements() != want {
            return Err(at(fail(Shape, "collective_dst_size", format!("{name}: dst must have {want} elements for a src of {first_elems} on {n} ranks, it has {}", o.dst.num_elements())).operand("dst")));
        }
        let raw_copy = matches!(kind, CollectiveKind::Exchange | CollectiveKind::Gather);
        if raw_copy && o.dst.dtype != first.src.dtype {
            return Err(at(fail(
                Dtype,
                "collective_dst_dtype_mismatch",
                format!(
                    "{name}: dst dtype {} differs from the sent data's {} (raw copy)",
                    o.dst.dtype.name(),
                    first.src.dtype.name()
                ),
            )
            .operand("dst")));
        }
    }
    Ok(())
}

/// The data movement of a checked group; returns the bytes of one rank's src.
fn move_data(
    ranks: &[Rank],
    all: &[Operands],
    kind: CollectiveKind,
    dev: &mut dyn DeviceMems,
    rounder: &Rounder,
) -> u64 {
    let n = ranks.len();
    let raw: Vec<Vec<u8>> = ranks
        .iter()
        .zip(all)
        .map(|(r, o)| dev.core(r.core).gather(o.src))
        .collect();
    let src_bytes = raw[0].len() as u64;
    match kind {
        CollectiveKind::Barrier => {}
        CollectiveKind::Exchange => {
            // Ranks 0 and 1: each receives the other's src.
            for k in 0..n {
                dev.core(ranks[k].core)
                    .scatter(all[k].dst, &raw[(k + 1) % n]);
            }
        }
        CollectiveKind::Gather => {
            let cat: Vec<u8> = raw.concat();
            for (r, o) in ranks.iter().zip(all) {
                dev.core(r.core).scatter(o.dst, &cat);
            }
        }
        CollectiveKind::ReduceScatter | CollectiveKind::Reduce => {
            let red = all[0].reduce_op.unwrap_or(AluOp::Add);
            let dtype = all[0].src.dtype;
            let mut acc = numerics::decode_all(dtype, &raw[0]);
            for r in &raw[1..] {
                for (x, y) in acc.iter_mut().zip(numerics::decode_all(dtype, r)) {
                    *x = alu::apply(red, *x, y);
                }
            }
            let chunk = if kind == CollectiveKind::ReduceScatter {
                acc.len() / n
            } else {
                acc.len()
            };
            for (k, (r, o)) in ranks.iter().zip(all).enumerate() {
                let part = if kind == CollectiveKind::ReduceScatter {
                    &acc[k * chunk..(k + 1) * chunk]
                } else {
                    &acc[..]
                };
                let bytes = rounder.encode_all(o.dst.dtype, part);
                dev.core(r.core).scatter(o.dst, &bytes);
            }
        }
    }
    src_bytes
}
