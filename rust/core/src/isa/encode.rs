//! Binary encoding (little-endian), documented in docs/encoding.md. Decoding validates every
//! field and then the whole instruction, so a decoded program is as trustworthy as an assembled one.

use super::instr::{Arg, Instr, Program, Signal, Wait};
use super::spec::ParamSpec;
use super::tables::{DType, Engine, Opcode};
use super::validate::validate_generic as validate;
use crate::error::{fail, EmuError, ErrorKind::Decode, Result};
use crate::hw::NUM_CORES;
use crate::memory::{Ap, DynKind, DynSrc, Dynamic, Mem};

pub const MAGIC: &[u8; 4] = b"T3EP";
pub const VERSION: u16 = 1;

const TAG_ABSENT: u8 = 0;
const TAG_TENSOR: u8 = 1;
const TAG_F32: u8 = 2;
const TAG_I32: u8 = 3;
const TAG_BOOL: u8 = 4;
const TAG_ENUM: u8 = 5;
const TAG_INTS: u8 = 6;
const TAG_REG: u8 = 7;

fn put_ap(out: &mut Vec<u8>, ap: &Ap) {
    out.push(ap.mem as u8);
    out.push(ap.dtype as u8);
    out.push(ap.start.min(255) as u8);
    out.push(ap.dynamic.is_some() as u8);
    out.extend_from_slice(&ap.parts.to_le_bytes());
    out.extend_from_slice(&ap.pstep.to_le_bytes());
    out.extend_from_slice(&ap.offset.to_le_bytes());
    out.push(ap.dims.len() as u8);
    for (st, n) in &ap.dims {
        out.extend_from_slice(&st.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    if let Some(d) = ap.dynamic.as_deref() {
        out.push(match d.kind {
            DynKind::Scalar => 0,
            DynKind::Vector => 1,
            DynKind::Indirect => 2,
            DynKind::Columns => 3,
        });
        match &d.src {
            DynSrc::Reg(r) => {
                out.push(0);
                out.push(*r);
            }
            DynSrc::Tile(t) => {
                out.push(1);
                put_ap(out, t);
            }
        }
        out.extend_from_slice(&d.step.to_le_bytes());
        out.extend_from_slice(&d.bound.to_le_bytes());
    }
}

pub fn encode_instr(ins: &Instr, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&(ins.op as u16).to_le_bytes());
    out.push(ins.engine as u8);
    out.push(ins.name.is_some() as u8);
    out.extend_from_slice(&0u32.to_le_bytes()); // length, patched below
    out.push(ins.waits.len() as u8);
    out.push(ins.signals.len() as u8);
    for w in &ins.waits {
        out.extend_from_slice(&w.sem.to_le_bytes());
        out.extend_from_slice(&w.value.to_le_bytes());
    }
    for s in &ins.signals {
        out.extend_from_slice(&s.sem.to_le_bytes());
        out.extend_from_slice(&s.delta.to_le_bytes());
    }
    if let Some(n) = &ins.name {
        out.push(n.len() as u8);
        out.extend_from_slice(n.as_bytes());
    }
    for a in &ins.args {
        match a {
            Arg::Absent => out.push(TAG_ABSENT),
            Arg::Tensor(ap) => {
                out.push(TAG_TENSOR);
                put_ap(out, ap);
            }
            Arg::F32(v) => {
                out.push(TAG_F32);
                out.extend_from_slice(&v.to_bits().to_le_bytes());
            }
            Arg::I32(v) => {
                out.push(TAG_I32);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Arg::Bool(b) => {
                out.push(TAG_BOOL);
                out.push(*b as u8);
            }
            Arg::Enum(e) => {
                out.push(TAG_ENUM);
                out.push(*e);
            }
            Arg::Ints(v) => {
                out.push(TAG_INTS);
                out.push(v.len() as u8);
                for x in v {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            Arg::Reg(r) => {
                out.push(TAG_REG);
                out.push(*r);
            }
        }
    }
    let len = (out.len() - start) as u32;
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
}

pub fn encode_program(p: &Program) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + p.instrs.len() * 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(p.core);
    out.push(0);
    out.extend_from_slice(&(p.instrs.len() as u32).to_le_bytes());
    for ins in &p.instrs {
        encode_instr(ins, &mut out);
    }
    out
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() - self.pos < n {
            return Err(fail(
                Decode,
                "decode_truncated",
                format!("truncated at byte {} (needed {n} more)", self.pos),
            ));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.bytes()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.bytes()?))
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
}

fn get_ap(r: &mut Reader, nested: bool) -> Result<Ap> {
    let m = r.u8()?;
    let mem = Mem::from_u8(m)
        .ok_or_else(|| fail(Decode, "decode_bad_memory", format!("bad memory code {m}")))?;
    let d = r.u8()?;
    let dtype = DType::from_u8(d)
        .ok_or_else(|| fail(Decode, "decode_bad_dtype", format!("bad dtype code {d}")))?;
    let start = r.u8()? as u32;
    let flags = r.u8()?;
    if flags > 1 || (nested && flags != 0) {
        return Err(fail(
            Decode,
            "decode_bad_ap_flags",
            format!("unknown access-pattern flags {flags:#x}"),
        ));
    }
    let parts = r.u32()?;
    let pstep = r.i64()?;
    let offset = r.u64()?;
    let nd = r.u8()?;
    if nd as usize > crate::memory::ap::MAX_FREE_DIMS {
        return Err(fail(
            Decode,
            "decode_too_many_dims",
            format!("{nd} free dims (at most 4)"),
        ));
    }
    let mut dims = Vec::with_capacity(nd as usize);
    for _ in 0..nd {
        let st = r.i64()?;
        let n = r.u32()?;
        dims.push((st, n));
    }
    let dynamic = if flags & 1 != 0 {
        let kind = match r.u8()? {
            0 => DynKind::Scalar,
            1 => DynKind::Vector,
            2 => DynKind::Indirect,
            k => {
                return Err(fail(
                    Decode,
                    "decode_bad_dynamic_kind",
                    format!("unknown dynamic-offset kind {k}"),
                ))
            }
        };
        let src = match r.u8()? {
            0 => DynSrc::Reg(r.u8()?),
            1 => DynSrc::Tile(get_ap(r, true)?),
            k => {
                return Err(fail(
                    Decode,
                    "decode_bad_dynamic_source",
                    format!("unknown dynamic-offset source {k}"),
                ))
            }
        };
        let step = r.i64()?;
        let bound = r.u32()?;
        Some(Box::new(Dynamic {
            kind,
            src,
            step,
            bound,
            cols: Vec::new(),
        }))
    } else {
        None
    };
    if mem != Mem::Hbm && pstep != 0 {
        return Err(fail(
            Decode,
            "decode_onchip_row_step",
            "on-chip access pattern with a row step",
        ));
    }
    if mem == Mem::Hbm && start != 0 {
        return Err(fail(
            Decode,
            "decode_hbm_start_partition",
            "HBM access pattern with a start partition",
        ));
    }
    Ok(Ap {
        mem,
        dtype,
        start,
        parts,
        pstep,
        offset,
        dims,
        dynamic,
    })
}

/// One operand: its tag, then the value; the tag must fit the parameter's kind.
fn get_arg(r: &mut Reader, p: &ParamSpec) -> Result<Arg> {
    let tag = r.u8()?;
    let a = match tag {
        TAG_ABSENT => Arg::Absent,
        TAG_TENSOR => Arg::Tensor(get_ap(r, false)?),
        TAG_F32 => Arg::F32(f32::from_bits(r.u32()?)),
        TAG_I32 => Arg::I32(r.i32()?),
        TAG_BOOL => match r.u8()? {
            0 => Arg::Bool(false),
            1 => Arg::Bool(true),
            b => return Err(fail(Decode, "decode_bad_bool", format!("bool byte {b}"))),
        },
        TAG_ENUM => Arg::Enum(r.u8()?),
        TAG_INTS => {
            let n = r.u8()?;
            let mut v = Vec::with_capacity(n as usize);
            for _ in 0..n {
                v.push(r.i32()?);
            }
            Arg::Ints(v)
        }
        TAG_REG => Arg::Reg(r.u8()?),
        t => {
            return Err(fail(
                Decode,
                "decode_bad_operand_tag",
                format!("unknown operand tag {t}"),
            ))
        }
    };
    if !p.kind.accepts(&a) {
        return Err(fail(
            Decode,
            "decode_operand_kind",
            format!("operand tag {tag} does not fit kind {:?}", p.kind),
        ));
    }
    Ok(a)
}

fn decode_instr(r: &mut Reader) -> Result<Instr> {
    let at = r.pos;
    let opc = r.u16()?;
    let op = Opcode::from_u16(opc).ok_or_else(|| {
        fail(
            Decode,
            "decode_unknown_opcode",
            format!("unknown opcode {opc:#06x} at byte {at}"),
        )
    })?;
    let e = r.u8()?;
    let engine = Engine::from_u8(e)
        .ok_or_else(|| fail(Decode, "decode_bad_engine", format!("bad engine code {e}")))?;
    let flags = r.u8()?;
    if flags > 1 {
        return Err(fail(
            Decode,
            "decode_bad_flags",
            format!("unknown flags {flags:#x}"),
        ));
    }
    let len = r.u32()? as usize;
    let nw = r.u8()?;
    let ns = r.u8()?;
    let mut waits = Vec::new();
    for _ in 0..nw {
        waits.push(Wait {
            sem: r.u16()?,
            value: r.u32()?,
        });
    }
    let mut signals = Vec::new();
    for _ in 0..ns {
        signals.push(Signal {
            sem: r.u16()?,
            delta: r.u32()?,
        });
    }
    let name = if flags & 1 != 0 {
        let n = r.u8()? as usize;
        let b = r.take(n)?;
        Some(
            String::from_utf8(b.to_vec())
                .map_err(|_| fail(Decode, "decode_name_not_utf8", "name is not UTF-8"))?,
        )
    } else {
        None
    };
    let spec = op.spec();
    let args = spec
        .params
        .iter()
        .map(|p| get_arg(r, p).map_err(|e| e.operand(p.name)))
        .collect::<Result<Vec<_>>>()?;
    if r.pos - at != len {
        return Err(fail(
            Decode,
            "decode_length_mismatch",
            format!(
                "instruction length field says {len} bytes, decoded {}",
                r.pos - at
            ),
        ));
    }
    let ins = Instr {
        op,
        engine,
        args,
        waits,
        signals,
        name,
    };
    validate(&ins)?;
    Ok(ins)
}

/// Decode a program with the generic checks only; `engines::decode_program` adds every
/// instruction's own rules.
pub fn decode_program(bytes: &[u8]) -> Result<Program> {
    decode_program_with(bytes, |_| Ok(()))
}

/// Decode a program, running `check` on each instruction after the generic checks.
pub fn decode_program_with(bytes: &[u8], check: impl Fn(&Instr) -> Result<()>) -> Result<Program> {
    let mut r = Reader { b: bytes, pos: 0 };
    if r.take(4)? != MAGIC {
        return Err(fail(
            Decode,
            "decode_bad_magic",
            "not a trn3emu program (bad magic)",
        ));
    }
    let v = r.u16()?;
    if v != VERSION {
        return Err(fail(
            Decode,
            "decode_version",
            format!("encoding version {v} (this build reads {VERSION})"),
        ));
    }
    let core = r.u8()?;
    if core as usize >= NUM_CORES {
        return Err(fail(
            Decode,
            "decode_core_out_of_range",
            format!("core {core} out of range (0..{NUM_CORES})"),
        ));
    }
    if r.u8()? != 0 {
        return Err(fail(
            Decode,
            "decode_reserved_byte",
            "reserved header byte is not zero",
        ));
    }
    let n = r.u32()? as usize;
    let mut instrs = Vec::with_capacity(n.min(1 << 16));
    for i in 0..n {
        let ins = decode_instr(&mut r).map_err(|e: EmuError| e.at(i, "<binary>"))?;
        check(&ins).map_err(|e| e.at(i, "<binary>"))?;
        instrs.push(ins);
    }
    if r.pos != bytes.len() {
        return Err(fail(
            Decode,
            "decode_trailing_bytes",
            format!(
                "{} trailing bytes after {n} instructions",
                bytes.len() - r.pos
            ),
        ));
    }
    Ok(Program { core, instrs })
}
