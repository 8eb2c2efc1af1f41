//! SBUF and PSUM of one core: `PARTITIONS` rows of `part_bytes`, partition-major.
//!
//! Partitions sit `stride` = `part_bytes + PAD` bytes apart in host memory: with a power-of-two
//! stride every partition's byte k falls into the same cache set, so a column access (a [128, 1]
//! tile) would miss L1 and L2 on every element. The padding is host layout only; use
//! `partition(p)` (or `stride()` for absolute offsets), never `p * part_bytes`.

use super::{Ap, Mem, PARTITIONS, PSUM_PART_BYTES, SBUF_PART_BYTES};
use crate::memory::hbm::Hbm;

/// Host bytes between consecutive partitions beyond `part_bytes`: one page and one cache line.
/// The cache line spreads a column over the L1 sets (and off 4 KiB store/load aliasing); the
/// page also separates partitions `r` and `r + 64` (same low 12 bits) in the upper address
/// bits, which AMD Zen 3 evidently needs (its L1 way predictor tags lines by a hash of them):
/// with a 64-byte pad a [128, 1] column ran 8x slower there (a C loop of 128 rows: 573 against 68 ns; pads of 0 and 2048 worse still).
const PAD: usize = 4096 + 64;

pub struct OnChip {
    pub part_bytes: usize,
    stride: usize,
    data: super::zeroed::ZeroBuf,
    /// What is known of the bytes: every byte outside `dirty` is `base`, so refilling with
    /// `base` rewrites only `dirty`. Resetting a device between kernel launches refills all 8
    /// cores, and most launches touch one core and a small part of each partition.
    base: u8,
    /// Partition-offset byte range `lo..hi` (in every partition) that may differ from `base`.
    dirty: (usize, usize),
    /// While a run executes: the partition-offset byte range its instructions may write (the
    /// union of their written operands here), or `None` (unknown: a mutable view dirties all).
    window: Option<(usize, usize)>,
}

impl OnChip {
    pub fn new(part_bytes: usize) -> Self {
        let stride = part_bytes + PAD;
        OnChip {
            part_bytes,
            stride,
            data: super::zeroed::ZeroBuf::new(stride * PARTITIONS),
            base: 0,
            dirty: (0, 0),
            window: None,
        }
    }
    /// `new`, or a `Resource` error (rule `host_allocation_failed`) if the host cannot provide
    /// the memory (e.g. under an `RLIMIT_AS` cap) instead of an abort.
    pub fn try_new(part_bytes: usize) -> crate::error::Result<Self> {
        let stride = part_bytes + PAD;
        let bytes = stride * PARTITIONS;
        let data = super::zeroed::ZeroBuf::try_new(bytes).ok_or_else(|| {
            crate::error::fail(
                crate::error::ErrorKind::Resource,
                "host_allocation_failed",
                format!("cannot allocate {bytes} bytes of host memory for a core's on-chip memory"),
            )
        })?;
        Ok(OnChip {
            part_bytes,
            stride,
            data,
            base: 0,
            dirty: (0, 0),
            window: None,
        })
    }
    /// Host bytes from one partition's start to the next's.
    #[inline]
    pub fn stride(&self) -> usize {
        self.stride
    }
    /// The `part_bytes` bytes of partition `p`.
    #[inline]
    pub fn partition(&self, p: usize) -> &[u8] {
        &self.data[p * self.stride..p * self.stride + self.part_bytes]
    }
    #[inline]
    pub fn partition_mut(&mut self, p: usize) -> &mut [u8] {
        self.touch();
        &mut self.data[p * self.stride..p * self.stride + self.part_bytes]
    }
    /// The whole host buffer (partition p at `p * stride()`), for run lists with absolute offsets.
    #[inline]
    pub fn raw(&self) -> &[u8] {
        &self.data
    }
    #[inline]
    pub fn raw_mut(&mut self) -> &mut [u8] {
        self.touch();
        &mut self.data
    }
    /// A mutable view is handed out: the bytes it may change join `dirty`.
    #[inline]
    fn touch(&mut self) {
        // An empty declared window that still gets a mutable view: trust nothing.
        let (lo, hi) = match self.window {
            Some((lo, hi)) if lo < hi => (lo, hi),
            _ => (0, self.part_bytes),
        };
        self.dirty = if self.dirty.0 >= self.dirty.1 {
            (lo, hi)
        } else {
            (self.dirty.0.min(lo), self.dirty.1.max(hi))
        };
    }
    /// Declare (`Some`) or clear the partition-offset byte range the instructions about to run
    /// may write here (a run sets it from its programs' written operands; machine/mod.rs).
    pub fn set_write_window(&mut self, window: Option<(usize, usize)>) {
        self.window = window.map(|(lo, hi)| (lo.min(self.part_bytes), hi.min(self.part_bytes)));
    }
    pub fn sbuf() -> Self {
        Self::new(SBUF_PART_BYTES)
    }
    pub fn psum() -> Self {
        Self::new(PSUM_PART_BYTES)
    }
    /// Set every byte to `byte` (only the dirty range when the others are `byte` already).
    pub fn fill(&mut self, byte: u8) {
        let (lo, hi) = self.dirty;
        if byte != self.base {
            self.data.fill(byte);
        } else if lo < hi {
            for p in 0..PARTITIONS {
                self.data[p * self.stride + lo..p * self.stride + hi].fill(byte);
            }
        }
        self.base = byte;
        self.dirty = (0, 0);
    }
}

