//! What the two x86 exp kernels (exp_avx2.rs, exp_avx512.rs) share: the thresholds of their
//! decision tests and the function codes they are instantiated for. Kept in one place because
//! both kernels must decide the same lanes to give the same bits (exp_avx512.rs's module doc
//! derives the figures).

use super::exp::Func;

/// log2 of the distance (f64 ulps) from the fp32 half-way pattern below which a lane is not
/// decided by the bit test.
pub(super) const TH_LOG2: u32 = 13;
/// Half-width of the interval check for the lanes the bit test leaves.
pub(super) const D: f64 = 1.0 / (1u64 << 39) as f64;
/// exp inputs from which the result is an fp32 normal for sure (e^-87 > 2^-126 (1 + 2^-40)), and
/// below which it rounds to +0 for sure (e^-104 < 2^-150 (1 - 2^-40)).
pub(super) const EXP_NORMAL_X: f32 = -87.0;
pub(super) const EXP_TINY_X: f32 = -104.0;
/// Sigmoid's result is an fp32 normal from x >= -87 on too (e^-87 / (1 + e^-87) > 2^-126);
/// silu's when also |x| >= `SMALL_X` = 2^-100 (|silu(x)| >= |x| / 4 for |x| <= 1, > 2^-120 for
/// x in [-87, -1]); tanh's for |x| >= 2^-100, and below that tanh(x) rounds to x itself (the
/// relative distance x^2 / 3 < 2^-200 is far inside half an fp32 spacing), which is the value
/// the Taylor branch gives exactly (`fma(x z, p, x)` with |x z p| < 2^-300 < ulp(x) / 2).
pub(super) const SMALL_X: f32 = f32::from_bits(0x0d80_0000); // 2^-100

/// Function codes: the kernels' loops are generic over a `const F: u8` so each function gets
/// its own straight-line loop.
pub(super) const EXP: u8 = 0;
pub(super) const SIGMOID: u8 = 1;
pub(super) const SILU: u8 = 2;
pub(super) const TANH: u8 = 3;

pub(super) fn func(code: u8) -> Func {
    match code {
        EXP => Func::Exp,
        SIGMOID => Func::Sigmoid,
        SILU => Func::Silu,
        _ => Func::Tanh,
    }
}

