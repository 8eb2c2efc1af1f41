//! Instruction semantics, one module per engine. Each instruction has a `check` (shape rules,
//! run at validation) and an `exec` (the math, run by the scheduler).

pub mod act;
pub mod act_fused;
pub mod act_simple;
pub mod act_stream;
pub mod alu;
pub mod column;
pub mod control;
#[rustfmt::skip]
pub mod dispatch;
pub mod dma;
pub mod dynamic;
pub mod engine_select;
pub mod gpsimd;
pub mod gpsimd_gather;
pub mod gpsimd_reduce;
pub mod gpsimd_scan;
pub mod gpsimd_select;
pub mod gpsimd_sort;
pub mod host_memory;
pub mod intercore;
pub mod minmax_rows;
pub mod mx;
pub mod rng;
pub mod rows;
pub mod scalar;
pub mod tensor;
pub mod tensor_sparse;
pub mod vector;
pub mod vector_acc;
pub mod vector_math;
pub mod vector_reduce;
pub mod vector_rules;
pub mod vector_scan;
pub mod vector_select;
pub mod vector_shuffle;
pub mod vector_stats;
pub mod vector_top8;

use crate::error::{fail, EmuError, ErrorKind::*, Result};
use crate::isa::instr::Scalar;
use crate::isa::{Arg, Instr};
use crate::memory::onchip::Mems;
use crate::memory::{Ap, PARTITIONS, PSUM_PART_BYTES};
use crate::numerics;
use crate::numerics::config::Rounder;
use crate::numerics::rng::RngStates;

/// Per-core engine state that outlives single instructions.
pub struct EngineState {
    /// ScalarE accumulator registers, one fp32 per lane.
    pub act_regs: [f32; PARTITIONS],
    /// VectorE accumulator registers, one fp32 per lane (engines::vector_acc).
    pub vec_acc: [f32; PARTITIONS],
    /// One bit per 2-byte PSUM unit: written by a matmul since the run started (for accumulate=None).
    pub psum_mm: Vec<u64>,
    /// Set by the scheduler when an instruction that writes PSUM ran (only those can set bits
    /// in `psum_mm`), so a run without PSUM writes does not clear the 128 KiB bitmap.
    pub psum_mm_dirty: bool,
}

impl EngineState {
    /// Note that `ins` is about to run: one that writes PSUM may set bits in `psum_mm`.
    pub fn note_psum_writer(&mut self, ins: &Instr) {
        if !self.psum_mm_dirty
            && ins
                .tensors()
                .any(|(_, _, acc, ap)| acc.writes() && ap.mem == crate::memory::Mem::Psum)
        {
            self.psum_mm_dirty = true;
        }
    }

    /// Back to the start-of-run state, in place (no reallocation of the 128 KiB bitmap).
    pub fn reset(&mut self) {
        self.act_regs = [0.0; PARTITIONS];
        self.vec_acc = [0.0; PARTITIONS];
        if self.psum_mm_dirty {
            self.psum_mm.fill(0);
            self.psum_mm_dirty = false;
        }
    }
}

impl Default for EngineState {
    fn default() -> Self {
        EngineState {
            act_regs: [0.0; PARTITIONS],
            vec_acc: [0.0; PARTITIONS],
            psum_mm: vec![0; PARTITIONS * PSUM_PART_BYTES / 2 / 64],
            psum_mm_dirty: false,
        }
    }
}

/// What an instruction can touch while it executes.
pub struct Ctx<'a> {
    pub mems: Mems<'a>,
    pub state: &'a mut EngineState,
    /// The core's PRNG states (persist across runs).
    pub rng: &'a mut RngStates,
    /// Output-cast rounding of this instruction (RNE or stochastic; fp8 overflow policy).
    pub rounder: Rounder,
    /// The issuing engine's 64 sequencer registers (for a DMA transfer: their values when it
    /// was triggered).
    pub regs: &'a mut [u32; crate::isa::instr::NUM_REGISTERS as usize],
    /// Set by a taken `branch`: the instruction index the stream continues at.
    pub jump: Option<u32>,
}

impl Ctx<'_> {
    /// Every element of `ap` decoded to fp32, row-major (on-chip patterns decode straight from
    /// memory; HBM and indirect ones through a byte gather).
    pub fn read_f32(&self, ap: &Ap) -> Vec<f32> {
        rows::read_f32_direct(&self.mems, ap)
            .unwrap_or_else(|| numerics::decode_all(ap.dtype, &self.mems.gather(ap)))
    }
    /// Write fp32 results, cast to the dtype of `ap` under the instruction's rounding
    /// (element index = position in `vals`, which drives the stochastic-rounding bits).
    pub fn write_f32(&mut self, ap: &Ap, vals: &[f32]) {
        if !rows::write_f32_direct(self, ap, vals) {
            let bytes = self.rounder.encode_all(ap.dtype, vals);
            self.mems.scatter(ap, &bytes);
        }
    }
    pub fn read_raw(&self, ap: &Ap) -> Vec<u32> {
        rows::read_raw_direct(&self.mems, ap)
            .unwrap_or_else(|| numerics::raw_all(ap.dtype, &self.mems.gather(ap)))
    }
    pub fn write_raw(&mut self, ap: &Ap, vals: &[u32]) {
        if !rows::write_raw_direct(&mut self.mems, ap, vals) {
            let bytes = numerics::unraw_all(ap.dtype, vals);
            self.mems.scatter(ap, &bytes);
        }
    }
    /// A `tensor_or_f32` operand as P per-partition fp32 values (a tile is read, an immediate
    /// repeated).
    pub fn scalar(&self, s: Scalar, parts: u32) -> Vec<f32> {
        match s {
            Scalar::Tile(ap) => self.read_f32(ap),
            Scalar::Imm(i) => vec![i.f32(); parts as usize],
        }
    }
    /// An optional `tensor_or_f32` operand as P per-partition fp32 values, `dflt` when absent.
    pub fn scalar_or(&self, s: Option<Scalar>, parts: u32, dflt: f32) -> Vec<f32> {
        match s {
            Some(s) => self.scalar(s, parts),
            None => vec![dflt; parts as usize],
        }
    }
}