/// Mutable view of the memories one instruction of one core can reach.
pub struct Mems<'a> {
    pub sbuf: &'a mut OnChip,
    pub psum: &'a mut OnChip,
    pub hbm: &'a mut Hbm,
}

impl Mems<'_> {
    fn onchip(&self, m: Mem) -> &OnChip {
        match m {
            Mem::Sbuf => self.sbuf,
            _ => self.psum,
        }
    }

    /// Read the elements of a (validated) AP in logical order as packed little-endian bytes.
    pub fn gather(&self, ap: &Ap) -> Vec<u8> {
        let mut out = vec![0u8; ap.parts as usize * ap.free_size() * ap.dtype.size()];
        let offs = if ap.is_row_contiguous() {
            Vec::new()
        } else {
            ap.row_offsets()
        };
        self.gather_into(ap, &offs, &mut out);
        out
    }

    /// `gather` whose buffer may fail to allocate (a `Resource` error, not an abort): for
    /// patterns whose size is not bounded by on-chip memory (HBM to HBM transfers, where step-0
    /// patterns can name far more elements than they touch).
    pub fn try_gather(&self, ap: &Ap) -> crate::error::Result<Vec<u8>> {
        let n = (ap.parts as usize)
            .saturating_mul(ap.free_size())
            .saturating_mul(ap.dtype.size());
        let mut out = crate::error::try_vec(n, 0u8, "a DMA staging buffer")?;
        let offs = try_offsets(ap)?;
        self.gather_into(ap, &offs, &mut out);
        Ok(out)
    }

    /// `offs`: the row offsets of a pattern that is not row-contiguous (else empty).
    fn gather_into(&self, ap: &Ap, offs: &[i64], out: &mut [u8]) {
        let es = ap.dtype.size();
        let f = ap.free_size();
        let contiguous = ap.is_row_contiguous();
        for r in 0..ap.parts {
            let dst = &mut out[r as usize * f * es..(r as usize + 1) * f * es];
            match ap.mem {
                Mem::Hbm => {
                    let base = ap.row_base(r) as u64;
                    if contiguous {
                        self.hbm.read(base, dst);
                    } else {
                        for (i, o) in offs.iter().enumerate() {
                            self.hbm.read(
                                (base as i128 + *o as i128 * es as i128) as u64,
                                &mut dst[i * es..(i + 1) * es],
                            );
                        }
                    }
                }
                m => {
                    let part = self.onchip(m).partition((ap.start + r) as usize);
                    let base = ap.offset as usize;
                    if contiguous {
                        dst.copy_from_slice(&part[base..base + f * es]);
                    } else {
                        for (i, o) in offs.iter().enumerate() {
                            let a = (base as i64 + o * es as i64) as usize;
                            dst[i * es..(i + 1) * es].copy_from_slice(&part[a..a + es]);
                        }
                    }
                }
            }
        }
    }

    /// Same-dtype copy between HBM and on-chip memory when both patterns have dense rows:
    /// each row moves as one slice, with no staging buffer (the two memories cannot overlap).
    /// False (nothing done) for other shapes.
    pub fn copy_dense_hbm(&mut self, dst: &Ap, src: &Ap) -> bool {
        let dense = |a: &Ap| a.dynamic.is_none() && a.is_row_contiguous();
        if dst.dtype != src.dtype
            || dst.parts != src.parts
            || !dense(dst)
            || !dense(src)
            || (dst.mem == Mem::Hbm) == (src.mem == Mem::Hbm)
        {
            return false;
        }
        let n = src.free_size() * src.dtype.size();
        if n != dst.free_size() * dst.dtype.size() {
            return false;
        }
        let work = (n * src.parts as usize).saturating_mul(crate::par::STREAM_WORK_PER_BYTE);
        if crate::par::would_split(src.parts as usize, work)
            && self.copy_dense_hbm_par(dst, src, n, work)
        {
            return true;
        }
        let ahead = crate::kernels::simd::PREFETCH_ROWS_AHEAD as u32;
        for r in 0..src.parts {
            if r + ahead < src.parts {
                self.prefetch_row(dst, src, r + ahead, n);
            }
            if src.mem == Mem::Hbm {
                let base = src.row_base(r) as u64;
                let mem = match dst.mem {
                    Mem::Sbuf => &mut *self.sbuf,
                    _ => &mut *self.psum,
                };
                let o = dst.offset as usize;
                self.hbm.read(
                    base,
                    &mut mem.partition_mut((dst.start + r) as usize)[o..o + n],
                );
            } else {
                let base = dst.row_base(r) as u64;
                let o = src.offset as usize;
                let mem: &OnChip = match src.mem {
                    Mem::Sbuf => self.sbuf,
                    _ => self.psum,
                };
                let part = mem.partition((src.start + r) as usize);
                self.hbm.write(base, &part[o..o + n]);
            }
        }
        true
    }

    /// `copy_dense_hbm` with the rows on the host threads (`par_copy`): false (nothing done)
    /// when HBM destination rows overlap one another (the last row written would win), a
    /// page cannot be backed, or the on-chip rows fall outside the buffer.
    fn copy_dense_hbm_par(&mut self, dst: &Ap, src: &Ap, n: usize, work: usize) -> bool {
        use super::par_copy::{run, Piece};
        let parts = src.parts as usize;
        let (mut pieces, mut ends, mut tmp) = (Vec::new(), Vec::with_capacity(parts), Vec::new());
        if src.mem == Mem::Hbm {
            let mem = match dst.mem {
                Mem::Sbuf => &mut *self.sbuf,
                _ => &mut *self.psum,
            };
            let (stride, o, p0) = (mem.stride(), dst.offset as usize, dst.start as usize);
            let raw = mem.raw_mut();
            if (p0 + parts - 1) * stride + o + n > raw.len() {
                return false;
            }
            let base = raw.as_mut_ptr();
            for r in 0..parts {
                tmp.clear();
                self.hbm.pieces(src.row_base(r as u32) as u64, n, &mut tmp);
                // SAFETY: in bounds (checked above)
                let mut d = unsafe { base.add((p0 + r) * stride + o) };
                for &(p, k) in &tmp {
                    pieces.push(Piece {
                        src: p,
                        dst: d,
                        n: k,
                    });
                    // SAFETY: the row's pieces add up to its n bytes
                    d = unsafe { d.add(k) };
                }
                ends.push(pieces.len());
            }
        } else {
            let mut rows: Vec<u64> = (0..parts).map(|r| dst.row_base(r as u32) as u64).collect();
            rows.sort_unstable();
            if rows.windows(2).any(|w| w[1] < w[0] + n as u64) {
                return false;
            }
            let mem: &OnChip = match src.mem {
                Mem::Sbuf => self.sbuf,
                _ => self.psum,
            };
            let (stride, o, p0) = (mem.stride(), src.offset as usize, src.start as usize);
            let raw = mem.raw();
            if (p0 + parts - 1) * stride + o + n > raw.len() {
                return false;
            }
            let base = raw.as_ptr();
            let mut out = Vec::new();
            for r in 0..parts {
                out.clear();
                if !self
                    .hbm
                    .pieces_mut(dst.row_base(r as u32) as u64, n, &mut out)
                {
                    return false;
                }
                // SAFETY: in bounds (checked above)
                let mut s = unsafe { base.add((p0 + r) * stride + o) };
                for &(p, k) in &out {
                    pieces.push(Piece {
                        src: s,
                        dst: p,
                        n: k,
                    });
                    // SAFETY: the row's pieces add up to its n bytes
                    s = unsafe { s.add(k) };
                }
                ends.push(pieces.len());
            }
        }
        // SAFETY: sources and destinations lie in different memories (HBM and on-chip) that
        // stay borrowed for the call; destination rows are distinct partitions, or HBM rows
        // checked disjoint above, and each row's pieces cover disjoint bytes of it.
        unsafe { run(&pieces, &ends, work) };
        true
    }

    /// `copy_dense_hbm`'s row `r` (`n` bytes on each side) asked for ahead of its copy.
    #[inline]
    fn prefetch_row(&self, dst: &Ap, src: &Ap, r: u32, n: usize) {
        for (a, hbm) in [(src, src.mem == Mem::Hbm), (dst, dst.mem == Mem::Hbm)] {
            if hbm {
                self.hbm.prefetch(a.row_base(r) as u64, n);
            } else {
                let mem: &OnChip = if a.mem == Mem::Sbuf {
                    self.sbuf
                } else {
                    self.psum
                };
                let o = a.offset as usize;
                let part = mem.partition((a.start + r) as usize);
                crate::kernels::simd::prefetch_short_row(part.get(o..o + n).unwrap_or_default());
            }
        }
    }

    /// Write packed little-endian bytes to the elements of a (validated) AP in logical order.
    pub fn scatter(&mut self, ap: &Ap, data: &[u8]) {
        let offs = if ap.is_row_contiguous() {
            Vec::new()
        } else {
            ap.row_offsets()
        };
        self.scatter_with(ap, &offs, data);
    }

    /// `scatter` whose offset list may fail to allocate (a `Resource` error, not an abort):
    /// for HBM patterns of DMAs, not bounded by on-chip memory.
    pub fn try_scatter(&mut self, ap: &Ap, data: &[u8]) -> crate::error::Result<()> {
        let offs = try_offsets(ap)?;
        self.scatter_with(ap, &offs, data);
        Ok(())
    }

    fn scatter_with(&mut self, ap: &Ap, offs: &[i64], data: &[u8]) {
        let es = ap.dtype.size();
        let f = ap.free_size();
        let contiguous = ap.is_row_contiguous();
        for r in 0..ap.parts {
            let src = &data[r as usize * f * es..(r as usize + 1) * f * es];
            match ap.mem {
                Mem::Hbm => {
                    let base = ap.row_base(r) as u64;
                    if contiguous {
                        self.hbm.write(base, src);
                    } else {
                        for (i, o) in offs.iter().enumerate() {
                            self.hbm.write(
                                (base as i128 + *o as i128 * es as i128) as u64,
                                &src[i * es..(i + 1) * es],
                            );
                        }
                    }
                }
                m => {
                    let mem = match m {
                        Mem::Sbuf => &mut *self.sbuf,
                        _ => &mut *self.psum,
                    };
                    let part = mem.partition_mut((ap.start + r) as usize);
                    let base = ap.offset as usize;
                    if contiguous {
                        part[base..base + f * es].copy_from_slice(src);
                    } else {
                        for (i, o) in offs.iter().enumerate() {
                            let a = (base as i64 + o * es as i64) as usize;
                            part[a..a + es].copy_from_slice(&src[i * es..(i + 1) * es]);
                        }
                    }
                }
            }
        }
    }
}

