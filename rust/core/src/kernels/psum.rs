//! The PSUM write of a matmul result: overwrite, accumulate (`psum = fl32(psum + acc)`), or
//! decide per element (accumulate = None: add when a matmul already wrote the element in this
//! run). A bf16 PSUM is rounded after the add with the instruction's rounder (RNE or SR).
//! Contiguous fp32/bf16 destinations (every matmul in practice) read and write the PSUM bytes
//! in place, set the "written by a matmul" bits a row at a time, and (fp32) split the
//! partitions across host threads: each element is still one fp32 add or copy.
//!
//! The engine picks the path with [`layout`]: `F32Rows` writes PSUM in place
//! ([`write_f32_rows`]); `Bf16Rows` and `General` return staged fp32 values
//! ([`stage_bf16`], [`stage_general`]) that the engine stores with the instruction's rounder.

use crate::isa::DType;
use crate::memory::onchip::OnChip;
use crate::memory::{Ap, Mem, PSUM_PART_BYTES};
use crate::par;

/// Words of `EngineState::psum_mm` per partition (one bit per 2-byte unit).
const WORDS_PER_PART: usize = PSUM_PART_BYTES / 2 / 64;

/// A matmul result `[M, N]`: row-major, or in column panels `[N / nr][M][nr]` (the gemm's
/// output layout, padding lanes ignored).
#[derive(Clone, Copy)]
pub struct Acc<'a> {
    pub data: &'a [f32],
    pub m: usize,
    pub n: usize,
    /// Panel width; 0 = row-major.
    pub nr: usize,
    /// Operations of the instruction that produced it: the write is split across threads by
    /// the instruction's size (its threads are awake and its data already shared), not by the
    /// size of the write alone.
    pub work: usize,
}

impl<'a> Acc<'a> {
    pub fn row_major(data: &'a [f32], m: usize, n: usize) -> Self {
        Acc {
            data,
            m,
            n,
            nr: 0,
            work: 2 * m * n,
        }
    }

    /// Row `r` as consecutive (first column, values) segments.
    fn segments(&self, r: usize) -> impl Iterator<Item = (usize, &'a [f32])> + 'a {
        let (data, m, n, panels) = (self.data, self.m, self.n, self.nr != 0);
        let nr = if panels { self.nr } else { n.max(1) };
        let panel = if panels { m * nr } else { 0 };
        let stride = if panels { nr } else { n };
        (0..n.div_ceil(nr)).map(move |p| {
            let j0 = p * nr;
            let len = nr.min(n - j0);
            let at = p * panel + r * stride + if panels { 0 } else { j0 };
            (j0, data.get(at..at + len).unwrap_or(&[]))
        })
    }

    fn get(&self, r: usize, j: usize) -> f32 {
        let at = match (j.checked_div(self.nr), j.checked_rem(self.nr)) {
            (Some(p), Some(c)) => p * self.m * self.nr + r * self.nr + c,
            _ => r * self.n + j,
        };
        self.data.get(at).copied().unwrap_or(0.0)
    }
}

/// Index of the 2-byte PSUM unit holding byte `byte` of partition `part`.
fn unit(part: usize, byte: usize) -> usize {
    (part * PSUM_PART_BYTES + byte) / 2
}

fn test_bit(words: &[u64], b: usize) -> bool {
    words.get(b / 64).is_some_and(|w| w >> (b % 64) & 1 == 1)
}

/// Set bits `lo..hi`: the partial words at either end masked, the whole words between filled.
fn set_bits(words: &mut [u64], lo: usize, hi: usize) {
    if lo >= hi {
        return;
    }
    let (w0, w1) = (lo / 64, (hi - 1) / 64);
    let head = !0u64 << (lo % 64);
    let tail = !0u64 >> (63 - (hi - 1) % 64);
    if w0 == w1 {
        if let Some(x) = words.get_mut(w0) {
            *x |= head & tail;
        }
        return;
    }
    if let Some(x) = words.get_mut(w0) {
        *x |= head;
    }
    if let Some(mid) = words.get_mut(w0 + 1..w1.min(words.len())) {
        mid.fill(!0);
    }
    if let Some(x) = words.get_mut(w1) {
        *x |= tail;
    }
}

/// `set_bits(part, lo, hi)` on every partition's `WORDS_PER_PART` words of `words`, the word
/// range and end masks worked out once (no fill call per partition).
fn set_bits_rows(words: &mut [u64], lo: usize, hi: usize) {
    if lo >= hi || hi > WORDS_PER_PART * 64 {
        for part in words.chunks_exact_mut(WORDS_PER_PART) {
            set_bits(part, lo, hi);
        }
        return;
    }
    let (w0, w1) = (lo / 64, (hi - 1) / 64);
    let head = !0u64 << (lo % 64);
    let tail = !0u64 >> (63 - (hi - 1) % 64);
    for part in words.chunks_exact_mut(WORDS_PER_PART) {
        let span = &mut part[w0..=w1];
        if let [only] = span {
            *only |= head & tail;
            continue;
        }
        if let Some((first, rest)) = span.split_first_mut() {
            *first |= head;
            if let Some((last, mid)) = rest.split_last_mut() {
                *last |= tail;
                for x in mid {
                    *x = !0;
                }
            }
        }
    }
}

/// How a matmul result is written to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Contiguous fp32 rows inside PSUM: written in place, partitions in parallel.
    F32Rows,
    /// Contiguous bf16 rows inside PSUM: staged in fp32, stored through the rounder.
    Bf16Rows,
    /// Any other pattern: element by element from the old values.
    General,
}

