//! Instruction semantics, one module per engine. Each instruction has a `check` (shape rules,
//! run at validation) and an `exec` (the math, run by the scheduler).

pub mod act;
pub mod alu;
pub mod control;
pub mod dma;
pub mod dynamic;
pub mod engine_select;
pub mod gpsimd;
pub mod gpsimd_gather;
pub mod gpsimd_reduce;
pub mod gpsimd_scan;
pub mod gpsimd_select;
pub mod gpsimd_sort;
pub mod intercore;
pub mod mx;
pub mod rng;
pub mod scalar;
pub mod tensor;
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

use crate::error::{err, ErrorKind::*, Result};
use crate::isa::{Arg, Instr, Opcode};
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
}

impl EngineState {
    /// Back to the power-on state, reusing the allocation (runs reset every running core).
    pub fn reset(&mut self) {
        self.act_regs = [0.0; PARTITIONS];
        self.vec_acc = [0.0; PARTITIONS];
        self.psum_mm.clear();
        self.psum_mm
            .resize(PARTITIONS * PSUM_PART_BYTES / 2 / 64, 0);
    }
}

impl Default for EngineState {
    fn default() -> Self {
        EngineState {
            act_regs: [0.0; PARTITIONS],
            vec_acc: [0.0; PARTITIONS],
            psum_mm: vec![0; PARTITIONS * PSUM_PART_BYTES / 2 / 64],
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
    pub fn read_f32(&self, ap: &Ap) -> Vec<f32> {
        numerics::decode_all(ap.dtype, &self.mems.gather(ap))
    }
    /// Write fp32 results, cast to the dtype of `ap` under the instruction's rounding
    /// (element index = position in `vals`, which drives the stochastic-rounding bits).
    pub fn write_f32(&mut self, ap: &Ap, vals: &[f32]) {
        let bytes = self.rounder.encode_all(ap.dtype, vals);
        self.mems.scatter(ap, &bytes);
    }
    pub fn read_raw(&self, ap: &Ap) -> Vec<u32> {
        numerics::raw_all(ap.dtype, &self.mems.gather(ap))
    }
    pub fn write_raw(&mut self, ap: &Ap, vals: &[u32]) {
        let bytes = numerics::unraw_all(ap.dtype, vals);
        self.mems.scatter(ap, &bytes);
    }
    /// A scalar immediate or a (P,1) tile as P per-partition fp32 values.
    pub fn per_partition(&self, a: &Arg, parts: u32, dflt: f32) -> Vec<f32> {
        match a {
            Arg::Tensor(ap) => self.read_f32(ap),
            a => vec![a.imm_f32().unwrap_or(dflt); parts as usize],
        }
    }
}

/// Same partition count and elements per partition.
pub fn same_shape(a: &Ap, an: &str, b: &Ap, bn: &str) -> Result<()> {
    if a.parts != b.parts || a.free_size() != b.free_size() {
        return Err(err(
            Shape,
            format!("{an} is {:?} ({} x {}) but {bn} is {:?} ({} x {}): partitions and elements per partition must match", a.shape(), a.parts, a.free_size(), b.shape(), b.parts, b.free_size()),
        )
        .operand(bn.to_string()));
    }
    Ok(())
}

/// A (P,1)-style per-partition operand must have the data's partition count and one element.
pub fn check_column(a: &Arg, name: &str, parts: u32) -> Result<()> {
    if let Arg::Tensor(ap) = a {
        if ap.parts != parts || ap.free_size() != 1 {
            return Err(err(
                Shape,
                format!(
                    "{name} must be a scalar or a ({parts}, 1) tile, got {:?}",
                    ap.shape()
                ),
            )
            .operand(name.to_string()));
        }
        if ap.dtype.is_packed() {
            return Err(
                err(Dtype, format!("{name} cannot be a packed MX dtype")).operand(name.to_string())
            );
        }
    }
    Ok(())
}

/// Each engine module lists the opcodes it implements and dispatches its own `check`/`exec`,
/// so adding instructions touches one module and the `MODULES` table.
pub struct Module {
    pub opcodes: &'static [Opcode],
    pub check: fn(&Instr) -> Result<()>,
    pub exec: fn(&Instr, &mut Ctx) -> Result<()>,
}

pub const MODULES: &[&Module] = &[
    &tensor::MODULE,
    &mx::MODULE,
    &vector::MODULE,
    &rng::MODULE,
    &vector_math::MODULE,
    &vector_reduce::MODULE,
    &vector_scan::MODULE,
    &vector_select::MODULE,
    &vector_stats::MODULE,
    &vector_top8::MODULE,
    &vector_shuffle::MODULE,
    &scalar::MODULE,
    &gpsimd::MODULE,
    &gpsimd_select::MODULE,
    &gpsimd_reduce::MODULE,
    &gpsimd_gather::MODULE,
    &gpsimd_scan::MODULE,
    &gpsimd_sort::MODULE,
    &dma::MODULE,
    &intercore::MODULE,
    &control::MODULE,
];

fn module_of(op: Opcode) -> Option<&'static Module> {
    MODULES.iter().copied().find(|m| m.opcodes.contains(&op))
}

pub use engine_select::default_engine;

pub fn is_implemented(op: Opcode) -> bool {
    module_of(op).is_some()
}

/// Instruction-specific rules beyond the generic operand checks.
pub fn check(ins: &Instr) -> Result<()> {
    engine_select::check_engine_ops(ins)?;
    match module_of(ins.op) {
        Some(m) => (m.check)(ins),
        None => Ok(()),
    }
}

/// Execute one instruction's semantics.
pub fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    match module_of(ins.op) {
        Some(m) => match dynamic::resolve_indirect_operands(ins, ctx)? {
            Some(r) => (m.exec)(&r, ctx),
            None => (m.exec)(ins, ctx),
        },
        None => Err(err(
            NotImplemented,
            format!(
                "{} is part of the ISA (it assembles, encodes and prints) but its semantics are not implemented in this build",
                ins.op.spec().name
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::tables::INSTRUCTIONS;

    #[test]
    fn implemented_flags_match_isa_data() {
        for s in INSTRUCTIONS {
            assert_eq!(
                is_implemented(s.opcode),
                s.implemented,
                "{}: isa.toml `implemented` disagrees with the engines",
                s.name
            );
        }
    }
}
