//! Software prefetch of the next rows of a row-by-row copy or map. On-chip partitions lie a
//! partition apart in host memory (192 KiB for SBUF), so every row of a tile is in its own
//! 4 KiB page, where the hardware prefetchers do not follow: each short row (a 256-byte row
//! of a [128, 128] bf16 tile is four cache lines) started with a demand miss. Asking for the
//! row a few ahead lets those misses overlap. A hint only: no effect on any result.

/// Rows ahead of the one being processed that are asked for.
pub const AHEAD: usize = 2;

/// Ask for the cache lines of `bytes` (no-op off x86-64).
#[inline(always)]
pub fn lines(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = bytes.as_ptr();
        let mut at = 0;
        while at < bytes.len() {
            // SAFETY: `p + at` lies inside `bytes`; a prefetch never faults or changes memory.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(at).cast()) };
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}
