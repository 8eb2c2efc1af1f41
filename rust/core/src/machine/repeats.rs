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
//!
//! With `rename`, a compute instruction (not a DMA) that differs from the earlier instance only
//! in where its one SBUF result goes (a fresh tile per loop iteration) is dropped too, when every later read of its
//! result can read the earlier result instead: each such read lies within the result's bytes and
//! is moved to the earlier result's, which nothing writes until the last of them, and the
//! result's bytes are overwritten whole (by one contiguous write) before the program ends
//! (`rename_plan`). Otherwise it is kept.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use std::borrow::Cow;

use super::region::{regions_into, Region};
use crate::isa::spec::Access;
use crate::isa::{Arg, Instr, Opcode, Program};
use crate::memory::{Ap, DynSrc, Mem};

/// How far `rename_plan` looks for the reads of a repeat's result (instructions).
const RENAME_LIMIT: usize = 1 << 14;

/// Bucket width of the write index: 2 KiB of a partition on chip (an SBUF partition is at most
/// 128 such buckets, a PSUM bank one), 64 KiB of HBM.
const ONCHIP_SHIFT: u32 = 11;
const HBM_SHIFT: u32 = 16;
/// A footprint over more buckets than this is kept in (or, as a write, checked against) one
/// list of its own rather than bucket by bucket.
const MAX_BUCKETS: i128 = 64;

/// A multiply-rotate hasher (the keys are already hashes or small integers; SipHash's
/// resistance to chosen keys is not needed and cost a third of the pass).
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64);
    }
    fn write_u16(&mut self, v: u16) {
        self.write_u64(v as u64);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_i32(&mut self, v: i32) {
        self.write_u64(v as u32 as u64);
    }
    fn write_i64(&mut self, v: i64) {
        self.write_u64(v as u64);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

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
            matches!(
                arg("reduce_cmd"),
                None | Some(Arg::Absent) | Some(Arg::Enum(0))
            ) && absent("reduce_res")
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
    }) && !ins
        .tensors()
        .any(|(_, _, acc, _)| acc == crate::isa::spec::Access::ReadWrite)
}

