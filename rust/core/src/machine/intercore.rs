//! Inter-core rendezvous: the protocol that drives `core_barrier`, `sendrecv` and the
//! collectives. Each participant's instruction first *arrives* (its semaphore waits satisfied;
//! the issuing stream then blocks), and when the last participant of its group arrives the
//! group's collective is performed at once (its data semantics are in engines/intercore.rs,
//! its duration comes from `CostModel::collective_ps`) and every participant is *released* at the same completion time. The release clock is the join
//! of every participant's arrival clock (plus each participant's completion epoch), so work
//! after a rendezvous is ordered after everything each participant did before it: the race
//! detector sees a barrier-ordered exchange as ordered and an unsynchronised one as a race.
//!
//! Groups are matched by (opcode, participant cores, pipe_id, sequence number): the n-th
//! `core_barrier` of core 2i meets the n-th of core 2i+1; the n-th `sendrecv` on a pipe meets
//! the peer's n-th on that pipe; the n-th collective with a given replica group meets the
//! others' n-th with the same group.

use super::Core;
use crate::cost::CostModel;
use crate::engines::intercore::{self as collective, DeviceMems, Rank};
use crate::error::{fail, EmuError, ErrorKind::*, Result};
use crate::isa::ops;
use crate::isa::spec::DataPath;
use crate::isa::text::format_instr;
use crate::isa::{Instr, Opcode, Program};
use crate::memory::hbm::Hbm;
use crate::memory::onchip::Mems;
use crate::numerics::config::Rounder;
use std::collections::HashMap;

type Vc = Vec<u32>;

/// True for the instructions the scheduler runs as a rendezvous (data path `collective`).
#[inline]
pub fn is_rendezvous(ins: &Instr) -> bool {
    ins.op.spec().path == DataPath::Collective
}

fn ins_err(e: EmuError, core: u8, idx: u32, ins: &Instr) -> EmuError {
    e.at(idx as usize, format!("{} (core {core})", format_instr(ins)))
}

/// Rules that need the issuing core: run once per program before the run starts.
pub fn check_program(prog: &Program, all: &[Option<&Program>]) -> Result<()> {
    let has = |c: u16| all.get(c as usize).is_some_and(|p| p.is_some());
    check_program_at(prog, prog.core as u16, &has)
}

/// `check_program` for a program on global core `me` (chip * 8 + core in an UltraServer);
/// `has(g)` says whether global core `g` runs a program.
pub fn check_program_at(prog: &Program, me: u16, has: &dyn Fn(u16) -> bool) -> Result<()> {
    let core = prog.core;
    for (i, ins) in prog.instrs.iter().enumerate() {
        if !is_rendezvous(ins) {
            continue;
        }
        check_participant(me, ins, has).map_err(|e| ins_err(e, core, i as u32, ins))?;
    }
    Ok(())
}

