//! A small fork-join team of host threads that stay awake (spinning) while a device run is in
//! progress.
//!
//! A NeuronCore instruction is short (a 128x128x512 matmul is ~0.1 ms on one host core), and a
//! kernel issues thousands of them, each split a few times. A general pool that parks its
//! workers between splits pays a futex wake-up (several microseconds on a VM) per split; here
//! the workers spin while a run is "hot" (`Hot` guard) and only park after `SPIN` of idleness
//! or when no run is in progress, so a split costs an atomic store and a few cache misses.
//! Threads are opt-in (`TRN3EMU_NUM_THREADS`), so this spinning only happens when asked for.
//!
//! One job at a time per team: a job published while another runs (a second Python thread
//! driving another device) runs inline on its caller instead. Indices are claimed dynamically;
//! which thread runs an index never changes what it computes.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long an idle worker spins during a hot run before it parks.
const SPIN: Duration = Duration::from_millis(2);

thread_local! {
    /// Set while this thread runs an index of a job: nested splits then run inline.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// One published job: `f(i)` for every `i in 0..n`, claimed `grain` consecutive indices at a
/// time (one shared counter update per batch instead of per index).
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n: usize,
    grain: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job<'_> {
    /// Claim and run batches of indices until none are left.
    fn work(&self) {
        IN_JOB.with(|c| c.set(true));
        loop {
            let i0 = self.next.fetch_add(self.grain, Relaxed);
            if i0 >= self.n {
                break;
            }
            let i1 = (i0 + self.grain).min(self.n);
            for i in i0..i1 {
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| (self.f)(i))) {
                    let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(p);
                }
            }
            self.done.fetch_add(i1 - i0, Release);
        }
        IN_JOB.with(|c| c.set(false));
    }
}

struct Shared {
    /// The current job (type-erased `*const Job`), null between jobs.
    job: AtomicPtr<()>,
    /// Bumped once per published job.
    epoch: AtomicUsize,
    /// Workers that may hold a reference to the current job (see `run`).
    users: AtomicUsize,
    /// Nested `Hot` guards alive: workers spin instead of parking while > 0.
    hot: AtomicUsize,
    sleepers: AtomicUsize,
    quit: AtomicBool,
    /// One job at a time.
    submit: Mutex<()>,
    park: Mutex<()>,
    wake: Condvar,
}

pub struct Team {
    shared: Arc<Shared>,
    /// Worker threads (the caller of `run` is the remaining member).
    pub workers: usize,
}

impl Team {
    /// A team of `workers` extra threads; `None` when a thread cannot be spawned.
    pub fn new(workers: usize) -> Option<Team> {
        let shared = Arc::new(Shared {
            job: AtomicPtr::new(ptr::null_mut()),
            epoch: AtomicUsize::new(0),
            users: AtomicUsize::new(0),
            hot: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            quit: AtomicBool::new(false),
            submit: Mutex::new(()),
            park: Mutex::new(()),
            wake: Condvar::new(),
        });
        for i in 0..workers {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("trn3emu-{i}"))
                .spawn(move || worker(&s));
            if spawned.is_err() {
                shared.quit.store(true, SeqCst);
                return None;
            }
        }
        Some(Team { shared, workers })
    }

    /// Run `f(i)` for `i in 0..n` on this thread and the workers; returns when all are done.
    /// Panics inside `f` are re-raised here (after every index has run or been abandoned).
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        let guard = if IN_JOB.with(|c| c.get()) {
            None
        } else {
            s.submit.try_lock().ok()
        };
        if guard.is_none() {
            (0..n).for_each(f);
            return;
        }
        // About four batches per thread: few counter updates, and a thread that starts late
        // still finds work.
        let grain = n.div_ceil(4 * (self.workers + 1)).max(1);
        let job = Job {
            f,
            n,
            grain,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
        };
        s.job.store(&job as *const Job as *mut (), SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        job.work();
        // Stragglers: spin briefly, then yield so that a worker the OS descheduled (a busy
        // host) gets this core back instead of watching it spin.
        let mut spins = 0u32;
        while job.done.load(Acquire) < n {
            relax(&mut spins);
        }
        // `job` lives on this stack: unpublish it, then wait until no worker can still be
        // looking at it (a worker counts itself in `users` before it loads the pointer).
        s.job.store(ptr::null_mut(), SeqCst);
        while s.users.load(SeqCst) != 0 {
            relax(&mut spins);
        }
        drop(guard);
        let p = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = p {
            resume_unwind(p);
        }
    }

    /// Keep the workers spinning between jobs until the guard drops.
    pub fn hot(&self) -> Hot {
        self.shared.hot.fetch_add(1, SeqCst);
        Hot(self.shared.clone())
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.quit.store(true, SeqCst);
        let _g = s.park.lock().unwrap_or_else(|e| e.into_inner());
        s.wake.notify_all();
    }
}

