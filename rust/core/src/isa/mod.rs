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
pub use tables::{
    ActFn, AluOp, DType, DgeMode, Engine, MatmulPerfMode, Opcode, ReduceCmd, SparsityPattern,
};

impl SparsityPattern {
    /// `(s, g)` of an `s:g` pattern: at most `s` non-zeros kept in every `g` contiguous
    /// contraction rows (m4_n16 = 4:16). `g / s` is an integer for every pattern.
    pub fn kept_of(self) -> (usize, usize) {
        match self {
            SparsityPattern::M4N16 => (4, 16),
            SparsityPattern::M4N12 => (4, 12),
            SparsityPattern::M4N8 => (4, 8),
            SparsityPattern::M2N8 => (2, 8),
            SparsityPattern::M2N4 => (2, 4),
            SparsityPattern::M1N4 => (1, 4),
            SparsityPattern::M1N2 => (1, 2),
        }
    }

    /// Dense contraction rows per compressed row, `g / s` (4, 3 or 2).
    pub fn ratio(self) -> usize {
        let (s, g) = self.kept_of();
        g / s
    }
}
