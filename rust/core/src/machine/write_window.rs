//! The on-chip bytes a run may write, declared to SBUF / PSUM before it starts so that
//! resetting a device afterwards (`OnChip::fill`, between kernel launches) rewrites only them
//! instead of all 34 MiB of every core that ran.
//!
//! A core's window is the union, over the instructions of its programs, of the partition-offset
//! byte ranges of their written on-chip operands: the same footprints the race checks rely on
//! (an instruction writes nothing outside its written operands). An operand whose place is only
//! known while running (dynamic or indirect offsets) leaves the window undeclared: every mutable
//! view then dirties the whole memory, as without a window.

use super::Device;
use crate::isa::Program;
use crate::memory::{Ap, Mem};

/// Union of byte ranges; `None` = unknown (anything may be written).
#[derive(Clone, Copy)]
enum Window {
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

    fn declared(self) -> Option<(usize, usize)> {
        match self {
            Window::Empty => Some((0, 0)),
            Window::Range(a, b) => Some((a, b)),
            Window::Unknown => None,
        }
    }
}

/// SBUF and PSUM windows of `core` over the programs that run on it.
fn windows(programs: &[&Program], core: usize) -> (Window, Window) {
    let (mut sbuf, mut psum) = (Window::Empty, Window::Empty);
    for p in programs.iter().filter(|p| p.core as usize == core) {
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
    }
    (sbuf, psum)
}

/// Declare every core's windows for a run of `programs` (cores with no program: empty).
pub(super) fn declare(dev: &mut Device, programs: &[&Program]) {
    for (c, core) in dev.cores.iter_mut().enumerate() {
        let (s, p) = windows(programs, c);
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
