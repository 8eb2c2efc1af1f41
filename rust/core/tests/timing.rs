//! Timing through the public API: the scheduler, the cost model and the DMA machinery together.
//! Expected values are formulas from the reference figures (docs/cost-model.md), not earlier output.

use trn3emu_core::isa::text::parse_program;
use trn3emu_core::trace::Unit;
use trn3emu_core::{Device, RunOptions};

fn run(text: &str) -> trn3emu_core::RunResult {
    let p = parse_program(text).unwrap();
    Device::new().run(&[p], &RunOptions::default()).unwrap()
}

/// 16 MiB HBM -> SBUF over 16 engines: fixed 1300 ns + 8 descriptors x 7.4 ns + 1 MiB / 33 B/ns
/// per engine, after a 64-cycle trigger on the sync sequencer at 1.2 GHz. (The per-descriptor
/// cost was a 16 ns guess; it is now fitted to the published DMA throughput curve, anchor I2.)
#[test]
fn big_copy_is_fixed_cost_plus_bytes_over_16_engines() {
    let r = run(".core 0\ndma_copy.sync dst=sbuf:bfloat16[0:128]+0[[1,65536]] src=hbm:bfloat16+0[[65536,128],[1,65536]]\n");
    let t = r
        .trace
        .records
        .iter()
        .find(|x| matches!(x.unit, Unit::DmaQueue(_)))
        .unwrap();
    let trigger_ps = (64.0f64 / 1.2 * 1000.0).ceil() as u64;
    assert_eq!(t.start_ps, trigger_ps);
    let per_engine_ns = 1300.0 + 8.0 * 7.4 + (1u64 << 20) as f64 / 33.0;
    let want = trigger_ps + (per_engine_ns * 1000.0).ceil() as u64;
    assert!(t.end_ps.abs_diff(want) <= 1000, "{} vs {want}", t.end_ps);
    assert_eq!(t.dma_engines, 16);
    assert_eq!(r.end_ps, t.end_ps);
}

/// A signal becomes visible one semaphore latency after the signaller ends.
#[test]
fn waiter_starts_one_semaphore_latency_after_the_signal() {
    let r = run(".core 0\nmemset.vector dst=sbuf:float32[0:128]+0[[1,64]] value=2.0 signal=s0+1\nactivation.scalar dst=sbuf:float32[0:128]+1024[[1,64]] op=square data=sbuf:float32[0:128]+0[[1,64]] wait=s0>=1\n");
    let (a, b) = (&r.trace.records[0], &r.trace.records[1]);
    assert_eq!(b.start_ps, a.end_ps + 53_000);
    let w = r.trace.sems.iter().find(|e| e.wait).unwrap();
    assert_eq!(w.by, 0);
}