/// The write path for the PSUM tile `dst`.
pub fn layout(dst: &Ap) -> Layout {
    let fast = dst.mem == Mem::Psum
        && dst.dynamic.is_none()
        && dst.is_row_contiguous()
        && matches!(dst.dtype, DType::Float32 | DType::Bfloat16)
        && dst.offset.is_multiple_of(2)
        && (dst.offset as usize + dst.free_size() * dst.dtype.size()) <= PSUM_PART_BYTES;
    match (fast, dst.dtype) {
        (false, _) => Layout::General,
        (true, DType::Float32) => Layout::F32Rows,
        (true, _) => Layout::Bf16Rows,
    }
}

/// The one NaN a matmul writes to PSUM: the positive quiet NaN with no payload (docs/numerics.md).
/// Which NaN an FMA or an add returns when an operand is NaN (the first operand's, quieted, or
/// the "default NaN" of Inf x 0, negative on x86) depends on the instruction form the compiler
/// picked, so without this the bits would depend on the SIMD path.
pub const CANONICAL_NAN: f32 = f32::from_bits(0x7fc0_0000);

/// `v`, or `CANONICAL_NAN` if `v` is a NaN (branch-free: vectorises to a compare and blend).
#[inline(always)]
pub fn canon(v: f32) -> f32 {
    if v.is_nan() {
        CANONICAL_NAN
    } else {
        v
    }
}

