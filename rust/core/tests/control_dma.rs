//! Registers, branches, dynamic DMA addressing and read-add-write through the public API,
//! with programs written in the text assembly.

use trn3emu_core::engines::{decode_program, parse_program};
use trn3emu_core::isa::encode::encode_program;
use trn3emu_core::isa::text::format_program;
use trn3emu_core::{Device, ErrorKind, RunOptions};

fn run(dev: &mut Device, text: &str) -> trn3emu_core::Result<trn3emu_core::RunResult> {
    let p = parse_program(text)?;
    dev.run(&[p], &RunOptions::default())
}

fn sbuf_f32(dev: &Device, part: usize, off: usize) -> f32 {
    let b = &dev.cores[0].sbuf.partition(part)[off..];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[test]
fn counted_loop_runs_its_body_n_times() {
    // r1 = 0; do { t += 1.5; r1 += 1 } while r1 < 6
    let text = "\
memset.vector dst=sbuf:float32[0:4]+0[[1,8]] value=0.0
register_move.vector dst=r1 src=0
tensor_scalar.vector dst=sbuf:float32[0:4]+0[[1,8]] data=sbuf:float32[0:4]+0[[1,8]] op0=add operand0=1.5
register_op.vector dst=r1 src=r1 op=add imm=1
branch.vector target=2 cmp=lt reg=r1 imm=6
";
    let mut dev = Device::new();
    let r = run(&mut dev, text).unwrap();
    assert_eq!(sbuf_f32(&dev, 3, 28), 9.0);
    assert_eq!(r.executed, 2 + 3 * 6);
    assert_eq!(dev.cores[0].regs[1][1], 6);
}

#[test]
fn dynamic_patterns_round_trip_text_and_binary() {
    let text = "\
.core 2
dma_copy.gpsimd dst=sbuf:float32[0:16]+0[[1,32]] src=hbm:float32+64[[32,16],[1,32]]@v(sbuf:uint32[0:16]+256[[1,1]],32,100) oob_mode=skip
dma_copy.sync dst=hbm:float32+0[[32,1],[1,32]]@s(r7,32,100) src=sbuf:float32[0:1]+0[[1,32]]
branch.sync target=0 cmp=ne reg=r7 imm=-1
";
    let p = parse_program(text).unwrap();
    assert_eq!(format_program(&p), text);
    let b = encode_program(&p);
    assert_eq!(decode_program(&b).unwrap(), p);
}

#[test]
fn gather_oob_error_and_read_add_write() {
    let mut dev = Device::new();
    // index 5 into a 4-row table: an AddressError naming src.
    let e = run(
        &mut dev,
        "dma_copy.gpsimd dst=sbuf:float32[0:1]+0[[1,4]] src=hbm:float32+0[[4,1],[1,4]]@s(r0,4,4)\n\
         register_move.gpsimd dst=r0 src=5\n\
         dma_copy.gpsimd dst=sbuf:float32[0:1]+0[[1,4]] src=hbm:float32+0[[4,1],[1,4]]@s(r0,4,4) wait=s0>=0\n",
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Address, "{e}");
    assert_eq!(e.operand.as_deref(), Some("src"));
    // B += A twice from two engines without semaphores between the two adds.
    let text = "\
memset.vector dst=sbuf:float32[0:2]+0[[1,4]] value=1.0 signal=s0+1
memset.vector dst=sbuf:float32[0:2]+64[[1,4]] value=2.5 signal=s0+1
dma_compute.sync dst=sbuf:float32[0:2]+0[[1,4]] src0=sbuf:float32[0:2]+0[[1,4]] src1=sbuf:float32[0:2]+64[[1,4]] wait=s0>=2 signal=s1+1
dma_compute.scalar dst=sbuf:float32[0:2]+0[[1,4]] src0=sbuf:float32[0:2]+0[[1,4]] src1=sbuf:float32[0:2]+64[[1,4]] wait=s0>=2 signal=s1+1
";
    run(&mut dev, text).unwrap();
    assert_eq!(sbuf_f32(&dev, 1, 12), 6.0);
}

#[test]
fn runaway_loop_stops_at_the_step_limit() {
    let mut dev = Device::new();
    dev.max_executed = 1000;
    let e = run(&mut dev, "nop.gpsimd\nbranch.gpsimd target=0\n").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Runaway, "{e}");
    assert_eq!(e.rule, "runaway_loop", "{e}");
    assert!(e.message.contains("runaway"), "{e}");
    // The device stays usable.
    run(&mut dev, "nop.sync\n").unwrap();
}
