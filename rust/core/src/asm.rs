//! The assembler: a program under construction plus the state its rules need.
//!
//! Front ends (the Python binding, tests) hand over one parsed instruction at a time; the
//! `Assembler` fills in ISA defaults, picks the default engine, validates the instruction and
//! resolves `nc_matmul accumulate=None` from which PSUM bytes earlier matmuls wrote since their
//! allocation (`psum_fresh`). Nothing here knows about Python.

use crate::cost::CostModel;
use crate::engine_choice::EngineBalance;
use crate::engines;
use crate::error::{fail, ErrorKind, Result};
use crate::isa::spec::Default as ParamDefault;
use crate::isa::{ops, Arg, Engine, Instr, Opcode, Program};
use crate::machine::run_plan::{PlanCache, RunPlan};
use crate::machine::{autosync, NUM_CORES};
use crate::memory::{Ap, PARTITIONS, PSUM_PART_BYTES};
use crate::timing::Generation;
use std::sync::Arc;

/// What `Assembler::append` reports besides success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// Index of the new instruction in the program.
    pub index: usize,
    /// An `nc_matmul` with `accumulate=None` whose PSUM dst earlier matmuls wrote only in part:
    /// it stays None (decided per element at run time), which hardware cannot do with its one
    /// flag per instruction; front ends warn about it.
    pub accumulate_mixed: bool,
}

/// A program under construction for one core.
#[derive(Clone, Debug)]
pub struct Assembler {
    program: Program,
    /// Matmul-written state of the core's PSUM, one bit per 2-byte unit.
    psum_written: PsumBits,
    /// PSUM units allocated (`psum_fresh`) that no instruction has written since, one bit per
    /// 2-byte unit: an accumulating matmul into them adds to garbage.
    psum_unwritten: PsumBits,
    /// The first `validated` instructions passed `engines::validate` when appended (a program
    /// taken over by `from_program` counts as unvalidated): auto-sync re-checks only what it
    /// adds to them.
    validated: usize,
    /// The program's run plan, built at its first run and kept until the program changes.
    plan: PlanCache,
    /// Engine choice for instructions appended without an engine (`engine_choice.rs`): `None`
    /// gives the ISA's default engine (the text form, raw programs); a front end that compiles
    /// kernels turns balancing on with `set_engine_balance`.
    balance: Option<EngineBalance>,
    /// Indices of the instructions appended without an engine (`Engine::Unknown`), ascending:
    /// the ones an engine-choice pass over the finished program may decide (`engine_choices`).
    unpinned: Vec<u32>,
    /// `keep_unresolved`: (index, the `accumulate` operand as given) of every `nc_matmul` whose
    /// `accumulate=None` was resolved on append, ascending, so a lowering that moves the
    /// instruction's operands can append it again unresolved (`unresolved_accumulate`).
    unresolved: Option<Vec<(u32, Arg)>>,
}

/// Equal programs and PSUM state (how much of it was validated on the way is bookkeeping).
impl PartialEq for Assembler {
    fn eq(&self, other: &Self) -> bool {
        self.program == other.program
            && self.psum_written == other.psum_written
            && self.psum_unwritten == other.psum_unwritten
    }
}

impl Assembler {
    /// An empty program for core `core` (0..NUM_CORES).
    pub fn new(core: i64) -> Result<Self> {
        if !(0..NUM_CORES as i64).contains(&core) {
            return Err(fail(
                ErrorKind::Value,
                "core_out_of_range",
                format!("core {core} out of range (0..{NUM_CORES})"),
            )
            .operand("core"));
        }
        Ok(Self::from_program(Program {
            core: core as u8,
            instrs: Vec::new(),
        }))
    }

    /// Continue assembling an existing program (parsed or decoded): its PSUM counts as fresh.
    pub fn from_program(program: Program) -> Self {
        Assembler {
            program,
            psum_written: PsumBits::new(),
            psum_unwritten: PsumBits::new(),
            validated: 0,
            plan: PlanCache::default(),
            balance: None,
            unpinned: Vec::new(),
            unresolved: None,
        }
    }

    /// Keep, from now on, the `accumulate` operand of each `nc_matmul` as given before its
    /// resolution (a recording trace whose program a later lowering re-appends with moved
    /// operands: docs/nki.md "Lowering").
    pub fn keep_unresolved(&mut self) {
        self.unresolved.get_or_insert_with(Vec::new);
    }

    /// The `accumulate` operand instruction `index` was appended with, when `keep_unresolved`
    /// kept it (its `accumulate=None` was resolved on append); `None` otherwise.
    pub fn unresolved_accumulate(&self, index: usize) -> Option<&Arg> {
        let kept = self.unresolved.as_ref()?;
        let i = kept
            .binary_search_by_key(&(index as u32), |(k, _)| *k)
            .ok()?;
        Some(&kept[i].1)
    }

