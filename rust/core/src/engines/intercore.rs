//! Inter-core instructions: LNC=2 `sendrecv` and `core_barrier`, and the collectives
//! (`all_reduce`, `all_gather`, `reduce_scatter`, `all_to_all`, `all_to_all_v`,
//! `collective_permute`) across the cores of a device or of an UltraServer's chips.
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
use crate::hw::MAX_CHIPS;
use crate::isa::ops;
use crate::isa::tables::DmaEngine;
use crate::isa::{AluOp, Engine, Instr, Opcode};
use crate::memory::onchip::Mems;
use crate::memory::{Ap, NUM_CORES};
use crate::numerics;
use crate::numerics::config::Rounder;

pub mod part;

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
        if !(0..(MAX_CHIPS * NUM_CORES) as i32).contains(c) {
            return Err(fail(
                Value,
                "replica_group_core_out_of_range",
                format!(
                    "core {c} in the replica group is not a core of the device (0..{NUM_CORES}) or of an UltraServer (global ids chip * {NUM_CORES} + core, 0..{})", MAX_CHIPS * NUM_CORES
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

impl Semantics for ops::AllToAll<'_> {
    fn check(&self) -> Result<()> {
        check_group(self.cores)
    }
    /// Driven as a rendezvous by the scheduler (module docs).
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        exec_alone(self.ins, ctx)
    }
}

impl Semantics for ops::AllToAllV<'_> {
    /// The counts' size and the dst dtype are checked when the group meets (`agree`).
    fn check(&self) -> Result<()> {
        check_group(self.cores)
    }
    /// Driven as a rendezvous by the scheduler (module docs).
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        exec_alone(self.ins, ctx)
    }
}

impl Semantics for ops::CollectivePermute<'_> {
    fn check(&self) -> Result<()> {
        check_group(self.cores)?;
        permute_pairs(self.pairs, self.cores.len()).map(|_| ())
    }
    /// Driven as a rendezvous by the scheduler (module docs).
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        exec_alone(self.ins, ctx)
    }
}

/// `collective_permute`'s flattened (source, target) rank pairs: even length, ranks in
/// `0..n`, no rank the target of two pairs.
pub fn permute_pairs(pairs: &[i32], n: usize) -> Result<Vec<(usize, usize)>> {
    let bad = |why: String| {
        Err(fail(
            Value,
            "collective_permute_pairs",
            format!("collective_permute pairs {pairs:?}: {why}"),
        )
        .operand("pairs"))
    };
    if !pairs.len().is_multiple_of(2) {
        return bad("a flat list of (source, target) rank pairs has an even length".into());
    }
    let mut out: Vec<(usize, usize)> = Vec::new();
    for p in pairs.chunks(2) {
        if p.iter().any(|r| !(0..n as i32).contains(r)) {
            return bad(format!("ranks are positions in the replica group (0..{n})"));
        }
        let (s, t) = (p[0] as usize, p[1] as usize);
        if out.iter().any(|q| q.1 == t) {
            return bad(format!("rank {t} is the target of two pairs"));
        }
        out.push((s, t));
    }
    Ok(out)
}

/// How a collective meets its peers: its replica group (global core ids, chip * 8 + core, in
/// rank order) and its pipe (`sendrecv`'s pipe_id; 0 for the others).
pub struct Meeting {
    pub cores: Vec<u16>,
    pub pipe: i32,
}

/// The meeting of collective `ins` issued on global core `core` (an LNC=2 instruction meets its
/// pair).
pub fn meeting(ins: &Instr, core: u16) -> Result<Meeting> {
    let pair = || vec![core & !1, core | 1];
    let group = |cores: &[i32]| cores.iter().map(|c| *c as u16).collect();
    let cores = match ins.op {
        Opcode::Sendrecv => {
            return Ok(Meeting {
                cores: pair(),
                pipe: ops::Sendrecv::view(ins)?.pipe_id,
            })
        }
        Opcode::AllReduce => group(ops::AllReduce::view(ins)?.cores),
        Opcode::AllGather => group(ops::AllGather::view(ins)?.cores),
        Opcode::ReduceScatter => group(ops::ReduceScatter::view(ins)?.cores),
        Opcode::AllToAll => group(ops::AllToAll::view(ins)?.cores),
        Opcode::AllToAllV => group(ops::AllToAllV::view(ins)?.cores),
        Opcode::CollectivePermute => group(ops::CollectivePermute::view(ins)?.cores),
        _ => pair(),
    };
    Ok(Meeting { cores, pipe: 0 })
}

