//! VectorE (and the GpSimd/Scalar variants of the same instructions): tensor_tensor,
//! tensor_scalar, tensor_copy, memset.

use super::alu::{
    apply, apply_bits, apply_bytes, apply_bytes_bf16, apply_i32, apply_scalar_bytes,
    apply_scalar_inplace, apply_slices, apply_vec_inplace, is_bitwise, is_elementwise, is_unary,
    ScalarOps,
};
use super::rows::{self, stream_work};
use super::{check_column, same_shape, Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::instr::{Imm, Scalar};
use crate::isa::ops::{Memset, TensorCopy, TensorScalar, TensorTensor};
use crate::isa::{AluOp, DType, Engine, Instr};
use crate::memory::{Ap, Mem};
use crate::numerics;

impl Semantics for TensorTensor<'_> {
    fn check(&self) -> Result<()> {
        check_tensor_tensor(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        tensor_tensor(self, ctx)
    }
}

impl Semantics for TensorScalar<'_> {
    fn check(&self) -> Result<()> {
        super::engine_select::check_engine_ops(self)?;
        check_tensor_scalar(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        tensor_scalar(self, ctx)
    }
}

impl Semantics for TensorCopy<'_> {
    fn check(&self) -> Result<()> {
        check_tensor_copy(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        tensor_copy(self, ctx)
    }
}

impl Semantics for Memset<'_> {
    fn check(&self) -> Result<()> {
        check_memset(self)
    }
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        memset(self, ctx)
    }
}

fn no_packed(ins: &Instr, aps: &[(&Ap, &str)]) -> Result<()> {
    for (ap, n) in aps {
        if ap.dtype.is_packed() {
            return Err(fail(
                Dtype,
                "packed_dtype_not_allowed",
                format!(
                    "{} cannot operate on packed MX dtype {}",
                    ins.op.spec().name,
                    ap.dtype.name()
                ),
            )
            .operand(n.to_string()));
        }
    }
    Ok(())
}

fn check_tensor_tensor(v: &TensorTensor) -> Result<()> {
    let (ins, dst, a, b, op) = (v.ins, v.dst, v.data1, v.data2, v.op);
    same_shape(dst, "dst", a, "data1")?;
    same_shape(a, "data1", b, "data2")?;
    if a.mem == Mem::Psum && b.mem == Mem::Psum {
        return Err(fail(
            MemorySpace,
            "psum_both_inputs",
            "at most one input of tensor_tensor may be in PSUM (both data1 and data2 are)",
        )
        .operand("data2"));
    }
    if !is_elementwise(op) || is_unary(op) {
        return Err(fail(
            Value,
            "alu_op_not_binary_elementwise",
            format!("{} is not a binary elementwise operator", op.name()),
        )
        .operand("op"));
    }
    if op == AluOp::Power && ins.engine != Engine::Gpsimd {
        return Err(fail(
            Value,
            "power_gpsimd_only",
            "power runs on GpSimd only (engine=gpsimd)",
        )
        .operand("op"));
    }
    super::alu::require_integer(op, &[(dst, "dst"), (a, "data1"), (b, "data2")])?;
    Ok(())
}

fn int32_exact(ins: &Instr, dts: &[DType]) -> bool {
    ins.engine == Engine::Gpsimd
        && dts
            .iter()
            .all(|d| matches!(d, DType::Int32 | DType::Uint32))
}

/// Shortest fp32 row (elements) the fused row-by-row pass takes: per row it pays a fixed cost
/// that the block path (one decode of all rows) does not, so columns such as the [P, 1] running
/// statistics of a softmax go the block way (same arithmetic, same bits).
const FUSED_MIN_ELEMENTS: usize = 16;

