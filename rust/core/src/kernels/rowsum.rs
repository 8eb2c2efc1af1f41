//! In-order fp32 row sums of 16 rows at once: `sums[k] += rows[k * w + j]` for j = 0, 1, ..
//! (each row one serial chain of fp32 adds, as the ScalarE accumulator registers define it).
//! One chain runs at the add latency; 16 independent chains in the 16 lanes of a vector run
//! at throughput. On AVX-512 each 16 x 16 block is transposed in registers (lane k = row k,
//! one vector per column) and the 16 column vectors are added in column order: every lane
//! performs exactly its row's additions in its row's order, so the bits are the scalar
//! chain's.

#[cfg(any(target_arch = "x86_64", test))]
use super::simd::{self, Path};

/// Rows summed together.
pub const ROWS: usize = 16;

/// `sums[k] += rows[k * w + j]` for j in order, k < 16 (`rows` holds 16 rows of `w`).
pub fn add_rows_16(sums: &mut [f32; ROWS], rows: &[f32], w: usize) {
    assert!(rows.len() >= ROWS * w);
    let init = *sums;
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut j0 = 0;
    #[cfg(target_arch = "x86_64")]
    if simd::path() == Path::Avx512 && w >= 16 {
        // SAFETY: AVX-512F is present (simd::path); the rows hold 16 * w values (checked).
        j0 = unsafe { x86::add_blocks(sums, rows, w) };
    }
    scalar(sums, rows, w, j0);
    fix_nan_sums(sums, &init, rows, w);
}

/// The NaN an fp32 add chain `init + r[0] + r[1] + ..` ends with, by one rule on every path:
/// the first NaN the chain holds sticks (`init` or the first NaN input, quieted, or the NaN an
/// inf - inf made). IEEE 754 leaves to the implementation which payload an add of two NaNs
/// returns; x86 returns its first source, and compilers swap the operands of a commutative add
/// at will, so without this rule the AVX-512 chains and the scalar ones kept different payloads.
pub fn sticky_nan_sum(init: f32, row: &[f32]) -> f32 {
    let mut a = init;
    for &v in row {
        if a.is_nan() {
            return f32::from_bits(a.to_bits() | 0x0040_0000);
        }
        a += v; // (a is no NaN here: a NaN result is v's, quieted, or inf - inf's)
    }
    a
}

/// After `sums[k] += rows[k * w + j]` chains whose start values were `init`: each sum that
/// ended NaN is redone by `sticky_nan_sum` (rare rows only; the sums that are numbers are the
/// chains' own bits).
pub fn fix_nan_sums(sums: &mut [f32], init: &[f32], rows: &[f32], w: usize) {
    for (k, s) in sums.iter_mut().enumerate() {
        if s.is_nan() {
            *s = sticky_nan_sum(init[k], &rows[k * w..(k + 1) * w]);
        }
    }
}

