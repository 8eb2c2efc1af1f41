//! Argument conversion: the assembler's Python operands (access-pattern tuples, numbers,
//! names, integer lists, sync pairs) into core `Arg`s. Types only; the rules live in the core.

use crate::pattern::AccessPattern;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyList, PyString, PyTuple};
use trn3emu_core as core;
use trn3emu_core::error::fail;
use trn3emu_core::isa::spec::Kind;
use trn3emu_core::isa::{Arg, DType, Signal, Wait};
use trn3emu_core::memory::{Ap, DynKind, DynSrc, Dynamic, Mem, PARTITIONS};
use trn3emu_core::{EmuError, ErrorKind, Result};

/// An integer argument of the binding as `T`. PyO3's own extraction raises a bare TypeError or
/// OverflowError; here a non-integer (a float, a string, a bool) raises `ArgumentTypeError`
/// (`int_expected`) and a value outside `T`'s range `OperandError` (`int_out_of_range`), both
/// naming the argument.
pub fn int_arg<T: TryFrom<i128>>(obj: &Bound<'_, PyAny>, operand: &str) -> PyResult<T> {
    let py = obj.py();
    let range = |shown: String| {
        let ty = std::any::type_name::<T>();
        crate::errors::to_py(
            py,
            fail(
                ErrorKind::Value,
                "int_out_of_range",
                format!("{operand} = {shown} is outside the range this argument takes ({ty})"),
            )
            .operand(operand),
        )
    };
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(int_type(obj, operand));
    }
    match obj.extract::<i128>() {
        Ok(v) => T::try_from(v).map_err(|_| range(v.to_string())),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) => {
            Err(range(obj.str().map(|s| s.to_string()).unwrap_or_default()))
        }
        Err(_) => Err(int_type(obj, operand)),
    }
}

fn int_type(obj: &Bound<'_, PyAny>, operand: &str) -> PyErr {
    let ty = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    crate::errors::named(
        obj.py(),
        "ArgumentTypeError",
        "int_expected",
        operand,
        format!("{operand} must be an integer, got {ty}"),
    )
}

/// A one-dimensional uint8 array argument (the raw-byte HBM methods). PyO3's own extraction
/// raises a bare TypeError for another dtype, rank or type; here `ArgumentTypeError`
/// (`u8_array_expected`) names the method and the argument.
pub fn u8_array<'py>(
    obj: &Bound<'py, PyAny>,
    method: &str,
    operand: &str,
) -> PyResult<Bound<'py, numpy::PyArray1<u8>>> {
    obj.cast::<numpy::PyArray1<u8>>().cloned().map_err(|_| {
        let shown = match obj.getattr("dtype").and_then(|d| d.str()) {
            Ok(dt) => format!(
                "a {}-dimensional {} array",
                obj.getattr("ndim")
                    .and_then(|n| n.extract::<usize>())
                    .unwrap_or(0),
                dt
            ),
            Err(_) => obj
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default(),
        };
        crate::errors::named(
            obj.py(),
            "ArgumentTypeError",
            "u8_array_expected",
            operand,
            format!("{method}: {operand} must be a one-dimensional uint8 numpy array, got {shown}"),
        )
    })
}

/// An optional string argument (`None` or a `str`); anything else raises `ArgumentTypeError`
/// (`str_expected`), a string that is not valid UTF-8 (a lone surrogate) `OperandError`
/// (`str_not_utf8`).
pub fn opt_str_arg(obj: Option<&Bound<'_, PyAny>>, operand: &str) -> PyResult<Option<String>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => str_arg(o, operand, ErrorKind::Value).map(Some),
    }
}

/// A string argument; a non-string raises `ArgumentTypeError` (`str_expected`), a string that is
/// not valid UTF-8 (a lone surrogate) the error of `kind` (`str_not_utf8`).
pub fn str_arg(o: &Bound<'_, PyAny>, operand: &str, kind: ErrorKind) -> PyResult<String> {
    let py = o.py();
    let s = o.cast::<pyo3::types::PyString>().map_err(|_| {
        let ty = o
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
        crate::errors::named(
            py,
            "ArgumentTypeError",
            "str_expected",
            operand,
            format!("{operand} must be a string, got {ty}"),
        )
    })?;
    s.to_str().map(|t| t.to_string()).map_err(|_| {
        crate::errors::to_py(
            py,
            fail(
                kind,
                "str_not_utf8",
                format!("{operand} holds a lone surrogate (not valid UTF-8 text)"),
            )
            .operand(operand),
        )
    })
}

