//! Fuzz targets of trn3emu-core, shared by the coverage-guided `cargo fuzz` targets
//! (`fuzz/fuzz_targets/*.rs`, nightly + libFuzzer) and the seeded smoke test that CI runs on
//! stable (`rust/core/tests/fuzz_smoke.rs` includes this file). No dependency but the core, so
//! the same code compiles in both places.
//!
//! Three targets, each a function of an arbitrary byte string that panics on a finding:
//! - `decode`: the binary decoder on raw bytes, or on a generated program's encoding with bytes
//!   overwritten; whatever decodes must re-encode byte-identical and round-trip through text.
//! - `parse`: the text parser on raw text, or on a generated program's text with edits; whatever
//!   parses must print back to the text it parsed from its own printing, and round-trip binary.
//! - `sched`: a random *valid* program (built from the ISA tables, with branches, registers,
//!   dynamic offsets, semaphores, collectives) run on a fresh device; the run may fail with an
//!   `EmuError` but never panic, never report an internal error, and must give bit-identical
//!   memory, trace and result when run again on a second fresh device.

use std::fmt::Write as _;

use trn3emu_core::engines::{decode_program, parse_program, validate};
use trn3emu_core::error::ErrorKind;
use trn3emu_core::isa::encode::encode_program;
use trn3emu_core::isa::spec::{mem, DataPath, Default, Kind};
use trn3emu_core::isa::tables::{DTYPES, ENGINES, ENUMS, INSTRUCTIONS};
use trn3emu_core::isa::text::format_program;
use trn3emu_core::isa::{Arg, Instr, Program};
use trn3emu_core::machine::autosync::auto_sync;
use trn3emu_core::memory::{Ap, DynKind, DynSrc, Dynamic, Mem};
use trn3emu_core::numerics::rng::RngStates;
use trn3emu_core::{Device, RunOptions};

/// An `arbitrary`-style reader over the fuzzer's bytes: every draw is total (zeros once the
/// input is exhausted), so any input yields a program.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, pos: 0 }
    }
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 256 {
            self.u8() as usize % n
        } else {
            self.u32() as usize % n
        }
    }
    /// True with probability about `p`/256.
    pub fn chance(&mut self, p: u8) -> bool {
        self.u8() < p
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    pub fn exhausted(&self) -> bool {
        self.pos >= self.data.len()
    }
    pub fn rest(&self) -> &'a [u8] {
        &self.data[self.pos.min(self.data.len())..]
    }
}

const PARTS: &[u32] = &[1, 2, 4, 16, 32, 64, 128];
const FREE: &[u32] = &[1, 2, 3, 4, 8, 16, 32, 64];
const F32S: &[f32] = &[
    0.0,
    1.0,
    -2.5,
    0.5,
    3.0,
    -0.0,
    1e30,
    f32::INFINITY,
    f32::NAN,
];
const I32S: &[i32] = &[0, 1, 2, 3, -1, 7, 31, 127, 1 << 20, i32::MAX, i32::MIN];
/// Registers the generator uses: few, so that writes and reads meet.
const REGS: u8 = 4;

/// The shape every tensor operand of one instruction starts from (so shapes agree often).
struct Shape {
    parts: u32,
    free: u32,
    /// The instruction's main dtype, used for every operand that allows it (most of the time).
    dtype: trn3emu_core::isa::DType,
    /// Operands keep the shape exactly (DMA element counts must match).
    exact: bool,
    /// Dynamic offsets are allowed (DMA instructions only).
    dynamic: bool,
}

fn gen_dtype(
    u: &mut Bytes,
    class: u32,
    main: trn3emu_core::isa::DType,
) -> Option<trn3emu_core::isa::DType> {
    if main.in_class(class) && u.chance(220) {
        return Some(main);
    }
    let ok: Vec<_> = DTYPES
        .iter()
        .filter(|d| d.dtype.in_class(class))
        .map(|d| d.dtype)
        .collect();
    if ok.is_empty() {
        return None;
    }
    // float32 (when allowed) half the time: most instructions accept it for every operand.
    if u.chance(128) {
        if let Some(d) = ok.iter().find(|d| d.name() == "float32") {
            return Some(*d);
        }
    }
    Some(u.pick(&ok))
}

