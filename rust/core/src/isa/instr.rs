//! Instructions and programs as values.

use super::spec::{Default, Kind};
use super::tables::{Engine, Opcode};
use crate::error::{fail, ErrorKind, Result};
use crate::memory::Ap;

pub use crate::hw::{NUM_REGISTERS, NUM_SEMAPHORES};
/// Waits (and, separately, signals) per instruction: the binary encoding counts them in a byte.
pub const MAX_SYNC: usize = 255;

/// One operand value. `Absent` = keyword omitted / None.
#[derive(Clone, Debug)]
pub enum Arg {
    Absent,
    Tensor(Ap),
    F32(f32),
    I32(i32),
    Bool(bool),
    Enum(u8),
    Ints(Vec<i32>),
    Reg(u8),
}

impl PartialEq for Arg {
    /// Bit equality for floats, so NaN payloads and -0.0 round-trip checks are exact.
    fn eq(&self, other: &Self) -> bool {
        use Arg::*;
        match (self, other) {
            (Absent, Absent) => true,
            (Tensor(a), Tensor(b)) => a == b,
            (F32(a), F32(b)) => a.to_bits() == b.to_bits(),
            (I32(a), I32(b)) => a == b,
            (Bool(a), Bool(b)) => a == b,
            (Enum(a), Enum(b)) => a == b,
            (Ints(a), Ints(b)) => a == b,
            (Reg(a), Reg(b)) => a == b,
            _ => false,
        }
    }
}

impl Kind {
    /// Whether an operand of this kind may hold `a` (absent is always representable).
    pub fn accepts(self, a: &Arg) -> bool {
        matches!(
            (self, a),
            (_, Arg::Absent)
                | (Kind::Tensor, Arg::Tensor(_))
                | (
                    Kind::TensorOrF32,
                    Arg::Tensor(_) | Arg::F32(_) | Arg::I32(_)
                )
                | (Kind::F32, Arg::F32(_) | Arg::I32(_))
                | (Kind::I32, Arg::I32(_))
                | (Kind::I32OrReg, Arg::I32(_) | Arg::Reg(_))
                | (Kind::Bool, Arg::Bool(_))
                | (Kind::Enum, Arg::Enum(_))
                | (Kind::Ints | Kind::Pattern, Arg::Ints(_))
                | (Kind::Reg, Arg::Reg(_))
        )
    }
}

impl Arg {
    /// The value an omitted keyword takes (`None` when the keyword is required).
    pub fn from_default(d: &Default, _kind: Kind) -> Option<Arg> {
        Some(match *d {
            Default::Required => return None,
            Default::Absent => Arg::Absent,
            Default::Bool(b) => Arg::Bool(b),
            Default::F32(f) => Arg::F32(f),
            Default::I32(i) => Arg::I32(i),
            Default::Enum(e) => Arg::Enum(e),
            Default::Ints(v) => Arg::Ints(v.to_vec()),
        })
    }

    /// A numeric immediate (`F32`, or an exact integer `I32`) as fp32; integer immediates are
    /// read as signed int32 and rounded to nearest even, the arithmetic path of every engine.
    pub fn imm_f32(&self) -> Option<f32> {
        match *self {
            Arg::F32(v) => Some(v),
            Arg::I32(v) => Some(v as f32),
            _ => None,
        }
    }

    #[inline]
    pub fn tensor(&self) -> Option<&Ap> {
        match self {
            Arg::Tensor(ap) => Some(ap),
            _ => None,
        }
    }

    // Typed getters for the generated operand views (`isa::ops`): `None` on a kind mismatch.
    #[inline]
    pub fn as_tensor(&self) -> Option<&Ap> {
        self.tensor()
    }
    #[inline]
    pub fn as_scalar(&self) -> Option<Scalar<'_>> {
        match self {
            Arg::Tensor(ap) => Some(Scalar::Tile(ap)),
            Arg::F32(v) => Some(Scalar::Imm(Imm::F32(*v))),
            Arg::I32(v) => Some(Scalar::Imm(Imm::I32(*v))),
            _ => None,
        }
    }
    #[inline]
    pub fn as_imm(&self) -> Option<Imm> {
        match *self {
            Arg::F32(v) => Some(Imm::F32(v)),
            Arg::I32(v) => Some(Imm::I32(v)),
            _ => None,
        }
    }
    #[inline]
    pub fn as_i32(&self) -> Option<i32> {
        match *self {
            Arg::I32(v) => Some(v),
            _ => None,
        }
    }
    #[inline]
    pub fn as_int_or_reg(&self) -> Option<IntOrReg> {
        match *self {
            Arg::I32(v) => Some(IntOrReg::Imm(v)),
            Arg::Reg(r) => Some(IntOrReg::Reg(r)),
            _ => None,
        }
    }
    #[inline]
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Arg::Bool(v) => Some(v),
            _ => None,
        }
    }
    #[inline]
    pub fn as_enum(&self) -> Option<u8> {
        match *self {
            Arg::Enum(v) => Some(v),
            _ => None,
        }
    }
    #[inline]
    pub fn as_ints(&self) -> Option<&[i32]> {
        match self {
            Arg::Ints(v) => Some(v),
            _ => None,
        }
    }
    #[inline]
    pub fn as_reg(&self) -> Option<u8> {
        match *self {
            Arg::Reg(r) => Some(r),
            _ => None,
        }
    }
}

