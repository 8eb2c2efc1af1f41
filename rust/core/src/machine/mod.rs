//! The device: 8 NeuronCores with their SBUF, PSUM and engine state, and shared HBM.

pub mod autosync;
pub mod control;
pub mod dead;
pub mod dependence;
pub mod dma_timing;
pub mod fabric;
pub mod forward;
mod identical;
pub mod intercore;
pub mod limits;
mod parallel;
mod race_log;
pub mod region;
pub mod repeats;
pub mod run_plan;
pub mod sched;
pub mod ultra;
pub mod ultra_dist;
mod write_window;

use crate::cost::{CostModel, DefaultCost};
use crate::engines::EngineState;
use crate::error::Result;
use crate::isa::instr::NUM_REGISTERS;
use crate::isa::{Engine, Program};
use crate::memory::hbm::Hbm;
use crate::memory::onchip::OnChip;
use crate::numerics::config::NumericsConfig;
use crate::numerics::rng::RngStates;
use crate::trace::{Trace, Unit};
use run_plan::RunPlan;
use std::sync::Arc;

pub use crate::memory::NUM_CORES;

/// Instruction streams per core (one sequencer per engine).
pub const NUM_STREAMS: usize = 5;
/// The engine of each stream, in stream-index order.
pub const STREAMS: [Engine; NUM_STREAMS] = [
    Engine::Tensor,
    Engine::Vector,
    Engine::Scalar,
    Engine::Gpsimd,
    Engine::Sync,
];
/// Agents per core: the five streams plus one DMA queue per issuing stream.
pub const AGENTS_PER_CORE: usize = 2 * NUM_STREAMS;

/// An instruction stream of a core; the discriminant is its stream index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Stream {
    Tensor = 0,
    Vector = 1,
    Scalar = 2,
    Gpsimd = 3,
    Sync = 4,
}

impl Stream {
    /// Every stream, in stream-index order.
    pub const ALL: [Stream; NUM_STREAMS] = [
        Stream::Tensor,
        Stream::Vector,
        Stream::Scalar,
        Stream::Gpsimd,
        Stream::Sync,
    ];

    /// The stream that issues engine `e`'s instructions (an engine without a stream of its own
    /// issues on Sync).
    #[inline]
    pub fn of(e: Engine) -> Stream {
        match e {
            Engine::Tensor => Stream::Tensor,
            Engine::Vector => Stream::Vector,
            Engine::Scalar => Stream::Scalar,
            Engine::Gpsimd => Stream::Gpsimd,
            _ => Stream::Sync,
        }
    }

    /// Position in `STREAMS` (and in `Core::regs`).
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn engine(self) -> Engine {
        STREAMS[self.index()]
    }
}

/// What executes work on a core: an engine stream, or the DMA queue that runs the transfers
/// a stream triggers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Executor {
    Engine(Stream),
    DmaQueue(Stream),
}

impl Executor {
    /// Position among the core's executors (0..AGENTS_PER_CORE): the streams, then their queues.
    #[inline]
    pub fn index(self) -> usize {
        match self {
            Executor::Engine(s) => s.index(),
            Executor::DmaQueue(s) => NUM_STREAMS + s.index(),
        }
    }

    /// Inverse of `index`.
    pub fn from_index(i: usize) -> Executor {
        let s = Stream::ALL[i % NUM_STREAMS];
        if i < NUM_STREAMS {
            Executor::Engine(s)
        } else {
            Executor::DmaQueue(s)
        }
    }

    /// The stream that issues the work (for a queue: the stream whose transfers it runs).
    #[inline]
    pub fn stream(self) -> Stream {
        match self {
            Executor::Engine(s) | Executor::DmaQueue(s) => s,
        }
    }

    #[inline]
    pub fn is_queue(self) -> bool {
        matches!(self, Executor::DmaQueue(_))
    }

    /// Where the trace says a record ran.
    pub fn unit(self) -> Unit {
        match self {
            Executor::Engine(s) => Unit::Engine(s.index() as u8),
            Executor::DmaQueue(s) => Unit::DmaQueue(s.index() as u8),
        }
    }
}

pub struct Core {
    pub sbuf: OnChip,
    pub psum: OnChip,
    pub state: EngineState,
    /// VectorE / GpSimd XORWOW states: persist across runs (like the hardware's, until reset).
    pub rng: RngStates,
    /// The 64 x 32-bit registers of each stream's sequencer, indexed by `Stream::index`.
    pub regs: [[u32; NUM_REGISTERS as usize]; NUM_STREAMS],
}