fn gen_mem(u: &mut Bytes, allowed: u8) -> Mem {
    let mut ms = Vec::new();
    for (bit, m) in [
        (mem::SBUF, Mem::Sbuf),
        (mem::PSUM, Mem::Psum),
        (mem::HBM, Mem::Hbm),
    ] {
        if allowed & bit != 0 {
            ms.push(m);
        }
    }
    if ms.is_empty() {
        Mem::Sbuf
    } else {
        u.pick(&ms)
    }
}

/// A tensor operand: a small tile in one of a few slots, sometimes with a column shape, a
/// second free dim, a broadcast or reversed step, or a dynamic (register / tile) offset.
fn gen_ap(u: &mut Bytes, allowed_mem: u8, class: u32, shape: &Shape) -> Option<Ap> {
    let dtype = gen_dtype(u, class, shape.dtype)?;
    let m = gen_mem(u, allowed_mem);
    let mut parts = if shape.exact || u.chance(220) {
        shape.parts
    } else {
        u.pick(PARTS)
    };
    let free = match u.below(8) {
        _ if shape.exact => shape.free,
        0 => 1,
        1 => u.pick(FREE),
        _ => shape.free,
    };
    let mut dims = vec![(1i64, free)];
    match u.below(16) {
        0 if free > 1 && free % 2 == 0 => dims = vec![(free as i64 / 2, 2), (1, free / 2)],
        1 => dims = vec![(0, free)],
        2 if free > 1 => dims = vec![(-1, free)],
        _ => {}
    }
    let esize = dtype.size().max(1) as i64;
    let reversed = dims.iter().any(|d| d.0 < 0);
    let mut ap = match m {
        Mem::Hbm => Ap {
            mem: m,
            dtype,
            start: 0,
            parts,
            pstep: free as i64,
            offset: u.below(8) as u64 * 4096
                + if reversed {
                    (free as u64 - 1) * esize as u64
                } else {
                    0
                },
            dims,
            dynamic: None,
        },
        _ => {
            let start = u.pick(&[0u32, 0, 32, 64, 96]);
            if start + parts > 128 {
                parts = 128 - start;
            }
            // PSUM: the first 4 banks; SBUF: 12 slots of 1 KiB (tiles are at most 256 bytes per
            // partition; dynamic offsets reach 2 KiB further).
            let base = if m == Mem::Psum {
                u.below(4) as u64 * 2048
            } else {
                u.below(12) as u64 * 1024
            };
            Ap {
                mem: m,
                dtype,
                start,
                parts,
                pstep: 0,
                offset: base
                    + if reversed {
                        (free as u64 - 1) * esize as u64
                    } else {
                        0
                    },
                dims,
                dynamic: None,
            }
        }
    };
    if shape.dynamic && u.chance(60) {
        ap.dynamic = gen_dynamic(u, &ap).map(Box::new);
    }
    Some(ap)
}

