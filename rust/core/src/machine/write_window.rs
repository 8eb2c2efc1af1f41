//! The on-chip bytes a run may write, declared to SBUF / PSUM before it starts so that
//! resetting a device afterwards (`OnChip::fill`, between kernel launches) rewrites only them
//! instead of all 34 MiB of every core that ran.
//!
//! A core's window is the union, over the instructions of its programs, of the partition-offset
//! byte ranges of their written on-chip operands: the same footprints the race checks rely on
//! (an instruction writes nothing outside its written operands). An operand whose place is only
//! known while running (dynamic or indirect offsets) leaves the window undeclared: every mutable
//! view then dirties the whole memory, as without a window.

use std::sync::Arc;

use super::run_plan::RunPlan;
use super::Device;
use crate::isa::Program;
use crate::memory::{Ap, Mem};

/// Union of byte ranges; `None` = unknown (anything may be written).
#[derive(Clone, Copy, Debug)]
pub(super) enum Window {
    Empty,
    Range(usize, usize),
    Unknown,
}

impl Window {
    fn add(self, ap: &Ap) -> Window {
        if ap.dynamic.is_some() {
            return Window::Unknown;
        }
        let (lo, hi) = ap.row_byte_range();
        let (lo, hi) = (ap.offset as i128 + lo, ap.offset as i128 + hi);
        if lo < 0 || hi > usize::MAX as i128 {
            return Window::Unknown;
        }
        let (lo, hi) = (lo as usize, hi as usize);
        match self {
            Window::Empty => Window::Range(lo, hi),
            Window::Range(a, b) => Window::Range(a.min(lo), b.max(hi)),
            Window::Unknown => Window::Unknown,
        }
    }

    fn union(self, o: Window) -> Window {
        match (self, o) {
            (Window::Unknown, _) | (_, Window::Unknown) => Window::Unknown,
            (Window::Empty, x) | (x, Window::Empty) => x,
            (Window::Range(a, b), Window::Range(c, d)) => Window::Range(a.min(c), b.max(d)),
        }
    }

    fn declared(self) -> Option<(usize, usize)> {
        match self {
            Window::Empty => Some((0, 0)),
            Window::Range(a, b) => Some((a, b)),
            Window::Unknown => None,
        }
    }
}

/// SBUF and PSUM windows of one program (kept in its `RunPlan`).
pub(super) fn of_program(p: &Program) -> (Window, Window) {
    let (mut sbuf, mut psum) = (Window::Empty, Window::Empty);
    for ins in &p.instrs {
        for (_, _, access, ap) in ins.tensors() {
            if !access.writes() {
                continue;
            }
            match ap.mem {
                Mem::Sbuf => sbuf = sbuf.add(ap),
                Mem::Psum => psum = psum.add(ap),
                Mem::Hbm => {}
            }
        }
    }
    (sbuf, psum)
}

/// Declare every core's windows for a run of `programs` (`plans[i]` that of `programs[i]`;
/// cores with no program: empty).
pub(super) fn declare(dev: &mut Device, programs: &[&Program], plans: &[Arc<RunPlan>]) {
    for (c, core) in dev.cores.iter_mut().enumerate() {
        let (mut s, mut p) = (Window::Empty, Window::Empty);
        for (prog, plan) in programs.iter().zip(plans) {
            if prog.core as usize == c {
                s = s.union(plan.windows.0);
                p = p.union(plan.windows.1);
            }
        }
        core.sbuf.set_write_window(s.declared());
        core.psum.set_write_window(p.declared());
    }
}

/// After the run: mutable views outside runs dirty the whole memory again.
pub(super) fn clear(dev: &mut Device) {
    for core in &mut dev.cores {
        core.sbuf.set_write_window(None);
        core.psum.set_write_window(None);
    }
}
