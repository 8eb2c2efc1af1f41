//! Random numbers: `rng`, `rand2`, `set_rng_seed`, `rand_set_state`, `rand_get_state` and
//! `dropout`, all drawing from the core's XORWOW states (`numerics::rng`).
//!
//! Our choices where the documentation is silent (docs/numerics.md, "Random numbers"): lane =
//! absolute partition; VectorE element j of a row draws from state j % 4 of its lane (GpSimd from
//! the lane's single state), elements in row order; a state is 6 words `[x0..x4, d]` and the
//! VectorE (P, 24) dump is state 0's six words, then state 1's, ...; a draw -> uniform
//! u = (bits >> 8) * 2^-24 in [0, 1); `rand2` = fl32(min + fl32((max - min) * u)); `dropout`
//! drops an element when u < prob.

use super::check_column;
use super::{same_shape, Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::instr::Scalar;
use crate::isa::ops::{Dropout, Rand2, RandGetState, RandSetState, Rng, SetRngSeed};
use crate::isa::{DType, Engine, Instr};
use crate::memory::{Ap, Mem, PARTITIONS};
use crate::numerics::rng::{VECTOR_STATES, WORDS};

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
        return Err(fail(
            Shape,
            "rng_state_shape",
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

/// GpSimd's PRNG instructions write SBUF only.
fn gpsimd_sbuf_only(ins: &Instr, dst: &Ap, message: &str) -> Result<()> {
    if ins.engine == Engine::Gpsimd && dst.mem != Mem::Sbuf {
        return Err(fail(MemorySpace, "gpsimd_rng_sbuf_only", message).operand("dst"));
    }
    Ok(())
}

fn min_below_max(lo: f32, hi: f32, operand: &str) -> Result<()> {
    if lo.partial_cmp(&hi) != Some(std::cmp::Ordering::Less) {
        return Err(fail(
            Value,
            "rand2_min_not_below_max",
            format!("min ({lo}) must be less than max ({hi})"),
        )
        .operand(operand.to_string()));
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

impl Semantics for Rng<'_> {
    fn check(&self) -> Result<()> {
        gpsimd_sbuf_only(self.ins, self.dst, "GpSimd rng writes SBUF only")
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let bits = draws(ctx, self.ins.engine == Engine::Vector, self.dst);
        ctx.write_raw(self.dst, &bits);
        Ok(())
    }
}

impl Semantics for Rand2<'_> {
    fn check(&self) -> Result<()> {
        let parts = self.dst.parts;
        check_column(self.min, "min", parts)?;
        check_column(self.max, "max", parts)?;
        if let (Some(lo), Some(hi)) = (self.min.imm_f32(), self.max.imm_f32()) {
            min_below_max(lo, hi, "max")?;
        }
        Ok(())
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let d = self.dst;
        let lo = ctx.scalar(self.min, d.parts);
        let hi = ctx.scalar(self.max, d.parts);
        for (l, h) in lo.iter().zip(&hi) {
            min_below_max(*l, *h, "min")?;
        }
        let bits = draws(ctx, self.ins.engine == Engine::Vector, d);
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
        Ok(())
    }
}

impl Semantics for SetRngSeed<'_> {
    fn check(&self) -> Result<()> {
        let s = self.src_seeds;
        if s.parts != 1 || s.free_size() != 1 {
            return Err(fail(
                Shape,
                "rng_seed_shape",
                format!("src_seeds must be a [1, 1] tile, got {:?}", s.shape()),
            )
            .operand("src_seeds"));
        }
        Ok(())
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let seed = ctx.read_raw(self.src_seeds).first().copied().unwrap_or(0);
        ctx.rng.seed_vector(seed as u64);
        Ok(())
    }
}

impl Semantics for RandSetState<'_> {
    fn check(&self) -> Result<()> {
        check_state_tile(self.ins, self.src_seeds, "src_seeds")
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let s = self.src_seeds;
        let raw = ctx.read_raw(s);
        let vector = self.ins.engine == Engine::Vector;
        let w = state_words(self.ins.engine);
        for (r, row) in raw.chunks_exact(w).enumerate() {
            let lane = (s.start as usize + r) % PARTITIONS;
            if vector {
                for (k, st) in ctx.rng.vector[lane].iter_mut().enumerate() {
                    st.copy_from_slice(&row[k * WORDS..(k + 1) * WORDS]);
                }
            } else {
                ctx.rng.gpsimd[lane].copy_from_slice(row);
            }
        }
        Ok(())
    }
}

impl Semantics for RandGetState<'_> {
    fn check(&self) -> Result<()> {
        check_state_tile(self.ins, self.dst, "dst")?;
        gpsimd_sbuf_only(
            self.ins,
            self.dst,
            "GpSimd rand_get_state writes SBUF only (PSUM only from Vector)",
        )
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let d = self.dst;
        let vector = self.ins.engine == Engine::Vector;
        let mut out = Vec::with_capacity(d.num_elements());
        for r in 0..d.parts as usize {
            let lane = (d.start as usize + r) % PARTITIONS;
            if vector {
                for st in &ctx.rng.vector[lane] {
                    out.extend_from_slice(st);
                }
            } else {
                out.extend_from_slice(&ctx.rng.gpsimd[lane]);
            }
        }
        ctx.write_raw(d, &out);
        Ok(())
    }
}

/// `prob` is a probability: a (P,1) tile or an immediate in [0, 1].
fn check_prob(prob: Scalar, parts: u32) -> Result<()> {
    check_column(prob, "prob", parts)?;
    // Integer immediates count too (docs/encoding.md): prob=2 is as wrong as prob=2.0.
    if let Some(v) = prob.imm_f32() {
        if !(0.0..=1.0).contains(&v) {
            return Err(fail(
                Value,
                "dropout_prob_range",
                format!("prob must be in [0, 1], got {v}"),
            )
            .operand("prob"));
        }
    }
    Ok(())
}

impl Semantics for Dropout<'_> {
    fn check(&self) -> Result<()> {
        let (d, x) = (self.dst, self.data);
        if d.dtype != x.dtype {
            return Err(fail(
                Dtype,
                "dtype_mismatch",
                format!(
                    "dst dtype {} must equal data dtype {}",
                    d.dtype.name(),
                    x.dtype.name()
                ),
            )
            .operand("dst"));
        }
        same_shape(x, "data", d, "dst")?;
        check_prob(self.prob, x.parts)?;
        if let Scalar::Tile(t) = self.prob {
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
                return Err(fail(
                    Dtype,
                    "dropout_prob_dtype",
                    "prob must be fp32 for integer data",
                )
                .operand("prob"));
            }
        }
        Ok(())
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (d, x) = (self.dst, self.data);
        let prob = ctx.scalar(self.prob, x.parts);
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
        Ok(())
    }
}
