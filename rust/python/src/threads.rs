//! Host threading and SIMD path controls (speed only; results are the same bits).

use crate::errors::to_py;
use pyo3::prelude::*;
use trn3emu_core as core;
use trn3emu_core::error::fail;
use trn3emu_core::ErrorKind;

/// Host threads the kernels use (`TRN3EMU_NUM_THREADS`, else every core, unless set).
#[pyfunction]
pub fn get_num_threads() -> usize {
    core::par::num_threads()
}

/// Set the host thread count for later runs (0 restores the default). Results are the same
/// bits for every count.
#[pyfunction]
pub fn set_num_threads(n: usize) {
    core::par::set_num_threads(n)
}

/// Testing hook: instructions with at least `n` operations are split across threads (0: the
/// default threshold). Speed only, never bits.
#[pyfunction]
pub fn set_min_parallel_work(n: usize) {
    core::par::set_min_parallel_work(n)
}

/// The SIMD path the kernels take ("avx512", "avx2+fma" or "portable").
#[pyfunction]
pub fn simd_path() -> &'static str {
    core::kernels::simd::path_name()
}

/// Tests: limit the kernels to a SIMD path ("avx512", "avx2+fma", "portable"; None: the
/// host's best). Returns whether the host can run that path (if not, the limit still applies
/// and the next narrower supported path runs).
#[pyfunction]
#[pyo3(signature = (path = None))]
pub fn limit_simd(py: Python<'_>, path: Option<&str>) -> PyResult<bool> {
    let p = match path {
        None => None,
        Some(name) => Some(core::kernels::simd::parse(name).ok_or_else(|| {
            to_py(
                py,
                fail(
                    ErrorKind::Value,
                    "unknown_simd_path",
                    format!("SIMD path must be 'avx512', 'avx2+fma' or 'portable', got {name:?}"),
                )
                .operand("path"),
            )
        })?),
    };
    core::kernels::simd::set_limit(p);
    Ok(p.is_none_or(core::kernels::simd::host_supports))
}