fn not_tensor() -> EmuError {
    fail(
        ErrorKind::Value,
        "operand_not_tensor",
        "expected a tensor (SBUF/PSUM tile or HBM tensor view)",
    )
}

/// An access pattern tuple `(mem, dtype, start, parts, row_step, offset, dims[, dynamic])`;
/// `dynamic` = `(kind 's'|'v'|'i', register int | index-tile tuple, step, bound)`.
/// An `AccessPattern` (`pattern.rs`) stands for the tuple it was read from.
pub fn parse_ap(obj: &Bound<'_, PyAny>) -> Result<Ap> {
    if let Ok(p) = obj.cast::<AccessPattern>() {
        return Ok(p.get().ap.clone());
    }
    let tup = obj.cast::<PyTuple>().map_err(|_| not_tensor())?;
    if tup.len() != 8 {
        return parse_static_ap(obj);
    }
    let d = tup.get_item(7).map_err(|_| bad_dynamic())?;
    let dynamic = Some(Box::new(parse_dynamic(&d)?));
    let mut ap = parse_static_ap(tup.get_slice(0, 7).as_any())?;
    ap.dynamic = dynamic;
    Ok(ap)
}

fn bad_dynamic() -> EmuError {
    fail(
        ErrorKind::Value,
        "dynamic_offset_malformed",
        "dynamic offset must be (kind 's'|'v'|'i', register | index tile, step, bound)",
    )
}

