//! Cost model: how long each instruction occupies its engine, how DMA transfers move over the
//! DMA engines, and how long a semaphore takes to be seen. A trait so a measured model can
//! replace the default. The default is keyed on the instruction's *cost class* (the `cost` field
//! of isa/isa.toml) plus operand shapes and dtypes — never on opcodes — so an instruction added to
//! the ISA is costed as soon as it names a class. Every number is in docs/cost-model.md with its
//! source; the guesses are marked there and here (`GUESS`).

use crate::isa::ops::class;
use crate::isa::spec::{Access, DataPath};
use crate::isa::tables::{AluOp, CostClass, DgeMode, MatmulPerfMode};
use crate::isa::{DType, Engine, Instr};
use crate::memory::{Ap, Mem};
use crate::timing::{default_generation, Generation};

/// TensorE clock of the default (trn3) timing, GHz (reference §1.2); other generations: `timing.rs`.
pub const TENSOR_GHZ: f64 = 2.4;
/// VectorE / ScalarE / GpSimd clock of the default (trn3) timing, GHz (reference §1.2).
pub const ENGINE_GHZ: f64 = 1.2;
/// Minimum initiation interval of Vector/Scalar/GpSimd instructions, cycles (reference §1.12).
pub const MIN_II: f64 = 64.0;
/// Matmul start-up latency when the PE array was idle, TensorE cycles (reference §1.12).
pub const MM_INIT_LATENCY: f64 = 64.0;
/// GpSimd start-up cycles of `iota`/`affine_select`/`local_gather` (reference §1.12).
pub const GPSIMD_START: f64 = 150.0;
/// Sequencer cost of issuing a control instruction or a DMA trigger, engine cycles (GUESS: MIN_II).
pub const ISSUE_CYCLES: f64 = 64.0;
/// Time from a semaphore increment to a waiting engine seeing it, ns (GUESS: ~64 cycles @ 1.2 GHz).
pub const SEM_LATENCY_NS: f64 = 53.0;
/// Extra cycles of a Vector/Scalar/GpSimd instruction that reads what the previous instruction
/// of its engine wrote, issued back to back: the documented static instruction overhead of 100
/// engine cycles for dependent instructions (Trn1/Inf2 architecture guide, anchor I5).
pub const DEPENDENT_CYCLES: f64 = 100.0;
/// A dependent instruction with fewer than `SMALL_N` elements per partition pays the guide's
/// second static overhead of 100 cycles ("N << 128") as well: it cannot hide the previous
/// write's commit behind its own streaming. Our reading (applied to dependent instructions
/// only; independent small ones pay MIN_II as the ISA pages give); with it a dependent
/// 1-element ScalarE chain takes 64 + 100 + 100 = 264 cycles, 189 ns on Trn1 (anchor I3).
pub const SMALL_CYCLES: f64 = 100.0;
/// Elements per partition below which an instruction counts as small (the guide's "N << 128").
pub const SMALL_N: f64 = 128.0;
/// Minimum initiation interval of a compute instruction with a runtime (register / tile)
/// address offset, engine cycles (SDK 2.23 ISA docs, `tensor_copy_dynamic_src/dst`: ~600; I7).
pub const DYNAMIC_II: f64 = 600.0;
/// Innermost SBUF/PSUM stride above which an engine port delivers half bandwidth, bytes (I8).
pub const STRIDE_PENALTY_BYTES: i64 = 16;
/// GpSimd rsqrt runs 4x slower than ScalarE's (NC-v2 ISA notes, reference §1.12).
pub const GPSIMD_RSQRT_FACTOR: f64 = 4.0;

/// The published TensorE peaks per core, TFLOPS (reference §1.2), for reports.
pub const PEAK_TFLOPS_BF16: f64 = 79.0;
pub const PEAK_TFLOPS_MX: f64 = 315.0;
pub const PEAK_TFLOPS_FP32: f64 = 20.0;
/// Published sparse peak per core, dense-equivalent TFLOPS FP16/BF16/TF32 (2517 per chip / 8,
/// reference §1.1): reached by the 4x patterns (4:16, 2:8, 1:4); 4:12 gives 3/4 of it and
/// 4:8, 2:4, 1:2 half (derived, docs/cost-model.md).
pub const PEAK_TFLOPS_SPARSE: f64 = 315.0;
/// Dense moving rows the PE array takes per cycle in sparse mode: 4 x 128 of the 5 x 128
/// sparse input width (reference §1.2; the fifth 128 carries the compressed operand / indices,
/// an interpretation: docs/cost-model.md).
pub const SPARSE_MOVING_ROWS: f64 = 4.0 * 128.0;