impl Core {
    /// A core in the power-on state; a `Resource` error if the host cannot provide its memory.
    fn try_new(seed: u64, core: usize) -> Result<Self> {
        Ok(Core {
            sbuf: OnChip::try_new(crate::memory::SBUF_PART_BYTES)?,
            psum: OnChip::try_new(crate::memory::PSUM_PART_BYTES)?,
            state: EngineState::default(),
            rng: RngStates::seeded(seed ^ ((core as u64) << 32)),
            regs: [[0; NUM_REGISTERS as usize]; NUM_STREAMS],
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// Report unsynchronised overlapping accesses (default on).
    pub check_races: bool,
    /// Keep one trace record per instruction and transfer (default on).
    pub trace: bool,
    /// Every instruction already passed `engines::validate` (programs built by
    /// `asm::Assembler`, `engines::parse_program` or `engines::decode_program`), so the run
    /// skips re-validating them (default off: a hand-built `Program` is validated).
    pub prevalidated: bool,
    /// Trace records kept at most (default `TRACE_LIMIT`); items past it are counted in
    /// `Trace::dropped` instead, so a long run's trace cannot exhaust host memory.
    pub trace_limit: u64,
    /// Unordered writes of identical bytes to the same HBM from different cores (SPMD programs
    /// that ignore `program_id`) are warnings in `RunResult::identical_writes` instead of
    /// `data_race` errors (default off; `machine::identical`).
    pub identical_writes: bool,
    /// Host seconds the run may take (default `None`: no limit); past it the run stops with a
    /// `Runaway` error (rule `run_time_limit`), checked every `POLL_EVERY` items.
    pub max_seconds: Option<f64>,
    /// Host bytes the run may add to HBM's backing or take in one buffer sized by its operands
    /// (default `limits::default_max_memory()`: 32 GiB or half the host's memory, whichever is
    /// less); past it a `Resource` error (rule `run_memory_limit`).
    pub max_memory: u64,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            check_races: true,
            trace: true,
            prevalidated: false,
            trace_limit: TRACE_LIMIT,
            identical_writes: false,
            max_seconds: None,
            max_memory: limits::default_max_memory(),
        }
    }
}

/// How far a run has got: what `Monitor::poll` sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Instructions and transfers executed so far.
    pub executed: u64,
    /// Instructions and transfers the run will execute (one per instruction, plus one transfer
    /// per DMA instruction); `None` when a program branches (the count depends on the data).
    pub total: Option<u64>,
    /// Emulated device time reached, picoseconds.
    pub emulated_ps: u64,
}

/// A run's observer (`Device::run_monitored`): polled every `POLL_EVERY` executed items, on
/// the thread that runs the scheduler. Returning `false` cancels the run: it stops with an
/// `Interrupted` error (rule `interrupted`) and the device stays usable, as after any error.
pub trait Monitor: Send {
    fn poll(&mut self, progress: &Progress) -> bool;
}

/// Executed items between two `Monitor::poll` calls (host time: ~20 us for the tiniest
/// instructions, a few ms for the largest).
pub const POLL_EVERY: u64 = 64;

#[derive(Debug, Default)]
pub struct RunResult {
    pub trace: Trace,
    /// Estimated device time of the run (end of the last instruction or transfer), picoseconds.
    pub end_ps: u64,
    /// Instructions and transfers executed.
    pub executed: u64,
    /// With `RunOptions::identical_writes`: one message per unordered cross-core write of
    /// identical bytes (both instructions named), in the order they were found.
    pub identical_writes: Vec<String>,
}

pub struct Device {
    pub hbm: Hbm,
    pub cores: Vec<Core>,
    pub cost: Box<dyn CostModel>,
    /// Rounding mode, seed, SR bits, fp8 overflow policy, MX scale rule.
    pub numerics: NumericsConfig,
    /// Runs so far: part of the stochastic-rounding counter, so repeated runs draw fresh bits.
    pub runs: u64,
    /// Instructions and transfers one run may execute before it stops as a runaway loop.
    pub max_executed: u64,
}

/// Default `Device::max_executed` (units of work, `limits::work_units`: 5-15 s of host time for a loop of any shape).
pub const MAX_EXECUTED: u64 = 1 << 26;

/// Default `RunOptions::trace_limit`: trace records kept per run (~64 bytes each, so at most
/// ~128 MiB of records); later items run untraced and are counted in `Trace::dropped`.
pub const TRACE_LIMIT: u64 = 1 << 21;

impl Default for Device {
    fn default() -> Self {
        Self::new()
    }
}

impl Device {
    /// A device with the default numerics. Panics if the host cannot provide its memory;
    /// `try_new` reports that instead (the Python binding and UltraServer chips use it).
    pub fn new() -> Self {
        Self::with_numerics(NumericsConfig::default())
    }