/// After `ins` nothing matches across it: control flow and instructions ordered against other cores.
pub(super) fn ends_matches(op: Opcode) -> bool {
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
    let mut h = Fx::default();
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

/// `key_hash` without the offsets of written operands (a repeat whose result goes elsewhere).
fn moved_key_hash(ins: &Instr) -> u64 {
    let mut h = Fx::default();
    (ins.op as u16, ins.engine as u8, 99u8).hash(&mut h);
    for ((a, p), k) in ins.args.iter().zip(ins.op.spec().params.iter()).zip(0u64..) {
        match a {
            Arg::Tensor(ap) if p.access.writes() => {
                (ap.mem as u8, ap.dtype as u8, ap.start, ap.parts, ap.pstep).hash(&mut h);
                ap.dims.hash(&mut h);
            }
            Arg::Tensor(ap) => hash_ap(ap, &mut h),
            Arg::F32(v) => v.to_bits().hash(&mut h),
            Arg::I32(v) => v.hash(&mut h),
            Arg::Bool(v) => v.hash(&mut h),
            Arg::Enum(v) => v.hash(&mut h),
            Arg::Ints(v) => v.hash(&mut h),
            Arg::Reg(v) => v.hash(&mut h),
            Arg::Absent => k.hash(&mut h),
        }
    }
    h.finish()
}

/// The one written operand of `i` and its byte distance from `j`'s, when `i` is `j` with only
/// that operand's SBUF offset changed and the two results do not share a byte.
fn moved_result(core: u8, j: &Instr, i: &Instr) -> Option<(usize, i64)> {
    // Compute instructions only: a load into a fresh tile is a new tile's data for the compiler
    // (the fused Mamba tutorial's v1 reloads `delta` / `u` every state), kept.
    if i.op != j.op
        || i.engine != j.engine
        || i.args.len() != j.args.len()
        || crate::isa::validate::is_dma(i)
    {
        return None;
    }
    let spec = i.op.spec();
    let mut found = None;
    for (k, ((a, b), p)) in i
        .args
        .iter()
        .zip(&j.args)
        .zip(spec.params.iter())
        .enumerate()
    {
        if !p.access.writes() {
            if a != b {
                return None;
            }
            continue;
        }
        match (a, b) {
            (Arg::Absent, Arg::Absent) => {}
            (Arg::Tensor(x), Arg::Tensor(y)) => {
                if found.is_some() || x.mem != Mem::Sbuf || x.offset == y.offset {
                    return None;
                }
                let mut z = y.clone();
                z.offset = x.offset;
                if &z != x {
                    return None;
                }
                if Region::new(core, x, true).overlaps(&Region::new(core, y, true)) {
                    return None;
                }
                found = Some((k, x.offset as i64 - y.offset as i64));
            }
            _ => return None,
        }
    }
    found
}

/// A footprint that is exactly its box (a static pattern with contiguous rows).
fn is_box(r: &Region) -> bool {
    !r.boxed && r.ap.is_none()
}

/// Does box `d` hold every byte of `r`?
fn holds(d: &Region, r: &Region) -> bool {
    r.mem == d.mem && r.p0 >= d.p0 && r.p1 <= d.p1 && r.lo >= d.lo && r.hi <= d.hi
}

/// The operand moves that let the reads of repeat `i`'s result (operand `arg`, `delta` bytes
/// from the earlier result) read the earlier result: [(instruction, operand, byte shift)], or
/// None when some read cannot (see the module doc).
fn rename_plan(
    prog: &[Instr],
    core: u8,
    i: usize,
    arg: usize,
    delta: i64,
    last: bool,
) -> Option<Vec<(usize, usize, i64)>> {
    let ap = prog[i].args[arg].tensor()?;
    let di = Region::new(core, ap, true);
    let mut apj = ap.clone();
    apj.offset = (ap.offset as i64 - delta) as u64;
    let dj = Region::new(core, &apj, true);
    if !is_box(&di) {
        return None;
    }
    let mut moves = Vec::new();
    let mut dj_dead = false;
    for (k, ins) in prog.iter().enumerate().skip(i + 1).take(RENAME_LIMIT) {
        if ends_matches(ins.op) {
            return None;
        }
        let (mut reads, mut dead, mut writes_dj) = (Vec::new(), false, false);
        for (a, _, acc, ap) in ins.tensors() {
            if let Some(DynSrc::Tile(t)) = ap.dynamic.as_deref().map(|d| &d.src) {
                if Region::new(core, t, false).overlaps(&di) {
                    return None;
                }
            }
            let r = Region::new(core, ap, acc.writes());
            if acc.writes() && r.overlaps(&dj) {
                writes_dj = true;
            }
            if !r.overlaps(&di) {
                continue;
            }
            if acc == Access::ReadWrite || ap.dynamic.is_some() {
                return None;
            }
            if acc.writes() {
                if !(is_box(&r) && holds(&r, &di)) {
                    return None; // (part of the result would stay in use)
                }
                dead = true;
            } else if holds(&di, &r) {
                reads.push(a);
            } else {
                return None;
            }
        }
        if !reads.is_empty() {
            if dj_dead || writes_dj {
                return None;
            }
            let mut moved = ins.clone();
            for &a in &reads {
                if let Some(Arg::Tensor(ap)) = moved.args.get_mut(a) {
                    ap.offset = ap.offset.checked_add_signed(-delta)?;
                }
                moves.push((k, a, -delta));
            }
            crate::engines::validate(&moved).ok()?;
        }
        if dead {
            return Some(moves);
        }
        dj_dead |= writes_dj;
    }
    // The result is still there at the end: unread if nothing runs after this program.
    (last && prog.len() <= i + 1 + RENAME_LIMIT && !dj_dead).then_some(moves)
}

fn hash_ap(ap: &Ap, h: &mut impl Hasher) {
    (
        ap.mem as u8,
        ap.dtype as u8,
        ap.start,
        ap.parts,
        ap.pstep,
        ap.offset,
    )
        .hash(h);
    ap.dims.hash(h);
}

/// Whether `a` and `b` are the same instruction but for where their results go.
fn same_inputs(a: &Instr, b: &Instr) -> bool {
    a.op == b.op
        && a.engine == b.engine
        && a.args.len() == b.args.len()
        && a.args
            .iter()
            .zip(&b.args)
            .zip(a.op.spec().params.iter())
            .all(|((x, y), p)| p.access.writes() || x == y)
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
    let onchip_ok = r.mem == Mem::Hbm || (a >= 0 && b < ONCHIP_BUCKETS);
    (b - a < MAX_BUCKETS && onchip_ok).then_some((r.mem as u8, a, b))
}

/// On-chip buckets per memory (2 KiB each: 512 KiB of a partition).
const ONCHIP_BUCKETS: i128 = 256;

/// The write index: entry ids per bucket, on chip in a table (no hashing), HBM in a map.
#[derive(Default)]
struct Buckets {
    onchip: Vec<Vec<u32>>,
    hbm: FxMap<u64, Vec<u32>>,
}

impl Buckets {
    fn slot(mem: u8, k: i128) -> Option<usize> {
        (mem != Mem::Hbm as u8 && (0..ONCHIP_BUCKETS).contains(&k))
            .then(|| mem as usize * ONCHIP_BUCKETS as usize + k as usize)
    }
    fn get_mut(&mut self, mem: u8, k: i128) -> Option<&mut Vec<u32>> {
        match Self::slot(mem, k) {
            Some(i) => self.onchip.get_mut(i),
            None => self.hbm.get_mut(&(k as u64)),
        }
    }
    fn entry(&mut self, mem: u8, k: i128) -> &mut Vec<u32> {
        match Self::slot(mem, k) {
            Some(i) => {
                if self.onchip.is_empty() {
                    self.onchip
                        .resize_with(2 * ONCHIP_BUCKETS as usize, Vec::new);
                }
                &mut self.onchip[i]
            }
            None => self.hbm.entry(k as u64).or_default(),
        }
    }
    fn clear(&mut self) {
        self.onchip.iter_mut().for_each(Vec::clear);
        self.hbm.clear();
    }
}

struct Entry {
    instr: usize,
    /// The entry's footprints: `regs[from..to]` of the pass's one list.
    from: usize,
    to: usize,
    /// Its result was overwritten but not its inputs (`rename` only): never a hit, kept to count
    /// the repeats missed for that (`Reuse::missed`).
    ghost: bool,
    /// A DMA: never a ghost (a load again after its tile was reused is not counted missed, and
    /// its HBM source is rarely written again, so its ghost would stay in the index for good).
    dma: bool,
}

/// What the pass removes and moves.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reuse {
    /// (index of the repeat, index of the earlier instance it repeats), ascending.
    pub drops: Vec<(usize, usize)>,
    /// (instruction, operand, byte shift): reads moved to an earlier result (`rename`).
    pub moves: Vec<(usize, usize, i64)>,
    /// `rename`: the repeats kept because the earlier result's bytes were overwritten while its
    /// inputs were not (the earlier result was given to another tile: the NKI front end then
    /// looks for the repeats on its IR, before allocation, `nki/value_reuse.py`).
    pub missed: usize,
}

