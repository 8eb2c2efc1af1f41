//! `_native.CallPlan`: the operand tuple of a traced `nki.isa` call in its usual form (every
//! tensor an on-chip tile whose `AccessPattern` the front end already holds, every other value a
//! plain Python scalar or name after its converter), built in one native pass from a plan read
//! once per call form; any other value goes to the front end's `slow` function, and what that
//! refuses hands the call back to the Python loop of `nki/_emit.py` (`emit_call`), which gives
//! the same operands and errors.

use crate::pattern::AccessPattern;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

/// A value `append` takes as it is: exactly a `str`, `float`, `bool`, `int` or None (subclasses,
/// e.g. enum members, go to `slow`).
fn plain(v: &Bound<'_, PyAny>) -> bool {
    v.is_none()
        || v.is_exact_instance_of::<PyString>()
        || v.is_exact_instance_of::<PyFloat>()
        || v.is_exact_instance_of::<PyBool>()
        || v.is_exact_instance_of::<PyInt>()
}

/// One given value: its operand position (None: an NKI-only keyword, dropped), whether it is an
/// ISA operand, its converter.
struct Entry {
    slot: Option<usize>,
    operand: bool,
    conv: Option<Py<PyAny>>,
}

/// The plan of one call form of one instruction (`nki.isa`'s `plan_for`).
#[pyclass(module = "trn3emu._native", frozen)]
pub struct CallPlan {
    entries: Vec<Entry>,
    base: Py<PyTuple>,
    dsts: Vec<usize>,
    nki_tensor: Py<PyType>,
    slow: Py<PyAny>,
}

#[pymethods]
impl CallPlan {
    /// `plan`: per value `(operand position or None, is an ISA operand, converter or None)`;
    /// `base`: the operands' defaults; `dsts`: the positions of operands the instruction may
    /// write in HBM; `nki_tensor`: the `NkiTensor` class; `slow(value, is_dst, core, uses)`:
    /// the operand of a value this pass does not take itself, or None.
    #[new]
    fn new(
        plan: &Bound<'_, PyTuple>,
        base: &Bound<'_, PyList>,
        dsts: Vec<usize>,
        nki_tensor: Bound<'_, PyType>,
        slow: Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let mut entries = Vec::with_capacity(plan.len());
        for e in plan.iter() {
            let (slot, operand, conv): (Option<usize>, bool, Bound<'_, PyAny>) = e.extract()?;
            if slot.is_some_and(|i| i >= base.len()) {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "operand position past the operands",
                ));
            }
            let conv = (!conv.is_none()).then(|| conv.unbind());
            entries.push(Entry {
                slot,
                operand,
                conv,
            });
        }
        Ok(CallPlan {
            entries,
            base: base.to_tuple().unbind(),
            dsts,
            nki_tensor: nki_tensor.unbind(),
            slow: slow.unbind(),
        })
    }

    /// The operands of a call with `values` (positional, then keyword) in a program for `core`
    /// whose HBM uses are `uses`, or None at the first value the Python loop must take.
    fn operands<'py>(
        &self,
        py: Python<'py>,
        values: &Bound<'py, PyAny>,
        core: &Bound<'py, PyAny>,
        uses: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let mut out: Vec<Bound<'py, PyAny>> = self.base.bind(py).iter().collect();
        let nki = self.nki_tensor.bind(py);
        let mut entries = self.entries.iter();
        for v in values.try_iter()? {
            let mut v = v?;
            let Some(entry) = entries.next() else { break };
            let Some(i) = entry.slot else { continue };
            if entry.operand && v.get_type().is(nki) {
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
                if let Some(c) = &entry.conv {
                    v = c.bind(py).call1((v,))?;
                }
                if plain(&v) {
                    out[i] = v;
                    continue;
                }
            }
            let is_dst = self.dsts.contains(&i);
            let r = self.slow.bind(py).call1((v, is_dst, core, uses))?;
            if r.is_none() {
                return Ok(None);
            }
            out[i] = r;
        }
        Ok(Some(PyTuple::new(py, out)?))
    }
}
