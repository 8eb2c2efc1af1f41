//! The arithmetic of `nc_matmul_mx` (semantics: engines/mx.rs and docs/numerics.md "MX"):
//! per partition p and output (m, n), the 4 quad products are summed exactly with the two
//! block scales and rounded once to fp32; the fp32 column sum accumulates over p in order.
//!
//! Fast path: when every partial sum of 4 element products of the two formats is exact in
//! f64 (true for e4m3fn x e4m3fn and anything with fp4: values are multiples of the smallest
//! subnormal and bounded, so the sum needs < 53 bits), the exact sum is formed in f64, scaled
//! by the exact power of two and converted to f32 with one RNE rounding, the same value the
//! integer formula gives. Otherwise (e5m2 pairs) the integer formula runs. Partitions whose
//! terms involve Inf/NaN elements or a NaN scale use the reference IEEE formula unchanged.

use crate::numerics::float::Format;
use crate::numerics::mx::{round_wide_to_f32, scale_value, x4_code};
use crate::par;

/// One operand: `p` partitions of `w` x4 words, its element format and code width, and the
/// E8M0 scale codes `[p / 8][w]`.
pub struct Operand<'a> {
    pub words: &'a [u32],
    pub scales: &'a [u32],
    pub w: usize,
    pub fmt: Format,
    pub bits: u32,
}

/// Elements decoded per (partition, column): 4 values (f32, exact), the block scale as f64,
/// and whether the reference formula must be used (Inf/NaN element or NaN scale).
struct Decoded {
    q: [Vec<f32>; 4],
    /// `q * scale` in f64: exact (8-bit significands times a power of two in range).
    scaled: [Vec<f64>; 4],
    scale: Vec<f64>,
    code: Vec<u32>,
    special: Vec<bool>,
}

fn decode(o: &Operand, p: usize) -> Decoded {
    let codes = 1usize << o.bits;
    let vals: Vec<f32> = (0..codes as u32).map(|c| o.fmt.decode(c)).collect();
    let n = p * o.w;
    let scales: Vec<f64> = (0..256u32).map(scale_value).collect();
    let mut d = Decoded {
        q: std::array::from_fn(|_| vec![0f32; n]),
        scaled: std::array::from_fn(|_| vec![0f64; n]),
        scale: vec![0f64; n],
        code: vec![0; n],
        special: vec![false; n],
    };
    for i in 0..n {
        let word = o.words.get(i).copied().unwrap_or(0);
        let sc = o
            .scales
            .get((i / o.w / 8) * o.w + i % o.w)
            .copied()
            .unwrap_or(0xFF)
            & 0xFF;
        let mut special = sc == 0xFF;
        for q in 0..4 {
            let c = x4_code(word, q as u32, o.bits) as usize;
            let v = vals.get(c).copied().unwrap_or(f32::NAN);
            d.q[q][i] = v;
            special |= !v.is_finite();
        }
        d.scale[i] = scales.get(sc as usize).copied().unwrap_or(f64::NAN);
        for q in 0..4 {
            d.scaled[q][i] = d.q[q][i] as f64 * d.scale[i];
        }
        d.code[i] = sc;
        d.special[i] = special;
    }
    d
}

/// A finite MX element value as an integer multiple of 2^-16 (exact: MX elements are multiples
/// of 2^-16 and below 2^16), as `numerics::mx::element_units` computes it from the code.
fn element_units_of(v: f32) -> i64 {
    (v as f64 * 65536.0) as i64
}

/// True when a sum of 4 products of elements of `a` and `b` is always exact in f64.
fn f64_exact(a: Format, abits: u32, b: Format, bbits: u32) -> bool {
    let range = |f: Format, bits: u32| {
        let v: Vec<f64> = (0..1u32 << bits)
            .map(|c| f.decode(c).abs() as f64)
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        (lo, hi)
    };
    let (la, ha) = range(a, abits);
    let (lb, hb) = range(b, bbits);
    4.0 * ha * hb / (la * lb) < 2f64.powi(53)
}

