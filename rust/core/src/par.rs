//! Host threads for data-parallel instruction kernels.
//!
//! One rayon pool, private to this crate (never rayon's global pool), built lazily with the
//! configured thread count. The pool remembers the process id that built it: after `fork()`
//! the child has none of the parent's worker threads, so the first parallel call in the child
//! abandons (leaks) the inherited pool object and builds a fresh one. Work is always split
//! into the same fixed chunks whatever the thread count, and every output element is computed
//! by one thread with the same sequence of operations, so results never depend on it.
//!
//! Thread count: `set_num_threads(n)` (0 = default); the default is `TRN3EMU_NUM_THREADS` if
//! set to a positive integer, else the host's available parallelism.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Thread count requested by `set_num_threads` (0: not set, use the default).
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

struct Pool {
    pid: u32,
    threads: usize,
    pool: Arc<rayon::ThreadPool>,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

/// The default thread count: `TRN3EMU_NUM_THREADS`, else one. Threads are opt-in because a
/// NeuronCore instruction is small (a 128x128x512 matmul is ~0.1 ms on one host core): on the
/// 2-core host we measure on, waking the pool once per instruction cost more than it saved for
/// kernels made of such tiles (flash attention seq 4096: 0.13 s on 1 thread, 0.19 s on 2).
fn default_threads() -> usize {
    std::env::var("TRN3EMU_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
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

/// The pool for `threads` workers in this process, (re)built when missing, stale after a
/// fork, or sized differently. `None` when building fails (the caller then runs inline).
fn pool(threads: usize) -> Option<Arc<rayon::ThreadPool>> {
    let pid = std::process::id();
    // A poisoned lock only means a panic elsewhere while holding it; the state stays valid.
    let mut g = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = g.as_ref() {
        if p.pid == pid && p.threads == threads {
            return Some(p.pool.clone());
        }
        if p.pid != pid {
            // Forked child: the parent's workers do not exist here; dropping the pool would
            // try to talk to them, so leak it.
            if let Some(old) = g.take() {
                std::mem::forget(old);
            }
        }
    }
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("trn3emu-{i}"))
        .build()
        .ok()?;
    let pool = Arc::new(built);
    *g = Some(Pool {
        pid,
        threads,
        pool: pool.clone(),
    });
    Some(pool)
}

/// Run `f(i)` for every `i in 0..n`, in parallel when more than one thread is configured and
/// `work` (a rough count of arithmetic operations) makes it worth waking the pool. Each index
/// runs exactly once; the order between indices is unspecified, so `f` must write disjoint
/// outputs (it gets only shared access; use `for_each_chunk_mut` for a split output slice).
pub fn for_each_index(n: usize, work: usize, f: impl Fn(usize) + Sync + Send) {
    let threads = num_threads();
    if threads <= 1 || n <= 1 || work < MIN_PARALLEL_WORK {
        (0..n).for_each(f);
        return;
    }
    match pool(threads) {
        Some(p) => p.install(|| {
            use rayon::prelude::*;
            (0..n).into_par_iter().for_each(f)
        }),
        None => (0..n).for_each(f),
    }
}

/// Run `f` on a pool thread when more than one thread is configured and `work` warrants it
/// (else inline), so that the parallel loops inside it (the helpers below) split work among
/// threads that are already awake: one wake-up per kernel instead of one per loop.
pub fn install<R: Send>(work: usize, f: impl FnOnce() -> R + Send) -> R {
    let threads = num_threads();
    if threads <= 1 || work < MIN_PARALLEL_WORK {
        return f();
    }
    match pool(threads) {
        Some(p) => p.install(f),
        None => f(),
    }
}

/// Run a whole device run on a pool thread when threads are on, so the per-instruction splits
/// below start on the running thread and only the extra halves wait for a woken worker (from
/// outside the pool every split would also park and wake the caller).
pub fn run_in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let threads = num_threads();
    if threads <= 1 {
        return f();
    }
    match pool(threads) {
        Some(p) => p.install(f),
        None => f(),
    }
}

/// Below this many operations a parallel call costs more than it saves (pool wake-up is a few
/// microseconds).
pub const MIN_PARALLEL_WORK: usize = 1 << 16;

/// Split `data` into consecutive chunks of `chunk` elements (the last may be shorter) and run
/// `f(chunk_index, chunk)` on each, in parallel when worthwhile (see `for_each_index`).
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    chunk: usize,
    work: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let chunk = chunk.max(1);
    let threads = num_threads();
    let n = data.len().div_ceil(chunk);
    if threads <= 1 || n <= 1 || work < MIN_PARALLEL_WORK {
        data.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
        return;
    }
    match pool(threads) {
        Some(p) => p.install(|| {
            use rayon::prelude::*;
            data.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| f(i, c))
        }),
        None => data
            .chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c)),
    }
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
    let threads = num_threads();
    let n = a.len().div_ceil(ca).min(b.len().div_ceil(cb));
    let serial = |a: &mut [A], b: &mut [B]| {
        for (i, (x, y)) in a.chunks_mut(ca).zip(b.chunks_mut(cb)).enumerate() {
            f(i, x, y)
        }
    };
    if threads <= 1 || n <= 1 || work < MIN_PARALLEL_WORK {
        serial(a, b);
        return;
    }
    match pool(threads) {
        Some(p) => p.install(|| {
            use rayon::prelude::*;
            a.par_chunks_mut(ca)
                .zip(b.par_chunks_mut(cb))
                .enumerate()
                .for_each(|(i, (x, y))| f(i, x, y))
        }),
        None => serial(a, b),
    }
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
            install(usize::MAX, || {
                for_each_index(37, usize::MAX, |i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                })
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
