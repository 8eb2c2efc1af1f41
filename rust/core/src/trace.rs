//! Trace: one record per executed instruction and per DMA transfer.

use crate::isa::Opcode;

/// Where a record ran: an engine stream or a DMA queue of a core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Engine(u8),
    DmaQueue(u8),
}

#[derive(Clone, Debug)]
pub struct Record {
    pub core: u8,
    pub unit: Unit,
    /// Index of the instruction in its core's program.
    pub index: u32,
    pub opcode: Opcode,
    pub start_ps: u64,
    pub end_ps: u64,
    /// Bytes read plus bytes written.
    pub bytes: u64,
    pub flops: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub records: Vec<Record>,
}

impl Trace {
    /// Estimated end-to-end time of the run (latest record end), ns.
    pub fn total_ns(&self) -> f64 {
        self.records.iter().map(|r| r.end_ps).max().unwrap_or(0) as f64 / 1000.0
    }
}
