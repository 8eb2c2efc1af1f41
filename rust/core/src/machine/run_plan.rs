//! What the scheduler knows about a program before it runs, derived once per program instead of
//! once per executed item (issue 17: the scheduler's time outside the engines was mostly
//! re-deriving these, cold, every run): each instruction's memory regions (race checks, trace
//! bytes and write box), each DMA instruction's transfer plan, the dependent-instruction flag of
//! each instruction on its stream, its engine time for each kind of issue slot (cost models
//! with a `plan_key`) and the on-chip write windows.
//!
//! A plan belongs to one program as it is: `Assembler::run_plan` caches one and drops it when
//! the program changes (append, pop). A plan is only used for a run whose DMA numbers and cost
//! model key it was built with and for a program of its length and core (`fits`); otherwise the
//! run builds its own.

use std::sync::{Arc, Mutex, PoisonError};

use super::autosync::{cancelled, CHECK_EVERY};
use super::dependence::LastWrites;
use super::dma_timing::{plan, Plan};
use super::region::{regions_into, Region};
use super::write_window::{self, Window};
use crate::cost::{CostModel, DmaParams, Issue};
use crate::isa::validate::is_dma;
use crate::isa::Program;
use crate::memory::Mem;
use crate::trace::WriteBox;

/// No transfer plan (the instruction is not a DMA).
const NO_SLOT: u32 = u32::MAX;

/// The issue slots `RunPlan::times` lists (a dependent issue is always back to back).
const ISSUES: [Issue; 3] = [
    Issue {
        back_to_back: false,
        dependent: false,
    },
    Issue {
        back_to_back: true,
        dependent: false,
    },
    Issue {
        back_to_back: true,
        dependent: true,
    },
];

/// One engine stream's instructions in a program.
#[derive(Debug, Default)]
pub struct StreamList {
    /// Instruction indices, in program order.
    pub list: Vec<u32>,
    /// One past the last list position of an instruction that touches memory itself (not a
    /// DMA trigger), and one past the last DMA trigger (0: none).
    pub touch_end: usize,
    pub trigger_end: usize,
}

/// One program's per-instruction facts for its runs.
#[derive(Debug)]
pub struct RunPlan {
    core: u8,
    len: usize,
    dma: DmaParams,
    /// The cost model's `plan_key` (`Some`: `times` holds each instruction's engine time).
    cost_key: Option<usize>,
    /// Engine time of instruction `i` issued with a gap, back to back, back to back dependent.
    times: Vec<[u64; 3]>,
    /// Regions of instruction `i`: `regions[starts[i]..starts[i + 1]]` (all empty when built
    /// without regions).
    starts: Vec<u32>,
    regions: Vec<Region>,
    has_regions: bool,
    /// Bytes the instruction's operands touch, its flops and its first on-chip written box
    /// (trace).
    bytes: Vec<u64>,
    flops: Vec<u64>,
    write: Vec<WriteBox>,
    /// Units of work (`limits::work_units`) of instruction `i`, or of its transfer for a DMA
    /// (the trigger counts one): the step budget counts these. 1 each in a program without
    /// branches (it cannot loop).
    work: Vec<u32>,
    /// Whether instruction `i` runs as its semantics alone (`engines::is_plain`).
    plain: Vec<bool>,
    /// Transfer plan of DMA instruction `i`: `transfers[slot[i]]`.
    slot: Vec<u32>,
    transfers: Vec<Plan>,
    /// Whether instruction `i` reads what the previous instruction of its stream wrote (`None`:
    /// the program branches, the order is only known while running).
    dependent: Option<Vec<bool>>,
    /// Each engine stream's instructions in order (by `Stream::index`), with one past the last
    /// position of an instruction touching memory itself and of a DMA trigger (0: none).
    streams: [StreamList; super::NUM_STREAMS],
    /// Semaphore events (waits and signals) and DMA engine spans of a run of the program
    /// without branches.
    trace_room: (usize, usize),
    /// The program's SBUF and PSUM write windows.
    pub(super) windows: (Window, Window),
}