fn gen_dynamic(u: &mut Bytes, ap: &Ap) -> Option<Dynamic> {
    let bound = u.pick(&[1u32, 2, 4, 8]);
    let row = ap.free_size() as i64 * ap.parts as i64;
    let (kind, src) = match (ap.mem, u.below(3)) {
        (_, 0) | (Mem::Psum, _) | (Mem::Sbuf, _) => {
            (DynKind::Scalar, DynSrc::Reg(u.below(REGS as usize) as u8))
        }
        (Mem::Hbm, 1) => {
            let t = Ap {
                mem: Mem::Sbuf,
                dtype: trn3emu_core::isa::DType::from_name("int32")?,
                start: 0,
                parts: 1,
                pstep: 0,
                offset: OFFSET_TILES as u64,
                dims: vec![(1, 1)],
                dynamic: None,
            };
            (DynKind::Scalar, DynSrc::Tile(t))
        }
        (Mem::Hbm, _) => {
            let t = Ap {
                mem: Mem::Sbuf,
                dtype: trn3emu_core::isa::DType::from_name("int32")?,
                start: 0,
                parts: ap.parts,
                pstep: 0,
                offset: OFFSET_TILES as u64 + 1024,
                dims: vec![(1, 1)],
                dynamic: None,
            };
            (DynKind::Vector, DynSrc::Tile(t))
        }
    };
    let step = if ap.mem == Mem::Hbm {
        row
    } else {
        ap.free_size() as i64
    };
    Some(Dynamic {
        kind,
        src,
        step,
        bound,
        cols: Vec::new(),
    })
}

/// One operand of `p`'s kind; `n` is the program length (branch targets stay inside it).
fn gen_arg(
    u: &mut Bytes,
    p: &trn3emu_core::isa::spec::ParamSpec,
    mems: u8,
    shape: &Shape,
    n: usize,
) -> Option<Arg> {
    let optional = !matches!(p.default, Default::Required);
    if optional && u.chance(100) {
        return Arg::from_default(&p.default, p.kind);
    }
    Some(match p.kind {
        Kind::Tensor => Arg::Tensor(gen_ap(u, p.mem & mems, p.dtypes, shape)?),
        Kind::TensorOrF32 => {
            if u.chance(128) {
                Arg::F32(u.pick(F32S))
            } else {
                let col = Shape { free: 1, ..*shape };
                Arg::Tensor(gen_ap(u, p.mem & mems, p.dtypes, &col)?)
            }
        }
        Kind::F32 => Arg::F32(if u.chance(16) {
            f32::from_bits(u.u32())
        } else {
            u.pick(F32S)
        }),
        Kind::I32 if p.name == "target" => Arg::I32(u.below(n.max(1)) as i32),
        Kind::I32 if p.name == "priority" => Arg::I32(u.below(4) as i32),
        Kind::I32 => Arg::I32(if u.chance(16) {
            u.u32() as i32
        } else {
            u.pick(I32S)
        }),
        Kind::I32OrReg => {
            if u.chance(100) {
                Arg::Reg(u.below(REGS as usize) as u8)
            } else {
                Arg::I32(u.pick(I32S))
            }
        }
        Kind::Bool => Arg::Bool(u.chance(128)),
        Kind::Enum => {
            let values = ENUMS
                .get(p.enum_id as usize)
                .map_or(1, |e| e.values.len().max(1));
            Arg::Enum(u.below(values) as u8)
        }
        Kind::Ints => match p.default {
            Default::Ints(d) if !d.is_empty() && u.chance(128) => {
                let mut v = Vec::new();
                for &c in d {
                    if u.chance(200) {
                        v.push(c);
                    }
                }
                Arg::Ints(v)
            }
            _ => {
                let n = u.below(4);
                Arg::Ints(
                    (0..n)
                        .map(|_| u.pick(I32S).min(shape.free as i32))
                        .collect(),
                )
            }
        },
        Kind::Pattern => Arg::Ints(vec![1, shape.free as i32]),
        Kind::Reg => Arg::Reg(u.below(REGS as usize) as u8),
    })
}