fn tensor_tensor(v: &TensorTensor, ctx: &mut Ctx) -> Result<()> {
    let (ins, dst, a, b, op) = (v.ins, v.dst, v.data1, v.data2, v.op);
    if is_bitwise(op) {
        let streamed = rows::map_raw(ctx, dst, [a, b], |_, _, _, _, [x, y], out| {
            for ((o, x), y) in out.iter_mut().zip(x).zip(y) {
                *o = apply_bits(op, *x, *y);
            }
        });
        if streamed {
            return Ok(());
        }
        let x = ctx.read_raw(a);
        let y = ctx.read_raw(b);
        let out: Vec<u32> = x
            .iter()
            .zip(&y)
            .map(|(x, y)| apply_bits(op, *x, *y))
            .collect();
        ctx.write_raw(dst, &out);
        return Ok(());
    }
    if int32_exact(ins, &[dst.dtype, a.dtype, b.dtype]) && apply_i32(op, 0, 0, true).is_some() {
        let signed = a.dtype == DType::Int32;
        // apply_i32 is Some for this op (checked above); `x` is never used.
        let f = |x: u32, y: u32| apply_i32(op, x, y, signed).unwrap_or(x);
        let streamed = rows::map_raw(ctx, dst, [a, b], |_, _, _, _, [x, y], out| {
            for ((o, x), y) in out.iter_mut().zip(x).zip(y) {
                *o = f(*x, *y);
            }
        });
        if streamed {
            return Ok(());
        }
        let x = ctx.read_raw(a);
        let y = ctx.read_raw(b);
        let out: Vec<u32> = x.iter().zip(&y).map(|(x, y)| f(*x, *y)).collect();
        ctx.write_raw(dst, &out);
        return Ok(());
    }
    // fp32 in and out, dense rows, no overlap: one fused pass straight through memory.
    if [dst, a, b].iter().all(|t| t.dtype == DType::Float32)
        && dst.free_size() >= FUSED_MIN_ELEMENTS
        && rows::fused_dense_any_par(ctx, dst, [a, b], stream_work(dst), |_, [x, y], out| {
            apply_bytes(op, x, y, out)
        })
    {
        return Ok(());
    }
    // bf16 in and out with RNE casts: the same single pass, widening and rounding inline (rows
    // split over the host threads from 1 MiB written, as fp32).
    if [dst, a, b].iter().all(|t| t.dtype == DType::Bfloat16)
        && ctx.rounder.is_default()
        && rows::fused_dense_par(ctx, dst, [a, b], stream_work(dst), |_, [x, y], out| {
            apply_bytes_bf16(op, x, y, out)
        })
    {
        return Ok(());
    }
    // other dtypes (mixed, stochastic rounding): split rows through fp32 when large
    if dst.free_size() >= FUSED_MIN_ELEMENTS
        && rows::map_f32_rows_par(ctx, dst, [a, b], stream_work(dst), |_, [x, y], out| {
            apply_slices(op, x, y, out)
        })
    {
        return Ok(());
    }
    if rows::map_f32(ctx, dst, [a, b], |_, _, _, _, [x, y], out| {
        apply_slices(op, x, y, out)
    }) {
        return Ok(());
    }
    let x = ctx.read_f32(a);
    let y = ctx.read_f32(b);
    let mut out = vec![0f32; x.len()];
    apply_slices(op, &x, &y, &mut out);
    ctx.write_f32(dst, &out);
    Ok(())
}