fn parse_dynamic(d: &Bound<'_, PyAny>) -> Result<Dynamic> {
    let (kind, src, step, bound): (String, Bound<'_, PyAny>, i64, u32) =
        d.extract().map_err(|_| bad_dynamic())?;
    let kind = match kind.as_str() {
        "s" => DynKind::Scalar,
        "v" => DynKind::Vector,
        "i" => DynKind::Indirect,
        _ => return Err(bad_dynamic()),
    };
    let src = if let Ok(r) = src.extract::<u8>() {
        DynSrc::Reg(r)
    } else {
        DynSrc::Tile(parse_static_ap(&src)?)
    };
    Ok(Dynamic {
        kind,
        src,
        step,
        bound,
        cols: Vec::new(),
    })
}

fn parse_static_ap(obj: &Bound<'_, PyAny>) -> Result<Ap> {
    if let Some(ap) = fast_static_ap(obj) {
        return ap;
    }
    type T = (String, String, i64, i64, i64, i64, Vec<(i64, i64)>);
    let (mem, dtype, start, parts, pstep, offset, dims): T =
        obj.extract().map_err(|_| not_tensor())?;
    build_ap(&mem, &dtype, [start, parts, pstep, offset], dims)
}

/// `parse_static_ap` of the usual form (a 7-tuple of two `str`, four ints and a tuple or list
/// of `(step, num)` tuples) without the generic extraction's allocations: the names are
/// borrowed, the dims read in place. None: another form, for the generic extraction (which
/// accepts the same values and says what is wrong with the others).
fn fast_static_ap(obj: &Bound<'_, PyAny>) -> Option<Result<Ap>> {
    let t = obj.cast::<PyTuple>().ok()?;
    if t.len() != 7 {
        return None;
    }
    let item = |i: usize| t.get_borrowed_item(i).ok();
    let (mem, dtype) = (item(0)?, item(1)?);
    let (mem, dtype) = (mem.cast::<PyString>().ok()?, dtype.cast::<PyString>().ok()?);
    let (mem, dtype) = (mem.to_str().ok()?, dtype.to_str().ok()?);
    let mut ints = [0i64; 4];
    for (k, v) in ints.iter_mut().enumerate() {
        *v = item(k + 2)?.extract::<i64>().ok()?;
    }
    let dims = item(6)?;
    let mut d = Vec::new();
    let mut pair = |p: Borrowed<'_, '_, PyAny>| -> Option<()> {
        let p = p.cast::<PyTuple>().ok()?;
        if p.len() != 2 {
            return None;
        }
        let s = p.get_borrowed_item(0).ok()?.extract::<i64>().ok()?;
        let n = p.get_borrowed_item(1).ok()?.extract::<i64>().ok()?;
        d.push((s, n));
        Some(())
    };
    if let Ok(l) = dims.cast::<PyTuple>() {
        for p in l.iter_borrowed() {
            pair(p)?;
        }
    } else if let Ok(l) = dims.cast::<PyList>() {
        for i in 0..l.len() {
            pair(l.get_item(i).ok()?.as_borrowed())?;
        }
    } else {
        return None;
    }
    Some(build_ap(mem, dtype, ints, d))
}

/// An access pattern from its parts, each checked (`parse_static_ap`).
fn build_ap(mem: &str, dtype: &str, ints: [i64; 4], dims: Vec<(i64, i64)>) -> Result<Ap> {
    let [start, parts, pstep, offset] = ints;
    let mem = Mem::from_name(mem).ok_or_else(|| {
        fail(
            ErrorKind::MemorySpace,
            "unknown_memory",
            format!("unknown memory {mem:?}"),
        )
    })?;
    let dtype = DType::from_name(dtype).ok_or_else(|| unknown_dtype(dtype))?;
    if !(0..=PARTITIONS as i64 * 2).contains(&start) {
        return Err(fail(
            ErrorKind::Address,
            "ap_start_out_of_range",
            format!("start partition {start} out of range"),
        ));
    }
    if parts <= 0 || parts > u32::MAX as i64 {
        return Err(fail(
            ErrorKind::Shape,
            "ap_parts_out_of_range",
            format!("partition/row count {parts} out of range"),
        ));
    }
    if offset < 0 {
        return Err(fail(
            ErrorKind::Address,
            "ap_negative_offset",
            format!("negative offset {offset}"),
        ));
    }
    let mut d = Vec::with_capacity(dims.len());
    for (s, n) in dims {
        if n <= 0 || n > u32::MAX as i64 {
            return Err(fail(
                ErrorKind::Shape,
                "ap_dim_size_out_of_range",
                format!("dimension size {n} out of range"),
            ));
        }
        d.push((s, n as u32));
    }
    Ok(Ap {
        mem,
        dtype,
        start: start as u32,
        parts: parts as u32,
        pstep,
        offset: offset as u64,
        dims: d,
        dynamic: None,
    })
}

/// A DtypeError for a dtype name the core does not know.
pub fn unknown_dtype(name: &str) -> EmuError {
    fail(
        ErrorKind::Dtype,
        "unknown_dtype",
        format!("unknown dtype {name:?}"),
    )
}

/// One operand of ISA kind `kind` (`None` -> `Arg::Absent`; the core fills defaults).
pub fn parse_arg(obj: &Bound<'_, PyAny>, kind: Kind, enum_id: u8) -> Result<Arg> {
    if obj.is_none() {
        return Ok(Arg::Absent);
    }
    let bad = |what: &str| {
        fail(
            ErrorKind::Value,
            "operand_type_mismatch",
            format!(
                "expected {what}, got {}",
                obj.repr().map(|r| r.to_string()).unwrap_or_default()
            ),
        )
    };
    Ok(match kind {
        Kind::Tensor => Arg::Tensor(parse_ap(obj)?),
        Kind::TensorOrF32
            if obj.cast::<PyTuple>().is_ok() || obj.cast::<AccessPattern>().is_ok() =>
        {
            Arg::Tensor(parse_ap(obj)?)
        }
        Kind::TensorOrF32 | Kind::F32 => parse_number(obj, &bad)?,
        Kind::I32 => Arg::I32(obj.extract::<i32>().map_err(|_| bad("a 32-bit integer"))?),
        // The assembler passes a register as "rN" (a bare int is an immediate).
        Kind::I32OrReg => match obj.cast::<PyString>() {
            Ok(s) => Arg::Reg(
                s.to_str()
                    .ok()
                    .and_then(|s| s.strip_prefix('r'))
                    .and_then(|n| n.parse::<u8>().ok())
                    .ok_or_else(|| bad("a 32-bit integer or a register"))?,
            ),
            Err(_) => Arg::I32(
                obj.extract::<i32>()
                    .map_err(|_| bad("a 32-bit integer or a register"))?,
            ),
        },
        Kind::Bool => Arg::Bool(obj.extract::<bool>().map_err(|_| bad("a bool"))?),
        Kind::Enum => parse_enum(obj, enum_id, &bad)?,
        // A bare int is a one-element list (NKI's `axis=1`).
        Kind::Ints if !is_list_or_tuple(obj) && obj.extract::<i32>().is_ok() => {
            Arg::Ints(vec![obj.extract::<i32>().map_err(|_| bad("an integer"))?])
        }
        Kind::Ints | Kind::Pattern => Arg::Ints(parse_ints(obj, &bad)?),
        Kind::Reg => Arg::Reg(obj.extract::<u8>().map_err(|_| bad("a register number"))?),
    })
}

/// A number: Python ints (and numpy integers) stay exact 32-bit integer immediates.
fn parse_number(obj: &Bound<'_, PyAny>, bad: &dyn Fn(&str) -> EmuError) -> Result<Arg> {
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Arg::F32(f.value() as f32)); // (a failed int extraction costs a Python error)
    }
    if let Ok(i) = obj.extract::<i64>() {
        return core::isa::text::imm_from_i64(i).ok_or_else(|| {
            fail(
                ErrorKind::Value,
                "immediate_out_of_range",
                format!(
                    "integer immediate {i} does not fit 32 bits (-2^31 ..= 2^32-1); pass a float"
                ),
            )
        });
    }
    let f = obj
        .extract::<f64>()
        .map_err(|_| bad("a number or a (P, 1) tile"))?;
    Ok(Arg::F32(f as f32))
}

