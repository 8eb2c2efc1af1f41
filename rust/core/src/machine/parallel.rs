//! The cores of one device on host threads (issue 19, outcome 5).
//!
//! The scheduler (sched.rs) stays the one authority on order, time, race checks, traces, limits
//! and errors: it picks every item in emulated-time order on the calling thread, exactly as
//! with one thread. What moves to other threads is the *execution* of the compute instructions
//! that touch nothing but their own core's SBUF, PSUM, engine state and RNG (`deferrable`: no
//! HBM operand, no register, no dynamic offset, no branch, no DMA, no collective). The
//! scheduler hands each of those to its core's queue and runs on; a helper thread executes
//! queued instructions, one core's queue at a time and each queue in pick order. Before the
//! scheduler touches a core itself (a DMA trigger or transfer, a collective, a register or
//! HBM instruction) it waits until that core's queue is empty, draining it itself when no
//! helper holds it (`sync`). Every instruction therefore sees exactly the state it sees on one
//! thread: a core's queued instructions run in pick order, and nothing else touches that
//! core's memories while they do (HBM is the scheduler's alone). Results are the same bits for
//! any thread count; traces, race reports and limits come from the scheduler unchanged.
//!
//! Errors: a queued instruction that fails records its error with its pick number (later
//! instructions of its core are then skipped); when the run ends, or stops on an error of its
//! own, every queue is drained and the failure with the lowest pick number is the run's error,
//! the one a single thread raises first (a panic likewise resumes on the caller's thread).
//! Unlike on one thread, other cores may have executed instructions picked after the failing
//! one by then (their memory may show those writes; the device stays usable).

use super::sched::{ins_err, Scheduler};
use super::{Core, RunResult, NUM_CORES};
use crate::engines::{self, Ctx};
use crate::error::{EmuError, Result};
use crate::isa::instr::NUM_REGISTERS;
use crate::isa::spec::DataPath;
use crate::isa::{Arg, Instr};
use crate::memory::hbm::Hbm;
use crate::memory::onchip::Mems;
use crate::memory::Mem;
use crate::numerics::config::Rounder;
use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};

/// Jobs a core's queue holds at most (a [128, 512] matmul is ~0.1 ms of host time).
const AHEAD: usize = 64;

/// Whether `ins` may run away from the scheduler: a compute instruction whose operands are all
/// static SBUF / PSUM patterns and immediates (so it reads no register, no HBM and cannot jump).
pub(super) fn deferrable(ins: &Instr) -> bool {
    ins.op.spec().path == DataPath::Compute
        && ins.args.iter().all(|a| match a {
            Arg::Reg(_) => false,
            Arg::Tensor(ap) => ap.mem != Mem::Hbm && ap.dynamic.is_none(),
            _ => true,
        })
}

/// Whether a run of these programs spreads its cores over threads: more than one thread is
/// configured and more than one core has a program.
pub(super) fn wanted(cores_with_programs: usize) -> bool {
    cores_with_programs > 1 && crate::par::num_threads() > 1
}

/// A queued instruction: pick number `seq`, instruction `idx` of its core's program.
pub(super) struct Job<'p> {
    pub seq: u64,
    pub idx: u32,
    pub ins: &'p Instr,
    pub rounder: Rounder,
}

/// How a queued instruction failed.
enum Failure {
    Error(EmuError),
    Panic(Box<dyn Any + Send>),
}

/// One core's queue.
#[derive(Default)]
struct Slot<'p> {
    queue: Mutex<VecDeque<Job<'p>>>,
    /// Jobs queued or executing (the queue is drained when it reaches 0).
    pending: AtomicUsize,
    /// A thread owns the core and executes its jobs.
    busy: AtomicBool,
    /// The core's first failure and its pick number.
    failed: Mutex<Option<(u64, Failure)>>,
}

/// Every core's queue and the cores themselves while a run spreads them over threads.
pub(super) struct Pool<'p> {
    /// The device's cores (`Device::cores`' buffer). Each core is touched by one thread at a
    /// time: whoever holds its slot's `busy` flag, or the scheduler once its queue is empty.
    cores: *mut Core,
    slots: Vec<Slot<'p>>,
    /// Lowest pick number that failed (`u64::MAX`: none): jobs picked after it are skipped.
    first_failure: AtomicU64,
    /// The scheduler is done: helpers return.
    done: AtomicBool,
}

