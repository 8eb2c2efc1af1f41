//! The on-chip allocator's range bookkeeping (`trn3emu.allocator.Allocator` keeps the labels,
//! the owners and the messages; the policy is documented there and in docs/nki.md "Memory"):
//! first fit over the live ranges and the last `rotate` freed ones (rotation), falling back to
//! first fit over the live ranges alone; ranges aligned, and with PSUM banks kept whole.
//! The search runs once per tile a kernel allocates, so it lives here rather than in Python; in
//! SBUF it reads bitmaps of the 64-byte slots the ranges cover (64 words, however many tiles
//! are live, e.g. a load cache filling SBUF), and scans the ranges where the slots would not
//! say the same (PSUM's bank rule, explicit ranges off the alignment).

use crate::error::{fail, ErrorKind, Result};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// The hasher of the live ranges' keys (sequential u64s): one multiplication (Fibonacci
/// hashing) instead of SipHash; the keys come from this allocator, never from outside.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Per-partition byte ranges of one memory: live ones by key, recently freed ones kept out of
/// reach while another range fits.
#[derive(Clone, Debug)]
pub struct RangeAllocator {
    capacity: u64,
    align: u64,
    /// PSUM bank bytes (0: no bank rule)
    bank: u64,
    rotate: usize,
    next_key: u64,
    /// live ranges: key -> (lo, hi)
    live: HashMap<u64, (u64, u64), BuildHasherDefault<KeyHasher>>,
    /// live and recently freed ranges (lo, hi, key), ascending
    blocked: Vec<(u64, u64, u64)>,
    /// recently freed (lo, hi, key), oldest first, at most `rotate`
    recent: VecDeque<(u64, u64, u64)>,
    /// the fewest bytes known not to fit among the live ranges (u64::MAX: none known): a
    /// larger request cannot fit either (a legal start of it is one of the smaller one's), and
    /// adding ranges only takes room, so `alloc` refuses at once until a range is released.
    /// (A memory kept full, e.g. by cached loads, retries every allocation after freeing one.)
    no_fit: u64,
    /// the `align`-byte slots `blocked` / the live ranges cover (None: a memory without them,
    /// see `slots_for`), and how many ranges in `blocked` the slots do not describe exactly (a
    /// start off the alignment, or no bytes): while there are any, `alloc` scans the ranges
    slots: Option<(Slots, Slots)>,
    inexact: usize,
}

/// Which of a memory's `align`-byte slots a multiset of ranges covers: a count per slot and a bit
/// per slot (set: a range holds a byte of it; the bits past the last slot are set). For ranges
/// that start on a slot and hold a byte, a start on a slot is clear of them exactly when the
/// slots from it are free, so first fit is the lowest run of free slots, found a word at a time.
#[derive(Clone, Debug)]
struct Slots {
    count: Vec<u32>,
    bits: Vec<u64>,
}

impl Slots {
    fn new(n: usize) -> Self {
        let mut bits = vec![0u64; n.div_ceil(64)];
        for i in n..bits.len() * 64 {
            bits[i / 64] |= 1 << (i % 64);
        }
        Slots {
            count: vec![0; n],
            bits,
        }
    }

    fn cover(&mut self, slots: std::ops::Range<usize>) {
        for i in slots {
            self.count[i] += 1;
            self.bits[i / 64] |= 1 << (i % 64);
        }
    }

    fn uncover(&mut self, slots: std::ops::Range<usize>) {
        for i in slots {
            self.count[i] -= 1;
            if self.count[i] == 0 {
                self.bits[i / 64] &= !(1 << (i % 64));
            }
        }
    }

    /// The first slot of the lowest run of `k` (>= 1) free slots.
    fn first_run(&self, k: usize) -> Option<usize> {
        let n = self.bits.len() * 64;
        let (mut i, mut start) = (0, 0);
        while i < n {
            let (w, b) = (i / 64, i % 64);
            let free = (self.bits[w] >> b).trailing_zeros() as usize; // free slots from i in this word
            let free = free.min(64 - b);
            i += free;
            if i - start >= k {
                return Some(start);
            }
            if free < 64 - b {
                // slot i is taken: skip the taken run in this word
                let taken = (!(self.bits[w] >> (i % 64))).trailing_zeros() as usize;
                i += taken.min(64 - i % 64);
                start = i;
            }
        }
        None
    }
}

/// `x` rounded up to a multiple of `a`, None past u64 (a start no memory has).
fn up(x: u64, a: u64) -> Option<u64> {
    x.div_ceil(a).checked_mul(a)
}

