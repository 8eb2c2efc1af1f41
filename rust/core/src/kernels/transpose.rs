//! Bit-exact transposes of packed element buffers (nc_transpose, is_transpose matmuls):
//! pure data movement, done on whole elements of the dtype's width in cache-sized blocks.

/// `src` holds `p` rows of `f` elements of `es` bytes; returns the `f x p` transpose.
pub fn transpose_bytes(src: &[u8], p: usize, f: usize, es: usize) -> Vec<u8> {
    let mut out = vec![0u8; src.len()];
    if src.len() < p * f * es {
        return out; // callers pass whole tiles
    }
    match es {
        1 => blocked::<1>(src, &mut out, p, f),
        2 => blocked::<2>(src, &mut out, p, f),
        4 => blocked::<4>(src, &mut out, p, f),
        _ => {
            for i in 0..p {
                for j in 0..f {
                    let (s, d) = ((i * f + j) * es, (j * p + i) * es);
                    out[d..d + es].copy_from_slice(&src[s..s + es]);
                }
            }
        }
    }
    out
}

/// Whole elements of `ES` bytes, in 32 x 32 blocks (both sides stay in cache).
fn blocked<const ES: usize>(src: &[u8], dst: &mut [u8], p: usize, f: usize) {
    const B: usize = 32;
    let (s, _) = src.as_chunks::<ES>();
    let (d, _) = dst.as_chunks_mut::<ES>();
    if s.len() < p * f || d.len() < p * f {
        return;
    }
    for i0 in (0..p).step_by(B) {
        for j0 in (0..f).step_by(B) {
            let j1 = (j0 + B).min(f);
            for i in i0..(i0 + B).min(p) {
                let row = &s[i * f + j0..i * f + j1];
                for (j, e) in (j0..j1).zip(row) {
                    d[j * p + i] = *e;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn transposes_each_width() {
        for es in [1usize, 2, 4] {
            let (p, f) = (37, 70);
            let src: Vec<u8> = (0..p * f * es).map(|i| (i * 7 % 251) as u8).collect();
            let t = super::transpose_bytes(&src, p, f, es);
            for i in 0..p {
                for j in 0..f {
                    assert_eq!(
                        &t[(j * p + i) * es..(j * p + i + 1) * es],
                        &src[(i * f + j) * es..(i * f + j + 1) * es]
                    );
                }
            }
        }
    }
}
