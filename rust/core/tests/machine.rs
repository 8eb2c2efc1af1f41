//! Scheduler, synchronisation and memory behaviour through the public API, with programs
//! written in the text assembly.

use trn3emu_core::engines::parse_program;
use trn3emu_core::machine::autosync::auto_sync;
use trn3emu_core::{Device, ErrorKind, RunOptions};

fn run(dev: &mut Device, text: &str) -> trn3emu_core::Result<trn3emu_core::RunResult> {
    let p = parse_program(text)?;
    dev.run(&[p], &RunOptions::default())
}

fn sbuf_f32(dev: &Device, part: usize, off: usize) -> f32 {
    let b = &dev.cores[0].sbuf.partition(part)[off..];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

const WRITE_A: &str = "memset.vector dst=sbuf:float32[0:128]+0[[1,64]] value=2.0";
const READ_A: &str = "activation.scalar dst=sbuf:float32[0:128]+1024[[1,64]] op=square data=sbuf:float32[0:128]+0[[1,64]]";

#[test]
fn unsynchronised_reader_is_a_race_naming_both() {
    let mut dev = Device::new();
    let e = run(&mut dev, &format!("{WRITE_A}\n{READ_A}\n")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Race, "{e}");
    assert!(
        e.message.contains("memset.vector") && e.message.contains("activation.scalar"),
        "{e}"
    );
}

#[test]
fn semaphore_orders_writer_and_reader() {
    let mut dev = Device::new();
    let r = run(
        &mut dev,
        &format!("{WRITE_A} signal=s0+1\n{READ_A} wait=s0>=1\n"),
    )
    .unwrap();
    assert_eq!(sbuf_f32(&dev, 5, 1024), 4.0);
    assert_eq!(r.executed, 2);
    // The reader starts no earlier than the writer ends.
    let recs = &r.trace.records;
    assert!(recs[1].start_ps >= recs[0].end_ps);
}

#[test]
fn cyclic_wait_is_a_deadlock() {
    let mut dev = Device::new();
    let text = "nop.vector wait=s1>=1 signal=s2+1\nnop.scalar wait=s2>=1 signal=s1+1\n";
    let e = run(&mut dev, text).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Deadlock);
    assert!(
        e.message.contains("nop.vector") && e.message.contains("nop.scalar"),
        "{e}"
    );
    // The device stays usable.
    run(&mut dev, "nop.sync\n").unwrap();
}

#[test]
fn auto_sync_makes_a_racy_program_correct_and_keeps_independent_work_parallel() {
    let text = format!(
        "{WRITE_A}\n{READ_A}\nmemset.vector dst=sbuf:float32[0:128]+4096[[1,64]] value=1.0\nmemset.gpsimd dst=sbuf:float32[0:128]+8192[[1,64]] value=3.0\n"
    );
    let p = auto_sync(&parse_program(&text).unwrap()).unwrap();
    assert_eq!(p.instrs[0].signals.len(), 1);
    assert_eq!(p.instrs[1].waits.len(), 1);
    assert!(p.instrs[2].waits.is_empty() && p.instrs[3].waits.is_empty());
    let mut dev = Device::new();
    let r = dev.run(&[p], &RunOptions::default()).unwrap();
    assert_eq!(sbuf_f32(&dev, 0, 1024), 4.0);
    // gpsimd memset does not wait for anything: it starts at time 0, overlapping vector.
    let g = r.trace.records.iter().find(|x| x.index == 3).unwrap();
    assert_eq!(g.start_ps, 0);
}

#[test]
fn dma_read_after_write_needs_the_transfer_signal() {
    let mut dev = Device::new();
    let text = "dma_copy.sync dst=sbuf:float32[0:128]+0[[1,64]] src=hbm:float32+0[[64,128],[1,64]]\nactivation.scalar dst=sbuf:float32[0:128]+1024[[1,64]] op=copy data=sbuf:float32[0:128]+0[[1,64]]\n";
    assert_eq!(run(&mut dev, text).unwrap_err().kind, ErrorKind::Race);
    let synced = auto_sync(&parse_program(text).unwrap()).unwrap();
    dev.run(&[synced], &RunOptions::default()).unwrap();
}

#[test]
fn cores_run_concurrently_and_share_hbm() {
    let mut dev = Device::new();
    let mut progs = Vec::new();
    for c in 0..8u64 {
        let text = format!(
            ".core {c}\nmemset.vector dst=sbuf:float32[0:128]+0[[1,16]] value={c}.0 signal=s0+1\ndma_copy.sync dst=hbm:float32+{}[[16,128],[1,16]] src=sbuf:float32[0:128]+0[[1,16]] wait=s0>=1\n",
            c * 8192
        );
        progs.push(parse_program(&text).unwrap());
    }
    dev.run(&progs, &RunOptions::default()).unwrap();
    for c in 0..8u64 {
        let mut b = [0u8; 4];
        dev.hbm.read(c * 8192 + 4 * 100, &mut b);
        assert_eq!(f32::from_le_bytes(b), c as f32);
    }
}

#[test]
fn streams_and_queues_are_named() {
    use trn3emu_core::isa::Engine;
    use trn3emu_core::machine::{Executor, Stream, AGENTS_PER_CORE, STREAMS};
    use trn3emu_core::trace::Unit;
    for (i, s) in Stream::ALL.iter().enumerate() {
        assert_eq!(s.index(), i);
        assert_eq!(Stream::of(STREAMS[i]), *s);
        assert_eq!(s.engine(), STREAMS[i]);
    }
    // Engines without a sequencer of their own issue on Sync.
    assert_eq!(Stream::of(Engine::Dma), Stream::Sync);
    for i in 0..AGENTS_PER_CORE {
        let e = Executor::from_index(i);
        assert_eq!(e.index(), i);
        assert_eq!(e.is_queue(), i >= STREAMS.len());
    }
    let q = Executor::DmaQueue(Stream::Gpsimd);
    assert_eq!(q.stream(), Stream::Gpsimd);
    assert_eq!(q.unit(), Unit::DmaQueue(3));
    assert_eq!(Executor::Engine(Stream::Vector).unit(), Unit::Engine(1));
}
