//! The ALU operators of reference §2.2, in fp32 (arithmetic) or on raw 32-bit words (bitwise).

use crate::isa::AluOp;

/// Bitwise operators work on raw integer bits, never through fp32.
pub fn is_bitwise(op: AluOp) -> bool {
    matches!(
        op,
        AluOp::BitwiseAnd
            | AluOp::BitwiseOr
            | AluOp::BitwiseXor
            | AluOp::Invert
            | AluOp::LeftShift
            | AluOp::RightShift
    )
}

/// Bitwise operators need integer operands: the first non-integer one is a DtypeError.
pub fn require_integer(
    op: AluOp,
    operands: &[(&crate::memory::Ap, &'static str)],
) -> crate::error::Result<()> {
    if !is_bitwise(op) {
        return Ok(());
    }
    for (ap, n) in operands {
        if !ap.dtype.is_integer() {
            return Err(crate::error::fail(
                crate::error::ErrorKind::Dtype,
                "bitwise_needs_integer",
                format!(
                    "bitwise {} needs integer dtypes, {n} is {}",
                    op.name(),
                    ap.dtype.name()
                ),
            )
            .operand(*n));
        }
    }
    Ok(())
}

/// Operators that ignore their second operand.
pub fn is_unary(op: AluOp) -> bool {
    matches!(
        op,
        AluOp::Abs
            | AluOp::Square
            | AluOp::Relu
            | AluOp::Rsqrt
            | AluOp::Reciprocal
            | AluOp::Invert
            | AluOp::LogicalNot
            | AluOp::Bypass
    )
}

/// Operators that are not elementwise binary/unary ALU operations at all.
pub fn is_elementwise(op: AluOp) -> bool {
    !matches!(op, AluOp::Average)
}

#[inline]
fn b(x: bool) -> f32 {
    if x {
        1.0
    } else {
        0.0
    }
}

/// `op(x, y)` in fp32. Comparisons and logical ops give 1.0 / 0.0; max/min return the non-NaN
/// operand when one is NaN (IEEE maxNum, an emulator choice); abs_max/abs_min return the signed
/// operand of larger/smaller magnitude, ties -> y.
#[inline]
pub fn apply(op: AluOp, x: f32, y: f32) -> f32 {
    match op {
        AluOp::Bypass => x,
        AluOp::Add => x + y,
        AluOp::Subtract => x - y,
        AluOp::Multiply => x * y,
        AluOp::Divide => x / y,
        AluOp::Maximum => x.max(y),
        AluOp::Minimum => x.min(y),
        AluOp::Equal => b(x == y),
        AluOp::NotEqual => b(x != y),
        AluOp::GreaterEqual => b(x >= y),
        AluOp::Greater => b(x > y),
        AluOp::LessEqual => b(x <= y),
        AluOp::Less => b(x < y),
        AluOp::LogicalAnd => b(x != 0.0 && y != 0.0),
        AluOp::LogicalOr => b(x != 0.0 || y != 0.0),
        AluOp::LogicalXor => b((x != 0.0) != (y != 0.0)),
        AluOp::LogicalNot => b(x == 0.0),
        AluOp::Power => (x as f64).powf(y as f64) as f32,
        AluOp::AbsMax => {
            if x.abs() > y.abs() {
                x
            } else {
                y
            }
        }
        AluOp::AbsMin => {
            if x.abs() < y.abs() {
                x
            } else {
                y
            }
        }
        AluOp::Abs => x.abs(),
        AluOp::Square => x * x,
        AluOp::Relu => {
            if x > 0.0 {
                x
            } else {
                0.0
            }
        }
        AluOp::Rsqrt => (1.0 / (x as f64).sqrt()) as f32,
        AluOp::Reciprocal => 1.0 / x,
        // Bitwise ops on fp32 values: act on the integer value (validation keeps these to ints).
        AluOp::BitwiseAnd
        | AluOp::BitwiseOr
        | AluOp::BitwiseXor
        | AluOp::Invert
        | AluOp::LeftShift
        | AluOp::RightShift => apply_bits(op, x as i32 as u32, y as i32 as u32) as i32 as f32,
        AluOp::Average => x + y,
    }
}

/// `op(x, y)` on raw 32-bit words (integers sign/zero-extended by the caller).
#[inline]
pub fn apply_bits(op: AluOp, x: u32, y: u32) -> u32 {
    match op {
        AluOp::BitwiseAnd => x & y,
        AluOp::BitwiseOr => x | y,
        AluOp::BitwiseXor => x ^ y,
        AluOp::Invert => !x,
        AluOp::LeftShift => x.wrapping_shl(y),
        AluOp::RightShift => x.wrapping_shr(y),
        _ => x,
    }
}

/// Exact 32-bit integer arithmetic (GpSimd int32/uint32 tensor_tensor): add/subtract/multiply
/// wrap; comparisons and logical ops give 1/0; abs_max/abs_min as in `apply` (ties -> y).
/// `None` for operators that only exist in fp32 (power, ...).
pub fn apply_i32(op: AluOp, x: u32, y: u32, signed: bool) -> Option<u32> {
    Some(match op {
        AluOp::Add => x.wrapping_add(y),
        AluOp::Subtract => x.wrapping_sub(y),
        AluOp::Multiply => x.wrapping_mul(y),
        AluOp::Maximum => {
            if signed {
                (x as i32).max(y as i32) as u32
            } else {
                x.max(y)
            }
        }
        AluOp::Minimum => {
            if signed {
                (x as i32).min(y as i32) as u32
            } else {
                x.min(y)
            }
        }
        AluOp::Equal => (x == y) as u32,
        AluOp::NotEqual => (x != y) as u32,
        AluOp::GreaterEqual | AluOp::Greater | AluOp::LessEqual | AluOp::Less => {
            let o = if signed {
                (x as i32).cmp(&(y as i32))
            } else {
                x.cmp(&y)
            };
            let r = match op {
                AluOp::GreaterEqual => o.is_ge(),
                AluOp::Greater => o.is_gt(),
                AluOp::LessEqual => o.is_le(),
                _ => o.is_lt(),
            };
            r as u32
        }
        AluOp::LogicalAnd => (x != 0 && y != 0) as u32,
        AluOp::LogicalOr => (x != 0 || y != 0) as u32,
        AluOp::LogicalXor => ((x != 0) != (y != 0)) as u32,
        AluOp::AbsMax | AluOp::AbsMin => {
            let mag = |v: u32| {
                if signed {
                    (v as i32 as i64).abs()
                } else {
                    v as i64
                }
            };
            let pick_x = if op == AluOp::AbsMax {
                mag(x) > mag(y)
            } else {
                mag(x) < mag(y)
            };
            if pick_x {
                x
            } else {
                y
            }
        }
        _ => return None,
    })
}

/// Calls `$zip(x, y, out, f)` with `f` a closure specialised per common operator (so each
/// loop vectorises), the generic `apply` for the rest.
macro_rules! per_op {
    ($op:expr, $zip:ident, $x:expr, $y:expr, $out:expr) => {
        match $op {
            AluOp::Add => $zip($x, $y, $out, |a, b| a + b),
            AluOp::Subtract => $zip($x, $y, $out, |a, b| a - b),
            AluOp::Multiply => $zip($x, $y, $out, |a, b| a * b),
            AluOp::Maximum => $zip($x, $y, $out, f32::max),
            AluOp::Minimum => $zip($x, $y, $out, f32::min),
            AluOp::Divide => $zip($x, $y, $out, |a, b| a / b),
            op => $zip($x, $y, $out, |a, b| apply(op, a, b)),
        }
    };
}

/// `out[i] = op(x[i], y[i])`: one tight loop per common operator (vectorisable), the generic
/// `apply` per element for the rest. Same results as `apply`.
pub fn apply_slices(op: AluOp, x: &[f32], y: &[f32], out: &mut [f32]) {
    #[inline(always)]
    fn zip(x: &[f32], y: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        for ((o, a), b) in out.iter_mut().zip(x).zip(y) {
            *o = f(*a, *b);
        }
    }
    per_op!(op, zip, x, y, out)
}

/// `v[i] = op(v[i], k)` (or `op(k, v[i])` when `rev`), in place; same results as `apply`.
pub fn apply_scalar_inplace(op: AluOp, v: &mut [f32], k: f32, rev: bool) {
    #[inline(always)]
    fn each(v: &mut [f32], f: impl Fn(f32) -> f32) {
        for x in v.iter_mut() {
            *x = f(*x);
        }
    }
    match (op, rev) {
        (AluOp::Bypass, false) => {}
        // Operand order kept even for commutative ops (NaN payloads follow the first operand).
        (AluOp::Add, false) => each(v, |x| x + k),
        (AluOp::Add, true) => each(v, |x| k + x),
        (AluOp::Multiply, false) => each(v, |x| x * k),
        (AluOp::Multiply, true) => each(v, |x| k * x),
        (AluOp::Subtract, false) => each(v, |x| x - k),
        (AluOp::Subtract, true) => each(v, |x| k - x),
        (AluOp::Maximum, false) => each(v, |x| x.max(k)),
        (AluOp::Minimum, false) => each(v, |x| x.min(k)),
        (op, false) => each(v, |x| apply(op, x, k)),
        (op, true) => each(v, |x| apply(op, k, x)),
    }
}

/// `v[i] = op(v[i], y[i])` (or `op(y[i], v[i])` when `rev`), in place; same results as `apply`.
pub fn apply_vec_inplace(op: AluOp, v: &mut [f32], y: &[f32], rev: bool) {
    #[inline(always)]
    fn each(v: &mut [f32], y: &[f32], f: impl Fn(f32, f32) -> f32) {
        for (x, k) in v.iter_mut().zip(y) {
            *x = f(*x, *k);
        }
    }
    match (op, rev) {
        (AluOp::Bypass, false) => {}
        (AluOp::Add, false) => each(v, y, |x, k| x + k),
        (AluOp::Add, true) => each(v, y, |x, k| k + x),
        (AluOp::Multiply, false) => each(v, y, |x, k| x * k),
        (AluOp::Multiply, true) => each(v, y, |x, k| k * x),
        (AluOp::Subtract, false) => each(v, y, |x, k| x - k),
        (AluOp::Subtract, true) => each(v, y, |x, k| k - x),
        (op, false) => each(v, y, |x, k| apply(op, x, k)),
        (op, true) => each(v, y, |x, k| apply(op, k, x)),
    }
}

/// `apply_slices` on little-endian fp32 bytes (`x`, `y`, `out` of equal length), for the fused
/// in-memory path; same results as `apply`.
/// An input given as None is the destination row itself (in place): each element is read
/// before it is written, so the results equal those from a copy of the old row.
pub fn apply_bytes(op: AluOp, x: Option<&[u8]>, y: Option<&[u8]>, out: &mut [u8]) {
    #[inline(always)]
    fn ld(c: &[u8]) -> f32 {
        f32::from_le_bytes([c[0], c[1], c[2], c[3]])
    }
    #[inline(always)]
    fn zip(x: Option<&[u8]>, y: Option<&[u8]>, out: &mut [u8], f: impl Fn(f32, f32) -> f32) {
        let out = out.chunks_exact_mut(4);
        match (x, y) {
            (Some(x), Some(y)) => {
                for ((o, a), b) in out.zip(x.chunks_exact(4)).zip(y.chunks_exact(4)) {
                    o.copy_from_slice(&f(ld(a), ld(b)).to_le_bytes());
                }
            }
            (None, Some(y)) => {
                for (o, b) in out.zip(y.chunks_exact(4)) {
                    let v = f(ld(o), ld(b));
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            (Some(x), None) => {
                for (o, a) in out.zip(x.chunks_exact(4)) {
                    let v = f(ld(a), ld(o));
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            (None, None) => {
                for o in out {
                    let v = ld(o);
                    o.copy_from_slice(&f(v, v).to_le_bytes());
                }
            }
        }
    }
    per_op!(op, zip, x, y, out)
}

/// The operators of one `tensor_scalar` row: `op1(op0(x, k0), k1)`, each operand order
/// reversed by its `rev` (`op1` None = op0 only).
#[derive(Clone, Copy, Debug)]
pub struct ScalarOps {
    pub op0: AluOp,
    pub rev0: bool,
    pub k0: f32,
    pub op1: Option<AluOp>,
    pub rev1: bool,
    pub k1: f32,
}

/// One row of `tensor_scalar` on little-endian fp32 bytes: `out = ops(x)`; same results as
/// `apply`, for the fused path. `x` None = in place on `out` (each element read before it is
/// written).
pub fn apply_scalar_bytes(ops: ScalarOps, x: Option<&[u8]>, out: &mut [u8]) {
    match x {
        Some(x) => scalar_rows(ops, FromTo(x, out)),
        None => scalar_rows(ops, InPlace(out)),
    }
}

/// A row loop of `apply_scalar_bytes`: applies a per-element function from `x` into `out`, or
/// in place on `out` (each element read before it is written).
trait RowLoop {
    fn each(self, f: impl Fn(f32) -> f32);
    /// `f(src, dst, n)` over the row's fp32 values (src == dst in place).
    fn raw(self, f: impl Fn(*const f32, *mut f32, usize));
}

struct FromTo<'a>(&'a [u8], &'a mut [u8]);

struct InPlace<'a>(&'a mut [u8]);

impl RowLoop for FromTo<'_> {
    #[inline(always)]
    fn each(self, f: impl Fn(f32) -> f32) {
        for (o, a) in self.1.chunks_exact_mut(4).zip(self.0.chunks_exact(4)) {
            o.copy_from_slice(&f(f32::from_le_bytes([a[0], a[1], a[2], a[3]])).to_le_bytes());
        }
    }
    fn raw(self, f: impl Fn(*const f32, *mut f32, usize)) {
        let n = self.1.len().min(self.0.len()) / 4;
        f(
            self.0.as_ptr() as *const f32,
            self.1.as_mut_ptr() as *mut f32,
            n,
        )
    }
}

impl RowLoop for InPlace<'_> {
    #[inline(always)]
    fn each(self, f: impl Fn(f32) -> f32) {
        for o in self.0.chunks_exact_mut(4) {
            let v = f(f32::from_le_bytes([o[0], o[1], o[2], o[3]]));
            o.copy_from_slice(&v.to_le_bytes());
        }
    }
    fn raw(self, f: impl Fn(*const f32, *mut f32, usize)) {
        let p = self.0.as_mut_ptr() as *mut f32;
        f(p, p, self.0.len() / 4)
    }
}

/// The operator pair of `apply_scalar_bytes` as one closure run by `rows`: the common pairs
/// as straight arithmetic (vectorised), any other through `apply`. Not inlined (one copy per
/// row loop): inlined into the dispatcher, its loops lost their vectorisation (~25 % slower).
#[inline(never)]
fn scalar_rows(ops: ScalarOps, rows: impl RowLoop) {
    let ScalarOps {
        op0,
        rev0,
        k0,
        op1,
        rev1,
        k1,
    } = ops;
    let one = |op: AluOp, rev: bool, k: f32, v: f32| {
        if rev {
            apply(op, k, v)
        } else {
            apply(op, v, k)
        }
    };
    match (op0, rev0, op1, rev1) {
        (AluOp::Multiply, false, Some(AluOp::Add), false) => rows.each(|v| v * k0 + k1),
        (AluOp::Multiply, false, None, _) => rows.each(|v| v * k0),
        (AluOp::Add, false, None, _) => rows.each(|v| v + k0),
        (AluOp::Add, false, Some(AluOp::Multiply), false) => rows.each(|v| (v + k0) * k1),
        (AluOp::Subtract, false, Some(AluOp::Multiply), false) => rows.each(|v| (v - k0) * k1),
        // the unary ops alone (the operand ignored): fp32 division; rsqrt by act_simple.rs's
        // checked kernel (the same f64 formula's bits, no f64 division per element)
        (AluOp::Reciprocal, false, None, _) => rows.each(|v| 1.0 / v),
        (AluOp::Rsqrt, false, None, _) => rows.raw(|s, d, n| {
            // SAFETY: s and d hold n fp32 values each, equal (in place) or disjoint
            unsafe { super::act_simple::alu_rsqrt(s, d, n) }
        }),
        _ => rows.each(|v| {
            let t = one(op0, rev0, k0, v);
            match op1 {
                Some(op1) => one(op1, rev1, k1, t),
                None => t,
            }
        }),
    }
}

/// `out[g] = x[g*m] op x[g*m+1] op ... op x[g*m+m-1]` (left to right from the first element,
/// as `Iterator::reduce` with `apply`) for every group of `m`; 0 for an empty group. Eight
/// groups advance together for the common operators so their fp32 dependency chains overlap;
/// each group's order is unchanged.
pub fn reduce_groups(op: AluOp, x: &[f32], m: usize, out: &mut [f32]) {
    #[inline(always)]
    fn run(x: &[f32], m: usize, out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        for (g8, o) in out.chunks_mut(8).enumerate() {
            let base = g8 * 8 * m;
            if o.len() == 8 {
                let mut a = [0f32; 8];
                for (k, ak) in a.iter_mut().enumerate() {
                    *ak = x[base + k * m];
                }
                for j in 1..m {
                    for (k, ak) in a.iter_mut().enumerate() {
                        *ak = f(*ak, x[base + k * m + j]);
                    }
                }
                o.copy_from_slice(&a);
            } else {
                for (k, ok) in o.iter_mut().enumerate() {
                    let row = &x[base + k * m..base + (k + 1) * m];
                    *ok = row.iter().copied().reduce(&f).unwrap_or(0.0);
                }
            }
        }
    }
    if m == 0 {
        out.fill(0.0);
        return;
    }
    match op {
        AluOp::Add => run(x, m, out, |a, b| a + b),
        AluOp::Multiply => run(x, m, out, |a, b| a * b),
        AluOp::Maximum => run(x, m, out, f32::max),
        AluOp::Minimum => run(x, m, out, f32::min),
        op => run(x, m, out, |a, b| apply(op, a, b)),
    }
}

/// `apply_slices` on little-endian bf16 bytes: widen exactly, one fp32 operation, round to
/// nearest even (`numerics::bf16_rne`); same results as decode + `apply` + RNE encode.
pub fn apply_bytes_bf16(op: AluOp, x: &[u8], y: &[u8], out: &mut [u8]) {
    #[inline(always)]
    fn zip(x: &[u8], y: &[u8], out: &mut [u8], f: impl Fn(f32, f32) -> f32) {
        let ld = |c: &[u8]| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
        for ((o, a), b) in out
            .chunks_exact_mut(2)
            .zip(x.chunks_exact(2))
            .zip(y.chunks_exact(2))
        {
            let r = crate::numerics::bf16_rne(f(ld(a), ld(b)).to_bits()) as u16;
            o.copy_from_slice(&r.to_le_bytes());
        }
    }
    match op {
        AluOp::Add => zip(x, y, out, |a, b| a + b),
        AluOp::Subtract => zip(x, y, out, |a, b| a - b),
        AluOp::Multiply => zip(x, y, out, |a, b| a * b),
        AluOp::Maximum => zip(x, y, out, f32::max),
        AluOp::Minimum => zip(x, y, out, f32::min),
        op => zip(x, y, out, |a, b| apply(op, a, b)),
    }
}
