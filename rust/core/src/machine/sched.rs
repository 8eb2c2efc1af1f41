//! The scheduler: a discrete-event simulation of every core's five instruction streams and DMA
//! queues in emulated time. The next item to run is always the ready one with the earliest start
//! (ties by agent index), so functional effects happen in emulated-time order and results never
//! depend on the host. Semaphores carry vector clocks, which give the happens-before relation
//! the race detector checks every memory access against.
//!
//! One step of `Scheduler::run`: `pick` the next item, `issue` it (take it off its stream or
//! queue; a rendezvous may only arrive here), then either `trigger` a DMA transfer or
//! `check_races`, `execute`, `complete`, `signal` and `record` it.

use super::dependence::LastWrites;
use super::dma_timing::DmaFabric;
use super::intercore::{self, DevMem, Intercore, Ready, Release};
use super::race_log::RaceLog;
use super::region::{conflict, Region};
use super::run_plan::{self, RunPlan};
use super::{
    Device, Executor, Monitor, Progress, RunOptions, RunResult, AGENTS_PER_CORE, NUM_CORES,
    POLL_EVERY,
};
use crate::cost::Issue;
use crate::engines::validate;
use crate::engines::{self, Ctx};
use crate::error::{fail, EmuError, ErrorKind::*, Result};
use crate::isa::instr::{Wait, NUM_SEMAPHORES};
use crate::isa::text::format_instr;
use crate::isa::validate::is_dma;
use crate::isa::{Instr, Program};
use crate::memory::onchip::Mems;
use crate::memory::Mem;
use crate::numerics::config::Rounder;
use crate::trace::{DmaSpan, Record, SemEvent, WriteBox};

use super::identical;
use std::collections::VecDeque;
use std::sync::Arc;

type Vc = Vec<u32>;

fn join(a: &mut Vc, b: &[u32]) {
    for (x, y) in a.iter_mut().zip(b) {
        if *y > *x {
            *x = *y;
        }
    }
}

/// A transfer waiting on a DMA queue.
struct QItem {
    idx: u32,
    ready: u64,
    vc: Vc,
    transfer: Box<Transfer>,
}

/// What a queued transfer carries to its execution (boxed: the scheduler moves `Issued` items
/// by value every step, and a small one moves without a copy loop). How it uses the DMA
/// engines is its instruction's `RunPlan::transfer`.
struct Transfer {
    /// The issuing stream's registers when the DMA was triggered (scalar offsets read them).
    regs: Regs,
}

type Regs = [u32; crate::isa::instr::NUM_REGISTERS as usize];

/// An engine stream or a DMA queue of one core.
struct Agent {
    core: u8,
    exec: Executor,
    /// Engine streams: indices into the core's program, in order.
    list: Vec<u32>,
    pos: usize,
    /// Engine streams: the waits and kind of the instruction at `pos` (`pick` looks at every
    /// stream's each step; this keeps it from reading instructions, cold after an execute).
    next: Next,
    /// DMA queues: pending transfers.
    fifo: VecDeque<QItem>,
    free: u64,
    vc: Vc,
    epoch: u32,
    log: RaceLog,
    /// Engine streams: one past the last list position whose instruction touches memory itself
    /// (not a DMA trigger), and one past the last DMA trigger (0: none).
    touch_end: usize,
    trigger_end: usize,
    /// The core's program branches (a cursor may move back, an instruction run again).
    loops: bool,
    /// Engine streams: what the previous instruction wrote (dependent-instruction overhead).
    last_writes: LastWrites,
}

/// Waits `Next` holds in place; an instruction with more is read at each look.
const NEXT_WAITS: usize = 3;

/// Transfers one engine stream may have waiting on its DMA queue (triggered, not yet started);
/// its next DMA trigger stalls until the queue's first transfer starts. The hardware's queues
/// are finite: a NeuronCore has 16 DMA engines with 16 queues each (reference
/// neuroncore-v4.md §1.8; the ring depth of a queue is not public), so we allow 16 x 16 = 256.
/// Without a bound, an engine that triggers DMAs faster than they move (a loop of `dma_copy`
/// and `branch`) ran ahead without limit and its backlog grew host memory by ~85 MiB/s.
pub const DMA_QUEUE_DEPTH: usize = 256;

/// What `stream_ready` needs of a stream's next instruction.
#[derive(Clone, Copy)]
struct Next {
    waits: [Wait; NEXT_WAITS],
    /// Number of waits (above `NEXT_WAITS`: read them from the instruction).
    n: usize,
    rendezvous: bool,
    /// A DMA trigger: it waits for room on the stream's queue (`DMA_QUEUE_DEPTH`).
    dma: bool,
}

impl Next {
    const NONE: Next = Next {
        waits: [Wait { sem: 0, value: 0 }; NEXT_WAITS],
        n: 0,
        rendezvous: false,
        dma: false,
    };

    fn of(ins: &Instr) -> Next {
        let mut next = Next {
            n: ins.waits.len(),
            rendezvous: intercore::is_rendezvous(ins),
            dma: is_dma(ins),
            ..Next::NONE
        };
        if next.n <= NEXT_WAITS {
            next.waits[..next.n].copy_from_slice(&ins.waits);
        }
        next
    }
}

impl Agent {
    /// Note the instruction now at `pos` (after `pos` moved).
    #[inline]
    fn moved(&mut self, prog: &Program) {
        self.next = match self.list.get(self.pos) {
            Some(&i) => Next::of(&prog.instrs[i as usize]),
            None => Next::NONE,
        };
        prefetch_ahead(&self.list, self.pos, prog);
    }

    #[inline]
    fn is_queue(&self) -> bool {
        self.exec.is_queue()
    }
    /// An engine stream with instructions left.
    #[inline]
    fn has_next(&self) -> bool {
        !self.is_queue() && self.pos < self.list.len()
    }
    fn live(&self) -> bool {
        self.pos < self.list.len() || !self.fifo.is_empty()
    }
    /// An engine stream that may still run an instruction below list position `end`.
    fn may_reach(&self, end: usize) -> bool {
        self.has_next() && (self.pos < end || (self.loops && end > 0))
    }
}

/// Ask the caches for what the stream reads of its coming instructions (each is touched once
/// per run, cold: the engines' data evicts it): the `Instr` two ahead, and the operand, wait and
/// signal blocks of the next one (its `Instr` asked for one move earlier). Hints only.
#[inline]
fn prefetch_ahead(list: &[u32], pos: usize, prog: &Program) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (list, pos, prog);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let at = |k: usize| list.get(pos + k).map(|&j| &prog.instrs[j as usize]);
        let lines = |p: *const u8, n: usize| {
            for k in 0..n {
                // SAFETY: a prefetch never faults and reads nothing; the address is only a hint.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * k) as *const i8) };
            }
        };
        if let Some(ins) = at(2) {
            lines(ins as *const Instr as *const u8, 2);
        }
        if let Some(ins) = at(1) {
            lines(ins.args.as_ptr() as *const u8, 4);
            lines(ins.waits.as_ptr() as *const u8, 1);
            lines(ins.signals.as_ptr() as *const u8, 1);
        }
    }
}