fn gen_instr(u: &mut Bytes, n: usize) -> Option<Instr> {
    // Control instructions (registers, branches) and DMAs a third of the time: they drive
    // the scheduler's interesting paths (loops, dynamic offsets, queues).
    let spec = if u.chance(85) {
        let pool: Vec<_> = INSTRUCTIONS
            .iter()
            .filter(|s| {
                s.name.starts_with("register") || s.name == "branch" || s.name.starts_with("dma")
            })
            .collect();
        *u.pick(&pool)
    } else {
        u.pick(INSTRUCTIONS)
    };
    let engine = u.pick(spec.engines);
    let info = ENGINES.iter().find(|e| e.engine == engine)?;
    let dma = ENGINES.iter().find(|e| e.name == "dma")?;
    let one = matches!(
        spec.name,
        "register_load" | "register_store" | "scalar_load" | "scalar_store"
    );
    let dtypes = [
        "float32",
        "float32",
        "bfloat16",
        "int32",
        "float8_e4m3",
        "uint8",
    ];
    let shape = Shape {
        parts: if one { 1 } else { u.pick(PARTS) },
        free: if one { 1 } else { u.pick(FREE) },
        dtype: trn3emu_core::isa::DType::from_name(u.pick(&dtypes))?,
        exact: spec.path == DataPath::Dma,
        dynamic: spec.path == DataPath::Dma,
    };
    let mut args = Vec::with_capacity(spec.params.len());
    for p in spec.params {
        let mems = if spec.name.starts_with("dma") || spec.name.starts_with("register") {
            dma.reads | dma.writes
        } else if p.access.writes() {
            info.writes
        } else {
            info.reads
        };
        let mems = if u.chance(8) { 7 } else { mems };
        args.push(gen_arg(u, p, mems, &shape, n)?);
    }
    fix_control(u, &spec, &mut args);
    Some(Instr {
        op: spec.opcode,
        engine,
        args,
        waits: Vec::new(),
        signals: Vec::new(),
        name: None,
    })
}

/// Register ops the sequencer has, and a register for conditional branches.
fn fix_control(u: &mut Bytes, spec: &trn3emu_core::isa::spec::InstrSpec, args: &mut [Arg]) {
    let idx = |name| spec.param_index(name);
    if spec.name == "register_op" {
        let ops = [
            "add",
            "subtract",
            "multiply",
            "bitwise_and",
            "bitwise_or",
            "bitwise_xor",
            "left_shift",
            "right_shift",
        ];
        if let (Some(i), Some(e)) = (idx("op"), ENUMS.iter().find(|e| e.name == "alu_op")) {
            let name = u.pick(&ops);
            if let Some(v) = e.values.iter().position(|&x| x == name) {
                args[i] = Arg::Enum(v as u8);
            }
        }
    }
    if spec.name == "branch" {
        if let (Some(c), Some(r)) = (idx("cmp"), idx("reg")) {
            if args[c] != Arg::Enum(0) && args[r] == Arg::Absent {
                args[r] = Arg::Reg(u.below(REGS as usize) as u8);
            }
        }
    }
}

/// Random waits and signals on a few semaphores (may deadlock: a `DeadlockError` is fine).
fn gen_sync(u: &mut Bytes, ins: &mut Instr) {
    use trn3emu_core::isa::instr::{Signal, Wait};
    if u.chance(30) {
        ins.waits.push(Wait {
            sem: u.below(3) as u16,
            value: u.below(3) as u32,
        });
    }
    if u.chance(40) {
        ins.signals.push(Signal {
            sem: u.below(3) as u16,
            delta: 1,
        });
    }
}

/// How a generated program is synchronised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// None: streams race freely (a `RaceError` is a valid outcome).
    None,
    /// Random waits and signals.
    Random,
    /// The automatic synchronisation pass (`machine::autosync`).
    Auto,
}

/// A program of valid instructions from the ISA tables. Invalid draws are dropped (most
/// draws validate: shapes, memories and dtypes come from each operand's spec).
pub fn gen_program(u: &mut Bytes) -> (Program, Sync, usize) {
    let n = 1 + u.below(24);
    let sync = u.pick(&[Sync::None, Sync::Random, Sync::Auto, Sync::Auto]);
    let mut instrs = Vec::with_capacity(n);
    let mut drawn = 0;
    while instrs.len() < n && drawn < 4 * n && !u.exhausted() {
        drawn += 1;
        let Some(mut ins) = gen_instr(u, n) else {
            continue;
        };
        if sync == Sync::Random {
            gen_sync(u, &mut ins);
        }
        if validate(&ins).is_ok() {
            instrs.push(ins);
        }
    }
    let mut p = Program { core: 0, instrs };
    if sync == Sync::Auto {
        if let Ok(q) = auto_sync(&p) {
            p = q;
        }
    }
    (p, sync, drawn)
}

