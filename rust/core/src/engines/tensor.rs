//! TensorE: nc_matmul and nc_transpose.
//!
//! Matmul numerics (docs/numerics.md): every product is exact and each accumulation step is one
//! fused multiply-add `acc = fl32(acc + a*b)` in fp32 with round-to-nearest-even, in partition
//! order 0..K-1 starting from +0.0; the column sum is then added to PSUM
//! (`psum = fl32(psum + sum)`) or overwrites it, and a bf16 PSUM is rounded RNE after the add.
//! The arithmetic runs in crate::kernels (packed panels, SIMD microkernels, threads).

use super::Ctx;
use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::{nc_matmul as mm, nc_transpose as tp};
use crate::isa::Opcode;
use crate::isa::{DType, Engine, Instr, MatmulPerfMode};
use crate::kernels;
use crate::kernels::transpose::transpose_bytes;
use crate::memory::{Ap, Mem, PSUM_BANK_BYTES};

fn is_fp32ish(d: DType) -> bool {
    matches!(d, DType::Float32 | DType::Tfloat32)
}

pub fn check_matmul(ins: &Instr) -> Result<()> {
    let dst = ins.ap(mm::DST).unwrap();
    let st = ins.ap(mm::STATIONARY).unwrap();
    let mv = ins.ap(mm::MOVING).unwrap();
    if st.parts != mv.parts {
        return Err(err(
            Shape,
            format!(
                "stationary has {} partitions (K) but moving has {}",
                st.parts, mv.parts
            ),
        )
        .operand("moving"));
    }
    let double_row = ins.enum_val(mm::PERF_MODE) == Some(MatmulPerfMode::DoubleRow as u8);
    let (k, m, n) = if double_row {
        check_double_row(ins, st, mv)?;
        (st.parts, st.free_size() / 2, mv.free_size() / 2)
    } else {
        (st.parts, st.free_size(), mv.free_size())
    };
    if m > 128 {
        return Err(err(
            Shape,
            format!("stationary free size M = {m} exceeds 128 (PE columns)"),
        )
        .operand("stationary"));
    }
    if is_fp32ish(st.dtype) != is_fp32ish(mv.dtype) {
        return Err(err(
            Dtype,
            format!(
                "fp32/tf32 operands can only pair with fp32/tf32 (stationary {}, moving {})",
                st.dtype.name(),
                mv.dtype.name()
            ),
        )
        .operand("moving"));
    }
    let fp8_legacy = |d: DType| d == DType::Float8E4m3;
    let fp8_ocp = |d: DType| d == DType::Float8E4m3fn;
    if (fp8_legacy(st.dtype) && fp8_ocp(mv.dtype)) || (fp8_ocp(st.dtype) && fp8_legacy(mv.dtype)) {
        return Err(err(
            Dtype,
            "float8_e4m3 (legacy) and float8_e4m3fn (OCP) cannot be mixed in one matmul",
        )
        .operand("moving"));
    }
    let transpose = ins.bool_or(mm::IS_TRANSPOSE, false);
    if transpose {
        if dst.dtype != st.dtype {
            return Err(err(
                Dtype,
                format!(
                    "transpose mode writes the input dtype: dst is {} but stationary is {}",
                    dst.dtype.name(),
                    st.dtype.name()
                ),
            )
            .operand("dst"));
        }
        if n != k as usize {
            return Err(err(
                Shape,
                format!("transpose mode needs a [{k}, {k}] identity as moving, got free size {n}"),
            )
            .operand("moving"));
        }
    } else if !matches!(dst.dtype, DType::Float32 | DType::Bfloat16) {
        return Err(err(
            Dtype,
            format!(
                "matmul dst must be float32 or bfloat16 PSUM, got {}",
                dst.dtype.name()
            ),
        )
        .operand("dst"));
    }
    if dst.parts as usize != m || dst.free_size() != n {
        return Err(err(
            Shape,
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
        return Err(err(
            Shape,
            format!(
                "moving free size N = {n} exceeds {max_n} for {} PSUM",
                dst.dtype.name()
            ),
        )
        .operand("moving"));
    }
    let bank_elems = PSUM_BANK_BYTES / dst.dtype.size();
    if n > bank_elems && !dst.offset.is_multiple_of(PSUM_BANK_BYTES as u64) {
        return Err(err(PsumBank, format!("a result wider than one bank ({n} > {bank_elems} elements) must start on a bank boundary")).operand("dst"));
    }
    let (tpos, tsz) = (ins.ints(mm::TILE_POSITION), ins.ints(mm::TILE_SIZE));
    if tpos.len() != tsz.len() || !(tpos.is_empty() || tpos.len() == 2) {
        return Err(err(
            Value,
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
                return Err(err(Value, format!("tile {} position {} / size {} invalid (size 32, 64 or 128; position a multiple of size within 128)", ["row", "column"][i], tpos[i], tsz[i])).operand("tile_position"));
            }
        }
        if k as i32 > tsz[0] || m as i32 > tsz[1] {
            return Err(err(
                Shape,
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
fn check_double_row(ins: &Instr, st: &Ap, mv: &Ap) -> Result<()> {
    let fp8 = |d: DType| {
        matches!(
            d,
            DType::Float8E4m3 | DType::Float8E4m3fn | DType::Float8E5m2
        )
    };
    for (a, name) in [(st, "stationary"), (mv, "moving")] {
        if !fp8(a.dtype) {
            return Err(err(
                Dtype,
                format!(
                    "perf_mode=double_row takes fp8 operands only, {name} is {}",
                    a.dtype.name()
                ),
            )
            .operand(name));
        }
        if a.dims.first().map(|d| d.1) != Some(2) || a.dims.len() < 2 {
            return Err(err(
                Shape,
                format!(
                    "perf_mode=double_row needs {name} laid out [K, 2, F] (first free dim of size 2), got {:?}",
                    a.shape()
                ),
            )
            .operand(name));
        }
    }
    if ins.bool_or(mm::IS_TRANSPOSE, false) {
        return Err(err(
            Value,
            "perf_mode=double_row cannot combine with transpose mode",
        )
        .operand("is_transpose"));
    }
    let tsz = ins.ints(mm::TILE_SIZE);
    if tsz.len() == 2 && tsz[1] != 128 {
        return Err(err(
            Value,
            "perf_mode=double_row cannot combine with column tiling",
        )
        .operand("tile_size"));
    }
    Ok(())
}

pub fn matmul(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(mm::DST).unwrap();
    let st = ins.ap(mm::STATIONARY).unwrap();
    let mv = ins.ap(mm::MOVING).unwrap();
    if ins.bool_or(mm::IS_TRANSPOSE, false) {
        // Bit-exact pass-through of the stationary tile (moving is the identity by contract).
        let (k, m) = (st.parts as usize, st.free_size());
        let raw = ctx.mems.gather(st);
        let out = transpose_bytes(&raw, k, m, st.dtype.size());
        ctx.mems.scatter(dst, &out);
        return Ok(());
    }
    // double_row: [K, 2, M] x [K, 2, N], logical contraction row 2k + l, accumulated in order.
    let groups = if ins.enum_val(mm::PERF_MODE) == Some(MatmulPerfMode::DoubleRow as u8) {
        2
    } else {
        1
    };
    kernels::matmul::matmul(ctx, st, mv, groups, dst, ins.arg(mm::ACCUMULATE))
}

/// The PSUM write of a matmul result (kernels/psum.rs), shared with nc_matmul_mx.
pub(crate) use crate::kernels::psum::write_psum;

pub fn check_transpose(ins: &Instr) -> Result<()> {
    let dst = ins.ap(tp::DST).unwrap();
    let src = ins.ap(tp::DATA).unwrap();
    if dst.dtype != src.dtype {
        return Err(err(
            Dtype,
            format!(
                "dst dtype {} must equal data dtype {}",
                dst.dtype.name(),
                src.dtype.name()
            ),
        )
        .operand("dst"));
    }
    let (p, f) = (src.parts as usize, src.free_size());
    let limit = if ins.engine == Engine::Tensor {
        128
    } else {
        32
    };
    if p > limit || f > limit {
        return Err(err(
            Shape,
            format!(
                "{} transpose handles at most [{limit}, {limit}], got [{p}, {f}]",
                ins.engine.name()
            ),
        )
        .operand("data"));
    }
    if dst.parts as usize != f || dst.free_size() != p {
        return Err(err(
            Shape,
            format!(
                "dst must be [{f}, {p}] (data transposed), got {} x {}",
                dst.parts,
                dst.free_size()
            ),
        )
        .operand("dst"));
    }
    if ins.engine == Engine::Tensor {
        if src.mem != Mem::Sbuf {
            return Err(err(MemorySpace, "TensorE transpose reads SBUF").operand("data"));
        }
        if dst.mem != Mem::Psum {
            return Err(err(MemorySpace, "TensorE transpose writes PSUM").operand("dst"));
        }
    }
    Ok(())
}

pub fn transpose(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    let dst = ins.ap(tp::DST).unwrap();
    let src = ins.ap(tp::DATA).unwrap();
    let (p, f) = (src.parts as usize, src.free_size());
    let raw = ctx.mems.gather(src);
    let out = transpose_bytes(&raw, p, f, src.dtype.size());
    ctx.mems.scatter(dst, &out);
    Ok(())
}

/// The instructions this module implements.
pub const MODULE: super::Module = super::Module {
    opcodes: &[Opcode::NcMatmul, Opcode::NcTranspose],
    check,
    exec,
};

fn check(ins: &Instr) -> Result<()> {
    match ins.op {
        Opcode::NcMatmul => check_matmul(ins),
        Opcode::NcTranspose => check_transpose(ins),
        _ => Ok(()),
    }
}

fn exec(ins: &Instr, ctx: &mut Ctx) -> Result<()> {
    match ins.op {
        Opcode::NcMatmul => matmul(ins, ctx),
        Opcode::NcTranspose => transpose(ins, ctx),
        _ => Err(crate::error::err(
            crate::error::ErrorKind::Internal,
            format!("{} is listed but not dispatched", ins.op.spec().name),
        )),
    }
}

// TRANSITIONAL: routes the generated dispatch to this module's old `MODULE` until it
// implements `Semantics` on the operand views itself.
impl super::Semantics for crate::isa::ops::NcMatmul<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
impl super::Semantics for crate::isa::ops::NcTranspose<'_> {
    fn check(&self) -> crate::error::Result<()> {
        (MODULE.check)(self.ins)
    }
    fn exec(&self, ctx: &mut super::Ctx) -> crate::error::Result<()> {
        (MODULE.exec)(self.ins, ctx)
    }
}
