//! `_native.CallPlan`: the operand tuple of a traced `nki.isa` call in its usual form (every
//! tensor an on-chip tile whose `AccessPattern` the front end already holds, every other value a
//! plain Python scalar or name after its converter), built in one native pass from a plan read
//! once per call form; any other value goes to the front end's `slow` function, and what that
//! refuses hands the call back to the Python loop of `nki/_emit.py` (`emit_call`), which gives
//! the same operands and errors. `CallPlan.append` builds the operands and appends the
//! instruction to the program in the same call (the operands converted once, no tuple between).

use crate::args;
use crate::errors::to_py;
use crate::pattern::AccessPattern;
use crate::program::Program;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PySet, PyString, PyTuple, PyType};
use std::sync::Mutex;
use trn3emu_core::asm;
use trn3emu_core::isa::{Engine, Instr, Opcode};

/// A value `append` takes as it is: exactly a `str`, `float`, `bool`, `int`, `list`, `tuple` or
/// None, which `slow` too gives back as they are (subclasses, e.g. enum members, go to `slow`).
fn plain(v: &Bound<'_, PyAny>) -> bool {
    v.is_none()
        || v.is_exact_instance_of::<PyString>()
        || v.is_exact_instance_of::<PyFloat>()
        || v.is_exact_instance_of::<PyBool>()
        || v.is_exact_instance_of::<PyInt>()
        || v.is_exact_instance_of::<PyList>()
        || v.is_exact_instance_of::<PyTuple>()
}

/// One given value: its operand position (None: an NKI-only keyword, dropped), whether it is an
/// ISA operand, its converter.
struct Entry {
    slot: Option<usize>,
    operand: bool,
    conv: Option<Py<PyAny>>,
    /// the converter gives an exact `float` back as it is (its `floats_as_is` attribute): not
    /// called for one (a call back into Python per `scale=` / `operand0=` number)
    floats_as_is: bool,
    /// the converter gives every `plain` value back as it is (its `plain_as_is` attribute): not
    /// called for one (`keepdims=True`, `reduce_cmd=` names)
    plain_as_is: bool,
    /// the converter's answer depends only on the value's identity (its `by_identity`
    /// attribute: op tokens such as `nl.add` -> their names): the values seen (held, so their
    /// ids are not reused) and the `str` answers, looked up before calling it
    memo: Option<Memo>,
}

/// A `by_identity` converter's kept answers: (value, answer) pairs.
type Memo = Mutex<Vec<(Py<PyAny>, Py<PyAny>)>>;

/// Values a `by_identity` converter's answers are kept for, per operand (a kernel names a few
/// op tokens; past this many, the converter is called).
const MEMO_MAX: usize = 32;

/// The plan of one call form of one instruction (`nki.isa`'s `plan_for`).
#[pyclass(module = "trn3emu._native", frozen)]
pub struct CallPlan {
    opcode: Opcode,
    name: Py<PyString>,
    entries: Vec<Entry>,
    base: Py<PyTuple>,
    dsts: Vec<usize>,
    nki_tensor: Py<PyType>,
    /// a subclass of `nki_tensor` whose `_ap`, when an `AccessPattern`, is its view's (the
    /// front end's pending results once issued); None: only `nki_tensor` itself
    issued: Option<Py<PyType>>,
    slow: Py<PyAny>,
}

