//! Text assembly: one instruction per line, `print` and `parse` round-trip exactly.
//!
//! ```text
//! .core 0
//! tensor_tensor.vector dst=sbuf:float32[0:128]+0[[1,512]] data1=... op=add wait=s0>=1 signal=s1+1 name=k.py:12
//! ```
//! Operands equal to their default are omitted; an absent operand whose default is not absent is
//! written `none` (`None` for enums that have a value named `none`). Access patterns: on-chip
//! `MEM:DTYPE[START:END]+OFFSET[[step,num],...]`, HBM `hbm:DTYPE+ADDRESS[[row_step,rows],[step,num],...]`.
//! NaNs print as `nan:0x<bits>`.

use super::instr::{Arg, Instr, Program, Signal, Wait};
use super::spec::Kind;
use super::tables::{DType, Engine, Opcode, ENUMS};
use super::validate::validate_generic as validate;
use crate::error::{fail, ErrorKind::*, Result};
use crate::hw::NUM_CORES;
use crate::memory::{Ap, DynKind, DynSrc, Dynamic, Mem};
use std::fmt::Write;

pub fn format_f32(v: f32) -> String {
    if v.is_nan() {
        format!("nan:{:#010x}", v.to_bits())
    } else {
        format!("{v:?}")
    }
}

pub fn format_ap(ap: &Ap) -> String {
    let mut s = String::new();
    let dims: Vec<String> = ap
        .dims
        .iter()
        .map(|(st, n)| format!("[{st},{n}]"))
        .collect();
    match ap.mem {
        Mem::Hbm => {
            let _ = write!(
                s,
                "hbm:{}+{}[[{},{}],{}]",
                ap.dtype.name(),
                ap.offset,
                ap.pstep,
                ap.parts,
                dims.join(",")
            );
        }
        m => {
            let _ = write!(
                s,
                "{}:{}[{}:{}]+{}[{}]",
                m.name(),
                ap.dtype.name(),
                ap.start,
                ap.start + ap.parts,
                ap.offset,
                dims.join(",")
            );
        }
    }
    if let Some(d) = ap.dynamic.as_deref() {
        let kind = match d.kind {
            DynKind::Scalar => 's',
            DynKind::Vector => 'v',
            DynKind::Indirect => 'i',
            DynKind::Columns => 'c',
        };
        let src = match &d.src {
            DynSrc::Reg(r) => format!("r{r}"),
            DynSrc::Tile(t) => format_ap(t),
        };
        let _ = write!(s, "@{kind}({src},{},{})", d.step, d.bound);
    }
    s
}

/// `s(SRC,STEP,BOUND)` / `v(SRC,STEP,BOUND)` after the `@` of a dynamic access pattern.
fn parse_dynamic(s: &str) -> Result<Dynamic> {
    let bad = || {
        perr("asm_bad_dynamic_offset", format!(
            "dynamic offset {s:?}: expected s(SRC,STEP,BOUND), v(SRC,STEP,BOUND) or i(SRC,STEP,BOUND)"
        ))
    };
    let kind = match s.get(..2) {
        Some("s(") => DynKind::Scalar,
        Some("v(") => DynKind::Vector,
        Some("i(") => DynKind::Indirect,
        _ => return Err(bad()),
    };
    let inner = s[2..].strip_suffix(')').ok_or_else(bad)?;
    let mut it = inner.rsplitn(3, ',');
    let bound: u32 = parse_int(it.next().ok_or_else(bad)?)?;
    let step: i64 = parse_int(it.next().ok_or_else(bad)?)?;
    let src_s = it.next().ok_or_else(bad)?;
    let src = if let Some(r) = src_s.strip_prefix('r') {
        DynSrc::Reg(parse_int(r)?)
    } else if src_s.contains('@') {
        return Err(perr(
            "asm_nested_dynamic_offset",
            "a dynamic-offset tile cannot itself be dynamic",
        ));
    } else {
        DynSrc::Tile(parse_ap(src_s)?)
    };
    Ok(Dynamic {
        kind,
        src,
        step,
        bound,
        cols: Vec::new(),
    })
}

/// Enums with a value spelled `none` (dge_mode, matmul_perf_mode): there `none` is the value and
/// an absent operand is written `None`.
fn enum_has_none(kind: Kind, enum_id: u8) -> bool {
    kind == Kind::Enum && ENUMS[enum_id as usize].values.contains(&"none")
}

