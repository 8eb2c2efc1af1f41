//! Ctrl-C while the GIL is released: long native work (a device run, automatic
//! synchronisation) asks `SignalCheck::keep_going` now and then; every `EVERY` of host time it
//! takes the GIL and runs Python's signal handlers. An exception from a handler (Ctrl-C:
//! `KeyboardInterrupt`) stops the work, and `finish` raises it once the core has stopped.

use crate::errors::py_err;
use pyo3::prelude::*;
use std::time::{Duration, Instant};
use trn3emu_core as core;

/// How often long native work re-takes the GIL.
pub const EVERY: Duration = Duration::from_millis(25);

pub struct SignalCheck {
    last: Instant,
    error: Option<PyErr>,
}

impl SignalCheck {
    pub fn new() -> Self {
        SignalCheck {
            last: Instant::now(),
            error: None,
        }
    }

    /// Whether the work may go on. Cheap (a clock read) until `EVERY` has passed since the last
    /// look; then, with the GIL, the pending signal handlers run, then `then` (a progress
    /// callback); an exception from either is kept and the answer is false.
    pub fn keep_going(&mut self, then: impl FnOnce(Python<'_>) -> PyResult<()>) -> bool {
        let now = Instant::now();
        if now.duration_since(self.last) < EVERY {
            return true;
        }
        self.last = now;
        match Python::attach(|py| py.check_signals().and_then(|()| then(py))) {
            Ok(()) => true,
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }

    /// The work's result for Python: the kept exception if there is one (even when the work
    /// finished anyway: the signal handler has run, its exception must not be lost).
    pub fn finish<T>(self, py: Python<'_>, r: core::Result<T>) -> PyResult<T> {
        match self.error {
            Some(e) => Err(e),
            None => r.map_err(py_err(py)),
        }
    }
}