/// Every exact repeat of `prog` (module doc): (index of the repeat, index of the earlier
/// instance it repeats), ascending. An instruction found to be a repeat is taken as not run, so
/// a later copy of it repeats the same earlier instance.
pub fn exact_repeats(prog: &Program) -> Vec<(usize, usize)> {
    find(prog, false, false).drops
}

/// The repeats of `prog`, with `rename` also those whose result goes elsewhere (module doc);
/// `last`: nothing runs after `prog` on its core (a result still in place at its end is never
/// read). Indices are those of `prog`; apply the moves, then remove the drops.
pub fn find(prog: &Program, rename: bool, last: bool) -> Reuse {
    let mut out = Reuse::default();
    let mut work: Cow<'_, [Instr]> = Cow::Borrowed(&prog.instrs);
    let mut ix = Index::default();
    let mut tmp: Vec<Region> = Vec::new();
    for i in 0..work.len() {
        let ins = &work[i];
        if ends_matches(ins.op) {
            ix.clear();
            continue;
        }
        let candidate = reusable(ins);
        let key = if candidate { key_hash(ins) } else { 0 };
        if candidate {
            if let Some(j) = ix.exact_hit(&work, key, ins) {
                out.drops.push((i, j));
                continue; // (not run: it would write the bytes it finds)
            }
        }
        let moved_key = if candidate && rename {
            moved_key_hash(ins)
        } else {
            0
        };
        if candidate && rename {
            let hit = ix.moved_hit(&work, prog.core, moved_key, ins);
            if hit.is_none() && ix.ghost_hit(&work, prog.core, key, moved_key, ins) {
                out.missed += 1;
            }
            if let Some((j, arg, delta)) = hit {
                if let Some(plan) = rename_plan(&work, prog.core, i, arg, delta, last) {
                    let w = work.to_mut();
                    for &(k, a, d) in &plan {
                        if let Some(Arg::Tensor(ap)) = w[k].args.get_mut(a) {
                            ap.offset = (ap.offset as i64 + d) as u64;
                        }
                    }
                    out.moves.extend(plan);
                    out.drops.push((i, j));
                    continue;
                }
            }
        }
        let ins = &work[i];
        tmp.clear();
        if candidate {
            regions_into(prog.core, ins, &mut tmp);
        } else {
            // (only its writes matter; dynamic offsets' index tiles are read, never written)
            for (_, _, acc, ap) in ins.tensors() {
                if acc.writes() {
                    tmp.push(Region::new(prog.core, ap, true));
                }
            }
        }
        ix.kill_met(&tmp, rename);
        if !candidate {
            continue;
        }
        // An instruction that reads bytes it writes changes its own input: never a repeat.
        let self_read = tmp
            .iter()
            .filter(|r| !r.write)
            .any(|r| tmp.iter().any(|w| w.write && w.overlaps(r)));
        if !self_read {
            ix.insert(i, key, rename.then_some(moved_key), &mut tmp, &work);
        }
    }
    out.moves.sort_unstable();
    out
}

