//! TensorE: nc_matmul and nc_transpose.
//!
//! Matmul numerics (docs/numerics.md): every product is exact and each accumulation step is one
//! fused multiply-add `acc = fl32(acc + a*b)` in fp32 with round-to-nearest-even, in partition
//! order 0..K-1 starting from +0.0; the column sum is then added to PSUM
//! (`psum = fl32(psum + sum)`) or overwrites it, and a bf16 PSUM is rounded RNE after the add.
//! The arithmetic runs in crate::kernels (packed panels, SIMD microkernels, threads).

use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::{NcMatmul, NcTranspose};
use crate::isa::{DType, Engine, MatmulPerfMode};
use crate::kernels;
use crate::kernels::psum::{Acc, Layout};
use crate::kernels::transpose::transpose_bytes;
use crate::memory::{Ap, Mem, PSUM_BANK_BYTES};

fn is_fp32ish(d: DType) -> bool {
    matches!(d, DType::Float32 | DType::Tfloat32)
}

impl Semantics for NcMatmul<'_> {
    fn check(&self) -> Result<()> {
        let (st, mv) = (self.stationary, self.moving);
        if st.parts != mv.parts {
            return Err(fail(
                Shape,
                "matmul_k_mismatch",
                format!(
                    "stationary has {} partitions (K) but moving has {}",
                    st.parts, mv.parts
                ),
            )
            .operand("moving"));
        }
        let (k, m, n) = if self.perf_mode == MatmulPerfMode::DoubleRow {
            check_double_row(self)?;
            (st.parts, st.free_size() / 2, mv.free_size() / 2)
        } else {
            (st.parts, st.free_size(), mv.free_size())
        };
        check_stationary_columns(m)?;
        check_pairing(st.dtype, mv.dtype)?;
        check_matmul_dst(self, k, m, n)?;
        check_tiles(self.tile_position, self.tile_size, k, m)
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (dst, st, mv) = (self.dst, self.stationary, self.moving);
        if self.is_transpose {
            // Bit-exact pass-through of the stationary tile (moving is the identity by contract).
            transpose_tile(ctx, dst, st);
            return Ok(());
        }
        // double_row: [K, 2, M] x [K, 2, N], logical contraction row 2k + l, accumulated in order.
        let groups = if self.perf_mode == MatmulPerfMode::DoubleRow {
            2
        } else {
            1
        };
        let words = &mut ctx.state.psum_mm;
        let ops = (st, mv, groups);
        if kernels::matmul::matmul_in_place(&mut ctx.mems, words, ops, dst, self.accumulate)? {
            return Ok(());
        }
        let product = kernels::matmul::matmul(&ctx.mems, st, mv, groups)?;
        write_psum(ctx, self.accumulate, dst, &product.acc());
        Ok(())
    }
}

/// Which operand dtypes may meet in one matmul.
/// The stationary operand's free size is at most the 128 PE columns.
pub(crate) fn check_stationary_columns(m: usize) -> Result<()> {
    if m > 128 {
        return Err(fail(
            Shape,
            "matmul_stationary_free_too_large",
            format!("stationary free size M = {m} exceeds 128 (PE columns)"),
        )
        .operand("stationary"));
    }
    Ok(())
}

pub(crate) fn check_pairing(st: DType, mv: DType) -> Result<()> {
    if is_fp32ish(st) != is_fp32ish(mv) {
        return Err(fail(
            Dtype,
            "matmul_fp32_pairing",
            format!(
                "fp32/tf32 operands can only pair with fp32/tf32 (stationary {}, moving {})",
                st.name(),
                mv.name()
            ),
        )
        .operand("moving"));
    }
    let fp8_legacy = |d: DType| d == DType::Float8E4m3;
    let fp8_ocp = |d: DType| d == DType::Float8E4m3fn;
    if (fp8_legacy(st) && fp8_ocp(mv)) || (fp8_ocp(st) && fp8_legacy(mv)) {
        return Err(fail(
            Dtype,
            "matmul_fp8_e4m3_mix",
            "float8_e4m3 (legacy) and float8_e4m3fn (OCP) cannot be mixed in one matmul",
        )
        .operand("moving"));
    }
    Ok(())
}

