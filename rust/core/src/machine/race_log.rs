//! One agent's log of memory accesses for the race checks: each access's region with the
//! agent's epoch and the instruction index. Kept as two parallel arrays (the regions, and the
//! small (epoch, index) pairs) so that logging a step's regions moves them in one block instead
//! of building an entry per region (issue 17: tiny-instruction dispatch with race checks on).

use super::region::Region;

#[derive(Default)]
pub(super) struct RaceLog {
    /// (epoch, instruction index) of each access, parallel to `regions`.
    meta: Vec<(u32, u32)>,
    regions: Vec<Region>,
    /// Some epoch was moved up in place (`append` with dedup): `meta` may be out of epoch
    /// order. Otherwise epochs never decrease along the log (an agent's epoch only grows and
    /// `retain_after` keeps order), so `after` can skip the ordered prefix by binary search.
    unsorted: bool,
}

/// One logged access.
pub(super) struct Access<'a> {
    pub idx: u32,
    pub region: &'a Region,
}

impl RaceLog {
    /// Log every region of `regs` (emptied) as accesses of instruction `idx` at `epoch`. With
    /// `dedup` (a program that branches runs an instruction again), a region already logged
    /// by the same instruction has its epoch moved up instead: any later access unordered with
    /// the old entry is unordered with the new one and conflicts alike, so the log stays as
    /// long as the program's distinct accesses, not the run.
    pub fn append(&mut self, epoch: u32, idx: u32, regs: &mut Vec<Region>, dedup: bool) {
        if !dedup {
            self.meta
                .extend(std::iter::repeat_n((epoch, idx), regs.len()));
            self.regions.append(regs);
            return;
        }
        for r in regs.drain(..) {
            let seen = self
                .meta
                .iter()
                .zip(&self.regions)
                .position(|(m, x)| m.1 == idx && *x == r);
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
    fn iter(&self) -> impl Iterator<Item = (u32, u32, &Region)> {
        self.meta
            .iter()
            .zip(&self.regions)
            .map(|(&(epoch, idx), region)| (epoch, idx, region))
    }

    /// The logged accesses with an epoch above `bound`, oldest first (what `iter` filtered
    /// on `epoch > bound` gives, without visiting the ordered prefix of a sorted log).
    pub fn after(&self, bound: u32) -> impl Iterator<Item = Access<'_>> {
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
            .map(|(&(_, idx), region)| Access { idx, region })
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

    fn seen(log: &RaceLog) -> Vec<(u32, u32, i128)> {
        log.iter().map(|(e, i, r)| (e, i, r.lo)).collect()
    }

    #[test]
    fn append_dedup_and_retain_keep_order() {
        let mut log = RaceLog::default();
        let mut regs = vec![region(0), region(8)];
        log.append(1, 10, &mut regs, false);
        assert!(regs.is_empty());
        log.append(2, 11, &mut vec![region(16)], false);
        // the same instruction and footprint again: its epoch moves up, no new entry
        log.append(3, 10, &mut vec![region(8), region(32)], true);
        assert_eq!(
            seen(&log),
            vec![(1, 10, 0), (3, 10, 8), (2, 11, 16), (3, 10, 32)]
        );
        log.retain_after(1);
        assert_eq!(seen(&log), vec![(3, 10, 8), (2, 11, 16), (3, 10, 32)]);
        log.retain_after(2);
        assert_eq!(seen(&log), vec![(3, 10, 8), (3, 10, 32)]);
        log.clear();
        assert!(seen(&log).is_empty());
    }

    /// `after` as (epoch, index, lo): the epoch is looked up by the entry's position.
    fn after(log: &RaceLog, bound: u32) -> Vec<(u32, u32, i128)> {
        let all: Vec<_> = log.iter().collect();
        log.after(bound)
            .map(|a| {
                let k = all
                    .iter()
                    .position(|x| std::ptr::eq(x.2, a.region))
                    .unwrap();
                (all[k].0, a.idx, a.region.lo)
            })
            .collect()
    }

    #[test]
    fn after_equals_the_filtered_log_sorted_or_not() {
        let mut log = RaceLog::default();
        for e in 1..=6u32 {
            log.append(e, e, &mut vec![region(8 * e as i128)], false);
        }
        assert!(!log.unsorted);
        for bound in 0..8 {
            let want: Vec<_> = seen(&log).into_iter().filter(|a| a.0 > bound).collect();
            assert_eq!(after(&log, bound), want);
        }
        // instruction 2 runs again (a loop): its entry's epoch moves up out of order
        log.append(9, 2, &mut vec![region(16)], true);
        assert!(log.unsorted);
        assert_eq!(after(&log, 5), vec![(9, 2, 16), (6, 6, 48)]);
        for bound in 0..10 {
            let want: Vec<_> = seen(&log).into_iter().filter(|a| a.0 > bound).collect();
            assert_eq!(after(&log, bound), want);
        }
    }
}
