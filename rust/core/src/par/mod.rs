//! Host threads for data-parallel instruction kernels.
//!
//! One team of threads private to this crate (`team.rs`), built lazily with the configured
//! thread count. The team remembers the process id that built it: after `fork()` the child has
//! none of the parent's worker threads, so the first parallel call in the child abandons
//! (leaks) the inherited team and builds a fresh one. Work is always split into the same fixed
//! chunks whatever the thread count, and every output element is computed by one thread with
//! the same sequence of operations, so results never depend on it.
//!
//! Thread count: `set_num_threads(n)` (0 = default); the default is `TRN3EMU_NUM_THREADS` if
//! set to a positive integer, else one (read once, at the first call that needs it).

mod team;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use team::Team;

/// Thread count requested by `set_num_threads` (0: not set, use the default).
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

struct Built {
    pid: u32,
    team: Arc<Team>,
}

static TEAM: Mutex<Option<Built>> = Mutex::new(None);

/// The default thread count: `TRN3EMU_NUM_THREADS`, else one. Threads are opt-in: they only
/// pay off when the kernel's instructions are large enough to split, and a second thread spins
/// on its core for the whole of a run. Read once per process: `would_split` asks for the count
/// per instruction, and reading the environment (a lock and a `String`) cost ~0.4 µs each time
/// (4 % of a legacy RoPE kernel's first call, trace included: py-spy).
fn default_threads() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        std::env::var("TRN3EMU_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n > 0)
            .unwrap_or(1)
    })
}

/// Threads the kernels use (>= 1).
pub fn num_threads() -> usize {
    match REQUESTED.load(Ordering::Relaxed) {
        0 => default_threads(),
        n => n,
    }
}

/// Set the thread count for later runs (0 restores the default). Takes effect at the next
/// parallel call; results are the same bits for every count.
pub fn set_num_threads(n: usize) {
    REQUESTED.store(n, Ordering::Relaxed);
}

/// The team for the configured thread count in this process, (re)built when missing, stale
/// after a fork, or sized differently; `None` with one thread or when building fails (the
/// caller then runs inline).
fn team() -> Option<Arc<Team>> {
    let threads = num_threads();
    if threads <= 1 {
        return None;
    }
    let pid = std::process::id();
    // A poisoned lock only means a panic elsewhere while holding it; the state stays valid.
    let mut g = TEAM.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(b) = g.as_ref() {
        if b.pid == pid && b.team.workers + 1 == threads {
            return Some(b.team.clone());
        }
        if b.pid != pid {
            // Forked child: the parent's workers do not exist here and the team's locks may be
            // in any state, so leak it.
            if let Some(old) = g.take() {
                std::mem::forget(old);
            }
        }
    }
    let team = Arc::new(Team::new(threads - 1)?);
    *g = Some(Built {
        pid,
        team: team.clone(),
    });
    Some(team)
}

/// Run `f(i)` for every `i in 0..n`, in parallel when more than one thread is configured and
/// `work` (a rough count of arithmetic operations) makes it worth splitting. Each index runs
/// exactly once; the order between indices is unspecified, so `f` must write disjoint outputs
/// (it gets only shared access; use `for_each_chunk_mut` for a split output slice).
pub fn for_each_index(n: usize, work: usize, f: impl Fn(usize) + Sync + Send) {
    if !worth_splitting(n, work) {
        (0..n).for_each(f);
        return;
    }
    match team() {
        Some(t) => t.run(n, &f),
        None => (0..n).for_each(f),
    }
}

/// Run a whole device run with the team's workers kept awake between splits (they spin on
/// their cores until the run ends instead of parking after each instruction).
pub fn run_hot<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let _hot = team().map(|t| t.hot());
    f()
}

/// Below this many operations (of the whole instruction) a split costs more than it saves.
/// The team's own hand-off is ~1 us, but the halves a worker computes land in its core's
/// caches and the next instruction reads them from the other core: measured on the 2-core host
/// (flash attention seq 4096 at 2 threads), splitting 128x128x128 matmuls and [128, 512]
/// activations made the kernel 10-15 % slower than one thread, splitting only instructions of
/// this size and up (a 128x128x512 matmul is 2^24) made it 0-15 % faster.
pub const MIN_PARALLEL_WORK: usize = 1 << 23;

/// `work` per destination byte of a memory-bound pass (HBM <-> on-chip copies,
/// `memory::par_copy`; fp32 `tensor_scalar` / `tensor_tensor`): passes writing 1 MiB and up
/// split (a [128, 2048] fp32 tile; flash attention's [128, 512] tiles stay whole). That much
/// data leaves a core's L2 anyway, so the halves the other core wrote cost the next
/// instruction little more than one core's would.
pub const STREAM_WORK_PER_BYTE: usize = 8;

/// The split threshold in force: `MIN_PARALLEL_WORK`, or what `set_min_parallel_work` set
/// (tests lower it so that small instructions take the parallel paths too).
static MIN_WORK: AtomicUsize = AtomicUsize::new(MIN_PARALLEL_WORK);

