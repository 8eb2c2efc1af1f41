//! One receiving rank's part of a collective, for a run whose ranks live in different
//! processes (machine/ultra_dist.rs). [`plan`] checks a group from what its ranks' arrivals
//! say without their data ([`Meta`]) exactly as `combine` checks it, and gives what the group
//! moves (its timing); [`Plan::consumed`] is the bytes of one sender's src that one receiver
//! needs; [`Plan::receive`] computes that receiver's new dst from those bytes alone. The
//! results are `combine`'s for that rank, bit for bit (same reduction order, same casts).

use super::{a2av_layout, agree, group_operands, Block, Moved, Operands, Rank, RankError, Shared};
use super::{CollectiveKind, Snapshot};
use crate::isa::AluOp;
use crate::numerics;
use crate::numerics::config::Rounder;
use std::ops::Range;

/// What a rank's arrival says of its data without the data.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meta {
    /// Bytes of its src (read at arrival).
    pub src_len: usize,
    /// all_to_all_v's run-time counts.
    pub counts: Vec<i64>,
    /// Bytes of its dst snapshot (all_to_all_v).
    pub dst_len: usize,
    /// An in-place all_to_all (exchanged in the ranks' memories at completion).
    pub deferred: bool,
}

impl Meta {
    pub fn of(s: &Snapshot) -> Meta {
        Meta {
            src_len: s.src.len(),
            counts: s.counts.clone(),
            dst_len: s.dst.len(),
            deferred: s.deferred,
        }
    }
}

/// A checked group: what it moves and how its data flows from sender to receiver.
pub struct Plan<'a> {
    pub moved: Moved,
    ops: Vec<Operands<'a>>,
    srcs: Vec<usize>,
    layout: Vec<Vec<Block>>,
    deferred: bool,
}

/// Check a group as `combine` does (the same errors, in the same order) from its ranks'
/// metadata, and plan its data flow.
pub fn plan<'a>(ranks: &[Rank<'a>], metas: &[Meta]) -> Result<Plan<'a>, RankError> {
    let (kind, all) = group_operands(ranks)?;
    let mut p = Plan {
        moved: Moved {
            kind,
            src_bytes: 0,
            matrix: Vec::new(),
        },
        ops: Vec::new(),
        srcs: Vec::new(),
        layout: Vec::new(),
        deferred: false,
    };
    if all.len() != ranks.len() || ranks.is_empty() {
        return Ok(p);
    }
    agree(ranks, &all, kind)?;
    let n = ranks.len();
    let deferred = metas.iter().any(|m| m.deferred);
    p.deferred = deferred;
    let es = all[0].src.dtype.size();
    p.srcs = if deferred {
        vec![all[0].src.num_elements() * es; n]
    } else {
        metas.iter().map(|m| m.src_len).collect()
    };
    p.moved.src_bytes = p.srcs[0] as u64;
    match kind {
        _ if deferred => {}
        CollectiveKind::AllToAllV => {
            let counts: Vec<&[i64]> = metas.iter().map(|m| m.counts.as_slice()).collect();
            let dst_lens: Vec<usize> = metas.iter().map(|m| m.dst_len).collect();
            p.layout = a2av_layout(ranks, &all, &counts, &dst_lens)?;
            p.moved.matrix = vec![0u64; n * n];
            for (r, blocks) in p.layout.iter().enumerate() {
                for (i, b) in blocks.iter().enumerate() {
                    if i != r {
                        p.moved.matrix[i * n + r] = (b.len * es) as u64;
                    }
                }
            }
        }
        CollectiveKind::Permute => {
            p.moved.matrix = vec![0u64; n * n];
            for (s, t) in pairs(&all) {
                if s != t {
                    p.moved.matrix[s * n + t] = p.srcs[s] as u64;
                }
            }
        }
        _ => {}
    }
    if kind == CollectiveKind::AllToAll {
        let (n, c) = (n as u64, p.srcs[0] as u64 / n as u64);
        p.moved.matrix = (0..n * n)
            .map(|ij| if ij / n == ij % n { 0 } else { c })
            .collect();
    }
    p.ops = all;
    Ok(p)
}

