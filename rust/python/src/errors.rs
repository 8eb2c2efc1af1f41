//! Error mapping: a core `EmuError` becomes the `trn3emu.errors` class its kind names, and a
//! panic inside the core becomes an `InternalError` instead of crossing into Python.

use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use trn3emu_core::error::fail;
use trn3emu_core::{EmuError, ErrorKind, Result};

/// Raise the `trn3emu.errors` class named by the error kind, with its fields as attributes.
pub fn to_py(py: Python<'_>, e: EmuError) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let m = py.import("trn3emu.errors")?;
        let cls = m.getattr(e.kind.name())?;
        let (idx, text) = match &e.instruction {
            Some((i, t)) => (Some(*i), Some(t.clone())),
            None => (None, None),
        };
        let obj = cls.call1((e.to_string(), idx, text, e.operand.clone(), e.rule))?;
        Ok(PyErr::from_value(obj))
    };
    build().unwrap_or_else(|err| err)
}

/// `to_py` for `map_err`: `r.map_err(py_err(py))`.
pub fn py_err(py: Python<'_>) -> impl Fn(EmuError) -> PyErr + '_ {
    move |e| to_py(py, e)
}

/// Run `f`, turning a panic into an InternalError instead of letting it cross into Python.
pub fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(fail(
                ErrorKind::Internal,
                "internal_panic",
                format!("internal emulator error (please report): {msg}"),
            ))
        }
    }
}

/// An array argument the conversion or HBM helpers cannot use, as a project OperandError.
pub fn bad_array(py: Python<'_>, operand: &str, rule: &'static str, msg: &str) -> PyErr {
    to_py(
        py,
        fail(ErrorKind::Value, rule, msg.to_string()).operand(operand),
    )
}

/// The `trn3emu.errors` class `class` (one without a core `ErrorKind`, e.g. `ArgumentTypeError`)
/// with a rule id and operand.
pub fn named(py: Python<'_>, class: &str, rule: &'static str, operand: &str, msg: String) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let cls = py.import("trn3emu.errors")?.getattr(class)?;
        let none = py.None();
        Ok(PyErr::from_value(
            cls.call1((msg, &none, &none, operand, rule))?,
        ))
    };
    build().unwrap_or_else(|err| err)
}
