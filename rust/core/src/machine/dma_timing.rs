//! Timing of DMA transfers on the DMA machinery (reference §1.1, §1.8): 16 DMA engines per core,
//! 16 queues each; a transfer is split across engines (by default each engine serves 8
//! partitions); each engine moves its share at its own bandwidth after the transfer's fixed
//! cost; every byte that touches HBM also takes its share of the device-wide HBM bandwidth.
//! The data itself moves in engines/dma.rs; this module only says when.
//!
//! Arbitration: a transfer is *committed* (given its engines) when its engines are about to be
//! free; when several transfers could take the engines at the same time the lower `priority`
//! value (v4 QoS class) wins, then the scheduler's agent order. Committed work is never
//! pre-empted. HBM is a fluid server: reservations queue behind each other at 4.7 TB/s, so the
//! aggregate HBM traffic of all cores never exceeds the cap.

use crate::cost::DmaParams;
use crate::isa::ops::class;
use crate::isa::tables::CostClass;
use crate::isa::{Arg, Instr};
use crate::memory::{Ap, Mem};

/// One engine's share of a transfer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Piece {
    pub engine: u8,
    pub bytes: u64,
    pub descriptors: u64,
}

/// How one DMA instruction uses the DMA engines of its core.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub pieces: Vec<Piece>,
    /// Payload bytes (what lands in dst).
    pub bytes: u64,
    /// Bytes read from plus written to HBM.
    pub hbm_bytes: u64,
    /// Of `hbm_bytes`, those on each chiplet's stacks (`hw::hbm_chiplet`, estimated from each
    /// HBM operand's byte span).
    pub hbm_chiplet_bytes: [u64; 2],
    /// QoS class 0..3 (0 = highest).
    pub priority: u8,
    /// Fraction of the engine bandwidth the transfer reaches (DMA transpose: 0.9 from HBM,
    /// 0.5 SBUF -> SBUF, reference §1.8; copies 1.0).
    pub rate: f64,
}

/// `bytes` of HBM operand `a` split by chiplet, in proportion to its byte span on each half.
fn chiplet_split(a: &Ap, bytes: u64, into: &mut [u64; 2]) {
    let (r0, r1) = (a.row_base(0), a.row_base(a.parts.saturating_sub(1)));
    let (lo, hi) = a.row_byte_range();
    let (lo, hi) = (r0.min(r1) + lo, r0.max(r1) + hi);
    let half = (crate::hw::HBM_BYTES / 2) as i128;
    let span = (hi - lo).max(1);
    let near0 = (hi.min(half) - lo.max(0)).clamp(0, span);
    let b0 = (bytes as i128 * near0 / span) as u64;
    into[0] += b0;
    into[1] += bytes - b0;
}

fn runs_per_row(a: &Ap) -> u64 {
    a.row_runs().len().max(1) as u64
}

/// Each engine's (bytes, descriptors) of a transfer over `rows` partitions: on-chip, blocks of
/// `ppe` partitions per engine; HBM to HBM, rows round-robin (equal slices when fewer rows than
/// engines).
fn per_engine(
    bytes: u64,
    descriptors: u64,
    rows: u64,
    onchip: bool,
    engines: usize,
    ppe: u64,
) -> Vec<(u64, u64)> {
    let share = |total: u64, k: u64, n: u64| total * (k + 1) / n - total * k / n;
    let mut per: Vec<(u64, u64)> = vec![(0, 0); engines];
    if onchip {
        // Each block of `ppe` rows goes to one engine: the block's shares telescope to
        // share_upto(end) - share_upto(start), the same integers as adding them row by row.
        let upto = |total: u64, r: u64| total * r / rows;
        let mut r0 = 0;
        while r0 < rows {
            let r1 = ((r0 / ppe + 1) * ppe).min(rows);
            let pe = &mut per[(r0 / ppe) as usize % engines];
            pe.0 += upto(bytes, r1) - upto(bytes, r0);
            pe.1 += upto(descriptors, r1) - upto(descriptors, r0);
            r0 = r1;
        }
    } else if rows >= engines as u64 {
        for r in 0..rows {
            let e = r as usize % engines;
            per[e].0 += share(bytes, r, rows);
            per[e].1 += share(descriptors, r, rows);
        }
    } else {
        // Few HBM rows: cut the bytes into equal slices, one per engine.
        let n = engines as u64;
        for (e, pe) in per.iter_mut().enumerate() {
            *pe = (
                share(bytes, e as u64, n),
                share(descriptors, e as u64, n).max(1),
            );
        }
    }
    per
}