/// The DMA machinery's numbers (reference §1.1, §1.8).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DmaParams {
    /// DMA engines per core (16).
    pub engines: usize,
    /// Queues per DMA engine (16); a transfer runs on the queue of its issuing stream.
    pub queues: usize,
    /// Partitions served by one engine under the default split (128 / 16 = 8).
    pub partitions_per_engine: u32,
    /// Per-engine bandwidth, bytes/ns (33 on Trn3): the published peak.
    pub engine_bytes_per_ns: f64,
    /// Fraction of `engine_bytes_per_ns` that transfers sustain (`Generation::dma_sustained`).
    pub sustained: f64,
    /// Fixed cost of one transfer (semaphore-to-start across engines), ns (~1300).
    pub fixed_ns: f64,
    /// Engine time per DMA buffer (contiguous run) on top of its bytes, ns (fitted to the Trn2
    /// throughput curve, anchor I2: 4 KiB per partition reaches 96 %).
    pub descriptor_ns: f64,
    /// Minimum engine time of one DMA buffer, ns: a buffer of fewer bytes still occupies its
    /// engine this long, so time per transfer is flat up to ~2 KiB per partition, then linear
    /// (fitted to anchor I2 at 23 B/ns: 256 B 10 %, 512 B 21 %, 1 KiB 42 %, 2 KiB 82 %; GUESS
    /// for trn3; trn1 has none, `Generation::dma_descriptor_min_ns`).
    pub descriptor_min_ns: f64,
    /// Device-wide HBM bandwidth shared by every engine of every core, bytes/ns (4.7 TB/s).
    pub hbm_bytes_per_ns: f64,
    /// QoS classes (v4: 4; `priority` 0 = highest).
    pub priorities: u8,
    /// Chiplets whose HBM stacks are near their own cores only (2 on Trn3, `hw::hbm_chiplet`);
    /// 1: every stack is near every core.
    pub chiplets: usize,
    /// Extra latency of a transfer touching the far chiplet's HBM, ns (ESTIMATE).
    pub far_latency_ns: f64,
    /// Die-to-die bandwidth towards each chiplet for far HBM bytes, bytes/ns (ESTIMATE).
    pub d2d_bytes_per_ns: f64,
}

impl Default for DmaParams {
    fn default() -> Self {
        DmaParams::of(default_generation())
    }
}

impl DmaParams {
    /// The DMA machinery of generation `g`.
    pub fn of(g: &Generation) -> Self {
        DmaParams {
            engines: 16,
            queues: 16,
            partitions_per_engine: 8,
            engine_bytes_per_ns: g.dma_engine_bytes_per_ns,
            sustained: g.dma_sustained,
            fixed_ns: 1300.0,
            descriptor_ns: 7.4,
            descriptor_min_ns: g.dma_descriptor_min_ns,
            hbm_bytes_per_ns: g.hbm_bytes_per_ns,
            priorities: 4,
            chiplets: g.chiplets,
            far_latency_ns: 200.0,
            d2d_bytes_per_ns: g.hbm_bytes_per_ns / 4.0,
        }
    }

    /// Engine time of `descriptors` DMA buffers carrying `bytes` in all, at `rate` of the
    /// engine bandwidth, ns: each buffer takes `max(descriptor_min_ns, descriptor_ns + its
    /// bytes / bandwidth)`.
    pub fn piece_ns(&self, bytes: u64, descriptors: u64, rate: f64) -> f64 {
        let d = descriptors.max(1) as f64;
        let per = bytes as f64 / d / (self.engine_bytes_per_ns * self.sustained * rate.max(0.01));
        d * (self.descriptor_ns + per).max(self.descriptor_min_ns)
    }
}

/// What the scheduler knows about the issue slot of an instruction.
#[derive(Clone, Copy, Debug, Default)]
pub struct Issue {
    /// The stream's previous instruction ended exactly when this one starts (no idle gap):
    /// pipelines are warm and a matmul's LoadStationary ran in the background.
    pub back_to_back: bool,
    /// Issued back to back and reads what the previous instruction of the same engine wrote
    /// (a read-after-write the engine must drain first: `DEPENDENT_CYCLES`).
    pub dependent: bool,
}

/// How a collective instruction moves data between the ranks of its group (the engines layer
/// names it for each collective; the cost model prices it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// No data: every rank waits for the others.
    Barrier,
    /// Each rank of a pair receives the other's src.
    Exchange,
    /// Every rank receives every rank's src (all_gather).
    Gather,
    /// Rank r receives chunk r of the reduction (reduce_scatter).
    ReduceScatter,
    /// Every rank receives the whole reduction (all_reduce).
    Reduce,
    /// Rank r receives chunk r of every rank's src (all_to_all).
    AllToAll,
    /// all_to_all with run-time counts (all_to_all_v).
    AllToAllV,
    /// Each target rank receives its source's src (collective_permute).
    Permute,
}