    /// Whether instruction `index` was appended without an engine (`unpinned`).
    pub fn is_unpinned(&self, index: usize) -> bool {
        self.unpinned.binary_search(&(index as u32)).is_ok()
    }

    /// Choose the engines of instructions appended without one by `EngineBalance`'s rule with
    /// generation `g`'s costs (`Some`), or by the ISA default (`None`, the initial state).
    /// Instructions already appended keep their engines; they count towards the balance.
    pub fn set_engine_balance(&mut self, g: Option<&'static Generation>) {
        self.balance = g.map(|g| {
            let mut b = EngineBalance::new(g);
            for ins in &self.program.instrs {
                b.record(ins);
            }
            b
        });
    }

    /// Modelled busy time of VectorE, ScalarE, GpSimd the engine balance has counted, ps
    /// (`None` when balancing is off).
    pub fn engine_balance_ps(&self) -> Option<[u64; 3]> {
        self.balance.as_ref().map(EngineBalance::busy_ps)
    }

    /// Indices of the instructions appended without an engine, ascending.
    pub fn unpinned(&self) -> &[u32] {
        &self.unpinned
    }

    /// The engines `EngineBalance`'s rule (generation `g`'s costs) gives the instructions
    /// appended without one, replayed over the program as it stands: (index, engine) per such
    /// instruction the rule decides (its candidates, front-end stores), in program order; the
    /// others keep the ISA default engine they were appended with. The rule is the one `set_engine_balance` applies while
    /// appending (it reads only the instructions before each one), so a program assembled
    /// without balancing and then given these engines (`set_engine`) is the program assembled
    /// with it. Nothing changes here.
    pub fn engine_choices(&self, g: &'static Generation) -> Vec<(usize, Engine)> {
        let mut b = EngineBalance::new(g);
        let mut next = self.unpinned.iter().peekable();
        let mut out = Vec::with_capacity(self.unpinned.len());
        for (i, ins) in self.program.instrs.iter().enumerate() {
            if next.next_if(|&&u| u as usize == i).is_none() {
                b.record(ins);
                continue;
            }
            let Some(chosen) = b.choose(ins) else {
                b.record(ins); // (not the rule's: the ISA default engine it has)
                continue;
            };
            let default = crate::isa::default_engine::default_engine_of(ins);
            let mut probe = ins.clone();
            probe.engine = chosen;
            if chosen != default && engines::validate(&probe).is_err() {
                probe.engine = default; // (as `append`: the chosen engine refuses it)
            }
            b.record(&probe);
            out.push((i, probe.engine));
        }
        out
    }

    /// Give instruction `index` engine `engine` (a pass's decision, `engine_choices`),
    /// validated as when appended; an error leaves it as it was.
    pub fn set_engine(&mut self, index: usize, engine: Engine) -> Result<()> {
        let Some(ins) = self.program.instrs.get_mut(index) else {
            return Err(fail(
                ErrorKind::Value,
                "instruction_out_of_range",
                format!(
                    "no instruction {index} (the program has {})",
                    self.program.instrs.len()
                ),
            )
            .operand("index"));
        };
        if ins.engine == engine {
            return Ok(());
        }
        let old = std::mem::replace(&mut ins.engine, engine);
        if let Err(e) = engines::validate(ins) {
            ins.engine = old;
            return Err(e.at(index, crate::isa::text::format_instr(ins)));
        }
        self.plan.clear();
        Ok(())
    }

    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The program's run plan under the cost model `cost` (`Device::run_planned`): cached,
    /// dropped whenever the program changes.
    pub fn run_plan(&self, cost: &dyn CostModel) -> Arc<RunPlan> {
        self.plan.get(&self.program, cost)
    }

    /// `run_plan`, a plan it has to build asking `keep_going` now and then whether to go on
    /// (false: an `Interrupted` error, rule `interrupted`).
    pub fn run_plan_checked(
        &self,
        cost: &dyn CostModel,
        keep_going: &mut dyn FnMut() -> bool,
    ) -> Result<Arc<RunPlan>> {
        self.plan.get_checked(&self.program, cost, keep_going)
    }

    pub fn into_program(self) -> Program {
        self.program
    }

    pub fn len(&self) -> usize {
        self.program.instrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.program.instrs.is_empty()
    }

