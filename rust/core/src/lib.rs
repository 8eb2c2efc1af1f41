//! trn3emu core: an emulator of the AWS Trainium3 chip (8 x NeuronCore-v4).
//!
//! Layers: `hw` (hardware constants) · `numerics` (dtypes, conversions) · `memory` (HBM, SBUF, PSUM, access patterns) ·
//! `isa` (generated tables, instructions, text and binary forms, validation) · `engines`
//! (instruction semantics) · `machine` (device, scheduler, synchronisation) · `cost` · `trace`.
//! No Python here; the binding crate is a thin layer over this one.

pub mod asm;
pub mod cost;
pub mod engine_choice;
pub mod engines;
pub mod error;
pub mod hw;
pub mod isa;
pub mod kernels;
pub mod machine;
pub mod memory;
pub mod numerics;
pub mod par;
pub mod timing;
pub mod trace;

pub use error::{EmuError, ErrorKind, Result};
pub use isa::{Instr, Program};
pub use machine::{Device, RunOptions, RunResult};