/// The row offsets of `ap` if it is not row-contiguous (else none), allocated fallibly.
fn try_offsets(ap: &Ap) -> crate::error::Result<Vec<i64>> {
    if ap.is_row_contiguous() {
        Ok(Vec::new())
    } else {
        ap.try_row_offsets()
    }
}

#[cfg(test)]
mod fill_tests {
    use super::*;

    #[test]
    fn refill_restores_bytes_written_through_any_mutable_view() {
        let mut m = OnChip::psum();
        m.fill(0xAB);
        m.partition_mut(5)[7] = 1;
        m.fill(0xAB);
        assert_eq!(m.partition(5)[7], 0xAB);
        let at = 9 * m.stride() + 3;
        m.raw_mut()[at] = 2;
        m.fill(0xAB);
        assert_eq!(m.partition(9)[3], 0xAB);
        m.fill(0);
        assert!((0..PARTITIONS).all(|p| m.partition(p).iter().all(|b| *b == 0)));
    }

    #[test]
    fn a_declared_window_limits_the_refill_and_an_empty_one_trusts_nothing() {
        let mut m = OnChip::psum();
        m.fill(0xAB);
        m.set_write_window(Some((100, 200)));
        m.partition_mut(3)[150] = 1;
        assert_eq!(m.dirty, (100, 200));
        m.set_write_window(Some((0, 0)));
        m.partition_mut(4)[9000] = 2;
        assert_eq!(m.dirty, (0, m.part_bytes));
        m.set_write_window(None);
        m.fill(0xAB);
        assert_eq!(m.dirty, (0, 0));
        assert!((0..PARTITIONS).all(|p| m.partition(p).iter().all(|b| *b == 0xAB)));
    }
}