impl RangeAllocator {
    /// `align`: start alignment (>= 1); `bank`: bank bytes (0 for none); `rotate`: recently freed
    /// ranges kept out of reach.
    pub fn new(capacity: u64, align: u64, bank: u64, rotate: usize) -> Self {
        RangeAllocator {
            capacity,
            align: align.max(1),
            bank,
            rotate,
            next_key: 0,
            live: HashMap::default(),
            blocked: Vec::new(),
            recent: VecDeque::new(),
            no_fit: u64::MAX,
            slots: Self::slots_for(capacity, align.max(1), bank),
            inexact: 0,
        }
    }

    /// Slot bitmaps for a memory of whole slots without bank rules and of at most 2^16 slots
    /// (SBUF: 4,096 slots of 64 bytes); None otherwise (PSUM, odd sizes): `alloc` scans.
    fn slots_for(capacity: u64, align: u64, bank: u64) -> Option<(Slots, Slots)> {
        let n = capacity / align;
        (bank == 0 && capacity.is_multiple_of(align) && n <= 1 << 16)
            .then(|| (Slots::new(n as usize), Slots::new(n as usize)))
    }

    /// The slots of `lo..hi`, and whether they describe it exactly.
    fn slot_range(&self, lo: u64, hi: u64) -> (std::ops::Range<usize>, bool) {
        let a = self.align;
        (
            (lo / a) as usize..hi.div_ceil(a) as usize,
            lo.is_multiple_of(a) && hi > lo,
        )
    }

    /// `lo..hi` joins `blocked` (`live`: and the live ranges).
    fn cover(&mut self, lo: u64, hi: u64, live: bool) {
        let (r, exact) = self.slot_range(lo, hi);
        if let Some((blocked, live_slots)) = &mut self.slots {
            blocked.cover(r.clone());
            if live {
                live_slots.cover(r);
            }
        }
        self.inexact += usize::from(!exact);
    }

    /// `lo..hi` leaves the live ranges (`live`) or `blocked`.
    fn uncover(&mut self, lo: u64, hi: u64, live: bool) {
        let (r, exact) = self.slot_range(lo, hi);
        if let Some((blocked, live_slots)) = &mut self.slots {
            if live {
                live_slots.uncover(r);
            } else {
                blocked.uncover(r);
            }
        }
        if !live {
            self.inexact -= usize::from(!exact);
        }
    }

    /// The first legal start at or after `pos` for `nbytes` (>= 1), None past u64.
    fn start(&self, pos: u64, nbytes: u64) -> Option<u64> {
        let s = up(pos, self.align)?;
        let b = self.bank;
        if b > 0 && (nbytes > b || s / b != s.checked_add(nbytes - 1)? / b) {
            up(s, b)
        } else {
            Some(s)
        }
    }

    /// `start`, when `nbytes` from there end at or before `limit`.
    fn fits(&self, pos: u64, nbytes: u64, limit: u64) -> Option<u64> {
        let s = self.start(pos, nbytes)?;
        (s.checked_add(nbytes)? <= limit).then_some(s)
    }

    /// The lowest legal start of `nbytes` clear of `ranges` (sorted by start).
    fn fit(&self, nbytes: u64, ranges: impl Iterator<Item = (u64, u64)>) -> Option<u64> {
        match self.gaps(nbytes, 0, ranges) {
            Ok(s) => Some(s),
            Err(pos) => self.tail(nbytes, pos),
        }
    }

    /// The lowest legal start of `nbytes` in a gap of `ranges` (sorted by start) at or after
    /// `pos`, the end of what came before: Ok(start), or Err(the end of what they cover: the
    /// largest end among them and `pos`).
    fn gaps(
        &self,
        nbytes: u64,
        mut pos: u64,
        ranges: impl Iterator<Item = (u64, u64)>,
    ) -> std::result::Result<u64, u64> {
        for (lo, hi) in ranges {
            if lo > pos {
                if let Some(s) = self.fits(pos, nbytes, lo) {
                    return Ok(s);
                }
                pos = hi;
            } else if hi > pos {
                pos = hi;
            }
        }
        Err(pos)
    }

    /// `nbytes` after everything that ends at `pos`, if the memory has room.
    fn tail(&self, nbytes: u64, pos: u64) -> Option<u64> {
        if self.capacity > pos {
            self.fits(pos, nbytes, self.capacity)
        } else {
            None
        }
    }

    /// First fit over the live ranges alone, when first fit over `blocked` (live and recently
    /// freed) found no room: `blocked` less its recently freed entries. Before the first of
    /// those, both scans see the same ranges (and found nothing), so the scan starts there,
    /// from the end of what the ranges before it cover.
    fn fit_live(&self, nbytes: u64) -> Option<u64> {
        let blocked = &self.blocked;
        let mut skip: Vec<usize> = self
            .recent
            .iter()
            .filter_map(|r| blocked.binary_search(r).ok())
            .collect();
        skip.sort_unstable();
        let first = *skip.first()?;
        let mut pos = blocked[..first].iter().map(|r| r.1).max().unwrap_or(0);
        for (n, &k) in skip.iter().enumerate() {
            let end = skip.get(n + 1).copied().unwrap_or(blocked.len());
            match self.gaps(nbytes, pos, blocked[k + 1..end].iter().map(|r| (r.0, r.1))) {
                Ok(s) => return Some(s),
                Err(p) => pos = p,
            }
        }
        self.tail(nbytes, pos)
    }