fn format_arg(a: &Arg, kind: Kind, enum_id: u8) -> String {
    match a {
        Arg::Absent if enum_has_none(kind, enum_id) => "None".into(),
        Arg::Absent => "none".into(),
        Arg::Tensor(ap) => format_ap(ap),
        Arg::F32(v) => format_f32(*v),
        Arg::I32(v) => v.to_string(),
        Arg::Bool(b) => b.to_string(),
        Arg::Enum(v) => ENUMS[enum_id as usize]
            .values
            .get(*v as usize)
            .map(|s| s.to_string())
            .unwrap_or_else(|| format!("#{v}")),
        Arg::Ints(v) if kind == Kind::Pattern => {
            let pairs: Vec<String> = v
                .chunks(2)
                .map(|c| {
                    format!(
                        "[{}]",
                        c.iter()
                            .map(|x| x.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                })
                .collect();
            format!("[{}]", pairs.join(","))
        }
        Arg::Ints(v) => format!(
            "[{}]",
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
        Arg::Reg(r) => format!("r{r}"),
    }
}

/// One instruction as a line of text.
pub fn format_instr(ins: &Instr) -> String {
    let spec = ins.op.spec();
    let mut s = format!("{}.{}", spec.name, ins.engine.name());
    for (p, a) in spec.params.iter().zip(&ins.args) {
        if let Some(d) = Arg::from_default(&p.default, p.kind) {
            if d == *a {
                continue;
            }
        }
        let _ = write!(s, " {}={}", p.name, format_arg(a, p.kind, p.enum_id));
    }
    if !ins.waits.is_empty() {
        let w: Vec<String> = ins
            .waits
            .iter()
            .map(|w| format!("s{}>={}", w.sem, w.value))
            .collect();
        let _ = write!(s, " wait={}", w.join(","));
    }
    if !ins.signals.is_empty() {
        let w: Vec<String> = ins
            .signals
            .iter()
            .map(|w| format!("s{}+{}", w.sem, w.delta))
            .collect();
        let _ = write!(s, " signal={}", w.join(","));
    }
    if let Some(n) = &ins.name {
        let _ = write!(s, " name={n}");
    }
    s
}

pub fn format_program(p: &Program) -> String {
    let mut s = format!(".core {}\n", p.core);
    for ins in &p.instrs {
        s.push_str(&format_instr(ins));
        s.push('\n');
    }
    s
}

// ------------------------------------------------------------------------------------------ parsing

/// A malformed-text error with its rule id.
fn perr(rule: &'static str, msg: impl Into<String>) -> crate::error::EmuError {
    fail(Parse, rule, msg)
}

/// Split on whitespace outside brackets.
fn tokens(line: &str) -> Result<Vec<&str>> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = None;
    // `name=` values may hold unbalanced brackets (they never hold whitespace): no nesting there.
    let mut raw = false;
    for (i, c) in line.char_indices() {
        if start.is_none() && !c.is_whitespace() {
            raw = line[i..].starts_with("name=");
        }
        match c {
            '[' if !raw => depth += 1,
            ']' if !raw => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return Err(perr("asm_unbalanced_brackets", "unbalanced ']'"));
        }
        if c.is_whitespace() && depth == 0 {
            if let Some(s) = start.take() {
                out.push(&line[s..i]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if depth != 0 {
        return Err(perr("asm_unbalanced_brackets", "unbalanced '['"));
    }
    if let Some(s) = start {
        out.push(&line[s..]);
    }
    Ok(out)
}

fn parse_int<T: std::str::FromStr>(s: &str) -> Result<T> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x") {
        let v = u64::from_str_radix(h, 16)
            .map_err(|_| perr("asm_bad_number", format!("bad number {s:?}")))?;
        return v.to_string().parse::<T>().map_err(|_| {
            perr(
                "asm_number_out_of_range",
                format!("number {s:?} out of range"),
            )
        });
    }
    s.parse::<T>()
        .map_err(|_| perr("asm_bad_number", format!("bad number {s:?}")))
}

fn parse_f32(s: &str) -> Result<f32> {
    if let Some(h) = s.strip_prefix("nan:0x") {
        let bits = u32::from_str_radix(h, 16)
            .map_err(|_| perr("asm_bad_nan_bits", format!("bad NaN bits {s:?}")))?;
        let v = f32::from_bits(bits);
        if !v.is_nan() {
            return Err(perr(
                "asm_bad_nan_bits",
                format!("{s:?} is not a NaN bit pattern"),
            ));
        }
        return Ok(v);
    }
    match s {
        "nan" => Ok(f32::NAN),
        _ => s
            .parse::<f32>()
            .map_err(|_| perr("asm_bad_float", format!("bad float {s:?}"))),
    }
}

/// A numeric immediate: an integer literal (decimal, or 0x hex; -2^31 ..= 2^32-1, values above
/// i32::MAX kept as their 32-bit two's-complement word) is an exact `Arg::I32`; anything else
/// (`1.0`, `1e20`, `inf`, `nan:0x...`) is an `Arg::F32`. `format_f32` never prints a bare integer,
/// so both forms round-trip.
fn parse_imm(s: &str) -> Result<Arg> {
    let t = s.trim();
    let digits = t.strip_prefix('-').unwrap_or(t);
    let is_int = !digits.is_empty()
        && (digits.bytes().all(|c| c.is_ascii_digit())
            || (digits.len() > 2
                && digits.starts_with("0x")
                && digits[2..].bytes().all(|c| c.is_ascii_hexdigit())));
    if !is_int {
        return Ok(Arg::F32(parse_f32(t)?));
    }
    let mag: i64 = parse_int(digits)?;
    let v = if t.starts_with('-') { -mag } else { mag };
    imm_from_i64(v).ok_or_else(|| {
        perr(
            "asm_number_out_of_range",
            format!("integer immediate {s:?} does not fit 32 bits (-2^31 ..= 2^32-1)"),
        )
    })
}

/// An integer immediate as a 32-bit word: -2^31 ..= 2^32-1 (u32 values wrap to their i32 bits).
pub fn imm_from_i64(v: i64) -> Option<Arg> {
    if (i32::MIN as i64..=u32::MAX as i64).contains(&v) {
        Some(Arg::I32(v as u32 as i32))
    } else {
        None
    }
}

/// `[a,b,...]` -> ints; nested brackets are flattened (patterns).
fn parse_ints(s: &str) -> Result<Vec<i32>> {
    let t = s.trim();
    if !(t.starts_with('[') && t.ends_with(']')) {
        return Err(perr(
            "asm_bad_list",
            format!("expected a bracketed list, got {s:?}"),
        ));
    }
    let inner: String = t
        .chars()
        .map(|c| if c == '[' || c == ']' { ',' } else { c })
        .collect();
    inner
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(parse_int::<i32>)
        .collect()
}

fn parse_pairs(s: &str) -> Result<Vec<(i64, u32)>> {
    let t = s.trim();
    if !(t.starts_with("[[") && t.ends_with("]]")) {
        return Err(perr(
            "asm_bad_dims",
            format!("expected [[step,num],...], got {s:?}"),
        ));
    }
    let mut out = Vec::new();
    for part in t[2..t.len() - 2].split("],") {
        let part = part.trim().trim_start_matches('[').trim_end_matches(']');
        let xs: Vec<&str> = part.split(',').collect();
        if xs.len() != 2 {
            return Err(perr(
                "asm_bad_dims",
                format!("expected [step,num], got [{part}]"),
            ));
        }
        out.push((parse_int::<i64>(xs[0])?, parse_int::<u32>(xs[1])?));
    }
    Ok(out)
}

pub fn parse_ap(s: &str) -> Result<Ap> {
    if let Some((base, dyn_s)) = s.split_once('@') {
        let mut ap = parse_ap(base)?;
        ap.dynamic = Some(Box::new(parse_dynamic(dyn_s)?));
        return Ok(ap);
    }
    let (mem_s, rest) = s.split_once(':').ok_or_else(|| {
        perr(
            "asm_bad_access_pattern",
            format!("access pattern {s:?} needs MEM:DTYPE"),
        )
    })?;
    let mem = Mem::from_name(mem_s)
        .ok_or_else(|| perr("asm_unknown_memory", format!("unknown memory {mem_s:?}")))?;
    let dt_end = rest.find(['[', '+']).ok_or_else(|| {
        perr(
            "asm_bad_access_pattern",
            format!("access pattern {s:?} is incomplete"),
        )
    })?;
    let dtype = DType::from_name(&rest[..dt_end]).ok_or_else(|| {
        perr(
            "asm_unknown_dtype",
            format!("unknown dtype {:?}", &rest[..dt_end]),
        )
    })?;
    let mut rest = &rest[dt_end..];
    let (mut start, mut parts) = (0u32, 0u32);
    if mem != Mem::Hbm {
        let close = rest.find(']').ok_or_else(|| {
            perr(
                "asm_bad_access_pattern",
                format!("{s:?}: expected [start:end]"),
            )
        })?;
        let (a, b) = rest[1..close].split_once(':').ok_or_else(|| {
            perr(
                "asm_bad_access_pattern",
                format!("{s:?}: expected [start:end]"),
            )
        })?;
        start = parse_int(a)?;
        let end: u32 = parse_int(b)?;
        if end <= start {
            return Err(perr(
                "asm_empty_partition_range",
                format!("{s:?}: empty partition range"),
            ));
        }
        parts = end - start;
        rest = &rest[close + 1..];
    }
    let rest = rest
        .strip_prefix('+')
        .ok_or_else(|| perr("asm_bad_access_pattern", format!("{s:?}: expected +OFFSET")))?;
    let br = rest
        .find('[')
        .ok_or_else(|| perr("asm_bad_access_pattern", format!("{s:?}: expected dims")))?;
    let offset: u64 = parse_int(&rest[..br])?;
    let mut dims = parse_pairs(&rest[br..])?;
    let mut pstep = 0i64;
    if mem == Mem::Hbm {
        let (st, n) = dims.remove(0);
        pstep = st;
        parts = n;
    }
    Ok(Ap {
        mem,
        dtype,
        start,
        parts,
        pstep,
        offset,
        dims,
        dynamic: None,
    })
}

fn parse_arg(s: &str, kind: Kind, enum_id: u8) -> Result<Arg> {
    if s == "None" || (s == "none" && !enum_has_none(kind, enum_id)) {
        return Ok(Arg::Absent);
    }
    Ok(match kind {
        Kind::Tensor => Arg::Tensor(parse_ap(s)?),
        Kind::TensorOrF32 => {
            if s.contains(':') && !s.starts_with("nan:") {
                Arg::Tensor(parse_ap(s)?)
            } else {
                parse_imm(s)?
            }
        }
        Kind::F32 => parse_imm(s)?,
        Kind::I32 => Arg::I32(parse_int(s)?),
        Kind::I32OrReg => match s.strip_prefix('r') {
            Some(n) => Arg::Reg(parse_int(n)?),
            None => Arg::I32(parse_int(s)?),
        },
        Kind::Bool => match s {
            "true" | "True" => Arg::Bool(true),
            "false" | "False" => Arg::Bool(false),
            _ => {
                return Err(perr(
                    "asm_bad_bool",
                    format!("expected true/false, got {s:?}"),
                ))
            }
        },
        Kind::Enum => {
            let e = &ENUMS[enum_id as usize];
            let v = e.values.iter().position(|v| *v == s).ok_or_else(|| {
                perr(
                    "asm_bad_enum_value",
                    format!("{s:?} is not a {} value ({})", e.name, e.values.join(", ")),
                )
            })?;
            Arg::Enum(v as u8)
        }
        Kind::Ints | Kind::Pattern => Arg::Ints(parse_ints(s)?),
        Kind::Reg => Arg::Reg(parse_int(s.strip_prefix('r').ok_or_else(|| {
            perr("asm_bad_register", format!("expected rN, got {s:?}"))
        })?)?),
    })
}

/// `sN>=V,...` after `wait=`.
fn parse_waits(v: &str) -> Result<Vec<Wait>> {
    v.split(',')
        .map(|item| {
            let (a, b) = sync_item(item)?
                .split_once(">=")
                .ok_or_else(|| perr("asm_bad_sync", format!("expected sN>=V, got {item}")))?;
            Ok(Wait {
                sem: parse_int(a)?,
                value: parse_int(b)?,
            })
        })
        .collect()
}

/// `sN+D,...` after `signal=`.
fn parse_signals(v: &str) -> Result<Vec<Signal>> {
    v.split(',')
        .map(|item| {
            let (a, b) = sync_item(item)?
                .split_once('+')
                .ok_or_else(|| perr("asm_bad_sync", format!("expected sN+D, got {item}")))?;
            Ok(Signal {
                sem: parse_int(a)?,
                delta: parse_int(b)?,
            })
        })
        .collect()
}

/// A wait / signal item without its leading `s`.
fn sync_item(item: &str) -> Result<&str> {
    item.strip_prefix('s')
        .ok_or_else(|| perr("asm_bad_sync", format!("expected sN in {item:?}")))
}

/// Parse one instruction line (without validation).
pub fn parse_instr_unchecked(line: &str) -> Result<Instr> {
    let toks = tokens(line)?;
    let head = toks
        .first()
        .ok_or_else(|| perr("asm_empty_instruction", "empty instruction"))?;
    let (name, eng) = match head.split_once('.') {
        Some((n, e)) => (n, Some(e)),
        None => (*head, None),
    };
    let op = Opcode::from_name(name).ok_or_else(|| {
        perr(
            "asm_unknown_instruction",
            format!("unknown instruction {name:?}"),
        )
    })?;
    let spec = op.spec();
    let engine = match eng {
        Some(e) => {
            let unknown = || perr("asm_unknown_engine", format!("unknown engine {e:?}"));
            let idx = Engine::NAMES
                .iter()
                .position(|n| *n == e)
                .ok_or_else(unknown)?;
            Engine::from_u8(idx as u8).ok_or_else(unknown)?
        }
        None => Engine::Unknown,
    };
    let mut args: Vec<Option<Arg>> = vec![None; spec.params.len()];
    let (mut waits, mut signals, mut iname) = (Vec::new(), Vec::new(), None);
    let mut seen_extra = [false; 3];
    for t in &toks[1..] {
        let (k, v) = t.split_once('=').ok_or_else(|| {
            perr(
                "asm_expected_key_value",
                format!("expected key=value, got {t:?}"),
            )
        })?;
        match k {
            "wait" | "signal" => {
                let slot = if k == "wait" { 0 } else { 1 };
                if seen_extra[slot] {
                    return Err(perr("asm_duplicate_operand", format!("duplicate {k}=")));
                }
                seen_extra[slot] = true;
                if k == "wait" {
                    waits = parse_waits(v)?;
                } else {
                    signals = parse_signals(v)?;
                }
            }
            "name" => {
                if seen_extra[2] {
                    return Err(perr("asm_duplicate_operand", "duplicate name="));
                }
                seen_extra[2] = true;
                iname = Some(v.to_string());
            }
            _ => {
                let i = spec.param_index(k).ok_or_else(|| {
                    perr(
                        "asm_unknown_operand",
                        format!("{} has no operand {k:?}", spec.name),
                    )
                })?;
                if args[i].is_some() {
                    return Err(perr(
                        "asm_duplicate_operand",
                        format!("duplicate operand {k}"),
                    ));
                }
                let p = &spec.params[i];
                args[i] = Some(parse_arg(v, p.kind, p.enum_id).map_err(|e| e.operand(p.name))?);
            }
        }
    }
    let mut out = Vec::with_capacity(args.len());
    for (p, a) in spec.params.iter().zip(args) {
        match a {
            Some(a) => out.push(a),
            None => out.push(Arg::from_default(&p.default, p.kind).ok_or_else(|| {
                perr(
                    "asm_missing_operand",
                    format!("missing required operand {}", p.name),
                )
                .operand(p.name)
            })?),
        }
    }
    // No engine written (or `unknown`): the ISA's default-engine rule decides.
    let engine = if engine == Engine::Unknown {
        super::default_engine::default_engine(op, &out)
    } else {
        engine
    };
    Ok(Instr {
        op,
        engine,
        args: out,
        waits,
        signals,
        name: iname,
    })
}

/// Parse and validate one instruction line.
pub fn parse_instr(line: &str) -> Result<Instr> {
    let ins = parse_instr_unchecked(line)?;
    validate(&ins)?;
    Ok(ins)
}

/// Parse a whole program (`.core N` directive, `#` comments, blank lines), with the generic
/// checks only; `engines::parse_program` adds every instruction's own rules.
pub fn parse_program(text: &str) -> Result<Program> {
    parse_program_with(text, |_| Ok(()))
}

/// Parse a whole program, running `check` on each instruction after the generic checks.
pub fn parse_program_with(text: &str, check: impl Fn(&Instr) -> Result<()>) -> Result<Program> {
    let mut prog = Program::default();
    for (ln, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |e: crate::error::EmuError| {
            e.at(prog.instrs.len(), format!("line {}: {}", ln + 1, line))
        };
        if let Some(rest) = line.strip_prefix(".core") {
            let c: u8 = parse_int(rest).map_err(at)?;
            if c as usize >= NUM_CORES {
                return Err(at(fail(
                    Value,
                    "core_out_of_range",
                    format!("core {c} out of range (0..{NUM_CORES})"),
                )));
            }
            prog.core = c;
            continue;
        }
        let ins = parse_instr(line).map_err(at)?;
        check(&ins).map_err(at)?;
        prog.instrs.push(ins);
    }
    Ok(prog)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i32_or_reg_operand_takes_an_immediate_or_a_register() {
        use crate::isa::instr::IntOrReg;
        for (t, want) in [
            ("offset=r3", IntOrReg::Reg(3)),
            ("offset=-5", IntOrReg::Imm(-5)),
        ] {
            let line = format!("iota.gpsimd dst=sbuf:int32[0:4]+0[[1,8]] pattern=[[1,8]] {t}");
            let ins = parse_instr(&line).unwrap();
            assert_eq!(crate::isa::ops::Iota::view(&ins).unwrap().offset, want);
            assert_eq!(parse_instr(&format_instr(&ins)).unwrap(), ins);
            let prog = crate::isa::instr::Program {
                core: 0,
                instrs: vec![ins.clone()],
            };
            let enc = crate::isa::encode::encode_program(&prog);
            assert_eq!(crate::isa::encode::decode_program(&enc).unwrap(), prog);
        }
        assert!(
            parse_instr("iota.gpsimd dst=sbuf:int32[0:4]+0[[1,8]] pattern=[[1,8]] offset=r64")
                .is_err()
        );
        assert!(parse_instr(
            "iota.gpsimd dst=sbuf:int32[0:4]+0[[1,8]] pattern=[[1,8]] channel_multiplier=r1"
        )
        .is_err());
    }

    #[test]
    fn integer_and_float_immediates() {
        assert_eq!(parse_imm("123456789").unwrap(), Arg::I32(123456789));
        assert_eq!(parse_imm("-2147483648").unwrap(), Arg::I32(i32::MIN));
        assert_eq!(parse_imm("0xffffffff").unwrap(), Arg::I32(-1));
        assert_eq!(parse_imm("4294967295").unwrap(), Arg::I32(-1));
        assert!(parse_imm("4294967296").is_err());
        assert!(parse_imm("-2147483649").is_err());
        assert_eq!(parse_imm("2.0").unwrap(), Arg::F32(2.0));
        assert_eq!(parse_imm("1e3").unwrap(), Arg::F32(1000.0));
        assert_eq!(parse_imm("-inf").unwrap(), Arg::F32(f32::NEG_INFINITY));
        // The printer never emits a bare integer for an fp32 value, so the forms stay apart.
        for v in [0.0f32, -0.0, 2.0, 1e20, 16777216.0, -3.0] {
            assert_eq!(parse_imm(&format_f32(v)).unwrap(), Arg::F32(v));
        }
    }

    #[test]
    fn errors_carry_rule_ids() {
        let rule = |l: &str| parse_instr(l).unwrap_err().rule;
        let iota = |eng: &str, dst: &str, extra: &str| {
            format!("iota.{eng} dst={dst} pattern=[[1,8]] {extra}")
        };
        let dst = "sbuf:int32[0:4]+0[[1,8]]";
        assert_eq!(rule("nosuch.vector"), "asm_unknown_instruction");
        assert_eq!(rule(&iota("bogus", dst, "")), "asm_unknown_engine");
        assert_eq!(
            rule(&iota("gpsimd", dst, "offset=r64")),
            "register_out_of_range"
        );
        assert_eq!(
            rule(&iota("gpsimd", dst, "offset=[1")),
            "asm_unbalanced_brackets"
        );
        assert_eq!(rule(&iota("gpsimd", dst, "wait=s1")), "asm_bad_sync");
        assert_eq!(
            rule(&iota("gpsimd", dst, "wait=s999>=1")),
            "semaphore_out_of_range"
        );
        assert_eq!(rule(&iota("tensor", dst, "")), "engine_not_allowed");
        let dst = "sbuf:int32[1:5]+0[[1,8]]";
        assert_eq!(rule(&iota("gpsimd", dst, "")), "start_partition");
        let dst = "sbuf:int32[0:4]+262140[[1,8]]";
        assert_eq!(
            rule(&iota("gpsimd", dst, "")),
            "partition_bytes_out_of_range"
        );
        let e = parse_program(".core 9\n").unwrap_err();
        assert_eq!(e.rule, "core_out_of_range");
        let decode = |b: &[u8]| crate::isa::encode::decode_program(b).unwrap_err().rule;
        assert_eq!(decode(b"T3"), "decode_truncated");
        assert_eq!(decode(b"XXXX\x01\x00"), "decode_bad_magic");
    }
}
