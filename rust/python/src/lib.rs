//! Python bindings: array conversion, error mapping, GIL release. No semantics live here.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use std::panic::{catch_unwind, AssertUnwindSafe};
use trn3emu_core as core;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use trn3emu_core::isa::spec::Kind;
use trn3emu_core::isa::{Arg, DType, Engine, Instr, Opcode, Signal, Wait};
use trn3emu_core::memory::{Ap, DynKind, DynSrc, Dynamic, Mem, PARTITIONS, PSUM_PART_BYTES};
use trn3emu_core::{EmuError, ErrorKind};

/// Raise the `trn3emu.errors` class named by the error kind, with its fields as attributes.
fn to_py(py: Python<'_>, e: EmuError) -> PyErr {
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

fn emu(kind: ErrorKind, msg: impl Into<String>) -> EmuError {
    EmuError::new(kind, "binding", msg)
}

/// Run `f`, turning a panic into an InternalError instead of letting it cross into Python.
fn guarded<T>(f: impl FnOnce() -> core::Result<T>) -> core::Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(emu(
                ErrorKind::Internal,
                format!("internal emulator error (please report): {msg}"),
            ))
        }
    }
}

/// An access pattern tuple `(mem, dtype, start, parts, row_step, offset, dims[, dynamic])`;
/// `dynamic` = `(kind 's'|'v', register int | index-tile tuple, step, bound)`.
fn parse_ap(obj: &Bound<'_, PyAny>) -> core::Result<Ap> {
    let tup = obj.cast::<PyTuple>().map_err(|_| {
        emu(
            ErrorKind::Value,
            "expected a tensor (SBUF/PSUM tile or HBM tensor view)",
        )
    })?;
    let dynamic = if tup.len() == 8 {
        let d = tup
            .get_item(7)
            .map_err(|_| emu(ErrorKind::Value, "bad dynamic offset"))?;
        Some(Box::new(parse_dynamic(&d)?))
    } else {
        None
    };
    let base = if tup.len() == 8 {
        tup.get_slice(0, 7).into_any()
    } else {
        obj.clone()
    };
    let mut ap = parse_static_ap(&base)?;
    ap.dynamic = dynamic;
    Ok(ap)
}

