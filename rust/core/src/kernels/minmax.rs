//! The largest / smallest value of a row of little-endian fp32 bytes, many lanes at a time.
//!
//! The engines' `maximum` / `minimum` fold a row left to right with `f32::max` / `f32::min`
//! (NaN operands ignored, engines/alu.rs). Whenever that result is a value other than a zero
//! or the fold's infinite identity, it is the row's largest (smallest) non-NaN value, whose
//! bits are unique: any order of comparisons finds the same bits. These kernels compare in
//! any order and report only such results; a row whose answer might depend on the order (a
//! zero of either sign, all NaN, the infinity) gets `None` and the caller folds it in order.

/// Row maximum, or `None` when the caller must fold in order (see the module doc).
pub fn max_f32_le(row: &[u8]) -> Option<f32> {
    let m = dispatch::<true>(row);
    (m != f32::NEG_INFINITY && m != 0.0).then_some(m)
}

/// Row minimum, or `None` when the caller must fold in order (see the module doc).
pub fn min_f32_le(row: &[u8]) -> Option<f32> {
    let m = dispatch::<false>(row);
    (m != f32::INFINITY && m != 0.0).then_some(m)
}

fn dispatch<const MAX: bool>(row: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match super::simd::path() {
        // SAFETY: simd::path reports a path only when the host has its features.
        super::simd::Path::Avx512 => return unsafe { body_avx512::<MAX>(row) },
        super::simd::Path::Avx2Fma => return unsafe { body_avx2::<MAX>(row) },
        super::simd::Path::Portable => {}
    }
    body::<MAX>(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn body_avx2<const MAX: bool>(row: &[u8]) -> f32 {
    body::<MAX>(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn body_avx512<const MAX: bool>(row: &[u8]) -> f32 {
    body::<MAX>(row)
}

/// `x` if it beats `acc` (a NaN never does), else `acc`: one compare-and-select per lane.
#[inline(always)]
fn better<const MAX: bool>(acc: f32, x: f32) -> f32 {
    if (MAX && x > acc) || (!MAX && x < acc) {
        x
    } else {
        acc
    }
}

/// The best non-NaN value of the row (the infinite identity if there is none).
#[inline(always)]
fn body<const MAX: bool>(row: &[u8]) -> f32 {
    const L: usize = 32;
    let init = if MAX {
        f32::NEG_INFINITY
    } else {
        f32::INFINITY
    };
    let mut acc = [init; L];
    let (chunks, rest) = row.as_chunks::<{ 4 * L }>();
    for c in chunks {
        let (w, _) = c.as_chunks::<4>();
        for (a, b) in acc.iter_mut().zip(w) {
            *a = better::<MAX>(*a, f32::from_le_bytes(*b));
        }
    }
    let (w, _) = rest.as_chunks::<4>();
    let mut m = w
        .iter()
        .fold(init, |a, b| better::<MAX>(a, f32::from_le_bytes(*b)));
    for a in acc {
        m = better::<MAX>(m, a);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::{max_f32_le, min_f32_le};

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn fold(v: &[f32], max: bool) -> f32 {
        let f = if max { f32::max } else { f32::min };
        v.iter().copied().reduce(f).unwrap_or(0.0)
    }

    #[test]
    fn matches_the_in_order_fold_or_declines() {
        let mut seed = 12345u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let specials = [
            f32::NAN,
            -f32::NAN,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            1e-45,
            -1e-45,
        ];
        for n in [0usize, 1, 3, 31, 32, 33, 128, 129, 512, 1000] {
            for trial in 0..60 {
                let v: Vec<f32> = (0..n)
                    .map(|_| {
                        let r = next();
                        match (trial % 4, r % 7) {
                            (0, _) => f32::from_bits(r as u32),
                            (1, 0) => specials[(r >> 8) as usize % specials.len()],
                            (2, _) => specials[(r >> 8) as usize % specials.len()],
                            _ => ((r >> 20) % 9) as f32 - 4.0,
                        }
                    })
                    .collect();
                for (max, got) in [
                    (true, max_f32_le(&bytes(&v))),
                    (false, min_f32_le(&bytes(&v))),
                ] {
                    if let Some(g) = got {
                        assert_eq!(g.to_bits(), fold(&v, max).to_bits(), "{v:?} max={max}");
                    } else {
                        let want = fold(&v, max);
                        assert!(want == 0.0 || want.is_nan() || want.is_infinite() || n == 0);
                    }
                }
            }
        }
    }

    #[test]
    fn declines_zeros_infinities_and_all_nan() {
        assert_eq!(max_f32_le(&bytes(&[-0.0, 0.0, -1.0])), None);
        assert_eq!(min_f32_le(&bytes(&[-0.0, 0.0, 1.0])), None);
        assert_eq!(max_f32_le(&bytes(&[f32::NAN, f32::NAN])), None);
        assert_eq!(max_f32_le(&bytes(&[f32::NEG_INFINITY])), None);
        assert_eq!(max_f32_le(&bytes(&[])), None);
        assert_eq!(
            max_f32_le(&bytes(&[f32::NAN, 2.0, f32::NAN, -3.0])),
            Some(2.0)
        );
        assert_eq!(
            min_f32_le(&bytes(&[f32::NAN, 2.0, f32::NAN, -3.0])),
            Some(-3.0)
        );
        assert_eq!(
            max_f32_le(&bytes(&[f32::INFINITY, 1.0])),
            Some(f32::INFINITY)
        );
    }
}