    /// Append one instruction: `ins.args` aligned with the ISA parameters (`Arg::Absent` =
    /// omitted, replaced by the parameter's default), `Engine::Unknown` = the ISA's default
    /// engine. The instruction is validated before it enters the program; with
    /// `resolve_accumulate`, an `nc_matmul` with `accumulate=None` is resolved (see
    /// `resolve_accumulate`). Errors name the instruction being assembled.
    pub fn append(&mut self, mut ins: Instr, resolve_accumulate: bool) -> Result<Appended> {
        let index = self.len();
        let op = ins.op;
        let at = |e: crate::EmuError| e.at(index, format!("{} (being assembled)", ins_name(op)));
        check_operand_count(ins.op, ins.args.len()).map_err(at)?;
        fill_defaults(&mut ins);
        let unpinned = ins.engine == Engine::Unknown;
        let mut valid = false; // (a chosen engine's validation, not repeated)
        if unpinned {
            // The ISA's default-engine rule (e.g. int32 tensor_tensor -> GpSimd).
            let default = crate::isa::default_engine::default_engine_of(&ins);
            ins.engine = self
                .balance
                .as_ref()
                .and_then(|b| b.choose(&ins))
                .unwrap_or(default);
            if ins.engine != default {
                valid = engines::validate(&ins).is_ok();
                if !valid {
                    ins.engine = default; // a rule of the chosen engine refuses it: the default's error
                }
            }
        }
        if !valid {
            engines::validate(&ins).map_err(at)?;
        }
        if resolve_accumulate {
            self.check_accumulate_written(&ins).map_err(at)?;
        }
        let accumulate_mixed = if ins.op == Opcode::NcMatmul && resolve_accumulate {
            let given = ins.args[ops::NcMatmul::ACCUMULATE].clone();
            let mixed = self.resolve_accumulate(&mut ins).map_err(at)?;
            if let Some(kept) = &mut self.unresolved {
                kept.push((index as u32, given));
            }
            mixed
        } else {
            false
        };
        self.mark_psum_written(&ins);
        if let Some(b) = &mut self.balance {
            b.record(&ins);
        }
        if self.validated == index {
            self.validated += 1;
        }
        if unpinned {
            self.unpinned.push(index as u32);
        }
        self.program.instrs.push(ins);
        self.plan.clear();
        Ok(Appended {
            index,
            accumulate_mixed,
        })
    }

    /// Remove the last instruction (a front end refusing it after `append`, e.g. a warning
    /// turned into an error). The PSUM state it recorded stays.
    pub fn pop(&mut self) -> Option<Instr> {
        let ins = self.program.instrs.pop();
        if let (Some(b), Some(i)) = (&mut self.balance, &ins) {
            b.unrecord(i);
        }
        if self
            .unpinned
            .last()
            .is_some_and(|&u| u as usize == self.len())
        {
            self.unpinned.pop();
        }
        let len = self.program.instrs.len();
        if let Some(kept) = &mut self.unresolved {
            if kept.last().is_some_and(|&(u, _)| u as usize == len) {
                kept.pop();
            }
        }
        self.plan.clear();
        self.validated = self.validated.min(self.len());
        ins
    }

    /// Move operand `arg` of instruction `index` by `delta` bytes within its partitions, for each
    /// `(index, arg, delta)` (a pass's decision: `machine::repeats::find`'s reads moved to an
    /// earlier result), each moved instruction validated as when appended; an error leaves the
    /// instruction it names as it was.
    pub fn move_operands(&mut self, moves: &[(usize, usize, i64)]) -> Result<()> {
        for &(index, arg, delta) in moves {
            let n = self.program.instrs.len();
            let ins = self.program.instrs.get_mut(index).ok_or_else(|| {
                fail(
                    ErrorKind::Value,
                    "instruction_out_of_range",
                    format!("no instruction {index} (the program has {n})"),
                )
                .operand("index")
            })?;
            let old = ins.clone();
            let moved = match ins.args.get_mut(arg) {
                Some(Arg::Tensor(ap)) => ap.offset.checked_add_signed(delta).map(|o| ap.offset = o),
                _ => None,
            };
            let checked = match moved {
                Some(()) => engines::validate(ins),
                None => Err(fail(
                    ErrorKind::Value,
                    "operand_not_movable",
                    format!("operand {arg} of instruction {index} is not a tensor that can move by {delta} bytes"),
                )
                .operand("moves")),
            };
            if let Err(e) = checked {
                *ins = old;
                return Err(e.at(index, crate::isa::text::format_instr(ins)));
            }
        }
        self.plan.clear();
        Ok(())
    }

    /// Remove the instructions at `indices` (ascending; a pass's decision, e.g. the exact repeats
    /// `machine::repeats::exact_repeats` finds): the others keep their order, and the
    /// bookkeeping that names instructions by index (unpinned, kept `accumulate` operands,
    /// validation) follows them. The PSUM state stays (what the program wrote is unchanged).
    /// Drop the PSUM -> SBUF copies among `copies` whose readers can read PSUM instead, those
    /// readers moved there (`machine::forward`; the NKI pass `psum_forward`). Returns the copies
    /// dropped (ascending, indices before the removal) and the reads moved.
    pub fn forward_copies(
        &mut self,
        copies: &[usize],
        last: bool,
        which: crate::machine::forward::Copies,
    ) -> Result<(Vec<usize>, usize)> {
        let mut sorted = copies.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let (gone, moved) =
            crate::machine::forward::forward(&mut self.program, &sorted, last, which);
        self.plan.clear();
        self.remove(&gone)?;
        Ok((gone, moved))
    }