fn parse_enum(obj: &Bound<'_, PyAny>, enum_id: u8, bad: &dyn Fn(&str) -> EmuError) -> Result<Arg> {
    let e = &core::isa::tables::ENUMS[enum_id as usize];
    let s: String = obj
        .extract()
        .map_err(|_| bad(&format!("a {} name", e.name)))?;
    let v = e.values.iter().position(|v| *v == s).ok_or_else(|| {
        fail(
            ErrorKind::Value,
            "enum_value_unknown",
            format!(
                "{s:?} is not a {} value (one of {})",
                e.name,
                e.values.join(", ")
            ),
        )
    })?;
    Ok(Arg::Enum(v as u8))
}

/// Integers, or nested `[step, num]` pairs flattened (patterns).
fn parse_ints(obj: &Bound<'_, PyAny>, bad: &dyn Fn(&str) -> EmuError) -> Result<Vec<i32>> {
    let mut v = Vec::new();
    for item in obj.try_iter().map_err(|_| bad("a list of integers"))? {
        let item = item.map_err(|_| bad("a list of integers"))?;
        if !is_list_or_tuple(&item) {
            if let Ok(x) = item.extract::<i32>() {
                v.push(x);
                continue;
            }
        }
        for sub in item
            .try_iter()
            .map_err(|_| bad("integers or [step, num] pairs"))?
        {
            v.push(
                sub.and_then(|s| s.extract::<i32>())
                    .map_err(|_| bad("integers"))?,
            );
        }
    }
    Ok(v)
}

/// A list or tuple: never an integer, so no int extraction (and its Python error) is tried.
fn is_list_or_tuple(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>()
}

/// `wait=[(sem, value)]` and `signal=[(sem, delta)]` lists.
pub fn parse_sync(
    waits: &Bound<'_, PyAny>,
    signals: &Bound<'_, PyAny>,
) -> Result<(Vec<Wait>, Vec<Signal>)> {
    let malformed = |what: &str| {
        fail(
            ErrorKind::Semaphore,
            "sync_list_malformed",
            format!("{what} must be a list of (semaphore, value) pairs"),
        )
    };
    let empty = |o: &Bound<'_, PyAny>| o.cast::<PyList>().is_ok_and(|l| l.is_empty());
    if empty(waits) && empty(signals) {
        return Ok((Vec::new(), Vec::new())); // (the usual call: no extraction)
    }
    let w: Vec<(u16, u32)> = waits.extract().map_err(|_| malformed("wait"))?;
    let s: Vec<(u16, u32)> = signals.extract().map_err(|_| {
        fail(
            ErrorKind::Semaphore,
            "sync_list_malformed",
            "signal must be a list of (semaphore, delta) pairs",
        )
    })?;
    Ok((
        w.into_iter()
            .map(|(sem, value)| Wait { sem, value })
            .collect(),
        s.into_iter()
            .map(|(sem, delta)| Signal { sem, delta })
            .collect(),
    ))
}
