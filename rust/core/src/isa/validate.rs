//! The generic checks every instruction passes before it can be part of a program, whatever its
//! origin (assembler, text, binary): operand kinds, enums, memories, dtypes, bounds, engine
//! connectivity, the start-partition rule — all read from the isa.toml tables. The instruction's
//! own rules are `engines::Semantics::check`; `engines::validate` runs both.

use super::instr::{Arg, Instr, MAX_SYNC, NUM_REGISTERS, NUM_SEMAPHORES};
use super::spec::{dtype_names, mem_names, DataPath, Kind, StartRule};
use super::tables::{Engine, ENUMS};
use crate::error::{fail, ErrorKind::*, Result};
use crate::memory::{DynKind, DynSrc, Mem};

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
    for w in &instr.waits {
        if w.sem >= NUM_SEMAPHORES {
            return Err(fail(
                Semaphore,
                "semaphore_out_of_range",
                format!("semaphore s{} out of range (0..{NUM_SEMAPHORES})", w.sem),
            )
            .operand("wait"));
        }
    }
    for s in &instr.signals {
        if s.sem >= NUM_SEMAPHORES {
            return Err(fail(
                Semaphore,
                "semaphore_out_of_range",
                format!("semaphore s{} out of range (0..{NUM_SEMAPHORES})", s.sem),
            )
            .operand("signal"));
        }
    }
    let dma = spec.path == DataPath::Dma;
    // Collectives move their data on the DMA engines (any trigger engine); control instructions
    // (register / scalar loads and stores) go through the sequencer, not the engine's data path.
    let dma_path = dma || spec.path == DataPath::Collective;
    let eng = if dma_path { Engine::Dma } else { instr.engine };
    let einfo = if spec.path == DataPath::Control {
        None
    } else {
        eng.info()
    };
    for (p, a) in spec.params.iter().zip(&instr.args) {
        let bad = |k, rule, msg: String| Err(fail(k, rule, msg).operand(p.name));
        let kind_ok = p.kind.accepts(a);
        if !kind_ok {
            return bad(
                Value,
                "operand_kind",
                format!("expected {:?}, got {a:?}", p.kind),
            );
        }
        match a {
            Arg::Absent => {
                if matches!(p.default, super::spec::Default::Required) {
                    return bad(
                        Value,
                        "operand_required",
                        "required operand is missing".into(),
                    );
                }
            }
            Arg::Enum(v) => {
                let e = &ENUMS[p.enum_id as usize];
                if *v as usize >= e.values.len() {
                    return bad(
                        Value,
                        "enum_value_out_of_range",
                        format!("{v} is not a valid {} value", e.name),
                    );
                }
            }
            Arg::Ints(v) => {
                if v.len() > 255 {
                    return bad(Value, "too_many_ints", "at most 255 integers".into());
                }
                if p.kind == Kind::Pattern && (v.len() % 2 != 0 || v.len() > 8) {
                    return bad(
                        Shape,
                        "pattern_pairs",
                        "pattern must be 1..4 [step, num] pairs".into(),
                    );
                }
            }
            Arg::Reg(r) if *r >= NUM_REGISTERS => {
                return bad(
                    Value,
                    "register_out_of_range",
                    format!("register r{r} out of range (0..{NUM_REGISTERS})"),
                );
            }
            Arg::Tensor(ap) => {
                ap.check_bounds().map_err(|e| e.operand(p.name))?;
                if let Some(d) = ap.dynamic.as_deref() {
                    if d.kind == DynKind::Indirect {
                        if dma {
                            return bad(
                                Value,
                                "indirect_on_dma",
                                "tensor indirection (.indirect) is for compute operands; DMAs gather with vector_offset".into(),
                            );
                        }
                        if !p.indirect {
                            return bad(Value, "indirect_not_allowed", indirect_refusal(spec));
                        }
                    } else if !dma {
                        return bad(
                            Value,
                            "dynamic_offset_not_dma",
                            format!(
                                "dynamic offsets (scalar_offset / vector_offset) are DMA addressing; {} is not a DMA instruction",
                                spec.name
                            ),
                        );
                    }
                    if let DynSrc::Reg(r) = d.src {
                        if r >= NUM_REGISTERS {
                            return bad(
                                Value,
                                "register_out_of_range",
                                format!("register r{r} out of range (0..{NUM_REGISTERS})"),
                            );
                        }
                    }
                }
                if p.mem & ap.mem.bit() == 0 {
                    return bad(
                        MemorySpace,
                        "memory_space_not_allowed",
                        format!(
                            "{} is in {}, but {} allows {}",
                            p.name,
                            ap.mem.name(),
                            spec.name,
                            mem_names(p.mem)
                        ),
                    );
                }
                if !ap.dtype.in_class(p.dtypes) {
                    return bad(
                        Dtype,
                        "dtype_not_allowed",
                        format!(
                            "dtype {} not allowed for {} (allowed: {})",
                            ap.dtype.name(),
                            spec.name,
                            dtype_names(p.dtypes)
                        ),
                    );
                }
                if let Some(ei) = einfo {
                    if p.access.reads() && ei.reads & ap.mem.bit() == 0 {
                        return bad(
                            MemorySpace,
                            "engine_cannot_read",
                            format!("engine {} cannot read {}", ei.name, ap.mem.name()),
                        );
                    }
                    if p.access.writes() && ei.writes & ap.mem.bit() == 0 {
                        return bad(
                            MemorySpace,
                            "engine_cannot_write",
                            format!("engine {} cannot write {}", ei.name, ap.mem.name()),
                        );
                    }
                }
                if !dma_path && p.start == StartRule::Partition && ap.mem != Mem::Hbm {
                    ap.check_start_partition().map_err(|e| e.operand(p.name))?;
                }
                if eng == Engine::Tensor && p.access.writes() {
                    ap.check_psum_bank().map_err(|e| e.operand(p.name))?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn indirect_refusal(spec: &super::spec::InstrSpec) -> String {
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