    fn add(&mut self, lo: u64, hi: u64) -> u64 {
        let key = self.next_key;
        self.next_key += 1;
        self.live.insert(key, (lo, hi));
        let r = (lo, hi, key);
        let i = self.blocked.partition_point(|x| *x <= r);
        self.blocked.insert(i, r);
        self.cover(lo, hi, true);
        key
    }

    /// Place `nbytes` (at least 1): `(key, start)`, or None when no range fits.
    pub fn alloc(&mut self, nbytes: u64) -> Option<(u64, u64)> {
        let nbytes = nbytes.max(1);
        if nbytes >= self.no_fit {
            return None;
        }
        let mut pos = match &self.slots {
            Some((blocked, live)) if self.inexact == 0 => {
                let k = usize::try_from(nbytes.div_ceil(self.align)).unwrap_or(usize::MAX);
                let first = blocked.first_run(k).or_else(|| live.first_run(k));
                first.map(|i| i as u64 * self.align)
            }
            _ => None,
        };
        if pos.is_none() && (self.slots.is_none() || self.inexact > 0) {
            let blocked = self.blocked.iter().map(|r| (r.0, r.1));
            pos = self.fit(nbytes, blocked);
            if pos.is_none() {
                pos = self.fit_live(nbytes); // rotation found no room: the live ranges alone
            }
        }
        let Some(pos) = pos else {
            self.no_fit = self.no_fit.min(nbytes);
            return None;
        };
        Some((self.add(pos, pos + nbytes), pos))
    }

    /// Reserve `offset..offset + nbytes` (may overlap live ranges); its key. A range past the
    /// capacity is refused.
    pub fn place(&mut self, offset: u64, nbytes: u64) -> Result<u64> {
        match offset.checked_add(nbytes) {
            Some(end) if end <= self.capacity => Ok(self.add(offset, end)),
            _ => Err(fail(
                ErrorKind::Address,
                "tile_address_out_of_range",
                format!(
                    "a range at byte {offset} of {nbytes} bytes ends past the {} bytes of a partition",
                    self.capacity
                ),
            )
            .operand("offset")),
        }
    }

    /// The recently freed ranges (lo, hi), oldest first.
    pub fn recent(&self) -> Vec<(u64, u64)> {
        self.recent.iter().map(|r| (r.0, r.1)).collect()
    }

