//! Exact repeats: instructions that repeat an earlier instruction's encoding (opcode, engine and
//! every operand) when nothing either of them touches was written in between, so the earlier
//! result is still in place and running the repeat again changes no byte. The NKI front end's
//! pass `value_reuse` drops them (docs/nki.md, "Passes").
//!
//! Program order is the semantics: "in between" means any instruction of any engine or DMA queue
//! between the two in the program (automatic synchronisation, run after the pass, orders the
//! rest). Only deterministic instructions whose whole effect is their output operands qualify:
//! no random numbers (`rng`, `rand2`, `dropout`, RNG state), no accumulator registers
//! (`reduce_cmd` other than idle, `reduce_res`), no accumulating matmuls, no register operands or
//! run-time offsets, no HBM writes, no collectives, and no instruction that reads its own output
//! (`x = x + 1` twice is two increments). A `branch` or a cross-core instruction ends every
//! match (what runs between two instructions is then no longer the program text between them).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::region::{regions_into, Region};
use crate::isa::{Arg, Instr, Opcode, Program};
use crate::memory::{Ap, Mem};

/// Bucket width of the write index: 2 KiB of a partition on chip (an SBUF partition is at most
/// 128 such buckets, a PSUM bank one), 64 KiB of HBM.
const ONCHIP_SHIFT: u32 = 11;
const HBM_SHIFT: u32 = 16;
/// A footprint over more buckets than this is kept in (or, as a write, checked against) one
/// list of its own rather than bucket by bucket.
const MAX_BUCKETS: i128 = 64;

/// Whether `ins` may be dropped as a repeat (and kept as an earlier instance): deterministic,
/// no effect beyond its output operands, no run-time addresses, no semaphores.
pub fn reusable(ins: &Instr) -> bool {
    if !ins.waits.is_empty() || !ins.signals.is_empty() {
        return false;
    }
    let spec = ins.op.spec();
    let arg = |name: &str| {
        spec.params
            .iter()
            .position(|p| p.name == name)
            .map(|k| &ins.args[k])
    };
    let absent = |name: &str| matches!(arg(name), None | Some(Arg::Absent));
    let ok = match ins.op {
        Opcode::NcTranspose
        | Opcode::TensorTensor
        | Opcode::TensorScalar
        | Opcode::TensorCopy
        | Opcode::Memset
        | Opcode::Iota
        | Opcode::ScalarTensorTensor
        | Opcode::TensorReduce
        | Opcode::TensorTensorScan
        | Opcode::Reciprocal
        | Opcode::BnStats
        | Opcode::BnAggr
        | Opcode::Max8
        | Opcode::NcFindIndex8
        | Opcode::NcMatchReplace8
        | Opcode::NcStreamShuffle
        | Opcode::TensorPartitionReduce
        | Opcode::AffineSelect
        | Opcode::QuantizeMx
        | Opcode::SequenceBounds
        | Opcode::NonzeroWithCount
        | Opcode::Topk => true,
        // Without the accumulator registers (idle command, no read-out): a function of the inputs.
        Opcode::Activation | Opcode::Activate2 | Opcode::Exponential => {
            matches!(arg("reduce_cmd"), None | Some(Arg::Absent) | Some(Arg::Enum(0)))
                && absent("reduce_res")
                && (ins.op != Opcode::Activation || absent("reduce_op"))
        }
        // Overwriting matmuls only (an accumulating one adds to what the PSUM holds).
        Opcode::NcMatmul | Opcode::NcMatmulMx | Opcode::NcMatmulSparse => {
            matches!(arg("accumulate"), Some(Arg::Bool(false)))
        }
        // Loads into on-chip memory (a DMA writing HBM changes what others read).
        Opcode::DmaCopy | Opcode::DmaTranspose => ins
            .tensors()
            .all(|(_, _, acc, ap)| !acc.writes() || ap.mem != Mem::Hbm),
        _ => false,
    };
    ok && ins.args.iter().all(|a| match a {
        Arg::Reg(_) => false,
        Arg::Tensor(ap) => ap.dynamic.is_none(),
        _ => true,
    }) && !ins.tensors().any(|(_, _, acc, _)| {
        acc == crate::isa::spec::Access::ReadWrite
    })
}

/// After `ins` nothing matches across it: control flow and instructions ordered against other cores.
fn ends_matches(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Branch
            | Opcode::Sendrecv
            | Opcode::CoreBarrier
            | Opcode::AllReduce
            | Opcode::AllGather
            | Opcode::ReduceScatter
            | Opcode::AllToAll
            | Opcode::AllToAllV
            | Opcode::CollectivePermute
    )
}

