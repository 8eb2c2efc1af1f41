//! Inter-core rendezvous: `core_barrier`, `sendrecv` and the collectives. Each participant's
//! instruction first *arrives* (its semaphore waits satisfied; the issuing stream then blocks),
//! and when the last participant of its group arrives the group's data moves at once and
//! every participant is *released* at the same completion time. The release clock is the join
//! of every participant's arrival clock (plus each participant's completion epoch), so work
//! after a rendezvous is ordered after everything each participant did before it: the race
//! detector sees a barrier-ordered exchange as ordered and an unsynchronised one as a race.
//!
//! Groups are matched by (opcode, participant cores, pipe_id, sequence number): the n-th
//! `core_barrier` of core 2i meets the n-th of core 2i+1; the n-th `sendrecv` on a pipe meets
//! the peer's n-th on that pipe; the n-th collective with a given replica group meets the
//! others' n-th with the same group.

use super::Core;
use crate::cost::DmaParams;
use crate::engines::alu;
use crate::error::{err, EmuError, ErrorKind::*, Result};
use crate::isa::tables::p;
use crate::isa::text::format_instr;
use crate::isa::{AluOp, Instr, Opcode, Program};
use crate::memory::hbm::Hbm;
use crate::memory::onchip::Mems;
use crate::memory::Ap;
use crate::numerics;
use std::collections::HashMap;

type Vc = Vec<u32>;

pub fn is_rendezvous(ins: &Instr) -> bool {
    matches!(
        ins.op,
        Opcode::CoreBarrier
            | Opcode::Sendrecv
            | Opcode::AllReduce
            | Opcode::AllGather
            | Opcode::ReduceScatter
    )
}

/// The cores that take part in `ins` issued on `core`, in rank order.
fn participants(core: u8, ins: &Instr) -> Vec<u8> {
    let cores = match ins.op {
        Opcode::AllReduce => ins.ints(p::all_reduce::CORES),
        Opcode::AllGather => ins.ints(p::all_gather::CORES),
        Opcode::ReduceScatter => ins.ints(p::reduce_scatter::CORES),
        _ => return vec![core & !1, core | 1],
    };
    cores.iter().map(|c| *c as u8).collect()
}

fn pipe(ins: &Instr) -> i32 {
    if ins.op == Opcode::Sendrecv {
        ins.i32_or(p::sendrecv::PIPE_ID, 0)
    } else {
        0
    }
}

fn ins_err(e: EmuError, core: u8, idx: u32, ins: &Instr) -> EmuError {
    e.at(idx as usize, format!("{} (core {core})", format_instr(ins)))
}

/// Rules that need the issuing core: run once per program before the run starts.
pub fn check_program(prog: &Program, all: &[Option<&Program>]) -> Result<()> {
    let core = prog.core;
    for (i, ins) in prog.instrs.iter().enumerate() {
        if !is_rendezvous(ins) {
            continue;
        }
        let fail = |e: EmuError| ins_err(e, core, i as u32, ins);
        let group = participants(core, ins);
        if !group.contains(&core) {
            return Err(fail(
                err(Value, format!("core {core} issues a collective whose replica group {group:?} does not contain it"))
                    .operand("cores"),
            ));
        }
        if ins.op == Opcode::Sendrecv {
            let rank = (core % 2) as i32;
            if ins.i32_or(p::sendrecv::SEND_TO_RANK, 0) == rank {
                return Err(fail(
                    err(Value, format!("sendrecv on core {core} (rank {rank} of its LNC=2 pair) must send to the other rank, {}", 1 - rank))
                        .operand("send_to_rank"),
                ));
            }
        }
        for c in &group {
            if all.get(*c as usize).is_none_or(|p| p.is_none()) {
                let what = if matches!(ins.op, Opcode::Sendrecv | Opcode::CoreBarrier) {
                    format!("its LNC=2 peer core {c}")
                } else {
                    format!("core {c} of the replica group")
                };
                return Err(fail(err(
                    Value,
                    format!("{} on core {core} needs a program on {what} (pass one program per participating core to run)", ins.op.spec().name),
                )));
            }
        }
    }
    Ok(())
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    op: Opcode,
    cores: Vec<u8>,
    pipe: i32,
    seq: u32,
}

