//! `_native.Program`: the assembler's storage. Converts each instruction's Python operands and
//! hands it to the core `Assembler` (defaults, engine choice, validation, accumulate=None).

use crate::args;
use crate::errors::{guarded, py_err, to_py};
use crate::signals::SignalCheck;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple, PyWeakrefReference};
use trn3emu_core as core;
use trn3emu_core::asm::{self, Assembler};
use trn3emu_core::isa::{Engine, Instr};

/// An ISA program for one core (the assembler's storage).
#[pyclass(module = "trn3emu._native")]
#[derive(Clone)]
pub struct Program {
    pub(crate) asm: Assembler,
}

impl Program {
    fn wrap(p: core::Program) -> Self {
        Program {
            asm: Assembler::from_program(p),
        }
    }

    pub(crate) fn program(&self) -> &core::Program {
        self.asm.program()
    }

    /// The instruction `append` describes, its operands converted (nothing validated yet).
    fn convert(
        opcode: &str,
        engine: Option<&str>,
        args: &Bound<'_, PyTuple>,
        waits: &Bound<'_, PyAny>,
        signals: &Bound<'_, PyAny>,
        name: Option<String>,
    ) -> core::Result<Instr> {
        let op = asm::opcode_named(opcode)?;
        let engine = match engine {
            None => Engine::Unknown,
            Some(e) => asm::engine_named(e)?,
        };
        asm::check_operand_count(op, args.len())?;
        let mut out = Vec::with_capacity(args.len());
        for (p, a) in op.spec().params.iter().zip(args.iter()) {
            out.push(args::parse_arg(&a, p.kind, p.enum_id).map_err(|e| e.operand(p.name))?);
        }
        let (waits, signals) = args::parse_sync(waits, signals)?;
        Ok(Instr {
            op,
            engine,
            args: out,
            waits,
            signals,
            name,
        })
    }
}

/// `Program.onchip_operands` / `append_moved`: argument index `NESTED + k` names the index tile
/// of operand `k`'s run-time offset.
const NESTED: usize = 1000;

/// A non-negative instruction (or operand) index from Python; a negative one is an
/// `OperandError` (`instruction_out_of_range`) naming `operand`, not a bare `OverflowError`.
fn instr_index(py: Python<'_>, i: i64, operand: &'static str) -> PyResult<usize> {
    usize::try_from(i).map_err(|_| {
        to_py(
            py,
            core::error::fail(
                core::ErrorKind::Value,
                "instruction_out_of_range",
                format!("index {i} is negative: instructions and operands count from 0"),
            )
            .operand(operand),
        )
    })
}

/// `trn3emu.errors.AccumulateWarning` for instruction `index` (stack level: the kernel's call
/// of `Program.nc_matmul`). An error (warnings as errors) propagates.
fn warn_accumulate(py: Python<'_>, index: usize) -> PyResult<()> {
    let cls = py.import("trn3emu.errors")?.getattr("AccumulateWarning")?;
    let msg = std::ffi::CString::new(format!(
        "nc_matmul #{index}: accumulate=None on a PSUM dst that earlier matmuls wrote only in part; \
         the emulator adds on those elements and overwrites the rest, but hardware has one \
         accumulate flag per instruction (pass accumulate=True/False or split the matmul)"
    ))
    .unwrap_or_default();
    PyErr::warn(py, &cls, &msg, 3)
}

impl Program {
    /// Append `ins` (converted, not validated yet): the core assembler's append, then the
    /// accumulate warning (warnings as errors: the instruction is taken back). Its index.
    pub(crate) fn append_converted(
        &mut self,
        py: Python<'_>,
        ins: Instr,
        resolve_accumulate: bool,
    ) -> PyResult<usize> {
        let done = self
            .asm
            .append(ins, resolve_accumulate)
            .map_err(py_err(py))?;
        if done.accumulate_mixed {
            if let Err(e) = warn_accumulate(py, done.index) {
                // Warnings as errors: the instruction is not appended.
                self.asm.pop();
                return Err(e);
            }
        }
        Ok(done.index)
    }
}

