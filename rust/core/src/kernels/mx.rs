//! The arithmetic of `nc_matmul_mx` (semantics: engines/mx.rs and docs/numerics.md "MX"):
//! per partition p and output (m, n), the 4 quad products are summed exactly with the two
//! block scales and rounded once to fp32; the fp32 column sum accumulates over p in order.
//!
//! Fast path: when every partial sum of 4 element products of the two formats is exact in
//! f64 (true for e4m3fn x e4m3fn and anything with fp4: values are multiples of the smallest
//! subnormal and bounded, so the sum needs < 53 bits), the exact sum is formed in f64 (scaled
//! elements: `q * 2^(s - 127)` is exact in f64, so the product of two carries both scales), and
//! converted to f32 with one RNE rounding, the same value the integer formula gives. Since every
//! f64 step is exact, the order of the products and the use of fused multiply-adds cannot
//! change a bit: only the f32 conversion and the f32 accumulation round. The operands are
//! dequantised once per instruction into panels (A: `[M / MR][P][MR][4]`, B: `[N / NR][P][4][NR]`
//! f64) and a register-blocked microkernel keeps an `MR x NR` block of f32 accumulators while
//! it walks the partitions in order. Otherwise (e5m2 pairs) the integer formula runs.
//! Partitions whose terms involve Inf/NaN elements or a NaN scale use the reference IEEE
//! formula unchanged (one scalar step of the block at that partition).
//!
//! Speed: the per-partition rounding of each quad sum rules out the fp32 fma-chain gemm
//! (kernels/gemm.rs), whose K steps each round a single product into the accumulator. Here each
//! (partition, m, n) costs, per 8 outputs, a multiply and 3 fmas in f64 (8 lanes), half of a
//! two-uop f64 -> f32 conversion pair and an f32 add: about 0.9 vector uops per output-partition
//! against sgemm's 0.25 for the same 8 FLOPs, so on two FMA ports the kernel runs at roughly
//! 0.27 of sgemm at best (AVX-512; measured 0.17 of numpy sgemm for the whole instruction).

use super::psum::Acc;
use crate::numerics::float::Format;
use crate::numerics::mx::{round_wide_to_f32, scale_value, x4_code};
use crate::par;
use std::cell::RefCell;

/// One operand: `p` partitions of `w` x4 words, its element format and code width, and the
/// E8M0 scale codes `[p / 8][w]`.
pub struct Operand<'a> {
    pub words: &'a [u32],
    pub scales: &'a [u32],
    pub w: usize,
    pub fmt: Format,
    pub bits: u32,
}

/// Rows of A and columns of B per microkernel block.
const MR: usize = 8;
const NR: usize = 16;

/// One x4 element (partition, column) decoded: its 4 values (f32, exact), the block scale as
/// f64, the scale code, and whether the reference formula must be used (Inf/NaN element or
/// NaN scale).
#[derive(Clone, Copy)]
struct Entry {
    q: [f32; 4],
    scale: f64,
    code: u32,
    special: bool,
}

/// The element values of every code of a format (decoded once per instruction) and the
/// E8M0 scale values.
struct Tables {
    vals: Vec<f32>,
    /// `vals` as f64, indexed by the code byte (fp4 uses the first 16).
    vals64: Box<[f64; 256]>,
    scales: Box<[f64; 256]>,
}

impl Tables {
    fn new(o: &Operand) -> Tables {
        let vals: Vec<f32> = (0..1u32 << o.bits).map(|c| o.fmt.decode(c)).collect();
        Tables {
            vals64: Box::new(std::array::from_fn(|c| {
                vals.get(c).map_or(f64::NAN, |&v| v as f64)
            })),
            vals,
            scales: Box::new(std::array::from_fn(|c| scale_value(c as u32))),
        }
    }

