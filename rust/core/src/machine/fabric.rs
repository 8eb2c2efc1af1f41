//! The NeuronSwitch-v1 fabric of an UltraServer and the collective engines (CC-cores) that
//! drive it: the timing of a collective across chips, as per-link messages with emulated send
//! and arrival times.
//!
//! A collective across chips starts when its last rank arrives: the CC-cores of the group
//! synchronise over the fabric (one link latency), each rank's part is then run by a CC-core of
//! its chip (the earliest free of `cc_cores`, plus a launch cost), which moves the data as a
//! sequence of rounds of point-to-point messages on the DMA rings:
//!
//! * **mesh** (one round: every rank sends its piece to every other rank directly) for
//!   all_gather / reduce_scatter (all_reduce: reduce_scatter then all_gather, two rounds) when
//!   one rank's src is at most `mesh_max_bytes`, and always for all_to_all(_v) and
//!   collective_permute (point-to-point by nature);
//! * **ring** (rank r sends to rank r+1; all_gather N-1 rounds of the whole src, reduce_scatter
//!   N-1 rounds of src/N with a reduction per round, all_reduce 2(N-1) rounds of src/N) above.
//!
//! A message between chips leaves through the sender chip's egress port (busy bytes / link
//! bandwidth, in order of sending), crosses the switch (`latency_ns`) and is received through the
//! receiver chip's ingress port, which serves one message at a time: messages that reach a busy
//! port wait (contention at the receiving port). A message between two ranks of one chip moves
//! on the chip's DMA engines (`onchip_*`), not through the ports. A message's data is ready to
//! send on when it has been received (and, for reductions, reduced at `reduce_bytes_per_ns`).
//! Each rank completes when its last message is received; its CC-core is busy from its start
//! to its completion. Ports and CC-cores keep their busy state from one collective to the next
//! (groups are timed in the order they complete).
//!
//! Every completion is at least `latency_ns` after the group's last arrival: the *lookahead* of
//! the conservative synchronisation in machine/ultra.rs (a chip may run ahead of the others by
//! that much without missing a message).

use crate::cost::CollectiveKind;
use crate::isa::Opcode;

/// The fabric's numbers. Sources: AWS Trainium3 pages (NeuronLink-v4, 4 links per chip,
/// 2.56 TB/s per chip; 20 CC-cores per chip in the NKI architecture guide; NeuronSwitch-v1
/// all-to-all across up to 144 chips; chip-to-chip latency "just under 10 us" in the Trn3
/// UltraServer announcement). Marked GUESS where no public figure exists.
#[derive(Clone, Copy, Debug)]
pub struct FabricParams {
    /// Bytes per ns one chip sends (and, separately, receives) over all its links: 2.56 TB/s
    /// per chip counted both directions -> 1280 B/ns each way (GUESS: the split).
    pub link_bytes_per_ns: f64,
    /// NeuronLink-v4 ports per chip (documented; the model aggregates them into one port per
    /// direction).
    pub ports: usize,
    /// Chip-to-chip message latency through the switch, ns ("just under 10 us" published for
    /// the UltraServer; taken as 9500 ns).
    pub latency_ns: f64,
    /// Same-chip rank-to-rank messages: the chip's DMA engines (16 x 33 B/ns) and the fixed DMA
    /// cost (reference §1.8).
    pub onchip_bytes_per_ns: f64,
    pub onchip_latency_ns: f64,
    /// Collective engines per chip (NKI Trainium3 architecture guide: 20).
    pub cc_cores: usize,
    /// Time a CC-core takes to launch a rank's part, ns (GUESS: one DMA descriptor round).
    pub cc_launch_ns: f64,
    /// Reduction of a received chunk into the local one (DMA read-add-write at full DMA
    /// bandwidth on v4, reference §1.8), B/ns.
    pub reduce_bytes_per_ns: f64,
    /// Largest src per rank run with the mesh algorithm; larger runs as a ring (GUESS: 1 MiB).
    pub mesh_max_bytes: u64,
}

impl Default for FabricParams {
    fn default() -> Self {
        FabricParams {
            link_bytes_per_ns: 1280.0,
            ports: 4,
            latency_ns: 9500.0,
            onchip_bytes_per_ns: 16.0 * 33.0,
            onchip_latency_ns: 1300.0,
            cc_cores: 20,
            cc_launch_ns: 64.0,
            reduce_bytes_per_ns: 16.0 * 33.0,
            mesh_max_bytes: 1 << 20,
        }
    }
}

impl FabricParams {
    /// The least time from a group's last arrival to any of its completions, ps.
    pub fn lookahead_ps(&self) -> u64 {
        ns_ps(self.latency_ns).max(1)
    }
}

fn ns_ps(ns: f64) -> u64 {
    (ns * 1000.0).ceil().max(0.0) as u64
}