    pub fn remove(&mut self, indices: &[usize]) -> Result<()> {
        let n = self.len();
        if indices.windows(2).any(|w| w[0] >= w[1]) || indices.last().is_some_and(|&i| i >= n) {
            return Err(fail(
                ErrorKind::Value,
                "instruction_out_of_range",
                format!("indices must be ascending and below {n}"),
            )
            .operand("indices"));
        }
        if indices.is_empty() {
            return Ok(());
        }
        // new index of every kept instruction: old index - removed before it
        let shift = |i: u32| -> Option<u32> {
            match indices.binary_search(&(i as usize)) {
                Ok(_) => None,
                Err(k) => Some(i - k as u32),
            }
        };
        let mut drop = indices.iter().copied().peekable();
        let old = std::mem::take(&mut self.program.instrs);
        let mut kept = Vec::with_capacity(n - indices.len());
        for (i, ins) in old.into_iter().enumerate() {
            if drop.next_if_eq(&i).is_some() {
                if let Some(b) = &mut self.balance {
                    b.unrecord(&ins);
                }
                continue;
            }
            kept.push(ins);
        }
        self.program.instrs = kept;
        self.unpinned = self.unpinned.iter().filter_map(|&u| shift(u)).collect();
        if let Some(v) = &mut self.unresolved {
            *v = std::mem::take(v)
                .into_iter()
                .filter_map(|(u, a)| shift(u).map(|u| (u, a)))
                .collect();
        }
        self.validated -= indices.partition_point(|&i| i < self.validated);
        self.plan.clear();
        Ok(())
    }

    /// Mark PSUM bytes `offset..offset + nbytes` of partitions `start..start + parts` as freshly
    /// allocated: the next matmul with accumulate=None overwrites them. Clipped to the PSUM.
    pub fn psum_fresh(&mut self, start: u32, parts: u32, offset: u64, nbytes: u64) {
        let end = offset.saturating_add(nbytes).min(PSUM_PART_BYTES as u64) as usize;
        let offset = (offset as usize).min(end);
        let parts = partition_mask(start as usize, parts as usize);
        let (lo, hi) = (offset / 2, end.div_ceil(2));
        self.psum_written.assign(parts, lo, hi, false);
        self.psum_unwritten.assign(parts, lo, hi, true);
    }

    /// An accumulating matmul (`accumulate=True`) must not add into allocated PSUM of which no
    /// byte has been written by any instruction since its allocation.
    fn check_accumulate_written(&self, ins: &Instr) -> Result<()> {
        let dst = match ins.op {
            Opcode::NcMatmul => {
                let mm = ops::NcMatmul::view(ins)?;
                if mm.accumulate != Some(true) {
                    return Ok(());
                }
                mm.dst
            }
            Opcode::NcMatmulMx => {
                let mm = ops::NcMatmulMx::view(ins)?;
                if mm.accumulate != Some(true) {
                    return Ok(());
                }
                mm.dst
            }
            _ => return Ok(()),
        };
        if dst.dynamic.is_some() {
            return Ok(());
        }
        let (parts, ranges) = unit_ranges(dst);
        let rows = parts.count_ones() as usize;
        let total: usize = ranges.iter().map(|(a, b)| rows * (b - a)).sum();
        let never_written = ranges
            .iter()
            .all(|&(a, b)| self.psum_unwritten.all_set(parts, a, b));
        // The whole dst never written: the kernel accumulates onto garbage (a dst written in
        // part is a pattern hardware allows, e.g. overlapping accumulation groups).
        if total > 0 && never_written {
            return Err(fail(
                ErrorKind::Value,
                "matmul_accumulate_unwritten",
                format!(
                    "accumulate=True adds into PSUM bytes {}.. of partitions {}..{} that nothing has written since the tile was allocated: write it first (accumulate=False / None, or memset)",
                    dst.offset,
                    dst.start,
                    dst.start + dst.parts,
                ),
            )
            .operand("dst"));
        }
        Ok(())
    }

    /// Every PSUM operand the instruction writes is written from now on.
    fn mark_psum_written(&mut self, ins: &Instr) {
        for (p, a) in ins.op.spec().params.iter().zip(&ins.args) {
            if let Arg::Tensor(ap) = a {
                if ap.mem != crate::memory::Mem::Psum || !p.access.writes() {
                    continue;
                }
                if ap.dynamic.is_some() {
                    // unknown bytes: treat the partitions as written (no false errors)
                    let parts = partition_mask(ap.start as usize, ap.parts as usize);
                    self.psum_unwritten
                        .assign(parts, 0, PSUM_PART_BYTES / 2, false);
                    continue;
                }
                let (parts, ranges) = unit_ranges(ap);
                for (lo, hi) in ranges {
                    self.psum_unwritten.assign(parts, lo, hi, false);
                }
            }
        }
    }