/// The loop drivers both x86 kernels share, written once: `affine`, `run` (two steps per
/// iteration with one test of both, then single steps, then the remainder through a padded
/// buffer), `affine_in`, and the entry points `map_affine_raw`, `map` and `map_bytes`. Each kernel
/// module supplies its register width (`width`, the `mask` type of one bit per lane), its target
/// features and the fp32 vector operations, plus `K`, `k()`, `step`, `tiny_zero` and `fix` in its
/// own scope, and the prefetch offsets (elements ahead) of the paired and single loops. Expands
/// to the same code the two modules held before (the kernels' instruction streams are
/// unchanged).
macro_rules! loop_drivers {
    (
        width: $w:literal,
        mask: $mask:ty,
        vector: $v:ty,
        features: $feat:literal,
        host: $host:literal,
        ops: ($load:ident, $store:ident, $set1:ident, $mul:ident, $add:ident),
        prefetch: [$($p2:literal),*], [$($p1:literal),*] $(,)?
    ) => {
        /// The affine step's vector operations (the ones `Affine::ops` keeps). A function, not a
        /// closure: a closure would not inherit the caller's target features.
        #[inline(always)]
        unsafe fn affine<const MUL: bool, const ADD: bool>(x: $v, s: $v, b: $v) -> $v {
            let x = if MUL { $mul(x, s) } else { x };
            if ADD {
                $add(x, b)
            } else {
                x
            }
        }

        #[inline(always)]
        unsafe fn run<const F: u8, const MUL: bool, const ADD: bool>(
            aff: Affine,
            src: *const f32,
            dst: *mut f32,
            len: usize,
            slow: &impl Fn(f32) -> f32,
        ) -> usize {
            let f = func(F);
            let k = k();
            let (s, b) = ($set1(aff.scale), $set1(aff.bias));
            let pre = |x: $v| affine::<MUL, ADD>(x, s, b);
            let mut fallbacks = 0;
            let mut i = 0;
            // two steps per iteration (more independent work in flight, less loop overhead on
            // the vector ports), one test of both
            while i + 2 * $w <= len {
                $(_mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(i + $p2) as *const i8);)*
                $(_mm_prefetch::<_MM_HINT_ET0>(dst.wrapping_add(i + $p2) as *const i8);)*
                let raw = [$load(src.add(i)), $load(src.add(i + $w))];
                let ok0 = step(f, &k, pre(raw[0]), dst.add(i));
                let ok1 = step(f, &k, pre(raw[1]), dst.add(i + $w));
                if ok0 & ok1 != <$mask>::MAX {
                    for (h, ok) in [ok0, ok1].into_iter().enumerate() {
                        let ok = tiny_zero::<F>(&k, pre(raw[h]), ok, dst.add(i + $w * h));
                        if ok != <$mask>::MAX {
                            let mut xs = [0f32; $w];
                            $store(xs.as_mut_ptr(), raw[h]);
                            let (x, d) = (xs.map(|x| aff.scalar(x)), dst.add(i + $w * h));
                            fallbacks += fix(f, &x, ok, $w, d, slow);
                        }
                    }
                }
                i += 2 * $w;
            }
            while i + $w <= len {
                // the raw inputs stay in a register: dst may be src
                $(_mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(i + $p1) as *const i8);)*
                $(_mm_prefetch::<_MM_HINT_ET0>(dst.wrapping_add(i + $p1) as *const i8);)*
                let raw = $load(src.add(i));
                let ok = step(f, &k, pre(raw), dst.add(i));
                let ok = tiny_zero::<F>(&k, pre(raw), ok, dst.add(i));
                if ok != <$mask>::MAX {
                    let mut xs = [0f32; $w];
                    $store(xs.as_mut_ptr(), raw);
                    fallbacks += fix(f, &xs.map(|x| aff.scalar(x)), ok, $w, dst.add(i), slow);
                }
                i += $w;
            }
            let n = len - i;
            if n > 0 {
                let mut xs = [0f32; $w];
                for (j, v) in xs.iter_mut().enumerate().take(n) {
                    *v = aff.scalar(src.add(i + j).read_unaligned());
                }
                let mut ys = [0f32; $w];
                let ok = step(f, &k, $load(xs.as_ptr()), ys.as_mut_ptr());
                if ok | !((1u32 << n) - 1) as $mask != <$mask>::MAX {
                    fallbacks += fix(f, &xs, ok, n, ys.as_mut_ptr(), slow);
                }
                for (j, y) in ys.iter().enumerate().take(n) {
                    dst.add(i + j).write_unaligned(*y);
                }
            }
            fallbacks
        }

        /// `run` for the function code `F` with the affine step's operations chosen once per
        /// call.
        #[inline(always)]
        unsafe fn affine_in<const F: u8>(
            aff: Affine,
            src: *const f32,
            dst: *mut f32,
            len: usize,
            slow: &impl Fn(f32) -> f32,
        ) -> usize {
            match aff.ops(func(F)) {
                (false, false) => run::<F, false, false>(aff, src, dst, len, slow),
                (false, true) => run::<F, false, true>(aff, src, dst, len, slow),
                (true, false) => run::<F, true, false>(aff, src, dst, len, slow),
                (true, true) => run::<F, true, true>(aff, src, dst, len, slow),
            }
        }

        /// `dst[i] = f(src[i] * scale + bias)` (the fp32 multiply and add rounded separately);
        /// `src` and `dst` of `len` elements, equal or disjoint. Returns how many elements took
        /// `slow`.
        ///
        /// # Safety
        #[doc = concat!("The host must have ", $host, "; the pointers valid for `len` elements.")]
        #[target_feature(enable = $feat)]
        pub unsafe fn map_affine_raw(
            f: Func,
            aff: Affine,
            src: *const f32,
            dst: *mut f32,
            len: usize,
            slow: impl Fn(f32) -> f32,
        ) -> usize {
            match f {
                Func::Exp => affine_in::<EXP>(aff, src, dst, len, &slow),
                Func::Sigmoid => affine_in::<SIGMOID>(aff, src, dst, len, &slow),
                Func::Silu => affine_in::<SILU>(aff, src, dst, len, &slow),
                Func::Tanh => affine_in::<TANH>(aff, src, dst, len, &slow),
            }
        }

        /// `v[i] = f(pre(v[i]))` (exp.rs's `map` contract) for any `pre`. Returns how many
        /// elements took `slow`.
        ///
        /// # Safety
        #[doc = concat!("The host must have ", $host, ".")]
        #[target_feature(enable = $feat)]
        pub unsafe fn map(
            f: Func,
            v: &mut [f32],
            pre: impl Fn(f32) -> f32,
            slow: impl Fn(f32) -> f32,
        ) -> usize {
            let mut fallbacks = 0;
            for c in v.chunks_mut(256) {
                let mut xs = [0f32; 256];
                for (x, e) in xs.iter_mut().zip(c.iter()) {
                    *x = pre(*e);
                }
                let p = c.as_mut_ptr();
                fallbacks += map_affine_raw(f, Affine::IDENTITY, xs.as_ptr(), p, c.len(), &slow);
            }
            fallbacks
        }

        /// `dst[i] = f(pre(src[i]))` over little-endian fp32 bytes (equal lengths, multiples of
        /// 4).
        ///
        /// # Safety
        #[doc = concat!("The host must have ", $host, ".")]
        #[target_feature(enable = $feat)]
        pub unsafe fn map_bytes(
            f: Func,
            src: &[u8],
            dst: &mut [u8],
            pre: impl Fn(f32) -> f32,
            slow: impl Fn(f32) -> f32,
        ) -> usize {
            let mut fallbacks = 0;
            for (s, d) in src.chunks(1024).zip(dst.chunks_mut(1024)) {
                let mut xs = [0f32; 256];
                let n = s.len() / 4;
                for (x, e) in xs.iter_mut().zip(s.chunks_exact(4)) {
                    *x = pre(f32::from_le_bytes(e.try_into().unwrap()));
                }
                let p = d.as_mut_ptr() as *mut f32;
                fallbacks += map_affine_raw(f, Affine::IDENTITY, xs.as_ptr(), p, n, &slow);
            }
            fallbacks
        }
    };
}
pub(super) use loop_drivers;
