//! A zero-initialised byte buffer whose pages cost host memory only once touched.
//!
//! `vec![0u8; n]` asks the global allocator for zeroed memory; the Python extension's allocator
//! (mimalloc) may hand out recycled memory it must clear, touching every page. An UltraServer
//! holds 144 chips x 8 cores of 32 MiB SBUF: they must stay virtual until used. This buffer
//! takes its bytes from the system allocator's `alloc_zeroed`, which serves large blocks with
//! fresh zero pages from the OS (mmap) without writing them. (Alignment 16: the system
//! allocator's own, so `alloc_zeroed` is `calloc`; a larger one would allocate and then clear.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

pub struct ZeroBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: ZeroBuf owns its bytes exclusively, like a Vec<u8>.
unsafe impl Send for ZeroBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for ZeroBuf {}

impl ZeroBuf {
    /// `len` zero bytes (aborts like `vec!` if the host cannot provide them).
    pub fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len.max(1), 16).expect("buffer size overflows");
        Self::try_new(len).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
    }

    /// `len` zero bytes, or `None` if the host cannot provide them (no abort).
    pub fn try_new(len: usize) -> Option<Self> {
        if len == 0 {
            return Some(ZeroBuf {
                ptr: NonNull::dangling(),
                len,
            });
        }
        let layout = Layout::from_size_align(len, 16).ok()?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { System.alloc_zeroed(layout) };
        NonNull::new(p).map(|ptr| ZeroBuf { ptr, len })
    }
}

impl Drop for ZeroBuf {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        let layout = Layout::from_size_align(self.len, 16).expect("buffer size overflows");
        // SAFETY: allocated in `new` by System with this layout.
        unsafe { System.dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl Deref for ZeroBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for ZeroBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::ZeroBuf;

    #[test]
    fn zeroed_and_writable() {
        let mut b = ZeroBuf::new(1 << 20);
        assert!(b.iter().all(|x| *x == 0));
        b[12345] = 7;
        assert_eq!(b[12345], 7);
        assert_eq!(b.len(), 1 << 20);
        assert!(ZeroBuf::new(0).is_empty());
    }

    #[test]
    fn an_impossible_size_is_none_not_an_abort() {
        assert!(ZeroBuf::try_new(usize::MAX / 2).is_none());
        assert!(ZeroBuf::try_new(usize::MAX).is_none());
        assert_eq!(ZeroBuf::try_new(4096).map(|b| b.len()), Some(4096));
    }
}