/// The agent index of executor `e` of `core` (the order ties are broken in).
#[inline]
fn agent_id(core: u8, e: Executor) -> usize {
    core as usize * AGENTS_PER_CORE + e.index()
}

/// The index of semaphore `sem` of `core` in `Scheduler::sems`.
#[inline]
fn sem_id(core: u8, sem: u16) -> usize {
    core as usize * NUM_SEMAPHORES as usize + sem as usize
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

/// The instruction a stream of `core` is at, for messages (only cores with a program have
/// streams that act).
fn instr_at<'p>(progs: &[Option<&'p Program>], core: u8, idx: u32) -> Option<&'p Instr> {
    progs[core as usize].and_then(|p| p.instrs.get(idx as usize))
}

fn describe(progs: &[Option<&Program>], core: u8, idx: u32) -> String {
    match instr_at(progs, core, idx) {
        Some(ins) => format!("core {core} #{idx} `{}`", format_instr(ins)),
        None => format!("core {core} #{idx}"),
    }
}

pub(super) fn ins_err(e: EmuError, core: u8, idx: u32, ins: &Instr) -> EmuError {
    e.at(idx as usize, format!("{} (core {core})", format_instr(ins)))
}

/// The item `pick` chose: agent `agent` starts at `start`.
#[derive(Clone, Copy)]
struct Pick {
    start: u64,
    agent: usize,
}

/// What an issued item does.
enum Work {
    /// The next instruction of an engine stream.
    Instr,
    /// A transfer taken off a DMA queue, with its trigger's register snapshot.
    Transfer(Box<Transfer>),
    /// A rendezvous participant released now (its group's data moved when the group completed).
    Release(Box<Release>),
}

/// The item being run: made by `issue`, read by the later steps.
struct Issued<'p> {
    agent: usize,
    core: u8,
    idx: u32,
    ins: &'p Instr,
    start: u64,
    issue: Issue,
    work: Work,
}

/// Every core's programs, streams, queues and semaphores during one run.
pub struct Scheduler<'d, 'p> {
    dev: &'d mut Device,
    /// The program of each core, if it runs one.
    progs: Vec<Option<&'p Program>>,
    /// The plan of each core's program (regions, transfer plans: machine/run_plan.rs).
    plans: Vec<Arc<RunPlan>>,
    opts: RunOptions,
    /// Every core's streams and queues, `AGENTS_PER_CORE` per core (index: `agent_id`).
    agents: Vec<Agent>,
    /// The agents that can ever act (`acting`): streams with instructions, queues they feed.
    active: Vec<usize>,
    /// Per agent, at least the highest epoch in its race log (0: nothing logged): the race
    /// checks pass over an agent whose log is all ordered before without reading the log.
    log_top: Vec<u32>,
    sems: Vec<Sem>,
    inter: Intercore,
    fabric: DmaFabric,
    sem_latency: u64,
    result: RunResult,
    now: u64,
    since_prune: u32,
    /// Polled every `POLL_EVERY` executed items (None: no polls).
    monitor: Option<&'d mut dyn Monitor>,
    /// Units of work done (`limits::work_units` per item): the step budget
    /// (`Device::max_executed`) counts these, so a loop of large items reaches it as soon (in
    /// host time) as a loop of tiny ones.
    spent: u64,
    /// `spent` at which `check_budget` next looks up (the budget or a poll is due).
    next_check: u64,
    /// The run's planned item count, computed at the first poll (`Progress::total`).
    total: Option<Option<u64>>,
    /// A chip of an UltraServer: collectives across chips leave through here (machine/ultra.rs).
    pub(super) link: Option<super::ultra::ChipLink>,
    /// Wall-time and host-memory limits, checked at every poll.
    limits: super::limits::Limits,
    /// Cores on host threads (machine/parallel.rs): compute instructions queue there.
    pub(super) pool: Option<std::sync::Arc<super::parallel::Pool<'p>>>,
    /// `now` when `pick` last ran: the time the picked instruction's semaphores are settled at.
    picked_at: u64,
}

/// Run one program per listed core to completion, polling `monitor` on the way.
pub fn run(
    dev: &mut Device,
    programs: &[&Program],
    plans: &[Arc<RunPlan>],
    opts: &RunOptions,
    monitor: Option<&mut dyn Monitor>,
) -> Result<RunResult> {
    let mut s = Scheduler::with_check(dev, programs, plans, opts, &intercore::check_program)?;
    if let Some(m) = monitor {
        s.next_check = s.next_check.min(POLL_EVERY);
        s.monitor = Some(m);
    }
    if super::parallel::wanted(s.progs.iter().flatten().count()) {
        return super::parallel::run(s, opts.max_memory);
    }
    s.run()
}

/// Items a run of `progs` executes (each instruction, plus the transfer of each DMA
/// instruction); `None` when a program branches. Counted by the plans (`plans[core]`).
fn planned_items(progs: &[Option<&Program>], plans: &[Arc<RunPlan>]) -> Option<u64> {
    let mut n = 0;
    for (c, _) in progs.iter().enumerate().filter(|(_, p)| p.is_some()) {
        n += plans[c].planned_items()?;
    }
    Some(n)
}

/// The run-start rule check of one program, given every core's program.
pub(super) type ProgramCheck<'a> = dyn Fn(&Program, &[Option<&Program>]) -> Result<()> + 'a;

/// Validate the programs (unless the caller guarantees they were) and place them by core.
fn load_programs<'p>(
    programs: &[&'p Program],
    prevalidated: bool,
    check: &ProgramCheck,
) -> Result<Vec<Option<&'p Program>>> {
    let mut progs: Vec<Option<&Program>> = vec![None; NUM_CORES];
    for p in programs {
        if p.core as usize >= NUM_CORES {
            return Err(fail(
                Value,
                "core_out_of_range",
                format!("program for core {} (cores are 0..{NUM_CORES})", p.core),
            ));
        }
        if progs[p.core as usize].is_some() {
            return Err(fail(
                Value,
                "duplicate_core_program",
                format!("two programs for core {}", p.core),
            ));
        }
        if !prevalidated {
            for (i, ins) in p.instrs.iter().enumerate() {
                validate(ins).map_err(|e| ins_err(e, p.core, i as u32, ins))?;
            }
        }
        super::control::check_branches(p)?;
        progs[p.core as usize] = Some(p);
    }
    for p in programs {
        check(p, &progs)?;
    }
    Ok(progs)
}

