//! The fp32 -> narrow-float converter against an independent reference written here: f64
//! arithmetic with `round_ties_even` on the exact quotient by the target quantum, then an
//! explicit field-by-field encoding. `exhaustive_all_2_32` sweeps every fp32 bit pattern for
//! every format (about a minute per format in release: run with
//! `cargo test --release -p trn3emu-core --test numerics_exhaustive -- --ignored`); the default
//! test sweeps a dense strided subset.

use trn3emu_core::numerics::float::{Format, Special, BF16, E4M3, E4M3FN, E5M2, E8M0, FP16, TF32};

/// Independent reference: (ebits, mbits, bias, ieee_inf, fn_nan) describe the format.
struct Ref {
    mbits: i32,
    bias: i32,
    ebits: i32,
    ieee: bool, // top exponent reserved for Inf/NaN; else "fn" (only all-ones code is NaN)
}

impl Ref {
    fn of(f: Format) -> Self {
        Ref {
            mbits: f.mbits as i32,
            bias: f.bias,
            ebits: f.ebits as i32,
            ieee: f.special == Special::Ieee,
        }
    }
    fn emin(&self) -> i32 {
        1 - self.bias
    }
    fn max_value(&self) -> f64 {
        let emax_field = (1 << self.ebits) - if self.ieee { 2 } else { 1 };
        let top_mant = if self.ieee {
            (1 << self.mbits) - 1
        } else {
            (1 << self.mbits) - 2
        };
        (1.0 + top_mant as f64 / (1 << self.mbits) as f64) * 2f64.powi(emax_field - self.bias)
    }
    fn inf_code(&self) -> u32 {
        (((1 << self.ebits) - 1) << self.mbits) as u32
    }
    fn nan_code(&self) -> u32 {
        if self.ieee {
            self.inf_code() | (1 << (self.mbits - 1)) as u32
        } else {
            ((1 << (self.ebits + self.mbits)) - 1) as u32
        }
    }
    fn encode(&self, u: u32) -> u32 {
        let x = f32::from_bits(u);
        let sign = (u >> 31) << (self.ebits + self.mbits);
        if x.is_nan() {
            return sign | self.nan_code();
        }
        let overflow = if self.ieee {
            sign | self.inf_code()
        } else {
            sign | self.nan_code()
        };
        if x.is_infinite() {
            return overflow;
        }
        let a = (x as f64).abs();
        if a == 0.0 {
            return sign;
        }
        let e = exp2_floor(a).max(self.emin());
        let quantum = pow2(e - self.mbits);
        let r = (a / quantum).round_ties_even() * quantum;
        if r > self.max_value() {
            return overflow;
        }
        if r == 0.0 {
            return sign;
        }
        let er = exp2_floor(r);
        if er < self.emin() {
            let mant = (r / pow2(self.emin() - self.mbits)) as u32;
            sign | mant
        } else {
            let mant = (r / pow2(er - self.mbits)) as u32 - (1 << self.mbits);
            sign | (((er + self.bias) as u32) << self.mbits) | mant
        }
    }
}

/// floor(log2 a) for a positive normal f64 (every fp32 value is one), from its exponent field.
fn exp2_floor(a: f64) -> i32 {
    ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023
}

/// 2^e for the exponents used here (all normal in f64).
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// float8_e8m0fnu by the documented rule (docs/numerics.md), from the value in f64: the nearest
/// power 2^k, k in -127..=127, a tie (1.5 * 2^k) going up; below 2^-127 the smallest code (no
/// zero); zero, negatives, NaN, Inf and anything rounding past 2^127 -> NaN (0xFF).
fn e8m0_ref(u: u32) -> u32 {
    let x = f32::from_bits(u) as f64; // every fp32, subnormals included, is a normal f64
    if x.is_nan() || x <= 0.0 || x.is_infinite() {
        return 0xFF;
    }
    let e = ((x.to_bits() >> 52) & 0x7FF) as i32 - 1023; // 2^e <= x < 2^(e+1)
    let k = if x >= 1.5 * 2f64.powi(e) { e + 1 } else { e };
    match k.max(-127) {
        k if k > 127 => 0xFF,
        k => (k + 127) as u32,
    }
}

/// Every one of the 2^32 fp32 inputs (a few seconds: the reference is cheap).
#[test]
fn e8m0_all_2_32() {
    sweep_with(|u| E8M0.encode(u), e8m0_ref, "e8m0", 1);
}

fn sweep(f: Format, name: &str, step: u64) {
    let r = Ref::of(f);
    sweep_with(|u| f.encode(u), |u| r.encode(u), name, step);
}

fn sweep_with(
    got_of: impl Fn(u32) -> u32 + Sync,
    want_of: impl Fn(u32) -> u32 + Sync,
    name: &str,
    step: u64,
) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4) as u64;
    let bad: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (got_of, want_of) = (&got_of, &want_of);
                s.spawn(move || {
                    let mut bad = 0u64;
                    let mut i = t * step;
                    while i < 1u64 << 32 {
                        let u = i as u32;
                        let got = got_of(u);
                        let want = want_of(u);
                        if got != want {
                            if bad < 5 {
                                eprintln!("{name}: {u:#010x}: got {got:#x} want {want:#x}");
                            }
                            bad += 1;
                        }
                        i += threads * step;
                    }
                    bad
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(u64::MAX)).sum()
    });
    assert_eq!(bad, 0, "{name}: {bad} mismatches");
}

const FORMATS: [(Format, &str); 6] = [
    (BF16, "bf16"),
    (FP16, "fp16"),
    (TF32, "tf32"),
    (E4M3, "e4m3"),
    (E4M3FN, "e4m3fn"),
    (E5M2, "e5m2"),
];

#[test]
fn strided_sweep() {
    // 4099 is odd and prime: the subset hits every low-bit pattern class and every exponent.
    for (f, n) in FORMATS {
        sweep(f, n, 4099);
    }
}

#[test]
#[ignore = "2^32 inputs per format: run in release with --ignored"]
fn exhaustive_all_2_32() {
    for (f, n) in FORMATS {
        let t = std::time::Instant::now();
        sweep(f, n, 1);
        eprintln!(
            "{n}: all 2^32 inputs bit-identical ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
    }
}