/// The reference term of one (partition, m, n): IEEE f64 products when special, else the
/// exact integer formula.
fn reference_term(a: &Decoded, ia: usize, b: &Decoded, ib: usize) -> f32 {
    if a.special[ia] || b.special[ib] {
        let scale = a.scale[ia] * b.scale[ib];
        let mut s = 0f64;
        for q in 0..4 {
            s += a.q[q][ia] as f64 * b.q[q][ib] as f64;
        }
        (s * scale) as f32
    } else {
        // Finite elements as exact integer multiples of 2^-16 (numerics::mx::element_units).
        let units = |d: &Decoded, i: usize, q: usize| element_units_of(d.q[q][i]) as i128;
        let mut s: i128 = 0;
        for q in 0..4 {
            s += units(a, ia, q) * units(b, ib, q);
        }
        // value = s * 2^-32 * 2^(sa - 127) * 2^(sb - 127)
        round_wide_to_f32(
            s < 0,
            s.unsigned_abs(),
            a.code[ia] as i32 + b.code[ib] as i32 - 254 - 32,
        )
    }
}

/// `acc[m, n]` (row-major, `m = a.w`, `n = b.w`) over `p` partitions.
pub fn matmul_mx(p: usize, a: &Operand, b: &Operand) -> Vec<f32> {
    let (m, n) = (a.w, b.w);
    let da = decode(a, p);
    let db = decode(b, p);
    let fast = f64_exact(a.fmt, a.bits, b.fmt, b.bits);
    // Per partition: the B columns that need the reference term.
    let b_special: Vec<Vec<usize>> = (0..p)
        .map(|pp| (0..n).filter(|&j| db.special[pp * n + j]).collect())
        .collect();
    let mut acc = vec![0f32; m * n];
    // Tasks own blocks of output rows; within a block, partition-outer order keeps one
    // partition's decoded moving row in L1 while it meets every output row (each element
    // still accumulates its partitions in order 0..P-1).
    const ROWS: usize = 16;
    par::for_each_chunk_mut(&mut acc, ROWS * n, 16 * p * m * n, |ci, block| {
        let mut t = vec![0f32; n];
        for (pp, bsp) in b_special.iter().enumerate() {
            let cols = pp * n..(pp + 1) * n;
            for (li, row) in block.chunks_exact_mut(n).enumerate() {
                let mi = ci * ROWS + li;
                let ia = pp * m + mi;
                let qa = [
                    da.scaled[0][ia],
                    da.scaled[1][ia],
                    da.scaled[2][ia],
                    da.scaled[3][ia],
                ];
                let qb = [
                    &db.scaled[0][cols.clone()],
                    &db.scaled[1][cols.clone()],
                    &db.scaled[2][cols.clone()],
                    &db.scaled[3][cols.clone()],
                ];
                if fast && !da.special[ia] && bsp.is_empty() {
                    terms_f64(qa, qb, row, true);
                    continue;
                }
                if fast && !da.special[ia] {
                    terms_f64(qa, qb, &mut t, false);
                    for &j in bsp {
                        t[j] = reference_term(&da, ia, &db, pp * n + j);
                    }
                } else {
                    for (j, x) in t.iter_mut().enumerate() {
                        *x = reference_term(&da, ia, &db, pp * n + j);
                    }
                }
                for (o, x) in row.iter_mut().zip(&t) {
                    *o += *x;
                }
            }
        }
    });
    acc
}

