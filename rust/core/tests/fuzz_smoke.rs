//! The fuzz targets of `fuzz/` (coverage-guided with `cargo fuzz` on nightly; docs/fuzzing.md)
//! as a seeded smoke test on stable: each target gets a fixed number of pseudo-random inputs
//! from a fixed seed (same inputs every run), then replays every input a campaign found
//! (`fuzz/regressions/<target>/`). A finding panics, naming the input.

#[path = "../../../fuzz/src/lib.rs"]
mod targets;

use std::path::Path;

/// SplitMix64: the seeded source of inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn bytes(&mut self, max_len: usize) -> Vec<u8> {
        let n = (self.next() as usize) % (max_len + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Inputs per target: the smoke takes a few seconds each in CI (docs/fuzzing.md).
fn iterations(default: u64) -> u64 {
    std::env::var("TRN3EMU_FUZZ_SMOKE_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn replay_regressions(target: &str, f: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions")
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let data = std::fs::read(e.path()).unwrap();
        eprintln!("replaying {}", e.path().display());
        f(&data);
    }
}

/// Host seconds one input may take: a campaign (`TRN3EMU_FUZZ_SMOKE_ITERS` large) counts an
/// input over it as a finding, as libFuzzer's `-timeout=60` does.
const SLOW_SECS: f64 = 60.0;

fn smoke(target: &str, seed: u64, iters: u64, max_len: usize, f: fn(&[u8])) {
    replay_regressions(target, f);
    let mut rng = Rng(seed);
    let (mut slowest, mut slow_at, n) = (0f64, 0u64, iterations(iters));
    let t0 = std::time::Instant::now();
    for i in 0..n {
        let data = rng.bytes(max_len);
        let start = std::time::Instant::now();
        let r = std::panic::catch_unwind(|| f(&data));
        if r.is_err() {
            panic!("fuzz target {target}: input #{i} failed: {data:?}");
        }
        let secs = start.elapsed().as_secs_f64();
        if secs > slowest {
            (slowest, slow_at) = (secs, i);
        }
        assert!(
            secs <= SLOW_SECS,
            "fuzz target {target}: input #{i} took {secs:.1} s: {data:?}"
        );
    }
    eprintln!(
        "fuzz target {target}: {n} inputs in {:.0} s, slowest #{slow_at} {slowest:.3} s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn fuzz_smoke_decode() {
    smoke("decode", 1, 20_000, 512, targets::fuzz_decode);
}

#[test]
fn fuzz_smoke_parse() {
    smoke("parse", 2, 20_000, 512, targets::fuzz_parse);
}

#[test]
fn fuzz_smoke_sched() {
    smoke("sched", 3, 3_000, 1024, |d| {
        targets::fuzz_sched(d);
    });
}

/// The generator's programs mostly validate and are mostly non-empty: the sched target tests
/// the scheduler, not the validator.
#[test]
fn generator_makes_mostly_valid_programs() {
    let mut rng = Rng(4);
    let (mut kept, mut drawn, mut nonempty) = (0usize, 0usize, 0usize);
    for _ in 0..500 {
        let data = rng.bytes(1024);
        let (p, _, d) = targets::gen_program(&mut targets::Bytes::new(&data));
        kept += p
            .instrs
            .iter()
            .filter(|i| i.op.spec().name != "nop")
            .count()
            .min(d);
        drawn += d;
        nonempty += usize::from(!p.instrs.is_empty());
    }
    eprintln!("kept {kept} of {drawn} drawn instructions; {nonempty}/500 programs non-empty");
    assert!(nonempty > 400, "{nonempty}");
    assert!(kept * 3 > drawn, "{kept} of {drawn}");
}
