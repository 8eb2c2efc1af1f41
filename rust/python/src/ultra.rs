//! `_native.ultra_run`: an UltraServer run over several `_native.Device` chips, with the GIL
//! released; `_native.fabric_params`: the fabric model's numbers.

use crate::device::{Device, PyMonitor};
use crate::errors::{guarded, named, py_err};
use crate::program::Program;
use crate::signals::SignalCheck;
use crate::trace::RawTrace;
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use trn3emu_core as core;
use trn3emu_core::machine::fabric::FabricParams;
use trn3emu_core::machine::ultra::{self, Placed};
use trn3emu_core::machine::ultra_dist;

/// The fabric's numbers as a dict (names as `FabricParams`' fields).
fn params_dict<'py>(py: Python<'py>, p: &FabricParams) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("link_bytes_per_ns", p.link_bytes_per_ns)?;
    d.set_item("ports", p.ports)?;
    d.set_item("latency_ns", p.latency_ns)?;
    d.set_item("onchip_bytes_per_ns", p.onchip_bytes_per_ns)?;
    d.set_item("onchip_latency_ns", p.onchip_latency_ns)?;
    d.set_item("cc_cores", p.cc_cores)?;
    d.set_item("cc_launch_ns", p.cc_launch_ns)?;
    d.set_item("reduce_bytes_per_ns", p.reduce_bytes_per_ns)?;
    d.set_item("mesh_max_bytes", p.mesh_max_bytes)?;
    Ok(d)
}

/// The default NeuronSwitch fabric numbers (docs/ultraserver.md).
#[pyfunction]
pub fn fabric_params(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    params_dict(py, &FabricParams::default())
}

/// Run `programs` (pairs of chip index and program) on the chips `devices` concurrently;
/// returns the run's end, its count, one result dict per chip and the fabric's columns.
#[pyfunction]
#[pyo3(signature = (devices, programs, check_races = true, trace = true, trace_limit = core::machine::TRACE_LIMIT, latency_ns = None, link_bytes_per_ns = None, mesh_max_bytes = None, max_seconds = None, max_memory = core::machine::limits::default_max_memory(), progress = None))]
#[allow(clippy::too_many_arguments)]
pub fn ultra_run<'py>(
    py: Python<'py>,
    devices: Vec<PyRef<'py, Device>>,
    programs: Vec<(u16, PyRef<'py, Program>)>,
    check_races: bool,
    trace: bool,
    trace_limit: u64,
    latency_ns: Option<f64>,
    link_bytes_per_ns: Option<f64>,
    mesh_max_bytes: Option<u64>,
    max_seconds: Option<f64>,
    max_memory: u64,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let placed = placed(&programs);
    let opts = core::RunOptions {
        max_seconds,
        max_memory,
        ..run_options(check_races, trace, trace_limit)
    };
    let params = fabric_from(py, latency_ns, link_bytes_per_ns, mesh_max_bytes)?;
    let mut guards = lock_all(py, &devices)?;
    let mut devs: Vec<&mut core::Device> = guards.iter_mut().map(|g| &mut **g).collect();
    // Ctrl-C and progress as in `Device.run`: the run polls between its time windows.
    let mut monitor = PyMonitor {
        check: SignalCheck::new(),
        progress,
    };
    let res = py.detach(|| {
        guarded(|| ultra::run_monitored(&mut devs, &placed, &opts, params, Some(&mut monitor)))
    });
    drop(guards);
    let res = monitor.check.finish(py, res)?;
    result_dict(py, res, &params)
}

