//! One parametric mini-float converter on fp32 bit patterns (integer arithmetic only), so every
//! narrow float type is the same code with different parameters. Round-to-nearest-even; the
//! overflow and NaN rules follow each format's special-value style (see `Special`), which matches
//! ml_dtypes (reference numerics §3.3–3.5).

/// How a format spends its top codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// IEEE-like: all-ones exponent = Inf (mantissa 0) or NaN. Overflow -> ±Inf.
    Ieee,
    /// "fn" (OCP E4M3): no Inf, only S.1111.111 is NaN. Overflow and ±Inf -> NaN.
    Fn,
    /// Finite only (FP4/FP6): every code is a number. Overflow and ±Inf saturate to ±max.
    Finite,
    /// E8M0 scale: unsigned, no zero; 0xFF is NaN; code 0 = 2^-127.
    E8m0,
}

/// A binary floating-point format: `ebits` exponent bits, `mbits` mantissa bits, `bias`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    pub ebits: u32,
    pub mbits: u32,
    pub bias: i32,
    pub special: Special,
}

pub const BF16: Format = Format {
    ebits: 8,
    mbits: 7,
    bias: 127,
    special: Special::Ieee,
};
pub const FP16: Format = Format {
    ebits: 5,
    mbits: 10,
    bias: 15,
    special: Special::Ieee,
};
pub const TF32: Format = Format {
    ebits: 8,
    mbits: 10,
    bias: 127,
    special: Special::Ieee,
};
pub const E4M3: Format = Format {
    ebits: 4,
    mbits: 3,
    bias: 7,
    special: Special::Ieee,
};
pub const E4M3FN: Format = Format {
    ebits: 4,
    mbits: 3,
    bias: 7,
    special: Special::Fn,
};
pub const E5M2: Format = Format {
    ebits: 5,
    mbits: 2,
    bias: 15,
    special: Special::Ieee,
};
pub const E8M0: Format = Format {
    ebits: 8,
    mbits: 0,
    bias: 127,
    special: Special::E8m0,
};
pub const E2M1: Format = Format {
    ebits: 2,
    mbits: 1,
    bias: 1,
    special: Special::Finite,
};

impl Format {
    /// Bits of a code, sign included (E8M0 has no sign bit).
    pub const fn width(self) -> u32 {
        match self.special {
            Special::E8m0 => 8,
            _ => 1 + self.ebits + self.mbits,
        }
    }

    const fn sign_bit(self) -> u32 {
        1 << (self.ebits + self.mbits)
    }

    /// Largest finite magnitude code.
    const fn max_code(self) -> u32 {
        let all = (1u32 << (self.ebits + self.mbits)) - 1;
        match self.special {
            Special::Ieee => ((1 << self.ebits) - 1) << self.mbits, // minus 1 below
            Special::Fn => all - 1,
            Special::Finite => all,
            Special::E8m0 => 0xFE,
        }
    }

    const fn max_finite(self) -> u32 {
        match self.special {
            Special::Ieee => self.max_code() - 1,
            _ => self.max_code(),
        }
    }

    /// Canonical quiet NaN magnitude (sign added by the caller where the format has one).
    const fn nan_code(self) -> u32 {
        match self.special {
            Special::Ieee => {
                (((1 << self.ebits) - 1) << self.mbits) | (1 << (self.mbits.saturating_sub(1)))
            }
            Special::Fn => (1 << (self.ebits + self.mbits)) - 1,
            Special::Finite => 0, // no NaN: callers map NaN to +0 (documented)
            Special::E8m0 => 0xFF,
        }
    }

    fn overflow(self, sign: u32) -> u32 {
        match self.special {
            Special::Ieee => sign | (((1 << self.ebits) - 1) << self.mbits),
            Special::Fn => sign | self.nan_code(),
            Special::Finite => sign | self.max_finite(),
            Special::E8m0 => 0xFF,
        }
    }

    /// fp32 bits -> code, round to nearest even.
    pub fn encode(self, u: u32) -> u32 {
        self.encode_with(u, 0, 0)
    }

    /// fp32 bits -> code; `rbits` random bits `rand` (0 = RNE) select stochastic rounding: the
    /// dropped fraction is compared against a uniform `rbits`-bit threshold.
    pub fn encode_with(self, u: u32, rbits: u32, rand: u32) -> u32 {
        self.encode_full(u, rbits, rand, false)
    }