/// A numeric immediate: fp32, or an exact 32-bit integer (bit-exact for integer memset and
/// bitwise ops; converted with RNE, read as signed int32, on the fp32 arithmetic path).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Imm {
    F32(f32),
    I32(i32),
}

impl Imm {
    pub fn f32(self) -> f32 {
        match self {
            Imm::F32(v) => v,
            Imm::I32(v) => v as f32,
        }
    }
}

/// An `i32_or_reg` operand: an immediate, or a register of the issuing engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntOrReg {
    Imm(i32),
    Reg(u8),
}

impl IntOrReg {
    /// The value, reading a register from `regs` (validation keeps `r` in range).
    pub fn value(self, regs: &[u32]) -> i32 {
        match self {
            IntOrReg::Imm(v) => v,
            IntOrReg::Reg(r) => regs.get(r as usize).map_or(0, |&v| v as i32),
        }
    }
}

/// A `tensor_or_f32` operand: a (P,1) tile of per-partition values or an immediate.
#[derive(Clone, Copy, Debug)]
pub enum Scalar<'a> {
    Tile(&'a Ap),
    Imm(Imm),
}

impl<'a> Scalar<'a> {
    pub fn tile(self) -> Option<&'a Ap> {
        match self {
            Scalar::Tile(ap) => Some(ap),
            Scalar::Imm(_) => None,
        }
    }
    /// The immediate as fp32, `None` for a tile.
    pub fn imm_f32(self) -> Option<f32> {
        match self {
            Scalar::Imm(i) => Some(i.f32()),
            Scalar::Tile(_) => None,
        }
    }
}

/// View support: `ins` does not have the operand count of its opcode.
#[cold]
#[inline(never)]
pub(crate) fn arity_error(ins: &Instr, n: usize) -> crate::error::EmuError {
    fail(
        ErrorKind::Internal,
        "operand_count",
        format!(
            "{} takes {n} operands, got {}",
            ins.op.spec().name,
            ins.args.len()
        ),
    )
}

/// View support: operand `i` read by `get`; `None` when absent; a kind mismatch is an error.
#[inline(always)]
pub(crate) fn field<'a, T>(
    ins: &Instr,
    i: usize,
    a: &'a Arg,
    get: impl Fn(&'a Arg) -> Option<T>,
) -> Result<Option<T>> {
    if let Arg::Absent = a {
        return Ok(None);
    }
    match get(a) {
        Some(v) => Ok(Some(v)),
        None => Err(kind_error(ins, i)),
    }
}

#[cold]
#[inline(never)]
fn kind_error(ins: &Instr, i: usize) -> crate::error::EmuError {
    let p = &ins.op.spec().params[i];
    fail(
        ErrorKind::Value,
        "operand_kind",
        format!("expected {:?}, got {:?}", p.kind, ins.args[i]),
    )
    .operand(p.name)
}

/// View support: a required operand must be present.
#[inline(always)]
pub(crate) fn required<T>(v: Option<T>, ins: &Instr, i: usize) -> Result<T> {
    match v {
        Some(v) => Ok(v),
        None => Err(missing_error(ins, i)),
    }
}

#[cold]
#[inline(never)]
fn missing_error(ins: &Instr, i: usize) -> crate::error::EmuError {
    fail(
        ErrorKind::Value,
        "operand_required",
        "required operand is missing".to_string(),
    )
    .operand(ins.op.spec().params[i].name)
}

/// `wait`: block until semaphore `sem` >= `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    pub sem: u16,
    pub value: u32,
}

/// `signal`: add `delta` to semaphore `sem` when the instruction completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal {
    pub sem: u16,
    pub delta: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Instr {
    pub op: Opcode,
    pub engine: Engine,
    pub args: Vec<Arg>,
    pub waits: Vec<Wait>,
    pub signals: Vec<Signal>,
    /// Label (`name=` in NKI; kernel source line from the front end).
    pub name: Option<String>,
}

impl Instr {
    /// Tensor operands with their parameter index, name and access.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, &'static str, super::spec::Access, &Ap)> {
        let spec = self.op.spec();
        self.args.iter().enumerate().filter_map(move |(i, a)| {
            a.tensor()
                .map(|ap| (i, spec.params[i].name, spec.params[i].access, ap))
        })
    }
}

/// The instructions of one core, in program order (each runs on its engine's stream).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Program {
    pub core: u8,
    pub instrs: Vec<Instr>,
}
