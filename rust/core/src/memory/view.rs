//! Plain views of a tensor: the geometry of `t[key]` when every key entry is an index or a
//! step-less slice within its dim (the views kernels take in their loops). Front ends build the
//! view object; anything else (steps, out-of-range entries) is theirs to handle or refuse.

/// One key entry: an index (negative counts from the end) or a slice `start..stop` (None: the
/// dim's start / end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Index {
    At(i64),
    Range(Option<i64>, Option<i64>),
}

/// The geometry of a view: shape, strides (elements), byte offset and start partition.
pub type Geometry = (Vec<i64>, Vec<i64>, i64, i64);

/// `(shape, strides, offset, start)` of the view `key` of a tensor with that geometry, `es`
/// bytes per element; on-chip (`onchip`), dim 0 is the partition dim (it moves `start`, an
/// index keeps it as a dim of 1) and a view keeps at least two dims. None when an entry is out
/// of its dim's range, a slice is empty, or the key has more entries than dims.
pub fn plain_view(
    shape: &[i64],
    strides: &[i64],
    offset: i64,
    start: i64,
    onchip: bool,
    es: i64,
    key: &[Index],
) -> Option<Geometry> {
    if key.len() > shape.len() || strides.len() != shape.len() {
        return None;
    }
    let (mut out_shape, mut out_strides) = (Vec::with_capacity(4), Vec::with_capacity(4));
    let (mut offset, mut start) = (offset, start);
    for (d, k) in key.iter().enumerate() {
        let (n, st) = (shape[d], strides[d]);
        let (a, len) = match *k {
            Index::At(k) => {
                let i = if k < 0 { k.checked_add(n)? } else { k };
                if !(0..n).contains(&i) {
                    return None;
                }
                (i, None)
            }
            Index::Range(a, b) => {
                let (a, b) = (a.unwrap_or(0), b.unwrap_or(n));
                if a < 0 || b > n || a >= b {
                    return None;
                }
                (a, Some(b - a))
            }
        };
        if d == 0 && onchip {
            start = start.checked_add(a)?;
            out_shape.push(len.unwrap_or(1));
            out_strides.push(st);
        } else {
            offset = offset.checked_add(a.checked_mul(st)?.checked_mul(es)?)?;
            if let Some(len) = len {
                out_shape.push(len);
                out_strides.push(st);
            }
        }
    }
    out_shape.extend_from_slice(&shape[key.len()..]);
    out_strides.extend_from_slice(&strides[key.len()..]);
    if onchip && out_shape.len() < 2 {
        out_shape.push(1);
        out_strides.push(1);
    }
    if out_shape.is_empty() {
        (out_shape, out_strides) = (vec![1], vec![1]);
    }
    Some((out_shape, out_strides, offset, start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Index::*;

    #[test]
    fn slices_and_indices_move_offset_or_start() {
        // an SBUF tile [128, 512] fp32: dim 0 moves the start partition
        let (s, st) = (vec![128, 512], vec![512, 1]);
        let v = plain_view(
            &s,
            &st,
            64,
            0,
            true,
            4,
            &[Range(None, None), Range(Some(128), Some(256))],
        );
        assert_eq!(v, Some((vec![128, 128], vec![512, 1], 64 + 128 * 4, 0)));
        let v = plain_view(&s, &st, 0, 0, true, 4, &[At(-1)]);
        assert_eq!(v, Some((vec![1, 512], vec![512, 1], 0, 127)));
        // an HBM tensor [4096, 128] bf16: every dim moves the offset; an index drops its dim
        let (s, st) = (vec![4096, 128], vec![128, 1]);
        let v = plain_view(&s, &st, 1000, 0, false, 2, &[Range(Some(256), Some(384))]);
        assert_eq!(
            v,
            Some((vec![128, 128], vec![128, 1], 1000 + 256 * 128 * 2, 0))
        );
        let v = plain_view(&s, &st, 0, 0, false, 2, &[At(3), At(5)]);
        assert_eq!(v, Some((vec![1], vec![1], (3 * 128 + 5) * 2, 0)));
    }

    #[test]
    fn out_of_range_empty_and_overlong_keys_are_none() {
        let (s, st) = (vec![128, 512], vec![512, 1]);
        for key in [
            vec![At(128)],
            vec![At(-129)],
            vec![Range(Some(0), Some(513))],
            vec![Range(Some(5), Some(5))],
            vec![Range(Some(-1), None)],
            vec![At(0), At(0), At(0)],
        ] {
            assert_eq!(plain_view(&s, &st, 0, 0, true, 4, &key), None, "{key:?}");
        }
    }
}
