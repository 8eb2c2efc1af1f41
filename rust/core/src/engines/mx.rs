//! MX (microscaling) instructions of NeuronCore-v4: `quantize_mx` (VectorE) and `nc_matmul_mx`
//! (TensorE). Layout and scale rules: reference §1.6 and docs/numerics.md ("MX").
//!
//! Scales live in the quadrant layout: scale row r (data partitions 8r..8r+7) sits at partition
//! `32*(r/4) + r%4` relative to the scale tile's first partition, whose offset within its
//! quadrant (0, 4, 8 or 12) selects one of four scale sets sharing an allocation.

use super::tensor::write_psum;
use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::{NcMatmulMx, QuantizeMx};
use crate::kernels::mx::{matmul_mx, Operand};
use crate::memory::{Ap, PSUM_BANK_BYTES};
use crate::numerics::mx::{
    scale_code, scale_partition, scale_parts_needed, scale_value, x4_element,
};

/// Data partitions: a multiple of 32, at most 128.
fn check_data_parts(ap: &Ap, name: &'static str) -> Result<()> {
    if ap.parts == 0 || !ap.parts.is_multiple_of(32) || ap.parts > 128 {
        return Err(fail(
            Shape,
            "mx_data_partitions",
            format!(
                "{name} partitions must be a multiple of 32 up to 128, got {}",
                ap.parts
            ),
        )
        .operand(name));
    }
    Ok(())
}

/// A scale tile for `data_parts` data partitions and `free` x4 columns.
fn check_scale(sc: &Ap, name: &'static str, data_parts: u32, free: usize) -> Result<()> {
    let off = sc.start % 32;
    if ![0, 4, 8, 12].contains(&off) {
        return Err(fail(
            Partition,
            "mx_scale_start",
            format!(
                "{name} must start at quadrant offset 0, 4, 8 or 12 (start partition {})",
                sc.start
            ),
        )
        .operand(name));
    }
    let need = scale_parts_needed(data_parts);
    if sc.parts < need {
        return Err(fail(Shape, "mx_scale_partitions",
            format!(
                "{name} needs {need} partitions for {data_parts} data partitions (scale row r at partition 32*(r/4) + r%4), got {}",
                sc.parts
            ),
        )
        .operand(name));
    }
    if sc.start + scale_partition(data_parts.div_ceil(8) - 1) >= 128 {
        return Err(fail(
            Address,
            "mx_scale_past_partition_127",
            format!("{name} scale rows run past partition 127"),
        )
        .operand(name));
    }
    if sc.free_size() != free {
        return Err(fail(
            Shape,
            "mx_scale_free_size",
            format!(
                "{name} must have one scale per x4 column: {free} elements per partition, got {}",
                sc.free_size()
            ),
        )
        .operand(name));
    }
    Ok(())
}

/// The scale rows of a scale tile: row r as its own one-partition access pattern.
fn scale_row(sc: &Ap, r: u32) -> Ap {
    let mut a = sc.clone();
    a.start = sc.start + scale_partition(r);
    a.parts = 1;
    a
}

impl Semantics for QuantizeMx<'_> {
    fn check(&self) -> Result<()> {
        check_quantize(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        quantize(self, ctx)
    }
}

impl Semantics for NcMatmulMx<'_> {
    fn check(&self) -> Result<()> {
        check_matmul(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        matmul(self, ctx)
    }
}

fn check_quantize(v: &QuantizeMx) -> Result<()> {
    let (dst, src, sc) = (v.dst, v.src, v.dst_scale);
    check_data_parts(src, "src")?;
    let f = src.free_size();
    if !f.is_multiple_of(4) || f == 0 {
        return Err(fail(
            Shape,
            "mx_src_free_multiple_of_4",
            format!("src free size must be a positive multiple of 4, got {f}"),
        )
        .operand("src"));
    }
    if dst.parts != src.parts || dst.free_size() != f / 4 {
        return Err(fail(
            Shape,
            "mx_dst_shape",
            format!(
                "dst must be (P, F/4) = ({}, {}) x4 words, got {} x {}",
                src.parts,
                f / 4,
                dst.parts,
                dst.free_size()
            ),
        )
        .operand("dst"));
    }
    check_scale(sc, "dst_scale", src.parts, f / 4)
}