impl RunPlan {
    /// The plan of `prog` under the cost model `cost`; regions only `with_regions` (race checks
    /// or trace).
    pub fn new(prog: &Program, cost: &dyn CostModel, with_regions: bool) -> RunPlan {
        let Ok(p) = Self::build(prog, cost, with_regions, &mut || true) else {
            unreachable!("a build that is never cancelled completes")
        };
        p
    }

    /// `new`, asking `keep_going` every `autosync::CHECK_EVERY` instructions whether to go on
    /// (a plan of millions of instructions takes seconds): false stops it with an `Interrupted`
    /// error (rule `interrupted`).
    pub fn new_checked(
        prog: &Program,
        cost: &dyn CostModel,
        with_regions: bool,
        keep_going: &mut dyn FnMut() -> bool,
    ) -> crate::error::Result<RunPlan> {
        Self::build(prog, cost, with_regions, keep_going).map_err(cancelled)
    }

    /// The plan, or `Err(i)` when `keep_going` said stop at instruction `i`.
    fn build(
        prog: &Program,
        cost: &dyn CostModel,
        with_regions: bool,
        keep_going: &mut dyn FnMut() -> bool,
    ) -> std::result::Result<RunPlan, usize> {
        let n = prog.instrs.len();
        let dma = &cost.dma();
        let cost_key = cost.plan_key();
        let mut p = RunPlan {
            core: prog.core,
            len: n,
            dma: *dma,
            cost_key,
            times: Vec::new(),
            starts: Vec::with_capacity(n + 1),
            regions: Vec::new(),
            has_regions: with_regions,
            bytes: Vec::new(),
            flops: Vec::new(),
            write: Vec::new(),
            work: Vec::with_capacity(n),
            plain: Vec::with_capacity(n),
            slot: Vec::with_capacity(n),
            transfers: Vec::new(),
            dependent: dependent_flags(prog),
            trace_room: (0, 0),
            streams: Default::default(),
            windows: write_window::of_program(prog),
        };
        if with_regions {
            // One region per tensor operand as a rule: reserved at once, so the list is not
            // copied as it grows (fresh pages for each copy were most of a large plan's time).
            p.regions
                .reserve(prog.instrs.iter().map(|i| i.tensors().count()).sum());
            p.bytes.reserve(n);
            p.flops.reserve(n);
            p.write.reserve(n);
        }
        p.starts.push(0);
        // Only a program that branches can loop: a straight-line one runs each instruction
        // once, whatever its size, and counts one unit per item as before.
        let loops = p.dependent.is_none();
        for (i, ins) in prog.instrs.iter().enumerate() {
            if i % CHECK_EVERY == CHECK_EVERY - 1 && !keep_going() {
                return Err(i);
            }
            p.trace_room.0 += ins.waits.len() + ins.signals.len();
            p.plain.push(crate::engines::is_plain(ins));
            let s = &mut p.streams[super::Stream::of(ins.engine).index()];
            s.list.push(i as u32);
            if is_dma(ins) {
                s.trigger_end = s.list.len();
            } else if ins.tensors().next().is_some() {
                s.touch_end = s.list.len();
            }
            if with_regions {
                let from = p.regions.len();
                regions_into(prog.core, ins, &mut p.regions);
                let regs = &p.regions[from..];
                p.bytes.push(regs.iter().map(|r| r.bytes).sum());
                p.flops.push(crate::cost::flops(ins));
                p.write.push(write_box(regs));
            }
            p.starts.push(p.regions.len() as u32);
            if cost_key.is_some() {
                p.times.push(ISSUES.map(|issue| cost.engine_ps(ins, issue)));
            }
            if is_dma(ins) {
                p.slot.push(p.transfers.len() as u32);
                let t = plan(ins, dma);
                p.trace_room.1 += t.pieces.len();
                p.work.push(if loops {
                    super::limits::work_units(t.bytes)
                } else {
                    1
                });
                p.transfers.push(t);
            } else {
                p.slot.push(NO_SLOT);
                p.work.push(if loops {
                    super::limits::work_units(operand_bytes(ins))
                } else {
                    1
                });
            }
        }
        Ok(p)
    }

