//! VectorE batch-norm statistics: bn_stats (count, mean, M2 of even and odd free positions) and
//! bn_aggr (Chan's parallel combination into mean and population variance). The hardware's fp32
//! summation order is not public: the emulator accumulates in f64 and rounds each output once
//! to fp32, so results are deterministic and as close to exact as fp32 allows.

use super::vector_rules::{exact_shape, free_in};
use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::{BnAggr, BnStats};

/// bn_stats_fmax: elements per partition one bn_stats reads.
pub const BN_STATS_FMAX: usize = 512;

/// (count, mean, M2) of the values; an empty set gives (0, 0, 0).
fn stats(vals: impl Iterator<Item = f64> + Clone) -> [f64; 3] {
    let n = vals.clone().count() as f64;
    if n == 0.0 {
        return [0.0; 3];
    }
    let mean = vals.clone().sum::<f64>() / n;
    let m2 = vals.map(|v| (v - mean) * (v - mean)).sum::<f64>();
    [n, mean, m2]
}

impl Semantics for BnStats<'_> {
    fn check(&self) -> Result<()> {
        free_in(self.data, "data", 1, BN_STATS_FMAX)?;
        exact_shape(self.dst, "dst", self.data.parts, 6)
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let data = self.data;
        let (p, n) = (data.parts as usize, data.free_size());
        let x = ctx.read_f32(data);
        let mut out = Vec::with_capacity(p * 6);
        for r in 0..p {
            let row = &x[r * n..(r + 1) * n];
            for parity in 0..2 {
                let it = row.iter().skip(parity).step_by(2).map(|v| *v as f64);
                out.extend(stats(it).iter().map(|v| *v as f32));
            }
        }
        ctx.write_f32(self.dst, &out);
        Ok(())
    }
}

impl Semantics for BnAggr<'_> {
    fn check(&self) -> Result<()> {
        let f = self.data.free_size();
        if f == 0 || !f.is_multiple_of(3) {
            return Err(fail(
                Shape,
                "bn_aggr_triples",
                format!("data must hold (count, mean, M2) triples: elements per partition divisible by 3, got {f}"),
            )
            .operand("data"));
        }
        exact_shape(self.dst, "dst", self.data.parts, 2)
    }

    /// n = sum n_i; mean = sum n_i mean_i / n; M2 = sum M2_i + sum n_i (mean_i - mean)^2;
    /// dst = [mean, M2 / n]; n = 0 gives [0, 0].
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let data = self.data;
        let (p, f) = (data.parts as usize, data.free_size());
        let x = ctx.read_f32(data);
        let mut out = Vec::with_capacity(p * 2);
        for r in 0..p {
            let tr: Vec<[f64; 3]> = x[r * f..(r + 1) * f]
                .chunks_exact(3)
                .map(|c| [c[0] as f64, c[1] as f64, c[2] as f64])
                .collect();
            let n: f64 = tr.iter().map(|t| t[0]).sum();
            if n == 0.0 {
                out.extend([0.0, 0.0]);
                continue;
            }
            let mean = tr.iter().map(|t| t[0] * t[1]).sum::<f64>() / n;
            let m2: f64 = tr
                .iter()
                .map(|t| t[2] + t[0] * (t[1] - mean) * (t[1] - mean))
                .sum();
            out.extend([mean as f32, (m2 / n) as f32]);
        }
        ctx.write_f32(self.dst, &out);
        Ok(())
    }
}
