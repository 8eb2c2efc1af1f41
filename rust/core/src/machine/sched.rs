//! The scheduler: a discrete-event simulation of every core's five instruction streams and DMA
//! queues in emulated time. The next item to run is always the ready one with the earliest start
//! (ties by agent index), so functional effects happen in emulated-time order and results never
//! depend on the host. Semaphores carry vector clocks, which give the happens-before relation
//! the race detector checks every memory access against.

use super::dma_timing::{plan, DmaFabric, Plan};
use super::intercore::{self, DevMem, Intercore, Ready};
use super::region::{conflict, regions, Region};
use super::{stream_of, Device, RunOptions, RunResult, AGENTS_PER_CORE, NUM_CORES};
use crate::cost::{flops, Issue};
use crate::engines::validate;
use crate::engines::{self, Ctx};
use crate::error::{err, EmuError, ErrorKind::*, Result};
use crate::isa::instr::NUM_SEMAPHORES;
use crate::isa::text::format_instr;
use crate::isa::validate::is_dma;
use crate::isa::{Instr, Program};
use crate::memory::onchip::Mems;
use crate::memory::Mem;
use crate::numerics::config::Rounder;
use crate::trace::{DmaSpan, Record, SemEvent, Unit, WriteBox};
use std::collections::VecDeque;

type Vc = Vec<u32>;

fn join(a: &mut Vc, b: &[u32]) {
    for (x, y) in a.iter_mut().zip(b) {
        if *y > *x {
            *x = *y;
        }
    }
}

struct QItem {
    idx: u32,
    ready: u64,
    vc: Vc,
    /// The issuing stream's registers when the DMA was triggered (scalar offsets read them).
    regs: Box<Regs>,
    /// How the transfer uses the DMA engines (cost model, machine/dma_timing.rs).
    plan: Plan,
}

type Regs = [u32; crate::isa::instr::NUM_REGISTERS as usize];

struct LogEntry {
    epoch: u32,
    idx: u32,
    region: Region,
}

struct Agent {
    core: u8,
    stream: usize,
    /// Engine streams: indices into the core's program, in order.
    list: Vec<u32>,
    pos: usize,
    /// DMA queues: pending transfers.
    fifo: VecDeque<QItem>,
    free: u64,
    vc: Vc,
    epoch: u32,
    log: Vec<LogEntry>,
}

impl Agent {
    fn is_queue(&self) -> bool {
        self.stream >= 5
    }
    fn live(&self) -> bool {
        self.pos < self.list.len() || !self.fifo.is_empty()
    }
}

#[derive(Default)]
struct Sem {
    settled: u64,
    settled_vc: Vc,
    /// Increments not yet in the past: (time, delta, clock), sorted by time.
    pending: Vec<(u64, u32, Vc)>,
}

impl Sem {
    fn settle(&mut self, now: u64) {
        let n = self.pending.iter().take_while(|p| p.0 <= now).count();
        for (_, d, vc) in self.pending.drain(..n) {
            self.settled += d as u64;
            if self.settled_vc.is_empty() {
                self.settled_vc = vc;
            } else {
                join(&mut self.settled_vc, &vc);
            }
        }
    }

    /// Earliest time the value reaches `v` (`reach` without building the clock).
    fn reach_at(&self, v: u32) -> Option<u64> {
        if self.settled >= v as u64 {
            return Some(0);
        }
        let mut cum = self.settled;
        for (t, d, _) in &self.pending {
            cum += *d as u64;
            if cum >= v as u64 {
                return Some(*t);
            }
        }
        None
    }

    /// Join the clock of the increments that bring the value to `v` into `into`.
    fn join_reach(&self, v: u32, into: &mut Vc) {
        join(into, &self.settled_vc);
        if self.settled >= v as u64 {
            return;
        }
        let mut cum = self.settled;
        for (_, d, c) in &self.pending {
            cum += *d as u64;
            join(into, c);
            if cum >= v as u64 {
                return;
            }
        }
    }

    fn value_at_end(&self) -> u64 {
        self.settled + self.pending.iter().map(|p| p.1 as u64).sum::<u64>()
    }

    fn post(&mut self, t: u64, d: u32, vc: Vc) {
        let at = self.pending.partition_point(|p| p.0 <= t);
        self.pending.insert(at, (t, d, vc));
    }
}