/// Split `ins` over the engines of its core.
pub fn plan(ins: &Instr, p: &DmaParams) -> Plan {
    let spec = ins.op.spec();
    let mut dst: Option<&Ap> = None;
    let mut srcs: Vec<&Ap> = Vec::new();
    for (i, prm) in spec.params.iter().enumerate() {
        match ins.args.get(i) {
            Some(Arg::Tensor(ap)) if prm.access.writes() && dst.is_none() => dst = Some(ap),
            Some(Arg::Tensor(ap)) => srcs.push(ap),
            _ => {}
        }
    }
    let transpose = spec.cost == CostClass::DmaTranspose;
    let requested = if transpose {
        class::DmaTranspose::of(ins).and_then(|d| d.priority)
    } else {
        class::Dma::of(ins).and_then(|d| d.priority)
    };
    let priority = requested.map_or(0, |v| {
        v.clamp(0, p.priorities.saturating_sub(1) as i32) as u8
    });
    let Some(dst) = dst else {
        return Plan {
            priority,
            rate: 1.0,
            ..Plan::default()
        };
    };
    let rate = if transpose {
        if srcs.iter().any(|a| a.mem == Mem::Hbm) {
            0.9
        } else {
            0.5
        }
    } else {
        1.0
    };
    let bytes = dst.num_elements() as u64 * dst.dtype.size() as u64;
    let hbm_src: u64 = srcs
        .iter()
        .filter(|a| a.mem == Mem::Hbm)
        .map(|a| a.num_elements() as u64 * a.dtype.size() as u64)
        .sum();
    let hbm_bytes = hbm_src + if dst.mem == Mem::Hbm { bytes } else { 0 };
    let mut hbm_chiplet_bytes = [0u64; 2];
    for a in srcs.iter().copied().chain(std::iter::once(dst)) {
        if a.mem == Mem::Hbm {
            let b = a.num_elements() as u64 * a.dtype.size() as u64;
            chiplet_split(a, b, &mut hbm_chiplet_bytes);
        }
    }
    // DMA buffers: one per contiguous run of a row, on the more fragmented side.
    let descriptors = srcs
        .iter()
        .chain(std::iter::once(&dst))
        .map(|a| a.parts.max(1) as u64 * runs_per_row(a))
        .max()
        .unwrap_or(1);
    let engines = p.engines.max(1);
    let ppe = p.partitions_per_engine.max(1);
    // The on-chip side's partitions decide the split; HBM -> HBM spreads rows over all engines.
    let side = if dst.mem != Mem::Hbm {
        dst
    } else {
        srcs.iter()
            .copied()
            .find(|a| a.mem != Mem::Hbm)
            .unwrap_or(dst)
    };
    let onchip = side.mem != Mem::Hbm;
    let rows = side.parts.max(1) as u64;
    let per = per_engine(bytes, descriptors, rows, onchip, engines, ppe as u64);
    let pieces = per
        .iter()
        .enumerate()
        .filter(|(_, (b, _))| *b > 0)
        .map(|(e, (b, d))| Piece {
            engine: e as u8,
            bytes: *b,
            descriptors: *d,
        })
        .collect();
    Plan {
        pieces,
        bytes,
        hbm_bytes,
        hbm_chiplet_bytes,
        priority,
        rate,
    }
}

/// The state of every core's DMA engines and of the shared HBM.
pub struct DmaFabric {
    p: DmaParams,
    /// Per core, per engine: time (ps) the engine finishes its committed work.
    free: Vec<Vec<u64>>,
    /// Time (ps) the HBM fluid server drains its backlog.
    hbm_free: u64,
    /// Per chiplet: time (ps) the die-to-die link bringing far HBM bytes to it drains.
    d2d_free: [u64; 2],
    /// (engine, start ps, end ps, bytes) of each piece of the last committed transfer.
    pub last_spans: Vec<(u8, u64, u64, u64)>,
}

