//! The host memory of one instruction's buffers, checked before it runs (issue 18).
//!
//! Compute engines hold their operands as host vectors (`f32` / `u32` values, converted
//! copies, results) allocated in many places. An on-chip pattern is bounded by the emulator's
//! pattern limits (`memory::ap::MAX_ELEMENTS`, 2^30 elements), not by SBUF's size: a step-0
//! (broadcast) pattern over one 256-byte row can name 2^30 elements, 4 GiB per buffer. Rather
//! than thread a `Result` through every allocation, an instruction whose on-chip operands name
//! more than `CHECK_ABOVE` elements first asks the host for what its buffers can take at most
//! (`BYTES_PER_ELEMENT` per operand element): an error instead of an abort when the host (an
//! `RLIMIT_AS` cap) or the run's `max_memory` cannot give it. HBM operands are DMA operands,
//! whose staging buffers are allocated fallibly where they are made (`try_gather`, `try_vec`).

use crate::error::Result;
use crate::isa::{Arg, Instr};
use crate::memory::Mem;

/// On-chip operand elements an instruction may name before its buffers are checked: a full
/// SBUF of f32 (128 partitions x 64 Ki elements) and more. Below it the buffers are at most a
/// few times SBUF's 32 MiB and the check is skipped (it is on every instruction's path).
pub const CHECK_ABOVE: usize = 1 << 23;

/// Host bytes an instruction's buffers take at most per on-chip operand element: the value as
/// `f32`/`u32` (4 bytes) and one converted or intermediate copy (4 bytes). Results are counted
/// through their own (destination) operand.
pub const BYTES_PER_ELEMENT: u128 = 8;

/// `Ok` if `ins` is small or the host can give its buffers; else a `Resource` error.
#[inline]
pub fn check(ins: &Instr) -> Result<()> {
    let elems = onchip_elements(ins);
    if elems > CHECK_ABOVE {
        return check_large(elems);
    }
    Ok(())
}

/// Whether `check` passes `ins` without asking the host (its operands name few elements).
pub fn small(ins: &Instr) -> bool {
    onchip_elements(ins) <= CHECK_ABOVE
}

/// Elements `ins`'s on-chip operands name.
#[inline]
fn onchip_elements(ins: &Instr) -> usize {
    let mut elems = 0usize;
    for a in &ins.args {
        if let Arg::Tensor(ap) = a {
            if ap.mem != Mem::Hbm {
                elems = elems.saturating_add(ap.num_elements());
            }
        }
    }
    elems
}

#[cold]
#[inline(never)]
fn check_large(elems: usize) -> Result<()> {
    crate::error::check_host_bytes(
        elems as u128 * BYTES_PER_ELEMENT,
        &format!("the buffers of an instruction whose on-chip operands name {elems} elements"),
    )
}
