//! Memory regions of instruction operands and exact overlap tests, shared by the race detector
//! and the automatic synchronisation pass.

use std::borrow::Cow;

use crate::isa::{DType, Instr, Opcode};
use crate::memory::{Ap, DynSrc, Mem};

/// One operand's footprint: memory, core (on-chip), partition/row range and absolute byte box.
#[derive(Clone, Debug, PartialEq)]
pub struct Region {
    pub mem: Mem,
    pub core: u8,
    pub p0: u32,
    pub p1: u32,
    /// Byte bounding box: within a partition (on-chip) or absolute (HBM).
    pub lo: i128,
    pub hi: i128,
    pub write: bool,
    /// A near-memory SBUF accumulate (`dma_compute` read-add-write): two accumulates of one dtype
    /// into the same bytes commute (each is one atomic add at the memory), so they do not
    /// conflict with each other; against any other access an accumulate counts as a write.
    pub accum: bool,
    /// The footprint is only known as the byte box `lo..hi` (dynamic offsets): every byte in it
    /// counts as touched, unless `exact` lists it.
    pub boxed: bool,
    /// A dynamic footprint's sorted byte runs over every index in `0..bound`, when there are few
    /// enough of them (`MAX_EXACT_RUNS`): disjoint column slices of gathered rows, as LNC-sharded
    /// scatters use, then do not overlap.
    pub exact: Option<Box<[(i128, i128)]>>,
    /// Element dtype and bytes the operand touches (elements x size, as listed).
    pub dtype: DType,
    pub bytes: u64,
    /// The pattern, kept only when the footprint is not simply the box: a static on-chip
    /// pattern whose rows are contiguous touches exactly `lo..hi` in each of its partitions, so
    /// it needs no copy (a copy of the free dims per operand per instruction was a tenth of the
    /// time of tiny instructions with race checks or trace on). Boxed, like `exact`, so a
    /// region stays small enough to move without a copy call (the race log holds one per access).
    pub ap: Option<Box<Ap>>,
}

/// Above this many byte runs a dynamic footprint stays a box.
const MAX_EXACT_RUNS: usize = 4096;

impl Region {
    pub fn new(core: u8, ap: &Ap, write: bool) -> Region {
        if let Some(d) = ap.dynamic.as_deref() {
            return Self::dynamic(core, ap, d.bound, write);
        }
        Self::fixed(core, ap, write)
    }

    /// A dynamic pattern may touch any index in `0..bound`: the box spanning the first and
    /// last index's footprints (offsets are linear in the index, so it covers all between).
    fn dynamic(core: u8, ap: &Ap, bound: u32, write: bool) -> Region {
        let ends = [ap.at_index(0), ap.at_index(bound as i64 - 1)];
        let mut r: Option<Region> = None;
        for a in ends.into_iter().flatten() {
            let x = Self::fixed(core, &a, write);
            r = Some(match r {
                None => x,
                Some(mut y) => {
                    y.lo = y.lo.min(x.lo);
                    y.hi = y.hi.max(x.hi);
                    y.p0 = y.p0.min(x.p0);
                    y.p1 = y.p1.max(x.p1);
                    y
                }
            });
        }
        let mut r = r.unwrap_or_else(|| Self::fixed(core, ap, write));
        r.boxed = true;
        r.exact = Self::exact_runs(ap, bound).map(Vec::into_boxed_slice);
        r.ap = Some(Box::new(ap.clone()));
        r
    }

    /// The union of the footprints at every index (`None` when too many runs or an index is out
    /// of the address space). A vector offset puts every row at the index, so one row suffices.
    fn exact_runs(ap: &Ap, bound: u32) -> Option<Vec<(i128, i128)>> {
        let vector = ap
            .dynamic
            .as_deref()
            .is_some_and(|d| d.kind == crate::memory::DynKind::Vector);
        let mut out = Vec::new();
        for i in 0..bound as i64 {
            let mut a = ap.at_index(i).ok()?;
            if vector {
                a.parts = 1;
            }
            let runs = Self::fixed(0, &a, false).intervals().into_owned();
            if out.len() + runs.len() > MAX_EXACT_RUNS {
                return None;
            }
            out.extend(runs);
        }
        out.sort_unstable();
        Some(out)
    }