    /// The program with the semaphores its data dependencies need (automatic synchronisation).
    /// The added instructions and semaphores are validated like appended ones, so the synced
    /// program, too, can run with `RunOptions::prevalidated`.
    pub fn synced(&self) -> Result<Assembler> {
        self.synced_checked(&mut || true)
    }

    /// `synced`, asking `keep_going` now and then (every `autosync::CHECK_EVERY`
    /// instructions) whether to go on; false stops it with an `Interrupted` error.
    pub fn synced_checked(&self, keep_going: &mut dyn FnMut() -> bool) -> Result<Assembler> {
        let program = autosync::auto_sync_checked(&self.program, keep_going)?;
        for (i, ins) in program.instrs.iter().enumerate() {
            if i % autosync::CHECK_EVERY == autosync::CHECK_EVERY - 1 && !keep_going() {
                return Err(autosync::cancelled(i));
            }
            // Auto-sync only adds waits and signals: an instruction validated when appended
            // needs only its synchronisation checked again.
            let checked = if i < self.validated {
                crate::isa::validate::check_sync(ins)
            } else {
                crate::engines::validate(ins)
            };
            checked.map_err(|e| e.at(i, crate::isa::text::format_instr(ins)))?;
        }
        Ok(Assembler {
            program,
            psum_written: self.psum_written.clone(),
            psum_unwritten: self.psum_unwritten.clone(),
            validated: self.validated,
            plan: PlanCache::default(),
            balance: self.balance.clone(),
            unpinned: Vec::new(), // (auto-sync adds instructions: the indices would not hold)
            unresolved: None,
        })
    }

    /// `accumulate=None` -> False if no element of the dst was matmul-written since its PSUM
    /// allocation, True if all were; mixed stays None (returns true: the front end warns).
    /// Every dst element is matmul-written afterwards.
    fn resolve_accumulate(&mut self, ins: &mut Instr) -> Result<bool> {
        let mm = ops::NcMatmul::view(ins)?;
        let (parts, ranges) = unit_ranges(mm.dst);
        let resolved = if mm.accumulate.is_none() {
            let bits = &self.psum_written;
            if ranges.iter().all(|&(a, b)| bits.none_set(parts, a, b)) {
                Some(false) // no element written (an empty dst too)
            } else if ranges.iter().all(|&(a, b)| bits.all_set(parts, a, b)) {
                Some(true)
            } else {
                None
            }
        } else {
            None
        };
        let mixed = mm.accumulate.is_none() && resolved.is_none();
        for (a, b) in ranges {
            self.psum_written.assign(parts, a, b, true);
        }
        if let Some(flag) = resolved {
            ins.args[ops::NcMatmul::ACCUMULATE] = Arg::Bool(flag);
        }
        Ok(mixed)
    }
}

fn ins_name(op: Opcode) -> &'static str {
    op.spec().name
}

/// An instruction takes exactly as many operands as the ISA lists (omitted ones as Absent).
pub fn check_operand_count(op: Opcode, n: usize) -> Result<()> {
    let spec = op.spec();
    if n != spec.params.len() {
        return Err(fail(
            ErrorKind::Value,
            "operand_count_mismatch",
            format!(
                "{} takes {} operands, got {n}",
                spec.name,
                spec.params.len()
            ),
        ));
    }
    Ok(())
}

/// An instruction by its ISA name.
pub fn opcode_named(name: &str) -> Result<Opcode> {
    Opcode::from_name(name).ok_or_else(|| {
        fail(
            ErrorKind::Value,
            "unknown_instruction",
            format!("unknown instruction {name:?}"),
        )
    })
}

/// An engine by name (`Engine::NAMES`).
pub fn engine_named(name: &str) -> Result<Engine> {
    Engine::NAMES
        .iter()
        .position(|n| *n == name)
        .and_then(|i| Engine::from_u8(i as u8))
        .ok_or_else(|| {
            fail(
                ErrorKind::Value,
                "unknown_engine",
                format!(
                    "unknown engine {name:?} (one of {})",
                    Engine::NAMES.join(", ")
                ),
            )
            .operand("engine")
        })
}

/// Omitted operands with an ISA default take it (an omitted required operand stays Absent and
/// fails validation; an optional one without a default stays Absent).
pub(crate) fn fill_defaults(ins: &mut Instr) {
    for (p, a) in ins.op.spec().params.iter().zip(ins.args.iter_mut()) {
        if matches!(a, Arg::Absent) && !matches!(p.default, ParamDefault::Absent) {
            if let Some(d) = Arg::from_default(&p.default, p.kind) {
                *a = d;
            }
        }
    }
}