fn quantize(v: &QuantizeMx, ctx: &mut Ctx) -> Result<()> {
    let (dst, src, sc) = (v.dst, v.src, v.dst_scale);
    let (elem, _) = x4_element(dst.dtype)
        .ok_or_else(|| fail(Dtype, "mx_x4_dtype", "dst must be an fp8 x4 dtype").operand("dst"))?;
    // Largest finite element: e4m3fn 448 (0x7E), e5m2 57344 (0x7B).
    let maxv = elem.decode(if elem.ebits == 5 { 0x7B } else { 0x7E }) as f64;
    let v = ctx.read_f32(src);
    let (p, f) = (src.parts as usize, src.free_size());
    let w = f / 4;
    // plain RNE: the in-range encoder (|y| <= max finite after the clamp)
    let rne = ctx.rounder.is_default();
    let mut words = vec![0u32; p * w];
    let mut scales = vec![0u32; (p / 8) * w];
    for g in 0..p / 8 {
        if rne {
            let rule = ctx.rounder.cfg.mx_scale;
            let (ws, sc) = (
                &mut words[8 * g * w..8 * (g + 1) * w],
                &mut scales[g * w..][..w],
            );
            crate::kernels::quantize::group_rne(&v[8 * g * f..8 * (g + 1) * f], elem, rule, ws, sc);
            continue;
        }
        for j in 0..w {
            let mut amax = 0f32;
            let mut special = false;
            for pp in 8 * g..8 * g + 8 {
                for q in 0..4 {
                    let x = v[pp * f + 4 * j + q];
                    special |= !x.is_finite();
                    amax = amax.max(x.abs());
                }
            }
            let code = if special {
                0xFF
            } else {
                scale_code(amax, elem, ctx.rounder.cfg.mx_scale)
            };
            scales[g * w + j] = code;
            let inv = 1.0 / scale_value(code); // exact power of two (NaN for 0xFF)
            for pp in 8 * g..8 * g + 8 {
                let mut word = 0u32;
                for q in 0..4 {
                    let i = pp * f + 4 * j + q;
                    let x = v[i];
                    let c = if special {
                        // Inf/NaN group: the whole block is NaN (scale 0xFF); elements get NaN too.
                        elem.encode(f32::NAN.to_bits()) | ((x.is_sign_negative() as u32) << 7)
                    } else {
                        let y = (x as f64 * inv).clamp(-maxv, maxv) as f32; // exact: power-of-two scaling
                        ctx.rounder.encode_fmt(elem, y, i as u64, true)
                    };
                    word |= (c & 0xFF) << (8 * q);
                }
                words[pp * w + j] = word;
            }
        }
    }
    ctx.write_raw(dst, &words);
    for r in 0..(p / 8) as u32 {
        let row = scale_row(sc, r);
        ctx.write_raw(&row, &scales[r as usize * w..(r as usize + 1) * w]);
    }
    Ok(())
}

fn check_matmul(v: &NcMatmulMx) -> Result<()> {
    let (dst, st, mv) = (v.dst, v.stationary, v.moving);
    check_data_parts(st, "stationary")?;
    if mv.parts != st.parts {
        return Err(fail(
            Shape,
            "matmul_k_mismatch",
            format!(
                "stationary has {} partitions but moving has {}",
                st.parts, mv.parts
            ),
        )
        .operand("moving"));
    }
    let (m, n) = (st.free_size(), mv.free_size());
    if m == 0 || m > 128 || !m.is_multiple_of(2) {
        return Err(fail(
            Shape,
            "mx_stationary_free_size",
            format!("stationary free size must be even and at most 128, got {m}"),
        )
        .operand("stationary"));
    }
    let max_n = if dst.dtype.size() == 2 { 8192 } else { 4096 };
    if n == 0 || n > max_n {
        return Err(fail(
            Shape,
            "matmul_moving_free_too_large",
            format!(
                "moving free size N = {n} must be 1..{max_n} for {} PSUM",
                dst.dtype.name()
            ),
        )
        .operand("moving"));
    }
    if dst.parts as usize != m || dst.free_size() != n {
        return Err(fail(
            Shape,
            "matmul_dst_shape",
            format!(
                "dst must be [M, N] = [{m}, {n}], got {} x {}",
                dst.parts,
                dst.free_size()
            ),
        )
        .operand("dst"));
    }
    let bank_elems = PSUM_BANK_BYTES / dst.dtype.size();
    if n > bank_elems && !dst.offset.is_multiple_of(PSUM_BANK_BYTES as u64) {
        return Err(fail(PsumBank, "matmul_result_bank_alignment", format!("a result wider than one bank ({n} > {bank_elems} elements) must start on a bank boundary")).operand("dst"));
    }
    check_scale(v.stationary_scale, "stationary_scale", st.parts, m)?;
    check_scale(v.moving_scale, "moving_scale", mv.parts, n)?;
    check_row_tiles(
        v.tile_position.unwrap_or(&[]),
        v.tile_size.unwrap_or(&[]),
        st.parts,
    )
}

