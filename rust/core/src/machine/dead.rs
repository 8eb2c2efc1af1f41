//! Dead instructions: an instruction whose on-chip result no later instruction reads, because
//! later writes overwrite it whole first or the program ends with it unread. The NKI front
//! end's pass `dead_code` removes them (`CompileConfig(dead_code_elim / remove_unused_instructions
//! / remove_overwritten_writes)`, docs/nki.md "Passes").
//!
//! Program order is the semantics, as for `repeats`. Only an instruction whose whole effect is
//! its on-chip output operands can go (`repeats::reusable`: deterministic, no random numbers, no
//! accumulator registers, no accumulating matmul, no register operands or run-time offsets, no
//! semaphores, no HBM write). A later instruction reads what its read operands touch (a run-time
//! offset: every byte it could reach, and its index tile), and a write that is not known to
//! replace every byte of its footprint (an accumulating matmul, a predicated copy, a
//! read-add-write DMA, anything not listed in `whole_write`) counts as a read too. A program with
//! a branch or a cross-core instruction is left alone (what runs after an instruction is then
//! not the program text after it, or another core may read this one's memory).
//!
//! One sweep from the end is the fixed point: whether an instruction is dead depends only on
//! the instructions after it, already decided (a removed one neither reads nor overwrites).

use super::region::Region;
use super::repeats::{ends_matches, reusable};
use crate::isa::{Arg, Instr, Opcode, Program};
use crate::memory::{DynSrc, Mem};

/// How far the scan for a result's reads goes (instructions); past it the result is kept.
const LIMIT: usize = 1 << 14;

/// Why an instruction is dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Nothing reads or overwrites any of its bytes before the program ends.
    Unused,
    /// Later writes overwrite every byte before anything reads one.
    Overwritten,
    /// Partly overwritten, the rest unread at the end.
    Both,
}

impl Why {
    pub fn name(self) -> &'static str {
        match self {
            Why::Unused => "unused",
            Why::Overwritten => "overwritten",
            Why::Both => "both",
        }
    }
}

/// Whether `ins` replaces every byte of its written operands' footprints (so an earlier
/// result there is gone, not read): full, non-accumulating writers with static operands.
pub(super) fn whole_write(ins: &Instr) -> bool {
    let ok = match ins.op {
        Opcode::TensorTensor
        | Opcode::TensorScalar
        | Opcode::TensorCopy
        | Opcode::Memset
        | Opcode::Iota
        | Opcode::ScalarTensorTensor
        | Opcode::NcTranspose
        | Opcode::Reciprocal
        | Opcode::TensorReduce
        | Opcode::Activation
        | Opcode::Activate2
        | Opcode::Exponential
        | Opcode::DmaCopy
        // (every element of dst assigned: scans, reductions into dst, selects with a fill value,
        // statistics; an accumulator register they also update is a separate effect)
        | Opcode::TensorTensorScan
        | Opcode::TensorScalarCumulative
        | Opcode::ActivationReduce
        | Opcode::TensorScalarReduce
        | Opcode::TensorPartitionReduce
        | Opcode::AffineSelect
        | Opcode::RangeSelect
        | Opcode::SelectReduce
        | Opcode::BnStats
        | Opcode::BnAggr
        | Opcode::Max8
        | Opcode::NcFindIndex8
        | Opcode::Dropout => true,
        Opcode::NcMatmul => {
            let spec = ins.op.spec();
            spec.params
                .iter()
                .position(|p| p.name == "accumulate")
                .is_some_and(|k| matches!(ins.args[k], Arg::Bool(false)))
        }
        _ => false,
    };
    ok && ins.args.iter().all(|a| match a {
        Arg::Reg(_) => false,
        Arg::Tensor(ap) => ap.dynamic.is_none(),
        _ => true,
    }) && !ins
        .tensors()
        .any(|(_, _, acc, _)| acc == crate::isa::spec::Access::ReadWrite)
}

/// The footprints instruction `ins` reads (module doc: a partial write counts as a read) and
/// those it overwrites whole.
fn footprints(core: u8, ins: &Instr) -> (Vec<Region>, Vec<Region>) {
    let whole = whole_write(ins);
    let (mut reads, mut kills) = (Vec::new(), Vec::new());
    for (_, _, acc, ap) in ins.tensors() {
        if let Some(DynSrc::Tile(t)) = ap.dynamic.as_deref().map(|d| &d.src) {
            reads.push(Region::new(core, t, false));
        }
        if ap.mem == Mem::Hbm {
            continue; // (results removed here are on chip)
        }
        let r = Region::new(core, ap, acc.writes());
        if acc.reads() || (acc.writes() && !whole) {
            reads.push(r.clone());
        }
        if acc.writes() && whole {
            kills.push(r);
        }
    }
    (reads, kills)
}

