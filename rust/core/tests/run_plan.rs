//! `Assembler::run_plan`: the cached plan is the program's as it is now. A plan kept across an
//! append or a pop (even one that leaves the length as it was) would give the scheduler another
//! instruction's regions and transfer plans.

use std::sync::Arc;
use trn3emu_core::asm::Assembler;
use trn3emu_core::cost::{CostModel, DefaultCost, DmaParams, Issue};
use trn3emu_core::isa::text::parse_instr_unchecked;
use trn3emu_core::isa::Instr;

fn ins(text: &str) -> Instr {
    parse_instr_unchecked(text).unwrap()
}

const SET: &str = "memset.vector dst=sbuf:float32[0:8]+0[[1,4]] value=0.0";
const ADD: &str = "tensor_scalar.vector dst=sbuf:float32[0:8]+64[[1,4]] data=sbuf:float32[0:8]+0[[1,4]] op0=add operand0=1.0";
const STORE: &str = "dma_copy.vector dst=hbm:float32+0[[4,8],[1,4]] src=sbuf:float32[0:8]+0[[1,4]]";
const STORE2: &str =
    "dma_copy.vector dst=hbm:float32+4096[[4,16],[1,4]] src=sbuf:float32[0:16]+0[[1,4]]";

#[test]
fn the_cached_plan_is_kept_while_the_program_stays_and_dropped_when_it_changes() {
    let dma = DefaultCost::default();
    let mut a = Assembler::new(0).unwrap();
    a.append(ins(SET), false).unwrap();
    a.append(ins(STORE), false).unwrap();
    let p1 = a.run_plan(&dma);
    assert!(
        Arc::ptr_eq(&p1, &a.run_plan(&dma)),
        "a second run reuses it"
    );
    assert_eq!(p1.transfer(1).bytes, 8 * 4 * 4);

    // pop and append another DMA: same length, another transfer
    a.pop();
    a.append(ins(STORE2), false).unwrap();
    let p2 = a.run_plan(&dma);
    assert!(!Arc::ptr_eq(&p1, &p2));
    assert_eq!(p2.transfer(1).bytes, 16 * 4 * 4);
    assert_eq!(p2.regions(1)[0].lo, 4096);

    // appended: the new instruction has its regions (a write of bytes 64..80, a read of 0..16)
    a.append(ins(ADD), false).unwrap();
    let p3 = a.run_plan(&dma);
    let r = p3.regions(2);
    assert_eq!((r[0].write, r[0].lo, r[0].hi), (true, 64, 80));
    assert_eq!((r[1].write, r[1].lo, r[1].hi), (false, 0, 16));
    assert_eq!(p3.traced(2).0, 2 * 8 * 4 * 4);
}

/// The default model with other DMA numbers (`key`: its plan key).
struct OtherDma(DefaultCost, Option<usize>);
impl CostModel for OtherDma {
    fn engine_ps(&self, ins: &Instr, issue: Issue) -> u64 {
        self.0.engine_ps(ins, issue)
    }
    fn dma(&self) -> DmaParams {
        DmaParams {
            partitions_per_engine: 4,
            ..self.0.dma()
        }
    }
    fn sem_latency_ps(&self) -> u64 {
        self.0.sem_latency_ps()
    }
    fn plan_key(&self) -> Option<usize> {
        self.1
    }
}

#[test]
fn a_plan_is_only_reused_under_the_dma_numbers_it_was_built_with() {
    let mut a = Assembler::new(0).unwrap();
    a.append(ins(STORE), false).unwrap();
    let cost = DefaultCost::default();
    let p1 = a.run_plan(&cost);
    let other = OtherDma(cost, cost.plan_key());
    let p2 = a.run_plan(&other);
    assert!(!Arc::ptr_eq(&p1, &p2));
    assert_ne!(p1.transfer(0).pieces, p2.transfer(0).pieces);
    assert!(p2.fits(a.program(), &other, true) && !p2.fits(a.program(), &cost, true));
}