/// The plan of each core's program (`plans[i]` that of `programs[i]`, or built here when none
/// are given); cores without a program get an empty one.
fn by_core(
    programs: &[&Program],
    plans: &[Arc<RunPlan>],
    dev: &Device,
    opts: &RunOptions,
) -> Result<Vec<Arc<RunPlan>>> {
    let cost = &*dev.cost;
    let built;
    let plans = if plans.len() == programs.len() {
        plans
    } else {
        let with_regions = opts.check_races || opts.trace;
        built = run_plan::for_run(programs, &[], cost, with_regions, &mut || true)?;
        &built[..]
    };
    let empty = Program {
        core: 0,
        instrs: Vec::new(),
    };
    let none = Arc::new(RunPlan::new(&empty, cost, false));
    let mut out = vec![none; NUM_CORES];
    for (p, plan) in programs.iter().zip(plans) {
        if let Some(slot) = out.get_mut(p.core as usize) {
            *slot = plan.clone();
        }
    }
    Ok(out)
}

/// Every core's agents, each engine stream listing its instructions.
fn make_agents(progs: &[Option<&Program>], plans: &[Arc<RunPlan>]) -> Vec<Agent> {
    // Agents (and the clocks' entries) only for the cores up to the last with a program: the
    // others never act, and every agent index the scheduler forms is of an acting agent's core
    // or a program's. A one-core run builds 10 agents, not 80, and its clocks have 10 entries.
    let n_agents = progs.iter().rposition(Option::is_some).map_or(0, |c| c + 1) * AGENTS_PER_CORE;
    let n_clock = n_agents;
    let mut agents: Vec<Agent> = (0..n_agents)
        .map(|a| Agent {
            core: (a / AGENTS_PER_CORE) as u8,
            exec: Executor::from_index(a % AGENTS_PER_CORE),
            list: Vec::new(),
            pos: 0,
            next: Next::NONE,
            fifo: VecDeque::new(),
            free: 0,
            // Only agents of cores with a program carry a vector clock.
            vc: if progs[a / AGENTS_PER_CORE].is_some() {
                vec![0; n_clock]
            } else {
                Vec::new()
            },
            epoch: 0,
            log: RaceLog::default(),
            touch_end: 0,
            trigger_end: 0,
            loops: progs[a / AGENTS_PER_CORE].is_some() && plans[a / AGENTS_PER_CORE].branches(),
            last_writes: LastWrites::default(),
        })
        .collect();
    for p in progs.iter().flatten() {
        let plan = &plans[p.core as usize];
        for s in super::Stream::ALL {
            let a = &mut agents[agent_id(p.core, Executor::Engine(s))];
            let l = plan.stream(s.index());
            a.list.clone_from(&l.list);
            (a.touch_end, a.trigger_end) = (l.touch_end, l.trigger_end);
        }
        for e in 0..AGENTS_PER_CORE {
            agents[p.core as usize * AGENTS_PER_CORE + e].moved(p);
        }
    }
    agents
}

/// Room for the trace of a run without branches, so it does not grow by copies: at most two
/// records per instruction (a DMA's trigger and transfer); when they are all kept, the
/// programs' semaphore events and DMA engine spans (`RunPlan::trace_room`), else as many
/// semaphore events as records. Capacity no record uses costs address space only. The trace
/// grows fallibly past it.
fn reserve_trace(
    t: &mut crate::trace::Trace,
    progs: &[Option<&Program>],
    plans: &[Arc<RunPlan>],
    limit: u64,
) {
    let n: usize = progs.iter().flatten().map(|p| p.instrs.len()).sum();
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let records = n.saturating_mul(2).min(limit);
    let _ = t.records.try_reserve_exact(records);
    if records < n.saturating_mul(2) {
        let _ = t.sems.try_reserve_exact(records);
        return;
    }
    let (mut sems, mut spans) = (0usize, 0usize);
    for (c, _) in progs.iter().enumerate().filter(|(_, p)| p.is_some()) {
        let (s, d) = plans[c].trace_room();
        sems = sems.saturating_add(s);
        spans = spans.saturating_add(d);
    }
    let _ = t.sems.try_reserve_exact(sems.max(records));
    let _ = t.dma_spans.try_reserve_exact(spans);
}

/// The agents that can ever act, in index order: the engine streams of cores with a program
/// that list instructions, and the DMA queues of streams that trigger transfers (`pick` and the
/// race checks look at no other).
fn acting(agents: &[Agent], progs: &[Option<&Program>]) -> Vec<usize> {
    (0..agents.len())
        .filter(|&a| {
            let x = &agents[a];
            progs[a / AGENTS_PER_CORE].is_some()
                && if x.is_queue() {
                    let stream = agent_id(x.core, Executor::Engine(x.exec.stream()));
                    agents[stream].trigger_end > 0
                } else {
                    !x.list.is_empty()
                }
        })
        .collect()
}