/// A footprint that is exactly its box (a static pattern with contiguous rows).
fn is_box(r: &Region) -> bool {
    !r.boxed && r.ap.is_none() && r.exact.is_none()
}

/// Does box `d` hold every byte of `r`'s box?
fn holds(d: &Region, r: &Region) -> bool {
    r.mem == d.mem && r.p0 >= d.p0 && r.p1 <= d.p1 && r.lo >= d.lo && r.hi <= d.hi
}

/// `r` without the bytes of box `w`: the pieces left (`r` itself when it is not a box and `w`
/// does not hold all of it).
fn subtract(r: &Region, w: &Region, out: &mut Vec<Region>) {
    if !r.overlaps(w) {
        out.push(r.clone());
        return;
    }
    if holds(w, r) {
        return;
    }
    if !is_box(r) {
        out.push(r.clone());
        return;
    }
    let piece = |p0: u32, p1: u32, lo: i128, hi: i128| Region {
        p0,
        p1,
        lo,
        hi,
        ..r.clone()
    };
    let (p0, p1) = (r.p0.max(w.p0), r.p1.min(w.p1));
    if r.p0 < p0 {
        out.push(piece(r.p0, p0, r.lo, r.hi));
    }
    if p1 < r.p1 {
        out.push(piece(p1, r.p1, r.lo, r.hi));
    }
    if r.lo < w.lo {
        out.push(piece(p0, p1, r.lo, w.lo));
    }
    if w.hi < r.hi {
        out.push(piece(p0, p1, w.hi, r.hi));
    }
}

/// The dead instructions of `prog` (module doc), ascending, each with why. `last`: nothing runs
/// after `prog` on its core, so a result still unread at its end is never read. Nothing
/// changes; remove them to apply.
pub fn find(prog: &Program, last: bool) -> Vec<(usize, Why)> {
    let n = prog.instrs.len();
    if prog.instrs.iter().any(|i| ends_matches(i.op)) {
        return Vec::new();
    }
    let core = prog.core;
    let fp: Vec<(Vec<Region>, Vec<Region>)> =
        prog.instrs.iter().map(|i| footprints(core, i)).collect();
    let mut dead = vec![false; n];
    let mut out = Vec::new();
    let (mut rest, mut next) = (Vec::new(), Vec::new());
    for i in (0..n).rev() {
        let ins = &prog.instrs[i];
        if !candidate(ins) {
            continue;
        }
        rest.clear();
        for (_, _, acc, ap) in ins.tensors() {
            if acc.writes() {
                rest.push(Region::new(core, ap, true));
            }
        }
        let mut killed = false;
        let mut why = None;
        let mut k = i + 1;
        loop {
            if rest.is_empty() {
                why = Some(Why::Overwritten);
                break;
            }
            if k == n {
                if last {
                    why = Some(if killed { Why::Both } else { Why::Unused });
                }
                break;
            }
            if k - i > LIMIT {
                break;
            }
            if !dead[k] {
                let (reads, kills) = &fp[k];
                if reads.iter().any(|r| rest.iter().any(|x| x.overlaps(r))) {
                    break;
                }
                for w in kills {
                    // (only a box is subtracted: a pattern with gaps may overwrite less)
                    if !is_box(w) || !rest.iter().any(|x| x.overlaps(w)) {
                        continue;
                    }
                    killed = true;
                    next.clear();
                    for x in &rest {
                        subtract(x, w, &mut next);
                    }
                    std::mem::swap(&mut rest, &mut next);
                }
            }
            k += 1;
        }
        if let Some(w) = why {
            dead[i] = true;
            out.push((i, w));
        }
    }
    out.reverse();
    out
}

