//! Forwarding an on-chip copy to its readers: the NKI front end's pass `psum_forward`
//! (docs/nki.md, "Passes") drops the copy that follows a partition broadcast's matmul
//! (`nl.broadcast_to`), as the toolchain counts that broadcast as one TensorE instruction, and
//! lets the copy's readers read the PSUM result instead; the pass `copy_forward`
//! (`CompileConfig(tensor_copy_elim=True)`: a `tensor_copy` "whose readers can read the source
//! directly") does the same for any same-dtype on-chip copy (`Copies::Any`).
//!
//! A copy qualifies when its source and destination are the same pattern of the same dtype on the
//! same partitions (only the memory and the offset differ: a same-dtype copy is the identity on
//! the bits), not overlapping, and every later read of the destination's bytes, up to the
//! instruction that overwrites them whole (or the program's end when nothing runs after it), can
//! read the source instead: reading within the destination, none of it through a run-time
//! offset, valid with the moved operand (from PSUM: a VectorE or ScalarE instruction with no
//! other PSUM operand); and nothing writes the source until the last such read. A write to the
//! destination that is not known to replace it whole (`dead::whole_write`) keeps the copy.

use super::region::Region;
use crate::isa::spec::Access;
use crate::isa::{Arg, Engine, Instr, Opcode, Program};
use crate::memory::{Ap, DynSrc, Mem};

/// How far the search for the destination's reads goes (instructions).
const LIMIT: usize = 1 << 14;

/// Whether `d` holds every byte of `r`.
fn holds(d: &Region, r: &Region) -> bool {
    r.mem == d.mem && r.p0 >= d.p0 && r.p1 <= d.p1 && r.lo >= d.lo && r.hi <= d.hi
}

/// Which copies may be forwarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copies {
    /// PSUM -> SBUF only (a partition broadcast's copy: `psum_forward`).
    Psum,
    /// Any on-chip copy of one dtype (`copy_forward`).
    Any,
}

/// The copy's (source, destination) when it is a copy of one pattern that `which` takes.
fn copy_ends(ins: &Instr, which: Copies) -> Option<(&Ap, &Ap)> {
    if ins.op != Opcode::TensorCopy
        || !ins.waits.is_empty()
        || !ins.signals.is_empty()
        || ins.args.iter().any(|a| matches!(a, Arg::Reg(_)))
    {
        return None;
    }
    let (mut src, mut dst) = (None, None);
    for (_, name, acc, ap) in ins.tensors() {
        match (name, acc) {
            ("src", Access::Read) => src = Some(ap),
            ("dst", Access::Write) => dst = Some(ap),
            _ => return None,
        }
    }
    let (s, d) = (src?, dst?);
    let mems = match which {
        Copies::Psum => s.mem == Mem::Psum && d.mem == Mem::Sbuf,
        Copies::Any => s.mem != Mem::Hbm && d.mem != Mem::Hbm,
    };
    let same = mems
        && s.dynamic.is_none()
        && d.dynamic.is_none()
        && (s.dtype, s.start, s.parts, s.pstep, &s.dims)
            == (d.dtype, d.start, d.parts, d.pstep, &d.dims);
    same.then_some((s, d))
}

