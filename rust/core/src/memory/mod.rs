//! The memories: sparse HBM, per-core SBUF and PSUM, and access patterns into them.

pub mod ap;
pub mod hbm;
pub mod onchip;
pub mod par_copy;
pub mod ranges;
pub mod rows;
pub mod view;
pub mod zeroed;

pub use ap::{Ap, DynKind, DynSrc, Dynamic};

pub use crate::hw::{
    HBM_BYTES, NUM_CORES, PARTITIONS, PSUM_BANKS, PSUM_BANK_BYTES, PSUM_PART_BYTES, SBUF_PART_BYTES,
};

/// Memory spaces; the discriminant is the binary encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Mem {
    Sbuf = 0,
    Psum = 1,
    Hbm = 2,
}

impl Mem {
    pub fn name(self) -> &'static str {
        match self {
            Mem::Sbuf => "sbuf",
            Mem::Psum => "psum",
            Mem::Hbm => "hbm",
        }
    }
    pub fn from_name(s: &str) -> Option<Mem> {
        match s {
            "sbuf" => Some(Mem::Sbuf),
            "psum" => Some(Mem::Psum),
            "hbm" => Some(Mem::Hbm),
            _ => None,
        }
    }
    pub fn from_u8(v: u8) -> Option<Mem> {
        match v {
            0 => Some(Mem::Sbuf),
            1 => Some(Mem::Psum),
            2 => Some(Mem::Hbm),
            _ => None,
        }
    }
    /// The bit used in ISA memory sets.
    pub fn bit(self) -> u8 {
        match self {
            Mem::Sbuf => crate::isa::spec::mem::SBUF,
            Mem::Psum => crate::isa::spec::mem::PSUM,
            Mem::Hbm => crate::isa::spec::mem::HBM,
        }
    }
}