/// The encoding's hash (opcode, engine, operands; not the name, which is a label).
fn key_hash(ins: &Instr) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (ins.op as u16).hash(&mut h);
    (ins.engine as u8).hash(&mut h);
    for a in &ins.args {
        match a {
            Arg::Absent => 0u8.hash(&mut h),
            Arg::Tensor(ap) => {
                1u8.hash(&mut h);
                hash_ap(ap, &mut h);
            }
            Arg::F32(v) => (2u8, v.to_bits()).hash(&mut h),
            Arg::I32(v) => (3u8, *v).hash(&mut h),
            Arg::Bool(v) => (4u8, *v).hash(&mut h),
            Arg::Enum(v) => (5u8, *v).hash(&mut h),
            Arg::Ints(v) => (6u8, v).hash(&mut h),
            Arg::Reg(v) => (7u8, *v).hash(&mut h),
        }
    }
    h.finish()
}

fn hash_ap(ap: &Ap, h: &mut impl Hasher) {
    (ap.mem as u8, ap.dtype as u8, ap.start, ap.parts, ap.pstep, ap.offset).hash(h);
    ap.dims.hash(h);
}

fn same_encoding(a: &Instr, b: &Instr) -> bool {
    a.op == b.op && a.engine == b.engine && a.args == b.args
}

/// The buckets of a footprint: (memory, partition-independent bucket range), or None when it
/// spans more than `MAX_BUCKETS`.
fn buckets(r: &Region) -> Option<(u8, i128, i128)> {
    let shift = if r.mem == Mem::Hbm {
        HBM_SHIFT
    } else {
        ONCHIP_SHIFT
    };
    let (a, b) = (r.lo >> shift, (r.hi - 1).max(r.lo) >> shift);
    (b - a < MAX_BUCKETS).then_some((r.mem as u8, a, b))
}

struct Entry {
    instr: usize,
    /// The entry's footprints: `regs[from..to]` of the pass's one list.
    from: usize,
    to: usize,
}

/// Every exact repeat of `prog`: (index of the repeat, index of the earlier instance it
/// repeats), ascending. An instruction found to be a repeat is taken as not run, so a later
/// copy of it repeats the same earlier instance.
pub fn exact_repeats(prog: &Program) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut regs: Vec<Region> = Vec::new();
    let mut entries: Vec<Option<Entry>> = Vec::new();
    let mut by_key: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut by_bucket: HashMap<(u8, i128), Vec<u32>> = HashMap::new();
    let mut wide: Vec<u32> = Vec::new();
    let mut live = 0usize;
    let mut tmp: Vec<Region> = Vec::new();
    for (i, ins) in prog.instrs.iter().enumerate() {
        if ends_matches(ins.op) {
            entries.clear();
            by_key.clear();
            by_bucket.clear();
            wide.clear();
            regs.clear();
            live = 0;
            continue;
        }
        let candidate = reusable(ins);
        let key = if candidate { key_hash(ins) } else { 0 };
        if candidate {
            if let Some(ids) = by_key.get(&key) {
                let hit = ids.iter().find_map(|&id| {
                    let e = entries[id as usize].as_ref()?;
                    same_encoding(&prog.instrs[e.instr], ins).then_some(e.instr)
                });
                if let Some(j) = hit {
                    out.push((i, j));
                    continue; // (not run: it would write the bytes it finds)
                }
            }
        }
        tmp.clear();
        regions_into(prog.core, ins, &mut tmp);
        // Its writes end every entry whose footprint they meet.
        for w in tmp.iter().filter(|r| r.write) {
            let mut kill = |id: u32, entries: &mut Vec<Option<Entry>>| {
                let hit = entries[id as usize]
                    .as_ref()
                    .is_some_and(|e| regs[e.from..e.to].iter().any(|r| r.overlaps(w)));
                if hit {
                    entries[id as usize] = None;
                    live -= 1;
                }
            };
            match buckets(w) {
                Some((m, a, b)) => {
                    for k in a..=b {
                        if let Some(ids) = by_bucket.get_mut(&(m, k)) {
                            ids.retain(|&id| entries[id as usize].is_some());
                            for &id in ids.iter() {
                                kill(id, &mut entries);
                            }
                        }
                    }
                    wide.retain(|&id| entries[id as usize].is_some());
                    for &id in &wide {
                        kill(id, &mut entries);
                    }
                }
                None => {
                    for id in 0..entries.len() as u32 {
                        kill(id, &mut entries);
                    }
                }
            }
        }
        if !candidate {
            continue;
        }
        // An instruction that reads bytes it writes changes its own input: never a repeat.
        let self_read = tmp
            .iter()
            .filter(|r| !r.write)
            .any(|r| tmp.iter().any(|w| w.write && w.overlaps(r)));
        if self_read {
            continue;
        }
        let id = entries.len() as u32;
        let from = regs.len();
        regs.extend(tmp.drain(..));
        let to = regs.len();
        for r in &regs[from..to] {
            match buckets(r) {
                Some((m, a, b)) => {
                    for k in a..=b {
                        let v = by_bucket.entry((m, k)).or_default();
                        if v.last() != Some(&id) {
                            v.push(id);
                        }
                    }
                }
                None => {
                    if wide.last() != Some(&id) {
                        wide.push(id);
                    }
                }
            }
        }
        entries.push(Some(Entry { instr: i, from, to }));
        live += 1;
        let ids = by_key.entry(key).or_default();
        ids.retain(|&k| entries[k as usize].is_some());
        ids.push(id);
        // Keep the lists small: when most entries are dead, start the index afresh.
        if entries.len() > 4096 && live * 4 < entries.len() {
            compact(&mut entries, &mut regs, &mut by_key, &mut by_bucket, &mut wide, prog);
        }
    }
    out
}