/// Same partition count and elements per partition.
pub fn same_shape(a: &Ap, an: &str, b: &Ap, bn: &str) -> Result<()> {
    if a.parts != b.parts || a.free_size() != b.free_size() {
        return Err(fail(
            Shape,
            "shape_mismatch",
            format!("{an} is {:?} ({} x {}) but {bn} is {:?} ({} x {}): partitions and elements per partition must match", a.shape(), a.parts, a.free_size(), b.shape(), b.parts, b.free_size()),
        )
        .operand(bn.to_string()));
    }
    Ok(())
}

/// An operand that may be a per-partition tile: a `tensor_or_f32` view field (`Scalar`,
/// `Option<Scalar>`) or a tensor (`&Ap`, `Option<&Ap>`).
pub trait TileOperand {
    /// The tile, if the operand is one.
    fn tile(&self) -> Option<&Ap>;
}

impl TileOperand for Scalar<'_> {
    fn tile(&self) -> Option<&Ap> {
        match self {
            Scalar::Tile(ap) => Some(ap),
            Scalar::Imm(_) => None,
        }
    }
}

impl TileOperand for Option<Scalar<'_>> {
    fn tile(&self) -> Option<&Ap> {
        self.as_ref().and_then(|s| s.tile())
    }
}

impl TileOperand for Option<&Ap> {
    fn tile(&self) -> Option<&Ap> {
        *self
    }
}

impl TileOperand for &Ap {
    fn tile(&self) -> Option<&Ap> {
        Some(self)
    }
}

/// A (P,1)-style per-partition operand must have the data's partition count and one element.
pub fn check_column(a: impl TileOperand, name: &str, parts: u32) -> Result<()> {
    match a.tile() {
        Some(ap) if ap.parts != parts || ap.free_size() != 1 || ap.dtype.is_packed() => {
            Err(column_error(ap, name, parts))
        }
        _ => Ok(()),
    }
}

#[cold]
#[inline(never)]
fn column_error(ap: &Ap, name: &str, parts: u32) -> EmuError {
    if ap.dtype.is_packed() && ap.parts == parts && ap.free_size() == 1 {
        return fail(
            Dtype,
            "packed_dtype_not_allowed",
            format!("{name} cannot be a packed MX dtype"),
        )
        .operand(name.to_string());
    }
    fail(
        Shape,
        "column_shape",
        format!(
            "{name} must be a scalar or a ({parts}, 1) tile, got {:?}",
            ap.shape()
        ),
    )
    .operand(name.to_string())
}

/// The semantics of one instruction, implemented by an engine module on the instruction's
/// generated operand view (`impl Semantics for ops::BnStats<'_>`). The dispatch in
/// `dispatch.rs` is generated from isa.toml, so an instruction without an implementation does
/// not compile.
pub trait Semantics {
    /// The instruction's own rules, beyond the generic operand checks of `isa::validate`
    /// (run once, when the instruction enters a program).
    fn check(&self) -> Result<()>;
    /// The instruction's effect on the core's state.
    fn exec(&self, ctx: &mut Ctx) -> Result<()>;
}

pub use engine_select::default_engine;

/// Everything an instruction must satisfy to enter a program: the generic operand checks of
/// the tables, the rules of tensor indirection, then the instruction's own rules.
pub fn validate(ins: &Instr) -> Result<()> {
    crate::isa::validate::validate_generic(ins)?;
    let spec = ins.op.spec();
    for (p, a) in spec.params.iter().zip(&ins.args) {
        if let Arg::Tensor(ap) = a {
            if ap
                .dynamic
                .as_ref()
                .is_some_and(|d| d.kind == crate::memory::DynKind::Indirect)
            {
                dynamic::check_indirect(ins, p, ap).map_err(|e| e.operand(p.name))?;
            }
        }
    }
    dispatch::check(ins)
}

/// Parse text assembly with every instruction fully validated.
pub fn parse_program(text: &str) -> Result<crate::isa::Program> {
    crate::isa::text::parse_program_with(text, validate)
}

/// Decode a binary program with every instruction fully validated.
pub fn decode_program(bytes: &[u8]) -> Result<crate::isa::Program> {
    crate::isa::encode::decode_program_with(bytes, validate)
}

/// Whether `exec` of `ins` is its semantics alone (`exec_plain`): no indirect operand to
/// resolve and no buffer large enough for the host-memory check. Static: a run plan keeps it
/// per instruction (the two scans of the operands were an eighth of a [1, 1] instruction).
pub fn is_plain(ins: &Instr) -> bool {
    host_memory::small(ins) && !dynamic::has_indirect(ins)
}

/// `exec` of an instruction `is_plain` says is plain.
#[inline]
pub fn exec_plain(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    debug_assert!(is_plain(ins));
    dispatch::exec(ins, ctx)
}

/// Execute one instruction's semantics.
pub fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    host_memory::check(ins)?; // (resolving indirect operands keeps their shapes)
    match dynamic::resolve_indirect_operands(ins, ctx)? {
        Some(r) => dispatch::exec(&r, ctx),
        None => dispatch::exec(ins, ctx),
    }
}