/// The operand moves that let the readers of copy `i`'s destination read its source:
/// [(instruction, operand, the operand moved to the source)], or None when some read cannot
/// (module doc). `last`: nothing runs after `prog` on its core.
pub fn plan(
    prog: &Program,
    i: usize,
    last: bool,
    which: Copies,
) -> Option<Vec<(usize, usize, Ap)>> {
    let core = prog.core;
    let (src, dst) = copy_ends(prog.instrs.get(i)?, which)?;
    let (rs, rd) = (Region::new(core, src, false), Region::new(core, dst, true));
    if rd.boxed || rd.ap.is_some() || rs.boxed || rs.ap.is_some() || rs.overlaps(&rd) {
        return None; // (not a box: a pattern with gaps; or a copy onto itself)
    }
    let from_psum = src.mem == Mem::Psum;
    let shift = src.offset as i64 - dst.offset as i64;
    let mut moves = Vec::new();
    let mut psum_written = false;
    for (k, ins) in prog.instrs.iter().enumerate().skip(i + 1).take(LIMIT) {
        if super::repeats::ends_matches(ins.op) {
            return None;
        }
        let mut reads = Vec::new();
        let (mut dead, mut psum_other) = (false, false);
        for (a, _, acc, ap) in ins.tensors() {
            if let Some(DynSrc::Tile(t)) = ap.dynamic.as_deref().map(|d| &d.src) {
                if Region::new(core, t, false).overlaps(&rd) {
                    return None;
                }
            }
            let r = Region::new(core, ap, acc.writes());
            if acc.writes() && r.overlaps(&rs) {
                psum_written = true;
            }
            if ap.mem == Mem::Psum {
                psum_other = true;
            }
            if !r.overlaps(&rd) {
                continue;
            }
            if acc == Access::ReadWrite || ap.dynamic.is_some() {
                return None;
            }
            if acc.writes() {
                if r.boxed || r.ap.is_some() || !holds(&r, &rd) || !super::dead::whole_write(ins) {
                    return None; // (part of the destination would stay in use)
                }
                dead = true;
            } else if holds(&rd, &r) {
                reads.push(a);
            } else {
                return None;
            }
        }
        if !reads.is_empty() {
            if psum_written
                || (from_psum
                    && (psum_other || !matches!(ins.engine, Engine::Vector | Engine::Scalar)))
            {
                return None;
            }
            let mut moved = ins.clone();
            for &a in &reads {
                if let Some(Arg::Tensor(ap)) = moved.args.get_mut(a) {
                    ap.mem = src.mem;
                    ap.offset = ap.offset.checked_add_signed(shift)?;
                    moves.push((k, a, ap.clone()));
                }
            }
            crate::engines::validate(&moved).ok()?;
        }
        if dead {
            return Some(moves);
        }
    }
    (last && prog.instrs.len() <= i + 1 + LIMIT).then_some(moves)
}