/// `ins` with operand `arg`'s offset moved by `shift`, per `(arg, shift)` of `shifts` (on-chip
/// operands put in their tile's own frame: `relative_key`).
fn shifted(ins: &Instr, shifts: &[(usize, i64)]) -> Instr {
    let mut out = ins.clone();
    for &(a, d) in shifts {
        if let Some(Arg::Tensor(ap)) = out.args.get_mut(a) {
            ap.offset = ap.offset.wrapping_add_signed(d);
        }
    }
    out
}

/// A compute instruction's encoding with its on-chip operands moved by `shifts` into a frame
/// where they do not depend on where the allocator put their tiles (the NKI pass `value_reuse`
/// on the kernel IR, before allocation: `nki/value_reuse.py`), hashed; None when it may not be
/// dropped as a repeat whose result goes to another tile (`reusable`, no HBM operand, one
/// written operand, not a DMA; with `loads`, also a `dma_copy` from HBM into one on-chip
/// operand: the legacy toolchain's load reuse, `nki/load_reuse.py`).
pub fn relative_key(ins: &Instr, shifts: &[(usize, i64)], loads: bool) -> Option<u64> {
    let dma = crate::isa::validate::is_dma(ins);
    if !reusable(ins) || (dma && !(loads && ins.op == Opcode::DmaCopy)) {
        return None;
    }
    let mut written = 0;
    for (_, _, acc, ap) in ins.tensors() {
        if ap.mem == Mem::Hbm && (!dma || acc.writes()) {
            return None;
        }
        written += acc.writes() as usize;
    }
    if written != 1 {
        return None;
    }
    // (an instruction that reads bytes it writes changes its own input)
    let core = 0; // (footprints are compared within one instruction: any core's layout)
    let mut regs = Vec::new();
    regions_into(core, ins, &mut regs);
    let self_read = regs
        .iter()
        .filter(|r| !r.write)
        .any(|r| regs.iter().any(|w| w.write && w.overlaps(r)));
    (!self_read).then(|| key_hash(&shifted(ins, shifts)))
}

/// Whether `a` moved by `sa` and `b` moved by `sb` have the same encoding (`relative_key`'s
/// hashes matched).
pub fn same_relative(a: &Instr, sa: &[(usize, i64)], b: &Instr, sb: &[(usize, i64)]) -> bool {
    same_encoding(&shifted(a, sa), &shifted(b, sb))
}

/// The pass's index of the instructions whose results are still in place: their footprints,
/// looked up by encoding hash, by moved-result hash (`rename`) and by address bucket.
#[derive(Default)]
struct Index {
    regs: Vec<Region>,
    entries: Vec<Option<Entry>>,
    by_key: FxMap<u64, Vec<u32>>,
    by_moved: FxMap<u64, Vec<u32>>,
    by_bucket: Buckets,
    wide: Vec<u32>,
    live: usize,
}

impl Index {
    /// A matching-ending instruction (branch, cross-core): nothing earlier matches later ones.
    fn clear(&mut self) {
        self.entries.clear();
        self.by_key.clear();
        self.by_moved.clear();
        self.by_bucket.clear();
        self.wide.clear();
        self.regs.clear();
        self.live = 0;
    }

