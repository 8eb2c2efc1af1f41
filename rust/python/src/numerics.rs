//! Raw dtype conversions for tests, dtype helpers and benchmarks (numpy arrays of bits).

use crate::args::unknown_dtype;
use crate::errors::{bad_array, to_py};
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use trn3emu_core as core;
use trn3emu_core::error::fail;
use trn3emu_core::isa::DType;
use trn3emu_core::numerics::config::{Fp8Overflow, NumericsConfig, Rounder};
use trn3emu_core::ErrorKind;

/// A dtype by name, or a DtypeError naming it.
fn dtype_named(py: Python<'_>, name: &str) -> PyResult<DType> {
    DType::from_name(name).ok_or_else(|| to_py(py, unknown_dtype(name).operand("dtype")))
}

/// `out` if given (contiguous, writeable, `n` long: conversions then allocate nothing, which
/// is what keeps large buffers from being page-fault bound), else a new zeroed array.
fn out_array<'py, T: numpy::Element>(
    py: Python<'py>,
    out: Option<Bound<'py, PyArray1<T>>>,
    n: usize,
) -> PyResult<Bound<'py, PyArray1<T>>> {
    match out {
        Some(o) if o.len() != n => Err(to_py(
            py,
            fail(
                ErrorKind::Shape,
                "out_size_mismatch",
                format!("out has {} elements, the input {n}", o.len()),
            )
            .operand("out"),
        )),
        Some(o) => Ok(o),
        None => Ok(PyArray1::zeros(py, n, false)),
    }
}

/// Fill a result array in place: it must be writeable and contiguous (an `out=` argument).
fn write_out<T: numpy::Element>(
    py: Python<'_>,
    arr: &Bound<'_, PyArray1<T>>,
    f: impl FnOnce(&mut [T]),
) -> PyResult<()> {
    let mut w = arr.try_readwrite().map_err(|_| {
        bad_array(
            py,
            "out",
            "out_not_writeable",
            "out must be a writeable array",
        )
    })?;
    let o = w
        .as_slice_mut()
        .map_err(|_| bad_array(py, "out", "array_not_contiguous", "out must be contiguous"))?;
    f(o);
    Ok(())
}

/// Raw conversions exposed for tests and dtype helpers: fp32 bits -> dtype bits (RNE).
#[pyfunction]
#[pyo3(signature = (dtype, bits, saturate = false, out = None))]
pub fn convert_from_f32<'py>(
    py: Python<'py>,
    dtype: &str,
    bits: PyReadonlyArray1<'py, u32>,
    saturate: bool,
    out: Option<Bound<'py, PyArray1<u32>>>,
) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let dt = dtype_named(py, dtype)?;
    let s = bits.as_slice().map_err(|_| {
        bad_array(
            py,
            "bits",
            "array_not_contiguous",
            "a contiguous uint32 array is needed",
        )
    })?;
    let arr = out_array(py, out, s.len())?;
    write_out(py, &arr, |o| {
        if saturate {
            let cfg = NumericsConfig {
                fp8_overflow: Fp8Overflow::Saturate,
                ..Default::default()
            };
            let r = Rounder::new(cfg, 0, 0, 0, false);
            for (o, b) in o.iter_mut().zip(s) {
                *o = r.from_f32(dt, f32::from_bits(*b), 0);
            }
        } else {
            py.detach(|| core::numerics::convert_from_f32_slice(dt, s, o));
        }
    })?;
    Ok(arr)
}

/// Raw conversions for tests and benchmarks: dtype bits (zero-extended to u32) -> fp32 (exact).
#[pyfunction]
#[pyo3(signature = (dtype, codes, out = None))]
pub fn convert_to_f32<'py>(
    py: Python<'py>,
    dtype: &str,
    codes: PyReadonlyArray1<'py, u32>,
    out: Option<Bound<'py, PyArray1<f32>>>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let dt = dtype_named(py, dtype)?;
    let s = codes.as_slice().map_err(|_| {
        bad_array(
            py,
            "codes",
            "array_not_contiguous",
            "a contiguous uint32 array is needed",
        )
    })?;
    let arr = out_array(py, out, s.len())?;
    write_out(py, &arr, |o| {
        py.detach(|| core::numerics::convert_to_f32_slice(dt, s, o))
    })?;
    Ok(arr)
}