/// Each program with the chip it runs on.
fn placed<'a>(programs: &'a [(u16, PyRef<'_, Program>)]) -> Vec<Placed<'a>> {
    programs
        .iter()
        .map(|(chip, p)| Placed {
            chip: *chip,
            program: p.program(),
        })
        .collect()
}

/// The run options of an UltraServer run (programs built by validating paths).
fn run_options(check_races: bool, trace: bool, trace_limit: u64) -> core::RunOptions {
    core::RunOptions {
        check_races,
        trace,
        prevalidated: true,
        trace_limit,
        ..Default::default()
    }
}

/// The fabric numbers with the caller's overrides (checked).
fn fabric_from(
    py: Python<'_>,
    latency_ns: Option<f64>,
    link_bytes_per_ns: Option<f64>,
    mesh_max_bytes: Option<u64>,
) -> PyResult<FabricParams> {
    let mut params = FabricParams::default();
    for (name, v) in [
        ("latency_ns", latency_ns),
        ("link_bytes_per_ns", link_bytes_per_ns),
    ] {
        let Some(v) = v else { continue };
        if !(v.is_finite() && v > 0.0) {
            let msg = format!(
                "ultra_run: {name} must be a positive finite number of the fabric model, not {v}"
            );
            return Err(named(py, "OperandError", "fabric_param_invalid", name, msg));
        }
        match name {
            "latency_ns" => params.latency_ns = v,
            _ => params.link_bytes_per_ns = v,
        }
    }
    if let Some(v) = mesh_max_bytes {
        params.mesh_max_bytes = v;
    }
    Ok(params)
}

/// Every chip's device, locked in order (waiting for another thread's run on one to end).
fn lock_all<'a>(
    py: Python<'_>,
    devices: &'a [PyRef<'_, Device>],
) -> PyResult<Vec<crate::device::DevGuard<'a>>> {
    check_distinct(py, devices)?;
    devices.iter().map(|d| d.dev(py)).collect()
}

fn check_distinct(py: Python<'_>, devices: &[PyRef<'_, Device>]) -> PyResult<()> {
    // One lock per chip, in order; the same chip twice would wait on itself.
    for (i, a) in devices.iter().enumerate() {
        if devices[..i].iter().any(|b| std::ptr::eq(&**a, &**b)) {
            let msg = format!("ultra_run: chip {i} is the same Device as an earlier chip");
            return Err(named(
                py,
                "OperandError",
                "ultraserver_device_repeated",
                "devices",
                msg,
            ));
        }
    }
    Ok(())
}

/// The run's result as the dict `UltraResult` reads.
fn result_dict<'py>(
    py: Python<'py>,
    res: ultra::UltraResult,
    params: &FabricParams,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("end_ps", res.end_ps)?;
    d.set_item("executed", res.executed)?;
    let chips = pyo3::types::PyList::empty(py);
    for r in res.chips {
        let c = PyDict::new(py);
        c.set_item("end_ps", r.end_ps)?;
        c.set_item("executed", r.executed)?;
        c.set_item("trace_dropped", r.trace.dropped)?;
        c.set_item("trace", Py::new(py, RawTrace::new(r.trace))?)?;
        chips.append(c)?;
    }
    d.set_item("chips", chips)?;
    let m = &res.fabric.messages;
    let msgs = PyDict::new(py);
    macro_rules! col {
        ($d:expr, $name:expr, $src:expr, $f:expr) => {
            $d.set_item(
                $name,
                PyArray1::from_vec(py, $src.iter().map($f).collect::<Vec<_>>()),
            )?
        };
    }
    col!(msgs, "from_chip", m, |x| x.from_chip);
    col!(msgs, "to_chip", m, |x| x.to_chip);
    col!(msgs, "bytes", m, |x| x.bytes);
    col!(msgs, "send_ps", m, |x| x.send_ps);
    col!(msgs, "sent_ps", m, |x| x.sent_ps);
    col!(msgs, "recv_start_ps", m, |x| x.recv_start_ps);
    col!(msgs, "arrive_ps", m, |x| x.arrive_ps);
    col!(msgs, "group", m, |x| x.group);
    let cc = &res.fabric.cc;
    let ccs = PyDict::new(py);
    col!(ccs, "chip", cc, |x| x.chip);
    col!(ccs, "cc", cc, |x| x.cc);
    col!(ccs, "core", cc, |x| x.core);
    col!(ccs, "opcode", cc, |x| x.opcode as u16);
    col!(ccs, "start_ps", cc, |x| x.start_ps);
    col!(ccs, "end_ps", cc, |x| x.end_ps);
    col!(ccs, "group", cc, |x| x.group);
    d.set_item("messages", msgs)?;
    d.set_item("cc", ccs)?;
    d.set_item("params", params_dict(py, params)?)?;
    Ok(d)
}