/// One message over the fabric (or between two ranks of a chip when `from_chip == to_chip`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    pub from_chip: u16,
    pub to_chip: u16,
    pub bytes: u64,
    /// Leaves the sender's egress port.
    pub send_ps: u64,
    /// Has left the sender's port.
    pub sent_ps: u64,
    /// Starts and ends arriving at the receiver's ingress port.
    pub recv_start_ps: u64,
    pub arrive_ps: u64,
    /// The collective it belongs to (its number in completion order).
    pub group: u32,
}

/// A rank's part of a collective on a CC-core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CcSpan {
    pub chip: u16,
    pub cc: u8,
    pub core: u8,
    pub opcode: Opcode,
    pub start_ps: u64,
    pub end_ps: u64,
    pub group: u32,
}

/// What the fabric did during a run: every message and every CC-core span.
#[derive(Clone, Debug, Default)]
pub struct FabricTrace {
    pub messages: Vec<Message>,
    pub cc: Vec<CcSpan>,
}

/// A collective ready to time: who takes part (global core ids in rank order), when each
/// arrived, and what moves.
pub struct GroupTiming<'a> {
    pub opcode: Opcode,
    pub cores: &'a [u16],
    pub arrived: &'a [u64],
    pub kind: CollectiveKind,
    pub src_bytes: u64,
    /// Point-to-point bytes `i * N + j` (all_to_all(_v), collective_permute).
    pub matrix: &'a [u64],
}

/// The fabric's state during a run: port and CC-core busy times.
pub struct Fabric {
    pub params: FabricParams,
    egress_free: Vec<u64>,
    ingress_free: Vec<u64>,
    cc_free: Vec<u64>,
    groups: u32,
    pub trace: FabricTrace,
    pub record: bool,
}

/// One round of messages: (from rank, to rank, bytes, reduce on receipt).
type Round = Vec<(usize, usize, u64, bool)>;

/// The algorithm's rounds for a group of `n` ranks.
fn rounds(g: &GroupTiming, mesh_max: u64) -> Vec<Round> {
    let n = g.cores.len();
    let b = g.src_bytes;
    let chunk = b / n.max(1) as u64;
    let mesh = |bytes: u64, reduce: bool| -> Round {
        let mut r = Round::new();
        for k in 1..n {
            for i in 0..n {
                r.push((i, (i + k) % n, bytes, reduce));
            }
        }
        r
    };
    let ring = |bytes: u64, reduce: bool| -> Round {
        (0..n).map(|i| (i, (i + 1) % n, bytes, reduce)).collect()
    };
    if n < 2 {
        return Vec::new();
    }
    let use_mesh = b <= mesh_max || n == 2;
    match g.kind {
        CollectiveKind::Gather if use_mesh => vec![mesh(b, false)],
        CollectiveKind::Gather => (1..n).map(|_| ring(b, false)).collect(),
        CollectiveKind::ReduceScatter if use_mesh => vec![mesh(chunk, true)],
        CollectiveKind::ReduceScatter => (1..n).map(|_| ring(chunk, true)).collect(),
        CollectiveKind::Reduce if use_mesh => vec![mesh(chunk, true), mesh(chunk, false)],
        CollectiveKind::Reduce => (1..n)
            .map(|_| ring(chunk, true))
            .chain((1..n).map(|_| ring(chunk, false)))
            .collect(),
        CollectiveKind::AllToAll | CollectiveKind::AllToAllV | CollectiveKind::Permute => {
            let mut r = Round::new();
            for k in 1..n {
                for i in 0..n {
                    let j = (i + k) % n;
                    let bytes = g.matrix.get(i * n + j).copied().unwrap_or(0);
                    if bytes > 0 {
                        r.push((i, j, bytes, false));
                    }
                }
            }
            vec![r]
        }
        CollectiveKind::Exchange => vec![mesh(b, false)],
        CollectiveKind::Barrier => Vec::new(),
    }
}

impl Fabric {
    pub fn new(params: FabricParams, chips: usize) -> Self {
        Fabric {
            params,
            egress_free: vec![0; chips],
            ingress_free: vec![0; chips],
            cc_free: vec![0; chips * params.cc_cores.max(1)],
            groups: 0,
            trace: FabricTrace::default(),
            record: true,
        }
    }