/// The device memories a collective reaches: every core's SBUF and PSUM, and the shared HBM.
pub trait DeviceMems {
    /// The memories as core `core` sees them.
    fn core(&mut self, core: u16) -> Mems<'_>;
}

/// One core's memories, as the whole device of the group of one.
struct OneCore<'m, 'a>(&'m mut Mems<'a>);

impl DeviceMems for OneCore<'_, '_> {
    fn core(&mut self, _: u16) -> Mems<'_> {
        Mems {
            sbuf: &mut *self.0.sbuf,
            psum: &mut *self.0.psum,
            hbm: &mut *self.0.hbm,
        }
    }
}

/// A participant of a collective: its core (global id in an UltraServer) and its instruction.
#[derive(Clone, Copy)]
pub struct Rank<'a> {
    pub core: u16,
    pub ins: &'a Instr,
}

/// An error found in one rank's instruction (`rank` indexes the ranks given to `perform`).
#[derive(Debug)]
pub struct RankError {
    pub rank: usize,
    pub error: EmuError,
}

/// What a completed collective moved, for the cost model and the fabric.
#[derive(Clone, Debug)]
pub struct Moved {
    pub kind: CollectiveKind,
    /// Bytes of one rank's src.
    pub src_bytes: u64,
    /// Point-to-point collectives (all_to_all, all_to_all_v, collective_permute): bytes rank i
    /// sends to rank j at `i * N + j` (empty for the others).
    pub matrix: Vec<u64>,
}

/// One rank's operands of a data-moving collective.
struct Operands<'a> {
    src: &'a Ap,
    dst: &'a Ap,
    reduce_op: Option<AluOp>,
    /// all_to_all_v's metadata and its flags (receive counts known, receive displacements).
    counts: Option<&'a Ap>,
    flags: (bool, bool),
    pairs: &'a [i32],
}

/// The group's kind and every rank's data operands (a rank whose operands are refused is the
/// error, named by its position).
fn group_operands<'a>(
    ranks: &[Rank<'a>],
) -> std::result::Result<(CollectiveKind, Vec<Operands<'a>>), RankError> {
    let mut kind = CollectiveKind::Barrier;
    let mut all = Vec::with_capacity(ranks.len());
    for (k, r) in ranks.iter().enumerate() {
        let (kd, o) = operands(r.ins).map_err(|error| RankError { rank: k, error })?;
        kind = kd;
        all.extend(o);
    }
    Ok((kind, all))
}

