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
