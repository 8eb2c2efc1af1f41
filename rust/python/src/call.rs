//! `_native.call_operands`: the operand tuple of a traced `nki.isa` call in its usual form (every
//! tensor an on-chip tile whose `AccessPattern` the front end already holds, every other value a
//! plain Python scalar or name after its converter), built in one native pass; any other value
//! hands the call back to the Python loop of `nki/_emit.py` (`emit_call`), which gives the same
//! operands and errors.

use crate::pattern::AccessPattern;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

/// A value `append` takes as it is: exactly a `str`, `float`, `bool`, `int` or None (subclasses,
/// e.g. enum members, go through the Python loop).
fn plain(v: &Bound<'_, PyAny>) -> bool {
    v.is_none()
        || v.is_exact_instance_of::<PyString>()
        || v.is_exact_instance_of::<PyFloat>()
        || v.is_exact_instance_of::<PyBool>()
        || v.is_exact_instance_of::<PyInt>()
}

/// `plan`: per value `(operand position or None, is a tensor operand, converter or None)`;
/// `base`: the operands' defaults; `values`: the call's values (positional, then keyword);
/// `nki_tensor`: the `NkiTensor` class; `core`, `uses`: the program's core and HBM uses; `dsts`:
/// the positions of operands the instruction may write in HBM. A value that is neither a tile
/// with its pattern nor plain after its converter goes to `slow(value, is_dst, core, uses)`
/// (`nki/_emit.py`), which returns its operand or None. The operands as a tuple, or None at the
/// first value the Python loop must take (nothing converted after it).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn call_operands<'py>(
    py: Python<'py>,
    plan: &Bound<'py, PyTuple>,
    base: &Bound<'py, PyList>,
    values: &Bound<'py, PyAny>,
    nki_tensor: &Bound<'py, PyType>,
    core: &Bound<'py, PyAny>,
    uses: &Bound<'py, PyAny>,
    dsts: &Bound<'py, PyTuple>,
    slow: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let mut out: Vec<Bound<'py, PyAny>> = base.iter().collect();
    let mut entries = plan.iter();
    for v in values.try_iter()? {
        let v = v?;
        let Some(entry) = entries.next() else { break };
        let entry = entry.cast_into::<PyTuple>()?;
        let slot = entry.get_item(0)?;
        if slot.is_none() {
            continue; // an NKI-only keyword, dropped
        }
        let i: usize = slot.extract()?;
        if i >= out.len() {
            return Ok(None);
        }
        let mut v = v;
        if entry.get_item(1)?.is_truthy()? && v.get_type().is(nki_tensor) {
            let ap = v.getattr(intern!(py, "_ap"))?;
            if ap.is_instance_of::<AccessPattern>()
                && v.getattr(intern!(py, "_t"))?
                    .getattr(intern!(py, "core"))?
                    .eq(core)?
            {
                out[i] = ap;
                continue;
            }
        } else {
            let c = entry.get_item(2)?;
            if !c.is_none() {
                v = c.call1((v,))?;
            }
            if plain(&v) {
                out[i] = v;
                continue;
            }
        }
        let is_dst = dsts.contains(i)?;
        let r = slow.call1((v, is_dst, core, uses))?;
        if r.is_none() {
            return Ok(None);
        }
        out[i] = r;
    }
    Ok(Some(PyTuple::new(py, out)?))
}