    /// Time a completed group: each rank's completion time, ps (in rank order).
    pub fn time(&mut self, g: &GroupTiming) -> Vec<u64> {
        let p = self.params;
        let n = g.cores.len();
        let group = self.groups;
        self.groups += 1;
        let last = g.arrived.iter().copied().max().unwrap_or(0);
        let synced = last + ns_ps(p.latency_ns);
        let ncc = p.cc_cores.max(1);
        // Each rank's CC-core: the earliest free on its chip (ties: the lowest).
        let mut ccs = Vec::with_capacity(n);
        let mut ready = Vec::with_capacity(n);
        for &c in g.cores {
            let chip = c as usize / crate::memory::NUM_CORES;
            let slots = &self.cc_free[chip * ncc..(chip + 1) * ncc];
            let (k, free) = slots
                .iter()
                .copied()
                .enumerate()
                .min_by_key(|&(k, f)| (f, k))
                .unwrap_or((0, 0));
            let start = synced.max(free);
            // Held from now so a later rank of the same group on this chip takes another one.
            self.cc_free[chip * ncc + k] = u64::MAX;
            ccs.push((k, start));
            ready.push(start + ns_ps(p.cc_launch_ns));
        }
        for r in rounds(g, p.mesh_max_bytes) {
            let mut next = ready.clone();
            for (i, j, bytes, reduce) in r {
                let done = self.send(g, group, (i, j), bytes, ready[i]);
                let done = if reduce {
                    done + ns_ps(bytes as f64 / p.reduce_bytes_per_ns)
                } else {
                    done
                };
                next[j] = next[j].max(done);
            }
            ready = next;
        }
        for (r, &c) in g.cores.iter().enumerate() {
            let chip = c as usize / crate::memory::NUM_CORES;
            let (k, start) = ccs[r];
            self.cc_free[chip * ncc + k] = ready[r];
            if self.record {
                self.trace.cc.push(CcSpan {
                    chip: chip as u16,
                    cc: k as u8,
                    core: (c as usize % crate::memory::NUM_CORES) as u8,
                    opcode: g.opcode,
                    start_ps: start,
                    end_ps: ready[r],
                    group,
                });
            }
        }
        ready
    }

    /// One message from rank `i` to rank `j`, ready to leave at `at`: when it is received.
    fn send(
        &mut self,
        g: &GroupTiming,
        group: u32,
        (i, j): (usize, usize),
        bytes: u64,
        at: u64,
    ) -> u64 {
        let p = self.params;
        let nc = crate::memory::NUM_CORES;
        let (a, b) = (g.cores[i] as usize / nc, g.cores[j] as usize / nc);
        let (send, sent, rx0, rx1) = if a == b {
            let t = at + ns_ps(p.onchip_latency_ns + bytes as f64 / p.onchip_bytes_per_ns);
            (at, at, at, t)
        } else {
            let dur = ns_ps(bytes as f64 / p.link_bytes_per_ns);
            let send = at.max(self.egress_free[a]);
            self.egress_free[a] = send + dur;
            let rx0 = (send + ns_ps(p.latency_ns)).max(self.ingress_free[b]);
            self.ingress_free[b] = rx0 + dur;
            (send, send + dur, rx0, rx0 + dur)
        };
        if self.record {
            self.trace.messages.push(Message {
                from_chip: a as u16,
                to_chip: b as u16,
                bytes,
                send_ps: send,
                sent_ps: sent,
                recv_start_ps: rx0,
                arrive_ps: rx1,
                group,
            });
        }
        rx1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing<'a>(
        cores: &'a [u16],
        arrived: &'a [u64],
        kind: CollectiveKind,
        b: u64,
    ) -> GroupTiming<'a> {
        GroupTiming {
            opcode: Opcode::AllGather,
            cores,
            arrived,
            kind,
            src_bytes: b,
            matrix: &[],
        }
    }

    #[test]
    fn two_chip_gather_is_latency_plus_transfer() {
        let p = FabricParams::default();
        let mut f = Fabric::new(p, 2);
        let b = 1_280_000u64; // 1000 ns on a link
        let ends = f.time(&timing(&[0, 8], &[0, 500], CollectiveKind::Gather, b));
        let start = 500 + ns_ps(p.latency_ns) + ns_ps(p.cc_launch_ns);
        let want = start + 1_000_000 + ns_ps(p.latency_ns);
        assert_eq!(ends, vec![want, want]);
        assert_eq!(f.trace.messages.len(), 2);
        assert_eq!(f.trace.cc.len(), 2);
    }

    #[test]
    fn receiving_port_serialises_incast() {
        let p = FabricParams::default();
        let mut f = Fabric::new(p, 3);
        let b = 128_000u64; // 100 ns on a link; small enough for the mesh algorithm
                            // Ranks on chips 1 and 2 both send to chip 0 in one mesh round.
        let ends = f.time(&timing(&[0, 8, 16], &[0, 0, 0], CollectiveKind::Gather, b));
        let start = ns_ps(p.latency_ns) + ns_ps(p.cc_launch_ns);
        // Chip 1's second message waits for its egress (100 ns); chip 0's port serves the two
        // messages back to back: the last ends two transfers after the first starts arriving.
        let first = start + ns_ps(p.latency_ns) + 100_000;
        assert_eq!(ends[0], first + 100_000);
        assert!(ends.iter().all(|e| *e >= p.lookahead_ps()));
    }

    #[test]
    fn large_gather_runs_as_a_ring() {
        let p = FabricParams::default();
        let g = timing(&[0, 8, 16, 24], &[0; 4], CollectiveKind::Gather, 2 << 20);
        assert_eq!(rounds(&g, p.mesh_max_bytes).len(), 3);
        let g = timing(&[0, 8, 16, 24], &[0; 4], CollectiveKind::Gather, 1024);
        assert_eq!(rounds(&g, p.mesh_max_bytes).len(), 1);
    }
}