impl<'d, 'p> Scheduler<'d, 'p> {
    pub fn new(dev: &'d mut Device, programs: &[&'p Program], opts: &RunOptions) -> Result<Self> {
        Self::with_check(dev, programs, &[], opts, &intercore::check_program)
    }

    /// `new` with the programs' plans (`plans[i]` of `programs[i]`; none given: built here) and
    /// the run-start rule check of each program (an UltraServer chip checks its collectives'
    /// groups across chips).
    pub(super) fn with_check(
        dev: &'d mut Device,
        programs: &[&'p Program],
        plans: &[Arc<RunPlan>],
        opts: &RunOptions,
        check: &ProgramCheck,
    ) -> Result<Self> {
        let progs = load_programs(programs, opts.prevalidated, check)?;
        let plans = by_core(programs, plans, dev, opts)?;
        let agents = make_agents(&progs, &plans);
        let active = acting(&agents, &progs);
        let mut result = RunResult::default();
        if opts.trace {
            reserve_trace(&mut result.trace, &progs, &plans, opts.trace_limit);
        }
        // Semaphores of the cores up to the last with a program: only their agents act, and an
        // agent only waits on and signals its own core's (`sem_id`). A one-core run builds and
        // drops 256, not 2,048 (they were a quarter of a one-instruction run's host time).
        let sem_cores = progs.iter().rposition(Option::is_some).map_or(0, |c| c + 1);
        let sems = (0..sem_cores * NUM_SEMAPHORES as usize)
            .map(|_| Sem::default())
            .collect();
        let fabric = DmaFabric::new(dev.cost.dma(), NUM_CORES);
        let sem_latency = dev.cost.sem_latency_ps();
        let next_check = dev.max_executed.min(POLL_EVERY);
        let limits = super::limits::Limits::start(opts, &dev.hbm);
        Ok(Scheduler {
            dev,
            progs,
            plans,
            opts: *opts,
            log_top: vec![0; agents.len()],
            agents,
            active,
            sems,
            inter: Intercore::default(),
            fabric,
            sem_latency,
            result,
            now: 0,
            since_prune: 0,
            monitor: None,
            spent: 0,
            next_check,
            total: None,
            link: None,
            limits,
            pool: None,
            picked_at: 0,
        })
    }

    /// The plan of `core`'s program.
    #[inline]
    fn plan(&self, core: u8) -> &Arc<RunPlan> {
        &self.plans[core as usize]
    }

    /// Run every stream and queue until all are done (or an error: race, deadlock, runaway).
    pub fn run(mut self) -> Result<RunResult> {
        while let Some(p) = self.pick()? {
            self.step(p)?;
        }
        Ok(self.finish())
    }

    /// One event: the picked item runs.
    fn step(&mut self, p: Pick) -> Result<()> {
        self.now = p.start;
        self.check_budget()?;
        let Some(mut it) = self.issue(p)? else {
            return Ok(());
        };
        // A DMA instruction on an engine stream is only the trigger: queue the transfer.
        if matches!(it.work, Work::Instr) && is_dma(it.ins) {
            return self.trigger(&it);
        }
        let traced = self.traced();
        // SAFETY: `plans` is set once in `new` and never changed; each `Arc` keeps its plan
        // alive (and in place) as long as the scheduler, which outlives this step. (A clone of
        // the `Arc` per step was two atomic operations on a shared line.)
        let plan: &RunPlan = unsafe { &*Arc::as_ptr(self.plan(it.core)) };
        let regs = plan.regions(it.idx);
        let pending = self.check_races(&it, regs)?;
        let (bytes, write) = if traced {
            plan.traced(it.idx)
        } else {
            (0, WriteBox::NONE)
        };
        self.execute(&mut it)?;
        if !pending.is_empty() {
            self.settle_identical(&it, regs, pending)?;
        }
        let end = self.complete(&it, plan);
        let seen = self.signal(&it, end);
        if traced {
            self.record(&it, end, seen, bytes, write);
        }
        self.result.end_ps = self.result.end_ps.max(end);
        self.result.executed += 1;
        self.spent += plan.work(it.idx) as u64;
        self.since_prune += 1;
        if self.opts.check_races && self.since_prune >= 128 {
            self.since_prune = 0;
            prune(&mut self.agents);
        }
        Ok(())
    }

    /// Whether the item about to run gets a trace record: tracing is on, fewer than
    /// `trace_limit` records are kept and there is room for one more (the record list grows
    /// fallibly: a host that cannot give more memory ends the trace like the limit does, no
    /// abort). Otherwise the item is counted in `Trace::dropped`.
    fn traced(&mut self) -> bool {
        if !self.opts.trace {
            return false;
        }
        let t = &mut self.result.trace;
        let n = t.records.len();
        let limit = self.opts.trace_limit;
        // Semaphore events and DMA spans are bounded by the same count (a record has a few).
        let room = |len: usize| (len as u64) < limit;
        if room(n)
            && room(t.sems.len())
            && room(t.dma_spans.len())
            && (n < t.records.capacity() || grow_records(&mut t.records, limit))
        {
            return true;
        }
        t.dropped += 1;
        false
    }

    /// Pick the ready item with the earliest start. Ties go to the higher DMA priority (lower
    /// class), then to the lower agent index. `None` when every stream and queue is done; a
    /// deadlock error when streams remain but none can ever run.
    fn pick(&mut self) -> Result<Option<Pick>> {
        self.picked_at = self.now;
        let mut best: Option<(u64, u8, usize)> = None;
        for i in 0..self.active.len() {
            let ai = self.active[i];
            let ready = if self.agents[ai].is_queue() {
                self.queue_ready(ai)
            } else {
                self.stream_ready(ai)
            };
            let Some((start, prio)) = ready else { continue };
            let start = start.max(self.now);
            if best.is_none_or(|b| (start, prio) < (b.0, b.1)) {
                best = Some((start, prio, ai));
            }
        }
        match best {
            Some((start, _, agent)) => Ok(Some(Pick { start, agent })),
            None => match self.deadlock() {
                Some(e) => Err(e),
                None => Ok(None),
            },
        }
    }

    /// When queue `ai` could start its next transfer, and the transfer's priority.
    #[inline]
    fn queue_ready(&self, ai: usize) -> Option<(u64, u8)> {
        let a = &self.agents[ai];
        let q = a.fifo.front()?;
        let plan = self.plan(a.core).transfer(q.idx);
        let start = self
            .fabric
            .earliest(a.core as usize, a.free.max(q.ready), plan);
        Some((start, plan.priority))
    }

    /// When stream `ai` could start its next instruction: its semaphore waits met (and, for a
    /// rendezvous, its group released); `None` while a wait or the group cannot be met yet.
    /// The semaphores are settled only when the instruction issues (`next_instr`): the time of
    /// an increment already visible stands for 0 here, as `pick` starts nothing before `now`.
    #[inline]
    fn stream_ready(&self, ai: usize) -> Option<(u64, u8)> {
        let a = &self.agents[ai];
        if a.pos >= a.list.len() {
            return None;
        }
        let next = &a.next;
        let waits = if next.n <= NEXT_WAITS {
            &next.waits[..next.n]
        } else {
            &self.progs[a.core as usize]?.instrs[a.list[a.pos] as usize].waits[..]
        };
        let mut t = a.free;
        for w in waits {
            t = t.max(self.sems[sem_id(a.core, w.sem)].reach_at(w.value)?);
        }
        // A full queue: the trigger waits until a transfer starts (picked then at `now`).
        if next.dma && self.agents[ai + super::NUM_STREAMS].fifo.len() >= DMA_QUEUE_DEPTH {
            return None;
        }
        if next.rendezvous {
            match self.inter.ready(ai) {
                Ready::Arrive => {}
                Ready::Blocked => return None,
                Ready::At(done) => t = t.max(done),
            }
        }
        Some((t, 0))
    }

    /// Nothing can run: the deadlock error if streams remain, `None` if all are done.
    fn deadlock(&self) -> Option<EmuError> {
        if self.inter.any_away() {
            // A stream waits for a collective across chips: the UltraServer decides.
            return None;
        }
        let blocked = self.blocked_streams();
        if blocked.is_empty() {
            return None;
        }
        Some(fail(Deadlock, "deadlock", format!("deadlock: every remaining stream waits on a semaphore that no pending instruction will signal: {}", blocked.join("; "))))
    }

    /// Why each stream with instructions left cannot run.
    pub(super) fn blocked_streams(&self) -> Vec<String> {
        self.agents
            .iter()
            .enumerate()
            .filter(|(_, a)| a.has_next())
            .map(|(bi, a)| self.why_blocked(bi, a))
            .collect()
    }

    fn why_blocked(&self, bi: usize, a: &Agent) -> String {
        let idx = a.list[a.pos];
        if let Some(why) = self.inter.blocked(bi) {
            return format!("{} {why}", describe(&self.progs, a.core, idx));
        }
        let Some(ins) = instr_at(&self.progs, a.core, idx) else {
            return describe(&self.progs, a.core, idx);
        };
        let waits: Vec<String> = ins
            .waits
            .iter()
            .map(|w| {
                let s = &self.sems[sem_id(a.core, w.sem)];
                format!("s{}>={} (stays {})", w.sem, w.value, s.value_at_end())
            })
            .collect();
        format!(
            "{} waits {}",
            describe(&self.progs, a.core, idx),
            waits.join(", ")
        )
    }

    /// A run stops as a runaway loop after `Device::max_executed` units of work (an item is
    /// one unit plus one per `limits::WORK_BYTES` bytes it touches); every `POLL_EVERY` units
    /// the run's limits are checked and the monitor, if any, is polled (one comparison per
    /// step).
    #[inline]
    fn check_budget(&mut self) -> Result<()> {
        if self.spent >= self.next_check {
            self.poll()?;
        }
        Ok(())
    }

    #[cold]
    fn poll(&mut self) -> Result<()> {
        let n = self.result.executed;
        if self.spent >= self.dev.max_executed {
            return Err(fail(
                Runaway,
                "runaway_loop",
                format!(
                    "stopped after {n} executed instructions and transfers, {} units of work (one per item and per {} bytes it touches), the limit (a runaway loop?); Device::max_executed sets the limit",
                    self.spent,
                    super::limits::WORK_BYTES
                ),
            ));
        }
        self.next_check = (self.spent + POLL_EVERY).min(self.dev.max_executed);
        let held = self.host_bytes();
        self.limits.check(&self.dev.hbm, n, held)?;
        let Some(m) = self.monitor.as_deref_mut() else {
            return Ok(());
        };
        let (progs, plans) = (&self.progs, &self.plans);
        let total = *self
            .total
            .get_or_insert_with(|| planned_items(progs, plans));
        let p = Progress {
            executed: n,
            total,
            emulated_ps: self.now,
        };
        if !m.poll(&p) {
            return Err(fail(
                Interrupted,
                "interrupted",
                format!("run cancelled by its caller after {n} executed instructions"),
            ));
        }
        Ok(())
    }

    /// Host bytes the run holds besides HBM pages: the trace, the race logs, the queued
    /// transfers and the semaphores' pending increments (counted against `max_memory`).
    #[cold]
    fn host_bytes(&self) -> u64 {
        use std::mem::size_of;
        let t = &self.result.trace;
        let mut n = (t.records.capacity() * size_of::<Record>()
            + t.sems.capacity() * size_of::<SemEvent>()
            + t.dma_spans.capacity() * size_of::<DmaSpan>()) as u64;
        let clock = self.agents.first().map_or(0, |a| a.vc.len() * 4) as u64;
        for &ai in &self.active {
            let a = &self.agents[ai];
            n += a.log.host_bytes();
            let item = (size_of::<QItem>() + size_of::<Transfer>()) as u64 + clock;
            n += a.fifo.capacity() as u64 * item;
        }
        for sem in &self.sems {
            n += sem.pending.capacity() as u64 * (size_of::<(u64, u32, Vc)>() as u64 + clock);
        }
        n
    }

    /// Take the picked item off its stream or queue, with its clock. A rendezvous that only
    /// arrives here blocks its stream: `None`.
    fn issue(&mut self, p: Pick) -> Result<Option<Issued<'p>>> {
        let ai = p.agent;
        let a = &self.agents[ai];
        let core = a.core;
        let prog = self.progs[core as usize].ok_or_else(|| {
            fail(
                Internal,
                "agent_without_program",
                "scheduled a core without a program",
            )
        })?;
        let mut issue = Issue {
            back_to_back: a.epoch > 0 && a.free == p.start,
            dependent: false,
        };
        let (idx, work) = if a.is_queue() {
            self.pop_transfer(ai)?
        } else {
            match self.next_instr(ai, prog, p.start)? {
                Some(x) => x,
                None => return Ok(None),
            }
        };
        let a = &mut self.agents[ai];
        a.epoch += 1;
        a.vc[ai] = a.epoch;
        let ins = &prog.instrs[idx as usize];
        if !a.is_queue() {
            let dependent = match self.plans[core as usize].dependent(idx) {
                Some(d) => d,
                None => a.last_writes.track(ins),
            };
            issue.dependent = dependent && issue.back_to_back;
        }
        Ok(Some(Issued {
            agent: ai,
            core,
            idx,
            ins,
            start: p.start,
            issue,
            work,
        }))
    }

    fn pop_transfer(&mut self, ai: usize) -> Result<(u32, Work)> {
        let a = &mut self.agents[ai];
        let Some(q) = a.fifo.pop_front() else {
            return Err(fail(
                Internal,
                "empty_dma_queue_scheduled",
                "empty DMA queue was scheduled",
            ));
        };
        join(&mut a.vc, &q.vc);
        Ok((q.idx, Work::Transfer(q.transfer)))
    }

    /// The stream's next instruction, its waits' clocks joined into the stream's. A rendezvous
    /// is either released now or arrives (`None`).
    fn next_instr(
        &mut self,
        ai: usize,
        prog: &'p Program,
        start: u64,
    ) -> Result<Option<(u32, Work)>> {
        let a = &mut self.agents[ai];
        let idx = a.list[a.pos];
        let ins = &prog.instrs[idx as usize];
        for w in &ins.waits {
            // Settled at the time `pick` chose the stream, as when `pick` settled them itself.
            let s = &mut self.sems[sem_id(a.core, w.sem)];
            s.settle(self.picked_at);
            s.join_reach(w.value, &mut a.vc);
        }
        let mut work = Work::Instr;
        if intercore::is_rendezvous(ins) {
            match self.inter.complete(ai) {
                Some(r) => {
                    join(&mut a.vc, &r.vc);
                    work = Work::Release(Box::new(r));
                }
                None => {
                    self.arrive(ai, idx, ins, start)?;
                    return Ok(None);
                }
            }
        }
        let a = &mut self.agents[ai];
        a.pos += 1;
        a.moved(prog);
        Ok(Some((idx, work)))
    }

    /// A rendezvous arrives: the stream blocks until every participant has arrived; the last
    /// arrival performs the group's collective and releases every participant.
    fn arrive(&mut self, ai: usize, idx: u32, ins: &Instr, now: u64) -> Result<()> {
        let a = &mut self.agents[ai];
        a.epoch += 1;
        a.vc[ai] = a.epoch;
        let core = a.core;
        let vc = a.vc.clone();
        if self.link.is_some() && self.leave(ai, idx, ins, now, &vc)? {
            return Ok(());
        }
        let Some(group) = self.inter.arrive(ai, (core, idx), ins, now, vc)? else {
            return Ok(());
        };
        if let Some(pool) = &self.pool {
            pool.sync_all()?;
        }
        let dev = &mut *self.dev;
        let rounder = Rounder::new(dev.numerics, core, dev.runs, idx, false);
        let cores = match &self.pool {
            // SAFETY: every queue is empty (synced above) and nothing is queued until `mem` ends.
            Some(pool) => unsafe { pool.all_cores() },
            None => &mut dev.cores[..],
        };
        let mut mem = DevMem {
            cores,
            hbm: &mut dev.hbm,
        };
        let duration = intercore::perform(&group, &self.progs, &mut mem, &rounder, &*dev.cost)?;
        self.inter.release(group, now + duration);
        Ok(())
    }

    /// Queue the transfer a DMA instruction triggers on its stream's DMA queue.
    fn trigger(&mut self, it: &Issued) -> Result<()> {
        self.sync_core(it.core)?;
        let ins = it.ins;
        let cost = &*self.dev.cost;
        let busy = self.plans[it.core as usize].engine_ps(it.idx, it.issue);
        let end = it.start + busy.unwrap_or_else(|| cost.engine_ps(ins, it.issue));
        let exec = self.agents[it.agent].exec;
        let vc = if self.opts.check_races {
            self.agents[it.agent].vc.clone()
        } else {
            Vec::new()
        };
        let core = core_of(&self.pool, &mut self.dev.cores, it.core);
        let transfer = Box::new(Transfer {
            regs: core.regs[exec.stream().index()],
        });
        let queue = agent_id(it.core, Executor::DmaQueue(exec.stream()));
        self.agents[queue].fifo.push_back(QItem {
            idx: it.idx,
            ready: end,
            vc,
            transfer,
        });
        self.agents[it.agent].free = end;
        if self.traced() {
            let t = &mut self.result.trace;
            trace_waits(t, it.core, ins, it.start);
            t.records.push(Record {
                core: it.core,
                unit: exec.unit(),
                index: it.idx,
                opcode: ins.op,
                start_ps: it.start,
                end_ps: end,
                bytes: 0,
                flops: 0,
                hbm_bytes: 0,
                priority: 0,
                dma_engines: 0,
                write: WriteBox::NONE,
            });
        }
        self.result.executed += 1;
        self.spent += 1;
        Ok(())
    }

    /// Race check against every access of the other agents not ordered before this one.
    /// Cross-core writes that may be identical (`RunOptions::identical_writes`) come back as
    /// pending checks for after the write (`settle_identical`).
    fn check_races(&self, it: &Issued, regs: &[Region]) -> Result<Vec<identical::Pending>> {
        let mut pending = Vec::new();
        if !self.opts.check_races || regs.is_empty() {
            return Ok(pending);
        }
        let my_vc = &self.agents[it.agent].vc;
        for &bi in &self.active {
            if bi == it.agent || self.log_top[bi] <= my_vc[bi] {
                continue;
            }
            let b = &self.agents[bi];
            let theirs = self.plan(b.core).all_regions();
            for e in b.log.after(my_vc[bi]) {
                let region = &theirs[e.region as usize];
                for (i, mine) in regs.iter().enumerate() {
                    if conflict(std::slice::from_ref(mine), std::slice::from_ref(region)).is_none()
                    {
                        continue;
                    }
                    // Reported at the later instruction (the one that found the conflict).
                    let first = describe(&self.progs, b.core, e.idx);
                    if self.opts.identical_writes
                        && identical::candidate(mine, region, it.core, b.core)
                    {
                        let (lo, before) = identical::snapshot(&self.dev.hbm, mine, region);
                        let theirs = region.clone();
                        pending.push(identical::Pending {
                            lo,
                            before,
                            first,
                            theirs,
                            mine: i,
                        });
                        continue;
                    }
                    let e = race_error(first, mine, region, &self.progs, it);
                    return Err(ins_err(e, it.core, it.idx, it.ins));
                }
            }
        }
        Ok(pending)
    }

    /// After the later of two unordered cross-core writes ran: identical bytes are a warning,
    /// different ones the race error.
    fn settle_identical(
        &mut self,
        it: &Issued,
        regs: &[Region],
        pending: Vec<identical::Pending>,
    ) -> Result<()> {
        let second = describe(&self.progs, it.core, it.idx);
        for p in pending {
            if !identical::unchanged(&self.dev.hbm, &p) {
                let mut e = race_error(p.first, &regs[p.mine], &p.theirs, &self.progs, it);
                e.message.push_str(" (the bytes written differ)");
                return Err(ins_err(e, it.core, it.idx, it.ins));
            }
            let w = identical::warning(&p, &second);
            self.result.identical_writes.push(w);
        }
        Ok(())
    }

    /// Run the item's semantics on its core (a released rendezvous already moved its data).
    fn execute(&mut self, it: &mut Issued<'p>) -> Result<()> {
        if let Work::Release(r) = &mut it.work {
            if let Some(bytes) = r.payload.take() {
                self.sync_core(it.core)?;
                self.deliver_payload(it.core, it.ins, &bytes)
                    .map_err(|e| ins_err(e, it.core, it.idx, it.ins))?;
            }
            return Ok(());
        }
        let compute = matches!(it.work, Work::Instr);
        if self.defer(it, compute)? {
            return Ok(());
        }
        let plain = self.plans[it.core as usize].plain(it.idx);
        let dev = &mut *self.dev;
        let c = core_of(&self.pool, &mut dev.cores, it.core);
        let stream = self.agents[it.agent].exec.stream();
        let regs = match &mut it.work {
            Work::Transfer(t) => &mut t.regs,
            _ => &mut c.regs[stream.index()],
        };
        let ins = it.ins;
        let mut ctx = Ctx {
            mems: Mems {
                sbuf: &mut c.sbuf,
                psum: &mut c.psum,
                hbm: &mut dev.hbm,
            },
            state: &mut c.state,
            rng: &mut c.rng,
            rounder: Rounder::new(dev.numerics, it.core, dev.runs, it.idx, compute),
            regs,
            jump: None,
        };
        ctx.state.note_psum_writer(ins);
        let run = if plain {
            engines::exec_plain
        } else {
            engines::exec
        };
        run(ins, &mut ctx).map_err(|e| ins_err(e, it.core, it.idx, ins))?;
        if let Some(t) = ctx.jump {
            let a = &mut self.agents[it.agent];
            super::control::jump(&a.list, &mut a.pos, t);
            if let Some(prog) = self.progs[it.core as usize] {
                a.moved(prog);
            }
        }
        Ok(())
    }

    /// The item's end time; its agent becomes free and logs its accesses for the race checks.
    fn complete(&mut self, it: &Issued, plan: &RunPlan) -> u64 {
        let end = match &it.work {
            Work::Transfer(_) => {
                self.fabric
                    .commit(it.core as usize, it.start, plan.transfer(it.idx))
            }
            Work::Release(r) => r.end,
            Work::Instr => {
                let busy = plan.engine_ps(it.idx, it.issue);
                it.start + busy.unwrap_or_else(|| self.dev.cost.engine_ps(it.ins, it.issue))
            }
        };
        let a = &mut self.agents[it.agent];
        // A queue hands its next transfer to the engines as soon as this one is committed.
        a.free = if a.is_queue() { it.start } else { end };
        if self.opts.check_races {
            // A repeat of an access this agent already logged (same instruction, same
            // footprint, as in a loop) supersedes it (`RaceLog::append`). Only a program that
            // branches runs an instruction twice (the search costs nothing elsewhere).
            let regs = plan.region_range(it.idx);
            if !regs.is_empty() {
                self.log_top[it.agent] = a.epoch;
            }
            a.log.append(a.epoch, it.idx, regs, a.loops, plan);
        }
        end
    }

    /// Post the item's semaphore increments, visible one semaphore latency after `end`
    /// (returned).
    fn signal(&mut self, it: &Issued, end: u64) -> u64 {
        let seen = end + self.sem_latency;
        for s in &it.ins.signals {
            let vc = if self.opts.check_races {
                self.agents[it.agent].vc.clone()
            } else {
                Vec::new()
            };
            self.sems[sem_id(it.core, s.sem)].post(seen, s.delta, vc);
        }
        seen
    }

    /// The item's trace record, with its waits, DMA engine spans and signals.
    fn record(&mut self, it: &Issued, end: u64, seen: u64, bytes: u64, write: WriteBox) {
        let (core, ins) = (it.core, it.ins);
        let t = &mut self.result.trace;
        let plans = &self.plans;
        let transfer = match &it.work {
            Work::Transfer(_) => Some(plans[core as usize].transfer(it.idx)),
            _ => {
                trace_waits(t, core, ins, it.start);
                None
            }
        };
        let record = t.records.len() as u32;
        if transfer.is_some() {
            for &(engine, s0, s1, b) in &self.fabric.last_spans {
                t.dma_spans.push(DmaSpan {
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
            t.sems.push(SemEvent {
                core,
                sem: s.sem,
                wait: false,
                value: s.delta,
                time_ps: seen,
                record,
                by: -1,
            });
        }
        let (bytes, hbm_bytes, priority, dma_engines) = match transfer {
            Some(pl) => (pl.bytes, pl.hbm_bytes, pl.priority, pl.pieces.len() as u8),
            None => (bytes, 0, 0, 0),
        };
        t.records.push(Record {
            core,
            unit: self.agents[it.agent].exec.unit(),
            index: it.idx,
            opcode: ins.op,
            start_ps: match &it.work {
                Work::Release(r) => r.arrived,
                _ => it.start,
            },
            end_ps: end,
            bytes,
            flops: if transfer.is_some() {
                0
            } else {
                self.plans[core as usize].flops(it.idx)
            },
            hbm_bytes,
            priority,
            dma_engines,
            write,
        });
    }

    /// The run's result: it ends when the last item and the last busy agent end.
    pub(super) fn finish(mut self) -> RunResult {
        let free = self.agents.iter().map(|a| a.free).max().unwrap_or(0);
        self.result.end_ps = self.result.end_ps.max(free);
        if self.opts.trace {
            self.result.trace.link_semaphores();
        }
        self.result.trace.timing = self.dev.cost.timing();
        self.result
    }
}

/// The hooks an UltraServer chip needs (machine/ultra.rs): run up to a time horizon, send
/// collectives across chips out, take their releases in.
impl<'d, 'p> Scheduler<'d, 'p> {
    /// Run every item that starts before `horizon`; then the start of the next item (`None`:
    /// nothing can run until the fabric releases a stream, or everything is done).
    pub(super) fn run_until(&mut self, horizon: u64) -> Result<Option<u64>> {
        while let Some(p) = self.pick()? {
            if p.start >= horizon {
                return Ok(Some(p.start));
            }
            self.step(p)?;
        }
        Ok(None)
    }

    /// A rendezvous whose group reaches beyond this chip leaves for the fabric: its src is read
    /// now, the stream is held. `false`: the group is on this chip (the usual rendezvous).
    fn leave(&mut self, ai: usize, idx: u32, ins: &Instr, now: u64, vc: &Vc) -> Result<bool> {
        let core = self.agents[ai].core;
        let base = self.inter.base;
        let m = engines::intercore::meeting(ins, base + core as u16)?;
        let n = super::NUM_CORES as u16;
        if m.cores.iter().all(|g| g / n == base / n) {
            return Ok(false);
        }
        let dev = &mut *self.dev;
        let c = &mut dev.cores[core as usize];
        let mems = Mems {
            sbuf: &mut c.sbuf,
            psum: &mut c.psum,
            hbm: &mut dev.hbm,
        };
        let snap =
            engines::intercore::snapshot(ins, &mems).map_err(|e| ins_err(e, core, idx, ins))?;
        let what = format!(
            "waits in {} with the cores {:?} across chips",
            ins.op.spec().name,
            m.cores
        );
        self.inter.hold(ai, what);
        if let Some(link) = &mut self.link {
            link.outbox.push(super::ultra::Arrival {
                core,
                agent: ai,
                idx,
                time: now,
                vc: vc.clone(),
                snap,
                group: m.cores,
            });
        }
        Ok(true)
    }

    /// Write a collective's received bytes into its dst on `core`.
    fn deliver_payload(&mut self, core: u8, ins: &Instr, bytes: &[u8]) -> Result<()> {
        let dst = engines::intercore::dst_of(ins)?;
        let dev = &mut *self.dev;
        let c = core_of(&self.pool, &mut dev.cores, core);
        let mut mems = Mems {
            sbuf: &mut c.sbuf,
            psum: &mut c.psum,
            hbm: &mut dev.hbm,
        };
        mems.scatter(dst, bytes);
        Ok(())
    }

    /// `f` on the memories of `core` (an UltraServer's coordinator moves in-place data).
    pub(super) fn with_mems<R>(&mut self, core: u8, f: impl FnOnce(&mut Mems) -> R) -> R {
        let dev = &mut *self.dev;
        let c = &mut dev.cores[core as usize];
        let mut mems = Mems {
            sbuf: &mut c.sbuf,
            psum: &mut c.psum,
            hbm: &mut dev.hbm,
        };
        f(&mut mems)
    }

    /// Items executed so far.
    pub(super) fn executed(&self) -> u64 {
        self.result.executed
    }

    /// Release a stream the fabric held.
    pub(super) fn deliver(&mut self, agent: usize, r: Release) {
        self.inter.deliver(agent, r);
    }

    pub(super) fn set_base(&mut self, base: u16) {
        self.inter.base = base;
    }
}

/// Cores on host threads (machine/parallel.rs): the scheduler's side.
impl<'d, 'p> Scheduler<'d, 'p> {
    /// The device's cores, for the pool that runs them on other threads.
    pub(super) fn cores_ptr(&mut self) -> *mut super::Core {
        self.dev.cores.as_mut_ptr()
    }

    /// Queue a compute instruction that touches only its own core (`parallel::deferrable`)
    /// instead of executing it here; `false` when it must run here (the core's queue then
    /// drained first).
    fn defer(&mut self, it: &Issued<'p>, compute: bool) -> Result<bool> {
        let Some(pool) = &self.pool else {
            return Ok(false);
        };
        if compute && super::parallel::deferrable(it.ins) {
            let dev = &*self.dev;
            let rounder = Rounder::new(dev.numerics, it.core, dev.runs, it.idx, true);
            let job = super::parallel::Job {
                seq: self.result.executed,
                idx: it.idx,
                ins: it.ins,
                rounder,
            };
            pool.push(it.core, job);
            return Ok(true);
        }
        pool.sync(it.core)?;
        Ok(false)
    }

    /// Wait until `core`'s queued instructions ran (nothing to wait for on one thread).
    fn sync_core(&self, core: u8) -> Result<()> {
        match &self.pool {
            Some(pool) => pool.sync(core),
            None => Ok(()),
        }
    }
}

/// Core `k` for the scheduler: through the pool while cores run on other threads (its queue
/// must be empty: `sync_core`; no reference to the whole `cores` buffer is made then, as a
/// helper may be using another core), else straight from the device.
#[allow(clippy::ptr_arg)] // a slice would be a reference to every core
fn core_of<'a>(
    pool: &'a Option<std::sync::Arc<super::parallel::Pool>>,
    cores: &'a mut Vec<super::Core>,
    k: u8,
) -> &'a mut super::Core {
    match pool {
        // SAFETY: callers sync `k` first and queue nothing on it while the reference lives.
        Some(pool) => unsafe { pool.core(k) },
        None => &mut cores[k as usize],
    }
}

