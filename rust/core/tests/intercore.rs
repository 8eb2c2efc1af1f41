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