    /// A plan holding only `regions` (one instruction each), for tests of what reads them.
    #[cfg(test)]
    pub(super) fn from_regions(regions: Vec<Region>) -> RunPlan {
        let empty = Program {
            core: 0,
            instrs: Vec::new(),
        };
        let mut p = RunPlan::new(&empty, &crate::cost::DefaultCost::default(), true);
        p.len = regions.len();
        p.starts = (0..=regions.len() as u32).collect();
        p.regions = regions;
        p
    }

    /// Whether this plan describes `prog` for a run under `cost` that needs regions or not.
    pub fn fits(&self, prog: &Program, cost: &dyn CostModel, with_regions: bool) -> bool {
        self.core == prog.core
            && self.len == prog.instrs.len()
            && (self.has_regions || !with_regions)
            && self.cost_key == cost.plan_key()
            && self.dma == cost.dma()
    }

    /// Instruction `idx`'s engine time issued as `issue` (`None`: the cost model has no
    /// `plan_key`, the caller asks it).
    #[inline]
    pub fn engine_ps(&self, idx: u32, issue: Issue) -> Option<u64> {
        let k = issue.back_to_back as usize + (issue.back_to_back && issue.dependent) as usize;
        self.times.get(idx as usize).map(|t| t[k])
    }

    /// Every region of the program, instruction after instruction.
    #[inline]
    pub fn all_regions(&self) -> &[Region] {
        &self.regions
    }

    /// The positions in `all_regions` of instruction `idx`'s regions.
    #[inline]
    pub fn region_range(&self, idx: u32) -> std::ops::Range<u32> {
        self.starts[idx as usize]..self.starts[idx as usize + 1]
    }

    /// Instruction `idx`'s regions.
    #[inline]
    pub fn regions(&self, idx: u32) -> &[Region] {
        let r = self.region_range(idx);
        &self.regions[r.start as usize..r.end as usize]
    }

    /// Bytes instruction `idx`'s operands touch and its first written on-chip box (a plan
    /// built with regions).
    #[inline]
    pub fn traced(&self, idx: u32) -> (u64, WriteBox) {
        (self.bytes[idx as usize], self.write[idx as usize])
    }

    /// Whether the program branches (`control::has_branches`).
    #[inline]
    pub fn branches(&self) -> bool {
        self.dependent.is_none()
    }

    /// Engine stream `s`'s instructions (`Stream::index`).
    #[inline]
    pub fn stream(&self, s: usize) -> &StreamList {
        &self.streams[s]
    }

    /// Items a run of the program executes (each instruction and each DMA's transfer); `None`
    /// when it branches.
    #[inline]
    pub fn planned_items(&self) -> Option<u64> {
        self.dependent
            .as_ref()
            .map(|_| (self.len + self.transfers.len()) as u64)
    }

    /// Semaphore events and DMA engine spans a run of the program records (without branches).
    #[inline]
    pub fn trace_room(&self) -> (usize, usize) {
        self.trace_room
    }

    /// Instruction `idx`'s `cost::flops` (a plan built with regions).
    #[inline]
    pub fn flops(&self, idx: u32) -> u64 {
        self.flops[idx as usize]
    }

    /// Units of work of instruction `idx` (of its transfer, for a DMA instruction).
    #[inline]
    pub fn work(&self, idx: u32) -> u32 {
        self.work[idx as usize]
    }

    /// Whether instruction `idx` runs as its semantics alone (`engines::exec_plain`).
    #[inline]
    pub fn plain(&self, idx: u32) -> bool {
        self.plain.get(idx as usize).copied().unwrap_or(false)
    }

    /// The transfer plan of DMA instruction `idx`.
    #[inline]
    pub fn transfer(&self, idx: u32) -> &Plan {
        &self.transfers[self.slot[idx as usize] as usize]
    }