fn check_tensor_scalar(v: &TensorScalar) -> Result<()> {
    let (ins, dst, src, op0, op1) = (v.ins, v.dst, v.data, v.op0, v.op1);
    same_shape(dst, "dst", src, "data")?;
    no_packed(ins, &[(dst, "dst"), (src, "data")])?;
    check_column(v.operand0, "operand0", src.parts)?;
    check_column(v.operand1, "operand1", src.parts)?;
    for (op, n) in [(Some(op0), "op0"), (op1, "op1")] {
        if let Some(op) = op {
            if !is_elementwise(op) {
                return Err(fail(
                    Value,
                    "alu_op_not_elementwise",
                    format!("{} is not an elementwise operator", op.name()),
                )
                .operand(n));
            }
        }
    }
    if !is_unary(op0) && v.operand0.is_none() {
        return Err(fail(
            Value,
            "alu_operand_missing",
            format!("op0 {} needs operand0", op0.name()),
        )
        .operand("operand0"));
    }
    if let Some(op1) = op1 {
        if !is_unary(op1) && v.operand1.is_none() {
            return Err(fail(
                Value,
                "alu_operand_missing",
                format!("op1 {} needs operand1", op1.name()),
            )
            .operand("operand1"));
        }
        if is_bitwise(op0) != is_bitwise(op1) && op1 != AluOp::Bypass {
            return Err(fail(
                Value,
                "alu_bitwise_mix",
                "op0 and op1 must both be bitwise or both arithmetic",
            )
            .operand("op1"));
        }
    }
    if is_bitwise(op0) {
        if ins.engine != Engine::Vector {
            return Err(fail(
                Value,
                "bitwise_vector_only",
                "bitwise tensor_scalar runs on VectorE only",
            )
            .operand("engine"));
        }
        super::alu::require_integer(op0, &[(dst, "dst"), (src, "data")])?;
    }
    if ins.engine == Engine::Gpsimd && (dst.mem == Mem::Psum || src.mem == Mem::Psum) {
        return Err(
            fail(MemorySpace, "gpsimd_no_psum", "GpSimd cannot access PSUM").operand("dst"),
        );
    }
    Ok(())
}

fn tensor_scalar(v: &TensorScalar, ctx: &mut Ctx) -> Result<()> {
    let (dst, src, op0, op1) = (v.dst, v.data, v.op0, v.op1);
    let (rev0, rev1) = (v.reverse0, v.reverse1);
    let p = src.parts as usize;
    let f = src.free_size();
    if !is_bitwise(op0) {
        return tensor_scalar_f32(v, ctx, (op0, rev0), op1.map(|o| (o, rev1)));
    }
    let c0 = ctx.scalar_or(v.operand0, src.parts, 0.0);
    let c1 = ctx.scalar_or(v.operand1, src.parts, 0.0);
    // Bitwise: integer (P,1) tiles give their raw bits (like data); immediates their integer value.
    let bits = |a: Option<Scalar>, c: &[f32]| -> Vec<u32> {
        match a {
            Some(Scalar::Tile(ap)) if ap.dtype.is_integer() => ctx.read_raw(ap),
            Some(Scalar::Imm(Imm::I32(v))) => vec![v as u32; c.len()],
            _ => c.iter().map(|v| *v as i32 as u32).collect(),
        }
    };
    let b0 = bits(v.operand0, &c0);
    let b1 = bits(v.operand1, &c1);
    let x = ctx.read_raw(src);
    let mut out = vec![0u32; x.len()];
    for r in 0..p {
        let (k0, k1) = (b0[r], b1[r]);
        for j in 0..f {
            let v = x[r * f + j];
            let mut t = if rev0 {
                apply_bits(op0, k0, v)
            } else {
                apply_bits(op0, v, k0)
            };
            if let Some(op1) = op1 {
                t = if rev1 {
                    apply_bits(op1, k1, t)
                } else {
                    apply_bits(op1, t, k1)
                };
            }
            out[r * f + j] = t;
        }
    }
    ctx.write_raw(dst, &out);
    Ok(())
}

/// A tensor_scalar operand: one immediate for every partition, or a (P, 1) column's values.
enum Operand {
    Imm(f32),
    Col(Vec<f32>),
}

impl Operand {
    fn read(ctx: &Ctx, a: Option<Scalar>) -> Operand {
        match a {
            Some(Scalar::Tile(ap)) => Operand::Col(ctx.read_f32(ap)),
            Some(Scalar::Imm(i)) => Operand::Imm(i.f32()),
            None => Operand::Imm(0.0),
        }
    }
    #[inline]
    fn at(&self, r: usize) -> f32 {
        match self {
            Operand::Imm(v) => *v,
            Operand::Col(c) => c.get(r).copied().unwrap_or(0.0),
        }
    }
}