    /// The full converter: `saturate` maps finite values beyond the largest finite to ±max
    /// (after rounding, so SR can round up into the saturation path); ±Inf and NaN inputs keep
    /// their usual encoding (NaN for formats without Inf). Used for the fp8 `saturate` policy.
    pub fn encode_full(self, u: u32, rbits: u32, rand: u32, saturate: bool) -> u32 {
        let s = u >> 31;
        let a = u & 0x7FFF_FFFF;
        let sign = if self.special == Special::E8m0 {
            0
        } else {
            s * self.sign_bit()
        };
        if a > 0x7F80_0000 {
            return match self.special {
                Special::Finite => 0,
                Special::E8m0 => 0xFF,
                _ => sign | self.nan_code(),
            };
        }
        if self.special == Special::E8m0 && (s == 1 || a == 0) {
            return 0xFF;
        }
        if a == 0x7F80_0000 {
            return self.overflow(sign);
        }
        if a == 0 {
            return sign;
        }
        let (sig, e0) = if a >= 0x0080_0000 {
            ((a & 0x007F_FFFF) | 0x0080_0000, (a >> 23) as i32 - 150)
        } else {
            (a, -149)
        };
        let lead = e0 + (31 - sig.leading_zeros() as i32);
        let m = self.mbits as i32;
        // The smallest step's exponent: 1 - bias for IEEE-style formats (code 0 is their zero /
        // subnormal binade); E8M0 has no zero, its code 0 is the power 2^-bias itself.
        let q = if self.special == Special::E8m0 {
            lead.max(-self.bias)
        } else {
            lead.max(1 - self.bias)
        };
        let shift = (q - m) - e0;
        let mut r: u64 = if shift <= 0 {
            (sig as u64) << (-shift) as u32
        } else if shift >= 40 && rbits == 0 {
            0 // below half of the smallest step: rounds to zero
        } else if shift >= 64 {
            // Far below the smallest step (only reachable with stochastic rounding): the dropped
            // fraction is < 2^-40 of a step, far below any supported random-bit resolution.
            0
        } else {
            let sig = sig as u64;
            let kept = sig >> shift;
            let rem = sig & ((1u64 << shift) - 1);
            let up = if rbits == 0 {
                let half = 1u64 << (shift - 1);
                rem > half || (rem == half && kept & 1 == 1)
            } else {
                // Stochastic: round up with probability rem / 2^shift, using rbits of randomness.
                let frac = if shift as u32 >= rbits {
                    rem >> (shift as u32 - rbits)
                } else {
                    rem << (rbits - shift as u32)
                };
                frac > (rand as u64 & ((1u64 << rbits) - 1))
            };
            kept + up as u64
        };
        // code magnitude: ((q - 1 + bias) << m) + r handles subnormals and the carry into the next binade.
        if self.special == Special::E8m0 {
            // Below 2^-127 (r == 0 here) there is nothing smaller: underflow keeps the
            // smallest code, 2^-127 (every ml_dtypes release does the same).
            let code = r as i64 + (q - 1 + self.bias) as i64;
            return match code {
                c if c > self.max_finite() as i64 && saturate => self.max_finite(),
                c if c > self.max_finite() as i64 => 0xFF,
                c => c.max(0) as u32,
            };
        }
        r += ((q - 1 + self.bias) as u64) << m;
        if r > self.max_finite() as u64 {
            if saturate {
                return sign | self.max_finite();
            }
            return self.overflow(sign);
        }
        sign | r as u32
    }