    /// Whether instruction `idx` reads what the previous instruction of its stream wrote, when
    /// the program does not branch.
    #[inline]
    pub fn dependent(&self, idx: u32) -> Option<bool> {
        self.dependent.as_ref().map(|d| d[idx as usize])
    }
}

/// Bytes the tensor operands of `ins` name (elements times element size, each operand once).
fn operand_bytes(ins: &crate::isa::Instr) -> u64 {
    ins.tensors()
        .map(|(_, _, _, ap)| (ap.num_elements() as u64).saturating_mul(ap.dtype.size() as u64))
        .fold(0u64, u64::saturating_add)
}

/// `LastWrites::track` of every instruction, each stream's instructions in program order (the
/// order a program without branches issues them in).
fn dependent_flags(prog: &Program) -> Option<Vec<bool>> {
    if super::control::has_branches(prog) {
        return None;
    }
    let mut last = [LastWrites::default(); super::NUM_STREAMS];
    let flags = prog
        .instrs
        .iter()
        .map(|ins| last[super::Stream::of(ins.engine).index()].track(ins))
        .collect();
    Some(flags)
}

/// The first on-chip region the instruction writes (from its regions, which list operands in
/// order), for the occupancy counters of the trace.
fn write_box(regs: &[Region]) -> WriteBox {
    for r in regs {
        if !r.write || r.mem == Mem::Hbm {
            continue;
        }
        return WriteBox {
            mem: r.mem as u8,
            p0: r.p0.min(255) as u8,
            p1: r.p1.min(255) as u8,
            lo: r.lo.clamp(0, u32::MAX as i128) as u32,
            hi: r.hi.clamp(0, u32::MAX as i128) as u32,
        };
    }
    WriteBox::NONE
}

/// The plan of each program of a run: `given[i]` where it fits `programs[i]`, else a new one
/// (built asking `keep_going`, as `RunPlan::new_checked`).
pub(super) fn for_run(
    programs: &[&Program],
    given: &[Option<Arc<RunPlan>>],
    cost: &dyn CostModel,
    with_regions: bool,
    keep_going: &mut dyn FnMut() -> bool,
) -> crate::error::Result<Vec<Arc<RunPlan>>> {
    let mut out = Vec::with_capacity(programs.len());
    for (i, p) in programs.iter().enumerate() {
        out.push(match given.get(i).and_then(Option::as_ref) {
            Some(g) if g.fits(p, cost, with_regions) => g.clone(),
            _ => Arc::new(RunPlan::new_checked(p, cost, with_regions, keep_going)?),
        });
    }
    Ok(out)
}

/// A program's cached plan (held by its `Assembler`; a clone starts empty, `clear` on change).
#[derive(Default)]
pub struct PlanCache(Mutex<Option<Arc<RunPlan>>>);

impl PlanCache {
    /// The cached plan of `prog` under `cost` (with regions), built and kept if there is none
    /// or it was built under another cost model.
    pub fn get(&self, prog: &Program, cost: &dyn CostModel) -> Arc<RunPlan> {
        let Ok(p) = self.get_checked(prog, cost, &mut || true) else {
            unreachable!("a build that is never cancelled completes")
        };
        p
    }

    /// `get`, a plan it has to build asking `keep_going` (`RunPlan::new_checked`).
    pub fn get_checked(
        &self,
        prog: &Program,
        cost: &dyn CostModel,
        keep_going: &mut dyn FnMut() -> bool,
    ) -> crate::error::Result<Arc<RunPlan>> {
        let mut g = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = g.as_ref().filter(|p| p.fits(prog, cost, true)) {
            return Ok(p.clone());
        }
        let p = Arc::new(RunPlan::new_checked(prog, cost, true, keep_going)?);
        *g = Some(p.clone());
        Ok(p)
    }

    /// Forget the plan (the program changed).
    pub fn clear(&mut self) {
        *self.0.get_mut().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Clone for PlanCache {
    fn clone(&self) -> Self {
        PlanCache::default()
    }
}

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlanCache")
    }
}