/// The dst of a `[K, M] x [K, N]` matmul: dtype, shape `[M, N]`, N limit, bank alignment.
fn check_matmul_dst(v: &NcMatmul, k: u32, m: usize, n: usize) -> Result<()> {
    let (dst, st) = (v.dst, v.stationary);
    if v.is_transpose {
        if dst.dtype != st.dtype {
            return Err(fail(
                Dtype,
                "matmul_transpose_dtype",
                format!(
                    "transpose mode writes the input dtype: dst is {} but stationary is {}",
                    dst.dtype.name(),
                    st.dtype.name()
                ),
            )
            .operand("dst"));
        }
        if n != k as usize {
            return Err(fail(
                Shape,
                "matmul_transpose_identity",
                format!("transpose mode needs a [{k}, {k}] identity as moving, got free size {n}"),
            )
            .operand("moving"));
        }
    } else if !matches!(dst.dtype, DType::Float32 | DType::Bfloat16) {
        return Err(fail(
            Dtype,
            "matmul_dst_dtype",
            format!(
                "matmul dst must be float32 or bfloat16 PSUM, got {}",
                dst.dtype.name()
            ),
        )
        .operand("dst"));
    }
    check_result_tile(dst, m, n)
}

/// A matmul result tile `[M, N]` in PSUM (shared with nc_matmul_mx): shape, N at most 4096
/// fp32 / 8192 bf16, and a result wider than one bank starts on a bank boundary.
pub(crate) fn check_result_tile(dst: &Ap, m: usize, n: usize) -> Result<()> {
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
    let max_n = if dst.dtype.size() == 2 { 8192 } else { 4096 };
    if n > max_n {
        return Err(fail(
            Shape,
            "matmul_moving_free_too_large",
            format!(
                "moving free size N = {n} exceeds {max_n} for {} PSUM",
                dst.dtype.name()
            ),
        )
        .operand("moving"));
    }
    let bank_elems = PSUM_BANK_BYTES / dst.dtype.size();
    if n > bank_elems && !dst.offset.is_multiple_of(PSUM_BANK_BYTES as u64) {
        return Err(fail(PsumBank, "matmul_result_bank_alignment", format!("a result wider than one bank ({n} > {bank_elems} elements) must start on a bank boundary")).operand("dst"));
    }
    Ok(())
}

/// PE tiling: `tile_position` / `tile_size` both empty or both (row, col) pairs of valid
/// tiles, and `K x M` fits the tile.
fn check_tiles(tpos: &[i32], tsz: &[i32], k: u32, m: usize) -> Result<()> {
    if tpos.len() != tsz.len() || !(tpos.is_empty() || tpos.len() == 2) {
        return Err(fail(
            Value,
            "matmul_tile_pairs",
            "tile_position and tile_size must both be empty or both (row, col) pairs",
        )
        .operand("tile_position"));
    }
    if tpos.len() == 2 {
        for i in 0..2 {
            if ![32, 64, 128].contains(&tsz[i])
                || tpos[i] < 0
                || tpos[i] % tsz[i] != 0
                || tpos[i] + tsz[i] > 128
            {
                return Err(fail(Value, "matmul_tile_invalid", format!("tile {} position {} / size {} invalid (size 32, 64 or 128; position a multiple of size within 128)", ["row", "column"][i], tpos[i], tsz[i])).operand("tile_position"));
            }
        }
        if k as i32 > tsz[0] || m as i32 > tsz[1] {
            return Err(fail(
                Shape,
                "matmul_tile_too_small",
                format!(
                    "K = {k}, M = {m} do not fit the PE tile {}x{}",
                    tsz[0], tsz[1]
                ),
            )
            .operand("tile_size"));
        }
    }
    Ok(())
}

/// `perf_mode=double_row` (reference §1.5): FP8 operands only, laid out `[K, 2, M]` /
/// `[K, 2, N]` (the size-2 dim is the first free dim); no transpose, no column tiling.
fn check_double_row(v: &NcMatmul) -> Result<()> {
    let fp8 = |d: DType| {
        matches!(
            d,
            DType::Float8E4m3 | DType::Float8E4m3fn | DType::Float8E5m2
        )
    };
    for (a, name) in [(v.stationary, "stationary"), (v.moving, "moving")] {
        if !fp8(a.dtype) {
            return Err(fail(
                Dtype,
                "matmul_double_row_dtype",
                format!(
                    "perf_mode=double_row takes fp8 operands only, {name} is {}",
                    a.dtype.name()
                ),
            )
            .operand(name));
        }
        if a.dims.first().map(|d| d.1) != Some(2) || a.dims.len() < 2 {
            return Err(fail(
                Shape,
                "matmul_double_row_layout",
                format!(
                    "perf_mode=double_row needs {name} laid out [K, 2, F] (first free dim of size 2), got {:?}",
                    a.shape()
                ),
            )
            .operand(name));
        }
    }
    if v.is_transpose {
        return Err(fail(
            Value,
            "matmul_double_row_transpose",
            "perf_mode=double_row cannot combine with transpose mode",
        )
        .operand("is_transpose"));
    }
    if v.tile_size.len() == 2 && v.tile_size[1] != 128 {
        return Err(fail(
            Value,
            "matmul_double_row_column_tiling",
            "perf_mode=double_row cannot combine with column tiling",
        )
        .operand("tile_size"));
    }
    Ok(())
}

