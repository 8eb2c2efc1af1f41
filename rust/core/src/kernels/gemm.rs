//! The fp32 matmul engine behind `nc_matmul`: `out[m, n] = fma-chain over k = 0..K-1` of
//! `a[k, m] * b[k, n]`, starting from +0.0, one fused multiply-add (one RNE rounding) per step.
//!
//! Operands arrive packed in panels (kernels/matmul.rs packs them): A in panels of `MR` output rows,
//! B in panels of `NR` output columns, each panel `[K][width]` contiguous and zero-padded.
//! A register-blocked microkernel keeps an `MR x NR` block of accumulators in SIMD registers
//! and walks k in order, so each output element sees exactly the documented sequence of
//! fused multiply-adds whatever the path (AVX-512, AVX2+FMA, portable) or thread count.

use super::simd::Path;

/// Panel widths (rows of A, columns of B) of one SIMD path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    pub mr: usize,
    pub nr: usize,
}

pub fn blocking(p: Path) -> Blocking {
    match p {
        Path::Avx512 => Blocking { mr: 8, nr: 32 },
        Path::Avx2Fma => Blocking { mr: 6, nr: 16 },
        Path::Portable => Blocking { mr: 4, nr: 16 },
    }
}

/// Largest microkernel tile over all paths (the stack buffer a tile is written to).
pub const MAX_TILE: usize = 8 * 32;

/// Test driver: `out` ([m, n] row-major) = A^T B for packed A (`ceil(m/mr)` panels of
/// `[k][mr]`) and packed B (`ceil(n/nr)` panels of `[k][nr]`), with the blocking of `path`.
#[cfg(test)]
fn gemm(path: Path, k: usize, m: usize, n: usize, a: &[f32], b: &[f32], out: &mut [f32]) {
    let Blocking { mr, nr } = blocking(path);
    let nb = n.div_ceil(nr);
    if out.len() < m * n || a.len() < m.div_ceil(mr) * k * mr || b.len() < nb * k * nr {
        return; // callers size the buffers; never index past them
    }
    let out = &mut out[..m * n];
    let work = 2 * k * m * n;
    crate::par::for_each_chunk_mut(out, mr * n, work, |ib, rows| {
        let ap = &a[ib * k * mr..(ib + 1) * k * mr];
        let rows_here = rows.len() / n.max(1);
        let mut tile = [0f32; MAX_TILE];
        for jb in 0..nb {
            let bp = &b[jb * k * nr..(jb + 1) * k * nr];
            micro(path, k, ap, bp, &mut tile[..mr * nr]);
            let cols = nr.min(n - jb * nr);
            for r in 0..rows_here {
                rows[r * n + jb * nr..r * n + jb * nr + cols]
                    .copy_from_slice(&tile[r * nr..r * nr + cols]);
            }
        }
    });
}

/// One `mr x nr` block over all k: `tile[r][c] = fma-chain(a[.][r], b[.][c])`.
pub fn micro(path: Path, k: usize, a: &[f32], b: &[f32], tile: &mut [f32]) {
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the path is only chosen when the host has the features (simd::path), and the
        // slices hold k*mr, k*nr and mr*nr elements (checked by gemm's caller layout).
        Path::Avx512 => unsafe { x86::micro_avx512(k, a, b, tile) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 + FMA.
        Path::Avx2Fma => unsafe { x86::micro_avx2(k, a, b, tile) },
        _ => micro_portable(k, a, b, tile),
    }
}

/// The portable microkernel: `f32::mul_add` is an IEEE fused multiply-add (software where the
/// host lacks FMA), the same operation the SIMD paths' FMA instructions perform per lane.
fn micro_portable(k: usize, a: &[f32], b: &[f32], tile: &mut [f32]) {
    const MR: usize = 4;
    const NR: usize = 16;
    let mut acc = [[0f32; NR]; MR];
    for (av, bv) in a.chunks_exact(MR).zip(b.chunks_exact(NR)).take(k) {
        for (row, &x) in acc.iter_mut().zip(av) {
            for (o, &y) in row.iter_mut().zip(bv) {
                *o = x.mul_add(y, *o);
            }
        }
    }
    for (t, row) in tile.chunks_exact_mut(NR).zip(&acc) {
        t.copy_from_slice(row);
    }
}