/// The chains from column `j0` on, one element per row per step.
fn scalar(sums: &mut [f32; ROWS], rows: &[f32], w: usize, j0: usize) {
    let mut a = *sums;
    for j in j0..w {
        for (k, ak) in a.iter_mut().enumerate() {
            *ak += rows[k * w + j];
        }
    }
    *sums = a;
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::ROWS;
    use std::arch::x86_64::*;

    /// The 16 x 16 block `r[k][c]` (row k, column c) as 16 column vectors (lane k = row k).
    #[inline(always)]
    unsafe fn transpose(r: [__m512; 16]) -> [__m512; 16] {
        let ps = |a: __m512| _mm512_castps_pd(a);
        let sp = |a: __m512d| _mm512_castpd_ps(a);
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        let mut u = [_mm512_setzero_ps(); 16];
        for i in 0..4 {
            let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
            u[4 * i] = sp(_mm512_unpacklo_pd(ps(a), ps(c)));
            u[4 * i + 1] = sp(_mm512_unpackhi_pd(ps(a), ps(c)));
            u[4 * i + 2] = sp(_mm512_unpacklo_pd(ps(b), ps(d)));
            u[4 * i + 3] = sp(_mm512_unpackhi_pd(ps(b), ps(d)));
        }
        for h in 0..2 {
            for i in 0..4 {
                let (a, b) = (u[8 * h + i], u[8 * h + i + 4]);
                t[8 * h + i] = _mm512_shuffle_f32x4::<0x88>(a, b);
                t[8 * h + i + 4] = _mm512_shuffle_f32x4::<0xdd>(a, b);
            }
        }
        let mut c = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            c[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[i + 8]);
            c[i + 8] = _mm512_shuffle_f32x4::<0xdd>(t[i], t[i + 8]);
        }
        c
    }

    /// The whole 16-column blocks; returns the first column left.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn add_blocks(sums: &mut [f32; ROWS], rows: &[f32], w: usize) -> usize {
        let p = rows.as_ptr();
        let mut a = _mm512_loadu_ps(sums.as_ptr());
        let mut j = 0;
        while j + 16 <= w {
            let r: [__m512; 16] = std::array::from_fn(|k| _mm512_loadu_ps(p.add(k * w + j)));
            for c in transpose(r) {
                a = _mm512_add_ps(a, c);
            }
            j += 16;
        }
        _mm512_storeu_ps(sums.as_mut_ptr(), a);
        j
    }

    #[cfg(test)]
    #[test]
    fn transpose_is_a_transpose() {
        if !crate::kernels::simd::host_supports(crate::kernels::simd::Path::Avx512) {
            return;
        }
        let m: Vec<f32> = (0..256).map(|i| i as f32).collect();
        let mut out = [0f32; 256];
        // SAFETY: AVX-512F checked above.
        unsafe {
            let r: [__m512; 16] = std::array::from_fn(|k| _mm512_loadu_ps(m.as_ptr().add(16 * k)));
            for (c, v) in transpose(r).into_iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * c), v);
            }
        }
        for c in 0..16 {
            for k in 0..16 {
                assert_eq!(out[16 * c + k], m[16 * k + c], "column {c} row {k}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_are_the_serial_chains_bitwise() {
        // magnitudes spread over many binades: any change of order changes the bits
        let mut s = 0x1234_5678u32;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for w in [16, 17, 31, 48, 512, 515] {
            let rows: Vec<f32> = (0..ROWS * w)
                .map(|_| {
                    let v = next();
                    f32::from_bits(0x3000_0000 + (v % 0x1800_0000))
                        * if v & 1 == 0 { 1.0 } else { -1.0 }
                })
                .collect();
            let init: [f32; ROWS] = std::array::from_fn(|k| k as f32 * 0.37 - 2.0);
            let mut want = init;
            for (k, acc) in want.iter_mut().enumerate() {
                for v in &rows[k * w..(k + 1) * w] {
                    *acc += *v;
                }
            }
            for p in [Path::Portable, Path::Avx512] {
                if !simd::host_supports(p) {
                    continue;
                }
                let mut got = init;
                if p == Path::Portable {
                    scalar(&mut got, &rows, w, 0);
                } else {
                    add_rows_16(&mut got, &rows, w);
                }
                for k in 0..ROWS {
                    assert_eq!(got[k].to_bits(), want[k].to_bits(), "{p:?} w={w} row {k}");
                }
            }
        }
    }

    #[test]
    fn a_nan_chain_keeps_its_first_nan() {
        let nan = |bits: u32| f32::from_bits(bits);
        let (a, b) = (0x7FA0_0001, 0xFFC1_2345); // a signalling, b quiet
                                                 // the register's NaN sticks (quieted), whatever the row holds
        assert_eq!(
            sticky_nan_sum(nan(a), &[1.0, nan(b)]).to_bits(),
            a | 0x0040_0000
        );
        // else the first NaN input's payload, quieted; later NaNs do not replace it
        assert_eq!(
            sticky_nan_sum(0.0, &[1.0, nan(a), nan(b)]).to_bits(),
            a | 0x0040_0000
        );
        assert_eq!(sticky_nan_sum(0.0, &[nan(b), nan(a)]).to_bits(), b);
        // a NaN made by inf - inf sticks too (its bits are the host's default NaN)
        let made = f32::INFINITY + f32::NEG_INFINITY;
        assert_eq!(
            sticky_nan_sum(0.0, &[f32::INFINITY, f32::NEG_INFINITY, nan(b)]).to_bits(),
            made.to_bits()
        );
        // numbers are the plain chain
        assert_eq!(sticky_nan_sum(0.5, &[0.25, 1e-8]), 0.5 + 0.25 + 1e-8);
        // 16 rows on every path: the same NaN per row
        let w = 40;
        let mut rows = vec![1.0f32; ROWS * w];
        for k in 0..ROWS {
            rows[k * w + (k % 7)] = nan(0x7FC0_0000 | k as u32);
            rows[k * w + 20 + k] = nan(0xFFC0_0000 | (k as u32) << 8);
        }
        for path in [Path::Avx512, Path::Avx2Fma, Path::Portable] {
            simd::set_limit(Some(path)); // (narrows only: a path the host lacks falls back)
            let mut s = [0f32; ROWS];
            add_rows_16(&mut s, &rows, w);
            simd::set_limit(None);
            for (k, v) in s.iter().enumerate() {
                assert_eq!(v.to_bits(), 0x7FC0_0000 | k as u32, "{path:?} row {k}");
            }
        }
    }
}