    /// Element `i = partition * w + column` of `o`.
    #[inline]
    fn entry(&self, o: &Operand, i: usize) -> Entry {
        let word = o.words.get(i).copied().unwrap_or(0);
        let code = o
            .scales
            .get((i / o.w / 8) * o.w + i % o.w)
            .copied()
            .unwrap_or(0xFF)
            & 0xFF;
        let mut special = code == 0xFF;
        let mut q = [0f32; 4];
        for (k, v) in q.iter_mut().enumerate() {
            let c = x4_code(word, k as u32, o.bits) as usize;
            *v = self.vals.get(c).copied().unwrap_or(f32::NAN);
            special |= !v.is_finite();
        }
        let scale = self.scales.get(code as usize).copied().unwrap_or(f64::NAN);
        Entry {
            q,
            scale,
            code,
            special,
        }
    }
}

impl Entry {
    /// `q * scale` in f64: exact (small significands times a power of two in range).
    #[inline]
    fn scaled(&self) -> [f64; 4] {
        self.q.map(|v| v as f64 * self.scale)
    }
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
fn reference_term(a: &Entry, b: &Entry) -> f32 {
    if a.special || b.special {
        let scale = a.scale * b.scale;
        let mut s = 0f64;
        for q in 0..4 {
            s += a.q[q] as f64 * b.q[q] as f64;
        }
        (s * scale) as f32
    } else {
        // Finite elements as exact integer multiples of 2^-16 (numerics::mx::element_units).
        let mut s: i128 = 0;
        for q in 0..4 {
            s += element_units_of(a.q[q]) as i128 * element_units_of(b.q[q]) as i128;
        }
        // value = s * 2^-32 * 2^(sa - 127) * 2^(sb - 127)
        round_wide_to_f32(
            s < 0,
            s.unsigned_abs(),
            a.code as i32 + b.code as i32 - 254 - 32,
        )
    }
}

/// The fast term: the exact f64 sum of the scaled products, rounded once to f32.
#[inline(always)]
fn fast_term(a: &[f64; 4], b: [f64; 4]) -> f32 {
    (a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3]) as f32
}

#[derive(Default)]
struct Panels {
    /// `[M / MR][P][MR][4]` scaled stationary elements (zero for padding and special entries).
    a: Vec<f64>,
    /// `[M / MR][P]`: the row block holds a special entry at that partition.
    sa: Vec<bool>,
}

/// The `[M, N]` column sums of one `nc_matmul_mx`, panel-major `[N / NR][M][NR]` (the PSUM
/// write's panel layout), held in this thread's scratch (given back when dropped).
pub struct MxProduct {
    out: Vec<f32>,
    m: usize,
    n: usize,
    work: usize,
}

impl MxProduct {
    /// The result for the PSUM write.
    pub fn acc(&self) -> Acc<'_> {
        Acc {
            data: &self.out[..self.n.div_ceil(NR) * self.m * NR],
            m: self.m,
            n: self.n,
            nr: NR,
            work: self.work,
        }
    }

    /// The result row-major `[M, N]`.
    pub fn to_row_major(&self) -> Vec<f32> {
        let mut acc = vec![0f32; self.m * self.n];
        for (i, row) in acc.chunks_exact_mut(self.n.max(1)).enumerate() {
            for (jb, seg) in row.chunks_mut(NR).enumerate() {
                let at = (jb * self.m + i) * NR;
                seg.copy_from_slice(&self.out[at..at + seg.len()]);
            }
        }
        acc
    }
}

impl Drop for MxProduct {
    fn drop(&mut self) {
        let out = std::mem::take(&mut self.out);
        OUT.with(|c| c.replace(out));
    }
}