    /// The earlier instance of `ins` (same encoding) whose result is still in place.
    fn exact_hit(&self, work: &[Instr], key: u64, ins: &Instr) -> Option<usize> {
        self.by_key.get(&key)?.iter().find_map(|&id| {
            let e = self.entries[id as usize].as_ref().filter(|e| !e.ghost)?;
            same_encoding(&work[e.instr], ins).then_some(e.instr)
        })
    }

    /// Whether an earlier instance of `ins` (its result in place or elsewhere) had its result
    /// overwritten while its inputs still hold what it read.
    fn ghost_hit(&self, work: &[Instr], core: u8, key: u64, moved_key: u64, ins: &Instr) -> bool {
        if crate::isa::validate::is_dma(ins) {
            return false; // (a load again after its tile was reused is a new tile's data: kept)
        }
        let ghost = |id: &u32| self.entries[*id as usize].as_ref().filter(|e| e.ghost);
        let same = self.by_key.get(&key).is_some_and(|ids| {
            ids.iter()
                .filter_map(ghost)
                .any(|e| same_encoding(&work[e.instr], ins))
        });
        same || self.by_moved.get(&moved_key).is_some_and(|ids| {
            ids.iter()
                .filter_map(ghost)
                .any(|e| moved_result(core, &work[e.instr], ins).is_some())
        })
    }

    /// An earlier instance of `ins` with its result elsewhere: (its index, operand, byte shift).
    fn moved_hit(
        &self,
        work: &[Instr],
        core: u8,
        key: u64,
        ins: &Instr,
    ) -> Option<(usize, usize, i64)> {
        self.by_moved.get(&key)?.iter().find_map(|&id| {
            let e = self.entries[id as usize].as_ref().filter(|e| !e.ghost)?;
            let (arg, delta) = moved_result(core, &work[e.instr], ins)?;
            Some((e.instr, arg, delta))
        })
    }

    /// Its writes end every entry whose footprint they meet; with `ghosts`, an entry whose
    /// result alone they meet becomes a ghost (`Entry::ghost`).
    fn kill_met(&mut self, tmp: &[Region], ghosts: bool) {
        let Index {
            regs,
            entries,
            by_bucket,
            wide,
            live,
            ..
        } = self;
        for w in tmp.iter().filter(|r| r.write) {
            let mut kill = |id: u32, entries: &mut Vec<Option<Entry>>| {
                let Some(e) = entries[id as usize].as_mut() else {
                    return;
                };
                let met = regs[e.from..e.to].iter().filter(|r| r.overlaps(w));
                let (mut any, mut input) = (false, false);
                for r in met {
                    any = true;
                    input |= !r.write;
                }
                if any && ghosts && !input && !e.dma {
                    e.ghost = true;
                } else if any {
                    entries[id as usize] = None;
                    *live -= 1;
                }
            };
            match buckets(w) {
                Some((m, a, b)) => {
                    for k in a..=b {
                        if let Some(ids) = by_bucket.get_mut(m, k) {
                            ids.retain(|&id| entries[id as usize].is_some());
                            for &id in ids.iter() {
                                kill(id, entries);
                            }
                        }
                    }
                    wide.retain(|&id| entries[id as usize].is_some());
                    for &id in wide.iter() {
                        kill(id, entries);
                    }
                }
                None => {
                    for id in 0..entries.len() as u32 {
                        kill(id, entries);
                    }
                }
            }
        }
    }