/// The race error between an earlier access (`first`, region `theirs`) and the issued item's
/// region `mine`.
fn race_error(
    first: String,
    mine: &Region,
    theirs: &Region,
    progs: &[Option<&Program>],
    it: &Issued,
) -> EmuError {
    let what = if mine.mem == Mem::Hbm {
        format!(
            "hbm bytes {}..{}",
            mine.lo.max(theirs.lo),
            mine.hi.min(theirs.hi)
        )
    } else {
        format!(
            "{} partitions {}..{} bytes {}..{}",
            mine.mem.name(),
            mine.p0.max(theirs.p0),
            mine.p1.min(theirs.p1),
            mine.lo.max(theirs.lo),
            mine.hi.min(theirs.hi)
        )
    };
    let writers = if theirs.write && mine.write {
        "both"
    } else if theirs.write {
        "the first"
    } else {
        "the second"
    };
    fail(
        Race,
        "data_race",
        format!(
            "data race: {} and {} both touch {} ({} writes) with no semaphore ordering them",
            first,
            describe(progs, it.core, it.idx),
            what,
            writers
        ),
    )
}

/// Lower `bound[b]` to `vc[b]` for every agent `b` except `skip` (whose log the accesses in
/// question are never checked against).
fn lower(bound: &mut [u32], vc: &[u32], skip: usize) {
    for (b, (x, v)) in bound.iter_mut().zip(vc).enumerate() {
        if b != skip && *v < *x {
            *x = *v;
        }
    }
}

