//! VectorE top-8 family: max8, nc_find_index8 and nc_match_replace8 (8 values per partition).
//! Values compare in fp32 (so -0.0 == 0.0 and NaN matches nothing).

use super::vector_rules::{exact_shape, free_in};
use super::{same_shape, Ctx, Semantics};
use crate::error::Result;
use crate::isa::ops::{Max8, NcFindIndex8, NcMatchReplace8};
use crate::numerics;

/// Elements per partition these instructions read.
const MIN_FREE: usize = 8;
const MAX_FREE: usize = 16384;
/// "Not found": all ones, truncated to the index dtype's width on write.
const NOT_FOUND: u32 = u32::MAX;

impl Semantics for Max8<'_> {
    fn check(&self) -> Result<()> {
        free_in(self.src, "src", MIN_FREE, MAX_FREE)?;
        exact_shape(self.dst, "dst", self.src.parts, 8)
    }

    /// The 8 largest per partition, descending, ordered by IEEE totalOrder (so +NaN ranks above
    /// +inf and 0.0 above -0.0; the hardware's NaN handling is not documented); ties keep free
    /// order.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let src = self.src;
        let (p, n) = (src.parts as usize, src.free_size());
        let x = ctx.read_f32(src);
        let mut out = Vec::with_capacity(p * 8);
        for r in 0..p {
            let mut row = x[r * n..(r + 1) * n].to_vec();
            row.sort_by(|a, b| b.total_cmp(a));
            out.extend_from_slice(&row[..8]);
        }
        ctx.write_f32(self.dst, &out);
        Ok(())
    }
}

impl Semantics for NcFindIndex8<'_> {
    fn check(&self) -> Result<()> {
        let data = self.data;
        free_in(data, "data", MIN_FREE, MAX_FREE)?;
        exact_shape(self.vals, "vals", data.parts, 8)?;
        exact_shape(self.dst, "dst", data.parts, 8)
    }

    /// For each of the 8 vals (in column order) the first occurrence not already taken by an
    /// earlier equal val: duplicates take successive occurrences in ascending order; none -> all
    /// ones.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let data = self.data;
        let (p, n) = (data.parts as usize, data.free_size());
        let x = ctx.read_f32(data);
        let v = ctx.read_f32(self.vals);
        let mut out = Vec::with_capacity(p * 8);
        for r in 0..p {
            let row = &x[r * n..(r + 1) * n];
            let vals = &v[r * 8..(r + 1) * 8];
            for i in 0..8 {
                let k = vals[..i].iter().filter(|w| **w == vals[i]).count();
                let idx = row
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| **d == vals[i])
                    .nth(k)
                    .map_or(NOT_FOUND, |(j, _)| j as u32);
                out.push(idx);
            }
        }
        ctx.write_raw(self.dst, &out);
        Ok(())
    }
}

impl Semantics for NcMatchReplace8<'_> {
    fn check(&self) -> Result<()> {
        let data = self.data;
        free_in(data, "data", MIN_FREE, MAX_FREE)?;
        same_shape(data, "data", self.dst, "dst")?;
        exact_shape(self.vals, "vals", data.parts, 8)?;
        if let Some(idx) = self.dst_idx {
            exact_shape(idx, "dst_idx", data.parts, 8)?;
        }
        Ok(())
    }

    /// dst = data; for i = 7 down to 0 the first not-yet-replaced occurrence of vals[i] becomes
    /// imm and dst_idx[i] its flat index (not found: no replacement, index all ones). Same-dtype
    /// data is copied bit-exactly, otherwise through fp32.
    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (dst, data) = (self.dst, self.data);
        let (p, n) = (data.parts as usize, data.free_size());
        let imm = self.imm.f32();
        let x = ctx.read_f32(data);
        let v = ctx.read_f32(self.vals);
        let mut hit = vec![false; x.len()];
        let mut idx = vec![NOT_FOUND; p * 8];
        for r in 0..p {
            let row = &x[r * n..(r + 1) * n];
            for i in (0..8).rev() {
                let want = v[r * 8 + i];
                if let Some(j) = (0..n).find(|&j| !hit[r * n + j] && row[j] == want) {
                    hit[r * n + j] = true;
                    idx[r * 8 + i] = j as u32;
                }
            }
        }
        if dst.dtype == data.dtype {
            let mut raw = ctx.read_raw(data);
            let rep = numerics::from_f32(dst.dtype, imm);
            for (o, h) in raw.iter_mut().zip(&hit) {
                if *h {
                    *o = rep;
                }
            }
            ctx.write_raw(dst, &raw);
        } else {
            let out: Vec<f32> = x
                .iter()
                .zip(&hit)
                .map(|(x, h)| if *h { imm } else { *x })
                .collect();
            ctx.write_f32(dst, &out);
        }
        if let Some(ia) = self.dst_idx {
            ctx.write_raw(ia, &idx);
        }
        Ok(())
    }
}
