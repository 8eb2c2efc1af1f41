//! One agent's log of memory accesses for the race checks: each access's region with the
//! agent's epoch and the instruction index. Kept as two parallel arrays (the regions, and the
//! small (epoch, index) pairs) so that logging a step's regions is one block instead of an
//! entry per region (issue 17: tiny-instruction dispatch with race checks on). A region is its
//! position in the agent's program's `RunPlan::all_regions` (built once per program, not copied
//! per access).

use super::run_plan::RunPlan;
use std::ops::Range;

#[derive(Default)]
pub(super) struct RaceLog {
    /// (epoch, instruction index) of each access, parallel to `regions`.
    meta: Vec<(u32, u32)>,
    regions: Vec<u32>,
    /// Some epoch was moved up in place (`append` with dedup): `meta` may be out of epoch
    /// order. Otherwise epochs never decrease along the log (an agent's epoch only grows and
    /// `retain_after` keeps order), so `after` can skip the ordered prefix by binary search.
    unsorted: bool,
}

/// One logged access.
pub(super) struct Access {
    pub idx: u32,
    /// Position in the plan's `all_regions`.
    pub region: u32,
}

impl RaceLog {
    /// Host bytes the log holds (its capacity), counted against a run's `max_memory`.
    pub fn host_bytes(&self) -> u64 {
        (self.meta.capacity() * std::mem::size_of::<(u32, u32)>()
            + self.regions.capacity() * std::mem::size_of::<u32>()) as u64
    }

    /// Log the regions `regs` of `plan` as accesses of instruction `idx` at `epoch`. With
    /// `dedup` (a program that branches runs an instruction again), a region already logged
    /// by the same instruction has its epoch moved up instead: any later access unordered with
    /// the old entry is unordered with the new one and conflicts alike, so the log stays as
    /// long as the program's distinct accesses, not the run.
    pub fn append(&mut self, epoch: u32, idx: u32, regs: Range<u32>, dedup: bool, plan: &RunPlan) {
        if !dedup {
            self.meta
                .extend(std::iter::repeat_n((epoch, idx), regs.len()));
            self.regions.extend(regs);
            return;
        }
        let all = plan.all_regions();
        for r in regs {
            let seen = self
                .meta
                .iter()
                .zip(&self.regions)
                .position(|(m, &x)| m.1 == idx && all[x as usize] == all[r as usize]);
            match seen {
                Some(k) => {
                    self.meta[k].0 = epoch;
                    self.unsorted |= k + 1 < self.meta.len();
                }
                None => {
                    self.meta.push((epoch, idx));
                    self.regions.push(r);
                }
            }
        }
    }

