//! Python bindings: argument conversion, error mapping, GIL release. No semantics live here:
//! the assembler's rules are `trn3emu_core::asm`, the numerics options
//! `trn3emu_core::numerics::config`, the constants the core's own.

mod args;
mod call;
mod device;
mod errors;
mod info;
mod numerics;
mod pattern;
mod program;
mod signals;
mod threads;
mod trace;
mod ultra;
mod view;

use pyo3::prelude::*;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<device::Device>()?;
    m.add_class::<program::Program>()?;
    m.add_class::<pattern::AccessPattern>()?;
    m.add_function(wrap_pyfunction!(pattern::access_pattern, m)?)?;
    m.add_class::<call::CallPlan>()?;
    m.add_function(wrap_pyfunction!(view::view_geometry, m)?)?;
    m.add_class::<program::RangeAllocator>()?;
    m.add_class::<trace::RawTrace>()?;
    m.add_function(wrap_pyfunction!(numerics::convert_from_f32, m)?)?;
    m.add_function(wrap_pyfunction!(numerics::convert_to_f32, m)?)?;
    m.add_function(wrap_pyfunction!(info::isa_opcodes, m)?)?;
    m.add_function(wrap_pyfunction!(info::cost_params, m)?)?;
    m.add_function(wrap_pyfunction!(info::hbm_stack, m)?)?;
    m.add_function(wrap_pyfunction!(info::constants, m)?)?;
    m.add_function(wrap_pyfunction!(info::numerics_options, m)?)?;
    m.add_function(wrap_pyfunction!(threads::get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(threads::set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(threads::set_min_parallel_work, m)?)?;
    m.add_function(wrap_pyfunction!(threads::simd_path, m)?)?;
    m.add_function(wrap_pyfunction!(threads::limit_simd, m)?)?;
    m.add_function(wrap_pyfunction!(ultra::ultra_run, m)?)?;
    m.add_function(wrap_pyfunction!(ultra::ultra_run_dist, m)?)?;
    m.add_function(wrap_pyfunction!(ultra::fabric_params, m)?)?;
    info::add_constants(m)
}
