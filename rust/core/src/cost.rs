//! Cost model: how long each instruction occupies its engine and each DMA its queue, in
//! picoseconds. A trait so a measured model can replace the default; the default follows the
//! published NeuronCore-v4 clocks and widths (reference §1.2, §1.12) and is documented in
//! docs/cost-model.md, with the guesses marked.

use crate::isa::{DType, Engine, Instr, Opcode};

pub const TENSOR_GHZ: f64 = 2.4;
pub const ENGINE_GHZ: f64 = 1.2;
/// Minimum initiation interval of Vector/Scalar/GpSimd instructions, in cycles.
pub const MIN_II: u64 = 64;
/// Fixed cost of one DMA transfer (semaphore-to-start across engines), ns.
pub const DMA_FIXED_NS: f64 = 1300.0;
/// Per-core DMA bandwidth when a transfer is spread over the 16 engines, bytes/ns (16 x 33).
pub const DMA_BYTES_PER_NS: f64 = 528.0;
/// Sequencer cost of issuing a DMA trigger or a control instruction, ns.
pub const ISSUE_NS: f64 = 50.0;

pub trait CostModel: Send + Sync {
    /// Time the issuing engine is busy with `ins` (for DMAs: the trigger only).
    fn engine_ps(&self, ins: &Instr) -> u64;
    /// Time a DMA queue is busy with the transfer of `ins` moving `bytes`.
    fn dma_ps(&self, ins: &Instr, bytes: u64) -> u64;
}

fn ps(cycles: f64, ghz: f64) -> u64 {
    ((cycles / ghz) * 1000.0).ceil().max(1.0) as u64
}

/// The published-numbers model.
#[derive(Default, Clone, Copy)]
pub struct DefaultCost;

fn is_16bit(d: DType) -> bool {
    matches!(
        d,
        DType::Bfloat16
            | DType::Float16
            | DType::Float8E4m3
            | DType::Float8E4m3fn
            | DType::Float8E5m2
    )
}

impl CostModel for DefaultCost {
    fn engine_ps(&self, ins: &Instr) -> u64 {
        if crate::isa::validate::is_dma(ins) {
            return ps(ISSUE_NS * ENGINE_GHZ, ENGINE_GHZ);
        }
        let first = ins.args.iter().find_map(|a| a.tensor());
        let n = first.map(|a| a.free_size() as f64).unwrap_or(1.0);
        match (ins.op, ins.engine) {
            (Opcode::Nop, _) => 1000,
            (Opcode::NcMatmul, _) => {
                let st = ins.ap(1).unwrap();
                let mv = ins.ap(2).unwrap();
                let (ns, nm) = (st.free_size() as f64, mv.free_size() as f64);
                let mut c = (ns.min(64.0)).max(nm);
                if matches!(st.dtype, DType::Float32 | DType::Tfloat32) {
                    c *= 4.0;
                }
                ps(c, TENSOR_GHZ)
            }
            (Opcode::NcTranspose, Engine::Tensor) => {
                let d = ins.ap(1).unwrap();
                ps(
                    (d.parts as f64).max((d.free_size() as f64).min(64.0)),
                    TENSOR_GHZ,
                )
            }
            (Opcode::TensorTensor, _) => {
                let all16 = ins
                    .args
                    .iter()
                    .filter_map(|a| a.tensor())
                    .all(|a| is_16bit(a.dtype));
                let c = if all16 { n } else { 2.0 * n };
                ps(c.max(MIN_II as f64), ENGINE_GHZ)
            }
            (Opcode::Iota, _) => ps(150.0 + n, ENGINE_GHZ),
            (Opcode::Memset, _) => ps((n / 2.0).max(MIN_II as f64), ENGINE_GHZ),
            _ => ps(n.max(MIN_II as f64), ENGINE_GHZ),
        }
    }

    fn dma_ps(&self, _ins: &Instr, bytes: u64) -> u64 {
        ((DMA_FIXED_NS + bytes as f64 / DMA_BYTES_PER_NS) * 1000.0).ceil() as u64
    }
}