/// nc_matmul_mx tiles rows only (tile_size column 128, tile_position column 0).
fn check_row_tiles(tpos: &[i32], tsz: &[i32], parts: u32) -> Result<()> {
    if tpos.len() != tsz.len() || !(tpos.is_empty() || tpos.len() == 2) {
        return Err(fail(
            Value,
            "matmul_tile_pairs",
            "tile_position and tile_size must both be absent or both (row, col) pairs",
        )
        .operand("tile_position"));
    }
    if tpos.len() == 2 {
        if tsz[1] != 128 || tpos[1] != 0 {
            return Err(fail(Value, "mx_row_tiling_only", "nc_matmul_mx supports row tiling only: tile_size column 128, tile_position column 0").operand("tile_size"));
        }
        if ![32, 64, 128].contains(&tsz[0])
            || tpos[0] < 0
            || tpos[0] % tsz[0] != 0
            || tpos[0] + tsz[0] > 128
        {
            return Err(fail(Value, "matmul_tile_invalid", format!("row tile position {} / size {} invalid (size 32, 64 or 128; position a multiple of size within 128)", tpos[0], tsz[0])).operand("tile_position"));
        }
        if parts as i32 > tsz[0] {
            return Err(fail(
                Shape,
                "matmul_tile_too_small",
                format!("{} partitions do not fit the {}-row PE tile", parts, tsz[0]),
            )
            .operand("tile_size"));
        }
    }
    Ok(())
}

/// Per partition p and column pair (m, n): the 4 quad products, scaled by 2^(sS + sM), summed
/// exactly (integer arithmetic) and rounded once to fp32; the fp32 column sum accumulates over
/// partitions 0..P-1 with RNE from +0.0. Inf/NaN elements or NaN scales use plain fp64 products.
/// The arithmetic runs in kernels/mx.rs.
fn matmul(v: &NcMatmulMx, ctx: &mut Ctx) -> Result<()> {
    let (dst, st, mv) = (v.dst, v.stationary, v.moving);
    let (ss, ms) = (v.stationary_scale, v.moving_scale);
    let (fs, bs) = x4_element(st.dtype).ok_or_else(|| {
        fail(Dtype, "mx_x4_dtype", "stationary must be an x4 dtype").operand("stationary")
    })?;
    let (fm, bm) = x4_element(mv.dtype).ok_or_else(|| {
        fail(Dtype, "mx_x4_dtype", "moving must be an x4 dtype").operand("moving")
    })?;
    let (p, m, n) = (st.parts as usize, st.free_size(), mv.free_size());
    let a = ctx.read_raw(st);
    let b = ctx.read_raw(mv);
    let rows = p / 8;
    let mut sa = Vec::with_capacity(rows * m);
    let mut sb = Vec::with_capacity(rows * n);
    for r in 0..rows as u32 {
        sa.extend(ctx.read_raw(&scale_row(ss, r)).iter().map(|c| c & 0xFF));
        sb.extend(ctx.read_raw(&scale_row(ms, r)).iter().map(|c| c & 0xFF));
    }
    let opa = Operand {
        words: &a,
        scales: &sa,
        w: m,
        fmt: fs,
        bits: bs,
    };
    let opb = Operand {
        words: &b,
        scales: &sb,
        w: n,
        fmt: fm,
        bits: bm,
    };
    let prod = matmul_mx(p, &opa, &opb);
    write_psum(ctx, v.accumulate, dst, &prod.acc());
    Ok(())
}