fn operands(ins: &Instr) -> Result<(CollectiveKind, Option<Operands<'_>>)> {
    let data = |src, dst, reduce_op| {
        Some(Operands {
            src,
            dst,
            reduce_op,
            counts: None,
            flags: (false, false),
            pairs: &[],
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
        Opcode::AllToAll => {
            let v = ops::AllToAll::view(ins)?;
            (CollectiveKind::AllToAll, data(v.src, v.dst, None))
        }
        Opcode::AllToAllV => {
            let v = ops::AllToAllV::view(ins)?;
            let mut o = data(v.src, v.dst, None);
            if let Some(o) = &mut o {
                o.counts = Some(v.metadata);
                o.flags = (v.recv_counts_known, v.has_rdispls);
            }
            (CollectiveKind::AllToAllV, o)
        }
        Opcode::CollectivePermute => {
            let v = ops::CollectivePermute::view(ins)?;
            let mut o = data(v.src, v.dst, None);
            if let Some(o) = &mut o {
                o.pairs = v.pairs;
            }
            (CollectiveKind::Permute, o)
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

/// What one rank contributes, read from its memories when it arrives: its src bytes, and for
/// `all_to_all_v` its run-time counts and its dst's current bytes (the part not received keeps
/// them).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub src: Vec<u8>,
    pub counts: Vec<i64>,
    pub dst: Vec<u8>,
    /// Nothing was read: an in-place `all_to_all` (dst = src) exchanges its blocks in the
    /// ranks' memories when the group completes (`in_place_all_to_all`).
    pub deferred: bool,
}

/// Whether `ins` is an `all_to_all` whose dst is its src (exchanged in place, block by block,
/// without a copy of every rank's data).
pub fn is_in_place_all_to_all(ins: &Instr) -> bool {
    ins.op == Opcode::AllToAll && ops::AllToAll::view(ins).is_ok_and(|v| v.dst == v.src)
}

/// Read one rank's contribution from `mems` (the memories of the rank's core).
pub fn snapshot(ins: &Instr, mems: &Mems) -> Result<Snapshot> {
    if is_in_place_all_to_all(ins) {
        return Ok(Snapshot {
            deferred: true,
            ..Snapshot::default()
        });
    }
    let (_, o) = operands(ins)?;
    let Some(o) = o else {
        return Ok(Snapshot::default());
    };
    let mut s = Snapshot {
        src: mems.try_gather(o.src)?,
        ..Snapshot::default()
    };
    if let Some(c) = o.counts {
        let raw = mems.try_gather(c)?;
        s.counts = raw
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
            .collect();
        s.dst = mems.try_gather(o.dst)?;
    }
    Ok(s)
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
    let mut snaps = Vec::with_capacity(ranks.len());
    for (k, r) in ranks.iter().enumerate() {
        let s = snapshot(r.ins, &dev.core(r.core)).map_err(|error| RankError { rank: k, error })?;
        snaps.push(s);
    }
    let (moved, outs) = combine(ranks, &snaps, rounder)?;
    if snaps.iter().any(|s| s.deferred) {
        in_place_all_to_all(ranks, &mut |r, ap, at, len, d| {
            block_io(&mut dev.core(ranks[r].core), ap, at, len, d)
        })?;
    }
    for (k, out) in outs.into_iter().enumerate() {
        if let Some(bytes) = out {
            let dst = dst_of(ranks[k].ins).map_err(|error| RankError { rank: k, error })?;
            dev.core(ranks[k].core).scatter(dst, &bytes);
        }
    }
    Ok(moved)
}

/// A checked in-place `all_to_all` (every rank's dst = src): block j of rank i's buffer and
/// block i of rank j's are swapped, for every pair, in the ranks' memories (`mems(r)`: rank r's);
/// the diagonal stays. It reads and writes one block pair at a time, so it needs no copy of the
/// ranks' data.
pub fn in_place_all_to_all(ranks: &[Rank], io: &mut BlockIo) -> std::result::Result<(), RankError> {
    let n = ranks.len();
    let mut aps = Vec::with_capacity(n);
    for (k, r) in ranks.iter().enumerate() {
        let v = ops::AllToAll::view(r.ins).map_err(|error| RankError { rank: k, error })?;
        // Blocks of a dense HBM buffer are read in place; any other buffer is gathered whole
        // (a step-0 pattern may name far more bytes than it covers): ask the host first.
        let bytes = 2 * v.src.num_elements() as u128 * v.src.dtype.size() as u128;
        if bytes > 1 << 26 {
            crate::error::check_host_bytes(bytes, "an in-place all_to_all's block buffers")
                .map_err(|error| RankError {
                    rank: k,
                    error: error.operand("src"),
                })?;
        }
        aps.push(v.src);
    }
    let c = aps[0].num_elements() / n.max(1);
    for i in 0..n {
        for j in i + 1..n {
            // block j of rank i <-> block i of rank j
            let a = io(i, aps[i], j * c, c, None);
            let b = io(j, aps[j], i * c, c, None);
            io(i, aps[i], j * c, c, Some(&b));
            io(j, aps[j], i * c, c, Some(&a));
        }
    }
    Ok(())
}

/// Read (`None`) or write (`Some(bytes)`) elements `at..at + len` (in element order) of rank
/// `r`'s buffer `ap`; returns what it read.
pub type BlockIo<'f> = dyn FnMut(usize, &Ap, usize, usize, Option<&[u8]>) -> Vec<u8> + 'f;

/// `BlockIo` over one core's memories: a dense HBM buffer is read and written in place, any
/// other through the whole pattern.
pub fn block_io(m: &mut Mems, ap: &Ap, at: usize, len: usize, data: Option<&[u8]>) -> Vec<u8> {
    let es = ap.dtype.size();
    let dense = ap.mem == crate::memory::Mem::Hbm
        && ap.dynamic.is_none()
        && ap.is_row_contiguous()
        && (ap.parts <= 1 || ap.pstep == ap.free_size() as i64);
    let base = ap.offset + (at * es) as u64;
    match data {
        None if dense => {
            let mut out = vec![0u8; len * es];
            m.hbm.read(base, &mut out);
            out
        }
        None => m.gather(ap)[at * es..(at + len) * es].to_vec(),
        Some(d) if dense => {
            m.hbm.write(base, d);
            Vec::new()
        }
        Some(d) => {
            let mut all = m.gather(ap);
            all[at * es..at * es + d.len()].copy_from_slice(d);
            m.scatter(ap, &all);
            Vec::new()
        }
    }
}

/// The dst operand of a data-moving collective.
pub fn dst_of(ins: &Instr) -> Result<&Ap> {
    match operands(ins)?.1 {
        Some(o) => Ok(o.dst),
        None => Err(fail(
            Internal,
            "collective_without_dst",
            "a collective without data has no dst",
        )),
    }
}

/// A completed group's results from every rank's snapshot: what the collective moved, and
/// each rank's new dst bytes (`None`: its dst is not written).
#[allow(clippy::type_complexity)]
pub fn combine(
    ranks: &[Rank],
    snaps: &[Snapshot],
    rounder: &Rounder,
) -> std::result::Result<(Moved, Vec<Option<Shared>>), RankError> {
    let (kind, all) = group_operands(ranks)?;
    let none = || (0..ranks.len()).map(|_| None).collect();
    if all.len() != ranks.len() || ranks.is_empty() {
        let m = Moved {
            kind,
            src_bytes: 0,
            matrix: Vec::new(),
        };
        return Ok((m, none()));
    }
    agree(ranks, &all, kind)?;
    let src_bytes = if snaps.iter().any(|s| s.deferred) {
        (all[0].src.num_elements() * all[0].src.dtype.size()) as u64
    } else {
        snaps[0].src.len() as u64
    };
    let raw: Vec<&[u8]> = snaps.iter().map(|s| s.src.as_slice()).collect();
    let (outs, matrix) = match kind {
        _ if snaps.iter().any(|s| s.deferred) => {
            // In-place all_to_all: the caller exchanges the blocks (`in_place_all_to_all`).
            ((0..ranks.len()).map(|_| None).collect(), Vec::new())
        }
        CollectiveKind::AllToAllV => all_to_all_v(ranks, &all, snaps)?,
        CollectiveKind::Permute => permute(&all, &raw),
        _ => (move_data(&all, kind, &raw, rounder), Vec::new()),
    };
    let matrix = if kind == CollectiveKind::AllToAll {
        let n = ranks.len() as u64;
        let c = src_bytes / n;
        (0..n * n)
            .map(|ij| if ij / n == ij % n { 0 } else { c })
            .collect()
    } else {
        matrix
    };
    Ok((
        Moved {
            kind,
            src_bytes,
            matrix,
        },
        outs,
    ))
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
        if o.pairs != first.pairs {
            return Err(at(fail(
                Value,
                "collective_permute_pairs_mismatch",
                format!("{name}: every rank must give the same pairs as core {core0} ({:?}), core {} gives {:?}", first.pairs, r.core, o.pairs),
            )
            .operand("pairs")));
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
        if kind == CollectiveKind::AllToAllV {
            a2av_operands(o, n).map_err(at)?;
            continue;
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
        let want = match kind {
            CollectiveKind::Gather => first_elems * n,
            CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => {
                if first_elems % n != 0 {
                    return Err(at(fail(Shape, "reduce_scatter_indivisible", format!("{name}: src has {first_elems} elements, not divisible by the {n} ranks")).operand("src")));
                }
                if kind == CollectiveKind::AllToAll {
                    first_elems
                } else {
                    first_elems / n
                }
            }
            _ => first_elems,
        };
        if o.dst.num_elements() != want {
            return Err(at(fail(Shape, "collective_dst_size", format!("{name}: dst must have {want} elements for a src of {first_elems} on {n} ranks, it has {}", o.dst.num_elements())).operand("dst")));
        }
        let raw_copy = matches!(
            kind,
            CollectiveKind::Exchange
                | CollectiveKind::Gather
                | CollectiveKind::AllToAll
                | CollectiveKind::Permute
        );
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

/// all_to_all_v's own operand rules: metadata of (R, N) elements with the rows its flags need,
/// dst of src's dtype (raw copy).
fn a2av_operands(o: &Operands, n: usize) -> Result<()> {
    let elems = o.counts.map_or(0, |c| c.num_elements());
    let (known, rdispls) = o.flags;
    let need = if rdispls {
        4
    } else if known {
        3
    } else {
        2
    };
    if n == 0 || !elems.is_multiple_of(n) || !(need..=4).contains(&(elems / n)) {
        return Err(fail(
            Shape,
            "all_to_all_v_counts_size",
            format!(
                "all_to_all_v metadata must be ({need}..4, {n}): send counts, send displacements{}{} per rank; it has {elems} elements",
                if known || rdispls { ", receive counts" } else { "" },
                if rdispls { ", receive displacements" } else { "" },
            ),
        )
        .operand("metadata"));
    }
    if o.dst.dtype != o.src.dtype {
        return Err(fail(
            Dtype,
            "collective_dst_dtype_mismatch",
            format!(
                "all_to_all_v: dst dtype {} differs from src's {} (raw copy)",
                o.dst.dtype.name(),
                o.src.dtype.name()
            ),
        )
        .operand("dst"));
    }
    Ok(())
}

/// The new dst bytes of every rank of a checked group of the regular collectives.
fn move_data(
    all: &[Operands],
    kind: CollectiveKind,
    raw: &[&[u8]],
    rounder: &Rounder,
) -> Vec<Option<Shared>> {
    let n = raw.len();
    match kind {
        CollectiveKind::Barrier | CollectiveKind::AllToAllV | CollectiveKind::Permute => {
            (0..n).map(|_| None).collect()
        }
        // Ranks 0 and 1: each receives the other's src.
        CollectiveKind::Exchange => (0..n)
            .map(|k| Some(Shared::new(raw[(k + 1) % n].to_vec())))
            .collect(),
        CollectiveKind::Gather => {
            let cat = Shared::new(raw.concat());
            (0..n).map(|_| Some(cat.clone())).collect()
        }
        CollectiveKind::AllToAll => {
            let c = raw[0].len() / n;
            (0..n)
                .map(|r| {
                    let v: Vec<u8> = raw
                        .iter()
                        .flat_map(|s| &s[r * c..(r + 1) * c])
                        .copied()
                        .collect();
                    Some(Shared::new(v))
                })
                .collect()
        }
        CollectiveKind::ReduceScatter | CollectiveKind::Reduce => {
            let red = all[0].reduce_op.unwrap_or(AluOp::Add);
            let dtype = all[0].src.dtype;
            let mut acc = numerics::decode_all(dtype, raw[0]);
            for r in &raw[1..] {
                for (x, y) in acc.iter_mut().zip(numerics::decode_all(dtype, r)) {
                    *x = alu::apply(red, *x, y);
                }
            }
            let scatter = kind == CollectiveKind::ReduceScatter;
            let chunk = if scatter { acc.len() / n } else { acc.len() };
            // all_reduce: one encoding per dst dtype, shared by the ranks that use it.
            let mut made: Vec<(crate::isa::DType, Shared)> = Vec::new();
            all.iter()
                .enumerate()
                .map(|(k, o)| {
                    if scatter {
                        let part = &acc[k * chunk..(k + 1) * chunk];
                        return Some(Shared::new(rounder.encode_all(o.dst.dtype, part)));
                    }
                    if let Some((_, b)) = made.iter().find(|(d, _)| *d == o.dst.dtype) {
                        return Some(b.clone());
                    }
                    let b = Shared::new(rounder.encode_all(o.dst.dtype, &acc));
                    made.push((o.dst.dtype, b.clone()));
                    Some(b)
                })
                .collect()
        }
    }
}

type Outs = (Vec<Option<Shared>>, Vec<u64>);

/// A rank's new dst bytes, shared by the ranks that receive the same (all_gather, all_reduce).
pub type Shared = std::sync::Arc<Vec<u8>>;

/// `collective_permute`: each target receives its source's src.
fn permute(all: &[Operands], raw: &[&[u8]]) -> Outs {
    let n = raw.len();
    let mut outs: Vec<Option<Shared>> = (0..n).map(|_| None).collect();
    let mut matrix = vec![0u64; n * n];
    // Checked at assembly (permute_pairs); every rank gives the same pairs (agree).
    let pairs = permute_pairs(all[0].pairs, n).unwrap_or_default();
    for (s, t) in pairs {
        outs[t] = Some(Shared::new(raw[s].to_vec()));
        if s != t {
            matrix[s * n + t] = raw[s].len() as u64;
        }
    }
    (outs, matrix)
}

/// `all_to_all_v`: rank i sends src elements [sdispl_i[j], sdispl_i[j] + scount_i[j]) to
/// rank j, which places them at rdispl_j[i] or packed in rank order.
fn all_to_all_v(
    ranks: &[Rank],
    all: &[Operands],
    snaps: &[Snapshot],
) -> std::result::Result<Outs, RankError> {
    let n = ranks.len();
    let es = all[0].src.dtype.size();
    let counts: Vec<&[i64]> = snaps.iter().map(|s| s.counts.as_slice()).collect();
    let dst_lens: Vec<usize> = snaps.iter().map(|s| s.dst.len()).collect();
    let layout = a2av_layout(ranks, all, &counts, &dst_lens)?;
    let mut outs = Vec::with_capacity(n);
    let mut matrix = vec![0u64; n * n];
    for (r, s) in snaps.iter().enumerate() {
        let mut dst = s.dst.clone();
        for (i, b) in layout[r].iter().enumerate() {
            dst[b.at * es..(b.at + b.len) * es]
                .copy_from_slice(&snaps[i].src[b.from * es..(b.from + b.len) * es]);
            if i != r {
                matrix[i * n + r] = (b.len * es) as u64;
            }
        }
        outs.push(Some(Shared::new(dst)));
    }
    Ok((outs, matrix))
}

/// One block of `all_to_all_v`: `len` elements of the sender's src from element `from` land
/// at element `at` of the receiver's dst.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub from: usize,
    pub len: usize,
    pub at: usize,
}

/// `all_to_all_v`'s blocks, checked from the ranks' run-time `counts` and dst byte lengths:
/// `[r][i]` is what receiver r gets from sender i.
#[allow(clippy::type_complexity)]
fn a2av_layout(
    ranks: &[Rank],
    all: &[Operands],
    counts: &[&[i64]],
    dst_lens: &[usize],
) -> std::result::Result<Vec<Vec<Block>>, RankError> {
    let n = ranks.len();
    let es = all[0].src.dtype.size();
    let row = |s: &[i64], r: usize, j: usize| s.get(r * n + j).copied().unwrap_or(0) as usize;
    let bad = |k: usize, mut e: EmuError, operand: &str| {
        e.message = format!("all_to_all_v on core {}: {}", ranks[k].core, e.message);
        RankError {
            rank: k,
            error: e.operand(operand),
        }
    };
    for (k, (o, s)) in all.iter().zip(counts).enumerate() {
        for j in 0..n {
            let (c, d) = (row(s, 0, j), row(s, 1, j));
            if d + c > o.src.num_elements() {
                let what = format!(
                    "sends src elements {d}..{} to rank {j}, src has {}",
                    d + c,
                    o.src.num_elements()
                );
                return Err(bad(k, fail(Value, "all_to_all_v_counts", what), "metadata"));
            }
        }
    }
    let mut layout = Vec::with_capacity(n);
    for (r, (o, s)) in all.iter().zip(counts).enumerate() {
        let (known, rdispls) = o.flags;
        let mut packed = 0usize;
        let mut blocks = Vec::with_capacity(n);
        for (i, sent) in counts.iter().enumerate() {
            let (c, d) = (row(sent, 0, r), row(sent, 1, r));
            if known && row(s, 2, i) != c {
                let what = format!(
                    "expects {} elements from rank {i}, which sends {c}",
                    row(s, 2, i)
                );
                return Err(bad(
                    r,
                    fail(Value, "all_to_all_v_recv_counts", what),
                    "metadata",
                ));
            }
            let at = if rdispls { row(s, 3, i) } else { packed };
            packed += c;
            if (at + c) * es > dst_lens[r] {
                let what = format!(
                    "receives elements {at}..{} from rank {i}, dst has {}",
                    at + c,
                    o.dst.num_elements()
                );
                return Err(bad(r, fail(Value, "all_to_all_v_dst_size", what), "dst"));
            }
            blocks.push(Block {
                from: d,
                len: c,
                at,
            });
        }
        layout.push(blocks);
    }
    Ok(layout)
}