// SAFETY: the raw core pointer is only dereferenced under the ownership protocol above (one
// thread per core at a time); everything else is atomics and mutexes. Cores and instructions
// are plain data (`Send`, `Sync`).
unsafe impl Send for Pool<'_> {}
unsafe impl Sync for Pool<'_> {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Spin a little, yielding now and then (a helper waiting for work, the scheduler for a core a
/// helper holds).
fn relax(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    if spins.is_multiple_of(64) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

impl<'p> Pool<'p> {
    /// A pool over `cores` (`NUM_CORES` of them, the device's buffer).
    pub(super) fn new(cores: *mut Core) -> Pool<'p> {
        Pool {
            cores,
            slots: (0..NUM_CORES).map(|_| Slot::default()).collect(),
            first_failure: AtomicU64::new(u64::MAX),
            done: AtomicBool::new(false),
        }
    }

    /// Queue `job` on core `k` (scheduler only). A core already `AHEAD` jobs behind is drained
    /// first: the scheduler stays close to the execution, so its polls (limits, Ctrl-C) keep
    /// coming and the queues stay small.
    pub(super) fn push(&self, k: u8, job: Job<'p>) {
        let s = &self.slots[k as usize];
        let mut spins = 0u32;
        while s.pending.load(Acquire) >= AHEAD {
            if !self.drain(k as usize) && !self.drain_other(k as usize) {
                relax(&mut spins);
            }
        }
        lock(&s.queue).push_back(job);
        s.pending.fetch_add(1, Release);
    }

    /// Core `k` for the scheduler's own use, once its queue is empty (`sync`).
    ///
    /// SAFETY: call only on the scheduler's thread after `sync(k)` succeeded and before the
    /// next `push(k, ..)`; the reference must not outlive that.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn core(&self, k: u8) -> &mut Core {
        &mut *self.cores.add(k as usize)
    }

    /// Every core, once every queue is empty (`sync_all`); same contract as `core`.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn all_cores(&self) -> &mut [Core] {
        std::slice::from_raw_parts_mut(self.cores, NUM_CORES)
    }

    /// Run core `k`'s queued jobs on this thread if no other thread holds it; `false` if one
    /// does.
    fn drain(&self, k: usize) -> bool {
        let s = &self.slots[k];
        if s.busy
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_err()
        {
            return false;
        }
        loop {
            let Some(job) = lock(&s.queue).pop_front() else {
                break;
            };
            if job.seq < self.first_failure.load(Relaxed) {
                // SAFETY: `busy` makes this thread the core's only user until it is cleared.
                let core = unsafe { &mut *self.cores.add(k) };
                let r = catch_unwind(AssertUnwindSafe(|| exec(core, k as u8, &job)));
                let failure = match r {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(Failure::Error(e)),
                    Err(p) => Some(Failure::Panic(p)),
                };
                if let Some(f) = failure {
                    self.first_failure.fetch_min(job.seq, Relaxed);
                    lock(&s.failed).get_or_insert((job.seq, f));
                }
            }
            s.pending.fetch_sub(1, Release);
        }
        s.busy.store(false, Release);
        true
    }

    /// While a helper holds core `k`: run the queue of another core instead of waiting (the
    /// lowest first, the one the scheduler likely needs next). `false` if there was none.
    fn drain_other(&self, k: usize) -> bool {
        (0..NUM_CORES).any(|j| j != k && self.slots[j].pending.load(Acquire) > 0 && self.drain(j))
    }

    /// Wait until core `k`'s queue is empty, running it here when no helper holds it; the
    /// core's failure (its error) if one of its jobs failed.
    pub(super) fn sync(&self, k: u8) -> Result<()> {
        let s = &self.slots[k as usize];
        let mut spins = 0u32;
        while s.pending.load(Acquire) > 0 {
            if !self.drain(k as usize) && !self.drain_other(k as usize) {
                relax(&mut spins);
            }
        }
        // Pairs with the helper's release of `busy`: its writes to the core are visible.
        while s.busy.load(Acquire) {
            relax(&mut spins);
        }
        match &*lock(&s.failed) {
            Some((_, Failure::Error(e))) => Err(e.clone()),
            Some((_, Failure::Panic(_))) => Err(internal("a queued instruction panicked")),
            None => Ok(()),
        }
    }

    /// Wait until every queue is empty (their failures are kept for `outcome`).
    pub(super) fn sync_all(&self) -> Result<()> {
        let mut first = Ok(());
        for k in 0..NUM_CORES as u8 {
            if let Err(e) = self.sync(k) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// A helper thread: run queued jobs, the highest core first (the scheduler drains from the
    /// lowest when it needs a core, so the two rarely meet), until the scheduler is done.
    fn help(&self) {
        let mut spins = 0u32;
        while !self.done.load(Acquire) {
            let mut ran = false;
            for k in (0..NUM_CORES).rev() {
                if self.slots[k].pending.load(Acquire) > 0 && self.drain(k) {
                    ran = true;
                    break;
                }
            }
            if !ran {
                relax(&mut spins);
            }
        }
    }

    /// The run's outcome once every queue is empty: the queued failure picked first (it comes
    /// before anything the scheduler reported), else `r`.
    fn outcome(&self, r: Result<RunResult>) -> Result<RunResult> {
        let _ = self.sync_all();
        let mut first: Option<(u64, Failure)> = None;
        for s in &self.slots {
            if let Some((seq, f)) = lock(&s.failed).take() {
                if first.as_ref().is_none_or(|(q, _)| seq < *q) {
                    first = Some((seq, f));
                }
            }
        }
        match first {
            Some((_, Failure::Error(e))) => Err(e),
            Some((_, Failure::Panic(p))) => resume_unwind(p),
            None => r,
        }
    }
}

/// An internal failure of the parallel run itself (a panic stands behind it, re-raised by
/// `Pool::outcome`).
fn internal(what: &str) -> EmuError {
    crate::error::fail(
        crate::error::ErrorKind::Internal,
        "parallel_run_failed",
        what,
    )
}

/// Execute a queued instruction on core `k` (which has no HBM operand: it gets an empty one).
fn exec(core: &mut Core, k: u8, job: &Job) -> Result<()> {
    let mut hbm = Hbm::detached();
    // Deferred instructions read no register; the array only fills `Ctx`.
    let mut regs = [0u32; NUM_REGISTERS as usize];
    let ins = job.ins;
    let mut ctx = Ctx {
        mems: Mems {
            sbuf: &mut core.sbuf,
            psum: &mut core.psum,
            hbm: &mut hbm,
        },
        state: &mut core.state,
        rng: &mut core.rng,
        rounder: job.rounder,
        regs: &mut regs,
        jump: None,
    };
    ctx.state.note_psum_writer(ins);
    engines::exec(ins, &mut ctx).map_err(|e| ins_err(e, k, job.idx, ins))
}

/// Sets `done` when the scheduler's role ends, however it ends (a panic included).
struct Done<'a, 'p>(&'a Pool<'p>);

impl Drop for Done<'_, '_> {
    fn drop(&mut self) {
        self.0.done.store(true, Release);
    }
}

/// Run `s` with a helper thread executing its cores' queued instructions: the calling thread
/// runs the scheduler (so a monitor's Ctrl-C check stays on it), a worker of the thread team
/// the helper; with the team busy elsewhere, the scheduler runs every queue itself.
pub(super) fn run(mut s: Scheduler, max_memory: u64) -> Result<RunResult> {
    let pool = Arc::new(Pool::new(s.cores_ptr()));
    s.pool = Some(pool.clone());
    let caller = std::thread::current().id();
    let sched = Mutex::new(Some(s));
    let out: Mutex<Option<Result<RunResult>>> = Mutex::new(None);
    crate::par::for_each_index(2, usize::MAX, |_| {
        if std::thread::current().id() == caller {
            let Some(s) = lock(&sched).take() else {
                return;
            };
            let done = Done(&pool);
            let r = s.run();
            // Every job picked before the end (or the error) runs, the helper still helping.
            let _ = pool.sync_all();
            drop(done);
            *lock(&out) = Some(r);
        } else {
            crate::error::with_alloc_limit(max_memory, || pool.help());
        }
    });
    let r = lock(&out)
        .take()
        .unwrap_or_else(|| Err(internal("the scheduler did not run")));
    pool.outcome(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::text::parse_instr;
    use crate::machine::Device;

    fn job(seq: u64, text: &str) -> Job<'static> {
        let ins: &'static Instr = Box::leak(Box::new(parse_instr(text).unwrap()));
        assert!(deferrable(ins), "{text}");
        Job {
            seq,
            idx: seq as u32,
            ins,
            rounder: Rounder::default(),
        }
    }

    const SET_BAD: &str = "memset.gpsimd dst=sbuf:uint32[0:8]+512[[1,8]] value=1000";
    const GATHER: &str = "nc_n_gather.gpsimd dst=sbuf:float32[0:8]+0[[1,8]] data=sbuf:float32[0:8]+64[[1,64]] indices=sbuf:uint32[0:8]+512[[1,8]]";
    const SET_ONE: &str = "memset.vector dst=sbuf:float32[0:8]+1024[[1,4]] value=1.0";

    #[test]
    fn the_failure_picked_first_wins_whatever_ran_first() {
        let mut dev = Device::new();
        let pool = Pool::new(dev.cores.as_mut_ptr());
        // Core 1 fails at pick 3, core 7 at pick 8; core 7's queue runs first.
        pool.push(1, job(2, SET_BAD));
        pool.push(1, job(3, GATHER));
        pool.push(7, job(7, SET_BAD));
        pool.push(7, job(8, GATHER));
        assert!(pool.drain(7));
        assert!(pool.drain(1));
        // Picked after the first failure: skipped.
        pool.push(2, job(9, SET_ONE));
        let e = pool.outcome(Ok(RunResult::default())).unwrap_err();
        assert_eq!(e.rule, "gather_index_out_of_range");
        assert!(
            e.message.contains("(core 1)") || format!("{e}").contains("(core 1)"),
            "{e}"
        );
        let part = dev.cores[2].sbuf.partition(0);
        assert_eq!(&part[1024..1028], &[0; 4]);
    }

    #[test]
    fn deferrable_means_own_core_memories_only() {
        assert!(deferrable(&parse_instr(SET_ONE).unwrap()));
        for t in [
            "dma_copy.sync dst=sbuf:float32[0:8]+0[[1,4]] src=hbm:float32+0[[4,8],[1,4]]",
            "register_move.vector dst=r1 src=0",
            "branch.vector target=0",
            "iota.gpsimd dst=sbuf:int32[0:8]+0[[1,4]] pattern=[[1,4]] offset=r2",
        ] {
            assert!(!deferrable(&parse_instr(t).unwrap()), "{t}");
        }
    }
}
