//! The rounding check the table-driven kernels share (log.rs, rsqrt.rs): an f64 approximation
//! is kept, rounded to fp32, where no fp32 rounding midpoint lies within its error of it, and
//! the exact f64 formula is evaluated for the rare others.

/// 1 if the f64 `v`'s fp32 rounding may differ from that of a value within 2^th_log2 f64 ulps
/// of it (its 29 low bits within 2^th_log2 of the half-way pattern 2^28), else 0; for fp32
/// normal results.
#[inline(always)]
pub fn near_midpoint(v: f64, th_log2: u32) -> u32 {
    // the low 32 bits only (two-lane SIMD has no 64-bit compare before SSE4.1)
    let c = (v.to_bits() as u32).wrapping_add((1 << 28) + (1 << th_log2));
    ((c & ((1 << 29) - (1 << (th_log2 + 1)))) == 0) as u32
}

/// `dst[i] = f(src[i] * scale + bias)` over `n` values, for y outside `[lo, hi]` `outside(y)`
/// (a cold lane-by-lane pass) or, with `None`, the canonical NaN; where
/// `approx(y)` is within 2^th_log2 - 1 f64 ulps of the f64 value `exact` rounds, for every `y`
/// in the range whose result is an fp32 normal: `approx` rounded where `near_midpoint` clears
/// it, else (and for NaN inputs) `exact`. Generic code the callers compile per SIMD path.
/// Chunks of `W` lanes: the near-midpoint flags are `u32` lanes OR-reduced, and the rare chunk
/// with a flagged lane is redone lane by lane.
///
/// # Safety
/// `src` and `dst` valid for `n` fp32 values (unaligned), either equal or disjoint.
#[inline(always)]
pub unsafe fn map(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    (scale, bias): (f32, f32),
    (lo, hi): (f32, f32),
    (approx, th_log2, exact): (impl Fn(f32) -> f64, u32, impl Fn(f32) -> f32),
    outside: Option<impl Fn(f32) -> f32>,
) {
    let nan_outside = outside.is_none();
    const W: usize = 16;
    let load = |i: usize| {
        // SAFETY: i < n; the callers pass pointers valid for n (unaligned) values
        unsafe { src.add(i).read_unaligned() * scale + bias }
    };
    let one = |y: f32| {
        if !(y < lo || y > hi) {
            let r = approx(y);
            if near_midpoint(r, th_log2) != 0 || y.is_nan() {
                exact(y)
            } else {
                r as f32
            }
        } else {
            match &outside {
                Some(g) => g(y),
                None => f32::NAN,
            }
        }
    };
    let mut i = 0;
    while i + W <= n {
        let mut out = [0f32; W];
        let mut any = 0u32;
        for (j, o) in out.iter_mut().enumerate() {
            let y = load(i + j);
            let inside = !((y < lo) | (y > hi));
            let r = approx(y);
            any |= ((near_midpoint(r, th_log2) | y.is_nan() as u32) & inside as u32)
                | (!inside & !nan_outside) as u32;
            *o = if inside { r as f32 } else { f32::NAN };
        }
        if any != 0 {
            // the rare chunk with a near lane: each lane again, one at a time
            for (j, o) in out.iter_mut().enumerate() {
                *o = one(load(i + j));
            }
        }
        for (j, o) in out.iter().enumerate() {
            // SAFETY: i + j < n; src == dst is read above before this write
            unsafe { dst.add(i + j).write_unaligned(*o) };
        }
        i += W;
    }
    for j in i..n {
        let r = one(load(j));
        // SAFETY: j < n
        unsafe { dst.add(j).write_unaligned(r) };
    }
}

/// `out[j] = exact(ys[j])` for the lanes `j` set in `redo` (the intrinsics kernels' rare near
/// or NaN lanes, out of their hot loop).
///
/// # Safety
/// `out` valid for `ys.len()` fp32 values (unaligned).
#[cold]
#[inline(never)]
pub unsafe fn redo_lanes(ys: &[f32], redo: u32, out: *mut f32, exact: impl Fn(f32) -> f32) {
    for (j, &v) in ys.iter().enumerate() {
        if redo >> j & 1 != 0 {
            // SAFETY: j < ys.len(), the caller's bound
            unsafe { out.add(j).write_unaligned(exact(v)) };
        }
    }
}
