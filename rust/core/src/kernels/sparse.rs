//! The arithmetic of `nc_matmul_sparse` (semantics: engines/tensor_sparse.rs and
//! docs/sparsity.md): output row m is one fused multiply-add chain per column over the
//! compressed rows `c = 0..Kc-1` in order, `acc[n] = fl32(acc[n] + values[c, m] * moving[row(c, m), n])`,
//! starting from +0. Rows of the output run on separate threads; each element's chain is the
//! same on every SIMD path and thread count (one IEEE fma per step).

use super::simd;
use crate::par;

/// One sparse product: compressed values `[kc][m]`, the dense moving row each value meets
/// (`rows[c * m + j]`, already validated `< k`) and the dense moving operand `[k][n]`.
pub struct SparseOperands<'a> {
    pub values: &'a [f32],
    pub rows: &'a [usize],
    pub moving: &'a [f32],
    pub kc: usize,
    pub m: usize,
    pub n: usize,
}

/// The `[m][n]` column sums, row-major.
pub fn matmul_sparse(o: &SparseOperands) -> Vec<f32> {
    let (kc, m, n) = (o.kc, o.m, o.n);
    let mut out = vec![0f32; m * n];
    let work = 2 * kc * m * n;
    let path = simd::path();
    par::for_each_chunk_mut(&mut out, n.max(1), work, |j, acc| {
        for c in 0..kc {
            let (Some(&a), Some(&r)) = (o.values.get(c * m + j), o.rows.get(c * m + j)) else {
                continue;
            };
            if let Some(b) = o.moving.get(r * n..(r + 1) * n) {
                fma_row(path, a, b, acc);
            }
        }
    });
    out
}

/// `acc[i] = fl32(acc[i] + a * b[i])` with the widest FMA the host has.
fn fma_row(path: simd::Path, a: f32, b: &[f32], acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: simd::path reports a path only when the host has its features.
        simd::Path::Avx512 => return unsafe { fma_row_avx512(a, b, acc) },
        // SAFETY: as above, for AVX2 + FMA.
        simd::Path::Avx2Fma => return unsafe { fma_row_avx2(a, b, acc) },
        simd::Path::Portable => {}
    }
    let _ = path;
    fma_row_body(a, b, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_row_avx2(a: f32, b: &[f32], acc: &mut [f32]) {
    fma_row_body(a, b, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn fma_row_avx512(a: f32, b: &[f32], acc: &mut [f32]) {
    fma_row_body(a, b, acc)
}

/// `f32::mul_add` is an IEEE fused multiply-add (one rounding) on every path.
#[inline(always)]
fn fma_row_body(a: f32, b: &[f32], acc: &mut [f32]) {
    for (o, &y) in acc.iter_mut().zip(b) {
        *o = a.mul_add(y, *o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_follow_the_rows_and_skip_nothing_else() {
        // kc = 2, m = 1, n = 2; value 0 meets dense row 3, value 1 dense row 0.
        let moving = [1.0, 2.0, f32::NAN, f32::NAN, 0.0, 0.0, 4.0, 8.0];
        let o = SparseOperands {
            values: &[0.5, 3.0],
            rows: &[3, 0],
            moving: &moving,
            kc: 2,
            m: 1,
            n: 2,
        };
        // NaN rows are never read: only the kept rows of moving enter the sum.
        assert_eq!(matmul_sparse(&o), vec![0.5 * 4.0 + 3.0, 0.5 * 8.0 + 6.0]);
    }
}
