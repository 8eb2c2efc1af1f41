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

// ----------------------------------------------------------------------------------------
// The user-facing options: one name per option and per value, read by the front ends (the
// Python `Device(...)` keywords, `Device.numerics`) and the docs. Defaults: `Default` above.

impl RoundMode {
    pub const NAMES: &'static [&'static str] = &["rne", "stochastic"];
    pub fn name(self) -> &'static str {
        match self {
            RoundMode::Rne => "rne",
            RoundMode::Stochastic => "stochastic",
        }
    }
    /// By name; "nearest" and "sr" are accepted aliases.
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "rne" | "nearest" => Some(RoundMode::Rne),
            "stochastic" | "sr" => Some(RoundMode::Stochastic),
            _ => None,
        }
    }
}

impl Fp8Overflow {
    pub const NAMES: &'static [&'static str] = &["ieee", "saturate"];
    pub fn name(self) -> &'static str {
        match self {
            Fp8Overflow::Ieee => "ieee",
            Fp8Overflow::Saturate => "saturate",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "ieee" => Some(Fp8Overflow::Ieee),
            "saturate" => Some(Fp8Overflow::Saturate),
            _ => None,
        }
    }
}

impl MxScaleRule {
    pub const NAMES: &'static [&'static str] = &["nki", "ocp"];
    pub fn name(self) -> &'static str {
        match self {
            MxScaleRule::Nki => "nki",
            MxScaleRule::Ocp => "ocp",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "nki" => Some(MxScaleRule::Nki),
            "ocp" => Some(MxScaleRule::Ocp),
            _ => None,
        }
    }
}

/// Allowed values of `NumericsConfig::sr_bits`.
pub const SR_BITS_RANGE: std::ops::RangeInclusive<u32> = 1..=32;

/// The value of one option: a name (enumerated options) or an integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionValue {
    Name(&'static str),
    Int(u64),
}

/// One user-facing numerics option.
#[derive(Clone, Copy, Debug)]
pub struct OptionSpec {
    pub name: &'static str,
    /// The value names of an enumerated option (empty: an integer in `min..=max`).
    pub values: &'static [&'static str],
    pub min: u64,
    pub max: u64,
    /// The Neuron runtime environment variable that sets the default, if any.
    pub env: Option<&'static str>,
    pub doc: &'static str,
}

/// Every option, in `Device(...)` keyword order.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "rounding",
        values: RoundMode::NAMES,
        min: 0,
        max: 0,
        env: Some("NEURON_RT_STOCHASTIC_ROUNDING_EN"),
        doc: "output rounding of fp32 -> bf16/fp16/tf32/fp8 compute-engine casts",
    },
    OptionSpec {
        name: "seed",
        values: &[],
        min: 0,
        max: u64::MAX,
        env: Some("NEURON_RT_STOCHASTIC_ROUNDING_SEED"),
        doc: "stochastic-rounding seed, also the RNG power-on seed",
    },
    OptionSpec {
        name: "sr_bits",
        values: &[],
        min: *SR_BITS_RANGE.start() as u64,
        max: *SR_BITS_RANGE.end() as u64,
        env: None,
        doc: "random bits per stochastic-rounding decision",
    },
    OptionSpec {
        name: "fp8_overflow",
        values: Fp8Overflow::NAMES,
        min: 0,
        max: 0,
        env: None,
        doc: "finite fp8 overflow: ml_dtypes rule (ieee) or +-max (saturate)",
    },
    OptionSpec {
        name: "mx_scale",
        values: MxScaleRule::NAMES,
        min: 0,
        max: 0,
        env: None,
        doc: "quantize_mx scale rule: NKI 0.6 (nki) or the OCP MX sample (ocp)",
    },
];

fn bad_option(option: &str, got: impl std::fmt::Debug, allowed: &str) -> crate::EmuError {
    crate::error::fail(
        crate::ErrorKind::Value,
        "numerics_option_value",
        format!("{option} must be one of {allowed}, got {got:?}"),
    )
    .operand(option.to_string())
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl NumericsConfig {
    /// Every option's value, in `OPTIONS` order.
    pub fn values(&self) -> [(&'static str, OptionValue); 5] {
        [
            ("rounding", OptionValue::Name(self.rounding.name())),
            ("seed", OptionValue::Int(self.seed)),
            ("sr_bits", OptionValue::Int(self.sr_bits as u64)),
            ("fp8_overflow", OptionValue::Name(self.fp8_overflow.name())),
            ("mx_scale", OptionValue::Name(self.mx_scale.name())),
        ]
    }

    /// Set an enumerated option by value name (`rounding`, `fp8_overflow`, `mx_scale`).
    pub fn set_name(&mut self, option: &str, value: &str) -> crate::Result<()> {
        match option {
            "rounding" => {
                self.rounding = RoundMode::from_name(value)
                    .ok_or_else(|| bad_option(option, value, &quoted(RoundMode::NAMES)))?
            }
            "fp8_overflow" => {
                self.fp8_overflow = Fp8Overflow::from_name(value)
                    .ok_or_else(|| bad_option(option, value, &quoted(Fp8Overflow::NAMES)))?
            }
            "mx_scale" => {
                self.mx_scale = MxScaleRule::from_name(value)
                    .ok_or_else(|| bad_option(option, value, &quoted(MxScaleRule::NAMES)))?
            }
            _ => return Err(unknown_option(option)),
        }
        Ok(())
    }

    /// Set an integer option (`seed`, `sr_bits`).
    pub fn set_int(&mut self, option: &str, value: u64) -> crate::Result<()> {
        match option {
            "seed" => self.seed = value,
            "sr_bits" => match u32::try_from(value) {
                Ok(v) if SR_BITS_RANGE.contains(&v) => self.sr_bits = v,
                _ => {
                    let (lo, hi) = (SR_BITS_RANGE.start(), SR_BITS_RANGE.end());
                    return Err(bad_option(option, value, &format!("{lo}..={hi}")));
                }
            },
            _ => return Err(unknown_option(option)),
        }
        Ok(())
    }
}

fn unknown_option(option: &str) -> crate::EmuError {
    let names: Vec<&str> = OPTIONS.iter().map(|o| o.name).collect();
    crate::error::fail(
        crate::ErrorKind::Value,
        "unknown_numerics_option",
        format!(
            "unknown numerics option {option:?} (one of {})",
            names.join(", ")
        ),
    )
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

    #[test]
    fn options_round_trip_by_name() {
        let mut c = NumericsConfig::default();
        for o in OPTIONS {
            for v in o.values {
                c.set_name(o.name, v).unwrap();
                let got = c.values().iter().find(|(n, _)| *n == o.name).map(|x| x.1);
                assert_eq!(got, Some(OptionValue::Name(v)));
            }
        }
        assert_eq!(
            c.set_name("rounding", "up").unwrap_err().rule,
            "numerics_option_value"
        );
        assert_eq!(
            c.set_int("sr_bits", 0).unwrap_err().rule,
            "numerics_option_value"
        );
        assert_eq!(
            c.set_int("sr_bits", 33).unwrap_err().rule,
            "numerics_option_value"
        );
        assert_eq!(
            c.set_int("nope", 1).unwrap_err().rule,
            "unknown_numerics_option"
        );
        c.set_int("sr_bits", 7).unwrap();
        assert_eq!(c.sr_bits, 7);
        let names: Vec<_> = NumericsConfig::default().values().map(|(n, _)| n).to_vec();
        let specs: Vec<_> = OPTIONS.iter().map(|o| o.name).collect();
        assert_eq!(names, specs);
    }
}
