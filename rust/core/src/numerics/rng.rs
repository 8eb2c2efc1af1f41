//! XORWOW (Marsaglia 2003, the cuRAND default) and the per-lane generator states of a core.
//!
//! State word order (our choice; the hardware's is undocumented): `[x0, x1, x2, x3, x4, d]`,
//! five xorshift words then the Weyl counter `d`. One step:
//! `t = x4 ^ (x4 >> 2); t ^= t << 1; t ^= x0 ^ (x0 << 4); shift x down (x4 = x3 ... x1 = x0);
//! x0 = t; d += 362437; output t + d` (all mod 2^32).

use super::config::mix64;
use crate::memory::PARTITIONS;

pub const WORDS: usize = 6;
/// VectorE: 4 XORWOW states per lane; GpSimd: 1.
pub const VECTOR_STATES: usize = 4;

/// Advance one state and return its 32-bit output.
#[inline]
pub fn xorwow_next(s: &mut [u32; WORDS]) -> u32 {
    let mut t = s[4];
    let x0 = s[0];
    s[4] = s[3];
    s[3] = s[2];
    s[2] = s[1];
    s[1] = x0;
    t ^= t >> 2;
    t ^= t << 1;
    t ^= x0 ^ (x0 << 4);
    s[0] = t;
    s[5] = s[5].wrapping_add(362_437);
    t.wrapping_add(s[5])
}

/// The state a 32/64-bit seed gives state `k` of `lane` (our choice: SplitMix64 of
/// (seed, engine, lane, k); the xorshift words are never all zero).
pub fn seed_state(seed: u64, engine: u8, lane: usize, k: usize) -> [u32; WORDS] {
    let mut z = mix64(seed ^ ((engine as u64) << 48) ^ ((lane as u64) << 8) ^ k as u64);
    let mut s = [0u32; WORDS];
    for w in s.iter_mut() {
        z = mix64(z.wrapping_add(0x9E37_79B9_7F4A_7C15));
        *w = (z >> 32) as u32;
    }
    if s[..5].iter().all(|w| *w == 0) {
        s[0] = 1;
    }
    s
}

/// The generator states of one core: VectorE 4 per lane, GpSimd 1 per lane.
#[derive(Clone, Debug)]
pub struct RngStates {
    pub vector: Vec<[[u32; WORDS]; VECTOR_STATES]>,
    pub gpsimd: Vec<[u32; WORDS]>,
}

pub const ENGINE_VECTOR: u8 = 1;
pub const ENGINE_GPSIMD: u8 = 2;

impl RngStates {
    /// Power-on states derived from `seed` (the device numerics seed).
    pub fn seeded(seed: u64) -> Self {
        let mut r = RngStates {
            vector: vec![[[0; WORDS]; VECTOR_STATES]; PARTITIONS],
            gpsimd: vec![[0; WORDS]; PARTITIONS],
        };
        r.seed_vector(seed);
        for (lane, s) in r.gpsimd.iter_mut().enumerate() {
            *s = seed_state(seed, ENGINE_GPSIMD, lane, 0);
        }
        r
    }

    /// `set_rng_seed`: every VectorE lane and state from one seed.
    pub fn seed_vector(&mut self, seed: u64) {
        for (lane, st) in self.vector.iter_mut().enumerate() {
            for (k, s) in st.iter_mut().enumerate() {
                *s = seed_state(seed, ENGINE_VECTOR, lane, k);
            }
        }
    }

    /// Next 32-bit output for element `j` of a row on `lane`. VectorE element j draws from
    /// state j % 4 (4 outputs per lane per cycle); GpSimd from its only state.
    #[inline]
    pub fn next(&mut self, vector: bool, lane: usize, j: usize) -> u32 {
        if vector {
            xorwow_next(&mut self.vector[lane % PARTITIONS][j % VECTOR_STATES])
        } else {
            xorwow_next(&mut self.gpsimd[lane % PARTITIONS])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xorwow_reference_sequence() {
        // Marsaglia's paper seeds: x = 123456789, 362436069, 521288629, 88675123, 5783321;
        // d = 6615241. First outputs computed by hand from the recurrence in the paper:
        // t = x ^ (x >> 2); x = y; y = z; z = w; w = v; v = (v ^ (v << 4)) ^ (t ^ (t << 1));
        // return (d += 362437) + v. Our word order keeps the newest word in x0.
        let (mut x, mut y, mut z, mut w, mut v, mut d) = (
            123456789u32,
            362436069u32,
            521288629u32,
            88675123u32,
            5783321u32,
            6615241u32,
        );
        let mut s = [v, w, z, y, x, d];
        for _ in 0..1000 {
            let t = x ^ (x >> 2);
            x = y;
            y = z;
            z = w;
            w = v;
            v = (v ^ (v << 4)) ^ (t ^ (t << 1));
            d = d.wrapping_add(362437);
            let want = d.wrapping_add(v);
            assert_eq!(xorwow_next(&mut s), want);
        }
    }
}
