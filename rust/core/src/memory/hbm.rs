//! HBM: the full 144 GiB address space, backed sparsely by 1 MiB pages allocated on first write.
//! Reads of never-written bytes return zeros.

use super::HBM_BYTES;

const PAGE_BITS: u32 = 20;
const PAGE: usize = 1 << PAGE_BITS;

/// The part of a byte range inside one page: `n` bytes at `off` in `page`, which are bytes
/// `at..at + n` of the range.
struct Span {
    page: usize,
    off: usize,
    at: usize,
    n: usize,
}

/// The pages a range of `len` bytes at `addr` covers, in order.
fn spans(addr: u64, len: usize) -> impl Iterator<Item = Span> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at >= len {
            return None;
        }
        let a = addr + at as u64;
        let off = (a as usize) & (PAGE - 1);
        let n = (PAGE - off).min(len - at);
        let s = Span {
            page: (a >> PAGE_BITS) as usize,
            off,
            at,
            n,
        };
        at += n;
        Some(s)
    })
}

/// A zeroed 1 MiB page from the global allocator (as `vec![0u8; PAGE]`, whose recycling of freed
/// pages keeps a many-chip run's resident memory down), or `None` if the host refuses it.
fn try_zeroed_page() -> Option<Box<[u8]>> {
    let layout = std::alloc::Layout::array::<u8>(PAGE).ok()?;
    // SAFETY: the layout has a non-zero size; a non-null result points to PAGE zeroed bytes
    // allocated by the global allocator with the layout `Box<[u8]>` frees them with.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout);
        (!p.is_null()).then(|| Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, PAGE)))
    }
}

pub struct Hbm {
    pages: Vec<Option<Box<[u8]>>>,
    /// Pages backed (`Some`), kept so that `resident_bytes` is O(1) (a run checks it often).
    backed: u64,
    /// A write could not back a page (the host refused the memory): its bytes were dropped.
    /// `take_alloc_failure` turns it into an error (a run's, or `try_write`'s).
    alloc_failed: bool,
}

impl Default for Hbm {
    fn default() -> Self {
        Self::new()
    }
}

impl Hbm {
    pub fn new() -> Self {
        let n = (HBM_BYTES >> PAGE_BITS) as usize;
        Hbm {
            pages: (0..n).map(|_| None).collect(),
            backed: 0,
            alloc_failed: false,
        }
    }

    /// `new`, or a `Resource` error (rule `host_allocation_failed`) if the host cannot provide
    /// the page table (no abort).
    pub fn try_new() -> crate::error::Result<Self> {
        let n = (HBM_BYTES >> PAGE_BITS) as usize;
        let mut pages = Vec::new();
        pages.try_reserve_exact(n).map_err(|_| {
            crate::error::fail(
                crate::error::ErrorKind::Resource,
                "host_allocation_failed",
                "cannot allocate host memory for HBM's page table",
            )
        })?;
        pages.resize_with(n, || None);
        Ok(Hbm {
            pages,
            backed: 0,
            alloc_failed: false,
        })
    }

    /// An HBM without address space (every access is out of range, a panic): what an
    /// instruction without HBM operands executes with away from the device's HBM
    /// (machine/parallel.rs). Costs no host memory.
    pub fn detached() -> Self {
        Hbm {
            pages: Vec::new(),
            backed: 0,
            alloc_failed: false,
        }
    }

    /// Host bytes actually backing HBM.
    pub fn resident_bytes(&self) -> u64 {
        self.backed * PAGE as u64
    }

    /// Copy `out.len()` bytes starting at `addr` (caller has bounds-checked).
    pub fn read(&self, addr: u64, out: &mut [u8]) {
        for Span { page, off, at, n } in spans(addr, out.len()) {
            match &self.pages[page] {
                Some(p) => out[at..at + n].copy_from_slice(&p[off..off + n]),
                None => out[at..at + n].fill(0),
            }
        }
    }

    /// Ask for the cache lines of `len` bytes at `addr` if that is a short row
    /// (`kernels::simd::prefetch_short_row`; caller has bounds-checked). Pages never written
    /// hold no bytes to ask for.
    #[inline]
    pub fn prefetch(&self, addr: u64, len: usize) {
        if len > crate::kernels::simd::PREFETCH_SHORT_ROW {
            return;
        }
        for Span { page, off, n, .. } in spans(addr, len) {
            if let Some(p) = &self.pages[page] {
                crate::kernels::simd::prefetch(&p[off..off + n]);
            }
        }
    }

