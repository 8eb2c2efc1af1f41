//! Facts the Python layer reads instead of copying: hardware constants, numerics options,
//! the ISA opcode table and the default cost model's numbers. All defined in the core.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use trn3emu_core as core;
use trn3emu_core::numerics::config::{NumericsConfig, OptionValue, OPTIONS};

/// Hardware and emulator constants, exported as module attributes and by `constants()`.
pub const CONSTANTS: &[(&str, u64)] = {
    use core::isa::instr::{MAX_SYNC, NUM_REGISTERS, NUM_SEMAPHORES};
    use core::memory::*;
    &[
        ("NUM_CORES", core::machine::NUM_CORES as u64),
        ("PARTITIONS", PARTITIONS as u64),
        ("SBUF_PARTITION_BYTES", SBUF_PART_BYTES as u64),
        ("PSUM_PARTITION_BYTES", PSUM_PART_BYTES as u64),
        ("PSUM_BANK_BYTES", PSUM_BANK_BYTES as u64),
        ("PSUM_BANKS", PSUM_BANKS as u64),
        ("HBM_BYTES", HBM_BYTES),
        ("NUM_SEMAPHORES", NUM_SEMAPHORES as u64),
        // Semaphores from here up are reserved for automatic synchronisation.
        (
            "AUTO_SEM_BASE",
            core::machine::autosync::AUTO_SEM_BASE as u64,
        ),
        ("NUM_REGISTERS", NUM_REGISTERS as u64),
        ("MAX_SYNC", MAX_SYNC as u64),
        ("MAX_FREE_DIMS", core::memory::ap::MAX_FREE_DIMS as u64),
        ("CHIPLETS", core::hw::CHIPLETS as u64),
        ("HBM_STACKS", core::hw::HBM_STACKS as u64),
        ("HBM_INTERLEAVE_BYTES", core::hw::HBM_INTERLEAVE_BYTES),
        ("MAX_CHIPS", core::hw::MAX_CHIPS as u64),
    ]
};

/// Add `CONSTANTS` and `STREAMS` (the engine streams of a core, in trace unit order) to the module.
pub fn add_constants(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for (name, value) in CONSTANTS {
        m.add(*name, *value)?;
    }
    let streams: Vec<&str> = core::machine::STREAMS.iter().map(|e| e.name()).collect();
    m.add("STREAMS", pyo3::types::PyTuple::new(m.py(), streams)?)?;
    Ok(())
}

/// The hardware constants as a dict (the same values as the module attributes).
#[pyfunction]
pub fn constants<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, value) in CONSTANTS {
        d.set_item(*name, *value)?;
    }
    Ok(d)
}

fn value_to_py<'py>(py: Python<'py>, v: OptionValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        OptionValue::Name(s) => s.into_pyobject(py)?.into_any(),
        OptionValue::Int(i) => i.into_pyobject(py)?.into_any(),
    })
}

/// `{option: value}` of a numerics configuration.
pub fn option_values<'py>(py: Python<'py>, cfg: &NumericsConfig) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, v) in cfg.values() {
        d.set_item(name, value_to_py(py, v)?)?;
    }
    Ok(d)
}

/// Every numerics option of `Device(...)`: `{name: {"default", "values" (names, or None for
/// an integer), "min", "max", "env" (the Neuron runtime variable or None), "doc"}}`.
#[pyfunction]
pub fn numerics_options<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let defaults = NumericsConfig::default().values();
    let out = PyDict::new(py);
    for o in OPTIONS {
        let d = PyDict::new(py);
        let default = defaults.iter().find(|(n, _)| *n == o.name).map(|x| x.1);
        match default {
            Some(v) => d.set_item("default", value_to_py(py, v)?)?,
            None => d.set_item("default", py.None())?,
        }
        if o.values.is_empty() {
            d.set_item("values", py.None())?;
            d.set_item("min", o.min)?;
            d.set_item("max", o.max)?;
        } else {
            d.set_item("values", PyList::new(py, o.values)?)?;
            d.set_item("min", py.None())?;
            d.set_item("max", py.None())?;
        }
        d.set_item("env", o.env)?;
        d.set_item("doc", o.doc)?;
        out.set_item(o.name, d)?;
    }
    Ok(out)
}

/// A generation's cost-model numbers the trace reports compare against (docs/cost-model.md):
/// `timing` names the generation (default trn3).
#[pyfunction]
#[pyo3(signature = (timing = None))]
pub fn cost_params<'py>(py: Python<'py>, timing: Option<&str>) -> PyResult<Bound<'py, PyDict>> {
    use core::cost::*;
    let g = match timing {
        Some(t) => core::timing::generation(t).map_err(crate::errors::py_err(py))?,
        None => core::timing::default_generation(),
    };
    let d = PyDict::new(py);
    let p = DmaParams::of(g);
    d.set_item("timing", g.name)?;
    d.set_item("neuron_core", g.core)?;
    d.set_item("tensor_ghz", g.tensor_ghz)?;
    d.set_item("vector_ghz", g.vector_ghz)?;
    d.set_item("scalar_ghz", g.scalar_ghz)?;
    d.set_item("gpsimd_ghz", g.gpsimd_ghz)?;
    d.set_item("engine_ghz", g.scalar_ghz)?;
    d.set_item("peak_tflops_bf16", g.peak_tflops_bf16)?;
    d.set_item("peak_tflops_mx", g.peak_tflops_fp8)?;
    d.set_item("peak_tflops_fp32", g.peak_tflops_fp32)?;
    d.set_item("peak_tflops_sparse", g.peak_tflops_sparse)?;
    d.set_item("peak_tflops_vector", g.peak_tflops_vector)?;
    d.set_item("sem_latency_ns", SEM_LATENCY_NS)?;
    d.set_item("dma_engines", p.engines)?;
    d.set_item("dma_queues", p.queues)?;
    d.set_item("dma_partitions_per_engine", p.partitions_per_engine)?;
    d.set_item("dma_engine_bytes_per_ns", p.engine_bytes_per_ns)?;
    d.set_item("dma_sustained", p.sustained)?;
    d.set_item("dma_fixed_ns", p.fixed_ns)?;
    d.set_item("dma_descriptor_ns", p.descriptor_ns)?;
    d.set_item("dma_descriptor_min_ns", p.descriptor_min_ns)?;
    d.set_item("hbm_bytes_per_ns", p.hbm_bytes_per_ns)?;
    d.set_item("dma_priorities", p.priorities)?;
    d.set_item(
        "timings",
        PyList::new(py, core::timing::GENERATIONS.iter().map(|g| g.name))?,
    )?;
    Ok(d)
}

/// The HBM stack (0..4) holding byte `addr`: chiplet 0's stacks 0 and 1 hold the lower half of
/// the address space, chiplet 1's stacks 2 and 3 the upper half, alternating every
/// `HBM_INTERLEAVE_BYTES` (an estimate: docs/cost-model.md, "Dual-chiplet locality").
#[pyfunction]
pub fn hbm_stack(addr: u64) -> u32 {
    core::hw::hbm_stack(addr)
}

/// `(opcode, name)` of every instruction, in opcode order.
#[pyfunction]
pub fn isa_opcodes<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
    let items: Vec<(u16, &str)> = core::isa::tables::INSTRUCTIONS
        .iter()
        .map(|s| (s.opcode as u16, s.name))
        .collect();
    PyList::new(py, items)
}