    /// `new`, or a `Resource` error (rule `host_allocation_failed`): never a panic or abort.
    pub fn try_new() -> Result<Self> {
        Self::try_with_numerics(NumericsConfig::default())
    }

    /// A device with the given numerics configuration (the RNG power-on states derive from its seed).
    /// Panics if the host cannot provide its memory; `try_with_numerics` reports that instead.
    pub fn with_numerics(numerics: NumericsConfig) -> Self {
        match Self::try_with_numerics(numerics) {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        }
    }

    /// `with_numerics`, or a `Resource` error (rule `host_allocation_failed`) when the host
    /// cannot provide the device's memory (e.g. under an `RLIMIT_AS` cap): never an abort.
    pub fn try_with_numerics(numerics: NumericsConfig) -> Result<Self> {
        let mut cores = Vec::new();
        cores.try_reserve_exact(NUM_CORES).map_err(|_| {
            crate::error::fail(
                crate::error::ErrorKind::Resource,
                "host_allocation_failed",
                "cannot allocate host memory for a device's cores",
            )
        })?;
        for c in 0..NUM_CORES {
            cores.push(Core::try_new(numerics.seed, c)?);
        }
        Ok(Device {
            hbm: Hbm::try_new()?,
            cores,
            cost: Box::new(DefaultCost::default()),
            numerics,
            runs: 0,
            max_executed: MAX_EXECUTED,
        })
    }

    /// Time runs with generation `g`'s published constants (`timing.rs`); functional
    /// behaviour stays NeuronCore-v4.
    pub fn set_timing(&mut self, g: &'static crate::timing::Generation) {
        self.cost = Box::new(DefaultCost::new(g));
    }

    /// Run one program per listed core concurrently. Memories persist across runs; semaphores,
    /// accumulators, registers and the matmul first-write state start fresh each run. On error the device
    /// stays usable (memory holds whatever the run wrote before the error).
    pub fn run(&mut self, programs: &[Program], opts: &RunOptions) -> Result<RunResult> {
        let refs: Vec<&Program> = programs.iter().collect();
        self.run_refs(&refs, opts)
    }

    /// `run` on borrowed programs (the bindings run Python-owned programs without copying them).
    pub fn run_refs(&mut self, programs: &[&Program], opts: &RunOptions) -> Result<RunResult> {
        self.run_with(programs, &[], opts, None)
    }

    /// `run_refs` with a `Monitor` polled during the run (progress reports, cancellation).
    pub fn run_monitored(
        &mut self,
        programs: &[&Program],
        opts: &RunOptions,
        monitor: &mut dyn Monitor,
    ) -> Result<RunResult> {
        self.run_with(programs, &[], opts, Some(monitor))
    }

    /// `run_monitored` with the programs' cached plans (`plans[i]` of `programs[i]`, e.g.
    /// `Assembler::run_plan`); a plan that does not fit its program or this device is not
    /// used (the run builds its own).
    pub fn run_planned(
        &mut self,
        programs: &[&Program],
        plans: &[Option<Arc<RunPlan>>],
        opts: &RunOptions,
        monitor: &mut dyn Monitor,
    ) -> Result<RunResult> {
        self.run_with(programs, plans, opts, Some(monitor))
    }

    fn run_with(
        &mut self,
        programs: &[&Program],
        plans: &[Option<Arc<RunPlan>>],
        opts: &RunOptions,
        mut monitor: Option<&mut dyn Monitor>,
    ) -> Result<RunResult> {
        self.begin(programs);
        let with_regions = opts.check_races || opts.trace;
        // A plan built here (none given, or one that does not fit) is polled like the run.
        let start = Progress {
            executed: 0,
            total: None,
            emulated_ps: 0,
        };
        let mut keep_going = || monitor.as_mut().is_none_or(|m| m.poll(&start));
        let plans = run_plan::for_run(programs, plans, &*self.cost, with_regions, &mut keep_going)?;
        write_window::declare(self, programs, &plans);
        let r = crate::error::with_alloc_limit(opts.max_memory, || {
            crate::par::run_hot(|| sched::run(self, programs, &plans, opts, monitor))
        });
        write_window::clear(self);
        self.runs += 1;
        // A write that could not back an HBM page is the run's error (whatever followed it).
        self.hbm.take_alloc_failure().and(r)
    }

    /// Reset the per-run state of the cores that run `programs`. Only cores that run can
    /// observe it; the others are reset when they next run (saves zeroing 8 x 128 KiB of
    /// matmul-written bits per run).
    fn begin(&mut self, programs: &[&Program]) {
        for p in programs {
            if let Some(c) = self.cores.get_mut(p.core as usize) {
                c.state.reset();
                c.regs = [[0; NUM_REGISTERS as usize]; NUM_STREAMS];
            }
        }
    }
}
