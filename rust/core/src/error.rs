//! One error type for the whole core. Its `kind` selects the Python exception class, its `rule`
//! is a stable snake_case id (listed in docs/errors.md) that tests and users match on; the
//! message names the instruction (when there is one), the operand and the broken rule in prose.

use std::fmt;

/// What went wrong, coarse enough to map one-to-one onto the Python exception hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Operand shapes disagree or exceed an instruction's limits.
    Shape,
    /// A dtype the instruction or operand does not allow.
    Dtype,
    /// A memory space the instruction, operand or engine cannot use.
    MemorySpace,
    /// An address or partition outside the memory.
    Address,
    /// The start-partition (quadrant) rule.
    Partition,
    /// A PSUM access crossing a 2 KiB bank where it must not.
    PsumBank,
    /// SBUF/PSUM/HBM capacity exhausted (allocators).
    Capacity,
    /// Any other invalid operand value (enum, immediate, flag combination).
    Value,
    /// Malformed binary encoding.
    Decode,
    /// Malformed text assembly.
    Parse,
    /// Two unsynchronised streams touching the same bytes, one writing.
    Race,
    /// Every remaining stream waits on a semaphore that can no longer be signalled.
    Deadlock,
    /// A run executed more instructions than `Device::max_executed` allows (a runaway loop).
    Runaway,
    /// The caller cancelled the run (`Monitor::poll` returned false, e.g. on Ctrl-C).
    Interrupted,
    /// Semaphore id out of range and similar sync misuse.
    Semaphore,
    /// The host cannot allocate the memory an operation sized by user input needs.
    Resource,
    /// Another process of a distributed run failed, or the exchange between processes did.
    Distributed,
    /// A bug in the emulator itself (a caught panic); the device should be reset.
    Internal,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Shape => "ShapeError",
            ErrorKind::Dtype => "DtypeError",
            ErrorKind::MemorySpace => "MemorySpaceError",
            ErrorKind::Address => "AddressError",
            ErrorKind::Partition => "PartitionError",
            ErrorKind::PsumBank => "PsumBankError",
            ErrorKind::Capacity => "CapacityError",
            ErrorKind::Value => "OperandError",
            ErrorKind::Decode => "DecodeError",
            ErrorKind::Parse => "AsmSyntaxError",
            ErrorKind::Race => "RaceError",
            ErrorKind::Deadlock => "DeadlockError",
            ErrorKind::Runaway => "RunawayError",
            // The Python binding raises the caller's own exception (KeyboardInterrupt) instead.
            ErrorKind::Interrupted => "ExecutionError",
            ErrorKind::Semaphore => "SemaphoreError",
            ErrorKind::Resource => "ResourceError",
            ErrorKind::Distributed => "ExecutionError",
            ErrorKind::Internal => "InternalError",
        }
    }
}

/// An emulator error: kind, rule id, optional instruction (index and text), optional operand,
/// and the message.
#[derive(Clone, Debug, PartialEq)]
pub struct EmuError {
    pub kind: ErrorKind,
    /// Stable snake_case id of the broken rule (docs/errors.md).
    pub rule: &'static str,
    pub instruction: Option<(usize, String)>,
    pub operand: Option<String>,
    /// The rule in prose, with the values that broke it.
    pub message: String,
}

pub type Result<T> = std::result::Result<T, EmuError>;

impl EmuError {
    pub fn new(kind: ErrorKind, rule: &'static str, message: impl Into<String>) -> Self {
        EmuError {
            kind,
            rule,
            instruction: None,
            operand: None,
            message: message.into(),
        }
    }

    /// Name the operand, unless an inner layer already did.
    pub fn operand(mut self, name: impl Into<String>) -> Self {
        if self.operand.is_none() {
            self.operand = Some(name.into());
        }
        self
    }

    /// Name the instruction, unless an inner layer already did.
    pub fn at(mut self, index: usize, text: impl Into<String>) -> Self {
        if self.instruction.is_none() {
            self.instruction = Some((index, text.into()));
        }
        self
    }
}