/// Set the split threshold (0 restores `MIN_PARALLEL_WORK`). Changes speed only, never bits.
pub fn set_min_parallel_work(n: usize) {
    MIN_WORK.store(
        if n == 0 { MIN_PARALLEL_WORK } else { n },
        Ordering::Relaxed,
    );
}

fn worth_splitting(n: usize, work: usize) -> bool {
    n > 1 && work >= MIN_WORK.load(Ordering::Relaxed)
}

/// Whether `n` pieces of `work` operations in all would run on several threads (so a caller
/// with a faster single-thread path can keep the splittable one for those).
pub fn would_split(n: usize, work: usize) -> bool {
    num_threads() > 1 && worth_splitting(n, work)
}

/// A raw pointer that may cross threads: each index derives a disjoint sub-slice from it.
struct SendPtr<T>(*mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
unsafe impl<T: Send> Send for SendPtr<T> {}
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// Chunk `i` (`chunk` elements, the last shorter) of the `len`-element buffer.
    ///
    /// SAFETY: the caller hands each `i` to exactly one call while the buffer is borrowed
    /// mutably, so the chunks never alias.
    unsafe fn chunk<'a>(self, len: usize, chunk: usize, i: usize) -> &'a mut [T] {
        let lo = i * chunk;
        let hi = (lo + chunk).min(len);
        std::slice::from_raw_parts_mut(self.0.add(lo), hi - lo)
    }
}

/// Split `data` into consecutive chunks of `chunk` elements (the last may be shorter) and run
/// `f(chunk_index, chunk)` on each, in parallel when worthwhile (see `for_each_index`).
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    chunk: usize,
    work: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let chunk = chunk.max(1);
    let n = data.len().div_ceil(chunk);
    let team = if worth_splitting(n, work) {
        team()
    } else {
        None
    };
    let Some(t) = team else {
        data.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
        return;
    };
    let (len, base) = (data.len(), SendPtr(data.as_mut_ptr()));
    // SAFETY: every index in 0..n runs once, on disjoint chunks of `data`.
    t.run(n, &|i| f(i, unsafe { base.chunk(len, chunk, i) }));
}

/// Two buffers split in step: chunk i of `a` (`ca` elements) and chunk i of `b` (`cb`
/// elements) go to `f(i, a_i, b_i)` together (as many chunks as the shorter split has).
pub fn for_each_chunk_pair_mut<A: Send, B: Send>(
    a: &mut [A],
    ca: usize,
    b: &mut [B],
    cb: usize,
    work: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync + Send,
) {
    let (ca, cb) = (ca.max(1), cb.max(1));
    let n = a.len().div_ceil(ca).min(b.len().div_ceil(cb));
    let team = if worth_splitting(n, work) {
        team()
    } else {
        None
    };
    let Some(t) = team else {
        for (i, (x, y)) in a.chunks_mut(ca).zip(b.chunks_mut(cb)).enumerate() {
            f(i, x, y)
        }
        return;
    };
    let (la, pa) = (a.len(), SendPtr(a.as_mut_ptr()));
    let (lb, pb) = (b.len(), SendPtr(b.as_mut_ptr()));
    // SAFETY: every index in 0..n runs once, on disjoint chunks of `a` and of `b`.
    t.run(n, &|i| unsafe {
        f(i, pa.chunk(la, ca, i), pb.chunk(lb, cb, i))
    });
}

/// Rows of a row-major `[rows, row_len]` buffer, each handed to `f(row_index, row)`: the helper
/// engines use for per-partition work.
pub fn for_each_row<T: Send>(
    data: &mut [T],
    row_len: usize,
    work_per_row: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let rows = data.len() / row_len.max(1);
    for_each_chunk_mut(data, row_len, work_per_row.saturating_mul(rows), f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_everything_once_for_any_thread_count() {
        for t in [1, 2, 3] {
            set_num_threads(t);
            let mut v = vec![0u32; 1000];
            for_each_chunk_mut(&mut v, 7, usize::MAX, |i, c| {
                for (j, x) in c.iter_mut().enumerate() {
                    *x += (i * 7 + j) as u32;
                }
            });
            assert!(v.iter().enumerate().all(|(i, x)| *x == i as u32));
            let mut rows = vec![0u8; 12];
            for_each_row(&mut rows, 4, usize::MAX, |r, row| row.fill(r as u8));
            assert_eq!(rows, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
            let hits: Vec<std::sync::atomic::AtomicU32> = (0..37)
                .map(|_| std::sync::atomic::AtomicU32::new(0))
                .collect();
            for_each_index(37, usize::MAX, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            let (mut a, mut b) = (vec![0u16; 30], vec![0u32; 20]);
            for_each_chunk_pair_mut(&mut a, 3, &mut b, 2, usize::MAX, |i, x, y| {
                x.fill(i as u16);
                y.fill(i as u32);
            });
            assert!(a.iter().enumerate().all(|(j, x)| *x == (j / 3) as u16));
            assert!(b.iter().enumerate().all(|(j, y)| *y == (j / 2) as u32));
        }
        set_num_threads(0);
        assert!(num_threads() >= 1);
    }
}