struct Arrival {
    agent: usize,
    core: u8,
    idx: u32,
    time: u64,
    vc: Vc,
}

/// When a released participant completes and the clock it completes with.
pub struct Release {
    pub arrived: u64,
    pub end: u64,
    pub vc: Vc,
}

enum Gate {
    Arrived(Key),
    Released(Release),
}

/// Rendezvous state of one run.
#[derive(Default)]
pub struct Intercore {
    seq: HashMap<(u8, Opcode, Vec<u8>, i32), u32>,
    groups: HashMap<Key, Vec<Arrival>>,
    gates: HashMap<usize, Gate>,
}

/// What the scheduler may do with an engine stream whose next instruction is a rendezvous.
pub enum Ready {
    /// Not arrived yet: schedule as usual (its arrival is the next event).
    Arrive,
    /// Arrived, the group is incomplete.
    Blocked,
    /// Released: completes at this time.
    At(u64),
}

impl Intercore {
    pub fn ready(&self, agent: usize) -> Ready {
        match self.gates.get(&agent) {
            None => Ready::Arrive,
            Some(Gate::Arrived(_)) => Ready::Blocked,
            Some(Gate::Released(r)) => Ready::At(r.end),
        }
    }

    /// Take the release of a participant that completes now.
    pub fn complete(&mut self, agent: usize) -> Option<Release> {
        match self.gates.remove(&agent) {
            Some(Gate::Released(r)) => Some(r),
            Some(g) => {
                self.gates.insert(agent, g);
                None
            }
            None => None,
        }
    }

    /// Why a blocked stream is blocked (deadlock report).
    pub fn blocked(&self, agent: usize) -> Option<String> {
        let Some(Gate::Arrived(k)) = self.gates.get(&agent) else {
            return None;
        };
        let here: Vec<u8> = self
            .groups
            .get(k)
            .map(|v| v.iter().map(|a| a.core).collect())
            .unwrap_or_default();
        let missing: Vec<u8> = k
            .cores
            .iter()
            .copied()
            .filter(|c| !here.contains(c))
            .collect();
        Some(format!(
            "waits in {} #{} (pipe {}) for cores {missing:?}, which never reach their matching one",
            k.op.spec().name,
            k.seq,
            k.pipe
        ))
    }

    /// `ins` (instruction `idx` of `core`, on stream agent `agent`) arrives at `now` with clock `vc`.
    /// `epochs[a]` is agent a's current epoch (its completion will be the next one).
    #[allow(clippy::too_many_arguments)]
    pub fn arrive(
        &mut self,
        dev: &mut DevMem<'_>,
        progs: &[Option<&Program>],
        agent: usize,
        core: u8,
        idx: u32,
        ins: &Instr,
        now: u64,
        vc: Vc,
        dma: &DmaParams,
        sem_latency: u64,
    ) -> Result<()> {
        let cores = participants(core, ins);
        let pk = (core, ins.op, cores.clone(), pipe(ins));
        let n = self.seq.entry(pk).or_insert(0);
        let key = Key {
            op: ins.op,
            cores,
            pipe: pipe(ins),
            seq: *n,
        };
        *n += 1;
        let group = self.groups.entry(key.clone()).or_default();
        group.push(Arrival {
            agent,
            core,
            idx,
            time: now,
            vc,
        });
        if group.len() < key.cores.len() {
            self.gates.insert(agent, Gate::Arrived(key));
            return Ok(());
        }
        let mut group = self.groups.remove(&key).unwrap_or_default();
        group.sort_by_key(|a| key.cores.iter().position(|c| *c == a.core));
        let instrs: Vec<&Instr> = group
            .iter()
            .map(|a| progs[a.core as usize].map(|p| &p.instrs[a.idx as usize]))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| err(Internal, "rendezvous participant without a program"))?;
        let bytes = move_data(dev, &group, &instrs)?;
        let end = now + cost_ps(ins.op, bytes, key.cores.len(), dma, sem_latency);
        let mut joined = vec![0u32; group[0].vc.len()];
        for a in &group {
            for (x, y) in joined.iter_mut().zip(&a.vc) {
                *x = (*x).max(*y);
            }
        }
        // Each participant's completion is its next epoch: ordered before everyone's later work.
        for a in &group {
            // Blocked since its arrival, the participant's epoch advances exactly once more.
            let own = a.vc.get(a.agent).copied().unwrap_or(0);
            if let Some(x) = joined.get_mut(a.agent) {
                *x = (*x).max(own.saturating_add(1));
            }
        }
        for a in group {
            self.gates.insert(
                a.agent,
                Gate::Released(Release {
                    arrived: a.time,
                    end,
                    vc: joined.clone(),
                }),
            );
        }
        Ok(())
    }
}