pub trait CostModel: Send + Sync {
    /// Time the issuing engine is busy with `ins`, ps (for DMAs: the trigger only).
    fn engine_ps(&self, ins: &Instr, issue: Issue) -> u64;
    /// Some key when `engine_ps` depends on nothing but its arguments and the key: a run plan
    /// (machine/run_plan.rs) may then keep the times it computed for a model with the same key.
    /// `None` (the default): computed at every issue.
    fn plan_key(&self) -> Option<usize> {
        None
    }
    /// The DMA machinery's numbers.
    fn dma(&self) -> DmaParams;
    /// Semaphore increment to visibility, ps.
    fn sem_latency_ps(&self) -> u64;
    /// The name of the generation whose constants this model uses ("trn3" ...), for traces.
    fn timing(&self) -> &'static str {
        "custom"
    }
    /// Time from the last arrival of a collective's group to the release of every rank, ps;
    /// `src_bytes` is one rank's src, `ranks` the group size. By default a barrier is one
    /// semaphore hop; data moves on the DMA engines of a core at their aggregate bandwidth
    /// (GUESS: ring algorithm byte counts per rank: exchange n, gather (N-1)n, reduce_scatter
    /// (N-1)n/N, reduce 2(N-1)n/N), plus one fixed DMA cost and one semaphore hop.
    fn collective_ps(&self, kind: CollectiveKind, src_bytes: u64, ranks: usize) -> u64 {
        let sem_latency = self.sem_latency_ps();
        let dma = self.dma();
        let n = ranks.max(1) as f64;
        let b = src_bytes as f64;
        let moved = match kind {
            CollectiveKind::Barrier => return sem_latency,
            CollectiveKind::Exchange => b,
            CollectiveKind::Gather => (n - 1.0) * b,
            CollectiveKind::ReduceScatter => (n - 1.0) * b / n,
            CollectiveKind::Reduce => 2.0 * (n - 1.0) * b / n,
            CollectiveKind::AllToAll | CollectiveKind::AllToAllV => (n - 1.0) * b / n,
            CollectiveKind::Permute => b,
        };
        let bw = dma.engines as f64 * dma.engine_bytes_per_ns * dma.sustained;
        let ns = dma.fixed_ns + if bw > 0.0 { moved / bw } else { 0.0 };
        (ns * 1000.0) as u64 + sem_latency
    }
}

fn ps(cycles: f64, ghz: f64) -> u64 {
    ((cycles / ghz) * 1000.0).ceil().max(1.0) as u64
}

/// The engine's clock under the default (trn3) timing, GHz.
pub fn clock_ghz(e: Engine) -> f64 {
    engine_ghz(default_generation(), e)
}

/// The engine's clock in generation `g`, GHz.
pub fn engine_ghz(g: &Generation, e: Engine) -> f64 {
    match e {
        Engine::Tensor => g.tensor_ghz,
        Engine::Vector => g.vector_ghz,
        Engine::Scalar => g.scalar_ghz,
        Engine::Gpsimd => g.gpsimd_ghz,
        _ => g.sync_ghz,
    }
}

/// The published-numbers model, with one generation's constants (`timing.rs`).
#[derive(Clone, Copy)]
pub struct DefaultCost {
    pub gen: &'static Generation,
}

impl Default for DefaultCost {
    fn default() -> Self {
        DefaultCost {
            gen: default_generation(),
        }
    }
}

/// 8/16-bit floats: the dtypes VectorE/ScalarE perf modes and the 2x data paths apply to.
pub fn is_narrow(d: DType) -> bool {
    matches!(
        d,
        DType::Bfloat16
            | DType::Float16
            | DType::Float8E4m3
            | DType::Float8E4m3fn
            | DType::Float8E5m2
    )
}

fn is_x4(d: DType) -> bool {
    matches!(
        d,
        DType::Float8E4m3fnX4 | DType::Float8E5m2X4 | DType::Float4E2m1fnX4
    )
}

fn is_fp32(d: DType) -> bool {
    matches!(d, DType::Float32 | DType::Tfloat32)
}

/// Operand shape facts the formulas use.
struct Shape<'a> {
    /// Elements per partition of the largest operand (N in reference §1.12).
    n: f64,
    /// The data operands: those of N elements per partition (per-partition scalars excluded).
    data: Operands<'a>,
}

/// Operands held inline (no allocation per costed instruction) up to `INLINE_OPERANDS`, on
/// the heap beyond; read as a slice.
const INLINE_OPERANDS: usize = 8;

