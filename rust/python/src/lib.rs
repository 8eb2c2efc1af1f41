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

/// mimalloc returns freed pages to the OS `purge_delay` ms after they are freed (1 s by default).
/// The emulator frees and reallocates the same buffers all the time (a trace's program and its
/// synced copy, a run's plans, HBM reads): with 1 s, back-to-back traces of the flash-attention
/// kernel paged their memory back in, 100-1,200 page faults per trace (some of them 2 MiB pages
/// the kernel zeroes), 6 with 10 s; a legacy RoPE trace + run 2,300-3,200 faults, 200-1,100.
/// Freed memory goes back to the OS after 10 s instead; `MIMALLOC_PURGE_DELAY` (or its old name)
/// in the environment wins.
fn keep_freed_pages_longer() {
    unsafe extern "C" {
        fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    }
    /// `mi_option_purge_delay` in mimalloc.h's `mi_option_e` (the same in mimalloc v2 and v3)
    const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;
    let set_by_user = ["MIMALLOC_PURGE_DELAY", "MIMALLOC_RESET_DELAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    if !set_by_user {
        // SAFETY: mimalloc's options may be set at any time from any thread (atomic stores).
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    keep_freed_pages_longer();
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