    /// Whether the bytes at `addr` equal `data` (caller has bounds-checked).
    pub fn equals(&self, addr: u64, data: &[u8]) -> bool {
        spans(addr, data.len()).all(|Span { page, off, at, n }| {
            let want = &data[at..at + n];
            match &self.pages[page] {
                Some(p) => p[off..off + n] == *want,
                None => want.iter().all(|b| *b == 0),
            }
        })
    }

    /// Write `data` at `addr` (caller has bounds-checked). If the host cannot provide a new
    /// page, the bytes for it are dropped and the failure is kept for `take_alloc_failure`
    /// (a run reports it as its error): never an abort.
    pub fn write(&mut self, addr: u64, data: &[u8]) {
        for Span { page, off, at, n } in spans(addr, data.len()) {
            let slot = &mut self.pages[page];
            if slot.is_none() {
                let Some(fresh) = try_zeroed_page() else {
                    self.alloc_failed = true;
                    continue;
                };
                *slot = Some(fresh);
                self.backed += 1;
            }
            if let Some(p) = slot {
                p[off..off + n].copy_from_slice(&data[at..at + n]);
            }
        }
    }

    /// `write`, or a `Resource` error (rule `host_allocation_failed`) if a page could not be
    /// backed.
    pub fn try_write(&mut self, addr: u64, data: &[u8]) -> crate::error::Result<()> {
        self.write(addr, data);
        self.take_alloc_failure()
    }

    /// Whether a write since the last `take_alloc_failure` dropped bytes for want of a page.
    pub fn alloc_failed(&self) -> bool {
        self.alloc_failed
    }

    /// A `Resource` error (rule `host_allocation_failed`) if a write since the last call could
    /// not back a page; clears the failure.
    pub fn take_alloc_failure(&mut self) -> crate::error::Result<()> {
        if !std::mem::take(&mut self.alloc_failed) {
            return Ok(());
        }
        Err(crate::error::fail(
            crate::error::ErrorKind::Resource,
            "host_allocation_failed",
            format!(
                "cannot allocate host memory for a 1 MiB page of HBM ({} bytes backed so far); the write was not completed",
                self.resident_bytes()
            ),
        ))
    }

    /// Zero `n` bytes at `addr` (caller has bounds-checked). Pages never written stay unbacked;
    /// backed ones are kept (a launch that reuses the range would fault fresh pages in again).
    pub fn zero(&mut self, addr: u64, n: u64) {
        for Span { page, off, n, .. } in spans(addr, n as usize) {
            if let Some(p) = &mut self.pages[page] {
                p[off..off + n].fill(0);
            }
        }
    }

    /// Drop every page (back to all zeros).
    pub fn clear(&mut self) {
        for p in &mut self.pages {
            *p = None;
        }
        self.backed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_and_straddling() {
        let mut h = Hbm::new();
        let addr = (100u64 << 30) + PAGE as u64 - 3;
        h.write(addr, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(h.resident_bytes(), 2 * PAGE as u64);
        let mut out = [9u8; 8];
        h.read(addr - 1, &mut out);
        assert_eq!(out, [0, 1, 2, 3, 4, 5, 6, 0]);
        assert!(h.equals(addr - 1, &[0, 1, 2, 3, 4, 5, 6, 0]));
        assert!(!h.equals(addr - 1, &[0, 1, 2, 3, 4, 5, 7, 0]));
        assert!(h.equals(1 << 30, &[0; 100]) && !h.equals(1 << 30, &[0, 1]));
        h.zero(addr + 1, 2);
        h.read(addr - 1, &mut out);
        assert_eq!(out, [0, 1, 0, 0, 4, 5, 6, 0]);
        let big = 5u64 << 30;
        h.write(big, &vec![7u8; 3 * PAGE]);
        h.zero(big + 1, 3 * PAGE as u64 - 2);
        h.zero(big + 64 * PAGE as u64, 10); // never written: stays unbacked
        assert_eq!(h.resident_bytes(), 5 * PAGE as u64);
        let mut all = vec![1u8; 3 * PAGE];
        h.read(big, &mut all);
        assert!(
            all[0] == 7 && all[3 * PAGE - 1] == 7 && all[1..3 * PAGE - 1].iter().all(|b| *b == 0)
        );
    }
}
