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
}

/// One logged access.
pub(super) struct Access<'a> {
    pub epoch: u32,
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
                Some(k) => self.meta[k].0 = epoch,
                None => {
                    self.meta.push((epoch, idx));
                    self.regions.push(r);
                }
            }
        }
    }

    /// The logged accesses, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = Access<'_>> {
        self.meta
            .iter()
            .zip(&self.regions)
            .map(|(&(epoch, idx), region)| Access { epoch, idx, region })
    }

    pub fn clear(&mut self) {
        self.meta.clear();
        self.regions.clear();
    }

    /// Keep only the accesses after epoch `bound`, in order.
    pub fn retain_after(&mut self, bound: u32) {
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
        log.iter().map(|a| (a.epoch, a.idx, a.region.lo)).collect()
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
}