/// Binary and text round trips of a valid program.
pub fn check_round_trips(p: &Program) {
    let bin = encode_program(p);
    let back = decode_program(&bin)
        .unwrap_or_else(|e| panic!("re-decoding an encoded program failed: {e}"));
    assert_eq!(&back, p, "binary round trip changed the program");
    let text = format_program(p);
    let back = parse_program(&text)
        .unwrap_or_else(|e| panic!("re-parsing a printed program failed: {e}\n{text}"));
    assert_eq!(
        format_program(&back),
        text,
        "text round trip changed the program"
    );
}

/// Fuzz target `decode`.
pub fn fuzz_decode(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        // A generated program's encoding with a few bytes overwritten: reaches deep decoder
        // paths that random bytes rarely get past the header for.
        let mut u = Bytes::new(rest);
        let (p, _, _) = gen_program(&mut u);
        let mut bin = encode_program(&p);
        let edits = u.rest();
        for pair in edits.chunks(3).take(8) {
            if let [a, b, v] = *pair {
                if !bin.is_empty() {
                    let i = ((a as usize) << 8 | b as usize) % bin.len();
                    bin[i] = v;
                }
            }
        }
        bin
    };
    if let Ok(p) = decode_program(&bytes) {
        assert_eq!(
            encode_program(&p),
            bytes,
            "a decoded program must re-encode byte-identical"
        );
        check_round_trips(&p);
    }
}

/// Fuzz target `parse`.
pub fn fuzz_parse(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = if mode & 1 == 0 {
        String::from_utf8_lossy(rest).into_owned()
    } else {
        let mut u = Bytes::new(rest);
        let (p, _, _) = gen_program(&mut u);
        let mut text = format_program(&p).into_bytes();
        for pair in u.rest().chunks(3).take(8) {
            if let [a, b, v] = *pair {
                if !text.is_empty() {
                    let i = ((a as usize) << 8 | b as usize) % text.len();
                    // printable ASCII, newlines and the characters the syntax is made of
                    text[i] = b" \n[]()+-,.=:@0123456789abcdefgilmnoprstuvwxyz_"[v as usize % 46];
                }
            }
        }
        String::from_utf8_lossy(&text).into_owned()
    };
    if let Ok(p) = parse_program(&text) {
        check_round_trips(&p);
    }
}

/// Steps a fuzzed run may take (branch loops end in `RunawayError` quickly).
pub const FUZZ_MAX_EXECUTED: u64 = 4096;

thread_local! {
    /// One device reused across inputs (`Device::new` zeroes 8 cores of SBUF: ~80 ms, far
    /// more than a fuzzed run), brought back to its power-on state before each run.
    static DEVICE: std::cell::RefCell<Device> = std::cell::RefCell::new(Device::new());
}

/// Where the offset tiles of dynamic patterns are in SBUF (two 1 KiB slots of small indices).
const OFFSET_TILES: usize = 14 * 1024;
/// SBUF bytes per partition the generator's tiles can reach: 12 slots of 1 KiB, dynamic
/// offsets up to 8 rows of at most 256 bytes further, the offset tiles.
const SBUF_REACH: usize = 16 * 1024;
/// HBM bytes the generator reaches (8 slots of 4 KiB, dynamic offsets up to 8 x 128 x 64
/// elements further).
const HBM_REACH: usize = 8 * 4096 + 8 * 128 * 64 * 4;
/// PSUM bytes per partition the generator uses (4 banks).
const PSUM_REACH: usize = 8 * 1024;

