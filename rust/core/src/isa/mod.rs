//! The instruction set: generated tables, instruction values, validation, text and binary forms.

pub mod default_engine;
pub mod encode;
pub mod instr;
#[rustfmt::skip]
pub mod ops;
pub mod spec;
#[rustfmt::skip]
pub mod tables;
pub mod text;
pub mod validate;

pub use instr::{Arg, Instr, Program, Signal, Wait};
pub use spec::{Access, Kind};
pub use tables::{ActFn, AluOp, DType, DgeMode, Engine, MatmulPerfMode, Opcode, ReduceCmd};