/// Explicit intrinsics: autovectorised `mul_add` loops keep the accumulators in memory.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// 8 x 32 block: 16 zmm accumulators, B row as 2 loads, A values broadcast.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn micro_avx512(k: usize, a: &[f32], b: &[f32], tile: &mut [f32]) {
        const MR: usize = 8;
        const NR: usize = 32;
        assert!(a.len() >= k * MR && b.len() >= k * NR && tile.len() >= MR * NR);
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for kk in 0..k {
            let b0 = _mm512_loadu_ps(pb.add(kk * NR));
            let b1 = _mm512_loadu_ps(pb.add(kk * NR + 16));
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*pa.add(kk * MR + r));
                row[0] = _mm512_fmadd_ps(x, b0, row[0]);
                row[1] = _mm512_fmadd_ps(x, b1, row[1]);
            }
        }
        let pt = tile.as_mut_ptr();
        for (r, row) in acc.iter().enumerate() {
            _mm512_storeu_ps(pt.add(r * NR), row[0]);
            _mm512_storeu_ps(pt.add(r * NR + 16), row[1]);
        }
    }

    /// 6 x 16 block: 12 ymm accumulators (the classic AVX2 sgemm shape).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn micro_avx2(k: usize, a: &[f32], b: &[f32], tile: &mut [f32]) {
        const MR: usize = 6;
        const NR: usize = 16;
        assert!(a.len() >= k * MR && b.len() >= k * NR && tile.len() >= MR * NR);
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for kk in 0..k {
            let b0 = _mm256_loadu_ps(pb.add(kk * NR));
            let b1 = _mm256_loadu_ps(pb.add(kk * NR + 8));
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm256_set1_ps(*pa.add(kk * MR + r));
                row[0] = _mm256_fmadd_ps(x, b0, row[0]);
                row[1] = _mm256_fmadd_ps(x, b1, row[1]);
            }
        }
        let pt = tile.as_mut_ptr();
        for (r, row) in acc.iter().enumerate() {
            _mm256_storeu_ps(pt.add(r * NR), row[0]);
            _mm256_storeu_ps(pt.add(r * NR + 8), row[1]);
        }
    }
}

/// Lay out `rows` logical rows of width `w` as panels of `pw` columns (zero-padded):
/// element (r, j) goes to `dst[(j / pw) * rows * pw + r * pw + j % pw]`. `row(r, buf)` fills
/// `buf` (length `w`) with logical row r.
#[cfg(test)]
fn pack(
    dst: &mut Vec<f32>,
    rows: usize,
    w: usize,
    pw: usize,
    mut row: impl FnMut(usize, &mut [f32]),
    tmp: &mut Vec<f32>,
) {
    if pw == 0 {
        return;
    }
    let np = w.div_ceil(pw);
    grow(dst, np * rows * pw);
    grow(tmp, w);
    let tmp = &mut tmp[..w];
    for r in 0..rows {
        row(r, tmp);
        for (p, chunk) in tmp.chunks(pw).enumerate() {
            let at = p * rows * pw + r * pw;
            dst[at..at + chunk.len()].copy_from_slice(chunk);
        }
        // Padding lanes only feed padding outputs, which are never copied out; zero them so
        // stale scratch (NaN, subnormals) cannot slow the microkernel down.
        let used = w - (np - 1) * pw;
        if used < pw {
            let at = (np - 1) * rows * pw + r * pw;
            dst[at + used..at + pw].fill(0.0);
        }
    }
}

/// Make `v` at least `n` long (new elements zero), never shrinking: scratch reuse.
pub fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference: the documented chain, element by element.
    fn naive(k: usize, m: usize, n: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut o = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f32;
                for kk in 0..k {
                    s = a[kk * m + i].mul_add(b[kk * n + j], s);
                }
                o[i * n + j] = s;
            }
        }
        o
    }

    #[test]
    fn every_path_matches_the_fma_chain_bitwise() {
        let (k, m, n) = (37, 19, 45);
        let mut seed = 12345u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 3.0
        };
        let a: Vec<f32> = (0..k * m).map(|_| rnd()).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rnd()).collect();
        let want = naive(k, m, n, &a, &b);
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut paths = vec![Path::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                paths.push(Path::Avx2Fma);
            }
            if is_x86_feature_detected!("avx512f") {
                paths.push(Path::Avx512);
            }
        }
        for p in paths {
            let Blocking { mr, nr } = blocking(p);
            let (mut pa, mut pb, mut tmp) = (Vec::new(), Vec::new(), Vec::new());
            pack(
                &mut pa,
                k,
                m,
                mr,
                |r, buf| buf.copy_from_slice(&a[r * m..(r + 1) * m]),
                &mut tmp,
            );
            pack(
                &mut pb,
                k,
                n,
                nr,
                |r, buf| buf.copy_from_slice(&b[r * n..(r + 1) * n]),
                &mut tmp,
            );
            let mut out = vec![f32::NAN; m * n];
            gemm(p, k, m, n, &pa, &pb, &mut out);
            let same = out
                .iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{p:?} differs from the fma chain");
        }
    }
}
