//! `Device::run_monitored`: the monitor sees the run's progress every `POLL_EVERY` items and
//! can cancel it (an `Interrupted` error, the device usable afterwards).

use trn3emu_core::engines::parse_program;
use trn3emu_core::machine::{Monitor, Progress, POLL_EVERY};
use trn3emu_core::{Device, ErrorKind, RunOptions};

/// Records every poll; cancels at poll number `stop_at` (if any).
struct Recorder {
    polls: Vec<Progress>,
    stop_at: Option<usize>,
}

impl Monitor for Recorder {
    fn poll(&mut self, p: &Progress) -> bool {
        self.polls.push(*p);
        Some(self.polls.len()) != self.stop_at
    }
}

/// `n` vector adds of 1.0 to an [8, 4] tile, then a DMA of it to HBM.
fn adds(n: usize) -> String {
    let mut t = String::from("memset.vector dst=sbuf:float32[0:8]+0[[1,4]] value=0.0\n");
    for _ in 0..n {
        t += "tensor_scalar.vector dst=sbuf:float32[0:8]+0[[1,4]] data=sbuf:float32[0:8]+0[[1,4]] op0=add operand0=1.0\n";
    }
    t += "dma_copy.vector dst=hbm:float32+0[[4,8],[1,4]] src=sbuf:float32[0:8]+0[[1,4]]\n";
    t
}

fn sbuf_f32(dev: &Device, part: usize, off: usize) -> f32 {
    let b = &dev.cores[0].sbuf.partition(part)[off..];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[test]
fn polls_report_progress_every_poll_interval() {
    let n = 1000;
    let p = parse_program(&adds(n)).unwrap();
    let mut dev = Device::new();
    let mut m = Recorder {
        polls: Vec::new(),
        stop_at: None,
    };
    let r = dev
        .run_monitored(&[&p], &RunOptions::default(), &mut m)
        .unwrap();
    // memset + n adds + the DMA trigger + its transfer
    assert_eq!(r.executed, n as u64 + 3);
    assert_eq!(m.polls.len() as u64, r.executed.div_ceil(POLL_EVERY) - 1);
    for (k, q) in m.polls.iter().enumerate() {
        assert_eq!(q.executed, (k as u64 + 1) * POLL_EVERY);
        assert_eq!(q.total, Some(r.executed));
        assert!(q.emulated_ps > 0 && q.emulated_ps <= r.end_ps);
    }
    assert!(m
        .polls
        .windows(2)
        .all(|w| w[0].emulated_ps < w[1].emulated_ps));
    assert_eq!(sbuf_f32(&dev, 7, 12), n as f32);
}

#[test]
fn a_branching_program_has_no_total() {
    let text = "register_move.gpsimd dst=r1 src=0\nnop.gpsimd\nregister_op.gpsimd dst=r1 src=r1 op=add imm=1\nbranch.gpsimd target=1 cmp=lt reg=r1 imm=100\n";
    let p = parse_program(text).unwrap();
    let mut dev = Device::new();
    let mut m = Recorder {
        polls: Vec::new(),
        stop_at: None,
    };
    let r = dev
        .run_monitored(&[&p], &RunOptions::default(), &mut m)
        .unwrap();
    assert_eq!(r.executed, 1 + 3 * 100);
    assert_eq!(m.polls.len(), 4);
    assert!(m.polls.iter().all(|q| q.total.is_none()));
}

#[test]
fn a_cancelled_run_stops_with_interrupted_and_the_device_stays_usable() {
    let mut dev = Device::new();
    // An endless loop: only the monitor (or the step budget) ends it.
    let forever = parse_program("nop.gpsimd\nbranch.gpsimd target=0\n").unwrap();
    let mut m = Recorder {
        polls: Vec::new(),
        stop_at: Some(3),
    };
    let e = dev
        .run_monitored(&[&forever], &RunOptions::default(), &mut m)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Interrupted, "{e}");
    assert_eq!(e.rule, "interrupted");
    assert!(e.message.contains(&format!("{}", 3 * POLL_EVERY)), "{e}");
    assert_eq!(m.polls.len(), 3);
    // The same device runs the next program to its expected result.
    let p = parse_program(&adds(10)).unwrap();
    dev.run(&[p], &RunOptions::default()).unwrap();
    assert_eq!(sbuf_f32(&dev, 0, 0), 10.0);
}

#[test]
fn the_step_budget_still_applies_with_a_monitor() {
    let mut dev = Device::new();
    dev.max_executed = 1000;
    let forever = parse_program("nop.gpsimd\nbranch.gpsimd target=0\n").unwrap();
    let mut m = Recorder {
        polls: Vec::new(),
        stop_at: None,
    };
    let e = dev
        .run_monitored(&[&forever], &RunOptions::default(), &mut m)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Runaway, "{e}");
    assert_eq!(m.polls.len() as u64, 1000 / POLL_EVERY);
}

#[test]
fn automatic_synchronisation_can_be_cancelled_too() {
    use trn3emu_core::asm::Assembler;
    use trn3emu_core::machine::autosync::CHECK_EVERY;
    let n = 3 * CHECK_EVERY;
    let asm = Assembler::from_program(parse_program(&adds(n)).unwrap());
    let mut asks = 0;
    let e = asm
        .synced_checked(&mut || {
            asks += 1;
            asks < 2
        })
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Interrupted, "{e}");
    assert_eq!(e.rule, "interrupted");
    assert_eq!(asks, 2);
    // Not cancelled: the same result as `synced`, asked once per CHECK_EVERY instructions of
    // the pass and of the validation after it.
    let mut asks = 0;
    let synced = asm
        .synced_checked(&mut || {
            asks += 1;
            true
        })
        .unwrap();
    assert_eq!(synced.program(), asm.synced().unwrap().program());
    assert_eq!(asks, 2 * ((n + 3) / CHECK_EVERY));
}

/// `adds(n)` on `core`.
fn adds_on(core: u8, n: usize) -> trn3emu_core::Program {
    let text = adds(n).replace(
        "hbm:float32+0",
        &format!("hbm:float32+{}", 4096 * core as u32),
    );
    let mut p = parse_program(&text).unwrap();
    p.core = core;
    p
}

#[test]
fn cores_on_two_threads_poll_and_cancel_as_on_one() {
    // Four cores of vector adds: with 2 threads their adds run on both (machine/parallel.rs).
    let progs: Vec<_> = (0..4).map(|c| adds_on(c, 300)).collect();
    let refs: Vec<&trn3emu_core::Program> = progs.iter().collect();
    let mut seen = Vec::new();
    for threads in [1, 2] {
        trn3emu_core::par::set_num_threads(threads);
        let mut dev = Device::new();
        let mut m = Recorder {
            polls: Vec::new(),
            stop_at: Some(5),
        };
        let e = dev
            .run_monitored(&refs, &RunOptions::default(), &mut m)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Interrupted, "{e}");
        // The device stays usable: a full run completes with every core's sum.
        let r = dev.run_refs(&refs, &RunOptions::default()).unwrap();
        let b = &dev.cores[3].sbuf.partition(7)[12..16];
        assert_eq!(f32::from_le_bytes([b[0], b[1], b[2], b[3]]), 300.0);
        seen.push((e.message, m.polls, r.executed, r.end_ps));
    }
    trn3emu_core::par::set_num_threads(0);
    assert_eq!(seen[0], seen[1]);
}
