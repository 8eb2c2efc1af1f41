//! Bit-exact transposes of packed element buffers (nc_transpose, is_transpose matmuls):
//! pure data movement, done on whole elements of the dtype's width in small tiles.

/// `src` holds `p` rows of `f` elements of `es` bytes; returns the `f x p` transpose.
pub fn transpose_bytes(src: &[u8], p: usize, f: usize, es: usize) -> Vec<u8> {
    let mut out = vec![0u8; src.len()];
    if src.len() >= p * f * es {
        transpose_into(src, f * es, &mut out, p * es, (p, f), es);
    }
    out
}

/// Row `i` (of `p`, each `f` elements of `es` bytes) starts at `src[i * ss]`; writes the
/// transpose: row `j` (of `f`, each `p` elements) at `dst[j * ds]`. Strided rows let callers
/// move an on-chip tile straight from its partitions to the destination's, with no staging
/// buffers. Does nothing if the buffers are too short for the shape (callers pass whole tiles).
pub fn transpose_into(
    src: &[u8],
    ss: usize,
    dst: &mut [u8],
    ds: usize,
    (p, f): (usize, usize),
    es: usize,
) {
    if p == 0 || f == 0 {
        return;
    }
    let fits = |len: usize, rows: usize, stride: usize, row: usize| {
        (rows - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(row))
            .is_some_and(|need| need <= len)
    };
    if !fits(src.len(), p, ss, f * es) || !fits(dst.len(), f, ds, p * es) {
        return;
    }
    match es {
        1 => tiled::<1, 8>(src, ss, dst, ds, p, f),
        2 => tiled::<2, 8>(src, ss, dst, ds, p, f),
        4 => tiled::<4, 4>(src, ss, dst, ds, p, f),
        _ => {
            for i in 0..p {
                for j in 0..f {
                    let (s, d) = (i * ss + j * es, j * ds + i * es);
                    dst[d..d + es].copy_from_slice(&src[s..s + es]);
                }
            }
        }
    }
}

