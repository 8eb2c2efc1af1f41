//! `_native.view_geometry`: the geometry of a plain view (`trn3emu_core::memory::view`) for the
//! NKI front end's `tile[a:b, i]` (`nki/_kernel.py` `_plain_view`).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PySlice, PyTuple};
use trn3emu_core::memory::view::{plain_view, Geometry, Index};

/// A key entry as `Index`: an exact `int`, or a slice without a step whose bounds are None or
/// exact ints; None for anything else (the front end's general path takes it).
fn index(k: &Bound<'_, PyAny>) -> Option<Index> {
    let py = k.py();
    if k.is_exact_instance_of::<PyInt>() {
        return k.extract().ok().map(Index::At);
    }
    let s = k.cast::<PySlice>().ok()?;
    if !s.getattr(intern!(py, "step")).ok()?.is_none() {
        return None;
    }
    let bound = |name| -> Option<Option<i64>> {
        let b = s.getattr(name).ok()?;
        if b.is_none() {
            Some(None)
        } else if b.is_exact_instance_of::<PyInt>() {
            b.extract().ok().map(Some)
        } else {
            None
        }
    };
    Some(Index::Range(
        bound(intern!(py, "start"))?,
        bound(intern!(py, "stop"))?,
    ))
}

/// The entries of a tuple of ints (None: another entry).
fn ints(t: &Bound<'_, PyTuple>) -> Option<Vec<i64>> {
    t.iter_borrowed().map(|v| v.extract().ok()).collect()
}

/// `(shape, strides, offset, start)` of `t[key]` for a static tensor of that geometry (tuples
/// of ints, `es` bytes per element, `onchip`: SBUF/PSUM), shape and strides as tuples, or None
/// when the key is not a plain one within the dims (`memory::view::plain_view`).
#[pyfunction]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub fn view_geometry<'py>(
    py: Python<'py>,
    shape: &Bound<'py, PyTuple>,
    strides: &Bound<'py, PyTuple>,
    offset: i64,
    start: i64,
    onchip: bool,
    es: i64,
    key: &Bound<'py, PyTuple>,
) -> PyResult<Option<(Bound<'py, PyTuple>, Bound<'py, PyTuple>, i64, i64)>> {
    let mut idx = Vec::with_capacity(key.len());
    for k in key.iter() {
        let Some(i) = index(&k) else { return Ok(None) };
        idx.push(i);
    }
    let (Some(shape), Some(strides)) = (ints(shape), ints(strides)) else {
        return Ok(None);
    };
    let Some((s, st, offset, start)): Option<Geometry> =
        plain_view(&shape, &strides, offset, start, onchip, es, &idx)
    else {
        return Ok(None);
    };
    Ok(Some((
        PyTuple::new(py, s)?,
        PyTuple::new(py, st)?,
        offset,
        start,
    )))
}