#[pymethods]
impl CallPlan {
    /// `opcode`: the instruction; `plan`: per value `(operand position or None, is an ISA operand, converter or None)`;
    /// `base`: the operands' defaults; `dsts`: the positions of operands the instruction may
    /// write in HBM; `nki_tensor`: the `NkiTensor` class; `slow(value, is_dst, core, uses)`:
    /// the operand of a value this pass does not take itself, or None; `issued`: a subclass of
    /// `nki_tensor` taken the same way (its instances set `_ap`: None until known).
    #[new]
    #[pyo3(signature = (opcode, plan, base, dsts, nki_tensor, slow, issued = None))]
    fn new(
        opcode: &Bound<'_, PyString>,
        plan: &Bound<'_, PyTuple>,
        base: &Bound<'_, PyList>,
        dsts: Vec<usize>,
        nki_tensor: Bound<'_, PyType>,
        slow: Bound<'_, PyAny>,
        issued: Option<Bound<'_, PyType>>,
    ) -> PyResult<Self> {
        let py = opcode.py();
        let name = opcode.clone().unbind();
        let opcode = asm::opcode_named(opcode.to_str()?).map_err(|e| to_py(py, e))?;
        let mut entries = Vec::with_capacity(plan.len());
        for e in plan.iter() {
            let (slot, operand, conv): (Option<usize>, bool, Bound<'_, PyAny>) = e.extract()?;
            if slot.is_some_and(|i| i >= base.len()) {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "operand position past the operands",
                ));
            }
            let flag = |name: &Bound<'_, PyString>| -> PyResult<bool> {
                Ok(!conv.is_none()
                    && conv
                        .getattr_opt(name)?
                        .is_some_and(|v| v.is_truthy().unwrap_or(false)))
            };
            let floats_as_is = flag(intern!(py, "floats_as_is"))?;
            let plain_as_is = flag(intern!(py, "plain_as_is"))?;
            let memo = flag(intern!(py, "by_identity"))?.then(|| Mutex::new(Vec::new()));
            let conv = (!conv.is_none()).then(|| conv.unbind());
            entries.push(Entry {
                slot,
                operand,
                conv,
                floats_as_is,
                plain_as_is,
                memo,
            });
        }
        Ok(CallPlan {
            opcode,
            name,
            entries,
            base: base.to_tuple().unbind(),
            dsts,
            nki_tensor: nki_tensor.unbind(),
            issued: issued.map(Bound::unbind),
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
        match self.collect(py, values, core, uses)? {
            Some(out) => Ok(Some(PyTuple::new(py, out)?)),
            None => Ok(None),
        }
    }

    /// `operands`, then (as the front end's two-step path: `nki/_emit.py` `emit_call`)
    /// `opcodes.add(opcode)`, `bar.tick()` unless `bar` is None, and `program.append(opcode,
    /// None, operands, [], [], label)`, in one call: the instruction's index, or None (nothing
    /// done) when `operands` gives None. An `EmuError` of the append gets the note
    /// `"  in kernel at {loc} ({opcode})"` (errors of the converters and `slow` propagate as
    /// they are).
    #[allow(clippy::too_many_arguments)]
    fn append<'py>(
        &self,
        py: Python<'py>,
        program: &Bound<'py, Program>,
        values: &Bound<'py, PyAny>,
        core: &Bound<'py, PyAny>,
        uses: &Bound<'py, PyAny>,
        label: &Bound<'py, PyAny>,
        loc: &Bound<'py, PyAny>,
        opcodes: &Bound<'py, PySet>,
        bar: &Bound<'py, PyAny>,
    ) -> PyResult<Option<usize>> {
        let Some(vals) = self.collect(py, values, core, uses)? else {
            return Ok(None);
        };
        opcodes.add(self.name.bind(py))?;
        if !bar.is_none() {
            bar.call_method0(intern!(py, "tick"))?;
        }
        self.append_values(py, program, &vals, label)
            .map(Some)
            .map_err(|e| self.noted(py, e, loc))
    }
}

/// `conv(v)` for a converter whose answer depends only on `v`'s identity: a value seen before
/// (not an `nki_tensor`, answered with a `str`) gets the kept answer.
fn converted_by_identity<'py>(
    conv: &Bound<'py, PyAny>,
    memo: &Memo,
    v: Bound<'py, PyAny>,
    nki: &Bound<'py, PyType>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = v.py();
    if let Ok(kept) = memo.lock() {
        if let Some((_, out)) = kept.iter().find(|(seen, _)| seen.bind(py).is(&v)) {
            return Ok(out.bind(py).clone());
        }
    }
    let out = conv.call1((&v,))?;
    if out.is_exact_instance_of::<PyString>() && !v.is_instance(nki)? {
        if let Ok(mut kept) = memo.lock() {
            if kept.len() < MEMO_MAX {
                kept.push((v.unbind(), out.clone().unbind()));
            }
        }
    }
    Ok(out)
}

