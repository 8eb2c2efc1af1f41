//! The PSUM write of a matmul result: overwrite, accumulate (`psum = fl32(psum + acc)`), or
//! decide per element (accumulate = None: add when a matmul already wrote the element in this
//! run). A bf16 PSUM is rounded after the add with the instruction's rounder (RNE or SR).
//! Contiguous fp32/bf16 destinations (every matmul in practice) read and write the PSUM bytes
//! in place and set the "written by a matmul" bits a row at a time.

use crate::engines::Ctx;
use crate::isa::{Arg, DType};
use crate::memory::{Ap, Mem, PSUM_PART_BYTES};

/// Index of the 2-byte PSUM unit holding byte `byte` of partition `part`.
fn unit(part: usize, byte: usize) -> usize {
    (part * PSUM_PART_BYTES + byte) / 2
}

fn test_bit(words: &[u64], b: usize) -> bool {
    words.get(b / 64).is_some_and(|w| w >> (b % 64) & 1 == 1)
}

/// Set bits `lo..hi`.
fn set_bits(words: &mut [u64], lo: usize, hi: usize) {
    let mut b = lo;
    while b < hi {
        let (w, s) = (b / 64, b % 64);
        let n = (64 - s).min(hi - b);
        let mask = if n == 64 { !0 } else { ((1u64 << n) - 1) << s };
        if let Some(x) = words.get_mut(w) {
            *x |= mask;
        }
        b += n;
    }
}

/// Write `acc` ([M, N] fp32, row-major, in dst's logical order) to the PSUM tile `dst`.
pub fn write_psum(accumulate: &Arg, ctx: &mut Ctx, dst: &Ap, acc: &[f32]) {
    let mode = match accumulate {
        Arg::Bool(b) => Some(*b),
        _ => None,
    };
    let fast = dst.mem == Mem::Psum
        && dst.dynamic.is_none()
        && dst.is_row_contiguous()
        && matches!(dst.dtype, DType::Float32 | DType::Bfloat16)
        && dst.offset.is_multiple_of(2);
    if fast {
        write_contiguous(mode, ctx, dst, acc);
    } else {
        write_general(mode, ctx, dst, acc);
    }
}

fn write_contiguous(mode: Option<bool>, ctx: &mut Ctx, dst: &Ap, acc: &[f32]) {
    let (m, n) = (dst.parts as usize, dst.free_size());
    let es = dst.dtype.size();
    let units = es / 2;
    let f32_dst = dst.dtype == DType::Float32;
    let mut staged: Vec<f32> = if f32_dst {
        Vec::new()
    } else {
        vec![0f32; m * n]
    };
    let psum = &mut ctx.mems.psum.bytes;
    let words = &mut ctx.state.psum_mm;
    for r in 0..m {
        let part = dst.start as usize + r;
        let base = part * PSUM_PART_BYTES + dst.offset as usize;
        let (Some(row), Some(a)) = (
            psum.get_mut(base..base + n * es),
            acc.get(r * n..(r + 1) * n),
        ) else {
            continue; // validated APs are in bounds
        };
        let u0 = unit(part, dst.offset as usize);
        // Per element: add (true) or overwrite; explicit modes get branch-free loops.
        let adds: Option<Vec<bool>> = match mode {
            Some(_) => None,
            None => Some((0..n).map(|j| test_bit(words, u0 + j * units)).collect()),
        };
        let add_all = mode == Some(true);
        if f32_dst {
            match &adds {
                None if add_all => {
                    for (o, x) in row.chunks_exact_mut(4).zip(a) {
                        let v = f32::from_le_bytes([o[0], o[1], o[2], o[3]]) + *x;
                        o.copy_from_slice(&v.to_le_bytes());
                    }
                }
                None => {
                    for (o, x) in row.chunks_exact_mut(4).zip(a) {
                        o.copy_from_slice(&x.to_le_bytes());
                    }
                }
                Some(adds) => {
                    for ((o, x), add) in row.chunks_exact_mut(4).zip(a).zip(adds) {
                        let v = if *add {
                            f32::from_le_bytes([o[0], o[1], o[2], o[3]]) + *x
                        } else {
                            *x
                        };
                        o.copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        } else {
            let out = &mut staged[r * n..(r + 1) * n];
            for (j, ((o, x), old)) in out.iter_mut().zip(a).zip(row.chunks_exact(2)).enumerate() {
                let add = match &adds {
                    None => add_all,
                    Some(v) => v.get(j).copied().unwrap_or(false),
                };
                *o = if add {
                    f32::from_bits((u16::from_le_bytes([old[0], old[1]]) as u32) << 16) + *x
                } else {
                    *x
                };
            }
        }
        set_bits(words, u0, u0 + n * units);
    }
    if !f32_dst {
        ctx.write_f32(dst, &staged);
    }
}

/// Any other destination pattern, element by element.
fn write_general(mode: Option<bool>, ctx: &mut Ctx, dst: &Ap, acc: &[f32]) {
    let (m, n) = (dst.parts as usize, dst.free_size());
    let old = ctx.read_f32(dst);
    let offs = dst.row_offsets();
    let es = dst.dtype.size() as i64;
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        for (j, o) in offs.iter().enumerate() {
            let i = r * n + j;
            let byte = dst.offset as i64 + o * es;
            let bit = unit(dst.start as usize + r, byte.max(0) as usize);
            let add = mode.unwrap_or_else(|| test_bit(&ctx.state.psum_mm, bit));
            let (x, y) = (
                old.get(i).copied().unwrap_or(0.0),
                acc.get(i).copied().unwrap_or(0.0),
            );
            out[i] = if add { x + y } else { y };
            set_bits(&mut ctx.state.psum_mm, bit, bit + es as usize / 2);
        }
    }
    ctx.write_f32(dst, &out);
}