fn describe(progs: &[Option<&Program>], core: u8, idx: u32) -> String {
    let ins = &progs[core as usize].unwrap().instrs[idx as usize];
    format!("core {core} #{idx} `{}`", format_instr(ins))
}

fn ins_err(e: EmuError, core: u8, idx: u32, ins: &Instr) -> EmuError {
    e.at(idx as usize, format!("{} (core {core})", format_instr(ins)))
}

pub fn run(dev: &mut Device, programs: &[&Program], opts: &RunOptions) -> Result<RunResult> {
    let mut progs: Vec<Option<&Program>> = vec![None; NUM_CORES];
    for p in programs {
        if p.core as usize >= NUM_CORES {
            return Err(err(
                Value,
                format!("program for core {} (cores are 0..{NUM_CORES})", p.core),
            ));
        }
        if progs[p.core as usize].is_some() {
            return Err(err(Value, format!("two programs for core {}", p.core)));
        }
        for (i, ins) in p.instrs.iter().enumerate() {
            validate(ins).map_err(|e| ins_err(e, p.core, i as u32, ins))?;
        }
        super::control::check_branches(p)?;
        progs[p.core as usize] = Some(p);
    }
    for p in programs {
        intercore::check_program(p, &progs)?;
    }
    let mut inter = Intercore::default();
    let n_agents = NUM_CORES * AGENTS_PER_CORE;
    // Only the streams and queues of cores with a program can ever act: the scheduler scans
    // those, and only they carry a vector clock.
    let active: Vec<usize> = (0..n_agents)
        .filter(|a| progs[a / AGENTS_PER_CORE].is_some())
        .collect();
    let mut agents: Vec<Agent> = (0..n_agents)
        .map(|a| Agent {
            core: (a / AGENTS_PER_CORE) as u8,
            stream: a % AGENTS_PER_CORE,
            list: Vec::new(),
            pos: 0,
            fifo: VecDeque::new(),
            free: 0,
            vc: if progs[a / AGENTS_PER_CORE].is_some() {
                vec![0; n_agents]
            } else {
                Vec::new()
            },
            epoch: 0,
            log: Vec::new(),
        })
        .collect();
    // Vector clocks only order accesses for the race detector: without it, clocks are not
    // copied into semaphores and transfers (empty clocks join as no-ops).
    let races = opts.check_races;
    for p in programs {
        for (i, ins) in p.instrs.iter().enumerate() {
            agents[p.core as usize * AGENTS_PER_CORE + stream_of(ins.engine)]
                .list
                .push(i as u32);
        }
    }
    let mut sems: Vec<Sem> = (0..NUM_CORES * NUM_SEMAPHORES as usize)
        .map(|_| Sem::default())
        .collect();
    let mut result = RunResult::default();
    let mut now = 0u64;
    let mut since_prune = 0u32;
    let cost = &*dev.cost;
    let mut fabric = DmaFabric::new(cost.dma(), NUM_CORES);
    let sem_latency = cost.sem_latency_ps();

    loop {
        // Pick the ready item with the earliest start.
        // Ties go to the higher DMA priority (lower class), then to the lower agent index.
        let mut best: Option<(u64, u8, usize)> = None;
        for &ai in &active {
            let a = &agents[ai];
            let mut prio = 0u8;
            let start = if a.is_queue() {
                match a.fifo.front() {
                    Some(q) => {
                        prio = q.plan.priority;
                        fabric.earliest(a.core as usize, a.free.max(q.ready), &q.plan)
                    }
                    None => continue,
                }
            } else {
                if a.pos >= a.list.len() {
                    continue;
                }
                let ins = &progs[a.core as usize].unwrap().instrs[a.list[a.pos] as usize];
                let mut t = a.free;
                let mut ready = true;
                for w in &ins.waits {
                    let s = &mut sems[a.core as usize * NUM_SEMAPHORES as usize + w.sem as usize];
                    s.settle(now);
                    match s.reach_at(w.value) {
                        Some(tw) => t = t.max(tw),
                        None => {
                            ready = false;
                            break;
                        }
                    }
                }
                if !ready {
                    continue;
                }
                if intercore::is_rendezvous(ins) {
                    match inter.ready(ai) {
                        Ready::Arrive => {}
                        Ready::Blocked => continue,
                        Ready::At(done) => t = t.max(done),
                    }
                }
                t
            };
            let start = start.max(now);
            if best.is_none_or(|b| (start, prio) < (b.0, b.1)) {
                best = Some((start, prio, ai));
            }
        }
        let Some((start, _, ai)) = best else {
            let blocked: Vec<String> = agents
                .iter()
                .enumerate()
                .filter(|(_, a)| !a.is_queue() && a.pos < a.list.len())
                .map(|(bi, a)| {
                    let idx = a.list[a.pos];
                    if let Some(why) = inter.blocked(bi) {
                        return format!("{} {why}", describe(&progs, a.core, idx));
                    }
                    let ins = &progs[a.core as usize].unwrap().instrs[idx as usize];
                    let waits: Vec<String> = ins
                        .waits
                        .iter()
                        .map(|w| {
                            let s =
                                &sems[a.core as usize * NUM_SEMAPHORES as usize + w.sem as usize];
                            format!("s{}>={} (stays {})", w.sem, w.value, s.value_at_end())
                        })
                        .collect();
                    format!(
                        "{} waits {}",
                        describe(&progs, a.core, idx),
                        waits.join(", ")
                    )
                })
                .collect();
            if blocked.is_empty() {
                break;
            }
            return Err(err(Deadlock, format!("deadlock: every remaining stream waits on a semaphore that no pending instruction will signal: {}", blocked.join("; "))));
        };
        now = start;
        let core = agents[ai].core;
        let cbase = core as usize * AGENTS_PER_CORE;
        let prog = progs[core as usize].unwrap();

        if result.executed >= dev.max_executed {
            return Err(err(
                Value,
                format!(
                    "stopped after {} executed instructions (a runaway loop?); Device::max_executed sets the limit",
                    dev.max_executed
                ),
            ));
        }
        // Which instruction, with which clock (and, for a transfer, its register snapshot).
        let mut snapshot: Option<Box<Regs>> = None;
        let issue = Issue {
            back_to_back: agents[ai].epoch > 0 && agents[ai].free == start,
        };
        let mut transfer: Option<Plan> = None;
        let mut release: Option<intercore::Release> = None;
        let (idx, is_transfer) = if agents[ai].is_queue() {
            let Some(q) = agents[ai].fifo.pop_front() else {
                return Err(err(Internal, "empty DMA queue was scheduled"));
            };
            let a = &mut agents[ai];
            join(&mut a.vc, &q.vc);
            snapshot = Some(q.regs);
            transfer = Some(q.plan);
            (q.idx, true)
        } else {
            let a = &mut agents[ai];
            let idx = a.list[a.pos];
            let ins = &prog.instrs[idx as usize];
            for w in &ins.waits {
                let s = &sems[core as usize * NUM_SEMAPHORES as usize + w.sem as usize];
                s.join_reach(w.value, &mut a.vc);
            }
            if intercore::is_rendezvous(ins) {
                let mut vc = a.vc.clone();
                match inter.complete(ai) {
                    Some(r) => {
                        join(&mut vc, &r.vc);
                        release = Some(r);
                    }
                    None => {
                        // Arrival: the stream blocks until every participant has arrived.
                        let a = &mut agents[ai];
                        a.epoch += 1;
                        vc[ai] = a.epoch;
                        a.vc = vc.clone();
                        let mut mem = DevMem {
                            cores: &mut dev.cores,
                            hbm: &mut dev.hbm,
                            rounder: Rounder::new(dev.numerics, core, dev.runs, idx, false),
                        };
                        inter.arrive(
                            &mut mem,
                            &progs,
                            ai,
                            core,
                            idx,
                            ins,
                            start,
                            vc,
                            &cost.dma(),
                            sem_latency,
                        )?;
                        continue;
                    }
                }
                agents[ai].vc = vc;
            }
            agents[ai].pos += 1;
            (idx, false)
        };
        let ins = &prog.instrs[idx as usize];
        {
            let a = &mut agents[ai];
            a.epoch += 1;
            a.vc[ai] = a.epoch;
        }

        // A DMA instruction on an engine stream is only the trigger: queue the transfer.
        if !is_transfer && is_dma(ins) {
            let end = start + cost.engine_ps(ins, issue);
            let q = cbase + 5 + agents[ai].stream;
            let vc = if races {
                agents[ai].vc.clone()
            } else {
                Vec::new()
            };
            let regs = Box::new(dev.cores[core as usize].regs[agents[ai].stream]);
            agents[q].fifo.push_back(QItem {
                idx,
                ready: end,
                vc,
                regs,
                plan: plan(ins, &cost.dma()),
            });
            agents[ai].free = end;
            if opts.trace {
                trace_waits(&mut result.trace, core, ins, start);
                result.trace.records.push(Record {
                    core,
                    unit: Unit::Engine(agents[ai].stream as u8),
                    index: idx,
                    opcode: ins.op,
                    start_ps: start,
                    end_ps: end,
                    bytes: 0,
                    flops: 0,
                    hbm_bytes: 0,
                    priority: 0,
                    dma_engines: 0,
                    write: WriteBox::NONE,
                });
            }
            result.executed += 1;
            continue;
        }

        // Race check against every unordered access of the other agents.
        let regs = if races || opts.trace {
            regions(core, ins)
        } else {
            Vec::new()
        };
        if races && !regs.is_empty() {
            let my_vc = &agents[ai].vc;
            for &bi in &active {
                let b = &agents[bi];
                if bi == ai {
                    continue;
                }
                for e in &b.log {
                    if e.epoch <= my_vc[bi] {
                        continue;
                    }
                    if let Some((i, _)) = conflict(&regs, std::slice::from_ref(&e.region)) {
                        let r = &regs[i];
                        let what = if r.mem == crate::memory::Mem::Hbm {
                            format!(
                                "hbm bytes {}..{}",
                                r.lo.max(e.region.lo),
                                r.hi.min(e.region.hi)
                            )
                        } else {
                            format!(
                                "{} partitions {}..{} bytes {}..{}",
                                r.mem.name(),
                                r.p0.max(e.region.p0),
                                r.p1.min(e.region.p1),
                                r.lo.max(e.region.lo),
                                r.hi.min(e.region.hi)
                            )
                        };
                        // Reported at the later instruction (the one that found the conflict).
                        return Err(ins_err(
                            err(
                                Race,
                                format!(
                                    "data race: {} and {} both touch {} ({} writes) with no semaphore ordering them",
                                    describe(&progs, b.core, e.idx),
                                    describe(&progs, core, idx),
                                    what,
                                    if e.region.write && r.write { "both" } else if e.region.write { "the first" } else { "the second" }
                                ),
                            ),
                            core,
                            idx,
                            &prog.instrs[idx as usize],
                        ));
                    }
                }
            }
        }

        // Execute.
        let bytes: u64 = regs
            .iter()
            .map(|r| r.ap.num_elements() as u64 * r.ap.dtype.size() as u64)
            .sum();
        let wbox = if opts.trace {
            write_box(&regs)
        } else {
            WriteBox::NONE
        };
        let jump = {
            let c = &mut dev.cores[core as usize];
            let stream = agents[ai].stream;
            let regs = match snapshot.as_deref_mut() {
                Some(r) => r,
                None => &mut c.regs[stream.min(4)],
            };
            let mut ctx = Ctx {
                mems: Mems {
                    sbuf: &mut c.sbuf,
                    psum: &mut c.psum,
                    hbm: &mut dev.hbm,
                },
                state: &mut c.state,
                rng: &mut c.rng,
                rounder: Rounder::new(dev.numerics, core, dev.runs, idx, !is_transfer),
                regs,
                jump: None,
            };
            if release.is_none() {
                if !ctx.state.psum_mm_dirty
                    && ins
                        .tensors()
                        .any(|(_, _, acc, ap)| acc.writes() && ap.mem == Mem::Psum)
                {
                    ctx.state.psum_mm_dirty = true;
                }
                engines::exec(ins, &mut ctx).map_err(|e| ins_err(e, core, idx, ins))?;
            }
            ctx.jump
        };
        if let Some(t) = jump {
            let a = &mut agents[ai];
            super::control::jump(&a.list, &mut a.pos, t);
        }
        let end = match (&transfer, &release) {
            (Some(pl), _) => fabric.commit(core as usize, start, pl),
            (None, Some(r)) => r.end,
            (None, None) => start + cost.engine_ps(ins, issue),
        };
        {
            let a = &mut agents[ai];
            // A queue hands its next transfer to the engines as soon as this one is committed.
            a.free = if is_transfer { start } else { end };
            if opts.check_races {
                let epoch = a.epoch;
                for r in regs {
                    a.log.push(LogEntry {
                        epoch,
                        idx,
                        region: r,
                    });
                }
            }
        }
        let seen = end + sem_latency;
        for s in &ins.signals {
            let vc = if races {
                agents[ai].vc.clone()
            } else {
                Vec::new()
            };
            sems[core as usize * NUM_SEMAPHORES as usize + s.sem as usize].post(seen, s.delta, vc);
        }
        if opts.trace {
            let unit = if is_transfer {
                Unit::DmaQueue((agents[ai].stream - 5) as u8)
            } else {
                trace_waits(&mut result.trace, core, ins, start);
                Unit::Engine(agents[ai].stream as u8)
            };
            let record = result.trace.records.len() as u32;
            if is_transfer {
                for &(engine, s0, s1, b) in &fabric.last_spans {
                    result.trace.dma_spans.push(DmaSpan {
                        core,
                        engine,
                        start_ps: s0,
                        end_ps: s1,
                        bytes: b,
                        record,
                    });
                }
            }
            for s in &ins.signals {
                result.trace.sems.push(SemEvent {
                    core,
                    sem: s.sem,
                    wait: false,
                    value: s.delta,
                    time_ps: seen,
                    record,
                    by: -1,
                });
            }
            let write = wbox;
            let (bytes, hbm_bytes, priority, dma_engines) = match &transfer {
                Some(pl) => (pl.bytes, pl.hbm_bytes, pl.priority, pl.pieces.len() as u8),
                None => (bytes, 0, 0, 0),
            };
            result.trace.records.push(Record {
                core,
                unit,
                index: idx,
                opcode: ins.op,
                start_ps: release.as_ref().map_or(start, |r| r.arrived),
                end_ps: end,
                bytes,
                flops: if is_transfer { 0 } else { flops(ins) },
                hbm_bytes,
                priority,
                dma_engines,
                write,
            });
        }
        result.end_ps = result.end_ps.max(end);
        result.executed += 1;

        since_prune += 1;
        if opts.check_races && since_prune >= 128 {
            since_prune = 0;
            prune(&mut agents);
        }
    }
    result.end_ps = result
        .end_ps
        .max(agents.iter().map(|a| a.free).max().unwrap_or(0));
    if opts.trace {
        result.trace.link_semaphores();
    }
    Ok(result)
}

