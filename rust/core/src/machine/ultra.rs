//! An UltraServer run: many chips (each a full `Device`) joined by the NeuronSwitch fabric
//! (machine/fabric.rs), with collectives across chips.
//!
//! Each chip runs its own scheduler (machine/sched.rs). A collective whose replica group
//! reaches beyond its chip does not meet its peers inside the chip: its rank *leaves* as an
//! arrival message (its src read at arrival, its stream held) and the chip runs on. The
//! coordinator here matches arrivals into groups (the n-th collective of a core with a given
//! group meets the others' n-th), computes the results (engines/intercore.rs, the same data
//! semantics as on one chip), times the group on the fabric, and sends each rank a release
//! message (completion time, clock, the bytes for its dst, written when it completes).
//!
//! Time stays consistent by conservative synchronisation, as parallel discrete-event
//! simulators do: every completion comes at least `FabricParams::lookahead_ps` (one link
//! latency) after the group's last arrival, so in a window `[T, T + lookahead)` from the
//! earliest pending item `T` no chip can receive a message for its past. Every chip runs its
//! items of the window independently; then the arrivals are exchanged in chip order and the
//! completed groups timed in (last arrival, group) order. Results and timing therefore do not
//! depend on how the chips are spread over host threads (or, later, processes): the chips of a
//! window run in parallel on the thread team.

use super::fabric::{Fabric, FabricParams, FabricTrace, GroupTiming};
use super::intercore::{check_program_at, Release};
use super::sched::Scheduler;
use super::{Device, Monitor, Progress, RunOptions, RunResult, NUM_CORES};
use crate::engines::intercore::{
    block_io, combine, in_place_all_to_all, Moved, Rank, RankError, Shared, Snapshot,
};
use crate::error::{fail, EmuError, ErrorKind::*, Result};
use crate::hw::MAX_CHIPS;
use crate::isa::text::format_instr;
use crate::isa::{Opcode, Program};
use crate::numerics::config::{NumericsConfig, Rounder};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A rank's arrival at a collective across chips: the message a chip sends the coordinator.
pub struct Arrival {
    pub core: u8,
    /// The chip-local stream agent that waits (for the release).
    pub agent: usize,
    pub idx: u32,
    pub time: u64,
    pub vc: Vec<u32>,
    pub snap: Snapshot,
    /// The replica group, global core ids in rank order.
    pub group: Vec<u16>,
}

/// A chip's connection to the coordinator: the arrivals it sent during a window.
#[derive(Default)]
pub struct ChipLink {
    pub chip: u16,
    pub outbox: Vec<Arrival>,
}

/// A program placed on a chip (its `core` field names the chip's core).
#[derive(Clone, Copy)]
pub struct Placed<'p> {
    pub chip: u16,
    pub program: &'p Program,
}

/// An UltraServer run's result: one `RunResult` per chip (empty for chips without programs),
/// the fabric's messages and CC-core spans.
#[derive(Debug, Default)]
pub struct UltraResult {
    pub chips: Vec<RunResult>,
    pub fabric: FabricTrace,
    pub end_ps: u64,
    pub executed: u64,
}

/// The instruction at `idx` of the program on (`chip`, `core`).
pub(super) fn instr_of<'p>(
    by_chip: &[Vec<&'p Program>],
    chip: usize,
    core: u8,
    idx: u32,
) -> Option<&'p crate::isa::Instr> {
    let p = by_chip.get(chip)?.iter().find(|p| p.core == core)?;
    p.instrs.get(idx as usize)
}

/// Groups are matched by (opcode, group, sequence number).
type Key = (u16, Vec<u16>, u32);

pub(super) fn chip_err(chip: usize) -> impl Fn(EmuError) -> EmuError {
    move |mut e| {
        e.message = format!("chip {chip}: {}", e.message);
        e
    }
}

fn where_is(g: u16) -> String {
    format!(
        "chip {} core {}",
        g as usize / NUM_CORES,
        g as usize % NUM_CORES
    )
}

/// A group's ranks (in rank order) with their instructions.
pub(super) fn ranks_of<'p>(
    arrivals: &[(usize, Arrival)],
    by_chip: &[Vec<&'p Program>],
) -> Result<Vec<Rank<'p>>> {
    let mut ranks = Vec::with_capacity(arrivals.len());
    for (c, a) in arrivals {
        let ins = instr_of(by_chip, *c, a.core, a.idx);
        let ins = ins.ok_or_else(|| {
            fail(
                Internal,
                "rendezvous_without_program",
                "rendezvous participant without a program",
            )
        })?;
        ranks.push(Rank {
            core: (c * NUM_CORES) as u16 + a.core as u16,
            ins,
        });
    }
    Ok(ranks)
}

