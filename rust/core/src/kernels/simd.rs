//! Which instruction-set path the kernels take on this host.
//!
//! The wheel targets baseline x86-64, so wide SIMD is chosen at run time
//! (`is_x86_feature_detected!`). Every path computes the same IEEE operations in the same
//! order per output element, so they give the same bits; `set_limit` (or
//! `TRN3EMU_PORTABLE_KERNELS=1` at start-up) narrows the choice so tests can compare paths.

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

/// The widest path allowed: 0 not decided yet, 1 portable, 2 AVX2+FMA, 3 any (the host's best).
static CAP: AtomicU8 = AtomicU8::new(0);

fn cap() -> u8 {
    match CAP.load(Ordering::Relaxed) {
        0 => {
            let c = if std::env::var("TRN3EMU_PORTABLE_KERNELS").is_ok_and(|v| v == "1") {
                1
            } else {
                3
            };
            CAP.store(c, Ordering::Relaxed);
            c
        }
        c => c,
    }
}

/// Limit the kernels to at most `limit` (None: the host's best). Paths the host lacks are
/// never used; this only narrows, for tests that compare paths.
pub fn set_limit(limit: Option<Path>) {
    CAP.store(
        match limit {
            Some(Path::Portable) => 1,
            Some(Path::Avx2Fma) => 2,
            _ => 3,
        },
        Ordering::Relaxed,
    );
}

/// The widest path this host supports within the limit.
pub fn path() -> Path {
    match (cap(), host_path()) {
        (1, _) => Path::Portable,
        (2, Path::Avx512) => Path::Avx2Fma,
        (_, p) => p,
    }
}

/// Parse a path name as `path_name` prints it.
pub fn parse(name: &str) -> Option<Path> {
    match name {
        "avx512" => Some(Path::Avx512),
        "avx2+fma" => Some(Path::Avx2Fma),
        "portable" => Some(Path::Portable),
        _ => None,
    }
}

/// Whether this host can run `p`.
pub fn host_supports(p: Path) -> bool {
    match (p, host_path()) {
        (Path::Portable, _) => true,
        (Path::Avx2Fma, h) => h != Path::Portable,
        (Path::Avx512, h) => h == Path::Avx512,
    }
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

/// Rows ahead of the one being processed whose bytes a row-by-row copy or map asks for with
/// `prefetch`: every partition row of an on-chip tile is in its own host page, where the
/// hardware prefetchers do not follow, so each short row began with a demand miss.
pub const PREFETCH_ROWS_AHEAD: usize = 2;

/// Rows longer than this are not asked for: within a long row the hardware prefetchers keep
/// up, and asking for whole 64 KiB rows ahead slowed a [128, 16384] fp32 DMA by ~4 %.
pub const PREFETCH_SHORT_ROW: usize = 2048;

/// `prefetch` of a row ahead when it is short (`PREFETCH_SHORT_ROW`), else nothing.
#[inline]
pub fn prefetch_short_row(row: &[u8]) {
    if row.len() <= PREFETCH_SHORT_ROW {
        prefetch(row);
    }
}

/// Hint the cache to fetch `bytes` (no architectural effect). Partition rows sit a partition's
/// size plus 64 bytes apart (memory/onchip.rs), each in pages of its own: a stride the hardware
/// prefetchers do not follow.
pub fn prefetch(bytes: &[u8]) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: prefetch is a hint on a valid address; it never faults or changes memory.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                line.as_ptr() as *const i8,
                std::arch::x86_64::_MM_HINT_T0,
            )
        };
    }
}