/// What the offset tiles hold: small indices (0, 1, 2, 0, ...).
const OFFSET_PATTERN: [u8; 2048] = {
    let mut a = [0u8; 2048];
    let mut i = 0;
    while i < 2048 {
        a[i] = (i % 3) as u8;
        i += 1;
    }
    a
};

/// The on-chip partitions the programs' tensor operands name (bit `p` for partition `p`): the
/// only ones a run of them can write (every write goes through an operand's pattern).
fn partitions(programs: &[Program]) -> u128 {
    let mut mask = 0u128;
    let mut add = |ap: &Ap| {
        if ap.mem != Mem::Hbm {
            for p in ap.start.min(128)..(ap.start + ap.parts).min(128) {
                mask |= 1 << p;
            }
        }
    };
    for ins in programs.iter().flat_map(|p| &p.instrs) {
        for a in &ins.args {
            if let Arg::Tensor(ap) = a {
                add(ap);
                if let Some(DynSrc::Tile(t)) = ap.dynamic.as_ref().map(|d| &d.src) {
                    add(t);
                }
            }
        }
    }
    mask
}

thread_local! {
    /// Per core, the partitions the last run may have written (all, before the first reset).
    static DIRTY: std::cell::Cell<[u128; 2]> = const { std::cell::Cell::new([u128::MAX; 2]) };
}

/// Back to the state of a fresh device wherever the programs can reach: on chip, the
/// partitions they name and those the previous run may have written (zeroing every partition
/// of both cores was most of an input's time).
fn reset(dev: &mut Device, programs: &[Program]) {
    if dev.hbm.resident_bytes() > (1 << 20) {
        dev.hbm.clear(); // a run wrote beyond the first page: start from nothing
    }
    dev.hbm.zero(0, HBM_REACH as u64); // keeps the backing page (no fresh 1 MiB page per run)
    dev.runs = 0;
    dev.max_executed = FUZZ_MAX_EXECUTED;
    let seed = dev.numerics.seed;
    let now = partitions(programs);
    let mut dirty = DIRTY.get();
    for (c, core) in dev.cores.iter_mut().enumerate().take(programs.len()) {
        core.rng = RngStates::seeded(seed ^ ((c as u64) << 32));
        for part in (0..128).filter(|&p| (dirty[c] | now) >> p & 1 == 1) {
            let row = core.sbuf.partition_mut(part);
            row[..SBUF_REACH].fill(0);
            row[OFFSET_TILES..OFFSET_TILES + 2048].copy_from_slice(&OFFSET_PATTERN);
            core.psum.partition_mut(part)[..PSUM_REACH].fill(0);
        }
        dirty[c] = now;
    }
    DIRTY.set(dirty);
}

/// Panics if a run wrote on chip outside the partitions its programs name (`partitions`).
#[cfg(debug_assertions)]
fn check_untouched(dev: &Device, programs: &[Program]) {
    static ZEROS: [u8; SBUF_REACH] = [0; SBUF_REACH];
    let named = partitions(programs);
    for (c, core) in dev.cores.iter().enumerate().take(programs.len()) {
        for part in (0..128).filter(|&p| named >> p & 1 == 0) {
            let row = core.sbuf.partition(part);
            assert!(
                row[..OFFSET_TILES] == ZEROS[..OFFSET_TILES]
                    && row[OFFSET_TILES..OFFSET_TILES + 2048] == OFFSET_PATTERN
                    && row[OFFSET_TILES + 2048..SBUF_REACH] == ZEROS[OFFSET_TILES + 2048..]
                    && core.psum.partition(part)[..PSUM_REACH] == ZEROS[..PSUM_REACH],
                "core {c} partition {part}: written, but no operand names it"
            );
        }
    }
}