fn parse_dynamic(d: &Bound<'_, PyAny>) -> core::Result<Dynamic> {
    let bad = || {
        emu(
            ErrorKind::Value,
            "dynamic offset must be (kind 's'|'v'|'i', register | index tile, step, bound)",
        )
    };
    let (kind, src, step, bound): (String, Bound<'_, PyAny>, i64, u32) =
        d.extract().map_err(|_| bad())?;
    let kind = match kind.as_str() {
        "s" => DynKind::Scalar,
        "v" => DynKind::Vector,
        "i" => DynKind::Indirect,
        _ => return Err(bad()),
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

fn parse_static_ap(obj: &Bound<'_, PyAny>) -> core::Result<Ap> {
    type T = (String, String, i64, i64, i64, i64, Vec<(i64, i64)>);
    let (mem, dtype, start, parts, pstep, offset, dims): T = obj.extract().map_err(|_| {
        emu(
            ErrorKind::Value,
            "expected a tensor (SBUF/PSUM tile or HBM tensor view)",
        )
    })?;
    let mem = Mem::from_name(&mem)
        .ok_or_else(|| emu(ErrorKind::MemorySpace, format!("unknown memory {mem:?}")))?;
    let dtype = DType::from_name(&dtype)
        .ok_or_else(|| emu(ErrorKind::Dtype, format!("unknown dtype {dtype:?}")))?;
    if !(0..=PARTITIONS as i64 * 2).contains(&start) || start < 0 {
        return Err(emu(
            ErrorKind::Address,
            format!("start partition {start} out of range"),
        ));
    }
    if parts <= 0 || parts > u32::MAX as i64 {
        return Err(emu(
            ErrorKind::Shape,
            format!("partition/row count {parts} out of range"),
        ));
    }
    if offset < 0 {
        return Err(emu(ErrorKind::Address, format!("negative offset {offset}")));
    }
    let mut d = Vec::with_capacity(dims.len());
    for (s, n) in dims {
        if n <= 0 || n > u32::MAX as i64 {
            return Err(emu(
                ErrorKind::Shape,
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

fn parse_arg(obj: &Bound<'_, PyAny>, kind: Kind, enum_id: u8) -> core::Result<Arg> {
    if obj.is_none() {
        return Ok(Arg::Absent);
    }
    let bad = |what: &str| {
        emu(
            ErrorKind::Value,
            format!(
                "expected {what}, got {}",
                obj.repr().map(|r| r.to_string()).unwrap_or_default()
            ),
        )
    };
    Ok(match kind {
        Kind::Tensor => Arg::Tensor(parse_ap(obj)?),
        Kind::TensorOrF32 if obj.cast::<PyTuple>().is_ok() => Arg::Tensor(parse_ap(obj)?),
        Kind::TensorOrF32 | Kind::F32 => {
            // Python ints (and numpy integers) stay exact 32-bit integer immediates.
            if let Ok(i) = obj.extract::<i64>() {
                core::isa::text::imm_from_i64(i).ok_or_else(|| {
                    emu(
                        ErrorKind::Value,
                        format!("integer immediate {i} does not fit 32 bits (-2^31 ..= 2^32-1); pass a float"),
                    )
                })?
            } else {
                Arg::F32(
                    obj.extract::<f64>()
                        .map_err(|_| bad("a number or a (P, 1) tile"))? as f32,
                )
            }
        }
        Kind::I32 => Arg::I32(obj.extract::<i32>().map_err(|_| bad("a 32-bit integer"))?),
        // The assembler passes a register as "rN" (a bare int is an immediate).
        Kind::I32OrReg => match obj.extract::<String>() {
            Ok(s) => Arg::Reg(
                s.strip_prefix('r')
                    .and_then(|n| n.parse::<u8>().ok())
                    .ok_or_else(|| bad("a 32-bit integer or a register"))?,
            ),
            Err(_) => Arg::I32(
                obj.extract::<i32>()
                    .map_err(|_| bad("a 32-bit integer or a register"))?,
            ),
        },
        Kind::Bool => Arg::Bool(obj.extract::<bool>().map_err(|_| bad("a bool"))?),
        Kind::Enum => {
            let e = &core::isa::tables::ENUMS[enum_id as usize];
            let s: String = obj
                .extract()
                .map_err(|_| bad(&format!("a {} name", e.name)))?;
            let v = e.values.iter().position(|v| *v == s).ok_or_else(|| {
                emu(
                    ErrorKind::Value,
                    format!(
                        "{s:?} is not a {} value (one of {})",
                        e.name,
                        e.values.join(", ")
                    ),
                )
            })?;
            Arg::Enum(v as u8)
        }
        // A bare int is a one-element list (NKI's `axis=1`).
        Kind::Ints if obj.extract::<i32>().is_ok() => {
            Arg::Ints(vec![obj.extract::<i32>().map_err(|_| bad("an integer"))?])
        }
        Kind::Ints | Kind::Pattern => {
            let mut v = Vec::new();
            for item in obj.try_iter().map_err(|_| bad("a list of integers"))? {
                let item = item.map_err(|_| bad("a list of integers"))?;
                if let Ok(x) = item.extract::<i32>() {
                    v.push(x);
                } else {
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
            }
            Arg::Ints(v)
        }
        Kind::Reg => Arg::Reg(obj.extract::<u8>().map_err(|_| bad("a register number"))?),
    })
}

/// An ISA program for one core (the assembler's storage).
#[pyclass(module = "trn3emu._native")]
#[derive(Clone)]
struct Program {
    inner: core::Program,
    /// Matmul-written state of PSUM (2-byte units) used to resolve accumulate=None at assembly.
    mm: Vec<u64>,
}

impl Program {
    fn wrap(inner: core::Program) -> Self {
        Program {
            inner,
            mm: vec![0; PARTITIONS * PSUM_PART_BYTES / 2 / 64],
        }
    }

    /// The PSUM 2-byte units an access pattern covers, as half-open ranges (one per partition
    /// when rows are contiguous).
    fn unit_ranges(ap: &Ap) -> Vec<(usize, usize)> {
        let es = ap.dtype.size();
        let mut v = Vec::new();
        let contiguous = ap.is_row_contiguous();
        let offs = if contiguous {
            vec![0]
        } else {
            ap.row_offsets()
        };
        let run = if contiguous { ap.free_size() * es } else { es };
        for r in 0..ap.parts as usize {
            let base = (ap.start as usize + r) * PSUM_PART_BYTES + ap.offset as usize;
            for o in &offs {
                let b = (base as i64 + o * es as i64) as usize;
                v.push((b / 2, (b + run).div_ceil(2)));
            }
        }
        v
    }

    /// accumulate=None -> False if no element was matmul-written since its PSUM allocation,
    /// True if all were; mixed stays None (decided per element at run time).
    fn resolve_accumulate(&mut self, ins: &mut Instr) {
        use core::isa::tables::p::nc_matmul as mm;
        let Some(dst) = ins.ap(mm::DST).cloned() else {
            return;
        };
        let ranges = Self::unit_ranges(&dst);
        let total: usize = ranges.iter().map(|(a, b)| b - a).sum();
        let written: usize = ranges
            .iter()
            .map(|(a, b)| bits_count(&self.mm, *a, *b))
            .sum();
        if matches!(ins.args[mm::ACCUMULATE], Arg::Absent) {
            if written == 0 {
                ins.args[mm::ACCUMULATE] = Arg::Bool(false);
            } else if written == total {
                ins.args[mm::ACCUMULATE] = Arg::Bool(true);
            }
        }
        for (a, b) in ranges {
            bits_assign(&mut self.mm, a, b, true);
        }
    }
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

/// Number of one bits in `lo..hi`.
fn bits_count(words: &[u64], lo: usize, hi: usize) -> usize {
    let (mut i, mut n_ones) = (lo, 0);
    while i < hi {
        let first = i % 64;
        let n = (64 - first).min(hi - i);
        let mask = if n == 64 {
            u64::MAX
        } else {
            ((1u64 << n) - 1) << first
        };
        n_ones += (words[i / 64] & mask).count_ones() as usize;
        i += n;
    }
    n_ones
}

/// Set or clear bits `lo..hi` (word at a time).
fn bits_assign(words: &mut [u64], lo: usize, hi: usize, on: bool) {
    let mut i = lo;
    while i < hi {
        let w = i / 64;
        let first = i % 64;
        let n = (64 - first).min(hi - i);
        let mask = if n == 64 {
            u64::MAX
        } else {
            ((1u64 << n) - 1) << first
        };
        if on {
            words[w] |= mask;
        } else {
            words[w] &= !mask;
        }
        i += n;
    }
}

fn parse_sync(
    waits: &Bound<'_, PyAny>,
    signals: &Bound<'_, PyAny>,
) -> core::Result<(Vec<Wait>, Vec<Signal>)> {
    let w: Vec<(u16, u32)> = waits.extract().map_err(|_| {
        emu(
            ErrorKind::Semaphore,
            "wait must be a list of (semaphore, value) pairs",
        )
    })?;
    let s: Vec<(u16, u32)> = signals.extract().map_err(|_| {
        emu(
            ErrorKind::Semaphore,
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

#[pymethods]
impl Program {
    #[new]
    #[pyo3(signature = (core = 0))]
    fn new(py: Python<'_>, core: i64) -> PyResult<Self> {
        if !(0..8).contains(&core) {
            return Err(to_py(
                py,
                emu(ErrorKind::Value, format!("core {core} out of range (0..8)")).operand("core"),
            ));
        }
        Ok(Program::wrap(core::Program {
            core: core as u8,
            instrs: Vec::new(),
        }))
    }

    #[getter]
    fn core(&self) -> u8 {
        self.inner.core
    }

    fn __len__(&self) -> usize {
        self.inner.instrs.len()
    }

    /// Append one instruction: `args` aligned with the ISA parameters (None = omitted).
    #[pyo3(signature = (opcode, engine, args, waits, signals, name = None, resolve_accumulate = true))]
    #[allow(clippy::too_many_arguments)]
    fn append(
        &mut self,
        py: Python<'_>,
        opcode: &str,
        engine: Option<&str>,
        args: &Bound<'_, PyTuple>,
        waits: &Bound<'_, PyAny>,
        signals: &Bound<'_, PyAny>,
        name: Option<String>,
        resolve_accumulate: bool,
    ) -> PyResult<usize> {
        let index = self.inner.instrs.len();
        let r = (|| -> core::Result<Instr> {
            let op = Opcode::from_name(opcode)
                .ok_or_else(|| emu(ErrorKind::Value, format!("unknown instruction {opcode:?}")))?;
            let spec = op.spec();
            let engine = match engine {
                None => Engine::Unknown,
                Some(e) => {
                    let i = Engine::NAMES.iter().position(|n| *n == e).ok_or_else(|| {
                        emu(ErrorKind::Value, format!("unknown engine {e:?}")).operand("engine")
                    })?;
                    Engine::from_u8(i as u8).unwrap_or(Engine::Unknown)
                }
            };
            if args.len() != spec.params.len() {
                return Err(emu(
                    ErrorKind::Value,
                    format!(
                        "{opcode} takes {} operands, got {}",
                        spec.params.len(),
                        args.len()
                    ),
                ));
            }
            let mut out = Vec::with_capacity(args.len());
            for (p, a) in spec.params.iter().zip(args.iter()) {
                let arg = parse_arg(&a, p.kind, p.enum_id).map_err(|e| e.operand(p.name))?;
                let arg = match (arg, Arg::from_default(&p.default, p.kind)) {
                    (Arg::Absent, Some(d))
                        if !matches!(p.default, core::isa::spec::Default::Absent) =>
                    {
                        d
                    }
                    (a, _) => a,
                };
                out.push(arg);
            }
            let (waits, signals) = parse_sync(waits, signals)?;
            // engine=None / unknown: the ISA's default-engine rule (e.g. int32 tensor_tensor -> GpSimd).
            let engine = if engine == Engine::Unknown {
                core::engines::default_engine(op, &out)
            } else {
                engine
            };
            let mut ins = Instr {
                op,
                engine,
                args: out,
                waits,
                signals,
                name,
            };
            core::engines::validate(&ins)?;
            if op == Opcode::NcMatmul && resolve_accumulate {
                self.resolve_accumulate(&mut ins);
            }
            Ok(ins)
        })();
        match r {
            Ok(ins) => {
                // Still None after assembly: partly matmul-written dst, resolved per element.
                let mixed = ins.op == Opcode::NcMatmul
                    && resolve_accumulate
                    && matches!(
                        ins.args[core::isa::tables::p::nc_matmul::ACCUMULATE],
                        Arg::Absent
                    );
                self.inner.instrs.push(ins);
                if mixed {
                    if let Err(e) = warn_accumulate(py, index) {
                        // Warnings as errors: the instruction is not appended.
                        self.inner.instrs.pop();
                        return Err(e);
                    }
                }
                Ok(index)
            }
            Err(e) => {
                let text = format!("{opcode} (being assembled)");
                Err(to_py(py, e.at(index, text)))
            }
        }
    }

    /// Mark PSUM bytes as freshly allocated: the next matmul with accumulate=None overwrites them.
    fn psum_fresh(&mut self, start: u32, parts: u32, offset: u64, nbytes: u64) {
        let end = (offset + nbytes).min(PSUM_PART_BYTES as u64) as usize;
        let offset = (offset as usize).min(end);
        for p in start as usize..(start + parts).min(PARTITIONS as u32) as usize {
            let base = p * PSUM_PART_BYTES / 2;
            bits_assign(
                &mut self.mm,
                base + offset / 2,
                base + end.div_ceil(2),
                false,
            );
        }
    }

    /// Add the semaphores the data dependencies need (automatic synchronisation).
    fn synced(&self, py: Python<'_>) -> PyResult<Program> {
        let p = guarded(|| core::machine::autosync::auto_sync(&self.inner))
            .map_err(|e| to_py(py, e))?;
        Ok(Program {
            inner: p,
            mm: self.mm.clone(),
        })
    }

    /// Label (`name=`: the kernel source line) of every instruction, in program order.
    fn instruction_names(&self) -> Vec<Option<String>> {
        self.inner.instrs.iter().map(|i| i.name.clone()).collect()
    }

    fn instruction_text(&self, i: usize) -> Option<String> {
        self.inner.instrs.get(i).map(core::isa::text::format_instr)
    }

    fn to_text(&self) -> String {
        core::isa::text::format_program(&self.inner)
    }

    #[staticmethod]
    fn from_text(py: Python<'_>, text: &str) -> PyResult<Program> {
        guarded(|| core::engines::parse_program(text))
            .map(Program::wrap)
            .map_err(|e| to_py(py, e))
    }

    fn encode<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &core::isa::encode::encode_program(&self.inner))
    }

    #[staticmethod]
    fn decode(py: Python<'_>, data: &[u8]) -> PyResult<Program> {
        guarded(|| core::engines::decode_program(data))
            .map(Program::wrap)
            .map_err(|e| to_py(py, e))
    }

    fn __eq__(&self, other: &Program) -> bool {
        self.inner == other.inner
    }

    fn __repr__(&self) -> String {
        format!(
            "<Program core={} instructions={}>",
            self.inner.core,
            self.inner.instrs.len()
        )
    }
}

/// One Trainium3 device: 8 cores, shared sparse HBM.
#[pyclass(module = "trn3emu._native")]
struct Device {
    inner: core::Device,
}

fn check_hbm(addr: u64, n: u64) -> core::Result<()> {
    if addr
        .checked_add(n)
        .is_none_or(|e| e > core::memory::HBM_BYTES)
    {
        return Err(emu(
            ErrorKind::Address,
            format!(
                "HBM bytes {addr}..{} are outside the 144 GiB address space",
                addr as u128 + n as u128
            ),
        ));
    }
    Ok(())
}

#[pymethods]
impl Device {
    /// `rounding`: "rne" | "stochastic" (None: NEURON_RT_STOCHASTIC_ROUNDING_EN decides);
    /// `seed` (None: NEURON_RT_STOCHASTIC_ROUNDING_SEED or 0); `sr_bits` 1..=32;
    /// `fp8_overflow`: "ieee" (ml_dtypes) | "saturate"; `mx_scale`: "nki" | "ocp".
    #[new]
    #[pyo3(signature = (rounding = None, seed = None, sr_bits = 32, fp8_overflow = "ieee", mx_scale = "nki"))]
    fn new(
        py: Python<'_>,
        rounding: Option<&str>,
        seed: Option<u64>,
        sr_bits: u32,
        fp8_overflow: &str,
        mx_scale: &str,
    ) -> PyResult<Self> {
        use core::numerics::config::{Fp8Overflow, MxScaleRule, NumericsConfig, RoundMode};
        let bad = |what: &str, v: &str, allowed: &str| {
            to_py(
                py,
                emu(
                    ErrorKind::Value,
                    format!("{what} must be one of {allowed}, got {v:?}"),
                ),
            )
        };
        let mut cfg = NumericsConfig::from_env(|k| std::env::var(k).ok());
        match rounding {
            None => {}
            Some("rne") | Some("nearest") => cfg.rounding = RoundMode::Rne,
            Some("stochastic") | Some("sr") => cfg.rounding = RoundMode::Stochastic,
            Some(v) => return Err(bad("rounding", v, "'rne', 'stochastic'")),
        }
        if let Some(s) = seed {
            cfg.seed = s;
        }
        if !(1..=32).contains(&sr_bits) {
            return Err(bad("sr_bits", &sr_bits.to_string(), "1..=32"));
        }
        cfg.sr_bits = sr_bits;
        cfg.fp8_overflow = match fp8_overflow {
            "ieee" => Fp8Overflow::Ieee,
            "saturate" => Fp8Overflow::Saturate,
            v => return Err(bad("fp8_overflow", v, "'ieee', 'saturate'")),
        };
        cfg.mx_scale = match mx_scale {
            "nki" => MxScaleRule::Nki,
            "ocp" => MxScaleRule::Ocp,
            v => return Err(bad("mx_scale", v, "'nki', 'ocp'")),
        };
        Ok(Device {
            inner: core::Device::with_numerics(cfg),
        })
    }

    /// The numerics configuration in effect (after environment variables and arguments).
    fn numerics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        use core::numerics::config::{Fp8Overflow, MxScaleRule, RoundMode};
        let c = &self.inner.numerics;
        let d = PyDict::new(py);
        d.set_item(
            "rounding",
            match c.rounding {
                RoundMode::Rne => "rne",
                RoundMode::Stochastic => "stochastic",
            },
        )?;
        d.set_item("seed", c.seed)?;
        d.set_item("sr_bits", c.sr_bits)?;
        d.set_item(
            "fp8_overflow",
            match c.fp8_overflow {
                Fp8Overflow::Ieee => "ieee",
                Fp8Overflow::Saturate => "saturate",
            },
        )?;
        d.set_item(
            "mx_scale",
            match c.mx_scale {
                MxScaleRule::Nki => "nki",
                MxScaleRule::Ocp => "ocp",
            },
        )?;
        Ok(d)
    }

    /// Write raw bytes (a contiguous uint8 array) at an HBM address.
    fn hbm_write(
        &mut self,
        py: Python<'_>,
        addr: u64,
        data: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<()> {
        let s = data
            .as_slice()
            .map_err(|_| bad_array(py, "data", "hbm_write needs a contiguous uint8 array"))?;
        check_hbm(addr, s.len() as u64).map_err(|e| to_py(py, e))?;
        self.inner.hbm.write(addr, s);
        Ok(())
    }

    /// Zero `nbytes` of HBM at `addr` (no host buffer needed; whole 1 MiB pages are released).
    fn hbm_zero(&mut self, py: Python<'_>, addr: u64, nbytes: u64) -> PyResult<()> {
        check_hbm(addr, nbytes).map_err(|e| to_py(py, e))?;
        self.inner.hbm.zero(addr, nbytes);
        Ok(())
    }

    /// Whether HBM at `addr` holds exactly `data` (compared in place, no copy).
    fn hbm_equals(
        &self,
        py: Python<'_>,
        addr: u64,
        data: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<bool> {
        let s = data
            .as_slice()
            .map_err(|_| bad_array(py, "data", "hbm_equals needs a contiguous uint8 array"))?;
        check_hbm(addr, s.len() as u64).map_err(|e| to_py(py, e))?;
        Ok(self.inner.hbm.equals(addr, s))
    }

    /// Read `nbytes` raw bytes at an HBM address into a new uint8 array.
    fn hbm_read<'py>(
        &self,
        py: Python<'py>,
        addr: u64,
        nbytes: u64,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        check_hbm(addr, nbytes).map_err(|e| to_py(py, e))?;
        let mut v = vec![0u8; nbytes as usize];
        self.inner.hbm.read(addr, &mut v);
        Ok(PyArray1::from_vec(py, v))
    }

    /// Host bytes backing HBM (pages touched so far).
    fn hbm_resident_bytes(&self) -> u64 {
        self.inner.hbm.resident_bytes()
    }

    /// Read the bytes of `parts` partitions of a core's SBUF or PSUM, `nbytes` from `offset`.
    #[allow(clippy::too_many_arguments)]
    fn onchip_read<'py>(
        &self,
        py: Python<'py>,
        core: usize,
        mem: &str,
        start: usize,
        parts: usize,
        offset: usize,
        nbytes: usize,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let r = (|| -> core::Result<Vec<u8>> {
            let c = self
                .inner
                .cores
                .get(core)
                .ok_or_else(|| emu(ErrorKind::Value, format!("core {core} out of range")))?;
            let m = match mem {
                "sbuf" => &c.sbuf,
                "psum" => &c.psum,
                _ => {
                    return Err(emu(
                        ErrorKind::MemorySpace,
                        format!("{mem:?} is not an on-chip memory"),
                    ))
                }
            };
            if start + parts > PARTITIONS || offset + nbytes > m.part_bytes {
                return Err(emu(
                    ErrorKind::Address,
                    format!(
                        "partitions {start}..{} bytes {offset}..{} outside {mem}",
                        start + parts,
                        offset + nbytes
                    ),
                ));
            }
            let mut v = Vec::with_capacity(parts * nbytes);
            for p in start..start + parts {
                v.extend_from_slice(&m.partition(p)[offset..offset + nbytes]);
            }
            Ok(v)
        })();
        r.map(|v| PyArray1::from_vec(py, v))
            .map_err(|e| to_py(py, e))
    }

    /// Fill every core's SBUF and PSUM with one byte value (e.g. 0xFF = NaN for floats); free
    /// for a memory that holds only that byte already (a core no run has touched since).
    fn fill_onchip(&mut self, byte: u8) {
        for c in &mut self.inner.cores {
            c.sbuf.fill(byte);
            c.psum.fill(byte);
        }
    }

    /// Run programs (one per core) concurrently; the GIL is released while the device runs.
    #[pyo3(signature = (programs, check_races = true, trace = true))]
    fn run<'py>(
        &mut self,
        py: Python<'py>,
        programs: Vec<PyRef<'py, Program>>,
        check_races: bool,
        trace: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let progs: Vec<&core::Program> = programs.iter().map(|p| &p.inner).collect();
        let opts = core::RunOptions { check_races, trace };
        let dev = &mut self.inner;
        let res = py
            .detach(|| guarded(|| dev.run_refs(&progs, &opts)))
            .map_err(|e| to_py(py, e))?;
        let d = PyDict::new(py);
        d.set_item("end_ps", res.end_ps)?;
        d.set_item("executed", res.executed)?;
        // The trace stays in Rust until Python asks for its columns (RunResult.trace).
        d.set_item("trace", Py::new(py, RawTrace { inner: res.trace })?)?;
        Ok(d)
    }
}

/// A run's trace, held natively; `columns()` builds the numpy columns on demand.
#[pyclass(module = "trn3emu._native", frozen)]
struct RawTrace {
    inner: core::trace::Trace,
}

#[pymethods]
impl RawTrace {
    /// The trace as a dict of numpy columns (records, plus `sems` and `dma_spans` sub-dicts).
    fn columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let res = self;
        let recs = &res.inner.records;
        let cols = PyDict::new(py);
        macro_rules! col {
            ($d:expr, $name:expr, $src:expr, $f:expr) => {
                $d.set_item(
                    $name,
                    PyArray1::from_vec(py, $src.iter().map($f).collect::<Vec<_>>()),
                )?
            };
        }
        col!(cols, "core", recs, |r| r.core);
        col!(cols, "unit", recs, |r| match r.unit {
            core::trace::Unit::Engine(e) => e,
            core::trace::Unit::DmaQueue(q) => 5 + q,
        });
        col!(cols, "index", recs, |r| r.index);
        col!(cols, "opcode", recs, |r| r.opcode as u16);
        col!(cols, "start_ps", recs, |r| r.start_ps);
        col!(cols, "end_ps", recs, |r| r.end_ps);
        col!(cols, "bytes", recs, |r| r.bytes);
        col!(cols, "flops", recs, |r| r.flops);
        col!(cols, "hbm_bytes", recs, |r| r.hbm_bytes);
        col!(cols, "priority", recs, |r| r.priority);
        col!(cols, "dma_engines", recs, |r| r.dma_engines);
        col!(cols, "w_mem", recs, |r| r.write.mem);
        col!(cols, "w_p0", recs, |r| r.write.p0);
        col!(cols, "w_p1", recs, |r| r.write.p1);
        col!(cols, "w_lo", recs, |r| r.write.lo);
        col!(cols, "w_hi", recs, |r| r.write.hi);
        let ev = &res.inner.sems;
        let sems = PyDict::new(py);
        col!(sems, "core", ev, |e| e.core);
        col!(sems, "sem", ev, |e| e.sem);
        col!(sems, "wait", ev, |e| e.wait);
        col!(sems, "value", ev, |e| e.value);
        col!(sems, "time_ps", ev, |e| e.time_ps);
        col!(sems, "record", ev, |e| e.record);
        col!(sems, "by", ev, |e| e.by);
        cols.set_item("sems", sems)?;
        let sp = &res.inner.dma_spans;
        let spans = PyDict::new(py);
        col!(spans, "core", sp, |e| e.core);
        col!(spans, "engine", sp, |e| e.engine);
        col!(spans, "start_ps", sp, |e| e.start_ps);
        col!(spans, "end_ps", sp, |e| e.end_ps);
        col!(spans, "bytes", sp, |e| e.bytes);
        col!(spans, "record", sp, |e| e.record);
        cols.set_item("dma_spans", spans)?;
        cols.set_item("schema_version", core::trace::SCHEMA_VERSION)?;
        Ok(cols)
    }
}

/// An array argument the conversion or HBM helpers cannot use, as a project ValueError.
fn bad_array(py: Python<'_>, operand: &str, msg: &str) -> PyErr {
    to_py(py, emu(ErrorKind::Value, msg.to_string()).operand(operand))
}

/// A dtype by name, or a DtypeError naming it.
fn dtype_named(py: Python<'_>, name: &str) -> PyResult<DType> {
    DType::from_name(name).ok_or_else(|| {
        to_py(
            py,
            emu(ErrorKind::Dtype, format!("unknown dtype {name:?}")).operand("dtype"),
        )
    })
}

/// `out` if given (contiguous, writeable, `n` long: conversions then allocate nothing, which
/// is what keeps large buffers from being page-fault bound), else a new zeroed array.
fn out_array<'py, T: numpy::Element>(
    py: Python<'py>,
    out: Option<Bound<'py, PyArray1<T>>>,
    n: usize,
) -> PyResult<Bound<'py, PyArray1<T>>> {
    match out {
        Some(o) => {
            if o.len() != n {
                return Err(to_py(
                    py,
                    emu(
                        ErrorKind::Shape,
                        format!("out has {} elements, the input {n}", o.len()),
                    )
                    .operand("out"),
                ));
            }
            Ok(o)
        }
        None => Ok(PyArray1::zeros(py, n, false)),
    }
}

/// Fill a result array in place: it must be writeable and contiguous (an `out=` argument).
fn write_out<T: numpy::Element>(
    py: Python<'_>,
    arr: &Bound<'_, PyArray1<T>>,
    f: impl FnOnce(&mut [T]),
) -> PyResult<()> {
    let mut w = arr
        .try_readwrite()
        .map_err(|_| bad_array(py, "out", "out must be a writeable array"))?;
    let o = w
        .as_slice_mut()
        .map_err(|_| bad_array(py, "out", "out must be contiguous"))?;
    f(o);
    Ok(())
}

/// Raw conversions exposed for tests and dtype helpers: fp32 bits -> dtype bits (RNE).
#[pyfunction]
#[pyo3(signature = (dtype, bits, saturate = false, out = None))]
fn convert_from_f32<'py>(
    py: Python<'py>,
    dtype: &str,
    bits: PyReadonlyArray1<'py, u32>,
    saturate: bool,
    out: Option<Bound<'py, PyArray1<u32>>>,
) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let dt = dtype_named(py, dtype)?;
    let s = bits
        .as_slice()
        .map_err(|_| bad_array(py, "bits", "a contiguous uint32 array is needed"))?;
    let arr = out_array(py, out, s.len())?;
    write_out(py, &arr, |o| {
        if saturate {
            let cfg = core::numerics::config::NumericsConfig {
                fp8_overflow: core::numerics::config::Fp8Overflow::Saturate,
                ..Default::default()
            };
            let r = core::numerics::config::Rounder::new(cfg, 0, 0, 0, false);
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
fn convert_to_f32<'py>(
    py: Python<'py>,
    dtype: &str,
    codes: PyReadonlyArray1<'py, u32>,
    out: Option<Bound<'py, PyArray1<f32>>>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let dt = dtype_named(py, dtype)?;
    let s = codes
        .as_slice()
        .map_err(|_| bad_array(py, "codes", "a contiguous uint32 array is needed"))?;
    let arr = out_array(py, out, s.len())?;
    write_out(py, &arr, |o| {
        py.detach(|| core::numerics::convert_to_f32_slice(dt, s, o))
    })?;
    Ok(arr)
}

/// The default cost model's numbers the trace reports compare against (docs/cost-model.md).
#[pyfunction]
fn cost_params<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    use core::cost::*;
    let d = PyDict::new(py);
    let p = DmaParams::default();
    d.set_item("tensor_ghz", TENSOR_GHZ)?;
    d.set_item("engine_ghz", ENGINE_GHZ)?;
    d.set_item("peak_tflops_bf16", PEAK_TFLOPS_BF16)?;
    d.set_item("peak_tflops_mx", PEAK_TFLOPS_MX)?;
    d.set_item("peak_tflops_fp32", PEAK_TFLOPS_FP32)?;
    d.set_item("sem_latency_ns", SEM_LATENCY_NS)?;
    d.set_item("dma_engines", p.engines)?;
    d.set_item("dma_queues", p.queues)?;
    d.set_item("dma_partitions_per_engine", p.partitions_per_engine)?;
    d.set_item("dma_engine_bytes_per_ns", p.engine_bytes_per_ns)?;
    d.set_item("dma_fixed_ns", p.fixed_ns)?;
    d.set_item("dma_descriptor_ns", p.descriptor_ns)?;
    d.set_item("hbm_bytes_per_ns", p.hbm_bytes_per_ns)?;
    d.set_item("dma_priorities", p.priorities)?;
    Ok(d)
}

/// Opcode -> name table and other ISA facts for the Python layer.
#[pyfunction]
fn isa_opcodes<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
    let items: Vec<(u16, &str)> = core::isa::tables::INSTRUCTIONS
        .iter()
        .map(|s| (s.opcode as u16, s.name))
        .collect();
    PyList::new(py, items)
}

/// Host threads the kernels use (`TRN3EMU_NUM_THREADS`, else every core, unless set).
#[pyfunction]
fn get_num_threads() -> usize {
    core::par::num_threads()
}

/// Set the host thread count for later runs (0 restores the default). Results are the same
/// bits for every count.
#[pyfunction]
fn set_num_threads(n: usize) {
    core::par::set_num_threads(n)
}

/// Testing hook: instructions with at least `n` operations are split across threads (0: the
/// default threshold). Speed only, never bits.
#[pyfunction]
fn set_min_parallel_work(n: usize) {
    core::par::set_min_parallel_work(n)
}

/// The SIMD path the kernels take ("avx512", "avx2+fma" or "portable").
#[pyfunction]
fn simd_path() -> &'static str {
    core::kernels::simd::path_name()
}

/// Tests: limit the kernels to a SIMD path ("avx512", "avx2+fma", "portable"; None: the
/// host's best). Returns whether the host can run that path (if not, the limit still applies
/// and the next narrower supported path runs).
#[pyfunction]
#[pyo3(signature = (path = None))]
fn limit_simd(py: Python<'_>, path: Option<&str>) -> PyResult<bool> {
    let p = match path {
        None => None,
        Some(name) => Some(core::kernels::simd::parse(name).ok_or_else(|| {
            to_py(
                py,
                emu(
                    ErrorKind::Value,
                    format!("SIMD path must be 'avx512', 'avx2+fma' or 'portable', got {name:?}"),
                ),
            )
        })?),
    };
    core::kernels::simd::set_limit(p);
    Ok(p.is_none_or(core::kernels::simd::host_supports))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Device>()?;
    m.add_class::<Program>()?;
    m.add_class::<RawTrace>()?;
    m.add_function(wrap_pyfunction!(convert_from_f32, m)?)?;
    m.add_function(wrap_pyfunction!(convert_to_f32, m)?)?;
    m.add_function(wrap_pyfunction!(isa_opcodes, m)?)?;
    m.add_function(wrap_pyfunction!(cost_params, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(set_min_parallel_work, m)?)?;
    m.add_function(wrap_pyfunction!(simd_path, m)?)?;
    m.add_function(wrap_pyfunction!(limit_simd, m)?)?;
    m.add("AUTO_SEM_BASE", core::machine::autosync::AUTO_SEM_BASE)?;
    m.add("NUM_SEMAPHORES", core::isa::instr::NUM_SEMAPHORES)?;
    Ok(())
}
