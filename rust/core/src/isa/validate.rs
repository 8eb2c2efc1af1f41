//! The generic checks every instruction passes before it can be part of a program, whatever its
//! origin (assembler, text, binary): operand kinds, enums, memories, dtypes, bounds, engine
//! connectivity, the start-partition rule — all read from the isa.toml tables. The instruction's
//! own rules are `engines::Semantics::check`; `engines::validate` runs both.

use super::instr::{Arg, Instr, MAX_SYNC, NUM_REGISTERS, NUM_SEMAPHORES};
use super::spec::{
    dtype_names, mem_names, DataPath, EngineInfo, InstrSpec, Kind, ParamSpec, StartRule,
};
use super::tables::{Engine, ENUMS};
use crate::error::{fail, ErrorKind::*, Result};
use crate::memory::{Ap, DynKind, DynSrc, Dynamic, Mem};

/// Characters allowed in instruction names (so text assembly needs no quoting).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.:/-+[]".contains(c))
}

/// True for instructions that move data on DMA queues (their operands obey DMA connectivity).
pub fn is_dma(instr: &Instr) -> bool {
    instr.op.spec().path == DataPath::Dma
}

/// The generic operand checks (tables only); indirect operands are checked by the engines.
pub fn validate_generic(instr: &Instr) -> Result<()> {
    check_header(instr)?;
    check_sync(instr)?;
    let route = Route::of(instr);
    let spec = instr.op.spec();
    for (p, a) in spec.params.iter().zip(&instr.args) {
        check_operand(spec, &route, p, a).map_err(|e| e.operand(p.name))?;
    }
    Ok(())
}

/// Engine, operand count and label.
fn check_header(instr: &Instr) -> Result<()> {
    let spec = instr.op.spec();
    if !spec.engines.contains(&instr.engine) {
        let names: Vec<_> = spec.engines.iter().map(|e| e.name()).collect();
        return Err(fail(
            Value,
            "engine_not_allowed",
            format!(
                "engine {} cannot execute {} (allowed: {})",
                instr.engine.name(),
                spec.name,
                names.join(", ")
            ),
        )
        .operand("engine"));
    }
    if instr.args.len() != spec.params.len() {
        return Err(fail(
            Value,
            "operand_count",
            format!(
                "{} takes {} operands, got {}",
                spec.name,
                spec.params.len(),
                instr.args.len()
            ),
        ));
    }
    if let Some(name) = &instr.name {
        if !valid_name(name) {
            return Err(fail(
                Value,
                "invalid_name",
                format!("name {name:?} must be 1..255 characters of [A-Za-z0-9_.:/+-[]]"),
            )
            .operand("name"));
        }
    }
    Ok(())
}

/// Wait / signal counts and semaphore ids.
pub fn check_sync(instr: &Instr) -> Result<()> {
    if instr.waits.len() > MAX_SYNC || instr.signals.len() > MAX_SYNC {
        return Err(fail(
            Semaphore,
            "too_many_sync",
            format!(
                "{} waits and {} signals (at most {MAX_SYNC} each: the encoding counts them in a byte)",
                instr.waits.len(),
                instr.signals.len()
            ),
        )
        .operand(if instr.waits.len() > MAX_SYNC { "wait" } else { "signal" }));
    }
    let waits = instr.waits.iter().map(|w| (w.sem, "wait"));
    let signals = instr.signals.iter().map(|s| (s.sem, "signal"));
    for (sem, what) in waits.chain(signals) {
        if sem >= NUM_SEMAPHORES {
            return Err(fail(
                Semaphore,
                "semaphore_out_of_range",
                format!("semaphore s{sem} out of range (0..{NUM_SEMAPHORES})"),
            )
            .operand(what));
        }
    }
    Ok(())
}

/// Which data path an instruction's operands take.
struct Route {
    /// A DMA instruction (dynamic offsets allowed, tensor indirection not).
    dma: bool,
    /// Its data moves on the DMA engines: DMAs, and collectives (any trigger engine).
    dma_path: bool,
    /// The engine whose ports the operands use.
    engine: Engine,
    /// The read / write connectivity checked, `None` for control instructions (register and
    /// scalar loads and stores go through the sequencer, not the engine's data path).
    info: Option<&'static EngineInfo>,
}

impl Route {
    fn of(instr: &Instr) -> Route {
        let spec = instr.op.spec();
        let dma = spec.path == DataPath::Dma;
        let dma_path = dma || spec.path == DataPath::Collective;
        let engine = if dma_path { Engine::Dma } else { instr.engine };
        let info = if spec.path == DataPath::Control {
            None
        } else {
            engine.info()
        };
        Route {
            dma,
            dma_path,
            engine,
            info,
        }
    }
}