fn pairs(all: &[Operands]) -> Vec<(usize, usize)> {
    super::permute_pairs(all[0].pairs, all.len()).unwrap_or_default()
}

impl Plan<'_> {
    /// Whether the group moves data between ranks (not a barrier).
    pub fn has_data(&self) -> bool {
        !self.ops.is_empty()
    }

    /// Whether the group is an in-place all_to_all (its blocks move between the ranks'
    /// buffers when it completes; `in_place`).
    pub fn is_in_place(&self) -> bool {
        self.deferred && self.has_data()
    }

    /// The bytes of sender `i`'s src that receiver `r` consumes (empty: none). For an in-place
    /// all_to_all, the bytes of its buffer.
    pub fn consumed(&self, i: usize, r: usize) -> Range<usize> {
        let n = self.ops.len();
        if n == 0 {
            return 0..0;
        }
        let len = self.srcs[i];
        let es = self.ops[0].src.dtype.size();
        match self.moved.kind {
            CollectiveKind::AllToAll => (r * len / n)..((r + 1) * len / n),
            CollectiveKind::ReduceScatter => {
                let chunk = len / es / n * es;
                (r * chunk)..((r + 1) * chunk)
            }
            CollectiveKind::Gather | CollectiveKind::Reduce => 0..len,
            CollectiveKind::Exchange if i == (r + 1) % n => 0..len,
            CollectiveKind::Permute if pairs(&self.ops).contains(&(i, r)) => 0..len,
            CollectiveKind::AllToAllV => {
                let b = self.layout[r][i];
                (b.from * es)..((b.from + b.len) * es)
            }
            _ => 0..0,
        }
    }

    /// Receiver `r`'s new dst bytes (`None`: not written) from `pieces[i]`, the bytes
    /// `consumed(i, r)` of every sender i, and `own`, its own snapshot (all_to_all_v keeps the
    /// dst bytes it does not receive). Not for an in-place all_to_all.
    pub fn receive(
        &self,
        r: usize,
        pieces: &[&[u8]],
        own: &Snapshot,
        rounder: &Rounder,
    ) -> Option<Shared> {
        let n = self.ops.len();
        if n == 0 {
            return None;
        }
        let es = self.ops[0].src.dtype.size();
        let bytes = match self.moved.kind {
            CollectiveKind::AllToAll | CollectiveKind::Gather => pieces.concat(),
            CollectiveKind::Exchange => pieces[(r + 1) % n].to_vec(),
            CollectiveKind::Permute => {
                let (s, _) = pairs(&self.ops).into_iter().find(|p| p.1 == r)?;
                pieces[s].to_vec()
            }
            CollectiveKind::Reduce | CollectiveKind::ReduceScatter => {
                let red = self.ops[0].reduce_op.unwrap_or(AluOp::Add);
                let dtype = self.ops[0].src.dtype;
                let mut acc = numerics::decode_all(dtype, pieces[0]);
                for p in &pieces[1..] {
                    for (x, y) in acc.iter_mut().zip(numerics::decode_all(dtype, p)) {
                        *x = super::alu::apply(red, *x, y);
                    }
                }
                rounder.encode_all(self.ops[r].dst.dtype, &acc)
            }
            CollectiveKind::AllToAllV => {
                let mut dst = own.dst.clone();
                for (i, b) in self.layout[r].iter().enumerate() {
                    dst[b.at * es..(b.at + b.len) * es].copy_from_slice(pieces[i]);
                }
                dst
            }
            CollectiveKind::Barrier => return None,
        };
        Some(Shared::new(bytes))
    }

    /// An in-place all_to_all's buffer of rank `r` and its block size in elements.
    pub fn in_place(&self, r: usize) -> Option<(&crate::memory::Ap, usize)> {
        let src = self.ops.get(r)?.src;
        Some((src, src.num_elements() / self.ops.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::combine;
    use super::*;
    use crate::engines::parse_program;
    use crate::numerics::config::NumericsConfig;

    const CORES: &str = "cores=[0,1,2,3]";

    /// Every collective of 4 ranks: `receive` from the `consumed` bytes alone is `combine`'s
    /// result for that rank, bit for bit, and `plan`'s timing facts are `combine`'s.
    #[test]
    fn receive_from_the_consumed_bytes_is_combine_for_every_kind() {
        let f = "hbm:float32+0[[0,1],[1,16]]";
        let cases = [
            format!("all_to_all.gpsimd dst=hbm:float32+64[[0,1],[1,16]] src={f} {CORES}"),
            format!("reduce_scatter.gpsimd dst=hbm:bfloat16+128[[0,1],[1,4]] src={f} {CORES} reduce_op=add"),
            format!("reduce_scatter.gpsimd dst=hbm:float32+128[[0,1],[1,4]] src={f} {CORES} reduce_op=maximum"),
            format!("all_reduce.gpsimd dst=hbm:bfloat16+64[[0,1],[1,16]] src={f} {CORES}"),
            format!("all_gather.gpsimd dst=hbm:float32+256[[0,1],[1,64]] src={f} {CORES}"),
            format!("collective_permute.gpsimd dst=hbm:float32+64[[0,1],[1,16]] src={f} {CORES} pairs=[0,1,1,2,3,0]"),
            format!("all_to_all_v.gpsimd dst=hbm:float32+64[[0,1],[1,16]] src={f} metadata=hbm:uint32+192[[4,2],[1,4]] {CORES}"),
        ];
        for text in &cases {
            let p = parse_program(&format!(".core 0\n{text}\n")).unwrap();
            let ranks: Vec<Rank> = (0..4)
                .map(|k| Rank {
                    core: k,
                    ins: &p.instrs[0],
                })
                .collect();
            let snaps: Vec<Snapshot> = (0..4u32)
                .map(|k| Snapshot {
                    src: (0..16u32)
                        .flat_map(|i| (1.1f32 + (k * 16 + i) as f32 * 0.37).to_le_bytes())
                        .collect(),
                    // all_to_all_v: rank k sends (k + j) % 3 elements to rank j, packed
                    counts: {
                        let c: Vec<i64> = (0..4).map(|j| (k as i64 + j) % 3).collect();
                        let d: Vec<i64> = c
                            .iter()
                            .scan(0, |a, x| {
                                *a += x;
                                Some(*a - x)
                            })
                            .collect();
                        [c, d].concat()
                    },
                    dst: vec![0xA5; 64],
                    deferred: false,
                })
                .collect();
            let rounder = Rounder::new(NumericsConfig::default(), 0, 0, 0, false);
            let (moved, outs) = combine(&ranks, &snaps, &rounder).unwrap();
            let metas: Vec<Meta> = snaps.iter().map(Meta::of).collect();
            let pl = plan(&ranks, &metas).unwrap();
            assert_eq!(pl.moved.src_bytes, moved.src_bytes, "{text}");
            assert_eq!(pl.moved.matrix, moved.matrix, "{text}");
            for r in 0..4 {
                let pieces: Vec<&[u8]> = (0..4).map(|i| &snaps[i].src[pl.consumed(i, r)]).collect();
                let got = pl.receive(r, &pieces, &snaps[r], &rounder);
                assert_eq!(got.as_deref(), outs[r].as_deref(), "{text} rank {r}");
            }
            // all_to_all sends each rank one block only
            if text.starts_with("all_to_all.") {
                assert_eq!(pl.consumed(2, 1), 16..32);
            }
        }
    }
}
