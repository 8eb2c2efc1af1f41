//! Memory regions of instruction operands and exact overlap tests, shared by the race detector
//! and the automatic synchronisation pass.

use crate::isa::{Instr, Opcode};
use crate::memory::{Ap, Mem};

/// One operand's footprint: memory, core (on-chip), partition/row range and absolute byte box.
#[derive(Clone, Debug)]
pub struct Region {
    pub mem: Mem,
    pub core: u8,
    pub p0: u32,
    pub p1: u32,
    /// Byte bounding box: within a partition (on-chip) or absolute (HBM).
    pub lo: i128,
    pub hi: i128,
    pub write: bool,
    pub ap: Ap,
}

impl Region {
    pub fn new(core: u8, ap: &Ap, write: bool) -> Region {
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
        Region {
            mem: ap.mem,
            core,
            p0,
            p1,
            lo,
            hi,
            write,
            ap: ap.clone(),
        }
    }

    /// Absolute sorted byte intervals (HBM) or within-partition intervals (on-chip).
    fn intervals(&self) -> Vec<(i128, i128)> {
        let runs = self.ap.row_runs();
        match self.mem {
            Mem::Hbm => {
                let mut v: Vec<(i128, i128)> = (0..self.ap.parts)
                    .flat_map(|r| {
                        let b = self.ap.row_base(r);
                        runs.iter().map(move |(x, y)| (b + x, b + y))
                    })
                    .collect();
                v.sort_unstable();
                v
            }
            _ => runs
                .iter()
                .map(|(x, y)| (self.ap.offset as i128 + x, self.ap.offset as i128 + y))
                .collect(),
        }
    }

    /// Do the two footprints share at least one byte?
    pub fn overlaps(&self, o: &Region) -> bool {
        if self.mem != o.mem || self.hi <= o.lo || o.hi <= self.lo {
            return false;
        }
        if self.mem != Mem::Hbm && (self.core != o.core || self.p1 <= o.p0 || o.p1 <= self.p0) {
            return false;
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

/// Regions an instruction touches (DMAs included: the queue performs them).
pub fn regions(core: u8, ins: &Instr) -> Vec<Region> {
    let mut v = Vec::new();
    for (_, _, access, ap) in ins.tensors() {
        if access.reads() && !access.writes() {
            v.push(Region::new(core, ap, false));
        } else {
            v.push(Region::new(core, ap, true));
        }
    }
    let _ = Opcode::Nop;
    v
}

/// True when some pair (one writing) overlaps.
pub fn conflict(a: &[Region], b: &[Region]) -> Option<(usize, usize)> {
    for (i, x) in a.iter().enumerate() {
        for (j, y) in b.iter().enumerate() {
            if (x.write || y.write) && x.overlaps(y) {
                return Some((i, j));
            }
        }
    }
    None
}
