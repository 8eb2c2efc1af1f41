//! Engine choice for instructions a kernel leaves unpinned (docs/nki.md, "Engine choice").
//!
//! The NKI API pages say of `engine=unknown` on `tensor_copy`, `tensor_scalar` and
//! `tensor_tensor`: "let compiler select best engine based on the input tile shape"; the
//! selection rule itself is not published. Hardware profiles of compiled kernels show the
//! compiler spreading such work over VectorE, ScalarE and GpSimd (PSUM evacuation on ScalarE),
//! where the ISA's fixed default (`isa::default_engine`) would put all of it on VectorE. The
//! rule here (an emulator choice, written down because the docs are silent):
//!
//! 1. **Candidates** are the engines of the instruction's ISA record that compute it with the
//!    same bits as the default engine, reach its memories and accept its operators:
//!    - `tensor_copy`: VectorE, ScalarE, GpSimd (a copy or an fp32-RNE cast is the same on every
//!      engine); GpSimd only when no operand is in PSUM.
//!    - `tensor_scalar` with one operator among add / subtract / multiply (a single correctly
//!      rounded fp32 operation) on float data: VectorE, ScalarE, GpSimd (GpSimd SBUF only). Two
//!      operators stay on the default engine: a ScalarE or GpSimd pipeline may fuse them (no
//!      published statement), which would round once instead of twice.
//!    - anything else, dynamic (register / indirect) operands, or an instruction the ISA default
//!      rule already sends elsewhere (power, all-int32 tensor_tensor, rsqrt): the default engine.
//!      Float `tensor_tensor` stays on VectorE too: the fused Mamba tutorial (trn1) says its
//!      `tensor_tensor` work "can only run on VectorE" and profiles VectorE 98.71 % active, and
//!      the NKI 0.3+ `tensor_tensor` page names GpSimd as the automatic engine only for all-int32
//!      / uint32 operands (docs/cost-model.md, "Validation only: the fused Mamba tutorial").
//! 2. **Affinity** orders the candidates: an instruction touching PSUM prefers ScalarE (the
//!    profiles' PSUM -> SBUF copies), everything else VectorE, ScalarE, GpSimd.
//! 3. **Least loaded**: the candidate whose modelled busy time so far in this program plus the
//!    instruction's own modelled time on it (`cost::DefaultCost`, the run's generation) is
//!    smallest wins; ties go to the earlier candidate in affinity order. Every appended compute
//!    instruction, pinned or not, adds its time to its engine's busy time.
//!
//! 4. **Store triggers**: a `dma_copy` from SBUF to HBM without an engine (the front end's
//!    `nl.store` when balancing) is triggered by the engine that last wrote its source (one of
//!    the last `RECENT` compute instructions), so the trigger follows its producer in that
//!    engine's in-order stream and never blocks other work waiting for data; with no such
//!    writer, ScalarE (the front end's store queue). The compiler places DMA triggers itself
//!    (NKI DMA overview: "DMA transfers can be triggered by any engine sequencer"; the queue "is
//!    typically tied to the trigger engine"); which engine it picks is not published.
//!
//! Deterministic: the choice depends only on the program appended so far.

use crate::cost::{CostModel, DefaultCost, Issue};
use crate::isa::default_engine;
use crate::isa::ops;
use crate::isa::spec::DataPath;
use crate::isa::tables::{AluOp, Engine, Opcode};
use crate::isa::Instr;
use crate::memory::{Ap, Mem};
use crate::timing::Generation;
use std::collections::VecDeque;

/// Compute instructions whose on-chip writes a store trigger looks back over.
pub const RECENT: usize = 64;

/// An on-chip write: memory, partitions `p0..p1`, bytes `lo..hi` of each partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Written {
    engine: Engine,
    mem: Mem,
    p0: u32,
    p1: u32,
    lo: i128,
    hi: i128,
}

fn on_chip_box(a: &Ap) -> Option<(Mem, u32, u32, i128, i128)> {
    if a.mem == Mem::Hbm || a.dynamic.is_some() {
        return None;
    }
    let (lo, hi) = a.row_byte_range();
    let off = a.offset as i128;
    Some((a.mem, a.start, a.start + a.parts, off + lo, off + hi))
}

