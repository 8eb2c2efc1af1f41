//! GpSimd `affine_select`: keep a tile where an affine function of (partition, free index)
//! compares true with 0, fill elsewhere (causal masks).

use super::gpsimd::{check_pattern, pattern_offsets};
use super::{same_shape, Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::AffineSelect;
use crate::isa::AluOp;
#[cfg(target_arch = "x86_64")]
use crate::kernels::simd;
use crate::memory::{Ap, Mem};
use crate::numerics;

/// One affine_select's row pattern: element j of partition p is kept where
/// `off + p * cm + rel[j]` compares true with 0, else set to the raw word `fill`.
struct Select<'a> {
    rel: &'a [i32],
    off: i32,
    cm: i32,
    fill: u32,
}

impl Select<'_> {
    /// The select straight in on-chip memory, when both tiles have one dtype and dense static
    /// rows and `dst` is `on_true` itself, lives in the other memory, or shares no partition
    /// byte with it: rows are copied whole, then the dropped elements filled. False (nothing
    /// done) otherwise. Same bits as the general path (a same-dtype select copies raw words).
    fn direct(&self, ctx: &mut Ctx, dst: &Ap, on_true: &Ap, keep: impl Fn(i32) -> bool) -> bool {
        let es = dst.dtype.size();
        let dense = |a: &Ap| a.mem != Mem::Hbm && a.dynamic.is_none() && a.is_row_contiguous();
        let n = dst.free_size();
        if on_true.dtype != dst.dtype
            || !matches!(es, 1 | 2 | 4)
            || !dense(dst)
            || !dense(on_true)
            || n != self.rel.len()
        {
            return false;
        }
        let len = n * es;
        let (d0, s0) = (dst.offset as usize, on_true.offset as usize);
        let in_place = dst.mem == on_true.mem && dst.start == on_true.start && d0 == s0;
        let disjoint = dst.mem != on_true.mem || d0 + len <= s0 || s0 + len <= d0;
        if !in_place && !disjoint {
            return false;
        }
        for r in 0..dst.parts as usize {
            if !in_place {
                copy_row(ctx, (dst, d0), (on_true, s0), r, len);
            }
            let part = onchip_mut(ctx, dst.mem).partition_mut(dst.start as usize + r);
            let out = &mut part[d0..d0 + len];
            let base = self.off.wrapping_add((r as i32).wrapping_mul(self.cm));
            match es {
                1 => self.fill_row::<1>(out, base, &keep),
                2 => self.fill_row::<2>(out, base, &keep),
                _ => self.fill_row::<4>(out, base, &keep),
            }
        }
        true
    }

    /// Set the elements of one row whose affine value fails `keep` to the fill word, with the
    /// widest vectors the host has (the same select on every path).
    #[inline(always)]
    fn fill_row<const ES: usize>(&self, out: &mut [u8], base: i32, keep: &impl Fn(i32) -> bool) {
        #[cfg(target_arch = "x86_64")]
        match simd::path() {
            // SAFETY: simd::path reports a path only when the host has its features.
            simd::Path::Avx512 => return unsafe { self.fill_row_avx512::<ES>(out, base, keep) },
            simd::Path::Avx2Fma => return unsafe { self.fill_row_avx2::<ES>(out, base, keep) },
            simd::Path::Portable => {}
        }
        self.fill_row_body::<ES>(out, base, keep)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fill_row_avx512<const ES: usize>(
        &self,
        out: &mut [u8],
        base: i32,
        keep: &impl Fn(i32) -> bool,
    ) {
        self.fill_row_body::<ES>(out, base, keep)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn fill_row_avx2<const ES: usize>(
        &self,
        out: &mut [u8],
        base: i32,
        keep: &impl Fn(i32) -> bool,
    ) {
        self.fill_row_body::<ES>(out, base, keep)
    }

    /// Every element written (kept ones with their own bytes): a select, which vectorises
    /// (a conditional store does not).
    #[inline(always)]
    fn fill_row_body<const ES: usize>(
        &self,
        out: &mut [u8],
        base: i32,
        keep: &impl Fn(i32) -> bool,
    ) {
        let fill: [u8; ES] = std::array::from_fn(|k| self.fill.to_le_bytes()[k]);
        let (els, _) = out.as_chunks_mut::<ES>();
        for (e, &o) in els.iter_mut().zip(self.rel) {
            *e = if keep(base.wrapping_add(o)) { *e } else { fill };
        }
    }
}

/// Row `r` of `src` (at partition byte `s0`) to row `r` of `dst` (at `d0`): `len` bytes whose
/// ranges do not overlap.
fn copy_row(ctx: &mut Ctx, (dst, d0): (&Ap, usize), (src, s0): (&Ap, usize), r: usize, len: usize) {
    let (ps, pd) = (src.start as usize + r, dst.start as usize + r);
    let (sbuf, psum) = (&mut *ctx.mems.sbuf, &mut *ctx.mems.psum);
    match (src.mem, dst.mem) {
        (Mem::Sbuf, Mem::Psum) => {
            psum.partition_mut(pd)[d0..d0 + len].copy_from_slice(&sbuf.partition(ps)[s0..s0 + len])
        }
        (Mem::Psum, Mem::Sbuf) => {
            sbuf.partition_mut(pd)[d0..d0 + len].copy_from_slice(&psum.partition(ps)[s0..s0 + len])
        }
        (m, _) => {
            let mem = if m == Mem::Sbuf { sbuf } else { psum };
            let stride = mem.stride();
            mem.raw_mut()
                .copy_within(ps * stride + s0..ps * stride + s0 + len, pd * stride + d0);
        }
    }
}

fn onchip_mut<'c>(ctx: &'c mut Ctx, m: Mem) -> &'c mut crate::memory::onchip::OnChip {
    match m {
        Mem::Sbuf => ctx.mems.sbuf,
        _ => ctx.mems.psum,
    }
}