/// Arithmetic tensor_scalar: fused in-memory pass for dense fp32, else streamed blocks, else
/// the materialising path.
/// `tensor_scalar` on fp32 columns (`column::map_column_f32`): one kernel per common operator
/// pair with immediate operands, the generic `apply` per element otherwise (the same results
/// as `apply_scalar_inplace`). False when the operands are not columns.
fn column_scalar(
    ctx: &mut Ctx,
    dst: &Ap,
    src: &Ap,
    (op0, rev0, c0): (AluOp, bool, &Operand),
    op1: Option<(AluOp, bool, &Operand)>,
) -> bool {
    use super::column::map_column_f32 as map;
    use AluOp::*;
    let imm = |c: &Operand| match c {
        Operand::Imm(k) => Some(*k),
        Operand::Col(_) => None,
    };
    let k1 = op1.map_or(Some(0.0), |(_, _, c)| imm(c));
    if let (Some(k0), Some(k1)) = (imm(c0), k1) {
        match (op0, rev0, op1.map(|(o, r, _)| (o, r))) {
            (Add, false, None) => return map(ctx, dst, [src], |_, [x]| x + k0),
            (Multiply, false, None) => return map(ctx, dst, [src], |_, [x]| x * k0),
            (Multiply, false, Some((Add, false))) => {
                return map(ctx, dst, [src], |_, [x]| x * k0 + k1)
            }
            (Add, false, Some((Multiply, false))) => {
                return map(ctx, dst, [src], |_, [x]| (x + k0) * k1)
            }
            _ => {}
        }
    }
    let one = |op: AluOp, rev: bool, k: f32, v: f32| {
        if rev {
            apply(op, k, v)
        } else {
            apply(op, v, k)
        }
    };
    map(ctx, dst, [src], |r, [x]| {
        let t = one(op0, rev0, c0.at(r), x);
        match op1 {
            Some((op, rev, c)) => one(op, rev, c.at(r), t),
            None => t,
        }
    })
}

fn tensor_scalar_f32(
    v: &TensorScalar,
    ctx: &mut Ctx,
    (op0, rev0): (AluOp, bool),
    op1: Option<(AluOp, bool)>,
) -> Result<()> {
    let (dst, src) = (v.dst, v.data);
    let (p, f) = (src.parts as usize, src.free_size());
    let c0 = Operand::read(ctx, v.operand0);
    let c1 = Operand::read(ctx, v.operand1);
    let (op1, rev1) = match op1 {
        Some((o, r)) => (Some(o), r),
        None => (None, false),
    };
    // A block of rows r0..r0 + rows: op0 then op1 with each row's operands.
    let block = |r0: usize, rows: usize, w: usize, x: &[f32], out: &mut [f32]| {
        out.copy_from_slice(x);
        let stage = |out: &mut [f32], op: AluOp, c: &Operand, rev: bool| match c {
            // The same constant for every row: one pass over the block.
            Operand::Imm(k) => apply_scalar_inplace(op, out, *k, rev),
            // One element per row: the per-row operands are a vector.
            Operand::Col(v) if w == 1 => apply_vec_inplace(op, out, &v[r0..r0 + rows], rev),
            Operand::Col(v) => {
                for (k, row) in out.chunks_exact_mut(w.max(1)).enumerate() {
                    apply_scalar_inplace(op, row, v[r0 + k], rev);
                }
            }
        };
        stage(out, op0, &c0, rev0);
        if let Some(op1) = op1 {
            stage(out, op1, &c1, rev1);
        }
    };
    // fp32 columns (one element per partition): one strided pass, no block planning.
    if column_scalar(ctx, dst, src, (op0, rev0, &c0), op1.map(|o| (o, rev1, &c1))) {
        return Ok(());
    }
    // fp32 in and out, dense rows, no overlap: one pass straight through memory.
    if dst.dtype == DType::Float32
        && src.dtype == DType::Float32
        && f >= FUSED_MIN_ELEMENTS
        && rows::fused_dense_any_par(ctx, dst, [src], stream_work(dst), |r, [x], out| {
            let ops = ScalarOps {
                op0,
                rev0,
                k0: c0.at(r),
                op1,
                rev1,
                k1: c1.at(r),
            };
            apply_scalar_bytes(ops, x, out)
        })
    {
        return Ok(());
    }
    // other dtypes (bf16, mixed, stochastic rounding): split rows through fp32 when large, each
    // row as a one-row block
    if f >= FUSED_MIN_ELEMENTS
        && rows::map_f32_rows_par(ctx, dst, [src], stream_work(dst), |r, [x], out| {
            block(r, 1, f, x, out)
        })
    {
        return Ok(());
    }
    if rows::map_f32(ctx, dst, [src], |r0, rows, _, w, [x], out| {
        block(r0, rows, w, x, out)
    }) {
        return Ok(());
    }
    let x = ctx.read_f32(src);
    let mut out = vec![0f32; x.len()];
    block(0, p, f, &x, &mut out);
    ctx.write_f32(dst, &out);
    Ok(())
}