/// A rank's error in a group, naming its chip, core and instruction.
pub(super) fn rank_err(arrivals: &[(usize, Arrival)], ranks: &[Rank], e: RankError) -> EmuError {
    let (c, a) = &arrivals[e.rank];
    let text = format!(
        "{} (chip {c} core {})",
        format_instr(ranks[e.rank].ins),
        a.core
    );
    chip_err(*c)(e.error).at(a.idx as usize, text)
}

/// The coordinator's state during a run.
pub(super) struct Coordinator {
    pending: BTreeMap<Key, (Opcode, Vec<(usize, Arrival)>)>,
    seq: BTreeMap<(u16, u16, Vec<u16>), u32>,
    fabric: Fabric,
    /// Each chip's numerics and run count (the casts of reducing collectives).
    cfg: Vec<(NumericsConfig, u64)>,
}

/// Run programs placed on the chips `devs` (chip c = `devs[c]`) to completion.
pub fn run(
    devs: &mut [&mut Device],
    programs: &[Placed],
    opts: &RunOptions,
    params: FabricParams,
) -> Result<UltraResult> {
    run_monitored(devs, programs, opts, params, None)
}

/// `run` polling `monitor` (Ctrl-C from Python, progress) between the run's time windows, on
/// the calling thread: a window runs every chip up to one link latency of emulated time, so
/// polls come as often as a `Device` run's (`POLL_EVERY` items) or more. `opts.max_seconds`
/// and `opts.max_memory` hold for each chip's scheduler as for a `Device` run (memory: per chip).
pub fn run_monitored(
    devs: &mut [&mut Device],
    programs: &[Placed],
    opts: &RunOptions,
    params: FabricParams,
    monitor: Option<&mut dyn Monitor>,
) -> Result<UltraResult> {
    let by_chip = place(devs.len(), programs)?;
    let r = crate::error::with_alloc_limit(opts.max_memory, || {
        crate::par::run_hot(|| run_chips(devs, &by_chip, opts, params, monitor))
    });
    close_run(devs, &by_chip, r)
}

/// Ask `monitor` whether to go on: an `Interrupted` error (rule `interrupted`) if not.
fn poll(
    monitor: &mut Option<&mut dyn Monitor>,
    scheds: &[Option<Scheduler>],
    now: u64,
) -> Result<()> {
    let Some(m) = monitor.as_deref_mut() else {
        return Ok(());
    };
    let executed = scheds.iter().flatten().map(|s| s.executed()).sum();
    let p = Progress {
        executed,
        total: None,
        emulated_ps: now,
    };
    if m.poll(&p) {
        return Ok(());
    }
    Err(fail(
        Interrupted,
        "interrupted",
        format!("UltraServer run cancelled by its caller after {executed} executed instructions"),
    ))
}

/// After a run: count it on every chip that had programs, and report a chip whose HBM writes
/// could not back a page (before the run's own result).
pub(super) fn close_run<T>(
    devs: &mut [&mut Device],
    by_chip: &[Vec<&Program>],
    r: Result<T>,
) -> Result<T> {
    let mut failed = Ok(());
    for (c, d) in devs.iter_mut().enumerate() {
        if !by_chip[c].is_empty() {
            d.runs += 1;
        }
        failed = failed.and(d.hbm.take_alloc_failure().map_err(chip_err(c)));
    }
    failed.and(r)
}

/// Check the chip count and sort the programs by chip.
pub(super) fn place<'p>(nchips: usize, programs: &[Placed<'p>]) -> Result<Vec<Vec<&'p Program>>> {
    if nchips == 0 || nchips > MAX_CHIPS {
        return Err(fail(
            Value,
            "ultraserver_chips",
            format!("an UltraServer has 1..{MAX_CHIPS} chips, not {nchips}"),
        ));
    }
    let mut by_chip: Vec<Vec<&Program>> = vec![Vec::new(); nchips];
    for pl in programs {
        let Some(list) = by_chip.get_mut(pl.chip as usize) else {
            return Err(fail(
                Value,
                "chip_out_of_range",
                format!(
                    "program for chip {} (the UltraServer's chips are 0..{nchips})",
                    pl.chip
                ),
            )
            .operand("chip"));
        };
        list.push(pl.program);
    }
    Ok(by_chip)
}

