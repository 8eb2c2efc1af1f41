//! Inter-core rendezvous through the public API: completion times from the cost formulas of
//! docs/multicore.md, and the deadlock report, with programs in the text assembly.

use trn3emu_core::engines::parse_program;
use trn3emu_core::trace::Unit;
use trn3emu_core::{Device, ErrorKind, RunOptions};

fn run(texts: &[&str]) -> trn3emu_core::Result<trn3emu_core::RunResult> {
    let progs: Vec<_> = texts.iter().map(|t| parse_program(t).unwrap()).collect();
    Device::new().run(&progs, &RunOptions::default())
}

const SEM_PS: u64 = 53_000;

#[test]
fn barrier_completes_one_semaphore_hop_after_the_last_arrival_on_both_cores() {
    let r = run(&[
        ".core 0\ncore_barrier.gpsimd data=hbm:float32+0[[16,1],[1,16]] cores=[0,1]\n",
        ".core 1\nmemset.gpsimd dst=sbuf:float32[0:128]+0[[1,2048]] value=1.0\ncore_barrier.gpsimd data=hbm:float32+0[[16,1],[1,16]] cores=[0,1]\n",
    ])
    .unwrap();
    let recs = &r.trace.records;
    let memset = recs.iter().find(|x| x.core == 1 && x.index == 0).unwrap();
    let b0 = recs.iter().find(|x| x.core == 0).unwrap();
    let b1 = recs.iter().find(|x| x.core == 1 && x.index == 1).unwrap();
    assert_eq!(b0.start_ps, 0, "core 0 arrives at once");
    assert_eq!(
        b1.start_ps, memset.end_ps,
        "core 1 arrives after its memset"
    );
    assert_eq!(b0.end_ps, memset.end_ps + SEM_PS);
    assert_eq!(b1.end_ps, b0.end_ps);
    assert!(matches!(b0.unit, Unit::Engine(3)));
}

#[test]
fn all_reduce_time_is_ring_bytes_over_16_engines_plus_fixed_costs() {
    let texts: Vec<String> = (0..8)
        .map(|c| {
            let base = c * (1 << 20);
            format!(".core {c}\nall_reduce.gpsimd dst=hbm:float32+{base}[[1024,64],[1,1024]] src=hbm:float32+{base}[[1024,64],[1,1024]]\n")
        })
        .collect();
    let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
    let r = run(&refs).unwrap();
    let bytes = 64.0 * 1024.0 * 4.0;
    let ns = 1300.0 + 2.0 * 7.0 / 8.0 * bytes / (16.0 * 33.0);
    let want = (ns * 1000.0) as u64 + SEM_PS;
    assert_eq!(r.trace.records.len(), 8);
    for rec in &r.trace.records {
        assert_eq!((rec.start_ps, rec.end_ps), (0, want));
    }
}

#[test]
fn unmatched_sendrecv_is_a_deadlock_naming_the_missing_core() {
    let e = run(&[
        ".core 2\nsendrecv.sync src=sbuf:float32[0:8]+0[[1,8]] dst=sbuf:float32[0:8]+64[[1,8]] send_to_rank=1 recv_from_rank=1 pipe_id=0\n",
        ".core 3\nnop.sync\n",
    ])
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Deadlock, "{e}");
    assert!(
        e.message.contains("sendrecv") && e.message.contains("[3]"),
        "{e}"
    );
}

fn sbuf_f32(dev: &Device, core: usize, part: usize, off: usize) -> f32 {
    let b = &dev.cores[core].sbuf.partition(part)[off..];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Run `text` (one instruction per line) through `engines::exec` on core 0 of `dev`, outside
/// the scheduler.
fn exec_alone(dev: &mut Device, text: &str) {
    use trn3emu_core::engines::{exec, Ctx};
    use trn3emu_core::memory::onchip::Mems;
    use trn3emu_core::numerics::config::Rounder;
    let prog = parse_program(text).unwrap();
    let numerics = dev.numerics;
    let c = &mut dev.cores[0];
    let mut regs = [0u32; trn3emu_core::isa::instr::NUM_REGISTERS as usize];
    for (i, ins) in prog.instrs.iter().enumerate() {
        let mut ctx = Ctx {
            mems: Mems {
                sbuf: &mut c.sbuf,
                psum: &mut c.psum,
                hbm: &mut dev.hbm,
            },
            state: &mut c.state,
            rng: &mut c.rng,
            rounder: Rounder::new(numerics, 0, 0, i as u32, true),
            regs: &mut regs,
            jump: None,
        };
        exec(ins, &mut ctx).unwrap();
    }
}

#[test]
fn a_collective_executed_alone_is_its_group_of_one() {
    // The scheduler's rendezvous of a one-core replica group and the engines' `exec` agree:
    // all_reduce over one rank copies src to dst.
    let text = ".core 0\nmemset.gpsimd dst=sbuf:float32[0:4]+0[[1,8]] value=3.0\nall_reduce.gpsimd dst=sbuf:float32[0:4]+64[[1,8]] src=sbuf:float32[0:4]+0[[1,8]] cores=[0]\n";
    let mut dev = Device::new();
    dev.run(&[parse_program(text).unwrap()], &RunOptions::default())
        .unwrap();
    assert_eq!(sbuf_f32(&dev, 0, 3, 64 + 28), 3.0);
    let mut alone = Device::new();
    exec_alone(&mut alone, text);
    assert_eq!(sbuf_f32(&alone, 0, 3, 64 + 28), 3.0);
    // Alone, a sendrecv's peer is itself.
    exec_alone(&mut alone, ".core 0\nsendrecv.gpsimd src=sbuf:float32[0:4]+0[[1,8]] dst=sbuf:float32[0:4]+128[[1,8]] send_to_rank=1 recv_from_rank=1 pipe_id=0\n");
    assert_eq!(sbuf_f32(&alone, 0, 2, 128 + 4), 3.0);
}

#[test]
fn a_collective_takes_the_time_of_the_cost_model() {
    use trn3emu_core::cost::{CollectiveKind, CostModel, DefaultCost, DmaParams, Issue};
    struct SlowBarrier;
    impl CostModel for SlowBarrier {
        fn engine_ps(&self, ins: &trn3emu_core::Instr, issue: Issue) -> u64 {
            DefaultCost::default().engine_ps(ins, issue)
        }
        fn dma(&self) -> DmaParams {
            DefaultCost::default().dma()
        }
        fn sem_latency_ps(&self) -> u64 {
            DefaultCost::default().sem_latency_ps()
        }
        fn collective_ps(&self, kind: CollectiveKind, bytes: u64, ranks: usize) -> u64 {
            assert_eq!((kind, bytes, ranks), (CollectiveKind::Barrier, 0, 2));
            7_000_000
        }
    }
    let mut dev = Device::new();
    dev.cost = Box::new(SlowBarrier);
    let progs: Vec<_> = (0..2)
        .map(|c| {
            parse_program(&format!(
                ".core {c}\ncore_barrier.gpsimd data=hbm:float32+0[[16,1],[1,16]] cores=[0,1]\n"
            ))
            .unwrap()
        })
        .collect();
    let r = dev.run(&progs, &RunOptions::default()).unwrap();
    assert!(r.trace.records.iter().all(|x| x.end_ps == 7_000_000));
    // The default model: one semaphore hop.
    assert_eq!(
        DefaultCost::default().collective_ps(CollectiveKind::Barrier, 0, 2),
        SEM_PS
    );
}