/// The partitions an access pattern covers (a bit per partition) and the 2-byte units of a row
/// it covers, as half-open ranges relative to the row (one range when rows are contiguous; the
/// same in every partition).
fn unit_ranges(ap: &Ap) -> (u128, Vec<(usize, usize)>) {
    let es = ap.dtype.size();
    let parts = partition_mask(ap.start as usize, ap.parts as usize);
    let b = ap.offset as usize;
    if ap.is_row_contiguous() {
        return (parts, vec![(b / 2, (b + ap.free_size() * es).div_ceil(2))]);
    }
    let ranges = ap
        .row_offsets()
        .iter()
        .map(|o| {
            let c = (b as i64 + o * es as i64) as usize;
            (c / 2, (c + es).div_ceil(2))
        })
        .collect();
    (parts, ranges)
}

/// Partitions `start..start + n` (clipped to the PSUM's partitions) as one bit each.
fn partition_mask(start: usize, n: usize) -> u128 {
    let end = start.saturating_add(n).min(PARTITIONS);
    if start >= end {
        return 0;
    }
    let upto = |k: usize| {
        if k >= 128 {
            u128::MAX
        } else {
            (1u128 << k) - 1
        }
    };
    upto(end) & !upto(start)
}

/// One bit per 2-byte unit of the PSUM, stored column-major: for each unit of a row, a bit per
/// partition, so a tile (the same byte range in a set of partitions) is one pass over its columns.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PsumBits {
    cols: Vec<u128>,
}

const _: () = assert!(
    PARTITIONS <= 128,
    "PsumBits holds a partition per bit of a u128"
);

impl PsumBits {
    fn new() -> Self {
        PsumBits {
            cols: vec![0; PSUM_PART_BYTES / 2],
        }
    }

    /// Number of one bits in units `lo..hi` of the partitions in `parts` (units past the end
    /// count as zero): what `all_set` / `none_set` answer without counting (tests).
    #[cfg(test)]
    fn count(&self, parts: u128, lo: usize, hi: usize) -> usize {
        let hi = hi.min(self.cols.len());
        let lo = lo.min(hi);
        self.cols[lo..hi]
            .iter()
            .map(|c| (c & parts).count_ones() as usize)
            .sum()
    }

    /// Whether every bit of units `lo..hi` of the partitions in `parts` is one (units past the
    /// end count as zero; an empty range or no partition: true). Stops at the first zero bit.
    fn all_set(&self, parts: u128, lo: usize, hi: usize) -> bool {
        if parts == 0 || lo >= hi {
            return true;
        }
        hi <= self.cols.len() && self.cols[lo..hi].iter().all(|c| c & parts == parts)
    }

    /// Whether no bit of units `lo..hi` of the partitions in `parts` is one (units past the end
    /// count as zero). Stops at the first one bit.
    fn none_set(&self, parts: u128, lo: usize, hi: usize) -> bool {
        let hi = hi.min(self.cols.len());
        let lo = lo.min(hi);
        self.cols[lo..hi].iter().all(|c| c & parts == 0)
    }