/// Forward each copy of `copies` (ascending indices) that qualifies: its readers moved to its
/// source in `prog`. Returns the copies to remove (ascending) and the reads moved; the caller
/// removes them (`Assembler::forward_copies`, which keeps its bookkeeping by index).
pub fn forward(
    prog: &mut Program,
    copies: &[usize],
    last: bool,
    which: Copies,
) -> (Vec<usize>, usize) {
    let mut gone = Vec::new();
    let mut moved = 0;
    for &i in copies {
        // (the copies stay in place for the plans after them: indices hold)
        if let Some(moves) = plan(prog, i, last, which) {
            moved += moves.len();
            for (k, a, ap) in moves {
                prog.instrs[k].args[a] = Arg::Tensor(ap);
            }
            gone.push(i);
        }
    }
    (gone, moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::text::parse_program;

    const MM: &str = "nc_matmul.tensor dst=psum:float32[0:128]+2048[[1,64]] stationary=sbuf:float32[0:1]+0[[1,128]] moving=sbuf:float32[0:1]+512[[1,64]] accumulate=false\n";
    const COPY: &str = "tensor_copy.scalar dst=sbuf:float32[0:128]+4096[[1,64]] src=psum:float32[0:128]+2048[[1,64]]\n";
    fn tt(engine: &str, a: u32) -> String {
        format!("tensor_tensor.{engine} dst=sbuf:float32[0:128]+8192[[1,64]] data1=sbuf:float32[0:128]+{a}[[1,64]] data2=sbuf:float32[0:128]+1024[[1,64]] op=multiply\n")
    }

    #[test]
    fn a_broadcast_copy_read_by_vector_engine_is_forwarded() {
        let text = format!(".core 0\n{MM}{COPY}{}", tt("vector", 4096));
        let mut p = parse_program(&text).unwrap();
        let (gone, moved) = forward(&mut p, &[1], true, Copies::Psum);
        assert_eq!((gone, moved), (vec![1], 1));
        let ap = p.instrs[2].args[1].tensor().unwrap();
        assert_eq!((ap.mem, ap.offset), (Mem::Psum, 2048));
    }

    #[test]
    fn a_copy_whose_destination_a_dma_gpsimd_or_psum_reader_reads_is_kept() {
        let dma = "dma_copy.sync dst=hbm:float32+0[[64,128],[1,64]] src=sbuf:float32[0:128]+4096[[1,64]]\n";
        let two_psum = "tensor_tensor.vector dst=sbuf:float32[0:128]+8192[[1,64]] data1=sbuf:float32[0:128]+4096[[1,64]] data2=psum:float32[0:128]+0[[1,64]] op=add\n";
        for reader in [dma.to_string(), tt("gpsimd", 4096), two_psum.to_string()] {
            let mut p = parse_program(&format!(".core 0\n{MM}{COPY}{reader}")).unwrap();
            assert_eq!(
                forward(&mut p, &[1], true, Copies::Psum),
                (vec![], 0),
                "{reader}"
            );
        }
        // the PSUM source rewritten before the read
        let again = MM.replace(
            "moving=sbuf:float32[0:1]+512",
            "moving=sbuf:float32[0:1]+768",
        );
        let mut p =
            parse_program(&format!(".core 0\n{MM}{COPY}{again}{}", tt("vector", 4096))).unwrap();
        assert_eq!(forward(&mut p, &[1], true, Copies::Psum), (vec![], 0));
        // read after the program when something runs after it (a device loop's segment)
        let mut p = parse_program(&format!(".core 0\n{MM}{COPY}{}", tt("vector", 4096))).unwrap();
        assert_eq!(forward(&mut p, &[1], false, Copies::Psum), (vec![], 0));
    }

    const SCOPY: &str = "tensor_copy.gpsimd dst=sbuf:float32[0:128]+4096[[1,64]] src=sbuf:float32[0:128]+0[[1,64]]\n";
    const STORE: &str =
        "dma_copy.sync dst=hbm:float32+0[[64,128],[1,64]] src=sbuf:float32[0:128]+4096[[1,64]]\n";

    #[test]
    fn any_same_dtype_copy_is_forwarded_to_gpsimd_and_dma_readers() {
        let text = format!(".core 0\n{SCOPY}{}{STORE}", tt("gpsimd", 4096));
        let mut p = parse_program(&text).unwrap();
        assert_eq!(forward(&mut p, &[0], true, Copies::Psum), (vec![], 0));
        assert_eq!(forward(&mut p, &[0], true, Copies::Any), (vec![0], 2));
        for k in [1, 2] {
            let a = p.instrs[k]
                .tensors()
                .find(|(_, n, _, _)| *n != "dst")
                .unwrap()
                .3;
            assert_eq!((a.mem, a.offset), (Mem::Sbuf, 0), "{k}");
        }
    }

    #[test]
    fn a_copy_is_kept_when_its_source_changes_or_a_read_reaches_past_it() {
        let over_src = "memset.vector dst=sbuf:float32[0:128]+0[[1,4]] value=1.0\n";
        let half_dst = "memset.vector dst=sbuf:float32[0:128]+4096[[1,32]] value=1.0\n";
        let wide = "dma_copy.sync dst=hbm:float32+0[[65,128],[1,65]] src=sbuf:float32[0:128]+4096[[1,65]]\n";
        let cast = SCOPY.replace("dst=sbuf:float32", "dst=sbuf:bfloat16");
        for text in [
            format!("{SCOPY}{over_src}{STORE}"),
            format!("{SCOPY}{half_dst}{STORE}"),
            format!("{SCOPY}{wide}"),
            cast.clone(),
        ] {
            let mut p = parse_program(&format!(".core 0\n{text}")).unwrap();
            assert_eq!(
                forward(&mut p, &[0], true, Copies::Any),
                (vec![], 0),
                "{text}"
            );
        }
        // not the last program: the destination may be read after it
        let mut p = parse_program(&format!(".core 0\n{SCOPY}{STORE}")).unwrap();
        assert_eq!(forward(&mut p, &[0], false, Copies::Any), (vec![], 0));
    }
}