/// The streaming engines the rule balances, in the order of `EngineBalance::busy_ps`.
const ENGINES: [Engine; 3] = [Engine::Vector, Engine::Scalar, Engine::Gpsimd];

/// Running per-engine modelled busy time of a program under construction, and the rule above.
#[derive(Clone)]
pub struct EngineBalance {
    cost: DefaultCost,
    busy_ps: [u64; 3],
    recent: VecDeque<Written>,
}

impl std::fmt::Debug for EngineBalance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EngineBalance({}, {:?})",
            self.cost.gen.name, self.busy_ps
        )
    }
}

fn slot(e: Engine) -> Option<usize> {
    ENGINES.iter().position(|&x| x == e)
}

impl EngineBalance {
    /// Balance with generation `g`'s cost constants.
    pub fn new(g: &'static Generation) -> Self {
        EngineBalance {
            cost: DefaultCost::new(g),
            busy_ps: [0; 3],
            recent: VecDeque::with_capacity(RECENT),
        }
    }

    /// Modelled busy time so far of VectorE, ScalarE, GpSimd, ps.
    pub fn busy_ps(&self) -> [u64; 3] {
        self.busy_ps
    }

    fn time_on(&self, ins: &Instr, engine: Engine) -> u64 {
        self.cost.engine_ps_on(ins, engine, Issue::default())
    }

    /// The engine for `ins` (whose engine is unknown), or `None`: the ISA default applies.
    pub fn choose(&self, ins: &Instr) -> Option<Engine> {
        if ins.op == Opcode::DmaCopy {
            return self.store_trigger(ins);
        }
        let cands = candidates(ins)?;
        let mut best: Option<(u64, Engine)> = None;
        for e in cands {
            let i = slot(e)?;
            let t = self.busy_ps[i].saturating_add(self.time_on(ins, e));
            if best.is_none_or(|(bt, _)| t < bt) {
                best = Some((t, e));
            }
        }
        best.map(|(_, e)| e)
    }

    /// Rule 4: the engine that last wrote the SBUF source of a store, else ScalarE.
    fn store_trigger(&self, ins: &Instr) -> Option<Engine> {
        let v = ops::DmaCopy::view(ins).ok()?;
        if v.dst.mem != Mem::Hbm || v.src.mem == Mem::Hbm {
            return None;
        }
        let Some((mem, p0, p1, lo, hi)) = on_chip_box(v.src) else {
            return Some(Engine::Scalar);
        };
        let writer = self
            .recent
            .iter()
            .rev()
            .find(|w| w.mem == mem && w.p0 < p1 && p0 < w.p1 && w.lo < hi && lo < w.hi);
        Some(writer.map_or(Engine::Scalar, |w| w.engine))
    }

    /// Count an appended instruction's modelled time on its engine.
    pub fn record(&mut self, ins: &Instr) {
        if let Some(i) = self.charged(ins) {
            let params = ins.op.spec().params;
            for (k, arg) in ins.args.iter().enumerate() {
                let Some((mem, p0, p1, lo, hi)) = arg.tensor().and_then(on_chip_box) else {
                    continue;
                };
                if params[k].access.writes() {
                    if self.recent.len() == RECENT {
                        self.recent.pop_front();
                    }
                    self.recent.push_back(Written {
                        engine: ins.engine,
                        mem,
                        p0,
                        p1,
                        lo,
                        hi,
                    });
                }
            }
            self.busy_ps[i] =
                self.busy_ps[i].saturating_add(self.cost.engine_ps(ins, Issue::default()));
        }
    }

    /// Take back `record` of an instruction removed again.
    pub fn unrecord(&mut self, ins: &Instr) {
        if let Some(i) = self.charged(ins) {
            self.busy_ps[i] =
                self.busy_ps[i].saturating_sub(self.cost.engine_ps(ins, Issue::default()));
        }
    }