/// Transfer time of a completed group: a barrier is one semaphore hop; data moves on the DMA
/// engines of a core at their aggregate bandwidth (GUESS: ring algorithm byte counts per rank:
/// sendrecv n, all_gather (N-1)n, reduce_scatter (N-1)n/N, all_reduce 2(N-1)n/N), plus one
/// fixed DMA cost and one semaphore hop.
fn cost_ps(op: Opcode, bytes: u64, n: usize, dma: &DmaParams, sem_latency: u64) -> u64 {
    let n = n.max(1) as f64;
    let b = bytes as f64;
    let moved = match op {
        Opcode::CoreBarrier => return sem_latency,
        Opcode::Sendrecv => b,
        Opcode::AllGather => (n - 1.0) * b,
        Opcode::ReduceScatter => (n - 1.0) * b / n,
        _ => 2.0 * (n - 1.0) * b / n,
    };
    let bw = dma.engines as f64 * dma.engine_bytes_per_ns;
    let ns = dma.fixed_ns + if bw > 0.0 { moved / bw } else { 0.0 };
    (ns * 1000.0) as u64 + sem_latency
}

/// The device memory as one core sees it, and how collectives cast their results: like DMA
/// casts (round to nearest even; the device's fp8 overflow policy applies).
pub struct DevMem<'a> {
    pub cores: &'a mut [Core],
    pub hbm: &'a mut Hbm,
    pub rounder: crate::numerics::config::Rounder,
}

fn mems<'b>(dev: &'b mut DevMem<'_>, core: u8) -> Mems<'b> {
    let c = &mut dev.cores[core as usize];
    Mems {
        sbuf: &mut c.sbuf,
        psum: &mut c.psum,
        hbm: dev.hbm,
    }
}

fn operand(ins: &Instr, i: usize, name: &str) -> Result<Ap> {
    ins.ap(i)
        .cloned()
        .ok_or_else(|| err(Value, format!("{name} is required")).operand(name.to_string()))
}

