//! The types the generated tables (`tables.rs`) are written in.

pub use super::tables::{CostClass, DType, Engine, Opcode};

/// Memory-space bit sets used by operand and engine specs.
pub mod mem {
    pub const SBUF: u8 = 1;
    pub const PSUM: u8 = 2;
    pub const HBM: u8 = 4;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DKind {
    Float,
    Int,
    Uint,
    Bool,
    Packed,
}

#[derive(Clone, Copy, Debug)]
pub struct DTypeInfo {
    pub dtype: DType,
    pub name: &'static str,
    pub bits: u32,
    pub kind: DKind,
}

#[derive(Clone, Copy, Debug)]
pub struct EnumInfo {
    pub name: &'static str,
    pub values: &'static [&'static str],
}

#[derive(Clone, Copy, Debug)]
pub struct EngineInfo {
    pub engine: Engine,
    pub name: &'static str,
    pub reads: u8,
    pub writes: u8,
}

/// How an operand is written in text, encoded in binary and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Tensor,
    TensorOrF32,
    F32,
    I32,
    /// An int32 immediate or a register of the issuing engine (a dynamic offset).
    I32OrReg,
    Bool,
    Enum,
    Ints,
    Pattern,
    Reg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    None,
    Read,
    Write,
    ReadWrite,
}

impl Access {
    pub fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// The value an omitted keyword takes.
#[derive(Clone, Copy, Debug)]
pub enum Default {
    Required,
    Absent,
    Bool(bool),
    F32(f32),
    I32(i32),
    Enum(u8),
    Ints(&'static [i32]),
}

/// Where an operand may start on the partition axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartRule {
    /// The generic start-partition rule (checked by `isa::validate`).
    Partition,
    /// Placed by the instruction's own check (e.g. MX scale quadrants).
    Any,
}

/// The data path an instruction's operands travel (from its cost class).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// The issuing engine's own read and write ports.
    Compute,
    /// A transfer queued on the DMA engines; the issuing engine only triggers it.
    Dma,
    /// An inter-core rendezvous whose data moves on the DMA engines.
    Collective,
    /// The sequencer alone (registers, branches).
    Control,
}

#[derive(Clone, Copy, Debug)]
pub struct ParamSpec {
    pub name: &'static str,
    pub kind: Kind,
    pub access: Access,
    pub mem: u8,
    pub dtypes: u32,
    pub enum_id: u8,
    pub default: Default,
    pub start: StartRule,
    /// May use tensor indirection (an index tile).
    pub indirect: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct InstrSpec {
    pub opcode: Opcode,
    pub name: &'static str,
    pub engines: &'static [Engine],
    pub cost: CostClass,
    pub path: DataPath,
    pub since: &'static str,
    pub nki: bool,
    /// Draws from or sets the core's random generators.
    pub rng: bool,
    /// An NKI `mask=` can restrict it.
    pub maskable: bool,
    pub params: &'static [ParamSpec],
}

impl InstrSpec {
    pub fn param_index(&self, name: &str) -> Option<usize> {
        self.params.iter().position(|p| p.name == name)
    }
}

impl DType {
    pub fn info(self) -> &'static DTypeInfo {
        &super::tables::DTYPES[self as usize]
    }
    pub fn from_u8(code: u8) -> Option<DType> {
        super::tables::DTYPES.get(code as usize).map(|d| d.dtype)
    }
    pub fn from_name(name: &str) -> Option<DType> {
        super::tables::DTYPES
            .iter()
            .find(|d| d.name == name)
            .map(|d| d.dtype)
    }
    pub fn name(self) -> &'static str {
        self.info().name
    }
    pub fn size(self) -> usize {
        (self.info().bits / 8) as usize
    }
    pub fn is_packed(self) -> bool {
        self.info().kind == DKind::Packed
    }
    pub fn is_float(self) -> bool {
        self.info().kind == DKind::Float
    }
    pub fn is_integer(self) -> bool {
        matches!(self.info().kind, DKind::Int | DKind::Uint | DKind::Bool)
    }
    pub fn in_class(self, class: u32) -> bool {
        class & (1u32 << (self as u32)) != 0
    }
}

impl Engine {
    pub fn info(self) -> Option<&'static EngineInfo> {
        super::tables::ENGINES.iter().find(|e| e.engine == self)
    }
}

/// Names of the memories in a bit set, for messages.
pub fn mem_names(set: u8) -> String {
    let mut v = Vec::new();
    if set & mem::SBUF != 0 {
        v.push("sbuf");
    }
    if set & mem::PSUM != 0 {
        v.push("psum");
    }
    if set & mem::HBM != 0 {
        v.push("hbm");
    }
    if v.is_empty() {
        "none".into()
    } else {
        v.join("/")
    }
}

/// Names of the dtypes in a class bit set, for messages.
pub fn dtype_names(class: u32) -> String {
    super::tables::DTYPES
        .iter()
        .filter(|d| d.dtype.in_class(class))
        .map(|d| d.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::tables::{Opcode, INSTRUCTIONS};

    /// `Opcode::spec`'s flat table: every opcode (from its binary code, as a decoded program
    /// has it) finds its own entry, and no two share one.
    #[test]
    fn every_opcode_finds_its_own_spec() {
        for (i, s) in INSTRUCTIONS.iter().enumerate() {
            let op = Opcode::from_u16(s.opcode as u16).expect("a listed opcode decodes");
            assert!(std::ptr::eq(op.spec(), &INSTRUCTIONS[i]), "{}", s.name);
            assert_eq!(op.spec().opcode, op);
        }
    }
}