impl fmt::Display for EmuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((i, text)) = &self.instruction {
            write!(f, "instruction #{i} `{text}`: ")?;
        }
        if let Some(op) = &self.operand {
            write!(f, "operand `{op}`: ")?;
        }
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for EmuError {}

/// Shorthand: `Err(fail(Shape, "free_size_mismatch", format!(..)))`.
pub fn fail(kind: ErrorKind, rule: &'static str, message: impl Into<String>) -> EmuError {
    EmuError::new(kind, rule, message)
}

thread_local! {
    /// Bytes one `try_vec` buffer may take on this thread (`with_alloc_limit`; no limit outside a run).
    static ALLOC_LIMIT: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// Run `f` with `try_vec` buffers on this thread limited to `limit` bytes each (a run's
/// `RunOptions::max_memory`); the previous limit comes back after.
pub fn with_alloc_limit<R>(limit: u64, f: impl FnOnce() -> R) -> R {
    let old = ALLOC_LIMIT.with(|l| l.replace(limit));
    let r = f();
    ALLOC_LIMIT.with(|l| l.set(old));
    r
}

/// `run_memory_limit` if `bytes` for `what` exceed the running run's `max_memory`.
fn within_run_limit(bytes: u128, what: &str) -> Result<()> {
    let limit = ALLOC_LIMIT.with(|l| l.get());
    if bytes > limit as u128 {
        return Err(fail(
            ErrorKind::Resource,
            "run_memory_limit",
            format!(
                "{what} needs {bytes} bytes of host memory, over the run's limit of {limit} bytes (RunOptions::max_memory; Python: Device.run(max_memory=))"
            ),
        ));
    }
    Ok(())
}

/// Whether the host can give `bytes` of memory for `what` now (a reservation made and
/// released, no page touched): a `Resource` error (rule `host_allocation_failed`) if not, or
/// (inside a run) `run_memory_limit` if over the run's `max_memory`, as `try_vec`. For work
/// whose buffers are allocated in many places (`engines::host_memory`).
#[cold]
pub fn check_host_bytes(bytes: u128, what: &str) -> Result<()> {
    within_run_limit(bytes, what)?;
    let mut probe: Vec<u8> = Vec::new();
    if usize::try_from(bytes).map_or(true, |n| probe.try_reserve_exact(n).is_err()) {
        return Err(fail(
            ErrorKind::Resource,
            "host_allocation_failed",
            format!("cannot allocate {bytes} bytes of host memory for {what}"),
        ));
    }
    Ok(())
}

/// Make room for `more` elements in `v` (no reallocation after), or a `Resource` error
/// (`host_allocation_failed`, or `run_memory_limit` over a run's `max_memory`), as `try_vec`.
pub fn try_extend<T>(v: &mut Vec<T>, more: usize, what: &str) -> Result<()> {
    let bytes = (v.len() as u128 + more as u128) * std::mem::size_of::<T>() as u128;
    within_run_limit(bytes, what)?;
    if v.try_reserve_exact(more).is_err() {
        return Err(fail(
            ErrorKind::Resource,
            "host_allocation_failed",
            format!("cannot allocate {bytes} bytes of host memory for {what}"),
        ));
    }
    Ok(())
}

/// A buffer of `n` copies of `fill` whose size comes from user input: a failed host allocation
/// is a `Resource` error (rule `host_allocation_failed`) instead of an abort. `what` names the
/// buffer in the message. Inside a run, a buffer over the run's `max_memory` is a `Resource`
/// error too (rule `run_memory_limit`).
pub fn try_vec<T: Clone>(n: usize, fill: T, what: &str) -> Result<Vec<T>> {
    let bytes = (n as u128) * std::mem::size_of::<T>() as u128;
    within_run_limit(bytes, what)?;
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        return Err(fail(
            ErrorKind::Resource,
            "host_allocation_failed",
            format!("cannot allocate {bytes} bytes of host memory for {what}"),
        ));
    }
    v.resize(n, fill);
    Ok(v)
}