impl DmaFabric {
    pub fn new(p: DmaParams, cores: usize) -> DmaFabric {
        DmaFabric {
            p,
            free: vec![vec![0; p.engines.max(1)]; cores],
            hbm_free: 0,
            d2d_free: [0; 2],
            last_spans: Vec::new(),
        }
    }

    fn fixed_ps(&self) -> u64 {
        (self.p.fixed_ns * 1000.0) as u64
    }

    /// Earliest time a transfer ready at `ready` can be committed: when the busiest of its
    /// engines has at most the fixed cost's worth of work left (that latency overlaps it).
    pub fn earliest(&self, core: usize, ready: u64, plan: &Plan) -> u64 {
        let busy = plan
            .pieces
            .iter()
            .filter_map(|pc| self.free.get(core).and_then(|f| f.get(pc.engine as usize)))
            .copied()
            .max()
            .unwrap_or(0);
        ready.max(busy.saturating_sub(self.fixed_ps()))
    }

    /// Give the transfer its engines from `start`; returns its completion time (ps).
    pub fn commit(&mut self, core: usize, start: u64, plan: &Plan) -> u64 {
        // Bytes on the far chiplet's stacks cross the die-to-die link: extra latency, and they
        // queue on that link (ESTIMATE, docs/cost-model.md "Dual-chiplet locality").
        let chiplet = crate::hw::core_chiplet(core).min(1);
        let far = if self.p.chiplets > 1 {
            plan.hbm_chiplet_bytes[1 - chiplet]
        } else {
            0
        };
        let far_ps = if far > 0 {
            (self.p.far_latency_ns * 1000.0) as u64
        } else {
            0
        };
        let data_start = start + self.fixed_ps() + far_ps;
        let mut done = data_start;
        let total = plan.bytes.max(1) as f64;
        self.last_spans.clear();
        for pc in &plan.pieces {
            let Some(slot) = self
                .free
                .get_mut(core)
                .and_then(|f| f.get_mut(pc.engine as usize))
            else {
                continue;
            };
            let s = data_start.max(*slot);
            let work_ns = self.p.piece_ns(pc.bytes, pc.descriptors, plan.rate);
            let mut end = s + (work_ns * 1000.0).ceil() as u64;
            if plan.hbm_bytes > 0 {
                let share = plan.hbm_bytes as f64 * pc.bytes as f64 / total;
                let hs = s.max(self.hbm_free);
                self.hbm_free = hs + (share / self.p.hbm_bytes_per_ns * 1000.0).ceil() as u64;
                end = end.max(self.hbm_free);
            }
            if far > 0 {
                let share = far as f64 * pc.bytes as f64 / total;
                let link = &mut self.d2d_free[chiplet];
                let ls = s.max(*link);
                *link = ls + (share / self.p.d2d_bytes_per_ns * 1000.0).ceil() as u64;
                end = end.max(*link);
            }
            *slot = end;
            self.last_spans.push((pc.engine, s, end, pc.bytes));
            done = done.max(end);
        }
        done.max(start + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(bytes_per_engine: &[(u8, u64)], hbm: bool) -> Plan {
        let pieces: Vec<Piece> = bytes_per_engine
            .iter()
            .map(|&(e, b)| Piece {
                engine: e,
                bytes: b,
                descriptors: 8,
            })
            .collect();
        let bytes = pieces.iter().map(|p| p.bytes).sum();
        Plan {
            pieces,
            bytes,
            hbm_bytes: if hbm { bytes } else { 0 },
            hbm_chiplet_bytes: [if hbm { bytes } else { 0 }, 0],
            priority: 0,
            rate: 1.0,
        }
    }

    #[test]
    fn one_engine_costs_fixed_plus_bytes_over_bandwidth() {
        let p = DmaParams::default();
        let mut f = DmaFabric::new(p, 1);
        let pl = plan_of(&[(0, 33_000)], false);
        let end = f.commit(0, 0, &pl);
        let want = p.fixed_ns + 8.0 * p.descriptor_ns + 1000.0;
        assert_eq!(end, (want * 1000.0).ceil() as u64);
    }

    #[test]
    fn engines_work_in_parallel_and_queue_serially() {
        let p = DmaParams::default();
        let mut f = DmaFabric::new(p, 1);
        let all: Vec<(u8, u64)> = (0..16).map(|e| (e, 33_000)).collect();
        let pl = plan_of(&all, false);
        let e1 = f.commit(0, 0, &pl);
        // Same duration as one engine moving its share alone.
        let one = ((p.fixed_ns + 8.0 * p.descriptor_ns + 1000.0) * 1000.0).ceil() as u64;
        assert_eq!(e1, one);
        // A second transfer committed at once waits for the engines, minus nothing.
        let s2 = f.earliest(0, 0, &pl);
        assert_eq!(s2, e1 - (p.fixed_ns * 1000.0) as u64);
        let e2 = f.commit(0, s2, &pl);
        assert_eq!(
            e2,
            e1 + ((8.0 * p.descriptor_ns + 1000.0) * 1000.0).ceil() as u64
        );
    }

    #[test]
    fn onchip_split_sums_each_rows_share() {
        use crate::isa::text::parse_instr_unchecked;
        // Row-by-row reference: row r's share of `total` goes to engine (r / ppe) % engines.
        let reference = |total: u64, rows: u64, ppe: u64, engines: usize| {
            let mut per = vec![0u64; engines];
            for r in 0..rows {
                per[(r / ppe) as usize % engines] += total * (r + 1) / rows - total * r / rows;
            }
            per
        };
        for (parts, ppe, engines) in [(100, 8, 16), (128, 8, 16), (37, 3, 5), (7, 8, 16)] {
            let p = DmaParams {
                partitions_per_engine: ppe,
                engines,
                ..DmaParams::default()
            };
            let text = format!(
                "dma_copy.sync dst=sbuf:bfloat16[0:{parts}]+0[[1,5]] src=hbm:bfloat16+0[[10,{parts}],[2,5]]"
            );
            let pl = plan(&parse_instr_unchecked(&text).unwrap(), &p);
            let (bytes, descs) = (parts as u64 * 10, parts as u64 * 5);
            let want_b = reference(bytes, parts as u64, ppe as u64, engines);
            let want_d = reference(descs, parts as u64, ppe as u64, engines);
            let want: Vec<_> = (0..engines)
                .filter(|&e| want_b[e] > 0)
                .map(|e| (e as u8, want_b[e], want_d[e]))
                .collect();
            let got: Vec<_> = pl
                .pieces
                .iter()
                .map(|x| (x.engine, x.bytes, x.descriptors))
                .collect();
            assert_eq!(
                got, want,
                "{parts} rows, {ppe} per engine, {engines} engines"
            );
        }
    }

    #[test]
    fn plan_splits_partitions_and_rates_transposes() {
        use crate::isa::text::parse_instr_unchecked;
        let p = DmaParams::default();
        let copy = parse_instr_unchecked("dma_copy.sync dst=sbuf:bfloat16[0:24]+0[[1,1024]] src=hbm:bfloat16+0[[1024,24],[1,1024]] priority=2").unwrap();
        let pl = plan(&copy, &p);
        // 24 partitions -> engines 0, 1, 2 with 8 rows of 2 KiB each.
        let want: Vec<(u8, u64)> = (0..3).map(|e| (e, 8 * 2048)).collect();
        let got: Vec<(u8, u64)> = pl.pieces.iter().map(|x| (x.engine, x.bytes)).collect();
        assert_eq!(got, want);
        assert_eq!(
            (pl.bytes, pl.hbm_bytes, pl.priority, pl.rate),
            (24 * 2048, 24 * 2048, 2, 1.0)
        );
        // SBUF -> a flat HBM row: the SBUF partitions still decide the split.
        let out = parse_instr_unchecked(
            "dma_copy.sync dst=hbm:bfloat16+0[[1,24576]] src=sbuf:bfloat16[0:24]+0[[1,1024]]",
        )
        .unwrap();
        let got: Vec<(u8, u64)> = plan(&out, &p)
            .pieces
            .iter()
            .map(|x| (x.engine, x.bytes))
            .collect();
        assert_eq!(got, want);
        let tr = parse_instr_unchecked("dma_transpose.sync dst=sbuf:bfloat16[0:32]+0[[1,32]] src=hbm:bfloat16+0[[32,32],[1,32]]").unwrap();
        assert_eq!(plan(&tr, &p).rate, 0.9);
        let tr2 = parse_instr_unchecked("dma_transpose.sync dst=sbuf:bfloat16[0:32]+0[[1,32]] src=sbuf:bfloat16[0:32]+4096[[1,32]]").unwrap();
        assert_eq!(plan(&tr2, &p).rate, 0.5);
    }

    #[test]
    fn hbm_cap_limits_the_aggregate() {
        let p = DmaParams::default();
        let mut f = DmaFabric::new(p, 8);
        let big = 1u64 << 20;
        let all: Vec<(u8, u64)> = (0..16).map(|e| (e, big)).collect();
        let mut pl = plan_of(&all, true);
        pl.hbm_bytes = 2 * pl.bytes; // HBM -> HBM: read and write
        let mut end = 0;
        for c in 0..8 {
            end = end.max(f.commit(c, 0, &pl));
        }
        let total_hbm = 8.0 * pl.hbm_bytes as f64;
        let floor_ps = total_hbm / p.hbm_bytes_per_ns * 1000.0;
        assert!(end as f64 >= floor_ps, "{end} < {floor_ps}");
    }

    #[test]
    fn far_chiplet_hbm_costs_latency_and_link_time() {
        use crate::isa::text::parse_instr_unchecked;
        let p = DmaParams::default();
        let half = crate::hw::HBM_BYTES / 2;
        let near = parse_instr_unchecked("dma_copy.sync dst=sbuf:bfloat16[0:128]+0[[1,2048]] src=hbm:bfloat16+0[[2048,128],[1,2048]]").unwrap();
        let far = parse_instr_unchecked(&format!("dma_copy.sync dst=sbuf:bfloat16[0:128]+0[[1,2048]] src=hbm:bfloat16+{half}[[2048,128],[1,2048]]")).unwrap();
        let (pn, pf) = (plan(&near, &p), plan(&far, &p));
        assert_eq!(pn.hbm_chiplet_bytes, [512 * 1024, 0]);
        assert_eq!(pf.hbm_chiplet_bytes, [0, 512 * 1024]);
        let time = |core: usize, pl: &Plan| DmaFabric::new(p, 8).commit(core, 0, pl);
        // Core 0 (chiplet 0) reads chiplet 0's stacks at the near cost; chiplet 1's are far.
        assert!(time(0, &pf) >= time(0, &pn) + (p.far_latency_ns * 1000.0) as u64);
        // Core 4 (chiplet 1): the other way round, and symmetric.
        assert_eq!(time(4, &pn), time(0, &pf));
        assert_eq!(time(4, &pf), time(0, &pn));
        // Where every stack is near (trn1/trn2 timing) placement does not matter.
        let p1 = DmaParams::of(crate::timing::generation("trn2").unwrap());
        let t = |core: usize, pl: &Plan| DmaFabric::new(p1, 8).commit(core, 0, pl);
        assert_eq!(t(0, &pf), t(0, &pn));
    }

    #[test]
    fn the_stack_of_an_address() {
        use crate::hw::{hbm_chiplet, hbm_stack, HBM_BYTES, HBM_INTERLEAVE_BYTES};
        assert_eq!(hbm_stack(0), 0);
        assert_eq!(hbm_stack(HBM_INTERLEAVE_BYTES), 1);
        assert_eq!(hbm_stack(2 * HBM_INTERLEAVE_BYTES), 0);
        assert_eq!(hbm_stack(HBM_BYTES / 2), 2);
        assert_eq!(hbm_stack(HBM_BYTES / 2 + HBM_INTERLEAVE_BYTES), 3);
        assert_eq!(
            (hbm_chiplet(HBM_BYTES / 2 - 1), hbm_chiplet(HBM_BYTES - 1)),
            (0, 1)
        );
    }
}