/// Drop log entries that every agent that can still act is already ordered after.
fn prune(agents: &mut [Agent]) {
    let n = agents.len();
    let mut bound = vec![u32::MAX; n];
    for a in agents.iter() {
        if !a.is_queue() && a.pos < a.list.len() {
            for (b, v) in bound.iter_mut().zip(&a.vc) {
                *b = (*b).min(*v);
            }
        }
        for q in &a.fifo {
            for (b, v) in bound.iter_mut().zip(&q.vc) {
                *b = (*b).min(*v);
            }
        }
    }
    let any_live = agents.iter().any(|a| a.live());
    for (i, a) in agents.iter_mut().enumerate() {
        if !any_live {
            a.log.clear();
        } else {
            let b = bound[i];
            a.log.retain(|e| e.epoch > b);
        }
    }
}

/// Record the waits of the instruction about to become record `records.len()` (trace only).
fn trace_waits(t: &mut crate::trace::Trace, core: u8, ins: &Instr, start: u64) {
    let record = t.records.len() as u32;
    for w in &ins.waits {
        t.sems.push(SemEvent {
            core,
            sem: w.sem,
            wait: true,
            value: w.value,
            time_ps: start,
            record,
            by: -1,
        });
    }
}

/// The first on-chip region the instruction writes (from its `regions`, which list operands in
/// order), for the occupancy counters of the trace.
fn write_box(regs: &[Region]) -> WriteBox {
    for r in regs {
        if !r.write || r.mem == Mem::Hbm {
            continue;
        }
        return WriteBox {
            mem: r.mem as u8,
            p0: r.p0.min(255) as u8,
            p1: r.p1.min(255) as u8,
            lo: r.lo.clamp(0, u32::MAX as i128) as u32,
            hi: r.hi.clamp(0, u32::MAX as i128) as u32,
        };
    }
    WriteBox::NONE
}
