//! `_native.AccessPattern`: an access-pattern tuple read once. The front ends keep one per view
//! they use again and again (a tile's pattern); `Program.append` takes it wherever it takes the
//! tuple, without reading the tuple's seven items again.

use crate::args;
use pyo3::prelude::*;
use trn3emu_core::memory::Ap;

/// An access pattern, parsed (`access_pattern`); immutable.
#[pyclass(module = "trn3emu._native", frozen)]
pub struct AccessPattern {
    pub(crate) ap: Ap,
}

#[pymethods]
impl AccessPattern {
    /// The same pattern starting `offset` bytes into its rows (another tile of the same kind).
    fn at(&self, offset: u64) -> AccessPattern {
        let mut ap = self.ap.clone();
        ap.offset = offset;
        AccessPattern { ap }
    }

    fn __repr__(&self) -> String {
        format!(
            "<AccessPattern {}>",
            trn3emu_core::isa::text::format_ap(&self.ap)
        )
    }
}

/// The parsed `AccessPattern` of tuple `t`, or `t` itself when it does not parse: `append`
/// then says what is wrong with it, naming the instruction and operand, as for any tuple.
#[pyfunction]
pub fn access_pattern(py: Python<'_>, t: Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    match args::parse_ap(&t) {
        Ok(ap) => Ok(Py::new(py, AccessPattern { ap })?.into_any()),
        Err(_) => Ok(t.unbind()),
    }
}