enum Operands<'a> {
    Inline([(&'a Ap, bool); INLINE_OPERANDS], usize),
    Heap(Vec<(&'a Ap, bool)>),
}

impl<'a> std::ops::Deref for Operands<'a> {
    type Target = [(&'a Ap, bool)];
    fn deref(&self) -> &Self::Target {
        match self {
            Operands::Inline(a, n) => &a[..*n],
            Operands::Heap(v) => v,
        }
    }
}

/// The filler of unused inline operand slots (never read).
static NO_AP: Ap = Ap {
    mem: Mem::Sbuf,
    dtype: DType::Float32,
    start: 0,
    parts: 0,
    pstep: 0,
    offset: 0,
    dims: Vec::new(),
    dynamic: None,
};

fn shape(ins: &Instr) -> Shape<'_> {
    let all = || {
        ins.tensors()
            .map(|(_, _, acc, ap)| (ap, acc == Access::Write || acc == Access::ReadWrite))
    };
    let n = all().map(|(a, _)| a.free_size()).max().unwrap_or(1) as f64;
    let big = || all().filter(|(a, _)| a.free_size() > 1 || n <= 1.0);
    let mut inline = [(&NO_AP, false); INLINE_OPERANDS];
    let mut k = 0;
    for x in big() {
        if k == INLINE_OPERANDS {
            return Shape {
                n: n.max(1.0),
                data: Operands::Heap(big().collect()),
            };
        }
        inline[k] = x;
        k += 1;
    }
    Shape {
        n: n.max(1.0),
        data: Operands::Inline(inline, k),
    }
}

fn innermost_contiguous(a: &Ap) -> bool {
    a.dims
        .last()
        .is_none_or(|&(step, num)| step == 1 || num <= 1)
}

/// BF16/FP16: the dtypes the documented VectorE / ScalarE performance modes name.
fn is_half(d: DType) -> bool {
    matches!(d, DType::Bfloat16 | DType::Float16)
}

/// Innermost stride of an access pattern in bytes (the innermost dim of more than one element).
fn innermost_stride_bytes(a: &Ap) -> i64 {
    a.dims
        .iter()
        .rev()
        .find(|&&(_, num)| num > 1)
        .map_or(0, |&(step, _)| step.abs() * a.dtype.size() as i64)
}

/// Speed-up of tensor_copy / tensor_scalar from the documented performance modes (Trainium2
/// architecture guide, "Vector Engine Performance Mode"; v4 ScalarE, reference §1.7): VectorE
/// 4x when every operand is BF16/FP16, in SBUF and innermost-contiguous; 2x when BF16/FP16 and
/// either all in SBUF (strided) or innermost-contiguous with one side in PSUM; ScalarE (v4) 2x
/// for BF16/FP16; otherwise 1x.
fn copy_scalar_mode(g: &Generation, engine: Engine, sh: &Shape) -> f64 {
    let half = !sh.data.is_empty() && sh.data.iter().all(|(a, _)| is_half(a.dtype));
    if !half {
        return 1.0;
    }
    match engine {
        Engine::Vector if g.vector_perf_modes => {
            let sbuf = sh.data.iter().all(|(a, _)| a.mem == Mem::Sbuf);
            let contiguous = sh.data.iter().all(|(a, _)| innermost_contiguous(a));
            match (sbuf, contiguous) {
                (true, true) => 4.0,
                (true, false) | (false, true) => 2.0,
                (false, false) => 1.0,
            }
        }
        Engine::Scalar if g.scalar_perf_mode => 2.0,
        _ => 1.0,
    }
}

/// tensor_copy / tensor_scalar cycles: the performance modes, and GpSimd's rsqrt at a quarter
/// of ScalarE's rate.
fn copy_scalar_cycles(g: &Generation, ins: &Instr, eng: Engine, sh: &Shape, n: f64) -> f64 {
    // (The operand view is only built for GpSimd: the dispatch hot path skips it.)
    let rsqrt = eng == Engine::Gpsimd
        && class::VecCopyScalar::of(ins)
            .is_some_and(|v| v.op0 == Some(AluOp::Rsqrt) || v.op1 == Some(AluOp::Rsqrt));
    let n = if rsqrt { n * GPSIMD_RSQRT_FACTOR } else { n };
    (n / copy_scalar_mode(g, eng, sh)).max(MIN_II)
}

/// (contraction K, stationary free M, moving free N) of a pe_matmul instruction, in values.
pub fn matmul_dims(ins: &Instr) -> Option<(f64, f64, f64)> {
    let mm = class::PeMatmul::of(ins)?;
    let (st, mv) = (mm.stationary, mm.moving);
    let mut k = st.parts as f64;
    let (mut m, mut n) = (st.free_size() as f64, mv.free_size() as f64);
    if is_x4(st.dtype) {
        k *= 4.0;
    }
    if mm.perf_mode == Some(MatmulPerfMode::DoubleRow) {
        // double_row: operands are [P, 2, F]; the size-2 dim doubles the contraction.
        k *= 2.0;
        m /= 2.0;
        n /= 2.0;
    }
    Some((k, m, n))
}

/// (dense contraction K, stationary free M, moving free N) of a pe_matmul_sparse instruction:
/// the dense-equivalent shape (K = compressed rows x g/s).
pub fn sparse_matmul_dims(ins: &Instr) -> Option<(f64, f64, f64)> {
    let mm = class::PeMatmulSparse::of(ins)?;
    let r = mm.pattern.ratio() as f64;
    let k = mm.stationary.parts as f64 * r;
    let (m, n) = (
        mm.stationary.free_size() as f64,
        mm.moving.free_size() as f64 / r,
    );
    Some((k, m, n))
}

/// Floating-point operations of `ins` (2 per MAC for matmuls, dense-equivalent for sparse ones; one per output element for
/// elementwise classes; zero for data movement and control).
pub fn flops(ins: &Instr) -> u64 {
    use CostClass as C;
    match ins.op.spec().cost {
        C::PeMatmul => matmul_dims(ins)
            .map(|(k, m, n)| (2.0 * k * m * n) as u64)
            .unwrap_or(0),
        C::PeMatmulSparse => sparse_matmul_dims(ins)
            .map(|(k, m, n)| (2.0 * k * m * n) as u64)
            .unwrap_or(0),
        C::Act
        | C::Vec1in
        | C::Vec1inAcc
        | C::Vec2in
        | C::VecStt
        | C::VecReduce
        | C::VecScan
        | C::VecPred
        | C::VecExp
        | C::Reciprocal
        | C::BnAggr
        | C::Gpsimd1in => {
            let sh = shape(ins);
            sh.data
                .iter()
                .filter(|(_, w)| !*w)
                .map(|(a, _)| a.num_elements() as u64)
                .max()
                .unwrap_or(0)
        }
        _ => 0,
    }
}

/// TensorE matmul: MultiplyMoving over the moving free size (fp32 at 1/4 rate, 1/2 with a
/// one-zero operand); a cold array also pays the LoadStationary and the start-up latency.
fn pe_matmul_cycles(g: &Generation, ins: &Instr, issue: Issue) -> f64 {
    let Some(mm) = class::PeMatmul::of(ins) else {
        return MIN_II;
    };
    let (st, mv) = (mm.stationary, mm.moving);
    let (ns, mut nm) = (st.free_size() as f64, mv.free_size() as f64);
    // double_row halves the columns per pass where the generation has the mode (v3+); without
    // it the two halves of the contraction take a pass each (the moving columns stay).
    let ns = if mm.perf_mode == Some(MatmulPerfMode::DoubleRow) && g.pe_double_row {
        nm /= 2.0;
        ns / 2.0
    } else {
        ns
    };
    // MX (4 values per PE per cycle) is v4 only; earlier generations take four passes.
    if is_x4(st.dtype) && !g.pe_mx {
        nm *= 4.0;
    }
    // Back-to-back: the next LoadStationary overlaps this MultiplyMoving.
    let mut c = ns.min(64.0).max(nm);
    if is_fp32(st.dtype) || is_fp32(mv.dtype) {
        let onezero = mm.is_stationary_onezero == Some(true) || mm.is_moving_onezero == Some(true);
        c *= if onezero { 2.0 } else { 4.0 };
    }
    if !issue.back_to_back {
        // Cold array: the (fast) LoadStationary is exposed, plus the MM start-up.
        c += ns / 4.0 + MM_INIT_LATENCY;
    }
    c
}

/// TensorE sparse matmul: one moving column per cycle as long as its dense rows fit the
/// 4 x 128-row sparse moving width (every pattern with Kc <= 128 does), otherwise
/// proportionally more; fp32/tf32 operands at 1/4 rate as dense (GUESS: sparse fp32 timing is
/// not published); LoadStationary and start-up as dense.
fn pe_matmul_sparse_cycles(ins: &Instr, issue: Issue) -> f64 {
    let (Some(mm), Some((k, m, n))) = (class::PeMatmulSparse::of(ins), sparse_matmul_dims(ins))
    else {
        return MIN_II;
    };
    let per_column = (k / SPARSE_MOVING_ROWS).ceil().max(1.0);
    let mut c = m.min(64.0).max(n * per_column);
    if is_fp32(mm.stationary.dtype) || is_fp32(mm.moving.dtype) {
        c *= 4.0;
    }
    if !issue.back_to_back {
        c += m / 4.0 + MM_INIT_LATENCY;
    }
    c
}

/// A transpose through the PE array: partitions in, up to 64 columns out per cycle.
fn pe_transpose_cycles(sh: &Shape, issue: Issue) -> f64 {
    let d = sh.data.iter().find(|(_, w)| !*w).map(|(a, _)| *a);
    let (p, f) = d.map_or((128.0, sh.n), |a| (a.parts as f64, a.free_size() as f64));
    let c = p.max(f.min(64.0));
    if issue.back_to_back {
        c
    } else {
        c + MM_INIT_LATENCY
    }
}

/// local_gather: start-up plus the published per-index rate for the element size.
fn gpsimd_gather_cycles(ins: &Instr, n: f64) -> f64 {
    let g = class::GpsimdGather::of(ins);
    let e = match g.map(|g| g.num_elem_per_idx) {
        Some(v) if v > 0 => v as f64,
        _ => 1.0,
    };
    let valid = match g.and_then(|g| g.num_valid_indices) {
        Some(v) if v > 0 => v as f64,
        _ => n,
    };
    let bytes = g.map_or(4.0, |g| g.src_buffer.dtype.size() as f64);
    let c = ((28.0 + 4.0 * e) / (4.0 * e)) / (4.0 / bytes).min(e);
    GPSIMD_START + valid * e / c
}

impl DefaultCost {
    /// The model with generation `g`'s constants.
    pub fn new(g: &'static Generation) -> Self {
        DefaultCost { gen: g }
    }

    /// Cycles on the instruction's engine clock: the class formula (table 1), then the rules
    /// of the streaming engines: a runtime-offset instruction's initiation interval and the
    /// dependent-instruction overhead (docs/cost-model.md).
    pub fn cycles(&self, ins: &Instr, issue: Issue) -> f64 {
        self.cycles_on(ins, ins.engine, issue)
    }

    /// `cycles` of `ins` as if it ran on `eng` (engine choice weighs each candidate without a
    /// copy of the instruction).
    fn cycles_on(&self, ins: &Instr, eng: Engine, issue: Issue) -> f64 {
        let sh = shape(ins);
        let c = self.class_cycles(ins, eng, &sh, issue);
        if !matches!(eng, Engine::Vector | Engine::Scalar | Engine::Gpsimd)
            || ins.op.spec().cost.path() != DataPath::Compute
        {
            return c;
        }
        let dynamic = ins
            .args
            .iter()
            .any(|a| a.tensor().is_some_and(|ap| ap.dynamic.is_some()));
        let c = if dynamic { c.max(DYNAMIC_II) } else { c };
        if !issue.dependent {
            return c;
        }
        let small = if sh.n < SMALL_N { SMALL_CYCLES } else { 0.0 };
        c + DEPENDENT_CYCLES + small
    }

    /// Cycles by cost class (docs/cost-model.md, table 1); on Vector/Scalar/GpSimd an operand
    /// whose innermost SBUF/PSUM stride exceeds 16 bytes halves the streaming rate (I8).
    fn class_cycles(&self, ins: &Instr, eng: Engine, sh: &Shape, issue: Issue) -> f64 {
        use CostClass as C;
        let g = self.gen;
        let strided = matches!(eng, Engine::Vector | Engine::Scalar | Engine::Gpsimd)
            && sh.data.iter().any(|(a, _)| {
                a.mem != Mem::Hbm && innermost_stride_bytes(a) > STRIDE_PENALTY_BYTES
            });
        let n = if strided { 2.0 * sh.n } else { sh.n };
        let all_narrow = || !sh.data.is_empty() && sh.data.iter().all(|(a, _)| is_narrow(a.dtype));
        let all_half = || !sh.data.is_empty() && sh.data.iter().all(|(a, _)| is_half(a.dtype));
        let mii = |c: f64| c.max(MIN_II);
        match ins.op.spec().cost {
            C::Control | C::RngState | C::DmaTranspose | C::Collective => ISSUE_CYCLES,
            C::Dma => self.dma_issue_cycles(ins, eng),
            C::PeMatmul => pe_matmul_cycles(g, ins, issue),
            C::PeMatmulSparse => pe_matmul_sparse_cycles(ins, issue),
            C::PeTranspose => match eng {
                Engine::Tensor => pe_transpose_cycles(sh, issue),
                _ => mii(n),
            },
            C::Act => {
                let c = mii(n);
                let reduces = class::Act::of(ins).is_some_and(|a| a.reduce_res.is_some());
                if reduces {
                    c + MIN_II
                } else {
                    c
                }
            }
            C::VecCopyScalar => copy_scalar_cycles(g, ins, eng, sh, n),
            C::Vec1in => mii(n),
            C::Vec1inAcc => mii(n) + MIN_II,
            C::Vec2in => {
                let reads: Vec<&Ap> = sh
                    .data
                    .iter()
                    .filter(|(_, w)| !*w)
                    .map(|(a, _)| *a)
                    .collect();
                let split = reads.iter().any(|a| a.mem == Mem::Psum)
                    && reads.iter().any(|a| a.mem == Mem::Sbuf);
                let sbuf16 = all_half() && reads.iter().all(|a| a.mem == Mem::Sbuf);
                if eng == Engine::Vector && (split || sbuf16) {
                    mii(n)
                } else {
                    mii(2.0 * n)
                }
            }
            C::VecStt => {
                if all_narrow() {
                    mii(n)
                } else {
                    mii(2.0 * n)
                }
            }
            C::VecReduce => {
                if all_narrow() {
                    mii(n / 2.0)
                } else {
                    mii(n)
                }
            }
            C::VecScan => mii(2.0 * n),
            C::VecPred => {
                let psum = sh.data.iter().any(|(a, w)| !*w && a.mem == Mem::Psum);
                if psum {
                    mii(n)
                } else {
                    mii(2.0 * n)
                }
            }
            C::VecExp => mii(n / 4.0),
            C::VecQuant => mii(n / 4.0),
            C::VecMax8 => mii(n),
            C::Reciprocal => {
                if eng == Engine::Vector {
                    mii(8.0 * n)
                } else {
                    mii(n)
                }
            }
            C::Memset => {
                let zero = class::Memset::of(ins).is_none_or(|m| m.value.f32() == 0.0);
                if zero && all_narrow() {
                    mii(n / 2.0)
                } else {
                    mii(n)
                }
            }
            C::BnAggr => mii(13.0 * n / 3.0),
            C::Gpsimd1in => mii(n),
            C::GpsimdAffine => GPSIMD_START + n,
            C::GpsimdGather => gpsimd_gather_cycles(ins, n),
            C::GpsimdNGather => GPSIMD_START + n,
            C::Topk => {
                let t = class::Topk::of(ins);
                let src = t.map_or(n, |t| t.src.free_size() as f64);
                let k = t.map_or(8.0, |t| t.val_dst.free_size() as f64);
                4.0 * src + k
            }
            C::Rng => mii(n),
        }
    }
}

impl DefaultCost {
    /// The trigger of a DMA instruction: the sequencer's issue cost; a hardware-DGE instruction
    /// keeps its engine busy ~600 ns (nki-dge page, anchor I6; occupancy rather than latency
    /// is our reading, a GUESS).
    fn dma_issue_cycles(&self, ins: &Instr, eng: Engine) -> f64 {
        let hw = class::Dma::of(ins).is_some_and(|d| d.dge_mode == Some(DgeMode::Hwdge));
        if hw && self.gen.hwdge_issue_ns > 0.0 {
            (self.gen.hwdge_issue_ns * engine_ghz(self.gen, eng)).max(ISSUE_CYCLES)
        } else {
            ISSUE_CYCLES
        }
    }
}

impl DefaultCost {
    /// `engine_ps` of `ins` as if it ran on `engine` (no copy of the instruction).
    pub fn engine_ps_on(&self, ins: &Instr, engine: Engine, issue: Issue) -> u64 {
        ps(
            self.cycles_on(ins, engine, issue),
            engine_ghz(self.gen, engine),
        )
    }
}

impl CostModel for DefaultCost {
    fn engine_ps(&self, ins: &Instr, issue: Issue) -> u64 {
        self.engine_ps_on(ins, ins.engine, issue)
    }

    fn dma(&self) -> DmaParams {
        DmaParams::of(self.gen)
    }

    /// The generation's address: generations are statics (or leaked), never freed or moved.
    fn plan_key(&self) -> Option<usize> {
        Some(self.gen as *const Generation as usize)
    }

    fn sem_latency_ps(&self) -> u64 {
        (SEM_LATENCY_NS * 1000.0) as u64
    }

    fn timing(&self) -> &'static str {
        self.gen.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::isa::text::parse_instr_unchecked;

    fn warm_tflops(text: &str) -> f64 {
        let ins = parse_instr_unchecked(text).unwrap();
        let t = DefaultCost::default().engine_ps(
            &ins,
            Issue {
                back_to_back: true,
                dependent: false,
            },
        );
        flops(&ins) as f64 / t as f64 // flop per ps = TFLOPS
    }

    // Peaks from reference §1.2: 128 x 128 PEs x 2 flop x 2.4 GHz x {4, 1, 1/4}.
    const BF16_PEAK: f64 = 128.0 * 128.0 * 2.0 * 2.4e9 / 1e12;

    #[test]
    fn bf16_matmul_reaches_the_published_peak() {
        let t = warm_tflops("nc_matmul dst=psum:float32[0:128]+0[[1,512]] stationary=sbuf:bfloat16[0:128]+0[[1,128]] moving=sbuf:bfloat16[0:128]+256[[1,512]]");
        assert!((t - BF16_PEAK).abs() / BF16_PEAK < 1e-3, "{t}");
        assert!(t >= 0.9 * PEAK_TFLOPS_BF16);
    }

    #[test]
    fn mx_matmul_is_four_times_bf16() {
        // 128 partitions x 4 packed values = K 512; 128 x4 stationary columns, 512 moving.
        let ins = parse_instr_unchecked("nc_matmul_mx dst=psum:float32[0:128]+0[[1,512]] stationary=sbuf:float8_e4m3fn_x4[0:128]+0[[1,128]] moving=sbuf:float8_e4m3fn_x4[0:128]+512[[1,512]] stationary_scale=sbuf:uint8[0:128]+4096[[1,128]] moving_scale=sbuf:uint8[0:128]+4224[[1,512]]").unwrap();
        assert_eq!(flops(&ins), 2 * 512 * 128 * 512);
        let t = warm_tflops("nc_matmul_mx dst=psum:float32[0:128]+0[[1,512]] stationary=sbuf:float8_e4m3fn_x4[0:128]+0[[1,128]] moving=sbuf:float8_e4m3fn_x4[0:128]+512[[1,512]] stationary_scale=sbuf:uint8[0:128]+4096[[1,128]] moving_scale=sbuf:uint8[0:128]+4224[[1,512]]");
        assert!((t - 4.0 * BF16_PEAK).abs() / BF16_PEAK < 4e-3, "{t}");
        assert!(t >= 0.9 * PEAK_TFLOPS_MX);
    }

    #[test]
    fn sparse_matmul_peaks_by_pattern() {
        // Kc = 128 compressed rows, M = 128, N = 512: dense-equivalent K = 128 * g/s.
        for (pat, r) in [
            ("m4_n16", 4.0),
            ("m4_n12", 3.0),
            ("m4_n8", 2.0),
            ("m2_n8", 4.0),
            ("m2_n4", 2.0),
            ("m1_n4", 4.0),
            ("m1_n2", 2.0),
        ] {
            let text = format!("nc_matmul_sparse dst=psum:float32[0:128]+0[[1,512]] stationary=sbuf:bfloat16[0:128]+0[[1,128]] stationary_index=sbuf:uint8[0:128]+256[[1,128]] moving=sbuf:bfloat16[0:128]+512[[1,{}]] pattern={pat}", 512.0 * r);
            let ins = parse_instr_unchecked(&text).unwrap();
            assert_eq!(flops(&ins), (2.0 * 128.0 * r * 128.0 * 512.0) as u64);
            let t = warm_tflops(&text);
            assert!((t - r * BF16_PEAK).abs() / BF16_PEAK < 4e-3, "{pat}: {t}");
        }
        let t = warm_tflops("nc_matmul_sparse dst=psum:float32[0:128]+0[[1,512]] stationary=sbuf:bfloat16[0:128]+0[[1,128]] stationary_index=sbuf:uint8[0:128]+256[[1,128]] moving=sbuf:bfloat16[0:128]+512[[1,2048]] pattern=m4_n16");
        assert!(
            (0.9 * PEAK_TFLOPS_SPARSE..=1.001 * 4.0 * BF16_PEAK).contains(&t),
            "{t}"
        );
    }

    #[test]
    fn fp32_is_a_quarter_and_double_row_twice() {
        let f32t = warm_tflops("nc_matmul dst=psum:float32[0:128]+0[[1,512]] stationary=sbuf:float32[0:128]+0[[1,128]] moving=sbuf:float32[0:128]+512[[1,512]]");
        assert!((f32t - BF16_PEAK / 4.0).abs() / BF16_PEAK < 1e-3, "{f32t}");
        let dr = warm_tflops("nc_matmul dst=psum:float32[0:128]+0[[1,512]] stationary=sbuf:float8_e4m3[0:128]+0[[1,256]] moving=sbuf:float8_e4m3[0:128]+256[[1,1024]] perf_mode=double_row");
        assert!((dr - 2.0 * BF16_PEAK).abs() / BF16_PEAK < 2e-3, "{dr}");
    }

    #[test]
    fn cold_matmul_pays_load_stationary_and_start_up() {
        let ins = parse_instr_unchecked("nc_matmul dst=psum:float32[0:128]+0[[1,512]] stationary=sbuf:bfloat16[0:128]+0[[1,128]] moving=sbuf:bfloat16[0:128]+256[[1,512]]").unwrap();
        let warm = DefaultCost::default().cycles(
            &ins,
            Issue {
                back_to_back: true,
                dependent: false,
            },
        );
        let cold = DefaultCost::default().cycles(
            &ins,
            Issue {
                back_to_back: false,
                dependent: false,
            },
        );
        assert_eq!(warm, 512.0);
        assert_eq!(cold, 512.0 + 128.0 / 4.0 + 64.0);
    }

    #[test]
    fn vector_perf_modes() {
        let c = |t: &str| {
            DefaultCost::default().cycles(&parse_instr_unchecked(t).unwrap(), Issue::default())
        };
        // fp32: 1 element/lane/cycle; bf16 SBUF contiguous: 4x; bf16 from PSUM: 2x (§1.7).
        assert_eq!(c("tensor_copy.vector dst=sbuf:float32[0:128]+0[[1,2048]] src=sbuf:float32[0:128]+8192[[1,2048]]"), 2048.0);
        assert_eq!(c("tensor_copy.vector dst=sbuf:bfloat16[0:128]+0[[1,2048]] src=sbuf:bfloat16[0:128]+8192[[1,2048]]"), 512.0);
        assert_eq!(c("tensor_copy.vector dst=sbuf:bfloat16[0:128]+0[[1,512]] src=psum:bfloat16[0:128]+0[[1,512]]"), 256.0);
        assert_eq!(c("tensor_copy.scalar dst=sbuf:bfloat16[0:128]+0[[1,2048]] src=sbuf:bfloat16[0:128]+8192[[1,2048]]"), 1024.0);
        // Short ops pay the minimum initiation interval.
        assert_eq!(c("tensor_copy.vector dst=sbuf:float32[0:128]+0[[1,8]] src=sbuf:float32[0:128]+64[[1,8]]"), MIN_II);
    }
}