#[pymethods]
impl Program {
    #[new]
    #[pyo3(signature = (core = None), text_signature = "(core=0)")]
    fn new(py: Python<'_>, core: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let core: i64 = match core {
            Some(c) => args::int_arg(c, "core")?,
            None => 0,
        };
        Ok(Program {
            asm: Assembler::new(core).map_err(py_err(py))?,
        })
    }

    #[getter]
    fn core(&self) -> u8 {
        self.asm.program().core
    }

    fn __len__(&self) -> usize {
        self.asm.len()
    }

    /// Append one instruction: `args` aligned with the ISA parameters (None = omitted).
    /// Returns its index.
    #[pyo3(signature = (opcode, engine, args, waits, signals, name = None, resolve_accumulate = true))]
    #[allow(clippy::too_many_arguments)]
    fn append(
        &mut self,
        py: Python<'_>,
        opcode: &str,
        engine: Option<&Bound<'_, PyAny>>,
        args: &Bound<'_, PyTuple>,
        waits: &Bound<'_, PyAny>,
        signals: &Bound<'_, PyAny>,
        name: Option<&Bound<'_, PyAny>>,
        resolve_accumulate: bool,
    ) -> PyResult<usize> {
        let index = self.asm.len();
        let name = args::opt_str_arg(name, "name")?;
        let engine = args::opt_str_arg(engine, "engine")?;
        let engine = engine.as_deref();
        let ins = Self::convert(opcode, engine, args, waits, signals, name)
            .map_err(|e| to_py(py, e.at(index, format!("{opcode} (being assembled)"))))?;
        self.append_converted(py, ins, resolve_accumulate)
    }

    /// Choose the engines of instructions appended without one by the balancing rule
    /// (docs/nki.md "Engine choice") with the costs of generation `timing` ("trn1" / "trn2" /
    /// "trn3"), or by the ISA default (`None`, the initial state).
    #[pyo3(signature = (timing))]
    fn set_engine_balance(&mut self, py: Python<'_>, timing: Option<&str>) -> PyResult<()> {
        let g = match timing {
            Some(t) => Some(core::timing::generation(t).map_err(py_err(py))?),
            None => None,
        };
        self.asm.set_engine_balance(g);
        Ok(())
    }

    /// Modelled busy time (ps) of (vector, scalar, gpsimd) the engine balance counted so far,
    /// or None when balancing is off.
    fn engine_balance_ps(&self) -> Option<(u64, u64, u64)> {
        self.asm.engine_balance_ps().map(|[v, s, g]| (v, s, g))
    }

    /// Indices of the instructions appended without an engine, ascending.
    fn unpinned(&self) -> Vec<u32> {
        self.asm.unpinned().to_vec()
    }

    /// The engines the balancing rule (docs/nki.md "Engine choice", generation `timing`'s
    /// costs) gives the instructions appended without one, replayed over the program as it
    /// stands: [(index, engine name)] in program order (the pass `engine_choice` over the kernel
    /// IR, `nki/engine_choice.py`). Nothing changes; `set_engine` applies a choice.
    fn engine_choices(&self, py: Python<'_>, timing: &str) -> PyResult<Vec<(usize, &'static str)>> {
        let g = core::timing::generation(timing).map_err(py_err(py))?;
        Ok(self
            .asm
            .engine_choices(g)
            .into_iter()
            .map(|(i, e)| (i, e.name()))
            .collect())
    }

    /// Give instruction `index` the engine `engine` (validated as when appended).
    fn set_engine(&mut self, py: Python<'_>, index: i64, engine: &str) -> PyResult<()> {
        let index = instr_index(py, index, "index")?;
        let e = asm::engine_named(engine).map_err(py_err(py))?;
        self.asm.set_engine(index, e).map_err(py_err(py))
    }

    /// Mark PSUM bytes as freshly allocated: the next matmul with accumulate=None overwrites them.
    fn psum_fresh(
        &mut self,
        start: &Bound<'_, PyAny>,
        parts: &Bound<'_, PyAny>,
        offset: &Bound<'_, PyAny>,
        nbytes: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (start, parts) = (
            args::int_arg(start, "start")?,
            args::int_arg(parts, "parts")?,
        );
        let (offset, nbytes) = (
            args::int_arg(offset, "offset")?,
            args::int_arg(nbytes, "nbytes")?,
        );
        self.asm.psum_fresh(start, parts, offset, nbytes);
        Ok(())
    }

    /// Add the semaphores the data dependencies need (automatic synchronisation).
    /// Releases the GIL; Ctrl-C stops it (`KeyboardInterrupt`) within ~25 ms.
    fn synced(&self, py: Python<'_>) -> PyResult<Program> {
        let mut check = SignalCheck::new();
        let me = &self.asm;
        let r = py.detach(|| guarded(|| me.synced_checked(&mut || check.keep_going(|_| Ok(())))));
        let asm = check.finish(py, r)?;
        Ok(Program { asm })
    }

    /// The repeats of the program (`machine::repeats`; `rename`: also those whose result goes
    /// elsewhere, their result's reads moved to the earlier result; `last`: nothing runs after
    /// this program, so a result left in place at its end is never read): ([(index of the repeat,
    /// index of the earlier instance whose result is still in place)], [(instruction, operand,
    /// byte shift)], the repeats missed because the earlier result was overwritten while its
    /// inputs were not (`rename` only)), ascending. Nothing changes; `move_operands` then `remove` apply them (the
    /// NKI pass `value_reuse`, `nki/value_reuse.py`).
    #[pyo3(signature = (rename = false, last = false))]
    #[allow(clippy::type_complexity)]
    fn exact_repeats(
        &self,
        py: Python<'_>,
        rename: bool,
        last: bool,
    ) -> (Vec<(usize, usize)>, Vec<(usize, usize, i64)>, usize) {
        let p = self.program();
        let r = py.detach(|| core::machine::repeats::find(p, rename, last));
        (r.drops, r.moves, r.missed)
    }

    /// The dead instructions of the program (`machine::dead`: their on-chip result is overwritten
    /// before any read, or unread at the end when `last`, nothing running after this program):
    /// [(index, why)], ascending, why "unused" (nothing touches it again), "overwritten" (later
    /// writes replace it whole first) or "both". Nothing changes; `remove` applies them (the NKI
    /// pass `dead_code`, `nki/dead_code.py`).
    #[pyo3(signature = (last = true))]
    fn dead_instructions(&self, py: Python<'_>, last: bool) -> Vec<(usize, &'static str)> {
        let p = self.program();
        py.detach(|| core::machine::dead::find(p, last))
            .into_iter()
            .map(|(i, w)| (i, w.name()))
            .collect()
    }

    /// The hash of compute instruction `i` with each operand `(argument index, byte shift)` of
    /// `shifts` moved (its on-chip operands in their tiles' own frames), or None when it may not
    /// be dropped as a repeat into another tile (`machine::repeats::relative_key`; the NKI pass
    /// `value_reuse` on the kernel IR, `nki/value_reuse.py`; `loads`: a load from HBM may be one).
    #[pyo3(signature = (i, shifts, loads = false))]
    fn relative_key(&self, i: usize, shifts: Vec<(usize, i64)>, loads: bool) -> Option<u64> {
        let ins = self.program().instrs.get(i)?;
        core::machine::repeats::relative_key(ins, &shifts, loads)
    }

    /// Whether instructions `i` and `j` moved by `si` / `sj` have the same encoding.
    fn same_relative(
        &self,
        i: usize,
        si: Vec<(usize, i64)>,
        j: usize,
        sj: Vec<(usize, i64)>,
    ) -> bool {
        let p = self.program();
        match (p.instrs.get(i), p.instrs.get(j)) {
            (Some(a), Some(b)) => core::machine::repeats::same_relative(a, &si, b, &sj),
            _ => false,
        }
    }

    /// Drop the PSUM -> SBUF copies among `copies` (instruction indices) whose readers can read
    /// the PSUM source instead, the readers moved there (`machine::forward`; the NKI pass
    /// `psum_forward`, `nki/psum_forward.py`; `last`: nothing runs after this program). With
    /// `any`, every same-dtype on-chip `tensor_copy` among them (`copies=None`: of the program)
    /// whose readers can read its source (the pass `copy_forward`, `nki/copy_forward.py`).
    /// Returns the copies dropped (indices before the removal) and the reads moved.
    #[pyo3(signature = (copies, last = true, any = false))]
    fn forward_copies(
        &mut self,
        py: Python<'_>,
        copies: Option<Vec<i64>>,
        last: bool,
        any: bool,
    ) -> PyResult<(Vec<usize>, usize)> {
        let copies = match copies {
            Some(c) => c
                .into_iter()
                .map(|i| instr_index(py, i, "copies"))
                .collect::<PyResult<Vec<_>>>()?,
            None => (0..self.program().instrs.len()).collect(),
        };
        let which = if any {
            core::machine::forward::Copies::Any
        } else {
            core::machine::forward::Copies::Psum
        };
        self.asm
            .forward_copies(&copies, last, which)
            .map_err(py_err(py))
    }

    /// Move operand `arg` of instruction `index` by `delta` bytes, per `(index, arg, delta)`.
    fn move_operands(&mut self, py: Python<'_>, moves: Vec<(i64, i64, i64)>) -> PyResult<()> {
        let moves = moves
            .into_iter()
            .map(|(i, a, d)| {
                Ok((
                    instr_index(py, i, "moves")?,
                    instr_index(py, a, "moves")?,
                    d,
                ))
            })
            .collect::<PyResult<Vec<_>>>()?;
        self.asm.move_operands(&moves).map_err(py_err(py))
    }

    /// Remove the instructions at `indices` (ascending); the others keep their order.
    fn remove(&mut self, py: Python<'_>, indices: Vec<i64>) -> PyResult<()> {
        let indices = indices
            .into_iter()
            .map(|i| instr_index(py, i, "indices"))
            .collect::<PyResult<Vec<_>>>()?;
        self.asm.remove(&indices).map_err(py_err(py))
    }

    /// Keep each `nc_matmul`'s `accumulate` operand as given before its resolution, from now on
    /// (a recording trace whose program `append_moved` lowers again: docs/nki.md "Lowering").
    fn keep_unresolved(&mut self) {
        self.asm.keep_unresolved();
    }

    /// The SBUF / PSUM tensor operands of instruction `i` (empty past the end): per operand
    /// (its argument index, "sbuf" / "psum", first partition, partitions, first byte and end
    /// byte touched within a partition (a run-time offset at 0), whether the instruction writes
    /// it, whether its offset is read at run time). The on-chip index tile of an operand's
    /// run-time offset (`DynSrc::Tile`, also of an HBM operand) is listed too, with argument
    /// index `NESTED + k`.
    #[allow(clippy::type_complexity)]
    fn onchip_operands(
        &self,
        i: usize,
    ) -> Vec<(usize, &'static str, u32, u32, i64, i64, bool, bool)> {
        let Some(ins) = self.program().instrs.get(i) else {
            return Vec::new();
        };
        fn mem_name(m: core::memory::Mem) -> Option<&'static str> {
            match m {
                core::memory::Mem::Sbuf => Some("sbuf"),
                core::memory::Mem::Psum => Some("psum"),
                core::memory::Mem::Hbm => None,
            }
        }
        fn bytes(ap: &core::memory::Ap) -> (i64, i64) {
            let (lo, hi) = ap.row_byte_range();
            let base = ap.offset as i128;
            ((base + lo) as i64, (base + hi) as i64)
        }
        let mut out = Vec::new();
        for (k, (a, p)) in ins.args.iter().zip(ins.op.spec().params.iter()).enumerate() {
            let core::isa::Arg::Tensor(ap) = a else {
                continue;
            };
            if let Some(mem) = mem_name(ap.mem) {
                let (lo, hi) = bytes(ap);
                let writes = matches!(
                    p.access,
                    core::isa::spec::Access::Write | core::isa::spec::Access::ReadWrite
                );
                out.push((
                    k,
                    mem,
                    ap.start,
                    ap.parts,
                    lo,
                    hi,
                    writes,
                    ap.dynamic.is_some(),
                ));
            }
            if let Some(d) = &ap.dynamic {
                if let core::memory::DynSrc::Tile(t) = &d.src {
                    if let Some(mem) = mem_name(t.mem) {
                        let (lo, hi) = bytes(t);
                        out.push((NESTED + k, mem, t.start, t.parts, lo, hi, false, false));
                    }
                }
            }
        }
        out
    }

    /// Append instruction `i` of `src` again, each operand `(argument index, byte delta)` of
    /// `moves` moved by its delta within its partitions, with the engine and `accumulate`
    /// operand it was appended with (an engine left to the rule, `accumulate=None` kept by
    /// `keep_unresolved`): decided again here, as when it was first appended. Its index.
    fn append_moved(
        &mut self,
        py: Python<'_>,
        src: PyRef<'_, Program>,
        i: usize,
        moves: Vec<(usize, i64)>,
    ) -> PyResult<usize> {
        let Some(ins) = src.program().instrs.get(i) else {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "no instruction {i}"
            )));
        };
        let mut ins = ins.clone();
        if src.asm.is_unpinned(i) {
            ins.engine = Engine::Unknown;
        }
        if let Some(a) = src.asm.unresolved_accumulate(i) {
            ins.args[core::isa::ops::NcMatmul::ACCUMULATE] = a.clone();
        }
        for (k, delta) in moves {
            let ap = match ins.args.get_mut(k % NESTED) {
                Some(core::isa::Arg::Tensor(ap)) if k < NESTED => Some(ap),
                Some(core::isa::Arg::Tensor(ap)) => match ap.dynamic.as_deref_mut() {
                    Some(core::memory::Dynamic {
                        src: core::memory::DynSrc::Tile(t),
                        ..
                    }) => Some(t),
                    _ => None,
                },
                _ => None,
            };
            if let Some(ap) = ap {
                ap.offset = ap.offset.checked_add_signed(delta).ok_or_else(|| {
                    pyo3::exceptions::PyValueError::new_err(format!(
                        "operand {k} moved below byte 0"
                    ))
                })?;
            }
        }
        self.append_converted(py, ins, true)
    }

    /// Label (`name=`: the kernel source line) of every instruction, in program order.
    fn instruction_names(&self) -> Vec<Option<String>> {
        self.program()
            .instrs
            .iter()
            .map(|i| i.name.clone())
            .collect()
    }

    /// Engine of instruction `i` (None past the end).
    fn instruction_engine(&self, i: usize) -> Option<&'static str> {
        self.program().instrs.get(i).map(|ins| ins.engine.name())
    }

    /// Text of instruction `i` (None past the end).
    fn instruction_text(&self, i: usize) -> Option<String> {
        self.program()
            .instrs
            .get(i)
            .map(core::isa::text::format_instr)
    }

    fn to_text(&self) -> String {
        core::isa::text::format_program(self.program())
    }

    #[staticmethod]
    fn from_text(py: Python<'_>, text: &Bound<'_, PyAny>) -> PyResult<Program> {
        let text = args::str_arg(text, "text", core::ErrorKind::Parse)?;
        guarded(|| core::engines::parse_program(&text))
            .map(Program::wrap)
            .map_err(py_err(py))
    }

    fn encode<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &core::isa::encode::encode_program(self.program()))
    }

    #[staticmethod]
    fn decode(py: Python<'_>, data: &[u8]) -> PyResult<Program> {
        guarded(|| core::engines::decode_program(data))
            .map(Program::wrap)
            .map_err(py_err(py))
    }

    fn __eq__(&self, other: &Program) -> bool {
        self.program() == other.program()
    }

    fn __repr__(&self) -> String {
        format!(
            "<Program core={} instructions={}>",
            self.program().core,
            self.asm.len()
        )
    }
}