    fn charged(&self, ins: &Instr) -> Option<usize> {
        (ins.op.spec().cost.path() == DataPath::Compute)
            .then(|| slot(ins.engine))
            .flatten()
    }
}

/// Candidate engines of an unpinned instruction in affinity order (rule 1 and 2), or `None`.
pub fn candidates(ins: &Instr) -> Option<Vec<Engine>> {
    let default = default_engine::default_engine_of(ins);
    if default != Engine::Vector
        || ins
            .args
            .iter()
            .any(|a| a.tensor().is_some_and(|ap| ap.dynamic.is_some()))
    {
        return None;
    }
    let (aps, all): (Vec<&Ap>, &[Engine]) = match ins.op {
        Opcode::TensorCopy => {
            let v = ops::TensorCopy::view(ins).ok()?;
            (vec![v.dst, v.src], &ENGINES)
        }
        Opcode::TensorScalar => {
            let v = ops::TensorScalar::view(ins).ok()?;
            let single = v.op1.is_none_or(|o| o == AluOp::Bypass);
            if !single || !matches!(v.op0, AluOp::Add | AluOp::Subtract | AluOp::Multiply) {
                return None;
            }
            let aps = default_engine::tensor_scalar_aps(&v);
            if aps.iter().any(|a| !a.dtype.is_float()) {
                return None;
            }
            (aps, &ENGINES)
        }
        _ => return None,
    };
    let psum = default_engine::any_psum(&aps);
    let spec = ins.op.spec().engines;
    let mut out: Vec<Engine> = all
        .iter()
        .copied()
        .filter(|e| spec.contains(e) && !(psum && *e == Engine::Gpsimd))
        .collect();
    if psum {
        out.sort_by_key(|&e| e != Engine::Scalar); // PSUM affinity: ScalarE first
    }
    (out.len() > 1).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::asm::Assembler;
    use crate::isa::text::parse_instr_unchecked;
    use crate::timing::generation;

    /// `text` as an instruction without an engine (as the front end appends it).
    fn unpinned(text: &str) -> Instr {
        let mut ins = parse_instr_unchecked(text).unwrap();
        ins.engine = Engine::Unknown;
        crate::asm::fill_defaults(&mut ins);
        ins
    }

    const COPY_PSUM: &str =
        "tensor_copy dst=sbuf:float32[0:128]+0[[1,512]] src=psum:float32[0:128]+0[[1,512]]";
    const COPY_SBUF: &str =
        "tensor_copy dst=sbuf:float32[0:128]+0[[1,512]] src=sbuf:float32[0:128]+4096[[1,512]]";
    const ADD_SBUF: &str = "tensor_tensor dst=sbuf:float32[0:128]+0[[1,512]] data1=sbuf:float32[0:128]+2048[[1,512]] data2=sbuf:float32[0:128]+4096[[1,512]] op=add";

    fn trn3() -> EngineBalance {
        EngineBalance::new(generation("trn3").unwrap())
    }

    #[test]
    fn candidates_keep_bits_and_memories() {
        let c = |t: &str| candidates(&unpinned(t));
        // PSUM evacuation: ScalarE first, no GpSimd (no PSUM port).
        assert_eq!(c(COPY_PSUM), Some(vec![Engine::Scalar, Engine::Vector]));
        assert_eq!(
            c(COPY_SBUF),
            Some(vec![Engine::Vector, Engine::Scalar, Engine::Gpsimd])
        );
        // Float tensor_tensor stays on VectorE (the Mamba tutorial's profile).
        assert_eq!(c(ADD_SBUF), None);
        // One rounding only: a two-operator tensor_scalar stays on VectorE.
        assert_eq!(c("tensor_scalar dst=sbuf:float32[0:128]+0[[1,64]] data=sbuf:float32[0:128]+256[[1,64]] op0=multiply operand0=2.0 op1=add operand1=1.0"), None);
        assert_eq!(
            c("tensor_scalar dst=sbuf:float32[0:128]+0[[1,64]] data=sbuf:float32[0:128]+256[[1,64]] op0=multiply operand0=2.0"),
            Some(vec![Engine::Vector, Engine::Scalar, Engine::Gpsimd])
        );
        // Divide, integer data, a PSUM input of tensor_tensor: the default engine.
        assert_eq!(c("tensor_scalar dst=sbuf:float32[0:128]+0[[1,64]] data=sbuf:float32[0:128]+256[[1,64]] op0=divide operand0=3.0"), None);
        assert_eq!(c("tensor_scalar dst=sbuf:int32[0:128]+0[[1,64]] data=sbuf:int32[0:128]+256[[1,64]] op0=add operand0=3.0"), None);
        assert_eq!(c("tensor_tensor dst=sbuf:float32[0:128]+0[[1,512]] data1=psum:float32[0:128]+0[[1,512]] data2=sbuf:float32[0:128]+4096[[1,512]] op=add"), None);
        assert_eq!(c("tensor_tensor dst=sbuf:float32[0:128]+0[[1,512]] data1=sbuf:float32[0:128]+2048[[1,512]] data2=sbuf:float32[0:128]+4096[[1,512]] op=divide"), None);
        // Activation is ScalarE's; memset is not balanced.
        assert_eq!(c("activation dst=sbuf:float32[0:128]+0[[1,64]] op=exp data=sbuf:float32[0:128]+256[[1,64]]"), None);
    }

    #[test]
    fn least_loaded_wins_ties_go_by_affinity() {
        let mut b = trn3();
        // Nothing busy: equal costs, affinity decides.
        assert_eq!(b.choose(&unpinned(COPY_PSUM)), Some(Engine::Scalar));
        assert_eq!(b.choose(&unpinned(COPY_SBUF)), Some(Engine::Vector));
        // 512 fp32 elements: 512 cycles at 1.2 GHz on each engine.
        let one = (512.0f64 / 1.2 * 1000.0).ceil() as u64;
        let put = |b: &mut EngineBalance, text: &str| {
            let mut ins = unpinned(text);
            ins.engine = b.choose(&ins).unwrap();
            b.record(&ins);
            ins.engine
        };
        // Three equal copies go round the three engines, the fourth back to VectorE.
        let got: Vec<Engine> = (0..4).map(|_| put(&mut b, COPY_SBUF)).collect();
        assert_eq!(
            got,
            [
                Engine::Vector,
                Engine::Scalar,
                Engine::Gpsimd,
                Engine::Vector
            ]
        );
        assert_eq!(b.busy_ps(), [2 * one, one, one]);
        // Pinned activations load ScalarE: with one, VectorE and ScalarE are level (2 units
        // each) and a PSUM copy keeps its affinity; a second one sends it to VectorE.
        let act = parse_instr_unchecked("activation.scalar dst=sbuf:float32[0:128]+0[[1,512]] op=exp data=sbuf:float32[0:128]+4096[[1,512]]").unwrap();
        b.record(&act);
        assert_eq!(b.busy_ps(), [2 * one, 2 * one, one]);
        assert_eq!(b.choose(&unpinned(COPY_PSUM)), Some(Engine::Scalar));
        b.record(&act);
        assert_eq!(b.choose(&unpinned(COPY_PSUM)), Some(Engine::Vector));
        b.unrecord(&act);
        b.unrecord(&act);
        assert_eq!(b.busy_ps(), [2 * one, one, one]);
        // tensor_tensor fp32 SBUF is not balanced: it stays on VectorE, the busiest engine.
        assert_eq!(b.choose(&unpinned(ADD_SBUF)), None);
    }

    #[test]
    fn a_store_is_triggered_by_the_last_writer_of_its_source() {
        let mut b = trn3();
        let store = unpinned(
            "dma_copy dst=hbm:float32+0[[512,128],[1,512]] src=sbuf:float32[0:128]+0[[1,512]]",
        );
        assert_eq!(b.choose(&store), Some(Engine::Scalar)); // nothing wrote it: ScalarE
        let mut w = parse_instr_unchecked(
            COPY_SBUF
                .replace("tensor_copy", "tensor_copy.gpsimd")
                .as_str(),
        )
        .unwrap();
        b.record(&w);
        assert_eq!(b.choose(&store), Some(Engine::Gpsimd));
        w.engine = Engine::Vector;
        b.record(&w);
        assert_eq!(b.choose(&store), Some(Engine::Vector));
        // A load is not a store: the ISA default.
        let load = unpinned(
            "dma_copy dst=sbuf:float32[0:128]+0[[1,512]] src=hbm:float32+0[[512,128],[1,512]]",
        );
        assert_eq!(b.choose(&load), None);
    }

    #[test]
    fn the_assembler_balances_only_when_asked() {
        let run = |on: bool| {
            let mut a = Assembler::new(0).unwrap();
            if on {
                a.set_engine_balance(Some(generation("trn1").unwrap()));
            }
            (0..3)
                .map(|_| {
                    let mut ins = parse_instr_unchecked(COPY_SBUF).unwrap();
                    ins.engine = Engine::Unknown;
                    let i = a.append(ins, false).unwrap().index;
                    a.program().instrs[i].engine
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(false), [Engine::Vector; 3]);
        // trn1: ScalarE and GpSimd run at 1.4 GHz (512 cycles: 366 ns), VectorE at 1.12 (457
        // ns): ScalarE, then GpSimd, then VectorE (457 < 2 x 366).
        assert_eq!(run(true), [Engine::Scalar, Engine::Gpsimd, Engine::Vector]);
    }

    #[test]
    fn choices_replayed_over_a_finished_program_are_the_balanced_ones() {
        // A pinned activation, unpinned copies (SBUF, PSUM) and a store, appended without
        // balancing and then decided by `engine_choices`, equal the program balanced while
        // appending (the pass `engine_choice` over the kernel IR relies on it).
        let texts = [
            "activation.scalar dst=sbuf:float32[0:128]+0[[1,512]] op=exp data=sbuf:float32[0:128]+4096[[1,512]]",
            COPY_SBUF,
            COPY_PSUM,
            COPY_SBUF,
            "dma_copy dst=hbm:float32+0[[512,128],[1,512]] src=sbuf:float32[0:128]+0[[1,512]]",
            COPY_SBUF,
        ];
        let build = |on: bool| {
            let mut a = Assembler::new(0).unwrap();
            if on {
                a.set_engine_balance(Some(generation("trn3").unwrap()));
            }
            for (k, t) in texts.iter().enumerate() {
                let mut ins = parse_instr_unchecked(t).unwrap();
                if k > 0 {
                    ins.engine = Engine::Unknown;
                }
                a.append(ins, false).unwrap();
            }
            a
        };
        let balanced = build(true);
        let mut literal = build(false);
        assert_eq!(literal.unpinned(), &[1, 2, 3, 4, 5]);
        // a load is unpinned but not the rule's: it keeps the ISA default and is not listed
        let mut load = parse_instr_unchecked(
            "dma_copy dst=sbuf:float32[0:128]+0[[1,512]] src=hbm:float32+0[[512,128],[1,512]]",
        )
        .unwrap();
        load.engine = Engine::Unknown;
        let mut with_load = build(false);
        with_load.append(load, false).unwrap();
        assert_eq!(with_load.unpinned(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            with_load.engine_choices(generation("trn3").unwrap()).len(),
            5
        );
        let choices = literal.engine_choices(generation("trn3").unwrap());
        let want: Vec<(usize, Engine)> = (1..6)
            .map(|i| (i, balanced.program().instrs[i].engine))
            .collect();
        assert_eq!(choices, want);
        // the copy before it (instruction 3, sent to GpSimd) last wrote the store's source
        assert_eq!(choices[2], (3, Engine::Gpsimd));
        assert_eq!(choices[3], (4, Engine::Gpsimd));
        assert_ne!(literal.program(), balanced.program());
        for (i, e) in choices {
            literal.set_engine(i, e).unwrap();
        }
        assert_eq!(literal.program(), balanced.program());
        // a choice the engine refuses is an error and changes nothing (GpSimd has no PSUM port)
        assert!(literal.set_engine(2, Engine::Gpsimd).is_err());
        assert_eq!(literal.program(), balanced.program());
    }
}
