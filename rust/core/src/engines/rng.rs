//! Random numbers: `rng`, `rand2`, `set_rng_seed`, `rand_set_state`, `rand_get_state` and
//! `dropout`, all drawing from the core's XORWOW states (`numerics::rng`).
//!
//! Our choices where the documentation is silent (docs/numerics.md, "Random numbers"): lane =
//! absolute partition; VectorE element j of a row draws from state j % 4 of its lane (GpSimd from
//! the lane's single state), elements in row order; a state is 6 words `[x0..x4, d]` and the
//! VectorE (P, 24) dump is state 0's six words, then state 1's, ...; a draw -> uniform
//! u = (bits >> 8) * 2^-24 in [0, 1); `rand2` = fl32(min + fl32((max - min) * u)); `dropout`
//! drops an element when u < prob.

use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p;
use crate::isa::{Arg, DType, Engine, Instr, Opcode};
use crate::memory::{Ap, Mem};
use crate::numerics::rng::{VECTOR_STATES, WORDS};

/// A required tensor operand (validation guarantees it; a miss is an emulator bug).
pub(crate) fn req<'a>(ins: &'a Instr, i: usize, name: &'static str) -> Result<&'a Ap> {
    ins.ap(i).ok_or_else(|| {
        err(Internal, format!("{name} is not a tensor after validation")).operand(name)
    })
}

#[inline]
fn unit(bits: u32) -> f32 {
    (bits >> 8) as f32 * (1.0 / 16_777_216.0)
}

fn state_words(engine: Engine) -> usize {
    if engine == Engine::Vector {
        WORDS * VECTOR_STATES
    } else {
        WORDS
    }
}

fn check_state_tile(ins: &Instr, ap: &Ap, name: &'static str) -> Result<()> {
    let w = state_words(ins.engine);
    if ap.free_size() != w {
        return Err(err(
            Shape,
            format!(
                "{} states are uint32 (P, {w}) on {} ({} x 6 words per lane), got {} elements per partition",
                ins.op.spec().name,
                ins.engine.name(),
                w / WORDS,
                ap.free_size()
            ),
        )
        .operand(name));
    }
    Ok(())
}

fn check_prob(a: &Arg, parts: u32) -> Result<()> {
    super::check_column(a, "prob", parts)?;
    // Integer immediates count too (docs/encoding.md): prob=2 is as wrong as prob=2.0.
    if let Some(v) = a.imm_f32() {
        if !(0.0..=1.0).contains(&v) {
            return Err(err(Value, format!("prob must be in [0, 1], got {v}")).operand("prob"));
        }
    }
    Ok(())
}