pub struct Hot(Arc<Shared>);

impl Drop for Hot {
    fn drop(&mut self) {
        self.0.hot.fetch_sub(1, SeqCst);
    }
}

/// One step of a busy wait, with a yield to the OS now and then (a no-op when no other thread
/// wants this core). No `pause` instruction and no frequent yields: on the VM we measure on,
/// both made a spinning worker miss most short jobs (the hypervisor deschedules a vCPU that
/// pauses in a loop), which halved what a second thread gained on 57 us jobs.
fn relax(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    if spins.is_multiple_of(1 << 14) {
        std::thread::yield_now();
    }
}

fn worker(s: &Shared) {
    let mut seen = s.epoch.load(SeqCst);
    let mut idle_since = Instant::now();
    let mut spins = 0u32;
    while !s.quit.load(Relaxed) {
        let e = s.epoch.load(SeqCst);
        if e != seen {
            seen = e;
            s.users.fetch_add(1, SeqCst);
            let p = s.job.load(SeqCst) as *const Job;
            if !p.is_null() {
                // SAFETY: `run` keeps the job alive until `users` drops back to zero, and we
                // counted ourselves in `users` before loading the pointer.
                unsafe { (*p).work() };
            }
            s.users.fetch_sub(1, SeqCst);
            idle_since = Instant::now();
            spins = 0;
            continue;
        }
        if s.hot.load(Relaxed) > 0 && (!spins.is_multiple_of(1024) || idle_since.elapsed() < SPIN) {
            relax(&mut spins);
            continue;
        }
        let g = s.park.lock().unwrap_or_else(|e| e.into_inner());
        s.sleepers.fetch_add(1, SeqCst);
        if s.epoch.load(SeqCst) == seen && !s.quit.load(SeqCst) {
            // A timeout bounds the cost of any missed wake-up to a delay, never a hang.
            let _ = s.wake.wait_timeout(g, Duration::from_millis(50));
        }
        s.sleepers.fetch_sub(1, SeqCst);
        idle_since = Instant::now();
        spins = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn counts(n: usize) -> Vec<AtomicU32> {
        (0..n).map(|_| AtomicU32::new(0)).collect()
    }

    #[test]
    fn every_index_runs_once_hot_or_cold_nested_or_concurrent() {
        let team = Team::new(2).expect("spawn");
        for hot in [false, true] {
            let _h = hot.then(|| team.hot());
            for n in [0, 1, 2, 7, 1000] {
                let hits = counts(n);
                team.run(n, &|i| {
                    hits[i].fetch_add(1, Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n={n} hot={hot}");
            }
            // A split inside a job runs inline on the thread that reached it.
            let hits = counts(64);
            team.run(8, &|i| {
                team.run(8, &|j| _ = hits[i * 8 + j].fetch_add(1, Relaxed))
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
        }
        // Two submitters at once: one gets the team, the other runs inline; both complete.
        let hits = counts(2 * 5000);
        std::thread::scope(|sc| {
            for t in 0..2 {
                let (team, hits) = (&team, &hits);
                sc.spawn(move || {
                    for r in 0..50 {
                        team.run(100, &|i| {
                            _ = hits[t * 5000 + r * 100 + i].fetch_add(1, Relaxed)
                        });
                    }
                });
            }
        });
        assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
    }

    #[test]
    fn a_panicking_index_reaches_the_caller_and_the_team_survives() {
        let team = Team::new(1).expect("spawn");
        let r = catch_unwind(AssertUnwindSafe(|| {
            team.run(100, &|i| assert!(i != 37, "index 37"));
        }));
        assert!(r.is_err());
        let hits = counts(100);
        team.run(100, &|i| _ = hits[i].fetch_add(1, Relaxed));
        assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
    }
}