/// The comparison against 0, on the exact int32 affine value.
fn compare(op: AluOp, v: i32) -> Option<bool> {
    Some(match op {
        AluOp::Equal => v == 0,
        AluOp::NotEqual => v != 0,
        AluOp::GreaterEqual => v >= 0,
        AluOp::Greater => v > 0,
        AluOp::LessEqual => v <= 0,
        AluOp::Less => v < 0,
        _ => return None,
    })
}

impl Semantics for AffineSelect<'_> {
    fn check(&self) -> Result<()> {
        let (dst, on_true) = (self.dst, self.on_true_tile);
        same_shape(dst, "dst", on_true, "on_true_tile")?;
        for (ap, n) in [(dst, "dst"), (on_true, "on_true_tile")] {
            if ap.dtype.is_packed() {
                return Err(fail(
                    Dtype,
                    "packed_dtype_not_allowed",
                    format!(
                        "affine_select cannot operate on packed MX dtype {}",
                        ap.dtype.name()
                    ),
                )
                .operand(n));
            }
        }
        check_pattern(self.pattern, dst.free_size())?;
        if compare(self.cmp_op, 0).is_none() {
            return Err(fail(
                Value,
                "alu_op_not_allowed",
                format!(
                    "cmp_op must be a comparison (equal, not_equal, greater_equal, greater, less_equal, less), got {}",
                    self.cmp_op.name()
                ),
            )
            .operand("cmp_op"));
        }
        Ok(())
    }

    /// Same dtype: the selected on_true elements are copied bit-exactly; otherwise through fp32.
    /// The fill is `on_false_value` (fp32) rounded to dst's dtype.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (dst, on_true, op) = (self.dst, self.on_true_tile, self.cmp_op);
        let rel = pattern_offsets(self.pattern);
        let off = self.offset.value(&ctx.regs[..]);
        let cm = self.channel_multiplier;
        let fill = numerics::from_f32(dst.dtype, self.on_false_value.f32());
        let sel = Select {
            rel: &rel,
            off,
            cm,
            fill,
        };
        let direct = match op {
            AluOp::Equal => sel.direct(ctx, dst, on_true, |v| v == 0),
            AluOp::NotEqual => sel.direct(ctx, dst, on_true, |v| v != 0),
            AluOp::GreaterEqual => sel.direct(ctx, dst, on_true, |v| v >= 0),
            AluOp::Greater => sel.direct(ctx, dst, on_true, |v| v > 0),
            AluOp::LessEqual => sel.direct(ctx, dst, on_true, |v| v <= 0),
            AluOp::Less => sel.direct(ctx, dst, on_true, |v| v < 0),
            _ => false,
        };
        if direct {
            return Ok(());
        }
        let src: Vec<u32> = if on_true.dtype == dst.dtype {
            ctx.read_raw(on_true)
        } else {
            ctx.read_f32(on_true)
                .into_iter()
                .map(|v| numerics::from_f32(dst.dtype, v))
                .collect()
        };
        let n = rel.len();
        let mut out = src;
        for (p, row) in out.chunks_mut(n.max(1)).enumerate() {
            let base = off.wrapping_add((p as i32).wrapping_mul(cm));
            for (v, &o) in row.iter_mut().zip(&rel) {
                if compare(op, base.wrapping_add(o)) != Some(true) {
                    *v = fill;
                }
            }
        }
        ctx.write_raw(dst, &out);
        Ok(())
    }
}