fn check(ins: &Instr) -> Result<()> {
    match ins.op {
        Opcode::Rng => {
            let d = req(ins, p::rng::DST, "dst")?;
            if ins.engine == Engine::Gpsimd && d.mem != Mem::Sbuf {
                return Err(err(MemorySpace, "GpSimd rng writes SBUF only").operand("dst"));
            }
        }
        Opcode::Rand2 => {
            let d = req(ins, p::rand2::DST, "dst")?;
            super::check_column(ins.arg(p::rand2::MIN), "min", d.parts)?;
            super::check_column(ins.arg(p::rand2::MAX), "max", d.parts)?;
            if let (Some(lo), Some(hi)) = (
                ins.arg(p::rand2::MIN).imm_f32(),
                ins.arg(p::rand2::MAX).imm_f32(),
            ) {
                if lo.partial_cmp(&hi) != Some(std::cmp::Ordering::Less) {
                    return Err(
                        err(Value, format!("min ({lo}) must be less than max ({hi})"))
                            .operand("max"),
                    );
                }
            }
        }
        Opcode::SetRngSeed => {
            let s = req(ins, p::set_rng_seed::SRC_SEEDS, "src_seeds")?;
            if s.parts != 1 || s.free_size() != 1 {
                return Err(err(
                    Shape,
                    format!("src_seeds must be a [1, 1] tile, got {:?}", s.shape()),
                )
                .operand("src_seeds"));
            }
        }
        Opcode::RandSetState => {
            let s = req(ins, p::rand_set_state::SRC_SEEDS, "src_seeds")?;
            check_state_tile(ins, s, "src_seeds")?;
        }
        Opcode::RandGetState => {
            let d = req(ins, p::rand_get_state::DST, "dst")?;
            check_state_tile(ins, d, "dst")?;
            if ins.engine == Engine::Gpsimd && d.mem != Mem::Sbuf {
                return Err(err(
                    MemorySpace,
                    "GpSimd rand_get_state writes SBUF only (PSUM only from Vector)",
                )
                .operand("dst"));
            }
        }
        Opcode::Dropout => {
            let d = req(ins, p::dropout::DST, "dst")?;
            let x = req(ins, p::dropout::DATA, "data")?;
            if d.dtype != x.dtype {
                return Err(err(
                    Dtype,
                    format!(
                        "dst dtype {} must equal data dtype {}",
                        d.dtype.name(),
                        x.dtype.name()
                    ),
                )
                .operand("dst"));
            }
            super::same_shape(x, "data", d, "dst")?;
            check_prob(ins.arg(p::dropout::PROB), x.parts)?;
            if let Arg::Tensor(t) = ins.arg(p::dropout::PROB) {
                if t.dtype != DType::Float32
                    && !matches!(
                        x.dtype,
                        DType::Float32
                            | DType::Bfloat16
                            | DType::Float16
                            | DType::Tfloat32
                            | DType::Float8E4m3
                            | DType::Float8E4m3fn
                            | DType::Float8E5m2
                    )
                {
                    return Err(err(Dtype, "prob must be fp32 for integer data").operand("prob"));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// One uniform draw per element of `ap` (row order), as raw bits.
fn draws(ctx: &mut Ctx, vector: bool, ap: &Ap) -> Vec<u32> {
    let f = ap.free_size();
    let mut out = Vec::with_capacity(ap.num_elements());
    for r in 0..ap.parts as usize {
        let lane = ap.start as usize + r;
        for j in 0..f {
            out.push(ctx.rng.next(vector, lane, j));
        }
    }
    out
}

fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let vector = ins.engine == Engine::Vector;
    match ins.op {
        Opcode::Rng => {
            let d = req(ins, p::rng::DST, "dst")?;
            let bits = draws(ctx, vector, d);
            ctx.write_raw(d, &bits);
        }
        Opcode::Rand2 => {
            let d = req(ins, p::rand2::DST, "dst")?;
            let lo = ctx.per_partition(ins.arg(p::rand2::MIN), d.parts, 0.0);
            let hi = ctx.per_partition(ins.arg(p::rand2::MAX), d.parts, 1.0);
            for (l, h) in lo.iter().zip(&hi) {
                if l.partial_cmp(h) != Some(std::cmp::Ordering::Less) {
                    return Err(
                        err(Value, format!("min ({l}) must be less than max ({h})")).operand("min")
                    );
                }
            }
            let bits = draws(ctx, vector, d);
            let f = d.free_size();
            let vals: Vec<f32> = bits
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let (l, h) = (lo[i / f.max(1)], hi[i / f.max(1)]);
                    l + (h - l) * unit(*b)
                })
                .collect();
            ctx.write_f32(d, &vals);
        }
        Opcode::SetRngSeed => {
            let s = req(ins, p::set_rng_seed::SRC_SEEDS, "src_seeds")?;
            let seed = ctx.read_raw(s).first().copied().unwrap_or(0);
            ctx.rng.seed_vector(seed as u64);
        }
        Opcode::RandSetState => {
            let s = req(ins, p::rand_set_state::SRC_SEEDS, "src_seeds")?;
            let raw = ctx.read_raw(s);
            let w = state_words(ins.engine);
            for (r, row) in raw.chunks_exact(w).enumerate() {
                let lane = (s.start as usize + r) % crate::memory::PARTITIONS;
                if vector {
                    for (k, st) in ctx.rng.vector[lane].iter_mut().enumerate() {
                        st.copy_from_slice(&row[k * WORDS..(k + 1) * WORDS]);
                    }
                } else {
                    ctx.rng.gpsimd[lane].copy_from_slice(row);
                }
            }
        }
        Opcode::RandGetState => {
            let d = req(ins, p::rand_get_state::DST, "dst")?;
            let mut out = Vec::with_capacity(d.num_elements());
            for r in 0..d.parts as usize {
                let lane = (d.start as usize + r) % crate::memory::PARTITIONS;
                if vector {
                    for st in &ctx.rng.vector[lane] {
                        out.extend_from_slice(st);
                    }
                } else {
                    out.extend_from_slice(&ctx.rng.gpsimd[lane]);
                }
            }
            ctx.write_raw(d, &out);
        }
        Opcode::Dropout => {
            let d = req(ins, p::dropout::DST, "dst")?;
            let x = req(ins, p::dropout::DATA, "data")?;
            let prob = ctx.per_partition(ins.arg(p::dropout::PROB), x.parts, 0.0);
            let data = ctx.mems.gather(x);
            let bits = draws(ctx, true, d);
            let es = x.dtype.size();
            let f = x.free_size().max(1);
            let mut out = data;
            for (i, b) in bits.iter().enumerate() {
                if unit(*b) < prob[i / f] {
                    out[i * es..(i + 1) * es].fill(0);
                }
            }
            ctx.mems.scatter(d, &out);
        }
        _ => {
            return Err(err(
                Internal,
                format!("{} is listed but not dispatched", ins.op.spec().name),
            ));
        }
    }
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[
        Opcode::Rng,
        Opcode::Rand2,
        Opcode::SetRngSeed,
        Opcode::RandSetState,
        Opcode::RandGetState,
        Opcode::Dropout,
    ],
    check,
    exec,
};

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::Rng<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::Rand2<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::SetRngSeed<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::RandSetState<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::RandGetState<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::Dropout<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
