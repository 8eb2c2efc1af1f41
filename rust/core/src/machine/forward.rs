//! Forwarding a PSUM -> SBUF copy to its readers: the NKI front end's pass `psum_forward`
//! (docs/nki.md, "Passes") drops the copy that follows a partition broadcast's matmul
//! (`nl.broadcast_to`), as the toolchain counts that broadcast as one TensorE instruction, and
//! lets the copy's readers read the PSUM result instead.
//!
//! A copy qualifies when its source and destination are the same pattern of the same dtype on the
//! same partitions (only the memory and the offset differ), and every later read of the
//! destination's bytes, up to the instruction that overwrites them whole (or the program's end
//! when nothing runs after it), can read PSUM instead: a VectorE or ScalarE instruction with no
//! other PSUM operand, reading within the destination, none of it through a run-time offset, and
//! valid with the moved operand; and nothing writes the PSUM source until the last such read.

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

/// The copy's (source, destination) when it is a PSUM -> SBUF copy of one pattern.
fn copy_ends(ins: &Instr) -> Option<(&Ap, &Ap)> {
    if ins.op != Opcode::TensorCopy || !ins.waits.is_empty() || !ins.signals.is_empty() {
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
    let same = s.mem == Mem::Psum
        && d.mem == Mem::Sbuf
        && s.dynamic.is_none()
        && d.dynamic.is_none()
        && (s.dtype, s.start, s.parts, s.pstep, &s.dims)
            == (d.dtype, d.start, d.parts, d.pstep, &d.dims);
    same.then_some((s, d))
}

/// The operand moves that let the readers of copy `i`'s destination read its PSUM source:
/// [(instruction, operand, the operand in PSUM)], or None when some read cannot (module doc).
/// `last`: nothing runs after `prog` on its core.
pub fn plan(prog: &Program, i: usize, last: bool) -> Option<Vec<(usize, usize, Ap)>> {
    let core = prog.core;
    let (src, dst) = copy_ends(prog.instrs.get(i)?)?;
    let (rs, rd) = (Region::new(core, src, false), Region::new(core, dst, true));
    if rd.boxed || rd.ap.is_some() || rs.boxed || rs.ap.is_some() {
        return None; // (not a box: a pattern with gaps)
    }
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
                if r.boxed || r.ap.is_some() || !holds(&r, &rd) {
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
            if psum_written || psum_other || !matches!(ins.engine, Engine::Vector | Engine::Scalar)
            {
                return None;
            }
            let mut moved = ins.clone();
            for &a in &reads {
                if let Some(Arg::Tensor(ap)) = moved.args.get_mut(a) {
                    ap.mem = Mem::Psum;
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

/// Forward each copy of `copies` (ascending indices) that qualifies: its readers moved to PSUM
/// in `prog`. Returns the copies to remove (ascending) and the reads moved; the caller removes
/// them (`Assembler::forward_copies`, which keeps its bookkeeping by index).
pub fn forward(prog: &mut Program, copies: &[usize], last: bool) -> (Vec<usize>, usize) {
    let mut gone = Vec::new();
    let mut moved = 0;
    for &i in copies {
        // (the copies stay in place for the plans after them: indices hold)
        if let Some(moves) = plan(prog, i, last) {
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
        let (gone, moved) = forward(&mut p, &[1], true);
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
            assert_eq!(forward(&mut p, &[1], true), (vec![], 0), "{reader}");
        }
        // the PSUM source rewritten before the read
        let again = MM.replace(
            "moving=sbuf:float32[0:1]+512",
            "moving=sbuf:float32[0:1]+768",
        );
        let mut p =
            parse_program(&format!(".core 0\n{MM}{COPY}{again}{}", tt("vector", 4096))).unwrap();
        assert_eq!(forward(&mut p, &[1], true), (vec![], 0));
        // read after the program when something runs after it (a device loop's segment)
        let mut p = parse_program(&format!(".core 0\n{MM}{COPY}{}", tt("vector", 4096))).unwrap();
        assert_eq!(forward(&mut p, &[1], false), (vec![], 0));
    }
}