    fn fixed(core: u8, ap: &Ap, write: bool) -> Region {
        let (blo, bhi) = ap.row_byte_range();
        let (p0, p1, lo, hi) = match ap.mem {
            Mem::Hbm => {
                let last = ap.row_base(ap.parts - 1);
                let first = ap.row_base(0);
                let (a, b) = (first.min(last), first.max(last));
                (0, 1, a + blo, b + bhi)
            }
            _ => (
                ap.start,
                ap.start + ap.parts,
                ap.offset as i128 + blo,
                ap.offset as i128 + bhi,
            ),
        };
        let just_box = ap.mem != Mem::Hbm
            && ap.dynamic.is_none()
            && ap.free_size() > 0
            && ap.is_row_contiguous();
        Region {
            mem: ap.mem,
            core,
            p0,
            p1,
            lo,
            hi,
            write,
            accum: false,
            boxed: false,
            exact: None,
            dtype: ap.dtype,
            bytes: ap.num_elements() as u64 * ap.dtype.size() as u64,
            ap: (!just_box).then(|| Box::new(ap.clone())),
        }
    }

    /// Absolute sorted byte intervals (HBM) or within-partition intervals (on-chip).
    fn intervals(&self) -> Cow<'_, [(i128, i128)]> {
        if self.boxed {
            return match &self.exact {
                Some(v) => Cow::Borrowed(&v[..]),
                None => Cow::Owned(vec![(self.lo, self.hi)]),
            };
        }
        let Some(ap) = &self.ap else {
            // A static on-chip pattern with contiguous rows: the box is the footprint.
            return Cow::Owned(vec![(self.lo, self.hi)]);
        };
        let runs = ap.row_runs();
        Cow::Owned(match self.mem {
            Mem::Hbm => {
                let mut v: Vec<(i128, i128)> = (0..ap.parts)
                    .flat_map(|r| {
                        let b = ap.row_base(r);
                        runs.iter().map(move |(x, y)| (b + x, b + y))
                    })
                    .collect();
                v.sort_unstable();
                v
            }
            _ => runs
                .iter()
                .map(|(x, y)| (ap.offset as i128 + x, ap.offset as i128 + y))
                .collect(),
        })
    }

    /// `intervals` is the one run `lo..hi` (and is not worth allocating).
    fn single_run(&self) -> bool {
        if self.boxed {
            self.exact.is_none()
        } else {
            self.ap.is_none()
        }
    }

    /// Do the two footprints share at least one byte?
    #[inline]
    pub fn overlaps(&self, o: &Region) -> bool {
        if self.mem != o.mem || self.hi <= o.lo || o.hi <= self.lo {
            return false;
        }
        if self.mem != Mem::Hbm && (self.core != o.core || self.p1 <= o.p0 || o.p1 <= self.p0) {
            return false;
        }
        self.boxes_meet(o)
    }

    /// `overlaps` of two footprints whose boxes meet (its rarer part: kept out of line, so the
    /// box test inlines into the scans of many pairs).
    #[inline(never)]
    fn boxes_meet(&self, o: &Region) -> bool {
        // A footprint that is its box (the usual static tile) needs no interval list; the walk
        // below with one side the single run `lo..hi` (the boxes overlap: two boxes meet).
        match (self.single_run(), o.single_run()) {
            (true, true) => return true,
            (true, false) => return meets_run(&o.intervals(), self.lo, self.hi, false),
            (false, true) => return meets_run(&self.intervals(), o.lo, o.hi, true),
            (false, false) => {}
        }
        let (a, b) = (self.intervals(), o.intervals());
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            if a[i].1 <= b[j].0 {
                i += 1;
            } else if b[j].1 <= a[i].0 {
                j += 1;
            } else {
                return true;
            }
        }
        false
    }
}

/// `Region::overlaps`'s walk of the runs `runs` against the one run `lo..hi` (on the left
/// when `runs_left`), step by step as the two-list walk takes it: the walk first asks whether
/// the left run ends before the right one starts (then the left list advances), then the
/// reverse (the right list advances); the one run's list ends after one step.
fn meets_run(runs: &[(i128, i128)], lo: i128, hi: i128, runs_left: bool) -> bool {
    for &(a, b) in runs {
        if runs_left {
            if b <= lo {
                continue;
            }
            if hi <= a {
                return false;
            }
        } else {
            if hi <= a {
                return false;
            }
            if b <= lo {
                continue;
            }
        }
        return true;
    }
    false
}

