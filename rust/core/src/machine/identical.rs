//! Cross-core writes of identical bytes. SPMD programs that ignore `program_id` (a kernel
//! launched as `kernel[2]` whose programs all store the same result) write the same HBM bytes
//! from several cores with nothing ordering them: a race by the letter, benign on hardware
//! because every order leaves the same bytes. With `RunOptions::identical_writes` such a
//! write-write overlap is checked after the later write runs: identical bytes make it a
//! warning (`RunResult::identical_writes`), different bytes the usual `data_race` error.

use crate::memory::hbm::Hbm;
use crate::memory::Mem;

use super::region::Region;

/// A write-write overlap waiting for the later write to run: the overlapping HBM bytes as the
/// earlier write left them, and the words of the race message.
pub(super) struct Pending {
    pub lo: u64,
    pub before: Vec<u8>,
    /// The earlier instruction (`core c #i `text``).
    pub first: String,
    pub theirs: Region,
    pub mine: usize,
}

/// Whether the overlap of `mine` (the later access) and `theirs` may be benign: both plain
/// writes of HBM from different cores with exact (not dynamic) footprints.
pub(super) fn candidate(mine: &Region, theirs: &Region, my_core: u8, their_core: u8) -> bool {
    my_core != their_core
        && mine.mem == Mem::Hbm
        && theirs.mem == Mem::Hbm
        && mine.write
        && theirs.write
        && !mine.accum
        && !theirs.accum
        && !mine.boxed
        && !theirs.boxed
}

/// The bytes both footprints' boxes cover, as they are now (before the later write).
pub(super) fn snapshot(hbm: &Hbm, mine: &Region, theirs: &Region) -> (u64, Vec<u8>) {
    let lo = mine.lo.max(theirs.lo).max(0);
    let hi = mine.hi.min(theirs.hi).max(lo);
    let mut before = vec![0u8; (hi - lo) as usize];
    hbm.read(lo as u64, &mut before);
    (lo as u64, before)
}

/// Whether the later write left the overlapping bytes as the earlier one wrote them.
pub(super) fn unchanged(hbm: &Hbm, p: &Pending) -> bool {
    hbm.equals(p.lo, &p.before)
}

/// The warning for a benign overlap: both instructions and the bytes.
pub(super) fn warning(p: &Pending, second: &str) -> String {
    format!(
        "identical writes: {} and {} both write hbm bytes {}..{} with no semaphore ordering them; \
         the bytes written are identical, so every order leaves the same result",
        p.first,
        second,
        p.lo,
        p.lo + p.before.len() as u64
    )
}