fn check_tensor_copy(v: &TensorCopy) -> Result<()> {
    let (dst, src) = (v.dst, v.src);
    same_shape(dst, "dst", src, "src")?;
    if (dst.dtype.is_packed() || src.dtype.is_packed()) && dst.dtype != src.dtype {
        return Err(fail(
            Dtype,
            "packed_dtype_copy",
            format!(
                "packed MX dtypes copy only to the same dtype ({} -> {})",
                src.dtype.name(),
                dst.dtype.name()
            ),
        )
        .operand("dst"));
    }
    Ok(())
}

fn tensor_copy(v: &TensorCopy, ctx: &mut Ctx) -> Result<()> {
    let (dst, src) = (v.dst, v.src);
    if dst.dtype == src.dtype {
        // short rows (a [P, 1] column) skip the fused row-by-row pass (see FUSED_MIN_ELEMENTS)
        let short = dst.free_size() < FUSED_MIN_ELEMENTS
            && !dst.dtype.is_packed()
            && rows::map_raw(ctx, dst, [src], |_, _, _, _, [x], out| {
                out.copy_from_slice(x)
            });
        if !short
            && !copy_par(ctx, dst, src)
            && !copy_across(ctx, dst, src)
            && !rows::copy_same(ctx, dst, src)
        {
            let raw = ctx.mems.gather(src);
            ctx.mems.scatter(dst, &raw);
        }
    } else if !rows::map_f32_rows_par(ctx, dst, [src], stream_work(dst), |_, [x], out| {
        out.copy_from_slice(x)
    }) && !rows::map_f32(ctx, dst, [src], |_, _, _, _, [x], out| {
        out.copy_from_slice(x)
    }) {
        let v = ctx.read_f32(src);
        ctx.write_f32(dst, &v);
    }
    Ok(())
}

/// Same-dtype on-chip copy from 1 MiB written: `rows::copy_same`, whose rows go to the host
/// threads. False (nothing done) when it would not split.
fn copy_par(ctx: &mut Ctx, dst: &Ap, src: &Ap) -> bool {
    crate::par::would_split(dst.parts as usize, stream_work(dst)) && rows::copy_same(ctx, dst, src)
}

