//! The arithmetic of `nc_matmul` (normal and double-row): decode both operands once into packed
//! fp32 panels (per-thread scratch reused across instructions), run the register-blocked gemm,
//! and hand the `[M, N]` column sums to the PSUM write.

use super::decode::{decode_into, Rows};
use super::gemm::{blocking, gemm, grow, pack};
use super::psum::write_psum;
use super::simd;
use crate::engines::Ctx;
use crate::error::Result;
use crate::isa::Arg;
use crate::memory::onchip::Mems;
use crate::memory::Ap;
use std::cell::RefCell;

#[derive(Default)]
struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
    tmp: Vec<f32>,
    out: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Decode the `parts x groups` logical rows (each `free / groups` wide) of `ap` into panels.
fn pack_operand(
    mems: &Mems,
    ap: &Ap,
    groups: usize,
    pw: usize,
    dst: &mut Vec<f32>,
    tmp: &mut Vec<f32>,
) -> Result<()> {
    let rows = Rows::new(mems, ap);
    let w = ap.free_size() / groups;
    let wb = w * ap.dtype.size();
    let mut res = Ok(());
    pack(
        dst,
        ap.parts as usize * groups,
        w,
        pw,
        |r, buf| match rows.row(r / groups) {
            Ok(bytes) => {
                let l = r % groups;
                decode_into(ap.dtype, &bytes[l * wb..(l + 1) * wb], buf)
            }
            Err(e) => res = Err(e),
        },
        tmp,
    );
    res
}

/// `acc[m, n] = fma-chain over logical rows` of stationary `[K, groups*M]` and moving
/// `[K, groups*N]` (logical row `groups*k + l`), written to PSUM `dst` per `accumulate`.
pub fn matmul(
    ctx: &mut Ctx,
    st: &Ap,
    mv: &Ap,
    groups: usize,
    dst: &Ap,
    accumulate: &Arg,
) -> Result<()> {
    // The scratch leaves the thread-local while in use (the PSUM write needs `ctx` mutably).
    let mut s = SCRATCH.with(|c| c.take());
    let r = compute(&ctx.mems, st, mv, groups, &mut s);
    if r.is_ok() {
        let mn = st.free_size() / groups * (mv.free_size() / groups);
        write_psum(accumulate, ctx, dst, s.out.get(..mn).unwrap_or(&[]));
    }
    SCRATCH.with(|c| c.replace(s));
    r
}

fn compute(mems: &Mems, st: &Ap, mv: &Ap, groups: usize, s: &mut Scratch) -> Result<()> {
    let path = simd::path();
    let bl = blocking(path);
    let (k, m, n) = (
        st.parts as usize * groups,
        st.free_size() / groups,
        mv.free_size() / groups,
    );
    pack_operand(mems, st, groups, bl.mr, &mut s.a, &mut s.tmp)?;
    pack_operand(mems, mv, groups, bl.nr, &mut s.b, &mut s.tmp)?;
    grow(&mut s.out, m * n);
    gemm(path, k, m, n, &s.a, &s.b, &mut s.out[..m * n]);
    Ok(())
}