    /// Free `key`'s range (a key not live: nothing). It stays out of reach while it is among
    /// the `rotate` most recently freed.
    pub fn release(&mut self, key: u64) {
        let Some((lo, hi)) = self.live.remove(&key) else {
            return;
        };
        self.no_fit = u64::MAX;
        self.uncover(lo, hi, true);
        let r = (lo, hi, key);
        if self.recent.len() >= self.rotate {
            if let Some(old) = self.recent.pop_front() {
                if let Ok(j) = self.blocked.binary_search(&old) {
                    self.blocked.remove(j);
                    self.uncover(old.0, old.1, false);
                }
            }
        }
        if self.rotate == 0 {
            if let Ok(j) = self.blocked.binary_search(&r) {
                self.blocked.remove(j);
                self.uncover(lo, hi, false);
            }
        } else {
            self.recent.push_back(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psum_tiles_share_banks_without_straddling() {
        let mut a = RangeAllocator::new(16384, 64, 2048, 8);
        let got: Vec<u64> = [1536, 1536, 512, 4096, 1024]
            .iter()
            .map(|&n| a.alloc(n).unwrap().1)
            .collect();
        assert_eq!(got, [0, 2048, 1536, 4096, 8192]);
    }

    #[test]
    fn freed_ranges_rotate_until_only_they_fit() {
        let mut a = RangeAllocator::new(256, 64, 0, 2);
        let (k0, s0) = a.alloc(64).unwrap();
        a.release(k0);
        let (k1, s1) = a.alloc(64).unwrap(); // not the range just freed
        assert_eq!((s0, s1), (0, 64));
        a.release(k1);
        let (_, s2) = a.alloc(64).unwrap();
        assert_eq!(s2, 128);
        let (_, s3) = a.alloc(64).unwrap();
        assert_eq!(s3, 192);
        // full but for the two recently freed ranges: they are used
        let (_, s4) = a.alloc(64).unwrap();
        assert_eq!(s4, 0);
        assert!(a.alloc(128).is_none());
    }

    #[test]
    fn a_refused_size_is_refused_until_a_release_and_smaller_ones_still_fit() {
        let mut a = RangeAllocator::new(512, 64, 0, 2);
        let keys: Vec<u64> = (0..3).map(|_| a.alloc(128).unwrap().0).collect();
        assert!(a.alloc(192).is_none());
        assert!(a.alloc(256).is_none()); // larger: refused by the memo
        assert_eq!(a.alloc(64).unwrap().1, 384); // smaller: still placed
        assert!(a.alloc(128).is_none());
        a.release(keys[1]); // 128..256 free again (recently freed: used only when nothing else fits)
        assert_eq!(a.alloc(128).unwrap().1, 128);
        a.release(keys[0]);
        a.release(keys[2]);
        assert!(a.alloc(320).is_none()); // 0..128 and 256..384 free, no 320-byte gap
        assert_eq!(a.alloc(128).unwrap().1, 0);
    }

    /// The policy stated plainly: the lowest legal start clear of every range in `ranges`.
    fn lowest_start(a: &RangeAllocator, nbytes: u64, ranges: &[(u64, u64)]) -> Option<u64> {
        let starts = std::iter::once(0).chain(ranges.iter().map(|r| r.1));
        starts
            .filter_map(|c| a.start(c, nbytes))
            .filter(|&s| {
                s + nbytes <= a.capacity
                    && ranges.iter().all(|&(lo, hi)| hi <= s || s + nbytes <= lo)
            })
            .min()
    }

    #[test]
    fn first_fit_with_rotation_matches_the_policy_stated_plainly() {
        for (capacity, bank, rotate) in [(4096, 0, 8), (16384, 2048, 8), (4096, 0, 2), (2048, 0, 0)]
        {
            let mut a = RangeAllocator::new(capacity, 64, bank, rotate);
            let mut live: Vec<(u64, u64, u64)> = Vec::new(); // (lo, hi, key)
            let mut recent: VecDeque<(u64, u64)> = VecDeque::new();
            let mut x: u64 = 12345;
            for step in 0..6000 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = x >> 33;
                if r.is_multiple_of(23) {
                    // an explicit range, now and then off the alignment or empty
                    let n = (r >> 5) % 300;
                    let lo = (r >> 14) % (capacity - n + 1);
                    let lo = if r.is_multiple_of(2) {
                        lo / 64 * 64
                    } else {
                        lo
                    };
                    let key = a.place(lo, n).unwrap();
                    live.push((lo, lo + n, key));
                } else if r % 5 < 3 || live.is_empty() {
                    let n = 1 + (r >> 3) % 700;
                    let all: Vec<(u64, u64)> = live
                        .iter()
                        .map(|l| (l.0, l.1))
                        .chain(recent.iter().copied())
                        .collect();
                    let only_live: Vec<(u64, u64)> = live.iter().map(|l| (l.0, l.1)).collect();
                    let want =
                        lowest_start(&a, n, &all).or_else(|| lowest_start(&a, n, &only_live));
                    let got = a.alloc(n);
                    assert_eq!(got.map(|g| g.1), want, "step {step}: alloc({n})");
                    if let Some((key, s)) = got {
                        live.push((s, s + n, key));
                    }
                } else {
                    let (lo, hi, key) = live.swap_remove((r >> 3) as usize % live.len());
                    a.release(key);
                    if rotate > 0 {
                        if recent.len() >= rotate {
                            recent.pop_front();
                        }
                        recent.push_back((lo, hi));
                    }
                }
            }
        }
    }

    #[test]
    fn placed_ranges_are_avoided_and_released_keys_once() {
        let mut a = RangeAllocator::new(1024, 64, 0, 0);
        let k = a.place(0, 100).unwrap();
        assert_eq!(a.alloc(10).unwrap().1, 128);
        a.release(k);
        a.release(k);
        assert_eq!(a.alloc(10).unwrap().1, 0);
    }

    #[test]
    fn ranges_past_the_capacity_or_u64_are_refused() {
        let mut a = RangeAllocator::new(1024, 64, 2048, 2);
        assert_eq!(
            a.place(1000, 25).unwrap_err().rule,
            "tile_address_out_of_range"
        );
        assert_eq!(
            a.place(u64::MAX, 2).unwrap_err().rule,
            "tile_address_out_of_range"
        );
        assert!(a.place(1000, 24).is_ok()); // ends exactly at the capacity
        assert!(a.alloc(1025).is_none());
        assert!(a.alloc(u64::MAX).is_none());
        let mut b = RangeAllocator::new(u64::MAX, u64::MAX / 2 + 1, 0, 0);
        assert_eq!(b.alloc(1).unwrap().1, 0);
        assert!(b.alloc(u64::MAX / 2 + 2).is_none()); // its start would round past u64
    }
}