/// Perform the group's data movement; returns the bytes of one rank's src (for the cost).
fn move_data(dev: &mut DevMem<'_>, group: &[Arrival], instrs: &[&Instr]) -> Result<u64> {
    let op = instrs[0].op;
    let (si, di, ri) = match op {
        Opcode::CoreBarrier => return Ok(0),
        Opcode::Sendrecv => (p::sendrecv::SRC, p::sendrecv::DST, None),
        Opcode::AllReduce => (
            p::all_reduce::SRC,
            p::all_reduce::DST,
            Some(p::all_reduce::REDUCE_OP),
        ),
        Opcode::AllGather => (p::all_gather::SRC, p::all_gather::DST, None),
        _ => (
            p::reduce_scatter::SRC,
            p::reduce_scatter::DST,
            Some(p::reduce_scatter::REDUCE_OP),
        ),
    };
    let n = group.len();
    let mut srcs = Vec::with_capacity(n);
    let mut dsts = Vec::with_capacity(n);
    for (a, ins) in group.iter().zip(instrs) {
        let fail = |e: EmuError| ins_err(e, a.core, a.idx, ins);
        srcs.push(operand(ins, si, "src").map_err(fail)?);
        dsts.push(operand(ins, di, "dst").map_err(fail)?);
    }
    // Every participant's operands must agree with the first's (same element count and dtype).
    let first_elems = srcs[0].num_elements();
    for k in 0..n {
        let (a, ins) = (&group[k], instrs[k]);
        let fail = |e: EmuError| ins_err(e, a.core, a.idx, ins);
        if let Some(r) = ri {
            if ins.enum_val(r) != instrs[0].enum_val(r) {
                return Err(fail(
                    err(
                        Value,
                        format!(
                            "{}: every rank must use the same reduce_op as core {}",
                            op.spec().name,
                            group[0].core
                        ),
                    )
                    .operand("reduce_op"),
                ));
            }
        }
        if srcs[k].num_elements() != first_elems {
            return Err(fail(
                err(
                    Shape,
                    format!(
                        "{}: every rank's src must have the same shape: core {} sends {:?} but core {} sends {:?}",
                        op.spec().name,
                        a.core,
                        srcs[k].shape(),
                        group[0].core,
                        srcs[0].shape()
                    ),
                )
                .operand("src"),
            ));
        }
        if srcs[k].dtype != srcs[0].dtype {
            return Err(fail(
                err(
                    Dtype,
                    format!(
                        "{}: every rank's src must have the same dtype: core {} sends {} but core {} sends {}",
                        op.spec().name,
                        a.core,
                        srcs[k].dtype.name(),
                        group[0].core,
                        srcs[0].dtype.name()
                    ),
                )
                .operand("src"),
            ));
        }
        let want = match op {
            Opcode::AllGather => first_elems * n,
            Opcode::ReduceScatter => {
                if first_elems % n != 0 {
                    return Err(fail(err(Shape, format!("reduce_scatter: src has {first_elems} elements, not divisible by the {n} ranks")).operand("src")));
                }
                first_elems / n
            }
            _ => first_elems,
        };
        if dsts[k].num_elements() != want {
            return Err(fail(err(Shape, format!("{}: dst must have {want} elements for a src of {first_elems} on {n} ranks, it has {}", op.spec().name, dsts[k].num_elements())).operand("dst")));
        }
        if matches!(op, Opcode::Sendrecv | Opcode::AllGather) && dsts[k].dtype != srcs[0].dtype {
            return Err(fail(
                err(
                    Dtype,
                    format!(
                        "{}: dst dtype {} differs from the sent data's {} (raw copy)",
                        op.spec().name,
                        dsts[k].dtype.name(),
                        srcs[0].dtype.name()
                    ),
                )
                .operand("dst"),
            ));
        }
    }
    // Read every src before writing any dst, so in-place collectives see the inputs.
    let raw: Vec<Vec<u8>> = group
        .iter()
        .zip(&srcs)
        .map(|(a, s)| mems(&mut *dev, a.core).gather(s))
        .collect();
    let src_bytes = raw[0].len() as u64;
    match op {
        Opcode::Sendrecv => {
            // Ranks 0 and 1: each receives the other's src.
            for k in 0..n {
                let from = &raw[(k + 1) % n];
                mems(&mut *dev, group[k].core).scatter(&dsts[k], from);
            }
        }
        Opcode::AllGather => {
            let all: Vec<u8> = raw.concat();
            for k in 0..n {
                mems(&mut *dev, group[k].core).scatter(&dsts[k], &all);
            }
        }
        _ => {
            let red = ri
                .and_then(|i| instrs[0].enum_val(i))
                .and_then(AluOp::from_u8)
                .unwrap_or(AluOp::Add);
            let vals: Vec<Vec<f32>> = raw
                .iter()
                .map(|r| numerics::decode_all(srcs[0].dtype, r))
                .collect();
            let mut acc = vals[0].clone();
            for v in &vals[1..] {
                for (x, y) in acc.iter_mut().zip(v) {
                    *x = alu::apply(red, *x, *y);
                }
            }
            let chunk = if op == Opcode::ReduceScatter {
                acc.len() / n
            } else {
                acc.len()
            };
            for k in 0..n {
                let part = if op == Opcode::ReduceScatter {
                    &acc[k * chunk..(k + 1) * chunk]
                } else {
                    &acc[..]
                };
                let bytes = dev.rounder.encode_all(dsts[k].dtype, part);
                mems(&mut *dev, group[k].core).scatter(&dsts[k], &bytes);
            }
        }
    }
    Ok(src_bytes)
}
