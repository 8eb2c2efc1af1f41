//! Which instruction-set path the kernels take on this host.
//!
//! The wheel targets baseline x86-64, so wide SIMD is chosen at run time
//! (`is_x86_feature_detected!`). Every path computes the same IEEE operations in the same
//! order per output element, so they give the same bits; `set_force_portable(true)` (or
//! `TRN3EMU_PORTABLE_KERNELS=1` at start-up) pins the portable path so tests can compare.

use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// x86-64 AVX-512F + BW (512-bit FMA; byte/word conversions for decoding).
    Avx512,
    /// x86-64 AVX2 + FMA3.
    Avx2Fma,
    /// Plain Rust (`f32::mul_add`: a software fma where the host has none).
    Portable,
}

/// 0: not decided yet, 1: follow the host, 2: forced portable.
static MODE: AtomicU8 = AtomicU8::new(0);

fn forced() -> bool {
    match MODE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let f = std::env::var("TRN3EMU_PORTABLE_KERNELS").is_ok_and(|v| v == "1");
            MODE.store(if f { 2 } else { 1 }, Ordering::Relaxed);
            f
        }
    }
}

/// Force the portable kernels (true) or let the host's features decide (false).
pub fn set_force_portable(on: bool) {
    MODE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// The widest path this host supports (unless forced portable).
pub fn path() -> Path {
    if forced() {
        return Path::Portable;
    }
    host_path()
}

#[cfg(target_arch = "x86_64")]
fn host_path() -> Path {
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
        Path::Avx512
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        Path::Avx2Fma
    } else {
        Path::Portable
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn host_path() -> Path {
    Path::Portable
}

/// Name of the path in use (for benchmarks and bug reports).
pub fn path_name() -> &'static str {
    match path() {
        Path::Avx512 => "avx512",
        Path::Avx2Fma => "avx2+fma",
        Path::Portable => "portable",
    }
}
