//! Row geometry of a static access pattern, for the streaming data paths: a row is a sequence
//! of *segments*, each `inner` elements `istep` apart. Free dims that continue each other
//! (`outer.step == inner.step * inner.num`) are folded first, so a dense row is one segment and
//! a plain slice of memory.

use super::ap::{Ap, DynKind, MAX_FREE_DIMS};

#[derive(Clone, Debug)]
pub struct RowGeom {
    /// Elements per segment (the folded innermost dims).
    pub inner: usize,
    /// Element step inside a segment.
    pub istep: i64,
    /// Outer dims (outer to inner) that select the segment: (step, count).
    outer: [(i64, usize); 3],
    nouter: usize,
    /// Elements per row.
    pub free: usize,
}

impl RowGeom {
    /// `None` for patterns whose offsets are data (resolved indirection).
    pub fn new(ap: &Ap) -> Option<RowGeom> {
        if ap
            .dynamic
            .as_deref()
            .is_some_and(|d| d.kind == DynKind::Columns)
        {
            return None;
        }
        if ap.dims.len() > MAX_FREE_DIMS {
            return None;
        }
        // Drop unit dims, then fold from the innermost outwards (no allocation: at most 4 dims).
        let mut buf = [(0i64, 0usize); MAX_FREE_DIMS];
        let mut nd = 0;
        for d in ap.dims.iter().filter(|d| d.1 != 1) {
            buf[nd] = (d.0, d.1 as usize);
            nd += 1;
        }
        let dims = &buf[..nd];
        let Some(&(mut istep, mut inner)) = dims.last() else {
            return Some(RowGeom {
                inner: 1,
                istep: 1,
                outer: [(0, 1); 3],
                nouter: 0,
                free: 1,
            });
        };
        let mut rest = &dims[..dims.len() - 1];
        while let Some(&(s, n)) = rest.last() {
            if s != istep * inner as i64 {
                break;
            }
            inner *= n;
            rest = &rest[..rest.len() - 1];
        }
        if rest.len() > 3 {
            return None;
        }
        let mut outer = [(0i64, 1usize); 3];
        for (o, d) in outer.iter_mut().zip(rest) {
            *o = *d;
        }
        if inner == 1 {
            istep = 1;
        }
        Some(RowGeom {
            inner,
            istep,
            outer,
            nouter: rest.len(),
            free: ap.free_size(),
        })
    }

    /// True when a row is one dense run.
    pub fn is_dense(&self) -> bool {
        self.nouter == 0 && self.istep == 1
    }

    /// Element offset of segment `s` from the row start.
    #[inline]
    fn seg_offset(&self, mut s: usize) -> i64 {
        let mut off = 0i64;
        for &(step, n) in self.outer[..self.nouter].iter().rev() {
            off += (s % n) as i64 * step;
            s /= n;
        }
        off
    }

    /// Call `f(element offset, step, position in the chunk, count)` for the runs covering the
    /// row's logical elements `j0..j1`, in order.
    #[inline]
    pub fn runs(&self, j0: usize, j1: usize, mut f: impl FnMut(i64, i64, usize, usize)) {
        let mut j = j0;
        while j < j1 {
            let (s, k) = (j / self.inner, j % self.inner);
            let n = (self.inner - k).min(j1 - j);
            f(
                self.seg_offset(s) + k as i64 * self.istep,
                self.istep,
                j - j0,
                n,
            );
            j += n;
        }
    }
}