thread_local! {
    /// Per issuing thread: the dequantised stationary panels and the result, reused across
    /// instructions.
    static PANELS: RefCell<Panels> = RefCell::new(Panels::default());
    /// Per issuing thread: the result buffer of the last product (reused).
    static OUT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Per worker thread: one column block of the moving operand (`[P][4][NR]`, stays in L2)
    /// and its special flags.
    static STRIP: RefCell<(Vec<f64>, Vec<bool>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

fn grow<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// Dequantise block `blk` (columns `blk * width ..`) of `o` (`p` partitions): `pan[p][..]` gets
/// element (column j of the block, quad q) at `lane(j, q)` (padding and special entries zero,
/// every lane written); `special[p]` marks partitions where the block has a special entry.
#[allow(clippy::too_many_arguments)]
fn pack_block(
    o: &Operand,
    t: &Tables,
    p: usize,
    width: usize,
    blk: usize,
    lane: impl Fn(usize, usize) -> usize,
    pan: &mut [f64],
    special: &mut [bool],
) {
    let (words, scales, w, bits) = (o.words, o.scales, o.w, o.bits);
    let (j0, cols) = (blk * width, width.min(w - blk * width));
    let whole = words.len() >= p * w && scales.len() >= p.div_ceil(8) * w;
    let (vals, sct) = (&*t.vals64, &*t.scales);
    for (pp, (step, flag)) in pan.chunks_exact_mut(width * 4).zip(special).enumerate() {
        let mut any = false;
        let mut put = |j: usize, vals4: [f64; 4], sc: f64| {
            let s = vals4.map(|v| v * sc);
            // Finite scaled elements are at most 2^136, so the sum is finite unless one is Inf/NaN.
            let bad = !(s[0] + s[1] + s[2] + s[3]).is_finite();
            any |= bad;
            for (q, v) in s.into_iter().enumerate() {
                step[lane(j, q)] = if bad { 0.0 } else { v };
            }
        };
        if whole {
            let wrow = &words[pp * w + j0..pp * w + j0 + cols];
            let srow = &scales[pp / 8 * w + j0..pp / 8 * w + j0 + cols];
            for (j, (&word, &code)) in wrow.iter().zip(srow).enumerate() {
                let q =
                    std::array::from_fn(|q| vals[(x4_code(word, q as u32, bits) & 0xFF) as usize]);
                put(j, q, sct[(code & 0xFF) as usize]);
            }
        } else {
            for j in 0..cols {
                let e = t.entry(o, pp * w + j0 + j);
                put(j, e.q.map(|v| v as f64), e.scale);
            }
        }
        for j in cols..width {
            put(j, [0.0; 4], 0.0);
        }
        *flag = any;
    }
}

/// `pack_block` of a full `NR`-column block of the moving operand (layout `[p][4][NR]`), every
/// word and scale present: the same values, a quad at a time over the block's columns (the
/// hot pack: one per column block per instruction). False (nothing done) otherwise.
fn pack_moving_full(
    o: &Operand,
    t: &Tables,
    p: usize,
    jb: usize,
    pan: &mut [f64],
    special: &mut [bool],
) -> bool {
    let (w, bits, j0) = (o.w, o.bits, jb * NR);
    if o.words.len() < p * w || o.scales.len() < p.div_ceil(8) * w || j0 + NR > w {
        return false;
    }
    let mask = (1u32 << bits) - 1;
    let (vals, sct) = (&*t.vals64, &*t.scales);
    for (pp, (step, flag)) in pan.chunks_exact_mut(NR * 4).zip(special).enumerate() {
        let (Ok(wrow), Ok(srow)) = (
            <&[u32; NR]>::try_from(&o.words[pp * w + j0..pp * w + j0 + NR]),
            <&[u32; NR]>::try_from(&o.scales[pp / 8 * w + j0..pp / 8 * w + j0 + NR]),
        ) else {
            return false;
        };
        let sc: [f64; NR] = std::array::from_fn(|j| sct[(srow[j] & 0xFF) as usize]);
        let mut sum = [0f64; NR];
        for (q, out) in step.chunks_exact_mut(NR).enumerate() {
            let shift = bits * q as u32;
            for j in 0..NR {
                let v = vals[((wrow[j] >> shift) & mask) as usize] * sc[j];
                sum[j] += v;
                out[j] = v;
            }
        }
        // Finite scaled elements are at most 2^136: the sum is finite unless one is Inf/NaN.
        let mut any = false;
        for (j, s) in sum.iter().enumerate() {
            if !s.is_finite() {
                any = true;
                for q in 0..4 {
                    step[q * NR + j] = 0.0;
                }
            }
        }
        *flag = any;
    }
    true
}

/// `acc[m, n]` (`m = a.w`, `n = b.w`) over `p` partitions.
pub fn matmul_mx(p: usize, a: &Operand, b: &Operand) -> MxProduct {
    matmul_mx_on(super::simd::path(), p, a, b)
}

/// `matmul_mx` on a given SIMD path (the host must have it).
fn matmul_mx_on(path: super::simd::Path, p: usize, a: &Operand, b: &Operand) -> MxProduct {
    let (m, n) = (a.w, b.w);
    let (ta, tb) = (Tables::new(a), Tables::new(b));
    let fast = f64_exact(a.fmt, a.bits, b.fmt, b.bits);
    let (mb, nb) = (m.div_ceil(MR), n.div_ceil(NR));
    let work = 8 * p * m * n;
    let mut pn = PANELS.with(|c| c.take());
    let pa = grow(&mut pn.a, mb * p * MR * 4);
    let sa = grow(&mut pn.sa, mb * p);
    if fast {
        par::for_each_chunk_pair_mut(pa, p * MR * 4, sa, p, work, |ib, pan, sp| {
            pack_block(a, &ta, p, MR, ib, |j, q| j * 4 + q, pan, sp)
        });
    }
    let (pa, sa) = (&pn.a[..mb * p * MR * 4], &pn.sa[..mb * p]);
    // Tasks own blocks of NR output columns (the moving block dequantised once, kept in L2);
    // each row block walks the partitions in order (each element accumulates its partitions
    // 0..P-1), running clean partitions through the microkernel and stepping special ones (or
    // all, without the fast path) in scalar code.
    let mut out = OUT.with(|c| c.take());
    par::for_each_chunk_mut(grow(&mut out, nb * m * NR), m * NR, work, |jb, strip| {
        STRIP.with(|c| {
            let (pb, sb) = &mut *c.borrow_mut();
            let (pb, sb) = (grow(pb, p * NR * 4), grow(sb, p));
            if fast && !pack_moving_full(b, &tb, p, jb, pb, sb) {
                pack_block(b, &tb, p, NR, jb, |j, q| q * NR + j, pb, sb);
            }
            for (ib, rows) in strip.chunks_mut(MR * NR).enumerate() {
                let mut tile = [0f32; MR * NR];
                let tile = &mut tile;
                let mut p0 = 0;
                while p0 < p {
                    let mut p1 = p0;
                    while p1 < p && fast && !sa[ib * p + p1] && !sb[p1] {
                        p1 += 1;
                    }
                    if p1 > p0 {
                        let ka = &pa[(ib * p + p0) * MR * 4..(ib * p + p1) * MR * 4];
                        micro(path, p1 - p0, ka, &pb[p0 * NR * 4..p1 * NR * 4], tile);
                    }
                    if p1 < p {
                        let blk = Block { ib, jb, m, n, fast };
                        scalar_step(&blk, p1, (a, &ta), (b, &tb), tile);
                        p1 += 1;
                    }
                    p0 = p1;
                }
                rows.copy_from_slice(&tile[..rows.len()]);
            }
        })
    });
    PANELS.with(|c| c.replace(pn));
    MxProduct { out, m, n, work }
}

/// The output block a scalar step updates.
struct Block {
    ib: usize,
    jb: usize,
    m: usize,
    n: usize,
    fast: bool,
}

/// One partition `pp` of an output block in scalar code: `tile[r][c] += term`, the fast term
/// where both entries are ordinary and the fast path applies, else the reference term.
fn scalar_step(
    blk: &Block,
    pp: usize,
    (a, ta): (&Operand, &Tables),
    (b, tb): (&Operand, &Tables),
    tile: &mut [f32; MR * NR],
) {
    let rows = MR.min(blk.m - blk.ib * MR);
    let cols = NR.min(blk.n - blk.jb * NR);
    let eb: Vec<Entry> = (0..cols)
        .map(|c| tb.entry(b, pp * blk.n + blk.jb * NR + c))
        .collect();
    let sb: Vec<[f64; 4]> = eb.iter().map(Entry::scaled).collect();
    for r in 0..rows {
        let ea = ta.entry(a, pp * blk.m + blk.ib * MR + r);
        let sa = ea.scaled();
        for (c, (e, s)) in eb.iter().zip(&sb).enumerate() {
            let term = if blk.fast && !ea.special && !e.special {
                fast_term(&sa, *s)
            } else {
                reference_term(&ea, e)
            };
            tile[r * NR + c] += term;
        }
    }
}

/// `k` partition steps of one `MR x NR` block: for each step, `tile[r][c] += fl32(sum_q
/// a[r][q] * b[q][c])` (the sum exact in f64, see `f64_exact`).
fn micro(path: super::simd::Path, k: usize, a: &[f64], b: &[f64], tile: &mut [f32; MR * NR]) {
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: simd::path reports a path only when the host has its features; the slices
        // hold k steps of MR x 4 and 4 x NR values (asserted inside).
        super::simd::Path::Avx512 if std::arch::is_x86_feature_detected!("avx512vl") => {
            return unsafe { x86::micro_avx512(k, a, b, tile) };
        }
        // SAFETY: both paths imply AVX2 + FMA.
        super::simd::Path::Avx512 | super::simd::Path::Avx2Fma => {
            return unsafe { x86::micro_avx2(k, a, b, tile) }
        }
        super::simd::Path::Portable => {}
    }
    let _ = path;
    micro_body(k, a, b, tile)
}

/// The portable microkernel (also the AVX2 one, compiled with its features).
#[inline(always)]
fn micro_body(k: usize, a: &[f64], b: &[f64], tile: &mut [f32; MR * NR]) {
    for (av, bv) in a.chunks_exact(MR * 4).zip(b.chunks_exact(NR * 4)).take(k) {
        for (r, out) in tile.chunks_exact_mut(NR).enumerate() {
            let x = [av[r * 4], av[r * 4 + 1], av[r * 4 + 2], av[r * 4 + 3]];
            for (c, o) in out.iter_mut().enumerate() {
                *o += fast_term(&x, [bv[c], bv[NR + c], bv[2 * NR + c], bv[3 * NR + c]]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{micro_body, MR, NR};
    use std::arch::x86_64::*;

    /// (Rust never contracts `a * b + c` into an FMA; here every f64 step is exact anyway.)
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn micro_avx2(k: usize, a: &[f64], b: &[f64], tile: &mut [f32; MR * NR]) {
        micro_body(k, a, b, tile)
    }

    /// 8 x 16 block: per step the 4 x 16 moving values as 8 zmm (f64), per row the 4 stationary
    /// values broadcast; the exact f64 quad sums (a multiply and 3 fmas, every step exact)
    /// convert to f32 and add to 16 ymm accumulators.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub unsafe fn micro_avx512(k: usize, a: &[f64], b: &[f64], tile: &mut [f32; MR * NR]) {
        assert!(a.len() >= k * MR * 4 && b.len() >= k * NR * 4);
        let pt = tile.as_mut_ptr();
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for (r, row) in acc.iter_mut().enumerate() {
            row[0] = _mm256_loadu_ps(pt.add(r * NR));
            row[1] = _mm256_loadu_ps(pt.add(r * NR + 8));
        }
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        for kk in 0..k {
            let bp = pb.add(kk * NR * 4);
            let bq: [[__m512d; 2]; 4] = std::array::from_fn(|q| {
                [
                    _mm512_loadu_pd(bp.add(q * NR)),
                    _mm512_loadu_pd(bp.add(q * NR + 8)),
                ]
            });
            let ap = pa.add(kk * MR * 4);
            for (r, row) in acc.iter_mut().enumerate() {
                let x: [__m512d; 4] = std::array::from_fn(|q| _mm512_set1_pd(*ap.add(r * 4 + q)));
                for (h, o) in row.iter_mut().enumerate() {
                    let mut t = _mm512_mul_pd(x[0], bq[0][h]);
                    t = _mm512_fmadd_pd(x[1], bq[1][h], t);
                    t = _mm512_fmadd_pd(x[2], bq[2][h], t);
                    t = _mm512_fmadd_pd(x[3], bq[3][h], t);
                    *o = _mm256_add_ps(*o, _mm512_cvtpd_ps(t));
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            _mm256_storeu_ps(pt.add(r * NR), row[0]);
            _mm256_storeu_ps(pt.add(r * NR + 8), row[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::simd::Path;
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

    fn lcg(seed: u64) -> impl FnMut() -> u32 {
        let mut s = seed;
        move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 32) as u32
        }
    }

    #[test]
    fn fast_terms_equal_the_integer_formula() {
        // Random e4m3fn quads with extreme scales (subnormal and overflowing f32 results).
        let mut rnd = lcg(7);
        for _ in 0..20000 {
            let (wa, wb) = ([rnd()], [rnd()]);
            let (sa, sb) = ([rnd() % 255], [rnd() % 255]);
            let oa = Operand {
                words: &wa,
                scales: &sa,
                w: 1,
                fmt: E4M3FN,
                bits: 8,
            };
            let ob = Operand {
                words: &wb,
                scales: &sb,
                ..oa
            };
            let (ea, eb) = (
                Tables::new(&oa).entry(&oa, 0),
                Tables::new(&ob).entry(&ob, 0),
            );
            if ea.special || eb.special {
                continue;
            }
            let got = fast_term(&ea.scaled(), eb.scaled());
            let want = reference_term(&ea, &eb);
            assert_eq!(got.to_bits(), want.to_bits(), "{wa:?} {wb:?} {sa:?} {sb:?}");
        }
    }

    fn host_paths() -> Vec<Path> {
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
        paths
    }

    /// Every term by the reference formula, accumulated in partition order.
    fn naive(p: usize, a: &Operand, b: &Operand) -> Vec<f32> {
        let (ta, tb) = (Tables::new(a), Tables::new(b));
        let mut out = vec![0f32; a.w * b.w];
        for (i, o) in out.iter_mut().enumerate() {
            let (mi, nj) = (i / b.w, i % b.w);
            for pp in 0..p {
                let (ea, eb) = (ta.entry(a, pp * a.w + mi), tb.entry(b, pp * b.w + nj));
                *o += reference_term(&ea, &eb);
            }
        }
        out
    }

    #[test]
    fn every_path_equals_the_reference_terms() {
        // Ragged blocks, e4m3fn x e4m3fn and e4m3fn x fp4 (fast) and e5m2 x e5m2 (integer),
        // with NaN/Inf codes, NaN scales and E8M0 extremes sprinkled in; every path the host has.
        let (p, m, n): (usize, usize, usize) = (40, 19, 37);
        let mut rnd = lcg(11);
        for (fa, fb, bb) in [(E4M3FN, E4M3FN, 8), (E4M3FN, E2M1, 4), (E5M2, E5M2, 8)] {
            let wa: Vec<u32> = (0..p * m).map(|_| rnd()).collect();
            let wb: Vec<u32> = (0..p * n)
                .map(|_| rnd() & if bb == 4 { 0xFFFF } else { !0 })
                .collect();
            let sc = |r: &mut dyn FnMut() -> u32| match r() % 16 {
                0 => 0xFF,
                1 => 0,
                2 => 254,
                _ => 100 + r() % 50,
            };
            let sa: Vec<u32> = (0..p.div_ceil(8) * m).map(|_| sc(&mut rnd)).collect();
            let sb: Vec<u32> = (0..p.div_ceil(8) * n).map(|_| sc(&mut rnd)).collect();
            let oa = Operand {
                words: &wa,
                scales: &sa,
                w: m,
                fmt: fa,
                bits: 8,
            };
            let ob = Operand {
                words: &wb,
                scales: &sb,
                w: n,
                fmt: fb,
                bits: bb,
            };
            let want = naive(p, &oa, &ob);
            for path in host_paths() {
                let got = matmul_mx_on(path, p, &oa, &ob).to_row_major();
                // NaN payloads follow the host's (and the compiler's) operand order: NaN-ness only.
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan());
                assert!(same, "{fa:?} x {fb:?} {path:?}");
            }
        }
    }
}
