//! Trace: one record per executed instruction and per DMA transfer, and one event per semaphore
//! signal and wait. The Python layer turns these into columnar numpy views (schema version
//! `SCHEMA_VERSION`, documented in python/trn3emu/trace.py and docs/cost-model.md).

use crate::isa::Opcode;

/// Bumped whenever a field is added, removed or changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

/// Where a record ran: an engine stream or a DMA queue of a core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Engine(u8),
    DmaQueue(u8),
}

/// The first on-chip region an instruction writes (for SBUF/PSUM occupancy counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteBox {
    /// 0 = SBUF, 1 = PSUM, 255 = none (HBM or nothing written).
    pub mem: u8,
    pub p0: u8,
    pub p1: u8,
    pub lo: u32,
    pub hi: u32,
}

impl WriteBox {
    pub const NONE: WriteBox = WriteBox {
        mem: 255,
        p0: 0,
        p1: 0,
        lo: 0,
        hi: 0,
    };
}

#[derive(Clone, Debug)]
pub struct Record {
    pub core: u8,
    pub unit: Unit,
    /// Index of the instruction in its core's program.
    pub index: u32,
    pub opcode: Opcode,
    pub start_ps: u64,
    pub end_ps: u64,
    /// Bytes read plus bytes written (DMA transfers: payload bytes landed in dst).
    pub bytes: u64,
    pub flops: u64,
    /// DMA transfers: bytes read from plus written to HBM; else 0.
    pub hbm_bytes: u64,
    /// DMA transfers: QoS class and DMA engines used; else 0.
    pub priority: u8,
    pub dma_engines: u8,
    pub write: WriteBox,
}

/// A semaphore signal (posted when the record ends, visible after the semaphore latency) or a
/// wait (satisfied when the record starts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemEvent {
    pub core: u8,
    pub sem: u16,
    pub wait: bool,
    /// Signal: delta; wait: threshold.
    pub value: u32,
    /// Signal: time the increment becomes visible; wait: time the waiter starts.
    pub time_ps: u64,
    /// Index into `Trace::records` of the signalling / waiting record.
    pub record: u32,
    /// Waits: the record whose signal made the value reach the threshold (-1: none needed).
    pub by: i64,
}

/// One DMA engine's share of a transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmaSpan {
    pub core: u8,
    /// DMA engine of the core, 0..16.
    pub engine: u8,
    pub start_ps: u64,
    pub end_ps: u64,
    pub bytes: u64,
    /// Index into `Trace::records` of the transfer.
    pub record: u32,
}

#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub records: Vec<Record>,
    pub sems: Vec<SemEvent>,
    pub dma_spans: Vec<DmaSpan>,
    /// Items run after `RunOptions::trace_limit` records were kept: not recorded (0: complete).
    pub dropped: u64,
    /// The generation whose constants timed the run ("trn3" ..., `CostModel::timing`).
    pub timing: &'static str,
}

impl Trace {
    /// Estimated end-to-end time of the run (latest record end), ns.
    pub fn total_ns(&self) -> f64 {
        self.records.iter().map(|r| r.end_ps).max().unwrap_or(0) as f64 / 1000.0
    }

    /// Fill `by` of every wait: replay each semaphore's increments in visibility order (ties in
    /// posting order, as the scheduler applies them) and find the one that reached the threshold.
    pub fn link_semaphores(&mut self) {
        use std::collections::HashMap;
        // Every increment as (core, semaphore, visible at, event position, delta, record),
        // sorted: each semaphore's increments are one run, in visibility order (ties in posting
        // order). One vector, not one per semaphore grown by pushes.
        let mut inc: Vec<(u8, u16, u64, usize, u32, u32)> = self
            .sems
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.wait)
            .map(|(i, e)| (e.core, e.sem, e.time_ps, i, e.value, e.record))
            .collect();
        inc.sort_unstable();
        // Each semaphore's increments in order, as (running value after it, record): a wait's
        // signaller is the first increment whose running value reaches the threshold (binary
        // search: auto-sync counters take thousands of increments, one scan per wait was
        // quadratic).
        let mut run: Vec<(u64, u32)> = Vec::with_capacity(inc.len());
        let mut at: HashMap<(u8, u16), (usize, usize)> = HashMap::new();
        let mut k = 0;
        while k < inc.len() {
            let (core, sem) = (inc[k].0, inc[k].1);
            let from = run.len();
            let mut cum = 0u64;
            while k < inc.len() && (inc[k].0, inc[k].1) == (core, sem) {
                cum += inc[k].4 as u64;
                run.push((cum, inc[k].5));
                k += 1;
            }
            at.insert((core, sem), (from, run.len()));
        }
        for e in self.sems.iter_mut().filter(|e| e.wait) {
            e.by = -1;
            let Some(&(from, to)) = at.get(&(e.core, e.sem)) else {
                continue;
            };
            if e.value == 0 {
                continue;
            }
            let v = &run[from..to];
            let k = v.partition_point(|&(cum, _)| cum < e.value as u64);
            if let Some(&(_, rec)) = v.get(k) {
                e.by = rec as i64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(sem: u16, wait: bool, value: u32, time_ps: u64, record: u32) -> SemEvent {
        SemEvent {
            core: (sem % 2) as u8,
            sem,
            wait,
            value,
            time_ps,
            record,
            by: 7,
        }
    }

    /// The definition: replay the increments in visibility order (ties in posting order) and
    /// take the one whose running value first reaches the threshold.
    fn naive_by(sems: &[SemEvent], w: &SemEvent) -> i64 {
        let mut incs: Vec<(u64, usize, u32, u32)> = sems
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.wait && e.core == w.core && e.sem == w.sem)
            .map(|(i, e)| (e.time_ps, i, e.value, e.record))
            .collect();
        incs.sort();
        let mut cum = 0u64;
        for (_, _, d, rec) in incs {
            if cum >= w.value as u64 {
                break;
            }
            cum += d as u64;
            if cum >= w.value as u64 {
                return rec as i64;
            }
        }
        -1
    }

    #[test]
    fn link_semaphores_finds_the_increment_reaching_each_threshold() {
        let mut r = 12345u64;
        let mut next = |n: u64| {
            r = r
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (r >> 33) % n
        };
        let mut t = Trace::default();
        for i in 0..3000u32 {
            let sem = next(4) as u16;
            let wait = next(3) == 0;
            // thresholds past the total and 0 included; deltas of 0..3; equal times tie
            let value = if wait {
                next(1200) as u32
            } else {
                next(4) as u32
            };
            t.sems.push(event(sem, wait, value, next(500) * 10, i));
        }
        let want: Vec<i64> = t
            .sems
            .iter()
            .map(|e| if e.wait { naive_by(&t.sems, e) } else { 7 })
            .collect();
        assert!(want.contains(&-1) && want.iter().filter(|&&b| b >= 0).count() > 100);
        t.link_semaphores();
        let got: Vec<i64> = t.sems.iter().map(|e| e.by).collect();
        assert_eq!(got, want);
    }
}