fn check_participant(me: u16, ins: &Instr, has: &dyn Fn(u16) -> bool) -> Result<()> {
    let group = collective::meeting(ins, me)?.cores;
    if !group.contains(&me) {
        return Err(fail(
            Value,
            "replica_group_without_issuer",
            format!(
                "core {me} issues a collective whose replica group {group:?} does not contain it"
            ),
        )
        .operand("cores"));
    }
    if ins.op == Opcode::Sendrecv {
        let rank = (me % 2) as i32;
        if ops::Sendrecv::view(ins)?.send_to_rank == rank {
            return Err(fail(
                Value,
                "sendrecv_to_self",
                format!("sendrecv on core {me} (rank {rank} of its LNC=2 pair) must send to the other rank, {}", 1 - rank),
            )
            .operand("send_to_rank"));
        }
    }
    for c in &group {
        if !has(*c) {
            let what = if matches!(ins.op, Opcode::Sendrecv | Opcode::CoreBarrier) {
                format!("its LNC=2 peer core {c}")
            } else {
                format!("core {c} of the replica group")
            };
            return Err(fail(
                Value,
                "collective_peer_without_program",
                format!("{} on core {me} needs a program on {what} (pass one program per participating core to run)", ins.op.spec().name),
            ));
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

/// A group whose last participant arrived, in rank order.
pub struct Group {
    key: Key,
    arrivals: Vec<Arrival>,
}

/// When a released participant completes and the clock it completes with.
pub struct Release {
    pub arrived: u64,
    pub end: u64,
    pub vc: Vc,
    /// A collective across chips: the participant's new dst bytes, written when it completes
    /// (`None`: the data already moved, or the dst is not written).
    pub payload: Option<crate::engines::intercore::Shared>,
}

enum Gate {
    Arrived(Key),
    /// Arrived at a collective across chips: held until the UltraServer fabric releases it.
    Away(String),
    Released(Release),
}

/// Rendezvous state of one run.
#[derive(Default)]
pub struct Intercore {
    /// The global id of this device's core 0 (chip * 8 in an UltraServer, else 0).
    pub base: u16,
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
            Some(Gate::Arrived(_) | Gate::Away(_)) => Ready::Blocked,
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

    /// Hold `agent`, which arrived at a collective across chips (`what` names it), until
    /// `deliver` releases it.
    pub fn hold(&mut self, agent: usize, what: String) {
        self.gates.insert(agent, Gate::Away(what));
    }

    /// Release `agent`, held by `hold`.
    pub fn deliver(&mut self, agent: usize, r: Release) {
        self.gates.insert(agent, Gate::Released(r));
    }

    /// Whether any stream is held by the fabric (the device may not conclude a deadlock).
    pub fn any_away(&self) -> bool {
        self.gates.values().any(|g| matches!(g, Gate::Away(_)))
    }

    /// Why a blocked stream is blocked (deadlock report).
    pub fn blocked(&self, agent: usize) -> Option<String> {
        let k = match self.gates.get(&agent) {
            Some(Gate::Arrived(k)) => k,
            Some(Gate::Away(what)) => return Some(what.clone()),
            _ => return None,
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

    /// `ins` (instruction `idx` of `core`, on stream agent `agent`) arrives at `now` with clock
    /// `vc` (whose entry `agent` is the arrival's epoch). Returns the group, in rank order, when
    /// this arrival completes it; the scheduler then performs it and calls `release`.
    pub fn arrive(
        &mut self,
        agent: usize,
        (core, idx): (u8, u32),
        ins: &Instr,
        now: u64,
        vc: Vc,
    ) -> Result<Option<Group>> {
        let m = collective::meeting(ins, self.base + core as u16)?;
        let cores: Vec<u8> = m
            .cores
            .iter()
            .map(|g| g.wrapping_sub(self.base) as u8)
            .collect();
        let n = self
            .seq
            .entry((core, ins.op, cores.clone(), m.pipe))
            .or_insert(0);
        let key = Key {
            op: ins.op,
            cores,
            pipe: m.pipe,
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
            return Ok(None);
        }
        let mut arrivals = self.groups.remove(&key).unwrap_or_default();
        arrivals.sort_by_key(|a| key.cores.iter().position(|c| *c == a.core));
        Ok(Some(Group { key, arrivals }))
    }

    /// Release every participant of a completed group at `end`. The release clock joins every
    /// participant's arrival clock, and each participant's completion is its next epoch:
    /// ordered before everyone's later work.
    pub fn release(&mut self, group: Group, end: u64) {
        let mut joined = vec![0u32; group.arrivals[0].vc.len()];
        for a in &group.arrivals {
            for (x, y) in joined.iter_mut().zip(&a.vc) {
                *x = (*x).max(*y);
            }
        }
        for a in &group.arrivals {
            // Blocked since its arrival, the participant's epoch advances exactly once more.
            let own = a.vc.get(a.agent).copied().unwrap_or(0);
            if let Some(x) = joined.get_mut(a.agent) {
                *x = (*x).max(own.saturating_add(1));
            }
        }
        for a in group.arrivals {
            self.gates.insert(
                a.agent,
                Gate::Released(Release {
                    arrived: a.time,
                    end,
                    vc: joined.clone(),
                    payload: None,
                }),
            );
        }
    }
}

/// The device memories, for the collectives of the engines layer.
pub struct DevMem<'a> {
    pub cores: &'a mut [Core],
    pub hbm: &'a mut Hbm,
}

impl DeviceMems for DevMem<'_> {
    fn core(&mut self, core: u16) -> Mems<'_> {
        let c = &mut self.cores[core as usize];
        Mems {
            sbuf: &mut c.sbuf,
            psum: &mut c.psum,
            hbm: &mut *self.hbm,
        }
    }
}

/// Perform a completed group's collective on the device memories (engines layer) with the
/// casts of `rounder`; returns its duration (cost model), ps.
pub fn perform(
    group: &Group,
    progs: &[Option<&Program>],
    dev: &mut DevMem<'_>,
    rounder: &Rounder,
    cost: &dyn CostModel,
) -> Result<u64> {
    let ranks: Vec<Rank> = group
        .arrivals
        .iter()
        .map(|a| {
            progs[a.core as usize].map(|p| Rank {
                core: a.core as u16,
                ins: &p.instrs[a.idx as usize],
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            fail(
                Internal,
                "rendezvous_without_program",
                "rendezvous participant without a program",
            )
        })?;
    let moved = collective::perform(&ranks, dev, rounder).map_err(|e| {
        let a = &group.arrivals[e.rank];
        ins_err(e.error, a.core, a.idx, ranks[e.rank].ins)
    })?;
    Ok(cost.collective_ps(moved.kind, moved.src_bytes, group.key.cores.len()))
}