/// `_native.RangeAllocator`: the on-chip allocator's range bookkeeping (first fit with
/// rotation, `trn3emu_core::memory::ranges`); `trn3emu.allocator.Allocator` wraps it.
#[pyclass(module = "trn3emu._native")]
pub struct RangeAllocator {
    inner: core::memory::ranges::RangeAllocator,
    owned: Owned,
}

/// The Python `Allocator`'s owner bookkeeping that `RangeAllocator.alloc_owned` updates:
/// `live` (key -> (lo, hi, label)), `owners` (weak reference -> key), `dead` (the references of
/// dead owners, appended by `on_dead`, their callback: `dead.append`).
struct Owned {
    live: Py<PyDict>,
    owners: Py<PyDict>,
    dead: Py<PyList>,
    on_dead: Py<PyAny>,
}

#[pymethods]
impl RangeAllocator {
    /// `live`, `owners`, `dead` and `on_dead`: the Python allocator's owner bookkeeping (`Owned`).
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        capacity: u64,
        align: u64,
        bank: u64,
        rotate: usize,
        live: Py<PyDict>,
        owners: Py<PyDict>,
        dead: Py<PyList>,
        on_dead: Py<PyAny>,
    ) -> Self {
        RangeAllocator {
            inner: core::memory::ranges::RangeAllocator::new(capacity, align, bank, rotate),
            owned: Owned {
                live,
                owners,
                dead,
                on_dead,
            },
        }
    }

    /// `trn3emu.allocator.Allocator.alloc_owned` in one call: frees the ranges of the owners in
    /// `dead` (last first), places `nbytes` (at least 1), records `live[key] = (start, start +
    /// nbytes, label)` and `owners[weakref.ref(owner, on_dead)] = key`; the start, or None when
    /// no range fits (nothing recorded).
    fn alloc_owned<'py>(
        &mut self,
        py: Python<'py>,
        nbytes: u64,
        label: Bound<'py, PyAny>,
        owner: Bound<'py, PyAny>,
    ) -> PyResult<Option<u64>> {
        let o = &self.owned;
        let (live, owners, dead) = (o.live.bind(py), o.owners.bind(py), o.dead.bind(py));
        while let Some(n) = dead.len().checked_sub(1) {
            let r = dead.get_item(n)?;
            dead.del_item(n)?;
            let key = owners
                .get_item(&r)?
                .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(r.clone().unbind()))?;
            owners.del_item(&r)?;
            if live.get_item(&key)?.is_some_and(|v| !v.is_none()) {
                live.del_item(&key)?;
                self.inner.release(key.extract()?);
            }
        }
        let Some((key, pos)) = self.inner.alloc(nbytes) else {
            return Ok(None);
        };
        live.set_item(key, (pos, pos + nbytes, label))?;
        owners.set_item(
            PyWeakrefReference::new_with(&owner, o.on_dead.bind(py))?,
            key,
        )?;
        Ok(Some(pos))
    }

    /// `(key, start)` of a new range of `nbytes` (at least 1), or None when none fits.
    fn alloc(&mut self, nbytes: u64) -> Option<(u64, u64)> {
        self.inner.alloc(nbytes)
    }

    /// Reserve `offset..offset + nbytes` (may overlap live ranges; within the capacity); its key.
    fn place(&mut self, py: Python<'_>, offset: u64, nbytes: u64) -> PyResult<u64> {
        self.inner.place(offset, nbytes).map_err(|e| to_py(py, e))
    }

    /// The recently freed ranges `(lo, hi)`, oldest first (kept out of reach while others fit).
    fn recent(&self) -> Vec<(u64, u64)> {
        self.inner.recent()
    }

    /// Free `key`'s range (a key not live: nothing).
    fn release(&mut self, key: u64) {
        self.inner.release(key)
    }
}