/// Whether `ins` may be removed when its result is unread: a compute instruction (no DMA: a
/// queue's transfers stay as the kernel wrote them) whose whole effect is its on-chip results
/// (`reusable`).
fn candidate(ins: &Instr) -> bool {
    reusable(ins)
        && !crate::isa::validate::is_dma(ins)
        && ins
            .tensors()
            .all(|(_, _, acc, ap)| !acc.writes() || ap.mem != Mem::Hbm)
        && ins.tensors().any(|(_, _, acc, _)| acc.writes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::text::parse_program;

    fn dead(text: &str, last: bool) -> Vec<(usize, Why)> {
        find(&parse_program(&format!(".core 0\n{text}")).unwrap(), last)
    }

    fn tt(dst: u32, a: u32, b: u32) -> String {
        format!("tensor_tensor.vector dst=sbuf:float32[0:128]+{dst}[[1,64]] data1=sbuf:float32[0:128]+{a}[[1,64]] data2=sbuf:float32[0:128]+{b}[[1,64]] op=add\n")
    }

    fn memset(dst: u32, n: u32) -> String {
        format!("memset.gpsimd dst=sbuf:float32[0:128]+{dst}[[1,{n}]] value=1.0\n")
    }

    const STORE: &str =
        "dma_copy.sync dst=hbm:float32+0[[64,128],[1,64]] src=sbuf:float32[0:128]+4096[[1,64]]\n";

    #[test]
    fn an_overwritten_memset_and_an_unread_chain_are_dead() {
        // memset 4096, then the add overwrites it whole before the store reads it
        let p = format!("{}{}{STORE}", memset(4096, 64), tt(4096, 0, 1024));
        assert_eq!(dead(&p, true), vec![(0, Why::Overwritten)]);
        // a chain into 8192 -> 9216 that nothing stores: both dead (one sweep), unread at the end
        let p = format!("{}{}{STORE}", tt(8192, 0, 1024), tt(9216, 8192, 0));
        assert_eq!(dead(&p, true), vec![(0, Why::Unused), (1, Why::Unused)]);
        // not the last program: a result left in place may be read later
        assert_eq!(dead(&p, false), vec![]);
    }

    #[test]
    fn a_partial_overwrite_or_a_read_keeps_it() {
        // half overwritten, then the store reads the whole tile
        let p = format!("{}{}{STORE}", memset(4096, 64), memset(4096, 32));
        assert_eq!(dead(&p, true), vec![]);
        // half overwritten by a write that is read, the rest never read: dead under "both"
        let half = "dma_copy.sync dst=hbm:float32+0[[32,128],[1,32]] src=sbuf:float32[0:128]+8192[[1,32]]\n";
        let p = format!("{}{}{half}", memset(8192, 64), memset(8192, 32));
        assert_eq!(dead(&p, true), vec![(0, Why::Both)]);
        // the overwriting half unread too: removed first, so the first is simply unused
        let p = format!("{}{}", memset(8192, 64), memset(8192, 32));
        assert_eq!(dead(&p, true), vec![(0, Why::Unused), (1, Why::Unused)]);
        // two halves overwrite it whole
        let p = format!(
            "{}{}memset.vector dst=sbuf:float32[0:128]+4224[[1,32]] value=2.0\n{STORE}",
            memset(4096, 64),
            memset(4096, 32)
        );
        assert_eq!(dead(&p, true), vec![(0, Why::Overwritten)]);
    }

    #[test]
    fn accumulation_hbm_writes_and_branches_stay() {
        let mm = |acc: bool| {
            format!("nc_matmul.tensor dst=psum:float32[0:128]+0[[1,64]] stationary=sbuf:float32[0:128]+0[[1,128]] moving=sbuf:float32[0:128]+1024[[1,64]] accumulate={acc}\n")
        };
        let copy = "tensor_copy.vector dst=sbuf:float32[0:128]+4096[[1,64]] src=psum:float32[0:128]+0[[1,64]]\n";
        // the first matmul's partial is read by the accumulating one (a partial write)
        let p = format!("{}{}{copy}{STORE}", mm(false), mm(true));
        assert_eq!(dead(&p, true), vec![]);
        // an overwriting matmul replaces it: the first is dead
        let p = format!("{}{}{copy}{STORE}", mm(false), mm(false));
        assert_eq!(dead(&p, true), vec![(0, Why::Overwritten)]);
        // the store itself (HBM) never goes, even with nothing after it
        assert_eq!(dead(&format!("{}{STORE}", tt(4096, 0, 1024)), true), vec![]);
        // nor a load, nor anything in a program with a branch
        let load = "dma_copy.sync dst=sbuf:float32[0:128]+8192[[1,64]] src=hbm:float32+0[[64,128],[1,64]]\n";
        assert_eq!(dead(load, true), vec![]);
        let p = format!("{}branch.vector target=0\n", tt(8192, 0, 1024));
        assert_eq!(dead(&p, true), vec![]);
        assert_eq!(dead(&tt(8192, 0, 1024), true), vec![(0, Why::Unused)]);
        // random numbers never go
        assert_eq!(
            dead("rng.gpsimd dst=sbuf:uint32[0:128]+0[[1,64]]\n", true),
            vec![]
        );
    }
}
