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

/// What a run started from, to check its limits against.
pub struct Limits {
    deadline: Option<(Instant, f64)>,
    max_memory: u64,
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
            max_memory: opts.max_memory,
            hbm_at_start: hbm.resident_bytes(),
        }
    }

    /// The wall-time limit (a `RunawayError`, rule `run_time_limit`) and the host memory the
    /// run's HBM writes have added (a `ResourceError`, rule `run_memory_limit`).
    pub fn check(&self, hbm: &Hbm, executed: u64) -> Result<()> {
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
        let grown = hbm.resident_bytes().saturating_sub(self.hbm_at_start);
        if grown > self.max_memory {
            return Err(fail(
                ErrorKind::Resource,
                "run_memory_limit",
                format!(
                    "the run's HBM writes back {grown} bytes of new host memory, over its limit of {} bytes; RunOptions::max_memory (Python: Device.run(max_memory=)) sets the limit",
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