#[test]
fn engine_times_are_kept_only_for_the_cost_model_key_they_were_computed_with() {
    let mut a = Assembler::new(0).unwrap();
    a.append(ins(ADD), false).unwrap();
    let trn3 = DefaultCost::default();
    let trn1 = DefaultCost {
        gen: trn3emu_core::timing::generation("trn1").unwrap(),
    };
    let issue = Issue::default();
    let t3 = a.run_plan(&trn3).engine_ps(0, issue).unwrap();
    assert_eq!(
        t3,
        trn3.engine_ps(a.program().instrs.first().unwrap(), issue)
    );
    let t1 = a.run_plan(&trn1).engine_ps(0, issue).unwrap();
    assert_eq!(
        t1,
        trn1.engine_ps(a.program().instrs.first().unwrap(), issue)
    );
    assert_ne!(t1, t3);
    // a model without a key: the plan keeps no times (the scheduler asks the model)
    let keyless = OtherDma(trn3, None);
    assert_eq!(a.run_plan(&keyless).engine_ps(0, issue), None);
    for (b2b, dep) in [(false, false), (true, false), (true, true), (false, true)] {
        let issue = Issue {
            back_to_back: b2b,
            dependent: dep,
        };
        let want = trn3.engine_ps(
            a.program().instrs.first().unwrap(),
            Issue {
                back_to_back: b2b,
                dependent: dep && b2b,
            },
        );
        assert_eq!(a.run_plan(&trn3).engine_ps(0, issue), Some(want));
    }
}

struct Quiet;
impl trn3emu_core::machine::Monitor for Quiet {
    fn poll(&mut self, _: &trn3emu_core::machine::Progress) -> bool {
        true
    }
}

#[test]
fn a_plan_built_without_regions_is_not_used_by_a_race_checked_run() {
    use trn3emu_core::machine::run_plan::RunPlan;
    use trn3emu_core::{Device, ErrorKind, RunOptions};
    // memset then an unordered read of its dst on another engine: a race
    let prog = trn3emu_core::engines::parse_program(&format!(
        "{SET}\nactivation.scalar dst=sbuf:float32[0:8]+128[[1,4]] data=sbuf:float32[0:8]+0[[1,4]] op=copy"
    ))
    .unwrap();
    let cost = DefaultCost::default();
    let bare = Arc::new(RunPlan::new(&prog, &cost, false));
    assert!(bare.regions(1).is_empty());
    assert!(bare.fits(&prog, &cost, false) && !bare.fits(&prog, &cost, true));
    let mut dev = Device::new();
    let unchecked = RunOptions {
        check_races: false,
        trace: false,
        ..RunOptions::default()
    };
    dev.run_planned(&[&prog], &[Some(bare.clone())], &unchecked, &mut Quiet)
        .unwrap();
    let e = dev
        .run_planned(&[&prog], &[Some(bare)], &RunOptions::default(), &mut Quiet)
        .unwrap_err();
    assert_eq!((e.kind, e.rule), (ErrorKind::Race, "data_race"));
}

/// A monitor that says stop at its `n`-th poll (and counts its polls).
struct StopAt(usize, usize);
impl trn3emu_core::machine::Monitor for StopAt {
    fn poll(&mut self, _: &trn3emu_core::machine::Progress) -> bool {
        self.1 += 1;
        self.1 < self.0
    }
}

#[test]
fn building_a_plan_asks_whether_to_go_on_and_stops_with_an_interrupted_error() {
    use trn3emu_core::machine::autosync::CHECK_EVERY;
    use trn3emu_core::{Device, ErrorKind, RunOptions};
    let mut a = Assembler::new(0).unwrap();
    a.append(ins(SET), false).unwrap();
    for _ in 0..3 * CHECK_EVERY {
        a.append(ins(ADD), false).unwrap();
    }
    let cost = DefaultCost::default();
    // the cached path: asked once per CHECK_EVERY instructions, stopped at the second ask
    let mut asked = 0;
    let e = a
        .run_plan_checked(&cost, &mut || {
            asked += 1;
            asked < 2
        })
        .unwrap_err();
    assert_eq!(
        (e.kind, e.rule, asked),
        (ErrorKind::Interrupted, "interrupted", 2)
    );
    // nothing half-built was kept: the next plan is whole
    let whole = a.run_plan_checked(&cost, &mut || true).unwrap();
    assert_eq!(whole.regions(3 * CHECK_EVERY as u32).len(), 2);
    // a run that builds its own plan polls its monitor while building it (stopped there)
    let mut dev = Device::new();
    let prog = a.program().clone();
    let mut m = StopAt(2, 0);
    let e = dev
        .run_planned(&[&prog], &[None], &RunOptions::default(), &mut m)
        .unwrap_err();
    assert_eq!(
        (e.kind, e.rule, m.1),
        (ErrorKind::Interrupted, "interrupted", 2)
    );
    let r = dev
        .run_planned(&[&prog], &[None], &RunOptions::default(), &mut Quiet)
        .unwrap();
    assert_eq!(r.executed, 3 * CHECK_EVERY as u64 + 1);
}
