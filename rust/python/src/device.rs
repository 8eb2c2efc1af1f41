//! `_native.Device`: numerics options in, HBM and on-chip bytes in and out, `run` with the GIL
//! released.

use crate::args;
use crate::errors::{bad_array, guarded, named, py_err};
use crate::program::Program;
use crate::signals::SignalCheck;
use crate::trace::RawTrace;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::ThreadId;
use trn3emu_core as core;
use trn3emu_core::error::fail;
use trn3emu_core::memory::{HBM_BYTES, PARTITIONS};
use trn3emu_core::numerics::config::NumericsConfig;
use trn3emu_core::ErrorKind;

/// One Trainium3 device: 8 cores, shared sparse HBM. A call from another thread while a run
/// holds the device waits for the run to end (with the GIL released); a call from the running
/// thread itself (a signal handler during the run) raises `ExecutionError` (`device_busy`).
#[pyclass(module = "trn3emu._native", frozen)]
pub struct Device {
    inner: Mutex<core::Device>,
    /// The thread running the device, while a run holds it.
    runner: Mutex<Option<ThreadId>>,
    /// The process id of whoever holds `inner` (0: nobody): a holder in another process is a
    /// thread of the parent that was using the device when the process forked. It does not
    /// exist in the child and never lets go, so the child's calls raise instead of waiting.
    holder: AtomicU32,
}

/// The device, locked: `holder` says by this process until it is dropped.
pub(crate) struct DevGuard<'a> {
    guard: MutexGuard<'a, core::Device>,
    holder: &'a AtomicU32,
}

impl std::ops::Deref for DevGuard<'_> {
    type Target = core::Device;
    fn deref(&self) -> &core::Device {
        &self.guard
    }
}

impl std::ops::DerefMut for DevGuard<'_> {
    fn deref_mut(&mut self) -> &mut core::Device {
        &mut self.guard
    }
}

impl Drop for DevGuard<'_> {
    fn drop(&mut self) {
        self.holder.store(0, Ordering::Release);
    }
}

impl Device {
    /// The device, waiting with the GIL released while another thread's run holds it. In a
    /// child process forked while another thread held it: `ExecutionError` (`device_forked`)
    /// at once (its state is whatever the parent's run left half-way; the holder is gone).
    pub(crate) fn dev(&self, py: Python<'_>) -> PyResult<DevGuard<'_>> {
        let pid = std::process::id();
        let held = |guard| {
            self.holder.store(pid, Ordering::Release);
            DevGuard {
                guard,
                holder: &self.holder,
            }
        };
        loop {
            match self.inner.try_lock() {
                Ok(g) => return Ok(held(g)),
                Err(TryLockError::Poisoned(p)) => return Ok(held(p.into_inner())),
                Err(TryLockError::WouldBlock) => {
                    let h = self.holder.load(Ordering::Acquire);
                    if h != 0 && h != pid {
                        return Err(named(
                            py,
                            "ExecutionError",
                            "device_forked",
                            "device",
                            format!("this Device was in use by another thread of process {h} when it forked into this one ({pid}); that thread does not exist here, so the device never becomes free: make a new Device in the child"),
                        ));
                    }
                    let me = std::thread::current().id();
                    let runner = *self.runner.lock().unwrap_or_else(PoisonError::into_inner);
                    if runner == Some(me) {
                        return Err(named(
                            py,
                            "ExecutionError",
                            "device_busy",
                            "device",
                            "the device is running on this thread (a call from a signal handler or progress callback during Device.run); call it after the run".into(),
                        ));
                    }
                    // Wait (GIL released) until it is free, looking again for a fork now and
                    // then (the holder may have been between its lock and its `holder` store).
                    py.detach(|| {
                        while matches!(self.inner.try_lock(), Err(TryLockError::WouldBlock)) {
                            let h = self.holder.load(Ordering::Acquire);
                            if h != 0 && h != pid {
                                return;
                            }
                            std::thread::sleep(std::time::Duration::from_micros(200));
                        }
                    });
                }
            }
        }
    }
}

fn check_hbm(addr: u64, n: u64) -> core::Result<()> {
    if addr.checked_add(n).is_none_or(|e| e > HBM_BYTES) {
        return Err(fail(
            ErrorKind::Address,
            "hbm_out_of_range",
            format!(
                "HBM bytes {addr}..{} are outside the 144 GiB address space",
                addr as u128 + n as u128
            ),
        ));
    }
    Ok(())
}

/// The numerics options: the environment's defaults, then each option given.
fn numerics_config(
    rounding: Option<&str>,
    seed: Option<u64>,
    sr_bits: Option<u64>,
    fp8_overflow: Option<&str>,
    mx_scale: Option<&str>,
) -> core::Result<NumericsConfig> {
    let mut cfg = NumericsConfig::from_env(|k| std::env::var(k).ok());
    for (option, value) in [
        ("rounding", rounding),
        ("fp8_overflow", fp8_overflow),
        ("mx_scale", mx_scale),
    ] {
        if let Some(v) = value {
            cfg.set_name(option, v)?;
        }
    }
    for (option, value) in [("seed", seed), ("sr_bits", sr_bits)] {
        if let Some(v) = value {
            cfg.set_int(option, v)?;
        }
    }
    Ok(cfg)
}

/// The timing generation: `timing` if given, else the `TRN3EMU_TIMING` environment variable,
/// else trn3.
fn timing_generation(timing: Option<&str>) -> core::Result<&'static core::timing::Generation> {
    match timing {
        Some(t) => core::timing::generation(t),
        None => match std::env::var(core::timing::ENV) {
            Ok(v) if !v.trim().is_empty() => core::timing::generation(&v),
            _ => Ok(core::timing::default_generation()),
        },
    }
}