/// fp32 PSUM (`Layout::F32Rows`): `mode` Some(add) adds or overwrites, None adds where the
/// matmul bit in `words` (`EngineState::psum_mm`) is set; per partition, in parallel
/// (partitions own disjoint bytes and bit words).
pub fn write_f32_rows(
    mode: Option<bool>,
    psum: &mut OnChip,
    words: &mut [u64],
    dst: &Ap,
    acc: &Acc,
) {
    let (start, m, n) = (dst.start as usize, dst.parts as usize, dst.free_size());
    let off = dst.offset as usize;
    // Partitions are `stride` host bytes apart (padded, memory/onchip.rs); each chunk holds one
    // partition's bytes first.
    let stride = psum.stride();
    let psum = psum.raw_mut();
    let (Some(bytes), Some(bits)) = (
        psum.get_mut(start * stride..(start + m) * stride),
        words.get_mut(start * WORDS_PER_PART..(start + m) * WORDS_PER_PART),
    ) else {
        return; // validated APs are in bounds
    };
    let path = super::simd::path();
    par::for_each_chunk_pair_mut(
        bytes,
        stride,
        bits,
        WORDS_PER_PART,
        acc.work,
        |r, part, bits| {
            // Units relative to this partition's first bit word.
            let u0 = off / 2;
            let Some(row) = part.get_mut(off..off + 4 * n) else {
                return;
            };
            match mode {
                Some(add) => row_f32(path, row, acc, r, add),
                None => {
                    for (j0, seg) in acc.segments(r) {
                        let Some(out) = row.get_mut(4 * j0..4 * (j0 + seg.len())) else {
                            continue;
                        };
                        for (i, (o, x)) in out.chunks_exact_mut(4).zip(seg).enumerate() {
                            let v = canon(if test_bit(bits, u0 + 2 * (j0 + i)) {
                                f32::from_le_bytes([o[0], o[1], o[2], o[3]]) + *x
                            } else {
                                *x
                            });
                            o.copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
            set_bits(bits, u0, u0 + 2 * n);
        },
    );
}

/// Row `r` of an fp32 PSUM tile (`out`, little-endian bytes): `out = acc` or
/// `out = fl32(out + acc)`, with the widest vectors the host has.
fn row_f32(path: super::simd::Path, out: &mut [u8], acc: &Acc, r: usize, add: bool) {
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: simd::path reports a path only when the host has its features.
        super::simd::Path::Avx512 => return unsafe { row_f32_avx512(out, acc, r, add) },
        super::simd::Path::Avx2Fma => return unsafe { row_f32_avx2(out, acc, r, add) },
        super::simd::Path::Portable => {}
    }
    let _ = path;
    row_f32_body(out, acc, r, add)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_f32_avx2(out: &mut [u8], acc: &Acc, r: usize, add: bool) {
    row_f32_body(out, acc, r, add)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn row_f32_avx512(out: &mut [u8], acc: &Acc, r: usize, add: bool) {
    row_f32_body(out, acc, r, add)
}

#[inline(always)]
fn row_f32_body(out: &mut [u8], acc: &Acc, r: usize, add: bool) {
    match acc.nr {
        32 => row_panels::<32>(out, acc, r, add),
        16 => row_panels::<16>(out, acc, r, add),
        _ => {
            for (j0, seg) in acc.segments(r) {
                if let Some(o) = out.get_mut(4 * j0..4 * (j0 + seg.len())) {
                    seg_f32(o, seg, add);
                }
            }
        }
    }
}

/// A row whose values sit in `NR`-wide panels: whole panels as fixed-size blocks.
#[inline(always)]
fn row_panels<const NR: usize>(out: &mut [u8], acc: &Acc, r: usize, add: bool) {
    let n = acc.n;
    for (p, j0) in (0..n).step_by(NR).enumerate() {
        let len = NR.min(n - j0);
        let at = p * acc.m * NR + r * NR;
        let (Some(o), Some(seg)) = (
            out.get_mut(4 * j0..4 * (j0 + len)),
            acc.data.get(at..at + len),
        ) else {
            continue;
        };
        seg_f32(o, seg, add);
    }
}

#[inline(always)]
fn seg_f32(out: &mut [u8], seg: &[f32], add: bool) {
    let (words, _) = out.as_chunks_mut::<4>();
    if add {
        for (o, x) in words.iter_mut().zip(seg) {
            *o = canon(f32::from_le_bytes(*o) + *x).to_le_bytes();
        }
    } else {
        for (o, x) in words.iter_mut().zip(seg) {
            *o = canon(*x).to_le_bytes();
        }
    }
}

/// An fp32 PSUM tile (`Layout::F32Rows`, accumulate given) written in place block by block:
/// the matmul hands each microkernel tile straight to its PSUM rows (kernels/matmul.rs
/// `matmul_in_place`), with no panel-major result buffer and no second pass over it. Each
/// element is the same single fp32 copy or add (`psum + acc`) as `write_f32_rows`.
pub struct TileSink<'a> {
    /// The tile's partitions (the first at byte 0), `stride` host bytes apart.
    bytes: &'a mut [u8],
    stride: usize,
    off: usize,
    add: bool,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    path: super::simd::Path,
}

/// The in-place writer for `dst` when the write is a plain copy or add into contiguous fp32
/// rows (else `None`: the caller stages the result). Sets the "written by a matmul" bits of the
/// tile, as `write_f32_rows` does; the caller then puts every element once.
pub fn tile_sink<'a>(
    mode: Option<bool>,
    psum: &'a mut OnChip,
    words: &mut [u64],
    dst: &Ap,
) -> Option<TileSink<'a>> {
    let add = mode?;
    if layout(dst) != Layout::F32Rows {
        return None;
    }
    let (start, m, n) = (dst.start as usize, dst.parts as usize, dst.free_size());
    let (off, stride) = (dst.offset as usize, psum.stride());
    let bytes = psum
        .raw_mut()
        .get_mut(start * stride..(start + m) * stride)?;
    let bits = words.get_mut(start * WORDS_PER_PART..(start + m) * WORDS_PER_PART)?;
    set_bits_rows(bits, off / 2, off / 2 + 2 * n);
    Some(TileSink {
        bytes,
        stride,
        off,
        add,
        path: super::simd::path(),
    })
}

impl TileSink<'_> {
    /// Rows `r0..r0 + rows`, columns `j0..j0 + cols` of the result from `tile` (row-major,
    /// rows `w` elements apart).
    pub fn put(
        &mut self,
        (r0, rows): (usize, usize),
        (j0, cols): (usize, usize),
        tile: &[f32],
        w: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        match self.path {
            // SAFETY: simd::path reports a path only when the host has its features.
            super::simd::Path::Avx512 => {
                return unsafe { self.put_avx512((r0, rows), (j0, cols), tile, w) }
            }
            super::simd::Path::Avx2Fma => {
                return unsafe { self.put_avx2((r0, rows), (j0, cols), tile, w) }
            }
            super::simd::Path::Portable => {}
        }
        self.put_body((r0, rows), (j0, cols), tile, w)
    }

    /// Whole 32-column rows with explicit 512-bit loads and stores (the byte-array loop does
    /// not vectorise); other blocks through `put_body`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn put_avx512(&mut self, r: (usize, usize), j: (usize, usize), tile: &[f32], w: usize) {
        use std::arch::x86_64::*;
        let ((r0, rows), (j0, cols)) = (r, j);
        if cols != 32 || w < 32 || tile.len() < rows * w {
            return self.put_body(r, j, tile, w);
        }
        for i in 0..rows {
            let at = (r0 + i) * self.stride + self.off + 4 * j0;
            let Some(o) = self.bytes.get_mut(at..at + 128) else {
                continue;
            };
            let (po, pt) = (o.as_mut_ptr() as *mut f32, tile.as_ptr().add(i * w));
            // SAFETY: `o` holds 32 floats' bytes and the tile row 32 floats (checked above);
            // unaligned loads and stores.
            let (mut x0, mut x1) = (_mm512_loadu_ps(pt), _mm512_loadu_ps(pt.add(16)));
            if self.add {
                x0 = _mm512_add_ps(_mm512_loadu_ps(po), x0);
                x1 = _mm512_add_ps(_mm512_loadu_ps(po.add(16)), x1);
            }
            // `canon` lane by lane: NaN lanes become CANONICAL_NAN.
            let nan = _mm512_set1_ps(CANONICAL_NAN);
            x0 = _mm512_mask_mov_ps(x0, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x0, x0), nan);
            x1 = _mm512_mask_mov_ps(x1, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x1, x1), nan);
            _mm512_storeu_ps(po, x0);
            _mm512_storeu_ps(po.add(16), x1);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn put_avx2(&mut self, r: (usize, usize), j: (usize, usize), tile: &[f32], w: usize) {
        self.put_body(r, j, tile, w)
    }

    #[inline(always)]
    fn put_body(
        &mut self,
        (r0, rows): (usize, usize),
        (j0, cols): (usize, usize),
        tile: &[f32],
        w: usize,
    ) {
        for (i, src) in tile.chunks(w.max(1)).take(rows).enumerate() {
            let at = (r0 + i) * self.stride + self.off + 4 * j0;
            let (Some(o), Some(seg)) = (self.bytes.get_mut(at..at + 4 * cols), src.get(..cols))
            else {
                continue;
            };
            seg_f32(o, seg, self.add);
        }
    }
}