    /// Enter candidate `i` with its footprint (taken from `tmp`); `moved_key` when renaming.
    fn insert(
        &mut self,
        i: usize,
        key: u64,
        moved_key: Option<u64>,
        tmp: &mut Vec<Region>,
        work: &[Instr],
    ) {
        let id = self.entries.len() as u32;
        let from = self.regs.len();
        self.regs.append(tmp);
        let to = self.regs.len();
        for r in &self.regs[from..to] {
            match buckets(r) {
                Some((m, a, b)) => {
                    for k in a..=b {
                        let v = self.by_bucket.entry(m, k);
                        if v.last() != Some(&id) {
                            v.push(id);
                        }
                    }
                }
                None => {
                    if self.wide.last() != Some(&id) {
                        self.wide.push(id);
                    }
                }
            }
        }
        self.entries.push(Some(Entry {
            instr: i,
            from,
            to,
            ghost: false,
            dma: crate::isa::validate::is_dma(&work[i]),
        }));
        self.live += 1;
        let entries = &self.entries;
        let ids = self.by_key.entry(key).or_default();
        ids.retain(|&k| entries[k as usize].is_some());
        ids.push(id);
        if let Some(mk) = moved_key {
            // (a ghost of the same computation is not needed once this one stands for it)
            let mut gone = Vec::new();
            let ids = self.by_moved.entry(mk).or_default();
            ids.retain(|&k| match &entries[k as usize] {
                Some(e) if e.ghost && same_inputs(&work[e.instr], &work[i]) => {
                    gone.push(k);
                    false
                }
                e => e.is_some(),
            });
            ids.push(id);
            for k in gone {
                self.entries[k as usize] = None;
                self.live -= 1;
            }
        }
        // Keep the lists small: when most entries are dead, start the index afresh.
        if self.entries.len() > 4096 && self.live * 4 < self.entries.len() {
            compact(
                &mut self.entries,
                &mut self.regs,
                &mut self.by_key,
                &mut self.by_bucket,
                &mut self.wide,
                work,
            );
            self.by_moved.clear();
            if moved_key.is_some() {
                for (id, e) in self.entries.iter().enumerate() {
                    if let Some(e) = e {
                        self.by_moved
                            .entry(moved_key_hash(&work[e.instr]))
                            .or_default()
                            .push(id as u32);
                    }
                }
            }
        }
    }
}

