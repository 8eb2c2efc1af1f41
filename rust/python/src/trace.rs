//! `_native.RawTrace`: a run's trace held natively; numpy columns are built on demand.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use trn3emu_core as core;

/// A run's trace, held natively; `columns()` builds the numpy columns on demand.
#[pyclass(module = "trn3emu._native", frozen)]
pub struct RawTrace {
    inner: core::trace::Trace,
}

impl RawTrace {
    pub fn new(inner: core::trace::Trace) -> Self {
        RawTrace { inner }
    }
}

/// `dict[name] = numpy array of f(record) for every record`.
macro_rules! col {
    ($py:expr, $d:expr, $name:expr, $src:expr, $f:expr) => {
        $d.set_item(
            $name,
            PyArray1::from_vec($py, $src.iter().map($f).collect::<Vec<_>>()),
        )?
    };
}

#[pymethods]
impl RawTrace {
    /// The trace as a dict of numpy columns (records, plus `sems` and `dma_spans` sub-dicts).
    /// `unit` numbers the streams (`STREAMS` order), then their DMA queues.
    fn columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let recs = &self.inner.records;
        let streams = core::machine::STREAMS.len() as u8;
        let cols = PyDict::new(py);
        col!(py, cols, "core", recs, |r| r.core);
        col!(py, cols, "unit", recs, |r| match r.unit {
            core::trace::Unit::Engine(e) => e,
            core::trace::Unit::DmaQueue(q) => streams + q,
        });
        col!(py, cols, "index", recs, |r| r.index);
        col!(py, cols, "opcode", recs, |r| r.opcode as u16);
        col!(py, cols, "start_ps", recs, |r| r.start_ps);
        col!(py, cols, "end_ps", recs, |r| r.end_ps);
        col!(py, cols, "bytes", recs, |r| r.bytes);
        col!(py, cols, "flops", recs, |r| r.flops);
        col!(py, cols, "hbm_bytes", recs, |r| r.hbm_bytes);
        col!(py, cols, "priority", recs, |r| r.priority);
        col!(py, cols, "dma_engines", recs, |r| r.dma_engines);
        col!(py, cols, "w_mem", recs, |r| r.write.mem);
        col!(py, cols, "w_p0", recs, |r| r.write.p0);
        col!(py, cols, "w_p1", recs, |r| r.write.p1);
        col!(py, cols, "w_lo", recs, |r| r.write.lo);
        col!(py, cols, "w_hi", recs, |r| r.write.hi);
        cols.set_item("sems", self.sems(py)?)?;
        cols.set_item("dma_spans", self.dma_spans(py)?)?;
        cols.set_item("schema_version", core::trace::SCHEMA_VERSION)?;
        cols.set_item("timing", self.inner.timing)?;
        Ok(cols)
    }
}

impl RawTrace {
    fn sems<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let ev = &self.inner.sems;
        let d = PyDict::new(py);
        col!(py, d, "core", ev, |e| e.core);
        col!(py, d, "sem", ev, |e| e.sem);
        col!(py, d, "wait", ev, |e| e.wait);
        col!(py, d, "value", ev, |e| e.value);
        col!(py, d, "time_ps", ev, |e| e.time_ps);
        col!(py, d, "record", ev, |e| e.record);
        col!(py, d, "by", ev, |e| e.by);
        Ok(d)
    }

    fn dma_spans<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let sp = &self.inner.dma_spans;
        let d = PyDict::new(py);
        col!(py, d, "core", sp, |e| e.core);
        col!(py, d, "engine", sp, |e| e.engine);
        col!(py, d, "start_ps", sp, |e| e.start_ps);
        col!(py, d, "end_ps", sp, |e| e.end_ps);
        col!(py, d, "bytes", sp, |e| e.bytes);
        col!(py, d, "record", sp, |e| e.record);
        Ok(d)
    }
}