impl CallPlan {
    /// The operand values of a call (`operands` without the tuple), or None.
    fn collect<'py>(
        &self,
        py: Python<'py>,
        values: &Bound<'py, PyAny>,
        core: &Bound<'py, PyAny>,
        uses: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
        let mut out: Vec<Bound<'py, PyAny>> = self.base.bind(py).iter().collect();
        let nki = self.nki_tensor.bind(py);
        let issued = self.issued.as_ref().map(|t| t.bind(py));
        let mut entries = self.entries.iter();
        for v in values.try_iter()? {
            let mut v = v?;
            let Some(entry) = entries.next() else { break };
            let Some(i) = entry.slot else { continue };
            let exact = v.get_type().is(nki);
            if entry.operand && (exact || issued.is_some_and(|t| v.get_type().is(t))) {
                let ap = v.getattr(intern!(py, "_ap"))?;
                if ap.is_instance_of::<AccessPattern>() && {
                    // (the same int object, the usual case, before Python's comparison)
                    let c = v.getattr(intern!(py, "_t"))?.getattr(intern!(py, "core"))?;
                    c.is(core) || c.eq(core)?
                } {
                    out[i] = ap;
                    continue;
                }
            }
            if !(entry.operand && exact) {
                if let Some(c) = &entry.conv {
                    let as_is = (entry.floats_as_is && v.is_exact_instance_of::<PyFloat>())
                        || (entry.plain_as_is && plain(&v));
                    if !as_is {
                        v = match &entry.memo {
                            Some(memo) => converted_by_identity(c.bind(py), memo, v, nki)?,
                            None => c.bind(py).call1((v,))?,
                        };
                    }
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
        Ok(Some(out))
    }

    /// `Program.append(opcode, None, vals, [], [], label)`: the same conversion, checks and
    /// errors.
    fn append_values(
        &self,
        py: Python<'_>,
        program: &Bound<'_, Program>,
        vals: &[Bound<'_, PyAny>],
        label: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let mut prog = program.try_borrow_mut()?;
        let name = args::opt_str_arg(Some(label), "name")?;
        let op = self.opcode;
        let at = |e: trn3emu_core::EmuError| {
            let index = prog.asm.len();
            to_py(
                py,
                e.at(index, format!("{} (being assembled)", op.spec().name)),
            )
        };
        asm::check_operand_count(op, vals.len()).map_err(at)?;
        let mut out = Vec::with_capacity(vals.len());
        for (p, a) in op.spec().params.iter().zip(vals) {
            out.push(args::parse_arg(a, p.kind, p.enum_id).map_err(|e| at(e.operand(p.name)))?);
        }
        let ins = Instr {
            op,
            engine: Engine::Unknown,
            args: out,
            waits: Vec::new(),
            signals: Vec::new(),
            name,
        };
        prog.append_converted(py, ins, true)
    }

    /// `e` with the kernel-line note when it is an `EmuError`.
    fn noted(&self, py: Python<'_>, e: PyErr, loc: &Bound<'_, PyAny>) -> PyErr {
        let emu = py
            .import(intern!(py, "trn3emu.errors"))
            .and_then(|m| m.getattr(intern!(py, "EmuError")));
        if let Ok(cls) = emu {
            if e.is_instance(py, &cls) {
                let note = format!("  in kernel at {loc} ({})", self.opcode.spec().name);
                if let Err(err) = e.value(py).call_method1(intern!(py, "add_note"), (note,)) {
                    return err;
                }
            }
        }
        e
    }
}