/// Rebuild the index from the live entries only (ids renumbered).
fn compact(
    entries: &mut Vec<Option<Entry>>,
    regs: &mut Vec<Region>,
    by_key: &mut FxMap<u64, Vec<u32>>,
    by_bucket: &mut Buckets,
    wide: &mut Vec<u32>,
    prog: &[Instr],
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
                        let v = by_bucket.entry(m, k);
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
        by_key.entry(key_hash(&prog[e.instr])).or_default().push(id);
        entries.push(Some(Entry {
            instr: e.instr,
            from,
            to,
            ghost: e.ghost,
            dma: e.dma,
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

    fn tt(dst: u32, a: u32, b: u32, op: &str) -> String {
        format!("tensor_tensor.vector dst=sbuf:float32[0:128]+{dst}[[1,64]] data1=sbuf:float32[0:128]+{a}[[1,64]] data2=sbuf:float32[0:128]+{b}[[1,64]] op={op}\n")
    }

    #[test]
    fn a_repeat_into_another_tile_is_dropped_and_its_reads_moved() {
        // product into 4096, read by the add into 8192; the same product into 5120 (a fresh
        // tile), read by an add into 9216, then 5120 overwritten whole by a memset
        let memset = "memset.vector dst=sbuf:float32[0:128]+5120[[1,64]] value=0.0\n";
        let p = parse_program(&format!(
            ".core 0\n{}{}{}{}{memset}",
            tt(4096, 0, 1024, "multiply"),
            tt(8192, 4096, 2048, "add"),
            tt(5120, 0, 1024, "multiply"),
            tt(9216, 5120, 3072, "add"),
        ))
        .unwrap();
        let r = find(&p, true, false);
        assert_eq!(r.drops, vec![(2, 0)]);
        assert_eq!(r.moves, vec![(3, 1, -1024)]); // data1 of the second add: 5120 -> 4096
        assert_eq!(find(&p, false, false).drops, vec![]); // not an exact repeat
    }

    #[test]
    fn a_moved_repeat_is_kept_when_a_read_cannot_move() {
        let memset = "memset.vector dst=sbuf:float32[0:128]+5120[[1,64]] value=0.0\n";
        let cases = [
            // a read reaching past the result (5120 + 256 ..)
            format!("{}{memset}", tt(9216, 5248, 3072, "add")),
            // the earlier result overwritten before the read
            format!(
                "memset.gpsimd dst=sbuf:float32[0:128]+4096[[1,4]] value=1.0\n{}{memset}",
                tt(9216, 5120, 3072, "add")
            ),
            // the result never overwritten whole (only its first half)
            format!(
                "{}memset.vector dst=sbuf:float32[0:128]+5120[[1,32]] value=0.0\n",
                tt(9216, 5120, 3072, "add")
            ),
        ];
        for tail in cases {
            let text = format!(
                ".core 0\n{}{}{tail}",
                tt(4096, 0, 1024, "multiply"),
                tt(5120, 0, 1024, "multiply")
            );
            let r = find(&parse_program(&text).unwrap(), true, false);
            assert_eq!(r, Reuse::default(), "{tail}");
        }
    }

    #[test]
    fn in_place_accumulate_and_random_are_never_repeats() {
        let inc = "tensor_scalar.vector dst=sbuf:float32[0:128]+0[[1,64]] data=sbuf:float32[0:128]+0[[1,64]] op0=add operand0=1.0\n";
        assert_eq!(repeats(&format!(".core 0\n{inc}{inc}")), vec![]);
        let rng = "rng.gpsimd dst=sbuf:uint32[0:128]+0[[1,64]]\n";
        assert_eq!(repeats(&format!(".core 0\n{rng}{rng}")), vec![]);
    }

    #[test]
    fn a_repeat_whose_earlier_result_was_overwritten_is_counted_as_missed() {
        let prod = |dst| tt(dst, 0, 1024, "multiply");
        let over = "memset.gpsimd dst=sbuf:float32[0:128]+4096[[1,64]] value=1.0\n";
        // the earlier product's bytes given to another tile, its inputs unchanged: missed, in
        // its own place and elsewhere
        for again in [prod(4096), prod(5120)] {
            let text = format!(".core 0\n{}{over}{again}", prod(4096));
            let r = find(&parse_program(&text).unwrap(), true, true);
            assert_eq!((r.drops.len(), r.missed), (0, 1), "{again}");
        }
        // an input overwritten too (after the result): a new value, not a missed repeat
        let input = "memset.gpsimd dst=sbuf:float32[0:128]+0[[1,4]] value=2.0\n";
        let text = format!(".core 0\n{}{over}{input}{}", prod(4096), prod(5120));
        assert_eq!(find(&parse_program(&text).unwrap(), true, true).missed, 0);
        // the same rule without renaming counts nothing
        let text = format!(".core 0\n{}{over}{}", prod(4096), prod(4096));
        assert_eq!(find(&parse_program(&text).unwrap(), false, true).missed, 0);
        // nor a load again after its tile was given to another
        let load =
            "dma_copy.sync dst=sbuf:float32[0:128]+0[[1,64]] src=hbm:float32+0[[64,128],[1,64]]\n";
        let over = "memset.gpsimd dst=sbuf:float32[0:128]+0[[1,64]] value=1.0\n";
        let text = format!(".core 0\n{load}{over}{load}");
        assert_eq!(find(&parse_program(&text).unwrap(), true, true).missed, 0);
    }

    #[test]
    fn relative_keys_ignore_where_tiles_are_and_refuse_what_is_not_a_repeat() {
        // the same product with its three tiles elsewhere: the same key once each operand is
        // counted from its tile's start
        let p = parse_program(&format!(
            ".core 0\n{}{}",
            tt(4096, 0, 1024, "multiply"),
            tt(12288, 8192, 9216, "multiply")
        ))
        .unwrap();
        let s0 = [(0, -4096), (1, 0), (2, -1024)];
        let s1 = [(0, -12288), (1, -8192), (2, -9216)];
        let k0 = relative_key(&p.instrs[0], &s0, false).unwrap();
        assert_eq!(relative_key(&p.instrs[1], &s1, false), Some(k0));
        assert!(same_relative(&p.instrs[0], &s0, &p.instrs[1], &s1));
        // an input read at another place within its tile is another computation
        let s2 = [(0, -12288), (1, -8192), (2, -9208)];
        assert_ne!(relative_key(&p.instrs[1], &s2, false), Some(k0));
        assert!(!same_relative(&p.instrs[0], &s0, &p.instrs[1], &s2));
        // loads, in-place updates and random numbers have none
        let q = parse_program(
            ".core 0\ndma_copy.sync dst=sbuf:float32[0:1]+0[[1,1]] src=hbm:float32+0[[1,1],[1,1]]\n\
             tensor_scalar.vector dst=sbuf:float32[0:128]+0[[1,64]] data=sbuf:float32[0:128]+0[[1,64]] op0=add operand0=1.0\n\
             rng.gpsimd dst=sbuf:uint32[0:128]+0[[1,64]]\n",
        )
        .unwrap();
        for ins in &q.instrs {
            assert_eq!(relative_key(ins, &[], false), None, "{:?}", ins.op);
        }
        // the load has one with `loads` (its HBM source counted as it is), the others still not
        let keys: Vec<_> = q
            .instrs
            .iter()
            .map(|i| relative_key(i, &[], true).is_some())
            .collect();
        assert_eq!(keys, [true, false, false]);
    }
}