/// The bytes of `parts` partitions of a core's SBUF or PSUM, `nbytes` from `offset`.
fn onchip_bytes(
    dev: &core::Device,
    core: usize,
    mem: &str,
    (start, parts): (usize, usize),
    (offset, nbytes): (usize, usize),
) -> core::Result<Vec<u8>> {
    let c = dev.cores.get(core).ok_or_else(|| {
        fail(
            ErrorKind::Value,
            "core_out_of_range",
            format!("core {core} out of range"),
        )
        .operand("core")
    })?;
    let m = match mem {
        "sbuf" => &c.sbuf,
        "psum" => &c.psum,
        _ => {
            return Err(fail(
                ErrorKind::MemorySpace,
                "not_onchip_memory",
                format!("{mem:?} is not an on-chip memory"),
            ))
        }
    };
    if start + parts > PARTITIONS || offset + nbytes > m.part_bytes {
        return Err(fail(
            ErrorKind::Address,
            "onchip_read_out_of_range",
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
}

/// The core's `Monitor` for a run from Python: on each poll (every `POLL_EVERY` executed
/// items) a `SignalCheck` (Ctrl-C cancels the run), which also calls the progress callback.
pub(crate) struct PyMonitor {
    pub(crate) check: SignalCheck,
    pub(crate) progress: Option<Py<PyAny>>,
}

impl core::machine::Monitor for PyMonitor {
    fn poll(&mut self, p: &core::machine::Progress) -> bool {
        let progress = &self.progress;
        self.check.keep_going(|py| match progress {
            Some(f) => f.call1(py, (p.executed, p.total, p.emulated_ps)).map(drop),
            None => Ok(()),
        })
    }
}

#[pymethods]
impl Device {
    /// Numerics options (names, values and defaults: `numerics_options()`); None keeps the
    /// default (for `rounding` and `seed`: the Neuron runtime's environment variables).
    #[new]
    #[pyo3(signature = (rounding = None, seed = None, sr_bits = None, fp8_overflow = None, mx_scale = None, timing = None))]
    fn new(
        py: Python<'_>,
        rounding: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        sr_bits: Option<&Bound<'_, PyAny>>,
        fp8_overflow: Option<&Bound<'_, PyAny>>,
        mx_scale: Option<&Bound<'_, PyAny>>,
        timing: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let int = |o: Option<&Bound<'_, PyAny>>, name| match o {
            Some(v) if !v.is_none() => args::int_arg::<u64>(v, name).map(Some),
            _ => Ok(None),
        };
        let (seed, sr_bits) = (int(seed, "seed")?, int(sr_bits, "sr_bits")?);
        let rounding = args::opt_str_arg(rounding, "rounding")?;
        let fp8_overflow = args::opt_str_arg(fp8_overflow, "fp8_overflow")?;
        let mx_scale = args::opt_str_arg(mx_scale, "mx_scale")?;
        let cfg = numerics_config(
            rounding.as_deref(),
            seed,
            sr_bits,
            fp8_overflow.as_deref(),
            mx_scale.as_deref(),
        )
        .map_err(py_err(py))?;
        let timing = args::opt_str_arg(timing, "timing")?;
        let gen = timing_generation(timing.as_deref()).map_err(py_err(py))?;
        let mut inner = core::Device::try_with_numerics(cfg).map_err(py_err(py))?;
        inner.set_timing(gen);
        Ok(Device {
            inner: Mutex::new(inner),
            runner: Mutex::new(None),
            holder: AtomicU32::new(0),
        })
    }

    /// The generation whose published constants time runs ("trn1", "trn2" or "trn3").
    #[getter]
    fn timing(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(self.dev(py)?.cost.timing())
    }

    /// The numerics configuration in effect (after environment variables and arguments).
    fn numerics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::info::option_values(py, &self.dev(py)?.numerics)
    }

    /// Write raw bytes (a contiguous uint8 array) at an HBM address.
    fn hbm_write(
        &self,
        py: Python<'_>,
        addr: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let addr: u64 = args::int_arg(addr, "addr")?;
        let data = args::u8_array(data, "hbm_write", "data")?;
        let data = data.try_readonly().map_err(|_| {
            bad_array(
                py,
                "data",
                "array_borrowed",
                "hbm_write cannot read an array borrowed for writing elsewhere",
            )
        })?;
        let s = data.as_slice().map_err(|_| {
            bad_array(
                py,
                "data",
                "array_not_contiguous",
                "hbm_write needs a contiguous uint8 array",
            )
        })?;
        check_hbm(addr, s.len() as u64).map_err(py_err(py))?;
        self.dev(py)?.hbm.try_write(addr, s).map_err(py_err(py))
    }

    /// Zero `nbytes` of HBM at `addr` (no host buffer needed; backed pages are kept for reuse).
    fn hbm_zero(
        &self,
        py: Python<'_>,
        addr: &Bound<'_, PyAny>,
        nbytes: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (addr, nbytes) = (
            args::int_arg(addr, "addr")?,
            args::int_arg(nbytes, "nbytes")?,
        );
        check_hbm(addr, nbytes).map_err(py_err(py))?;
        self.dev(py)?.hbm.zero(addr, nbytes);
        Ok(())
    }

    /// Whether HBM at `addr` holds exactly `data` (compared in place, no copy).
    fn hbm_equals(
        &self,
        py: Python<'_>,
        addr: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let addr: u64 = args::int_arg(addr, "addr")?;
        let data = args::u8_array(data, "hbm_equals", "data")?;
        let data = data.try_readonly().map_err(|_| {
            bad_array(
                py,
                "data",
                "array_borrowed",
                "hbm_equals cannot read an array borrowed for writing elsewhere",
            )
        })?;
        let s = data.as_slice().map_err(|_| {
            bad_array(
                py,
                "data",
                "array_not_contiguous",
                "hbm_equals needs a contiguous uint8 array",
            )
        })?;
        check_hbm(addr, s.len() as u64).map_err(py_err(py))?;
        Ok(self.dev(py)?.hbm.equals(addr, s))
    }

    /// Read `nbytes` raw bytes at an HBM address into a new uint8 array.
    fn hbm_read<'py>(
        &self,
        py: Python<'py>,
        addr: &Bound<'_, PyAny>,
        nbytes: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let (addr, nbytes): (u64, u64) = (
            args::int_arg(addr, "addr")?,
            args::int_arg(nbytes, "nbytes")?,
        );
        check_hbm(addr, nbytes).map_err(py_err(py))?;
        let n = usize::try_from(nbytes).unwrap_or(usize::MAX);
        let mut v = core::error::try_vec(n, 0u8, "an HBM read").map_err(py_err(py))?;
        self.dev(py)?.hbm.read(addr, &mut v);
        Ok(PyArray1::from_vec(py, v))
    }

    /// Read `len(out)` raw bytes at an HBM address into `out`, a contiguous uint8 array (the
    /// host's read-back of a kernel's outputs: numpy allocates large arrays on transparent huge
    /// pages, so a fresh 128 MiB result costs 64 page faults instead of 32768).
    fn hbm_read_into(
        &self,
        py: Python<'_>,
        addr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let addr: u64 = args::int_arg(addr, "addr")?;
        let out = args::u8_array(out, "hbm_read_into", "out")?;
        let mut out = out.try_readwrite().map_err(|_| {
            bad_array(
                py,
                "out",
                "array_not_writeable",
                "hbm_read_into needs a writeable uint8 array (not borrowed elsewhere)",
            )
        })?;
        let s = out.as_slice_mut().map_err(|_| {
            bad_array(
                py,
                "out",
                "array_not_contiguous",
                "hbm_read_into needs a contiguous uint8 array",
            )
        })?;
        check_hbm(addr, s.len() as u64).map_err(py_err(py))?;
        self.dev(py)?.hbm.read(addr, s);
        Ok(())
    }

    /// Instructions and transfers one run may execute before it stops with `RunawayError`
    /// (default 2^26).
    #[getter]
    fn max_executed(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.dev(py)?.max_executed)
    }

    #[setter]
    fn set_max_executed(&self, n: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = n.py();
        let n: u64 = args::int_arg(n, "max_executed")?;
        self.dev(py)?.max_executed = n;
        Ok(())
    }

    /// Host bytes backing HBM (pages touched so far).
    fn hbm_resident_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.dev(py)?.hbm.resident_bytes())
    }

    /// Read the bytes of `parts` partitions of a core's SBUF or PSUM, `nbytes` from `offset`.
    #[allow(clippy::too_many_arguments)]
    fn onchip_read<'py>(
        &self,
        py: Python<'py>,
        core: &Bound<'_, PyAny>,
        mem: &str,
        start: &Bound<'_, PyAny>,
        parts: &Bound<'_, PyAny>,
        offset: &Bound<'_, PyAny>,
        nbytes: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let core = args::int_arg(core, "core")?;
        let (start, parts) = (
            args::int_arg(start, "start")?,
            args::int_arg(parts, "parts")?,
        );
        let (offset, nbytes) = (
            args::int_arg(offset, "offset")?,
            args::int_arg(nbytes, "nbytes")?,
        );
        onchip_bytes(&*self.dev(py)?, core, mem, (start, parts), (offset, nbytes))
            .map(|v| PyArray1::from_vec(py, v))
            .map_err(py_err(py))
    }

    /// Fill every core's SBUF and PSUM with one byte value (e.g. 0xFF = NaN for floats); free
    /// for a memory that holds only that byte already (a core no run has touched since).
    fn fill_onchip(&self, byte: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = byte.py();
        let byte: u8 = args::int_arg(byte, "byte")?;
        for c in &mut self.dev(py)?.cores {
            c.sbuf.fill(byte);
            c.psum.fill(byte);
        }
        Ok(())
    }

    /// Run programs (one per core) concurrently; the GIL is released while the device runs,
    /// re-taken every 25 ms to run signal handlers (Ctrl-C stops the run and raises
    /// `KeyboardInterrupt`) and to call `progress(executed, total, emulated_ps)` if given.
    /// `max_seconds` (None: no limit) and `max_memory` bound the run's host time and memory
    /// (docs/limits.md).
    #[pyo3(signature = (programs, check_races = true, trace = true, progress = None, trace_limit = core::machine::TRACE_LIMIT, identical_writes = false, max_seconds = None, max_memory = core::machine::limits::default_max_memory()))]
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        programs: Vec<PyRef<'py, Program>>,
        check_races: bool,
        trace: bool,
        progress: Option<Py<PyAny>>,
        trace_limit: u64,
        identical_writes: bool,
        max_seconds: Option<f64>,
        max_memory: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let progs: Vec<&core::Program> = programs.iter().map(|p| p.program()).collect();
        // Every `_native.Program` is built by a validating path (Assembler appends, synced,
        // engines::parse_program / decode_program), so the run need not validate again.
        let opts = core::RunOptions {
            check_races,
            trace,
            prevalidated: true,
            trace_limit,
            identical_writes,
            max_seconds,
            max_memory,
        };
        let mut guard = self.dev(py)?;
        let dev = &mut *guard;
        let me = std::thread::current().id();
        *self.runner.lock().unwrap_or_else(PoisonError::into_inner) = Some(me);
        let mut monitor = PyMonitor {
            check: SignalCheck::new(),
            progress,
        };
        // Each program's cached run plan (regions, transfer plans), built at its first run.
        let asms: Vec<&core::asm::Assembler> = programs.iter().map(|p| &p.asm).collect();
        let res = py.detach(|| {
            guarded(|| {
                let mut plans = Vec::with_capacity(asms.len());
                for a in &asms {
                    let mut keep_going = || monitor.check.keep_going(|_| Ok(()));
                    plans.push(Some(a.run_plan_checked(&*dev.cost, &mut keep_going)?));
                }
                dev.run_planned(&progs, &plans, &opts, &mut monitor)
            })
        });
        *self.runner.lock().unwrap_or_else(PoisonError::into_inner) = None;
        drop(guard);
        let res = monitor.check.finish(py, res)?;
        // (keys interned once per process: a new Python string per key per run was ~1,200 host
        // instructions of a one-instruction run)
        let d = PyDict::new(py);
        d.set_item(pyo3::intern!(py, "end_ps"), res.end_ps)?;
        d.set_item(pyo3::intern!(py, "executed"), res.executed)?;
        d.set_item(pyo3::intern!(py, "trace_dropped"), res.trace.dropped)?;
        d.set_item(pyo3::intern!(py, "identical_writes"), res.identical_writes)?;
        // The trace stays in Rust until Python asks for its columns (RunResult.trace).
        d.set_item(
            pyo3::intern!(py, "trace"),
            Py::new(py, RawTrace::new(res.trace))?,
        )?;
        Ok(d)
    }
}