/// Drop log entries that no access still to come can be unordered with: every future access
/// of another agent is ordered after them. Future accesses are those of streams that may still
/// run an instruction touching memory (their clock bounds them), of transfers queued (their
/// trigger's clock) and of transfers streams may still trigger (the stream's clock); none is
/// checked against its own agent's log. A DMA queue no engine waits on is thus pruned as soon
/// as every stream that may still act has passed its entries, and memory stays proportional
/// to the accesses that can still race, not to the run's length.
fn prune(agents: &mut [Agent]) {
    let n = agents.len();
    let mut bound = vec![u32::MAX; n];
    for (ai, a) in agents.iter().enumerate() {
        if a.is_queue() {
            for q in &a.fifo {
                lower(&mut bound, &q.vc, ai);
            }
            continue;
        }
        if a.may_reach(a.touch_end) {
            lower(&mut bound, &a.vc, ai);
        }
        if a.may_reach(a.trigger_end) {
            lower(
                &mut bound,
                &a.vc,
                agent_id(a.core, Executor::DmaQueue(a.exec.stream())),
            );
        }
    }
    let any_live = agents.iter().any(|a| a.live());
    for (i, a) in agents.iter_mut().enumerate() {
        if !any_live {
            a.log.clear();
        } else {
            let b = bound[i];
            a.log.retain_after(b);
        }
    }
}

/// Room for more trace records, doubling up to `limit` records (not past it: a full trace
/// must not hold twice the memory it needs); false if the host cannot give it.
#[cold]
fn grow_records(records: &mut Vec<Record>, limit: u64) -> bool {
    let n = records.len();
    let cap = usize::try_from(limit).unwrap_or(usize::MAX);
    let more = n.max(1024).min(cap.saturating_sub(n)).max(1);
    records.try_reserve_exact(more).is_ok()
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