/// Whole `T x T` tiles of `ES`-byte elements (SSE2 shuffles for 2- and 4-byte elements on
/// x86-64, element copies elsewhere), then the edges element by element. Bounds were checked
/// by `transpose_into`.
fn tiled<const ES: usize, const T: usize>(
    src: &[u8],
    ss: usize,
    dst: &mut [u8],
    ds: usize,
    p: usize,
    f: usize,
) {
    let (pt, ft) = (p / T * T, f / T * T);
    #[cfg(target_arch = "x86_64")]
    if (ES == 2 && T == 8) || (ES == 4 && T == 4) {
        // SAFETY: `transpose_into` checked that rows 0..p of `src` (f elements each, ss apart)
        // and rows 0..f of `dst` (p elements each, ds apart) are in bounds; every tile lies
        // within them.
        unsafe {
            let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
            // AVX-512: four tiles side by side per shuffle network, then SSE2 for the rest.
            let wide = if super::simd::path() == super::simd::Path::Avx512 {
                avx512::tiles::<ES>(s, ss, d, ds, pt, ft)
            } else {
                0
            };
            sse2::tiles::<ES>(s.add(wide * ES), ss, d.add(wide * ds), ds, pt, ft - wide);
        }
    } else {
        for i in (0..pt).step_by(T) {
            for j in (0..ft).step_by(T) {
                tile::<ES, T>(src, i * ss + j * ES, ss, dst, j * ds + i * ES, ds);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in (0..pt).step_by(T) {
        for j in (0..ft).step_by(T) {
            tile::<ES, T>(src, i * ss + j * ES, ss, dst, j * ds + i * ES, ds);
        }
    }
    // Edges: the rows past the last whole tile, and the columns past it in the other rows.
    for i in 0..p {
        let j_from = if i < pt { ft } else { 0 };
        for j in j_from..f {
            let (s, d) = (i * ss + j * ES, j * ds + i * ES);
            dst[d..d + ES].copy_from_slice(&src[s..s + ES]);
        }
    }
}

/// One `T x T` tile by element copies: source rows at `s + r * ss`, destination rows at
/// `d + c * ds`.
#[inline(always)]
fn tile<const ES: usize, const T: usize>(
    src: &[u8],
    s: usize,
    ss: usize,
    dst: &mut [u8],
    d: usize,
    ds: usize,
) {
    for c in 0..T {
        for r in 0..T {
            let (a, b) = (s + r * ss + c * ES, d + c * ds + r * ES);
            dst[b..b + ES].copy_from_slice(&src[a..a + ES]);
        }
    }
}

/// SSE2 (part of baseline x86-64, so no run-time detection) unpack networks.
/// The same unpack networks on 512-bit registers: each 128-bit lane holds its own tile.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use core::arch::x86_64::*;

    /// Whole groups of four side-by-side tiles (columns `0..` a multiple of `4 * 16 / ES`) of a
    /// `pt x ft` block; returns how many columns it did.
    ///
    /// # Safety
    /// As `sse2::tiles`, and the host has AVX-512F and BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn tiles<const ES: usize>(
        s: *const u8,
        ss: usize,
        d: *mut u8,
        ds: usize,
        pt: usize,
        ft: usize,
    ) -> usize {
        let t = 16 / ES;
        let w = 4 * t;
        let wide = ft / w * w;
        for j in (0..wide).step_by(w) {
            for i in (0..pt).step_by(t) {
                let (sp, dp) = (s.add(i * ss + j * ES), d.add(j * ds + i * ES));
                if ES == 2 {
                    t8x32_u16(sp, ss, dp, ds);
                } else {
                    t4x16_u32(sp, ss, dp, ds);
                }
            }
        }
        wide
    }

    /// Store lane `k` of each output register `c` at destination row `k * t + c`.
    #[inline(always)]
    unsafe fn store_lanes<const N: usize>(out: [__m512i; N], d: *mut u8, ds: usize) {
        for (c, v) in out.iter().enumerate() {
            _mm_storeu_si128(d.add(c * ds).cast(), _mm512_castsi512_si128(*v));
            _mm_storeu_si128(
                d.add((N + c) * ds).cast(),
                _mm512_extracti32x4_epi32::<1>(*v),
            );
            _mm_storeu_si128(
                d.add((2 * N + c) * ds).cast(),
                _mm512_extracti32x4_epi32::<2>(*v),
            );
            _mm_storeu_si128(
                d.add((3 * N + c) * ds).cast(),
                _mm512_extracti32x4_epi32::<3>(*v),
            );
        }
    }

    /// 8 rows of 32 u16 -> 32 rows of 8.
    #[inline(always)]
    unsafe fn t8x32_u16(s: *const u8, ss: usize, d: *mut u8, ds: usize) {
        let a: [__m512i; 8] = std::array::from_fn(|r| _mm512_loadu_si512(s.add(r * ss).cast()));
        let t0 = _mm512_unpacklo_epi16(a[0], a[1]);
        let t1 = _mm512_unpackhi_epi16(a[0], a[1]);
        let t2 = _mm512_unpacklo_epi16(a[2], a[3]);
        let t3 = _mm512_unpackhi_epi16(a[2], a[3]);
        let t4 = _mm512_unpacklo_epi16(a[4], a[5]);
        let t5 = _mm512_unpackhi_epi16(a[4], a[5]);
        let t6 = _mm512_unpacklo_epi16(a[6], a[7]);
        let t7 = _mm512_unpackhi_epi16(a[6], a[7]);
        let u0 = _mm512_unpacklo_epi32(t0, t2);
        let u1 = _mm512_unpackhi_epi32(t0, t2);
        let u2 = _mm512_unpacklo_epi32(t1, t3);
        let u3 = _mm512_unpackhi_epi32(t1, t3);
        let u4 = _mm512_unpacklo_epi32(t4, t6);
        let u5 = _mm512_unpackhi_epi32(t4, t6);
        let u6 = _mm512_unpacklo_epi32(t5, t7);
        let u7 = _mm512_unpackhi_epi32(t5, t7);
        let out = [
            _mm512_unpacklo_epi64(u0, u4),
            _mm512_unpackhi_epi64(u0, u4),
            _mm512_unpacklo_epi64(u1, u5),
            _mm512_unpackhi_epi64(u1, u5),
            _mm512_unpacklo_epi64(u2, u6),
            _mm512_unpackhi_epi64(u2, u6),
            _mm512_unpacklo_epi64(u3, u7),
            _mm512_unpackhi_epi64(u3, u7),
        ];
        store_lanes(out, d, ds);
    }

    /// 4 rows of 16 u32 -> 16 rows of 4.
    #[inline(always)]
    unsafe fn t4x16_u32(s: *const u8, ss: usize, d: *mut u8, ds: usize) {
        let a: [__m512i; 4] = std::array::from_fn(|r| _mm512_loadu_si512(s.add(r * ss).cast()));
        let t0 = _mm512_unpacklo_epi32(a[0], a[1]);
        let t1 = _mm512_unpackhi_epi32(a[0], a[1]);
        let t2 = _mm512_unpacklo_epi32(a[2], a[3]);
        let t3 = _mm512_unpackhi_epi32(a[2], a[3]);
        let out = [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ];
        store_lanes(out, d, ds);
    }
}

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use core::arch::x86_64::*;

    /// All whole tiles of a `pt x ft` block (8 x 8 of u16 when `ES` = 2, 4 x 4 of u32 when 4),
    /// destination-row-major so each tile's stores stay within a few rows.
    ///
    /// # Safety
    /// Rows `0..pt` of `src` (`ft * ES` bytes each, `ss` apart) and rows `0..ft` of `dst`
    /// (`pt * ES` bytes each, `ds` apart) must be valid.
    pub unsafe fn tiles<const ES: usize>(
        src: *const u8,
        ss: usize,
        dst: *mut u8,
        ds: usize,
        pt: usize,
        ft: usize,
    ) {
        let t = 16 / ES;
        for j in (0..ft).step_by(t) {
            for i in (0..pt).step_by(t) {
                let s = src.add(i * ss + j * ES);
                let d = dst.add(j * ds + i * ES);
                if ES == 2 {
                    t8x8_u16(s, ss, d, ds);
                } else {
                    t4x4_u32(s, ss, d, ds);
                }
            }
        }
    }

    /// 8 rows of 8 u16 at `s` (`ss` apart) -> 8 rows of 8 at `d` (`ds` apart).
    #[inline(always)]
    unsafe fn t8x8_u16(s: *const u8, ss: usize, d: *mut u8, ds: usize) {
        let a: [__m128i; 8] = std::array::from_fn(|r| _mm_loadu_si128(s.add(r * ss).cast()));
        let t0 = _mm_unpacklo_epi16(a[0], a[1]);
        let t1 = _mm_unpackhi_epi16(a[0], a[1]);
        let t2 = _mm_unpacklo_epi16(a[2], a[3]);
        let t3 = _mm_unpackhi_epi16(a[2], a[3]);
        let t4 = _mm_unpacklo_epi16(a[4], a[5]);
        let t5 = _mm_unpackhi_epi16(a[4], a[5]);
        let t6 = _mm_unpacklo_epi16(a[6], a[7]);
        let t7 = _mm_unpackhi_epi16(a[6], a[7]);
        let u0 = _mm_unpacklo_epi32(t0, t2);
        let u1 = _mm_unpackhi_epi32(t0, t2);
        let u2 = _mm_unpacklo_epi32(t1, t3);
        let u3 = _mm_unpackhi_epi32(t1, t3);
        let u4 = _mm_unpacklo_epi32(t4, t6);
        let u5 = _mm_unpackhi_epi32(t4, t6);
        let u6 = _mm_unpacklo_epi32(t5, t7);
        let u7 = _mm_unpackhi_epi32(t5, t7);
        let out = [
            _mm_unpacklo_epi64(u0, u4),
            _mm_unpackhi_epi64(u0, u4),
            _mm_unpacklo_epi64(u1, u5),
            _mm_unpackhi_epi64(u1, u5),
            _mm_unpacklo_epi64(u2, u6),
            _mm_unpackhi_epi64(u2, u6),
            _mm_unpacklo_epi64(u3, u7),
            _mm_unpackhi_epi64(u3, u7),
        ];
        for (c, v) in out.iter().enumerate() {
            _mm_storeu_si128(d.add(c * ds).cast(), *v);
        }
    }

    /// 4 rows of 4 u32 at `s` (`ss` apart) -> 4 rows of 4 at `d` (`ds` apart).
    #[inline(always)]
    unsafe fn t4x4_u32(s: *const u8, ss: usize, d: *mut u8, ds: usize) {
        let a: [__m128i; 4] = std::array::from_fn(|r| _mm_loadu_si128(s.add(r * ss).cast()));
        let t0 = _mm_unpacklo_epi32(a[0], a[1]);
        let t1 = _mm_unpackhi_epi32(a[0], a[1]);
        let t2 = _mm_unpacklo_epi32(a[2], a[3]);
        let t3 = _mm_unpackhi_epi32(a[2], a[3]);
        let out = [
            _mm_unpacklo_epi64(t0, t2),
            _mm_unpackhi_epi64(t0, t2),
            _mm_unpacklo_epi64(t1, t3),
            _mm_unpackhi_epi64(t1, t3),
        ];
        for (c, v) in out.iter().enumerate() {
            _mm_storeu_si128(d.add(c * ds).cast(), *v);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn transposes_each_width() {
        for es in [1usize, 2, 3, 4] {
            for (p, f) in [(37, 70), (128, 128), (16, 9), (5, 3), (8, 8), (1, 1)] {
                let src: Vec<u8> = (0..p * f * es).map(|i| (i * 7 % 251) as u8).collect();
                let t = super::transpose_bytes(&src, p, f, es);
                for i in 0..p {
                    for j in 0..f {
                        assert_eq!(
                            &t[(j * p + i) * es..(j * p + i + 1) * es],
                            &src[(i * f + j) * es..(i * f + j + 1) * es]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn strided_rows_leave_the_gaps_alone() {
        for es in [1usize, 2, 4] {
            let (p, f, ss, ds) = (19, 21, 21 * es + 13, 19 * es + 7);
            let src: Vec<u8> = (0..p * ss).map(|i| (i * 13 % 253) as u8).collect();
            let mut dst = vec![0xEEu8; f * ds];
            super::transpose_into(&src, ss, &mut dst, ds, (p, f), es);
            for j in 0..f {
                for i in 0..p {
                    let (s, d) = (i * ss + j * es, j * ds + i * es);
                    assert_eq!(&dst[d..d + es], &src[s..s + es]);
                }
                assert!(dst[j * ds + p * es..(j + 1) * ds]
                    .iter()
                    .all(|b| *b == 0xEE));
            }
            // too short a destination: nothing written
            let mut short = vec![0xEEu8; (f - 1) * ds + p * es - 1];
            super::transpose_into(&src, ss, &mut short, ds, (p, f), es);
            assert!(short.iter().all(|b| *b == 0xEE));
        }
    }
}