/// `term[j] = fl32(sum_q a_q * b_q[j])` for block-scaled elements `a_q`, `b_q[j]`: every product
/// and partial sum is exact in f64 (see `f64_exact`), so the cast is the only rounding. Stored
/// to `t[j]`, or added to it (`t[j] = fl32(t[j] + term)`) when `accumulate`.
fn terms_f64(a: [f64; 4], b: [&[f64]; 4], t: &mut [f32], accumulate: bool) {
    #[cfg(target_arch = "x86_64")]
    match super::simd::path() {
        // SAFETY: simd::path reports a path only when the host has its features.
        super::simd::Path::Avx512 => return unsafe { terms_avx512(a, b, t, accumulate) },
        super::simd::Path::Avx2Fma => return unsafe { terms_avx2(a, b, t, accumulate) },
        super::simd::Path::Portable => {}
    }
    terms_body(a, b, t, accumulate)
}

/// (Rust never contracts `a * b + c` into an FMA, so enabling `fma` cannot change a bit.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn terms_avx2(a: [f64; 4], b: [&[f64]; 4], t: &mut [f32], accumulate: bool) {
    terms_body(a, b, t, accumulate)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn terms_avx512(a: [f64; 4], b: [&[f64]; 4], t: &mut [f32], accumulate: bool) {
    terms_body(a, b, t, accumulate)
}

#[inline(always)]
fn terms_body(a: [f64; 4], b: [&[f64]; 4], t: &mut [f32], accumulate: bool) {
    let n = t.len().min(b.iter().map(|x| x.len()).min().unwrap_or(0));
    let [a0, a1, a2, a3] = a;
    let (b0, b1, b2, b3) = (&b[0][..n], &b[1][..n], &b[2][..n], &b[3][..n]);
    if accumulate {
        for (j, o) in t[..n].iter_mut().enumerate() {
            *o += (a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]) as f32;
        }
    } else {
        for (j, o) in t[..n].iter_mut().enumerate() {
            *o = (a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::float::{E2M1, E4M3FN, E5M2};

    #[test]
    fn units_from_values_match_units_from_codes() {
        for (f, bits) in [(E4M3FN, 8), (E5M2, 8), (E2M1, 4)] {
            for c in 0..1u32 << bits {
                let want = crate::numerics::mx::element_units(f, c);
                let v = f.decode(c);
                assert_eq!(
                    want,
                    v.is_finite().then(|| element_units_of(v)),
                    "{f:?} {c:#x}"
                );
            }
        }
    }

    #[test]
    fn exactness_classification() {
        assert!(f64_exact(E4M3FN, 8, E4M3FN, 8));
        assert!(f64_exact(E2M1, 4, E5M2, 8));
        assert!(!f64_exact(E5M2, 8, E5M2, 8));
    }

    #[test]
    fn fast_terms_equal_the_integer_formula() {
        // Every e4m3fn code pair in one quad slot, with extreme scales (subnormal and
        // overflowing f32 results included).
        let mut seed = 7u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 32) as u32
        };
        for _ in 0..20000 {
            let (wa, wb) = (rnd(), rnd());
            let (sa, sb) = (rnd() % 255, rnd() % 255);
            let oa = Operand {
                words: &[wa],
                scales: &[sa],
                w: 1,
                fmt: E4M3FN,
                bits: 8,
            };
            let ob = Operand {
                words: &[wb],
                scales: &[sb],
                w: 1,
                fmt: E4M3FN,
                bits: 8,
            };
            let (da, db) = (decode(&oa, 1), decode(&ob, 1));
            if da.special[0] || db.special[0] {
                continue;
            }
            let mut t = [0f32];
            let qa = [
                da.scaled[0][0],
                da.scaled[1][0],
                da.scaled[2][0],
                da.scaled[3][0],
            ];
            let qb = [
                &db.scaled[0][..],
                &db.scaled[1][..],
                &db.scaled[2][..],
                &db.scaled[3][..],
            ];
            terms_body(qa, qb, &mut t, false);
            let want = reference_term(&da, 0, &db, 0);
            assert_eq!(
                t[0].to_bits(),
                want.to_bits(),
                "{wa:08x} {wb:08x} {sa} {sb}"
            );
        }
    }
}