/// bf16 PSUM (`Layout::Bf16Rows`): the fp32 sums, row-major, for the engine to store through
/// the instruction's rounder; sets the matmul bits.
pub fn stage_bf16(
    mode: Option<bool>,
    psum: &OnChip,
    words: &mut [u64],
    dst: &Ap,
    acc: &Acc,
) -> Vec<f32> {
    let (m, n) = (dst.parts as usize, dst.free_size());
    let mut staged = vec![0f32; m * n];
    for r in 0..m {
        let part = dst.start as usize + r;
        let base = dst.offset as usize;
        let Some(row) = psum.partition(part).get(base..base + 2 * n) else {
            continue;
        };
        let u0 = unit(part, dst.offset as usize);
        for (j0, seg) in acc.segments(r) {
            for (i, x) in seg.iter().enumerate() {
                let j = j0 + i;
                let add = mode.unwrap_or_else(|| test_bit(words, u0 + j));
                staged[r * n + j] = canon(if add {
                    f32::from_bits((u16::from_le_bytes([row[2 * j], row[2 * j + 1]]) as u32) << 16)
                        + *x
                } else {
                    *x
                });
            }
        }
        set_bits(words, u0, u0 + n);
    }
    staged
}

/// Any other destination pattern (`Layout::General`), element by element from `old` (dst's
/// current values, row-major): the new values for the engine to store; sets the matmul bits.
pub fn stage_general(
    mode: Option<bool>,
    old: &[f32],
    words: &mut [u64],
    dst: &Ap,
    acc: &Acc,
) -> Vec<f32> {
    let (m, n) = (dst.parts as usize, dst.free_size());
    let offs = dst.row_offsets();
    let es = dst.dtype.size() as i64;
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        for (j, o) in offs.iter().enumerate() {
            let i = r * n + j;
            let byte = dst.offset as i64 + o * es;
            let bit = unit(dst.start as usize + r, byte.max(0) as usize);
            let add = mode.unwrap_or_else(|| test_bit(words, bit));
            let (x, y) = (old.get(i).copied().unwrap_or(0.0), acc.get(r, j));
            out[i] = canon(if add { x + y } else { y });
            set_bits(words, bit, bit + es as usize / 2);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_bits_sets_exactly_the_range() {
        for lo in 0..200 {
            for hi in lo..260 {
                let mut words = [0u64; 4];
                set_bits(&mut words, lo, hi);
                for b in 0..256 {
                    assert_eq!(
                        test_bit(&words, b),
                        b >= lo && b < hi,
                        "bit {b} of {lo}..{hi}"
                    );
                }
            }
        }
        // every partition's range at once: the same bits as set_bits per partition
        for (lo, hi) in [
            (0, 1),
            (3, 64),
            (64, 128),
            (10, 1000),
            (0, WORDS_PER_PART * 64),
            (63, 65),
        ] {
            let mut a = vec![0x8000_0000_0000_0001u64; 3 * WORDS_PER_PART];
            let mut b = a.clone();
            set_bits_rows(&mut a, lo, hi);
            for part in b.chunks_exact_mut(WORDS_PER_PART) {
                set_bits(part, lo, hi);
            }
            assert_eq!(a, b, "{lo}..{hi}");
        }
        // bits already set stay set
        let mut words = [1u64 << 63, 1, 0];
        set_bits(&mut words, 10, 20);
        assert_eq!(words, [(1u64 << 63) | (((1u64 << 10) - 1) << 10), 1, 0]);
    }
}
