//! Large HBM <-> on-chip row copies on the host threads (`par`): the copy is listed first as
//! raw pieces (one per HBM page a row crosses), grouped by row, then the rows run on any
//! thread. Every destination byte is written by one piece, so the bytes never depend on the
//! thread count.

/// `n` bytes from `src` to `dst`; a null `src` is a never-written HBM page (zeros).
pub struct Piece {
    pub src: *const u8,
    pub dst: *mut u8,
    pub n: usize,
}

// SAFETY: pieces are only built (onchip.rs `copy_dense_hbm_par`, hbm.rs `read` / `write` /
// `zero`) over validated, disjoint destination ranges and sources that outlive `run`.
unsafe impl Send for Piece {}
// SAFETY: as above.
unsafe impl Sync for Piece {}

/// Copy row `r`'s pieces (`pieces[ends[r - 1]..ends[r]]`) for every row, rows split over the
/// host threads when `work` makes it worthwhile (`par::for_each_index`).
///
/// # Safety
/// Every piece's source is readable and its destination writable for `n` bytes for the
/// whole call, no destination overlaps another piece's destination or any source.
pub unsafe fn run(pieces: &[Piece], ends: &[usize], work: usize) {
    crate::par::for_each_index(ends.len(), work, |r| {
        let lo = if r == 0 { 0 } else { ends[r - 1] };
        for p in &pieces[lo..ends[r]] {
            // SAFETY: the caller's contract above.
            unsafe {
                if p.src.is_null() {
                    std::ptr::write_bytes(p.dst, 0, p.n)
                } else {
                    std::ptr::copy_nonoverlapping(p.src, p.dst, p.n)
                }
            }
        }
    });
}
