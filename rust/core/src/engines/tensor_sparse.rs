//! TensorE: `nc_matmul_sparse`, the M:N structured-sparse matmul (an emulator-level
//! instruction: NeuronCore-v4 has the hardware, `nki.isa` has no API). Layout and numerics:
//! docs/sparsity.md.
//!
//! The stationary operand is compressed: `values[Kc, M]` and `stationary_index[Kc, M]`, the
//! position of each kept value within its group of `g` dense rows (compressed rows
//! `j*s..j*s+s-1` form group j of an `s:g` pattern). The moving operand is dense, `[K, N]` laid
//! out `[Kc, R, N]` (`R = g/s`; dense row `k = R*p + r`). Each output element is one fp32
//! fused multiply-add chain over the compressed rows in order, then the nc_matmul PSUM write.

use super::tensor::{check_pairing, check_result_tile, check_stationary_columns, write_psum};
use super::{Ctx, Semantics};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::NcMatmulSparse;
use crate::kernels::psum::Acc;
use crate::kernels::sparse::{matmul_sparse, SparseOperands};

impl Semantics for NcMatmulSparse<'_> {
    fn check(&self) -> Result<()> {
        check_sparse(self)
    }

    fn exec(&self, ctx: &mut Ctx) -> Result<()> {
        let (st, mv) = (self.stationary, self.moving);
        let (kc, m) = (st.parts as usize, st.free_size());
        let n = mv.free_size() / self.pattern.ratio();
        let idx = ctx.read_raw(self.stationary_index);
        let rows = dense_rows(self, &idx)?;
        let values = ctx.read_f32(st);
        let moving = ctx.read_f32(mv);
        let out = matmul_sparse(&SparseOperands {
            values: &values,
            rows: &rows,
            moving: &moving,
            kc,
            m,
            n,
        });
        let acc = Acc {
            data: &out,
            m,
            n,
            nr: 0,
            work: 2 * kc * m * n,
        };
        write_psum(ctx, self.accumulate, self.dst, &acc);
        Ok(())
    }
}

/// Shapes: index tile like the values, whole groups, moving `[Kc, R, N]`, nc_matmul's dtype
/// pairing and result tile.
fn check_sparse(v: &NcMatmulSparse) -> Result<()> {
    let (st, ix, mv) = (v.stationary, v.stationary_index, v.moving);
    let (s, g) = v.pattern.kept_of();
    let r = v.pattern.ratio();
    if ix.parts != st.parts || ix.free_size() != st.free_size() {
        return Err(fail(
            Shape,
            "sparse_index_shape",
            format!(
                "stationary_index must have the shape of stationary [{}, {}], got [{}, {}]",
                st.parts,
                st.free_size(),
                ix.parts,
                ix.free_size()
            ),
        )
        .operand("stationary_index"));
    }
    if !(st.parts as usize).is_multiple_of(s) {
        return Err(fail(
            Shape,
            "sparse_partial_group",
            format!(
                "stationary has {} compressed rows, not a whole number of {s}:{g} groups ({s} rows each)",
                st.parts
            ),
        )
        .operand("stationary"));
    }
    if mv.parts != st.parts {
        return Err(fail(
            Shape,
            "sparse_k_mismatch",
            format!(
                "moving must have the {} partitions of stationary (dense K = {} rows laid out [Kc, {r}, N]), got {}",
                st.parts,
                st.parts as usize * r,
                mv.parts
            ),
        )
        .operand("moving"));
    }
    if !mv.free_size().is_multiple_of(r) || mv.free_size() == 0 {
        return Err(fail(
            Shape,
            "sparse_moving_layout",
            format!(
                "moving is laid out [Kc, {r}, N] for {s}:{g}: its free size {} must be a positive multiple of {r}",
                mv.free_size()
            ),
        )
        .operand("moving"));
    }
    let m = st.free_size();
    check_stationary_columns(m)?;
    check_pairing(st.dtype, mv.dtype)?;
    check_result_tile(v.dst, m, mv.free_size() / r)
}

/// The dense moving row of every compressed value, `(c / s) * g + idx[c, m]` (row-major
/// `[Kc][M]`), after checking each group's indices: in `0..g` and distinct. Groups are checked
/// in order (group j, then column m), so the error names the first bad group.
fn dense_rows(v: &NcMatmulSparse, idx: &[u32]) -> Result<Vec<usize>> {
    let (s, g) = v.pattern.kept_of();
    let (kc, m) = (v.stationary.parts as usize, v.stationary.free_size());
    let mut rows = vec![0usize; kc * m];
    for j in 0..kc / s {
        for col in 0..m {
            let mut seen = 0u32;
            for c in j * s..(j + 1) * s {
                let i = idx.get(c * m + col).copied().unwrap_or(u32::MAX) as usize;
                let bad = |rule: &'static str, what: String| {
                    fail(
                        Value,
                        rule,
                        format!(
                            "group {j} of column {col} (compressed rows {}..{}): stationary_index[{c}, {col}] = {i} {what}",
                            j * s,
                            (j + 1) * s - 1
                        ),
                    )
                    .operand("stationary_index")
                };
                if i >= g {
                    return Err(bad(
                        "sparse_index_out_of_range",
                        format!("is outside 0..{} ({s}:{g} groups)", g - 1),
                    ));
                }
                if seen & (1 << i) != 0 {
                    return Err(bad(
                        "sparse_index_repeated",
                        "repeats an earlier index of its group".into(),
                    ));
                }
                seen |= 1 << i;
                rows[c * m + col] = j * g + i;
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use crate::isa::text::parse_instr_unchecked;
    use crate::isa::SparsityPattern;

    #[test]
    fn every_pattern_has_an_integer_ratio_of_at_most_four() {
        for &name in SparsityPattern::NAMES {
            let p = (0..7u8)
                .filter_map(SparsityPattern::from_u8)
                .find(|p| p.name() == name)
                .unwrap();
            let (s, g) = p.kept_of();
            assert_eq!(name, format!("m{s}_n{g}"));
            assert_eq!(g % s, 0);
            assert!((2..=4).contains(&p.ratio()));
        }
    }

    #[test]
    fn text_form_round_trips() {
        let t = "nc_matmul_sparse dst=psum:float32[0:128]+0[[1,512]] stationary=sbuf:bfloat16[0:128]+0[[1,128]] stationary_index=sbuf:uint8[0:128]+256[[1,128]] moving=sbuf:bfloat16[0:128]+512[[1,2048]] pattern=m4_n16";
        let ins = parse_instr_unchecked(t).unwrap();
        assert!(crate::engines::validate(&ins).is_ok());
    }
}