fn run_chips(
    devs: &mut [&mut Device],
    by_chip: &[Vec<&Program>],
    opts: &RunOptions,
    params: FabricParams,
    mut monitor: Option<&mut dyn Monitor>,
) -> Result<UltraResult> {
    let nchips = devs.len();
    let (mut co, mut scheds) = start(devs, by_chip, opts, params, &|_| true)?;
    let look = params.lookahead_ps();
    let mut next: Vec<Option<u64>> = vec![None; nchips];
    for (c, s) in scheds.iter_mut().enumerate() {
        if let Some(s) = s {
            next[c] = s.run_until(0).map_err(chip_err(c))?;
        }
    }
    while let Some(t) = next.iter().flatten().min().copied() {
        poll(&mut monitor, &scheds, t)?;
        let horizon = t.saturating_add(look);
        window(&mut scheds, &mut next, horizon)?;
        let incoming = take_outboxes(&mut scheds);
        let woken = co.exchange(incoming, by_chip, &mut scheds)?;
        for c in woken {
            if let Some(s) = &mut scheds[c] {
                next[c] = s.run_until(0).map_err(chip_err(c))?;
            }
        }
    }
    co.check_done(&scheds)?;
    Ok(finish(scheds, co))
}

/// The coordinator and a scheduler for every chip `own` accepts that has programs.
pub(super) fn start<'d, 'p>(
    devs: &'d mut [&mut Device],
    by_chip: &[Vec<&'p Program>],
    opts: &RunOptions,
    params: FabricParams,
    own: &dyn Fn(usize) -> bool,
) -> Result<(Coordinator, Vec<Option<Scheduler<'d, 'p>>>)> {
    let nchips = devs.len();
    let has = |g: u16| {
        let (c, k) = (g as usize / NUM_CORES, g as usize % NUM_CORES);
        by_chip
            .get(c)
            .is_some_and(|ps| ps.iter().any(|p| p.core as usize == k))
    };
    let mut co = Coordinator {
        pending: BTreeMap::new(),
        seq: BTreeMap::new(),
        fabric: Fabric::new(params, nchips),
        cfg: devs.iter().map(|d| (d.numerics, d.runs)).collect(),
    };
    co.fabric.record = opts.trace;
    let mut scheds: Vec<Option<Scheduler>> = Vec::with_capacity(nchips);
    for (c, dev) in devs.iter_mut().enumerate() {
        if by_chip[c].is_empty() || !own(c) {
            scheds.push(None);
            continue;
        }
        dev.begin(&by_chip[c]);
        let base = (c * NUM_CORES) as u16;
        let check =
            |p: &Program, _: &[Option<&Program>]| check_program_at(p, base + p.core as u16, &has);
        let mut s =
            Scheduler::with_check(dev, &by_chip[c], &[], opts, &check).map_err(chip_err(c))?;
        s.set_base(base);
        s.link = Some(ChipLink {
            chip: c as u16,
            outbox: Vec::new(),
        });
        scheds.push(Some(s));
    }
    Ok((co, scheds))
}

/// Every chip's arrivals of the window, in chip order.
pub(super) fn take_outboxes(scheds: &mut [Option<Scheduler>]) -> Vec<(usize, Arrival)> {
    let mut out = Vec::new();
    for (c, s) in scheds.iter_mut().enumerate() {
        if let Some(link) = s.as_mut().and_then(|s| s.link.as_mut()) {
            out.extend(std::mem::take(&mut link.outbox).into_iter().map(|a| (c, a)));
        }
    }
    out
}

/// The run's result from the schedulers (chips without one get an empty result).
pub(super) fn finish(scheds: Vec<Option<Scheduler>>, mut co: Coordinator) -> UltraResult {
    let mut out = UltraResult::default();
    for s in scheds {
        let r = s.map(|s| s.finish()).unwrap_or_default();
        out.end_ps = out.end_ps.max(r.end_ps);
        out.executed += r.executed;
        out.chips.push(r);
    }
    out.fabric = std::mem::take(&mut co.fabric.trace);
    out
}

/// A chip's scheduler and what its window returned, while the window runs on a thread.
type Slot<'d, 'p> = (Option<Scheduler<'d, 'p>>, Result<Option<u64>>);

/// Run every chip with an item before `horizon` up to it; `next` gets each one's next start.
/// The chips are independent inside a window, so they run on the host's threads (the thread
/// team, `par`): which thread runs a chip changes nothing it computes.
pub(super) fn window(
    scheds: &mut [Option<Scheduler>],
    next: &mut [Option<u64>],
    horizon: u64,
) -> Result<()> {
    let due: Vec<usize> = (0..scheds.len())
        .filter(|&c| scheds[c].is_some() && next[c].is_some_and(|x| x < horizon))
        .collect();
    let slots: Vec<Mutex<Slot>> = due
        .iter()
        .map(|&c| Mutex::new((scheds[c].take(), Ok(None))))
        .collect();
    // Each chip's whole window is one index: worth a split whenever two chips are due.
    crate::par::for_each_index(due.len(), usize::MAX, |i| {
        let mut g = slots[i].lock().unwrap_or_else(|e| e.into_inner());
        let (s, r) = &mut *g;
        if let Some(s) = s {
            *r = s.run_until(horizon);
        }
    });
    let mut first_err = None;
    for (&c, slot) in due.iter().zip(slots) {
        let (s, r) = slot.into_inner().unwrap_or_else(|e| e.into_inner());
        scheds[c] = s;
        match r {
            Ok(x) => next[c] = x,
            Err(e) => {
                first_err.get_or_insert_with(|| chip_err(c)(e));
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

impl Coordinator {
    /// Match the arrivals (in chip order) into groups and complete the groups whose last rank
    /// arrived; returns the chips that got a release (chips without a scheduler get none).
    pub(super) fn exchange(
        &mut self,
        incoming: Vec<(usize, Arrival)>,
        by_chip: &[Vec<&Program>],
        scheds: &mut [Option<Scheduler>],
    ) -> Result<Vec<usize>> {
        let mut woken = Vec::new();
        for (op, cores, arrivals) in self.matched(incoming, by_chip) {
            woken.extend(self.complete((op, &cores), arrivals, by_chip, scheds)?);
        }
        woken.sort_unstable();
        woken.dedup();
        Ok(woken)
    }

    /// Match the arrivals (in chip order) into groups; returns the groups whose last rank
    /// arrived, in (last arrival, group) order.
    #[allow(clippy::type_complexity)]
    pub(super) fn matched(
        &mut self,
        incoming: Vec<(usize, Arrival)>,
        by_chip: &[Vec<&Program>],
    ) -> Vec<(Opcode, Vec<u16>, Vec<(usize, Arrival)>)> {
        let mut complete: Vec<(u64, Key)> = Vec::new();
        for (c, a) in incoming {
            let me = (c * NUM_CORES) as u16 + a.core as u16;
            let op = instr_of(by_chip, c, a.core, a.idx)
                .map(|i| i.op)
                .unwrap_or(Opcode::AllReduce);
            let n = self
                .seq
                .entry((me, op as u16, a.group.clone()))
                .or_insert(0);
            let key = (op as u16, a.group.clone(), *n);
            *n += 1;
            let (_, list) = self.pending.entry(key.clone()).or_insert((op, Vec::new()));
            list.push((c, a));
            if list.len() == key.1.len() {
                let last = list.iter().map(|(_, a)| a.time).max().unwrap_or(0);
                complete.push((last, key));
            }
        }
        complete.sort();
        let mut out = Vec::new();
        for (_, key) in complete {
            if let Some((op, mut arrivals)) = self.pending.remove(&key) {
                let global = |c: usize, a: &Arrival| (c * NUM_CORES) as u16 + a.core as u16;
                arrivals.sort_by_key(|(c, a)| key.1.iter().position(|g| *g == global(*c, a)));
                out.push((op, key.1, arrivals));
            }
        }
        out
    }

    /// Perform and time a group whose ranks all arrived (in rank order), and release every rank.
    fn complete(
        &mut self,
        key: (Opcode, &[u16]),
        mut arrivals: Vec<(usize, Arrival)>,
        by_chip: &[Vec<&Program>],
        scheds: &mut [Option<Scheduler>],
    ) -> Result<Vec<usize>> {
        let ranks = ranks_of(&arrivals, by_chip)?;
        let snaps: Vec<Snapshot> = arrivals
            .iter_mut()
            .map(|(_, a)| std::mem::take(&mut a.snap))
            .collect();
        let rounder = self.rounder(&arrivals);
        let (moved, outs) =
            combine(&ranks, &snaps, &rounder).map_err(|e| rank_err(&arrivals, &ranks, e))?;
        if snaps.iter().any(|s| s.deferred) {
            let at: Vec<(usize, u8)> = arrivals.iter().map(|(c, a)| (*c, a.core)).collect();
            in_place_all_to_all(&ranks, &mut |r, ap, i, len, d| {
                let (c, core) = at[r];
                match &mut scheds[c] {
                    Some(s) => s.with_mems(core, |m| block_io(m, ap, i, len, d)),
                    None => Vec::new(),
                }
            })
            .map_err(|e| {
                let (c, a) = &arrivals[e.rank];
                chip_err(*c)(e.error).at(a.idx as usize, format_instr(ranks[e.rank].ins))
            })?;
        }
        drop(snaps);
        Ok(self.release(key, &arrivals, &moved, outs, scheds))
    }

    /// The casts of a group's reductions: its first rank's chip numerics.
    pub(super) fn rounder(&self, arrivals: &[(usize, Arrival)]) -> Rounder {
        let (c0, a0) = (&arrivals[0].0, &arrivals[0].1);
        let (cfg, runs) = self.cfg[*c0];
        Rounder::new(cfg, a0.core, runs, a0.idx, false)
    }

    /// Time a performed group on the fabric and deliver every rank's release (with `outs[r]`,
    /// its dst bytes) to the chips that have a scheduler; returns the group's chips.
    pub(super) fn release(
        &mut self,
        key: (Opcode, &[u16]),
        arrivals: &[(usize, Arrival)],
        moved: &Moved,
        mut outs: Vec<Option<Shared>>,
        scheds: &mut [Option<Scheduler>],
    ) -> Vec<usize> {
        let times: Vec<u64> = arrivals.iter().map(|(_, a)| a.time).collect();
        let ends = self.fabric.time(&GroupTiming {
            opcode: key.0,
            cores: key.1,
            arrived: &times,
            kind: moved.kind,
            src_bytes: moved.src_bytes,
            matrix: &moved.matrix,
        });
        // Each chip's participants complete with the join of their clocks (a barrier among
        // them, as on one chip); clocks of other chips are another chip's business.
        let mut joined: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for (c, a) in arrivals {
            let j = joined.entry(*c).or_insert_with(|| vec![0; a.vc.len()]);
            for (x, y) in j.iter_mut().zip(&a.vc) {
                *x = (*x).max(*y);
            }
        }
        for (r, (c, a)) in arrivals.iter().enumerate() {
            let mut vc = joined[c].clone();
            let own = a.vc.get(a.agent).copied().unwrap_or(0);
            if let Some(x) = vc.get_mut(a.agent) {
                *x = (*x).max(own.saturating_add(1));
            }
            if let Some(s) = &mut scheds[*c] {
                s.deliver(
                    a.agent,
                    Release {
                        arrived: a.time,
                        end: ends[r],
                        vc,
                        payload: outs[r].take(),
                    },
                );
            }
        }
        joined.into_keys().collect()
    }

    /// Every chip is done or stuck: a `DeadlockError` naming the waiting and the missing ranks
    /// if any rank still waits.
    pub(super) fn check_done(&self, scheds: &[Option<Scheduler>]) -> Result<()> {
        let mut why: Vec<String> = Vec::new();
        for ((_, cores, seq), (op, list)) in &self.pending {
            let here: Vec<u16> = list
                .iter()
                .map(|(c, a)| (c * NUM_CORES) as u16 + a.core as u16)
                .collect();
            let waiting: Vec<String> = here.iter().map(|g| where_is(*g)).collect();
            let missing: Vec<String> = cores
                .iter()
                .filter(|g| !here.contains(g))
                .map(|g| where_is(*g))
                .collect();
            why.push(format!(
                "{} #{seq} over cores {cores:?}: {} wait for {}, which never arrive",
                op.spec().name,
                waiting.join(", "),
                missing.join(", ")
            ));
        }
        for (c, s) in scheds.iter().enumerate() {
            let Some(s) = s else { continue };
            for b in s.blocked_streams() {
                why.push(format!("chip {c}: {b}"));
            }
        }
        if why.is_empty() {
            return Ok(());
        }
        Err(fail(
            Deadlock,
            "deadlock",
            format!(
                "deadlock across chips: ranks wait for collectives that cannot complete: {}",
                why.join("; ")
            ),
        ))
    }
}