/// One operand against its parameter record.
fn check_operand(spec: &InstrSpec, route: &Route, p: &ParamSpec, a: &Arg) -> Result<()> {
    if !p.kind.accepts(a) {
        return Err(fail(
            Value,
            "operand_kind",
            format!("expected {:?}, got {a:?}", p.kind),
        ));
    }
    match a {
        Arg::Absent if matches!(p.default, super::spec::Default::Required) => Err(fail(
            Value,
            "operand_required",
            "required operand is missing",
        )),
        Arg::Enum(v) => {
            let e = &ENUMS[p.enum_id as usize];
            if *v as usize >= e.values.len() {
                return Err(fail(
                    Value,
                    "enum_value_out_of_range",
                    format!("{v} is not a valid {} value", e.name),
                ));
            }
            Ok(())
        }
        Arg::Ints(v) => {
            if v.len() > 255 {
                return Err(fail(Value, "too_many_ints", "at most 255 integers"));
            }
            if p.kind == Kind::Pattern && (v.len() % 2 != 0 || v.len() > 8) {
                return Err(fail(
                    Shape,
                    "pattern_pairs",
                    "pattern must be 1..4 [step, num] pairs",
                ));
            }
            Ok(())
        }
        Arg::Reg(r) => check_register(*r),
        Arg::Tensor(ap) => check_tensor(spec, route, p, ap),
        _ => Ok(()),
    }
}

fn check_register(r: u8) -> Result<()> {
    if r >= NUM_REGISTERS {
        return Err(fail(
            Value,
            "register_out_of_range",
            format!("register r{r} out of range (0..{NUM_REGISTERS})"),
        ));
    }
    Ok(())
}

/// A tensor operand: bounds, dynamic offsets, memory, dtype, engine ports, start partition and
/// (TensorE results) PSUM banks.
fn check_tensor(spec: &InstrSpec, route: &Route, p: &ParamSpec, ap: &Ap) -> Result<()> {
    ap.check_bounds()?;
    if let Some(d) = ap.dynamic.as_deref() {
        check_dynamic(spec, route, p, d)?;
    }
    if p.mem & ap.mem.bit() == 0 {
        return Err(fail(
            MemorySpace,
            "memory_space_not_allowed",
            format!(
                "{} is in {}, but {} allows {}",
                p.name,
                ap.mem.name(),
                spec.name,
                mem_names(p.mem)
            ),
        ));
    }
    if !ap.dtype.in_class(p.dtypes) {
        return Err(fail(
            Dtype,
            "dtype_not_allowed",
            format!(
                "dtype {} not allowed for {} (allowed: {})",
                ap.dtype.name(),
                spec.name,
                dtype_names(p.dtypes)
            ),
        ));
    }
    if let Some(ei) = route.info {
        if p.access.reads() && ei.reads & ap.mem.bit() == 0 {
            return Err(fail(
                MemorySpace,
                "engine_cannot_read",
                format!("engine {} cannot read {}", ei.name, ap.mem.name()),
            ));
        }
        if p.access.writes() && ei.writes & ap.mem.bit() == 0 {
            return Err(fail(
                MemorySpace,
                "engine_cannot_write",
                format!("engine {} cannot write {}", ei.name, ap.mem.name()),
            ));
        }
    }
    if !route.dma_path && p.start == StartRule::Partition && ap.mem != Mem::Hbm {
        ap.check_start_partition()?;
    }
    if route.engine == Engine::Tensor && p.access.writes() {
        ap.check_psum_bank()?;
    }
    Ok(())
}

/// Dynamic offsets are DMA addressing; tensor indirection is for the compute operands
/// isa.toml marks `indirect`.
fn check_dynamic(spec: &InstrSpec, route: &Route, p: &ParamSpec, d: &Dynamic) -> Result<()> {
    if d.kind == DynKind::Indirect {
        if route.dma {
            return Err(fail(
                Value,
                "indirect_on_dma",
                "tensor indirection (.indirect) is for compute operands; DMAs gather with vector_offset",
            ));
        }
        if !p.indirect {
            return Err(fail(Value, "indirect_not_allowed", indirect_refusal(spec)));
        }
    } else if !route.dma {
        return Err(fail(
            Value,
            "dynamic_offset_not_dma",
            format!(
                "dynamic offsets (scalar_offset / vector_offset) are DMA addressing; {} is not a DMA instruction",
                spec.name
            ),
        ));
    }
    if let DynSrc::Reg(r) = d.src {
        check_register(r)?;
    }
    Ok(())
}

fn indirect_refusal(spec: &InstrSpec) -> String {
    let v: Vec<&str> = spec
        .params
        .iter()
        .filter(|p| p.indirect)
        .map(|p| p.name)
        .collect();
    if v.is_empty() {
        format!(
            "{} does not support tensor indirection (.indirect)",
            spec.name
        )
    } else {
        format!(
            "{} supports tensor indirection only on {}",
            spec.name,
            v.join(", ")
        )
    }
}