/// Regions an instruction touches (DMAs included: the queue performs them).
/// Offset tiles of dynamic patterns are read too. A `dma_compute` whose dst is also one of its
/// sources is a read-add-write: one accumulate region instead of a read and a write.
pub fn regions(core: u8, ins: &Instr) -> Vec<Region> {
    let mut v = Vec::new();
    regions_into(core, ins, &mut v);
    v
}

/// `regions` appended to `v` (the scheduler reuses one buffer for every step).
pub fn regions_into(core: u8, ins: &Instr, v: &mut Vec<Region>) {
    let rmw_dst = if ins.op == Opcode::DmaCompute {
        crate::engines::dma::rmw_target(ins)
    } else {
        None
    };
    for (i, _, access, ap) in ins.tensors() {
        if let Some(d) = rmw_dst {
            if i != d && ins.args[d].tensor() == Some(ap) {
                continue;
            }
        }
        let mut r = Region::new(core, ap, access.writes());
        // Only SBUF has near-memory adders; an HBM read-add-write (scatter-add) is a DMA read
        // then write, so concurrent ones into the same bytes do race.
        r.accum = rmw_dst == Some(i) && ap.mem == crate::memory::Mem::Sbuf;
        v.push(r);
        if let Some(DynSrc::Tile(t)) = ap.dynamic.as_deref().map(|d| &d.src) {
            v.push(Region::new(core, t, false));
        }
    }
}

/// True when some pair (one writing) overlaps.
#[inline]
pub fn conflict(a: &[Region], b: &[Region]) -> Option<(usize, usize)> {
    for (i, x) in a.iter().enumerate() {
        for (j, y) in b.iter().enumerate() {
            let commute = x.accum && y.accum && x.dtype == y.dtype;
            if (x.write || y.write) && !commute && x.overlaps(y) {
                return Some((i, j));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two-list walk over both interval lists (what `overlaps` did for every pair).
    fn walk(a: &Region, o: &Region) -> bool {
        if a.mem != o.mem || a.hi <= o.lo || o.hi <= a.lo {
            return false;
        }
        if a.mem != Mem::Hbm && (a.core != o.core || a.p1 <= o.p0 || o.p1 <= a.p0) {
            return false;
        }
        let (x, y) = (a.intervals(), o.intervals());
        let (mut i, mut j) = (0, 0);
        while i < x.len() && j < y.len() {
            if x[i].1 <= y[j].0 {
                i += 1;
            } else if y[j].1 <= x[i].0 {
                j += 1;
            } else {
                return true;
            }
        }
        false
    }

    /// Small patterns (contiguous rows, strided rows, HBM rows) that often meet.
    fn pattern(seed: &mut u64, mem: Mem) -> Ap {
        let mut next = |n: u64| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 33) % n
        };
        let dims = match next(3) {
            0 => vec![(1, 1 + next(8) as u32)],
            1 => vec![(1 + next(4) as i64, 1 + next(6) as u32)],
            _ => vec![
                (4 + next(4) as i64, 1 + next(3) as u32),
                (1, 1 + next(3) as u32),
            ],
        };
        Ap {
            mem,
            dtype: DType::Float32,
            start: next(4) as u32,
            parts: 1 + next(3) as u32,
            pstep: if mem == Mem::Hbm {
                8 + next(8) as i64
            } else {
                0
            },
            offset: 4 * next(16),
            dims,
            dynamic: None,
        }
    }

    #[test]
    fn overlaps_is_the_walk_of_the_runs() {
        let mut seed = 7;
        let (mut met, mut single) = (0, 0);
        for k in 0..20000 {
            let mem = [Mem::Sbuf, Mem::Hbm][k % 2];
            let a = Region::new(0, &pattern(&mut seed, mem), true);
            let b = Region::new(0, &pattern(&mut seed, mem), false);
            assert_eq!(a.overlaps(&b), walk(&a, &b), "{a:?} {b:?}");
            assert_eq!(b.overlaps(&a), walk(&b, &a), "{b:?} {a:?}");
            met += usize::from(walk(&a, &b));
            single += usize::from(a.single_run() != b.single_run());
        }
        // both outcomes and the mixed fast path were exercised
        assert!(met > 1000 && met < 19000 && single > 1000, "{met} {single}");
    }
}
