//! Per-run limits on wall time and host memory (`RunOptions::max_seconds`, `max_memory`),
//! checked by the scheduler every `POLL_EVERY` executed items. The step limit
//! (`Device::max_executed`) is the scheduler's own; docs/limits.md lists them all.

use std::time::{Duration, Instant};

use crate::error::{fail, ErrorKind, Result};
use crate::memory::hbm::Hbm;

use super::RunOptions;

/// Upper bound of the default `RunOptions::max_memory`: 32 GiB of host memory a run may add
/// (HBM pages it backs) or take in one buffer sized by its operands (e.g. a DMA's staging buffer).
pub const MAX_MEMORY: u64 = 32 << 30;

/// The default `RunOptions::max_memory`: `MAX_MEMORY`, or half the host's physical memory where
/// that is less (Linux `/proc/meminfo`), so that by default a run is refused with an error before
/// the host's out-of-memory killer would end the process (Linux overcommits: a reservation alone
/// does not fail).
pub fn default_max_memory() -> u64 {
    static V: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *V.get_or_init(|| host_memory_bytes().map_or(MAX_MEMORY, |m| MAX_MEMORY.min(m / 2)))
}

fn host_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Operand bytes that count as one more unit of work in the step budget
/// (`Device::max_executed`): an item costs `1 + bytes / WORK_BYTES` units (`work_units`). One
/// unit is about the host time of the smallest instruction (~0.2 us), and the engines and DMA
/// copies move roughly 512 bytes in that time, so the default budget of 2^26 units lasts some
/// 15 s of host time whatever the loop does (a loop of 128 KiB DMAs used to take ~25 minutes to
/// reach 2^26 items).
pub const WORK_BYTES: u64 = 2048;

/// Units of work of an item whose operands (or transfer) touch `bytes` bytes.
pub fn work_units(bytes: u64) -> u32 {
    u32::try_from(1 + bytes / WORK_BYTES).unwrap_or(u32::MAX)
}

/// Address space a run may still take under an `RLIMIT_AS` cap (`ulimit -v`): three quarters
/// of what the process has left, so the run stops with `run_memory_limit` while the host's
/// other allocations (Python, numpy, the allocator's slack) still succeed, instead of the
/// process aborting on a failed allocation. `u64::MAX` without a cap (one `getrlimit` call).
pub fn address_space_room() -> u64 {
    let Some(cap) = address_space_cap() else {
        return u64::MAX;
    };
    let used = address_space_used().unwrap_or(0);
    cap.saturating_sub(used) / 4 * 3
}

#[cfg(target_os = "linux")]
fn address_space_cap() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the struct we pass.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

#[cfg(not(target_os = "linux"))]
fn address_space_cap() -> Option<u64> {
    None
}

/// The process's address space now (`/proc/self/statm`, first field, in pages).
#[cfg(target_os = "linux")]
fn address_space_used() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.checked_mul(u64::try_from(page).ok()?)
}

#[cfg(not(target_os = "linux"))]
fn address_space_used() -> Option<u64> {
    None
}

/// What a run started from, to check its limits against.
pub struct Limits {
    deadline: Option<(Instant, f64)>,
    /// The run's memory limit: `RunOptions::max_memory`, lowered to what an address-space cap
    /// leaves (`address_space_room`).
    max_memory: u64,
    /// `RunOptions::max_memory` as asked.
    asked: u64,
    hbm_at_start: u64,
}

impl Limits {
    pub fn start(opts: &RunOptions, hbm: &Hbm) -> Limits {
        let deadline = opts
            .max_seconds
            .filter(|s| s.is_finite() && *s >= 0.0)
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .and_then(|d| Instant::now().checked_add(d))
            .zip(opts.max_seconds);
        Limits {
            deadline,
            max_memory: opts.max_memory.min(address_space_room()),
            asked: opts.max_memory,
            hbm_at_start: hbm.resident_bytes(),
        }
    }

    /// The wall-time limit (a `RunawayError`, rule `run_time_limit`) and the host memory the
    /// run has added: HBM pages its writes backed plus `held` bytes of the run's own state
    /// (trace, race logs, queues; a `ResourceError`, rule `run_memory_limit`).
    pub fn check(&self, hbm: &Hbm, executed: u64, held: u64) -> Result<()> {
        if let Some((at, secs)) = self.deadline {
            if Instant::now() >= at {
                return Err(fail(
                    ErrorKind::Runaway,
                    "run_time_limit",
                    format!(
                        "stopped after {secs} s of host time ({executed} executed instructions); RunOptions::max_seconds (Python: Device.run(max_seconds=)) sets the limit"
                    ),
                ));
            }
        }
        if hbm.alloc_failed() {
            // A write could not back an HBM page: stop now (the run reports the failure).
            return Err(fail(
                ErrorKind::Resource,
                "host_allocation_failed",
                "cannot allocate host memory for a page of HBM",
            ));
        }
        let pages = hbm.resident_bytes().saturating_sub(self.hbm_at_start);
        let grown = pages.saturating_add(held);
        if grown > self.max_memory {
            let why = if self.max_memory < self.asked {
                format!(
                    " (the address-space limit, RLIMIT_AS / ulimit -v, leaves the run {} bytes)",
                    self.max_memory
                )
            } else {
                String::new()
            };
            return Err(fail(
                ErrorKind::Resource,
                "run_memory_limit",
                format!(
                    "the run holds {grown} bytes of new host memory ({pages} in HBM pages its writes backed, {held} in its trace, race logs and queues), over its limit of {} bytes{why}; RunOptions::max_memory (Python: Device.run(max_memory=)) sets the limit",
                    self.max_memory
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_memory_limit_is_half_the_host_at_most_32_gib() {
        let d = super::default_max_memory();
        assert!(d <= super::MAX_MEMORY && d > 0);
        if let Ok(info) = std::fs::read_to_string("/proc/meminfo") {
            // MemTotal in kB, read independently of host_memory_bytes.
            let kb: u64 = info
                .split('\n')
                .filter_map(|l| l.strip_prefix("MemTotal:"))
                .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap())
                .next()
                .unwrap();
            assert_eq!(d, (kb * 1024 / 2).min(32 << 30));
        }
    }
}