    /// code -> fp32 (exact: every narrow value is an fp32 value).
    pub fn decode(self, code: u32) -> f32 {
        if self.special == Special::E8m0 {
            let c = code & 0xFF;
            return if c == 0xFF {
                f32::NAN
            } else {
                f32::from_bits(if c == 0 { 0x0040_0000 } else { c << 23 })
            };
        }
        let neg = code & self.sign_bit() != 0;
        let mag = code & (self.sign_bit() - 1);
        let e = mag >> self.mbits;
        let man = mag & ((1 << self.mbits) - 1);
        let v = match self.special {
            Special::Ieee if e == (1 << self.ebits) - 1 => {
                if man == 0 {
                    f32::INFINITY
                } else {
                    f32::NAN
                }
            }
            Special::Fn if mag == self.nan_code() => f32::NAN,
            _ => {
                let (m, ex) = if e == 0 {
                    (man as f64, 1 - self.bias - self.mbits as i32)
                } else {
                    (
                        (man | (1 << self.mbits)) as f64,
                        e as i32 - self.bias - self.mbits as i32,
                    )
                };
                (m * 2f64.powi(ex)) as f32
            }
        };
        if neg {
            -v
        } else {
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(f: Format, x: f32) -> u32 {
        f.encode(x.to_bits())
    }

    #[test]
    fn bf16_matches_bit_trick() {
        // Classic RNE: (u + 0x7FFF + ((u >> 16) & 1)) >> 16 for finite non-NaN inputs.
        let mut u: u32 = 0;
        loop {
            if u & 0x7FFF_FFFF <= 0x7F7F_FFFF {
                let want = (u.wrapping_add(0x7FFF + ((u >> 16) & 1))) >> 16;
                assert_eq!(BF16.encode(u), want, "{u:#x}");
            }
            u = u.wrapping_add(0x0001_0FFF);
            if u < 0x0001_0FFF {
                break;
            }
        }
    }

    #[test]
    fn fp8_boundaries() {
        assert_eq!(enc(E4M3FN, 448.0), 0x7E);
        assert_eq!(enc(E4M3FN, 464.0), 0x7E); // tie -> even (448)
        assert_eq!(enc(E4M3FN, 465.0), 0x7F); // NaN
        assert_eq!(enc(E4M3FN, f32::INFINITY), 0x7F);
        assert_eq!(enc(E4M3FN, f32::NEG_INFINITY), 0xFF);
        assert_eq!(enc(E4M3, 240.0), 0x77);
        assert_eq!(enc(E4M3, 248.0), 0x78); // tie -> Inf
        assert_eq!(enc(E5M2, 61440.0), 0x7C);
        assert_eq!(enc(E4M3FN, 2f32.powi(-10)), 0); // tie to even (0)
        assert_eq!(enc(E4M3FN, 1.5 * 2f32.powi(-9)), 2);
        assert_eq!(E4M3FN.decode(1), 2f32.powi(-9));
        assert_eq!(enc(E2M1, 7.0), 0x7);
        assert_eq!(enc(E2M1, 5.0), 0x6); // 5 -> 4
        assert_eq!(enc(E8M0, 1.5), 128);
        assert_eq!(enc(E8M0, 0.0), 0xFF);
        assert_eq!(E8M0.decode(0), 2f32.powi(-127));
        // No zero: 2^-127 is code 0, its nearest neighbours below round to it, above (less than
        // the tie 1.5 * 2^-127) too; the tie rounds up.
        assert_eq!(E8M0.encode(0x0040_0000), 0);
        assert_eq!(E8M0.encode(0x0040_0001), 0);
        assert_eq!(E8M0.encode(0x005F_FFFF), 0);
        assert_eq!(E8M0.encode(0x0060_0000), 1);
        assert_eq!(E8M0.encode(1), 0);
        assert_eq!(enc(E8M0, 1.5 * 2f32.powi(127)), 0xFF);
        assert_eq!(
            E8M0.encode_full((1.5 * 2f32.powi(127)).to_bits(), 0, 0, true),
            0xFE
        );
    }

    #[test]
    fn decode_encode_round_trip_all_codes() {
        for f in [BF16, FP16, E4M3, E4M3FN, E5M2, E2M1, E8M0] {
            for c in 0..(1u32 << f.width()) {
                let v = f.decode(c);
                if v.is_nan() {
                    continue;
                }
                assert_eq!(f.encode(v.to_bits()), c, "{f:?} code {c:#x}");
            }
        }
    }

    #[test]
    fn fp16_matches_std_conversion_rule() {
        // Exhaustive over the top 20 bits with tie patterns, compared with an f64 reference.
        for hi in 0..(1u32 << 20) {
            for lo in [0u32, 1, 0x7FF, 0x800, 0x801, 0xFFF] {
                let u = (hi << 12) | lo;
                let x = f32::from_bits(u);
                if x.is_nan() {
                    continue;
                }
                let c = FP16.encode(u);
                let back = FP16.decode(c) as f64;
                let xd = x as f64;
                if back.is_infinite() {
                    assert!(xd.abs() >= 65520.0, "{u:#x}");
                    continue;
                }
                // nearest: no other fp16 neighbour is strictly closer
                let up = FP16.decode((c & 0x7FFF) + 1) as f64;
                let err = (back.abs() - xd.abs()).abs();
                if up.is_finite() {
                    assert!(err <= (up - xd.abs()).abs(), "{u:#x}");
                }
            }
        }
    }
}
