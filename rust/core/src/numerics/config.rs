//! The device-level numerics configuration (rounding mode, seed, random bits, fp8 overflow
//! policy, MX scale rule) and the per-instruction `Rounder` that applies it to output casts.
//!
//! Stochastic rounding draws its random bits from a counter-based hash of
//! (seed, core, run, instruction index, element index), so results depend only on the seed and
//! the program, never on host threads or on the order in which engines happen to execute.

use super::float::Format;
use super::{format_of, from_f32};
use crate::isa::DType;

/// Output rounding of fp32 -> narrower float casts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundMode {
    /// Round to nearest, ties to even (the hardware default).
    Rne,
    /// Stochastic rounding: round up with probability (dropped fraction), resolved with
    /// `NumericsConfig::sr_bits` random bits.
    Stochastic,
}

/// What a finite fp8 value beyond the format's largest finite becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Overflow {
    /// ml_dtypes behaviour (default): e4m3 / e5m2 -> ±Inf, e4m3fn -> NaN.
    Ieee,
    /// Saturate to ±max (finite overflow only; ±Inf and NaN inputs keep their encoding).
    Saturate,
}

/// The `quantize_mx` scale rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MxScaleRule {
    /// NKI 0.6 / Neuron 2.32: X = 2^(floor(log2 amax) - (Emax - 1)) (2x the OCP sample).
    Nki,
    /// OCP MX v1.0 sample algorithm: X = 2^(floor(log2 amax) - Emax).
    Ocp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NumericsConfig {
    pub rounding: RoundMode,
    /// Seed of the stochastic-rounding bit stream (and the initial RNG states).
    pub seed: u64,
    /// Random bits per stochastic rounding decision, 1..=32 (32: exact SR up to 2^-32 of an ulp).
    pub sr_bits: u32,
    pub fp8_overflow: Fp8Overflow,
    pub mx_scale: MxScaleRule,
}

impl Default for NumericsConfig {
    fn default() -> Self {
        NumericsConfig {
            rounding: RoundMode::Rne,
            seed: 0,
            sr_bits: 32,
            fp8_overflow: Fp8Overflow::Ieee,
            mx_scale: MxScaleRule::Nki,
        }
    }
}

impl NumericsConfig {
    /// Defaults updated from the Neuron runtime's own switches:
    /// `NEURON_RT_STOCHASTIC_ROUNDING_EN` (`1`/`true` enables SR) and
    /// `NEURON_RT_STOCHASTIC_ROUNDING_SEED` (an unsigned integer; unparsable values are ignored).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Self {
        let mut c = NumericsConfig::default();
        if let Some(v) = get("NEURON_RT_STOCHASTIC_ROUNDING_EN") {
            let v = v.trim().to_ascii_lowercase();
            if v == "1" || v == "true" || v == "yes" {
                c.rounding = RoundMode::Stochastic;
            }
        }
        if let Some(v) = get("NEURON_RT_STOCHASTIC_ROUNDING_SEED") {
            if let Ok(s) = v.trim().parse::<u64>() {
                c.seed = s;
            }
        }
        c
    }
}

/// SplitMix64 finaliser: a strong 64-bit mixing function (Steele, Lea, Flood 2014).
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The rounding context of one executing instruction.
#[derive(Clone, Copy, Debug)]
pub struct Rounder {
    pub cfg: NumericsConfig,
    /// mix64 of (seed, core, run, instruction): element random bits are mix64(key + element).
    key: u64,
    /// Stochastic rounding applies (compute engines only; DMA casts stay RNE).
    sr: bool,
}

impl Default for Rounder {
    fn default() -> Self {
        Rounder::new(NumericsConfig::default(), 0, 0, 0, false)
    }
}

impl Rounder {
    pub fn new(cfg: NumericsConfig, core: u8, run: u64, instr: u32, compute: bool) -> Self {
        let key = mix64(
            mix64(cfg.seed ^ 0x5452_4E33_5352_0000)
                ^ mix64(((core as u64) << 56) ^ (run << 24) ^ instr as u64),
        );
        Rounder {
            cfg,
            key,
            sr: compute && cfg.rounding == RoundMode::Stochastic,
        }
    }