/// One process's part of an UltraServer run spread over processes: it is process `me` of
/// `procs`, chip c belongs to process `owner[c]`; `exchange(data, counts) -> (data, counts)` is
/// an all-to-all over the processes (e.g. MPI's): `data` (a uint8 array) holds this process's
/// message for every process in order (`counts` bytes each), and it returns every process's
/// message for this one the same way. It is called at every window boundary
/// (docs/ultraserver.md, "Several processes"). Returns what `ultra_run` returns, with results
/// for the owned chips only.
#[pyfunction]
#[pyo3(signature = (devices, programs, owner, me, procs, exchange, check_races = true, trace = true, trace_limit = core::machine::TRACE_LIMIT, latency_ns = None, link_bytes_per_ns = None, mesh_max_bytes = None))]
#[allow(clippy::too_many_arguments)]
pub fn ultra_run_dist<'py>(
    py: Python<'py>,
    devices: Vec<PyRef<'py, Device>>,
    programs: Vec<(u16, PyRef<'py, Program>)>,
    owner: Vec<usize>,
    me: usize,
    procs: usize,
    exchange: Bound<'py, PyAny>,
    check_races: bool,
    trace: bool,
    trace_limit: u64,
    latency_ns: Option<f64>,
    link_bytes_per_ns: Option<f64>,
    mesh_max_bytes: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let placed = placed(&programs);
    let opts = run_options(check_races, trace, trace_limit);
    let params = fabric_from(py, latency_ns, link_bytes_per_ns, mesh_max_bytes)?;
    let mut guards = lock_all(py, &devices)?;
    let mut devs: Vec<&mut core::Device> = guards.iter_mut().map(|g| &mut **g).collect();
    let ex = exchange.unbind();
    let mut failed: Option<PyErr> = None;
    let mut call = |msgs: ultra_dist::Msgs| -> core::error::Result<ultra_dist::Msgs> {
        Python::attach(|py| {
            let out = all_to_all(py, &ex, msgs);
            out.map_err(|e| {
                let msg = format!("the exchange between processes failed: {e}");
                failed = Some(e);
                core::error::fail(
                    core::error::ErrorKind::Distributed,
                    "ultra_dist_exchange_failed",
                    msg,
                )
            })
        })
    };
    let procs = ultra_dist::Procs {
        me,
        count: procs,
        owner: &owner,
    };
    let res = py.detach(|| {
        guarded(|| ultra_dist::run(&mut devs, &placed, &opts, params, &procs, &mut call))
    });
    if let Some(e) = failed {
        return Err(e);
    }
    let res = res.map_err(py_err(py))?;
    result_dict(py, res, &params)
}

/// Call the Python all-to-all with the messages (handed over as a numpy array, not copied)
/// and their sizes, and copy out what it returns: a buffer and its messages' sizes.
fn all_to_all(
    py: Python<'_>,
    ex: &Py<PyAny>,
    msgs: ultra_dist::Msgs,
) -> PyResult<ultra_dist::Msgs> {
    let data = PyArray1::from_vec(py, msgs.data);
    let got = ex.bind(py).call1((data, msgs.counts))?;
    let (buf, counts): (PyReadonlyArray1<u8>, Vec<usize>) = got.extract()?;
    Ok(ultra_dist::Msgs {
        data: buf.as_slice()?.to_vec(),
        counts,
    })
}