    /// The logged accesses as (epoch, index, region), oldest first.
    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        self.meta
            .iter()
            .zip(&self.regions)
            .map(|(&(epoch, idx), &region)| (epoch, idx, region))
    }

    /// The logged accesses with an epoch above `bound`, oldest first (what `iter` filtered
    /// on `epoch > bound` gives, without visiting the ordered prefix of a sorted log).
    pub fn after(&self, bound: u32) -> impl Iterator<Item = Access> + '_ {
        let from = if self.unsorted {
            0
        } else if self.meta.last().is_none_or(|m| m.0 <= bound) {
            // Everything logged is ordered before (the usual answer: one look, no search).
            self.meta.len()
        } else {
            self.meta.partition_point(|m| m.0 <= bound)
        };
        self.meta[from..]
            .iter()
            .zip(&self.regions[from..])
            .filter(move |(m, _)| m.0 > bound)
            .map(|(&(_, idx), &region)| Access { idx, region })
    }

    pub fn clear(&mut self) {
        self.meta.clear();
        self.regions.clear();
        self.unsorted = false;
    }

    /// Keep only the accesses after epoch `bound`, in order.
    pub fn retain_after(&mut self, bound: u32) {
        if !self.unsorted {
            // Epochs ascend: the accesses to drop are a prefix (often none or all).
            let k = self.meta.partition_point(|m| m.0 <= bound);
            if k > 0 {
                self.meta.drain(..k);
                self.regions.drain(..k);
            }
            return;
        }
        let mut k = 0;
        for i in 0..self.meta.len() {
            if self.meta[i].0 > bound {
                self.meta.swap(k, i);
                self.regions.swap(k, i);
                k += 1;
            }
        }
        self.meta.truncate(k);
        self.regions.truncate(k);
        if k == 0 {
            self.unsorted = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::DType;
    use crate::machine::region::Region;
    use crate::memory::Mem;

    fn region(lo: i128) -> Region {
        Region {
            mem: Mem::Sbuf,
            core: 0,
            p0: 0,
            p1: 1,
            lo,
            hi: lo + 4,
            write: true,
            accum: false,
            boxed: false,
            exact: None,
            dtype: DType::Float32,
            bytes: 4,
            ap: None,
        }
    }

    /// A plan whose regions start at these bytes, in order.
    fn plan(los: &[i128]) -> RunPlan {
        RunPlan::from_regions(los.iter().map(|&lo| region(lo)).collect())
    }

    fn seen(log: &RaceLog, plan: &RunPlan) -> Vec<(u32, u32, i128)> {
        let all = plan.all_regions();
        log.iter()
            .map(|(e, i, r)| (e, i, all[r as usize].lo))
            .collect()
    }

    #[test]
    fn append_dedup_and_retain_keep_order() {
        let p = plan(&[0, 8, 16, 8, 32]);
        let mut log = RaceLog::default();
        log.append(1, 10, 0..2, false, &p);
        log.append(2, 11, 2..3, false, &p);
        // the same instruction and footprint again: its epoch moves up, no new entry
        log.append(3, 10, 3..5, true, &p);
        assert_eq!(
            seen(&log, &p),
            vec![(1, 10, 0), (3, 10, 8), (2, 11, 16), (3, 10, 32)]
        );
        log.retain_after(1);
        assert_eq!(seen(&log, &p), vec![(3, 10, 8), (2, 11, 16), (3, 10, 32)]);
        log.retain_after(2);
        assert_eq!(seen(&log, &p), vec![(3, 10, 8), (3, 10, 32)]);
        log.clear();
        assert!(seen(&log, &p).is_empty());
    }

    /// `after` as (epoch, index, lo): the epoch is looked up by the entry's position.
    fn after(log: &RaceLog, p: &RunPlan, bound: u32) -> Vec<(u32, u32, i128)> {
        let all: Vec<_> = log.iter().collect();
        log.after(bound)
            .map(|a| {
                let k = all.iter().position(|x| x.2 == a.region).unwrap();
                (all[k].0, a.idx, p.all_regions()[a.region as usize].lo)
            })
            .collect()
    }

    #[test]
    fn after_equals_the_filtered_log_sorted_or_not() {
        // region k + 1 starts at byte 8 (k + 1); the last is instruction 2's again
        let p = plan(&[8, 16, 24, 32, 40, 48, 16]);
        let mut log = RaceLog::default();
        for e in 1..=6u32 {
            log.append(e, e, e - 1..e, false, &p);
        }
        assert!(!log.unsorted);
        for bound in 0..8 {
            let want: Vec<_> = seen(&log, &p).into_iter().filter(|a| a.0 > bound).collect();
            assert_eq!(after(&log, &p, bound), want);
        }
        // instruction 2 runs again (a loop): its entry's epoch moves up out of order
        log.append(9, 2, 6..7, true, &p);
        assert!(log.unsorted);
        assert_eq!(after(&log, &p, 5), vec![(9, 2, 16), (6, 6, 48)]);
        for bound in 0..10 {
            let want: Vec<_> = seen(&log, &p).into_iter().filter(|a| a.0 > bound).collect();
            assert_eq!(after(&log, &p, bound), want);
        }
    }
}
