//! Bit-exact transposes of packed element buffers (nc_transpose, is_transpose matmuls):
//! pure data movement, done on whole elements of the dtype's width in cache-sized blocks.

/// `src` holds `p` rows of `f` elements of `es` bytes; returns the `f x p` transpose.
pub fn transpose_bytes(src: &[u8], p: usize, f: usize, es: usize) -> Vec<u8> {
    let mut out = vec![0u8; src.len()];
    if src.len() < p * f * es {
        return out; // callers pass whole tiles
    }
    match es {
        1 => blocked(src, &mut out, p, f, |s, d, i, o| d[o] = s[i]),
        2 => blocked(src, &mut out, p, f, |s, d, i, o| {
            d[2 * o..2 * o + 2].copy_from_slice(&s[2 * i..2 * i + 2])
        }),
        4 => blocked(src, &mut out, p, f, |s, d, i, o| {
            d[4 * o..4 * o + 4].copy_from_slice(&s[4 * i..4 * i + 4])
        }),
        _ => blocked(src, &mut out, p, f, |s, d, i, o| {
            d[es * o..es * o + es].copy_from_slice(&s[es * i..es * i + es])
        }),
    }
    out
}

/// Visit (source element i, destination element o) pairs in 32 x 32 blocks.
fn blocked(
    src: &[u8],
    dst: &mut [u8],
    p: usize,
    f: usize,
    mv: impl Fn(&[u8], &mut [u8], usize, usize),
) {
    const B: usize = 32;
    for i0 in (0..p).step_by(B) {
        for j0 in (0..f).step_by(B) {
            for i in i0..(i0 + B).min(p) {
                for j in j0..(j0 + B).min(f) {
                    mv(src, dst, i * f + j, j * p + i);
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