    /// Set or clear units `lo..hi` of the partitions in `parts` (units past the end are ignored).
    fn assign(&mut self, parts: u128, lo: usize, hi: usize, on: bool) {
        let hi = hi.min(self.cols.len());
        let lo = lo.min(hi);
        let cols = &mut self.cols[lo..hi];
        if parts == u128::MAX {
            // Every partition (the usual tile): a fill, which compiles to a memset; the loops
            // below go one u128 at a time (a 2 KiB PSUM tile took ~1.3 us per bitmap).
            cols.fill(if on { u128::MAX } else { 0 });
        } else if on {
            cols.iter_mut().for_each(|c| *c |= parts);
        } else {
            cols.iter_mut().for_each(|c| *c &= !parts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::text::parse_instr_unchecked;

    const MM: &str = "nc_matmul dst=psum:float32[0:128]+0[[1,512]] \
        stationary=sbuf:bfloat16[0:128]+0[[1,128]] moving=sbuf:bfloat16[0:128]+256[[1,512]]";

    /// An nc_matmul into `dst` (accumulate omitted unless given).
    fn matmul(dst: &str, accumulate: Option<bool>) -> Instr {
        let mut text = MM.replace("psum:float32[0:128]+0[[1,512]]", dst);
        if let Some(a) = accumulate {
            text.push_str(&format!(" accumulate={a}"));
        }
        parse_instr_unchecked(&text).expect("test instruction parses")
    }

    fn accumulate_of(a: &Assembler, i: usize) -> Option<bool> {
        ops::NcMatmul::view(&a.program().instrs[i])
            .expect("matmul view")
            .accumulate
    }

    const DST: &str = "psum:float32[0:128]+0[[1,512]]";

    #[test]
    fn psum_bits_assign_to_every_partition_matches_one_partition_at_a_time() {
        let (mut all, mut each) = (PsumBits::new(), PsumBits::new());
        all.assign(partition_mask(3, 5), 10, 40, true);
        each.assign(partition_mask(3, 5), 10, 40, true);
        let steps = [
            (0, 100, true),
            (50, 60, false),
            (90, usize::MAX, true),
            (20, 30, false),
            (35, 12, true),
        ];
        for (lo, hi, on) in steps {
            all.assign(u128::MAX, lo, hi, on);
            for p in 0..128 {
                each.assign(1u128 << p, lo, hi, on);
            }
            assert_eq!(all, each, "{lo}..{hi} {on}");
        }
        // set: 0..20, 30..50, 60..end
        assert_eq!(
            all.count(u128::MAX, 0, usize::MAX),
            128 * (20 + 20 + all.cols.len() - 60)
        );
    }

    #[test]
    fn psum_bits_all_and_none_agree_with_counting_the_bits() {
        let mut bits = PsumBits::new();
        let n = bits.cols.len();
        // a pseudo-random pattern, some columns full, some empty
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for (i, c) in bits.cols.iter_mut().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *c = match i % 5 {
                0 => u128::MAX,
                1 => 0,
                _ => (x as u128) << 64 | (x.rotate_left(17) as u128),
            };
        }
        let count = |parts: u128, lo: usize, hi: usize| -> usize {
            (lo..hi)
                .map(|u| {
                    bits.cols
                        .get(u)
                        .map_or(0, |c| (c & parts).count_ones() as usize)
                })
                .sum()
        };
        let parts_list = [0u128, 1, u128::MAX, 0xffff << 64, partition_mask(3, 60)];
        let ranges = [
            (0, 0),
            (0, 1),
            (5, 6),
            (0, 5),
            (10, 15),
            (n - 2, n),
            (n - 1, n + 3),
            (0, n),
        ];
        for parts in parts_list {
            for &(lo, hi) in &ranges {
                let total = parts.count_ones() as usize * (hi - lo);
                let c = count(parts, lo, hi);
                assert_eq!(
                    bits.all_set(parts, lo, hi),
                    c == total,
                    "{parts:x} {lo}..{hi}"
                );
                assert_eq!(bits.none_set(parts, lo, hi), c == 0, "{parts:x} {lo}..{hi}");
            }
        }
    }

    #[test]
    fn kept_unresolved_accumulate_reappends_as_given() {
        // a lowering that moves a matmul appends it again with `accumulate` as given: resolved
        // against the PSUM state where it lands, not the first program's decision
        let mut a = Assembler::new(0).unwrap();
        a.keep_unresolved();
        a.append(matmul(DST, None), true).unwrap();
        a.append(matmul(DST, None), true).unwrap();
        a.append(matmul(DST, Some(true)), true).unwrap();
        assert_eq!(
            (accumulate_of(&a, 0), accumulate_of(&a, 1)),
            (Some(false), Some(true))
        );
        let given = a.unresolved_accumulate(1).cloned().expect("kept");
        let mut again = a.program().instrs[1].clone();
        again.args[ops::NcMatmul::ACCUMULATE] = given;
        let mut b = Assembler::new(0).unwrap();
        b.append(again, true).unwrap();
        assert_eq!(accumulate_of(&b, 0), Some(false)); // fresh PSUM there: overwrite
        assert!(a.unresolved_accumulate(2).is_some()); // (as given: true)
        a.pop();
        assert!(a.unresolved_accumulate(2).is_none());
        assert!(Assembler::new(0)
            .unwrap()
            .unresolved_accumulate(0)
            .is_none());
    }

    #[test]
    fn fresh_psum_resolves_to_overwrite_then_accumulate() {
        let mut a = Assembler::new(0).unwrap();
        let r = a.append(matmul(DST, None), true).unwrap();
        assert_eq!(
            r,
            Appended {
                index: 0,
                accumulate_mixed: false
            }
        );
        assert_eq!(accumulate_of(&a, 0), Some(false));
        let r = a.append(matmul(DST, None), true).unwrap();
        assert!(!r.accumulate_mixed);
        assert_eq!(accumulate_of(&a, 1), Some(true));
    }

    #[test]
    fn psum_fresh_restarts_the_accumulation() {
        let mut a = Assembler::new(0).unwrap();
        a.append(matmul(DST, None), true).unwrap();
        a.psum_fresh(0, 128, 0, 2048);
        a.append(matmul(DST, None), true).unwrap();
        assert_eq!(accumulate_of(&a, 1), Some(false));
    }

    #[test]
    fn partly_written_dst_stays_none_and_is_reported() {
        let mut a = Assembler::new(0).unwrap();
        a.append(matmul(DST, None), true).unwrap();
        // Partitions 64..128 are reallocated: half the dst is fresh, half matmul-written.
        a.psum_fresh(64, 64, 0, 2048);
        let r = a.append(matmul(DST, None), true).unwrap();
        assert!(r.accumulate_mixed);
        assert_eq!(accumulate_of(&a, r.index), None);
        // Afterwards the whole dst counts as written.
        a.append(matmul(DST, None), true).unwrap();
        assert_eq!(accumulate_of(&a, 2), Some(true));
    }

    #[test]
    fn explicit_flag_is_kept_and_resolution_can_be_off() {
        let mut a = Assembler::new(0).unwrap();
        a.append(matmul(DST, Some(true)), true).unwrap();
        assert_eq!(accumulate_of(&a, 0), Some(true));
        let r = a.append(matmul(DST, None), false).unwrap();
        assert!(!r.accumulate_mixed);
        assert_eq!(accumulate_of(&a, 1), None);
    }

    #[test]
    fn bank_offsets_are_tracked_separately() {
        let mut a = Assembler::new(0).unwrap();
        a.append(matmul(DST, None), true).unwrap();
        // Bank 1 (offset 2048) was never written.
        let other = "psum:float32[0:128]+2048[[1,512]]";
        a.append(matmul(other, None), true).unwrap();
        assert_eq!(accumulate_of(&a, 1), Some(false));
    }

    #[test]
    fn assembler_rules_have_ids() {
        assert_eq!(Assembler::new(8).unwrap_err().rule, "core_out_of_range");
        assert_eq!(Assembler::new(-1).unwrap_err().rule, "core_out_of_range");
        assert_eq!(
            opcode_named("nope").unwrap_err().rule,
            "unknown_instruction"
        );
        assert_eq!(engine_named("warp").unwrap_err().rule, "unknown_engine");
        assert_eq!(engine_named("vector").unwrap(), Engine::Vector);
        let mut ins = matmul(DST, None);
        ins.args.pop();
        let mut a = Assembler::new(0).unwrap();
        let e = a.append(ins, true).unwrap_err();
        assert_eq!(e.rule, "operand_count_mismatch");
        assert_eq!(e.instruction.map(|(i, _)| i), Some(0));
        assert!(a.is_empty());
    }

    #[test]
    fn defaults_and_default_engine_are_filled() {
        let mut a = Assembler::new(0).unwrap();
        let mut ins = matmul(DST, None);
        ins.engine = Engine::Unknown;
        for arg in ins.args.iter_mut().skip(3) {
            *arg = Arg::Absent;
        }
        a.append(ins, true).unwrap();
        let got = &a.program().instrs[0];
        assert_eq!(got.engine, Engine::Tensor);
        let mm = ops::NcMatmul::view(got).unwrap();
        assert!(!mm.is_transpose);
        assert_eq!(a.pop().map(|i| i.op), Some(Opcode::NcMatmul));
        assert!(a.is_empty());
    }

    #[test]
    fn psum_bits_count_and_assign_per_partition() {
        let mut b = PsumBits::new();
        let all = partition_mask(0, 128);
        assert_eq!(all.count_ones(), 128);
        assert_eq!(partition_mask(120, 20).count_ones(), 8);
        assert_eq!(partition_mask(128, 4), 0);
        b.assign(all, 10, 150, true);
        assert_eq!(b.count(all, 0, 200), 128 * 140);
        assert_eq!(b.count(partition_mask(3, 2), 60, 70), 2 * 10);
        b.assign(partition_mask(0, 64), 64, 128, false);
        assert_eq!(b.count(all, 0, 200), 128 * 140 - 64 * 64);
        assert_eq!(b.count(all, 0, usize::MAX), 128 * 140 - 64 * 64);
        b.assign(all, 8000, usize::MAX, true);
        assert_eq!(
            b.count(1, 0, usize::MAX),
            140 - 64 + (PSUM_PART_BYTES / 2 - 8000)
        );
    }

    #[test]
    fn synced_rechecks_taken_over_programs_fully() {
        // Never validated: a matmul on the Vector engine, taken over from a program.
        let mut bad = matmul(DST, Some(false));
        bad.engine = Engine::Vector;
        let taken = Assembler::from_program(Program {
            core: 0,
            instrs: vec![bad.clone()],
        });
        assert_eq!(taken.synced().unwrap_err().rule, "engine_not_allowed");
        // Appended instructions were validated; their synced forms still pass in full.
        let copy = "tensor_copy.vector dst=sbuf:float32[0:128]+0[[1,512]] \
            src=psum:float32[0:128]+0[[1,512]]";
        let mut a = Assembler::new(0).unwrap();
        a.append(matmul(DST, Some(false)), false).unwrap();
        a.append(parse_instr_unchecked(copy).unwrap(), false)
            .unwrap();
        a.append(bad, false).unwrap_err();
        let synced = a.synced().unwrap();
        assert!(synced.program().instrs[1].waits.len() == 1);
        for ins in &synced.program().instrs {
            engines::validate(ins).unwrap();
        }
        // A popped instruction leaves the validated count within the program.
        a.pop();
        assert_eq!(a.validated, 1);
    }
}