    /// True when casts are plain RNE with the ml_dtypes overflow rule (the fast paths apply).
    pub fn is_default(&self) -> bool {
        !self.sr && self.cfg.fp8_overflow == Fp8Overflow::Ieee
    }

    /// The random word for element `i` of this instruction's output.
    #[inline]
    pub fn rand(&self, i: u64) -> u32 {
        (mix64(self.key.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))) >> 32) as u32
    }

    /// Encode one fp32 value as `fmt` under this configuration; `i` is the element index.
    #[inline]
    pub fn encode_fmt(&self, fmt: Format, x: f32, i: u64, fp8: bool) -> u32 {
        let sat = fp8 && self.cfg.fp8_overflow == Fp8Overflow::Saturate;
        let (rbits, r) = if self.sr {
            (self.cfg.sr_bits.clamp(1, 32), self.rand(i))
        } else {
            (0, 0)
        };
        fmt.encode_full(x.to_bits(), rbits, r, sat)
    }

    /// fp32 value -> raw bits of `dt`; `i` is the element index within the instruction output.
    #[inline]
    pub fn from_f32(&self, dt: DType, x: f32, i: u64) -> u32 {
        let fp8 = matches!(
            dt,
            DType::Float8E4m3 | DType::Float8E4m3fn | DType::Float8E5m2
        );
        let narrow = fp8 || matches!(dt, DType::Bfloat16 | DType::Float16 | DType::Tfloat32);
        match format_of(dt) {
            Some(f) if narrow => {
                let c = self.encode_fmt(f, x, i, fp8);
                if dt == DType::Tfloat32 {
                    c << 13
                } else {
                    c
                }
            }
            _ => from_f32(dt, x),
        }
    }

    /// Encode fp32 values into a packed byte buffer of `dt` elements.
    pub fn encode_all(&self, dt: DType, vals: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; vals.len() * dt.size()];
        super::bulk::encode_run(self, dt, &mut out, 0, 1, vals, 0);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_switches() {
        let c = NumericsConfig::from_env(|k| match k {
            "NEURON_RT_STOCHASTIC_ROUNDING_EN" => Some("1".into()),
            "NEURON_RT_STOCHASTIC_ROUNDING_SEED" => Some("42".into()),
            _ => None,
        });
        assert_eq!(c.rounding, RoundMode::Stochastic);
        assert_eq!(c.seed, 42);
        let d = NumericsConfig::from_env(|_| None);
        assert_eq!(d, NumericsConfig::default());
    }

    #[test]
    fn saturate_policy() {
        let cfg = NumericsConfig {
            fp8_overflow: Fp8Overflow::Saturate,
            ..Default::default()
        };
        let r = Rounder::new(cfg, 0, 0, 0, true);
        assert_eq!(r.from_f32(DType::Float8E4m3fn, 1000.0, 0), 0x7E);
        assert_eq!(r.from_f32(DType::Float8E4m3fn, -1000.0, 0), 0xFE);
        assert_eq!(r.from_f32(DType::Float8E4m3, 300.0, 0), 0x77);
        assert_eq!(r.from_f32(DType::Float8E5m2, 1e6, 0), 0x7B);
        assert_eq!(r.from_f32(DType::Float8E5m2, f32::INFINITY, 0), 0x7C);
        // bf16 is not affected by the fp8 policy
        assert_eq!(r.from_f32(DType::Bfloat16, f32::MAX, 0), 0x7F80);
    }

    #[test]
    fn sr_keys_differ() {
        let cfg = NumericsConfig {
            rounding: RoundMode::Stochastic,
            ..Default::default()
        };
        let a = Rounder::new(cfg, 0, 0, 0, true);
        let b = Rounder::new(cfg, 0, 0, 1, true);
        assert_ne!(a.rand(0), b.rand(0));
        assert_ne!(a.rand(0), a.rand(1));
        assert!(!Rounder::new(cfg, 0, 0, 0, false).sr);
    }
}
