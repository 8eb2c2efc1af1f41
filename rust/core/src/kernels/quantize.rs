//! quantize_mx under plain RNE, one group of 8 partitions at a time (engines/mx.rs holds the
//! semantics and the general loop; this is its fast path, same values). Integer and exact fp32
//! operations only, so the AVX-512 / AVX2 builds of the same body give the same bits.

use super::simd;
#[cfg(target_arch = "x86_64")]
use super::simd::Path;
use crate::numerics::config::MxScaleRule;
use crate::numerics::float::Format;
use crate::numerics::mx::{encode_in_range_rne, scale_code, scale_value};

/// Words (`8 * w`, row-major) and scale codes (`w`) of one group: `v` holds its 8 rows of
/// `4 * w` fp32 elements.
pub fn group_rne(
    v: &[f32],
    elem: Format,
    rule: MxScaleRule,
    words: &mut [u32],
    scales: &mut [u32],
) {
    match simd::path() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the path is only chosen when the host has the features (simd::path).
        Path::Avx512 => unsafe { x86::avx512(v, elem, rule, words, scales) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Path::Avx2Fma => unsafe { x86::avx2(v, elem, rule, words, scales) },
        _ => body(v, elem, rule, words, scales),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{body, Format, MxScaleRule};

    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn avx512(v: &[f32], e: Format, r: MxScaleRule, w: &mut [u32], s: &mut [u32]) {
        body(v, e, r, w, s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn avx2(v: &[f32], e: Format, r: MxScaleRule, w: &mut [u32], s: &mut [u32]) {
        body(v, e, r, w, s)
    }
}

/// (The portable body.) One group of 8 partitions (`v` its rows, `f` elements each) under plain RNE, the same
/// values as `quantize`'s general loop: the block maximum from the magnitude bits (integer
/// order is value order for non-NaN fp32; >= the Inf pattern marks an Inf/NaN block), then
/// `x * 2^-scale` in fp32 (one rounding of the exact product, as the f64 product cast to fp32
/// gives; clamping commutes with it) and the in-range encoder.
#[inline(always)]
fn body(v: &[f32], elem: Format, rule: MxScaleRule, words: &mut [u32], scales: &mut [u32]) {
    let w = scales.len();
    let f = 4 * w;
    let maxv = elem.decode(if elem.ebits == 5 { 0x7B } else { 0x7E });
    let mut amax = vec![0u32; w];
    for row in v.chunks_exact(f) {
        for (m, q) in amax.iter_mut().zip(row.chunks_exact(4)) {
            let b = q
                .iter()
                .map(|x| x.to_bits() & 0x7FFF_FFFF)
                .max()
                .unwrap_or(0);
            *m = (*m).max(b);
        }
    }
    let mut inv = vec![0f32; w];
    for ((code, i), m) in scales.iter_mut().zip(inv.iter_mut()).zip(&amax) {
        *code = if *m >= 0x7F80_0000 {
            0xFF
        } else {
            scale_code(f32::from_bits(*m), elem, rule)
        };
        *i = (1.0 / scale_value(*code)) as f32; // a power of two, exact in fp32 (NaN for 0xFF)
    }
    for (row, out) in v.chunks_exact(f).zip(words.chunks_exact_mut(w)) {
        for ((o, q), k) in out.iter_mut().zip(row.chunks_exact(4)).zip(&inv) {
            let mut word = 0u32;
            for (t, x) in q.iter().enumerate() {
                let y = (x * k).clamp(-maxv, maxv);
                word |= (encode_in_range_rne(elem, y) & 0xFF) << (8 * t);
            }
            *o = word;
        }
    }
    for (j, code) in scales.iter().enumerate() {
        if *code == 0xFF {
            // Inf/NaN block: every element NaN with its sign (as the general loop)
            for r in 0..8 {
                let mut word = 0u32;
                for t in 0..4 {
                    let x = v[r * f + 4 * j + t];
                    let c = elem.encode(f32::NAN.to_bits()) | ((x.is_sign_negative() as u32) << 7);
                    word |= (c & 0xFF) << (8 * t);
                }
                words[r * w + j] = word;
            }
        }
    }
}