/// Same-dtype copy between dense static rows of SBUF and PSUM (a PSUM result evacuated to
/// SBUF): row by row, straight between the two memories, which cannot overlap. False (nothing
/// done) for other patterns.
fn copy_across(ctx: &mut Ctx, dst: &Ap, src: &Ap) -> bool {
    let dense = |a: &Ap| {
        a.mem != Mem::Hbm && a.dynamic.is_none() && !a.dtype.is_packed() && a.is_row_contiguous()
    };
    if dst.mem == src.mem || !dense(dst) || !dense(src) || dst.parts != src.parts {
        return false;
    }
    let len = src.free_size() * src.dtype.size();
    if len != dst.free_size() * dst.dtype.size() {
        return false;
    }
    let (d0, s0) = (dst.offset as usize, src.offset as usize);
    let (from, to) = match src.mem {
        Mem::Sbuf => (&*ctx.mems.sbuf, &mut *ctx.mems.psum),
        _ => (&*ctx.mems.psum, &mut *ctx.mems.sbuf),
    };
    let (parts, ahead) = (
        src.parts as usize,
        crate::kernels::simd::PREFETCH_ROWS_AHEAD,
    );
    for r in 0..parts {
        if r + ahead < parts {
            let (s, d) = (
                src.start as usize + r + ahead,
                dst.start as usize + r + ahead,
            );
            crate::kernels::simd::prefetch_short_row(&from.partition(s)[s0..s0 + len]);
            crate::kernels::simd::prefetch_short_row(&to.partition(d)[d0..d0 + len]);
        }
        let row = &from.partition(src.start as usize + r)[s0..s0 + len];
        to.partition_mut(dst.start as usize + r)[d0..d0 + len].copy_from_slice(row);
    }
    true
}

fn check_memset(m: &Memset) -> Result<()> {
    let (ins, dst, value) = (m.ins, m.dst, m.value);
    let v = value.f32();
    let zero = match value {
        Imm::I32(i) => i == 0,
        Imm::F32(_) => v.to_bits() == 0,
    };
    if dst.dtype.is_packed() && !zero {
        return Err(fail(
            Value,
            "packed_memset_nonzero",
            format!(
                "packed MX dtype {} can only be memset to 0",
                dst.dtype.name()
            ),
        )
        .operand("value"));
    }
    if dst.dtype.is_integer() {
        let (lo, hi): (f64, f64) = match dst.dtype {
            DType::Int8 => (-128.0, 127.0),
            DType::Int16 => (-32768.0, 32767.0),
            DType::Int32 => (-2147483648.0, 2147483647.0),
            DType::Uint8 | DType::Bool => (0.0, 255.0),
            DType::Uint16 => (0.0, 65535.0),
            _ => (0.0, 4294967295.0),
        };
        let ok = match value {
            // A 32-bit integer immediate is a word: any value fills an int32/uint32 tile exactly.
            Imm::I32(i) => dst.dtype.size() == 4 || (lo..=hi).contains(&(i as f64)),
            Imm::F32(_) => v.fract() == 0.0 && (lo..=hi).contains(&(v as f64)),
        };
        if !ok {
            let shown = match value {
                Imm::I32(i) => i.to_string(),
                Imm::F32(_) => v.to_string(),
            };
            return Err(fail(
                Value,
                "memset_value_range",
                format!(
                    "value {shown} is not an integer in range of {}",
                    dst.dtype.name()
                ),
            )
            .operand("value"));
        }
    }
    if ins.engine == Engine::Gpsimd && dst.mem == Mem::Psum {
        return Err(
            fail(MemorySpace, "gpsimd_no_psum", "GpSimd cannot access PSUM").operand("dst"),
        );
    }
    Ok(())
}

fn memset(m: &Memset, ctx: &mut Ctx) -> Result<()> {
    let dst = m.dst;
    let raw = match m.value {
        _ if dst.dtype.is_packed() => 0,
        // Integer immediates fill integer tiles exactly (truncated to the dtype's width, which
        // check_memset has range-checked); float tiles get the RNE fp32 conversion.
        Imm::I32(i) if dst.dtype.is_integer() => i as u32,
        value => numerics::from_f32(dst.dtype, value.f32()),
    };
    if !rows::fill_raw(&mut ctx.mems, dst, raw) {
        let vals = vec![raw; dst.num_elements()];
        ctx.write_raw(dst, &vals);
    }
    Ok(())
}