/// The PSUM write of a matmul result (shared with nc_matmul_mx): overwrite, add, or (`None`)
/// add where a matmul already wrote this run (kernels/psum.rs); bf16 and strided results are
/// stored through the instruction's rounder.
pub(crate) fn write_psum(ctx: &mut Ctx, accumulate: Option<bool>, dst: &Ap, acc: &Acc) {
    let words = &mut ctx.state.psum_mm;
    match kernels::psum::layout(dst) {
        Layout::F32Rows => {
            kernels::psum::write_f32_rows(accumulate, ctx.mems.psum, words, dst, acc)
        }
        Layout::Bf16Rows => {
            let staged = kernels::psum::stage_bf16(accumulate, ctx.mems.psum, words, dst, acc);
            ctx.write_f32(dst, &staged);
        }
        Layout::General => {
            let old = ctx.read_f32(dst);
            let words = &mut ctx.state.psum_mm;
            let out = kernels::psum::stage_general(accumulate, &old, words, dst, acc);
            ctx.write_f32(dst, &out);
        }
    }
}

fn check_transpose(v: &NcTranspose) -> Result<()> {
    let (dst, src) = (v.dst, v.data);
    if dst.dtype != src.dtype {
        return Err(fail(
            Dtype,
            "transpose_dtype_mismatch",
            format!(
                "dst dtype {} must equal data dtype {}",
                dst.dtype.name(),
                src.dtype.name()
            ),
        )
        .operand("dst"));
    }
    let (p, f) = (src.parts as usize, src.free_size());
    let engine = v.ins.engine;
    let limit = if engine == Engine::Tensor { 128 } else { 32 };
    if p > limit || f > limit {
        return Err(fail(
            Shape,
            "transpose_too_large",
            format!(
                "{} transpose handles at most [{limit}, {limit}], got [{p}, {f}]",
                engine.name()
            ),
        )
        .operand("data"));
    }
    if dst.parts as usize != f || dst.free_size() != p {
        return Err(fail(
            Shape,
            "transpose_dst_shape",
            format!(
                "dst must be [{f}, {p}] (data transposed), got {} x {}",
                dst.parts,
                dst.free_size()
            ),
        )
        .operand("dst"));
    }
    if engine == Engine::Tensor {
        if src.mem != Mem::Sbuf {
            return Err(fail(
                MemorySpace,
                "pe_transpose_memory",
                "TensorE transpose reads SBUF",
            )
            .operand("data"));
        }
        if dst.mem != Mem::Psum {
            return Err(fail(
                MemorySpace,
                "pe_transpose_memory",
                "TensorE transpose writes PSUM",
            )
            .operand("dst"));
        }
    }
    Ok(())
}

impl Semantics for NcTranspose<'_> {
    fn check(&self) -> Result<()> {
        check_transpose(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        transpose_tile(ctx, self.dst, self.data);
        Ok(())
    }
}

/// `dst` = `src` transposed, bit for bit (validated shapes: src [p, f], dst [f, p]). Dense
/// rows in two different on-chip memories (the PE's SBUF -> PSUM) move straight from
/// partition to partition; other patterns go through packed staging buffers.
fn transpose_tile(ctx: &mut Ctx, dst: &Ap, src: &Ap) {
    let (p, f, es) = (src.parts as usize, src.free_size(), src.dtype.size());
    let dense = |a: &Ap| a.mem != Mem::Hbm && a.dynamic.is_none() && a.is_row_contiguous();
    if dense(dst) && dense(src) && dst.mem != src.mem && dst.dtype.size() == es {
        let (s_mem, d_mem) = match src.mem {
            Mem::Sbuf => (&*ctx.mems.sbuf, &mut *ctx.mems.psum),
            _ => (&*ctx.mems.psum, &mut *ctx.mems.sbuf),
        };
        let (ss, ds) = (s_mem.stride(), d_mem.stride());
        let s0 = src.start as usize * ss + src.offset as usize;
        let d0 = dst.start as usize * ds + dst.offset as usize;
        let raw = d_mem.raw_mut();
        if let (Some(s), Some(d)) = (s_mem.raw().get(s0..), raw.get_mut(d0..)) {
            kernels::transpose::transpose_into(s, ss, d, ds, (p, f), es);
            return;
        }
    }
    let raw = ctx.mems.gather(src);
    let out = transpose_bytes(&raw, p, f, es);
    ctx.mems.scatter(dst, &out);
}
