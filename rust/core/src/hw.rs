//! Hardware constants of one NeuronCore-v4 (and the emulator's choices where the hardware count
//! is not public), defined once here; the memory and ISA layers re-export them and the binding
//! crate exports them to Python.

/// SBUF / PSUM partitions (the rows of every on-chip tile).
pub const PARTITIONS: usize = 128;
/// SBUF bytes per partition (128 x 256 KiB = 32 MiB per core).
pub const SBUF_PART_BYTES: usize = 256 * 1024;
/// PSUM bytes per partition (128 x 16 KiB = 2 MiB).
pub const PSUM_PART_BYTES: usize = 16 * 1024;
/// One PSUM accumulation bank per partition: 2 KiB (512 fp32).
pub const PSUM_BANK_BYTES: usize = 2048;
/// PSUM banks per partition.
pub const PSUM_BANKS: usize = 8;
/// Device HBM (144 GiB).
pub const HBM_BYTES: u64 = 144 << 30;
/// NeuronCores per device (program `.core` ids are `0..NUM_CORES`).
pub const NUM_CORES: usize = 8;
/// Semaphores per core available to programs (an emulator choice; the hardware count is not public).
pub const NUM_SEMAPHORES: u16 = 256;
/// Registers per engine sequencer.
pub const NUM_REGISTERS: u8 = 64;

const _: () = assert!(PSUM_BANKS * PSUM_BANK_BYTES == PSUM_PART_BYTES);
/// Chips of the largest Trn3 UltraServer (NeuronSwitch-v1 all-to-all); a replica group names a
/// core of any chip by its global id `chip * NUM_CORES + core`.
pub const MAX_CHIPS: usize = 144;

/// Chiplets of a Trainium3 and NeuronCores per chiplet: cores `4c..4c+4` sit on chiplet `c`.
pub const CHIPLETS: usize = 2;
pub const CORES_PER_CHIPLET: usize = NUM_CORES / CHIPLETS;
/// HBM stacks of the device; chiplet `c` is attached to stacks `2c` and `2c + 1`.
pub const HBM_STACKS: u32 = 4;
/// Interleave granule between the two stacks of a chiplet, bytes (an ESTIMATE: the address map
/// is not published; docs/cost-model.md, "Dual-chiplet locality").
pub const HBM_INTERLEAVE_BYTES: u64 = 4096;

const _: () = assert!(CHIPLETS * CORES_PER_CHIPLET == NUM_CORES);

/// The chiplet a NeuronCore sits on.
pub const fn core_chiplet(core: usize) -> usize {
    core / CORES_PER_CHIPLET
}

/// The chiplet whose stacks hold HBM byte `addr`: the lower half of the address space lives on
/// chiplet 0's stacks, the upper half on chiplet 1's (ESTIMATE, as the runtime places a core's
/// memory near it).
pub const fn hbm_chiplet(addr: u64) -> usize {
    if addr < HBM_BYTES / 2 {
        0
    } else {
        1
    }
}

/// The HBM stack holding byte `addr`: its chiplet's two stacks alternate every
/// `HBM_INTERLEAVE_BYTES` (ESTIMATE).
pub const fn hbm_stack(addr: u64) -> u32 {
    2 * hbm_chiplet(addr) as u32 + ((addr / HBM_INTERLEAVE_BYTES) % 2) as u32
}