/// A cheap digest of memory for the determinism check: four independent multiply-xor lanes
/// over 8-byte words (memory-bound, not latency-bound).
fn hash(h: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x100_0000_01b3;
    let mut lanes = [h, h ^ 1, h ^ 2, h ^ 3];
    let blocks = bytes.chunks_exact(32);
    let tail = blocks.remainder();
    for b in blocks {
        for (l, w) in lanes.iter_mut().zip(b.chunks_exact(8)) {
            let w = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            *l = (*l ^ w).wrapping_mul(K);
        }
    }
    let mut h = lanes.iter().fold(0u64, |a, &l| (a ^ l).wrapping_mul(K));
    for &b in tail {
        h = (h ^ b as u64).wrapping_mul(K);
    }
    h
}

/// A `fmt::Write` that hashes what is written (digests a trace without building its text).
struct HashWriter(u64);

impl std::fmt::Write for HashWriter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 = hash(self.0, s.as_bytes());
        Ok(())
    }
}

/// Everything a run leaves behind that must be the same on a second run from the same state:
/// the outcome (time, steps, a digest of the trace, or the error) and a digest of the memory
/// a generated program can reach. Without `digest` (inputs not checked for determinism) the
/// run keeps no trace and memory is not hashed: tracing and reading 3 MiB per core cost more
/// than most fuzzed runs.
fn run_once(
    dev: &mut Device,
    programs: &[Program],
    seed_hbm: &[u8],
    digest: bool,
) -> (String, u64) {
    reset(dev, programs);
    dev.hbm.write(0, seed_hbm);
    let opts = RunOptions {
        trace: digest,
        ..RunOptions::default()
    };
    let r = dev.run(programs, &opts);
    let outcome = match &r {
        Ok(r) => {
            let mut w = HashWriter(0);
            let _ = write!(w, "{:?}", r.trace.records);
            format!("ok {} {} trace {:x}", r.end_ps, r.executed, w.0)
        }
        Err(e) => {
            assert_ne!(e.kind, ErrorKind::Internal, "internal error: {e}");
            format!("{e}")
        }
    };
    // The reset and the digest skip the partitions no operand names: with debug assertions
    // (the seeded smoke; a `-O` campaign has none) check that those are untouched.
    #[cfg(debug_assertions)]
    check_untouched(dev, programs);
    if !digest {
        return (outcome, 0);
    }
    let mut hbm = vec![0u8; HBM_REACH];
    dev.hbm.read(0, &mut hbm);
    let mut h = hash(0, &hbm);
    let named = partitions(programs);
    for core in dev.cores.iter().take(programs.len()) {
        for part in (0..128).filter(|&p| named >> p & 1 == 1) {
            h = hash(h, &core.sbuf.partition(part)[..SBUF_REACH]);
            h = hash(h, &core.psum.partition(part)[..PSUM_REACH]);
        }
    }
    (outcome, h)
}

/// Fuzz target `sched`: returns whether the generated program was non-empty (for statistics).
pub fn fuzz_sched(data: &[u8]) -> bool {
    let mut u = Bytes::new(data);
    let (p, _sync, _) = gen_program(&mut u);
    if p.instrs.is_empty() {
        return false;
    }
    check_round_trips(&p);
    let two_cores = u.chance(40);
    let mut programs = vec![p.clone()];
    if two_cores {
        let mut q = p;
        q.core = 1;
        programs.push(q);
    }
    let seed_hbm: Vec<u8> = (0..256).map(|_| u.u8()).collect();
    // The determinism check (a second run from the same state, memory digested in full) on
    // one input in 16: it costs three times a plain input.
    let twice = u.chance(16);
    DEVICE.with(|d| {
        let dev = &mut d.borrow_mut();
        let a = run_once(dev, &programs, &seed_hbm, twice);
        if twice {
            let b = run_once(dev, &programs, &seed_hbm, true);
            assert!(
                a == b,
                "two runs from the same state differ: {a:?} vs {b:?}"
            );
        }
    });
    true
}