/// Rebuild the index from the live entries only (ids renumbered).
fn compact(
    entries: &mut Vec<Option<Entry>>,
    regs: &mut Vec<Region>,
    by_key: &mut HashMap<u64, Vec<u32>>,
    by_bucket: &mut HashMap<(u8, i128), Vec<u32>>,
    wide: &mut Vec<u32>,
    prog: &Program,
) {
    let old = std::mem::take(entries);
    let old_regs = std::mem::take(regs);
    by_key.clear();
    by_bucket.clear();
    wide.clear();
    for e in old.into_iter().flatten() {
        let id = entries.len() as u32;
        let from = regs.len();
        regs.extend(old_regs[e.from..e.to].iter().cloned());
        let to = regs.len();
        for r in &regs[from..to] {
            match buckets(r) {
                Some((m, a, b)) => {
                    for k in a..=b {
                        let v = by_bucket.entry((m, k)).or_default();
                        if v.last() != Some(&id) {
                            v.push(id);
                        }
                    }
                }
                None => {
                    if wide.last() != Some(&id) {
                        wide.push(id);
                    }
                }
            }
        }
        by_key
            .entry(key_hash(&prog.instrs[e.instr]))
            .or_default()
            .push(id);
        entries.push(Some(Entry {
            instr: e.instr,
            from,
            to,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::text::parse_program;

    fn repeats(text: &str) -> Vec<(usize, usize)> {
        exact_repeats(&parse_program(text).unwrap())
    }

    const MUL: &str = "tensor_tensor.vector dst=sbuf:float32[0:128]+4096[[1,64]] data1=sbuf:float32[0:128]+0[[1,64]] data2=sbuf:float32[0:128]+1024[[1,64]] op=multiply\n";

    #[test]
    fn a_repeat_on_unchanged_tiles_is_found() {
        let p = format!(".core 0\n{MUL}{MUL}{MUL}");
        assert_eq!(repeats(&p), vec![(1, 0), (2, 0)]);
    }

    #[test]
    fn a_write_to_an_input_or_the_output_in_between_ends_the_match() {
        for mid in [
            "memset.gpsimd dst=sbuf:float32[0:128]+1020[[1,2]] value=1.0\n", // last byte of data1 .. into data2
            "memset.vector dst=sbuf:float32[0:1]+4348[[1,1]] value=1.0\n",   // last element of dst
            "dma_copy.sync dst=sbuf:float32[0:1]+0[[1,1]] src=hbm:float32+0[[1,1],[1,1]]\n",
        ] {
            let p = format!(".core 0\n{MUL}{mid}{MUL}");
            assert_eq!(repeats(&p), vec![], "{mid}");
        }
        // a write elsewhere (another partition range) does not
        let mid = "memset.gpsimd dst=sbuf:float32[0:128]+8192[[1,64]] value=1.0\n";
        assert_eq!(repeats(&format!(".core 0\n{MUL}{mid}{MUL}")), vec![(2, 0)]);
    }

    #[test]
    fn in_place_accumulate_and_random_are_never_repeats() {
        let inc = "tensor_scalar.vector dst=sbuf:float32[0:128]+0[[1,64]] data=sbuf:float32[0:128]+0[[1,64]] op0=add operand0=1.0\n";
        assert_eq!(repeats(&format!(".core 0\n{inc}{inc}")), vec![]);
        let rng = "rng.gpsimd dst=sbuf:uint32[0:128]+0[[1,64]]\n";
        assert_eq!(repeats(&format!(".core 0\n{rng}{rng}")), vec![]);
    }
}
