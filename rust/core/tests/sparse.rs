//! nc_matmul_sparse through the public API: every pattern against a dense matmul of the
//! decompressed operand computed here (small integers: every partial sum is exact), and the
//! execution-time index rules.

use trn3emu_core::engines::parse_program;
use trn3emu_core::isa::SparsityPattern;
use trn3emu_core::{Device, ErrorKind, RunOptions};

const KC: usize = 32;
const M: usize = 8;
const N: usize = 16;

fn put_f32(dev: &mut Device, psum: bool, p: usize, off: usize, v: &[f32]) {
    let mem = if psum {
        &mut dev.cores[0].psum
    } else {
        &mut dev.cores[0].sbuf
    };
    let part = mem.partition_mut(p);
    for (i, x) in v.iter().enumerate() {
        part[off + 4 * i..off + 4 * i + 4].copy_from_slice(&x.to_le_bytes());
    }
}

fn get_f32(dev: &Device, p: usize, off: usize, n: usize) -> Vec<f32> {
    let part = dev.cores[0].psum.partition(p);
    (0..n)
        .map(|i| f32::from_le_bytes(part[off + 4 * i..off + 4 * i + 4].try_into().unwrap()))
        .collect()
}

/// A deterministic small integer in -4..=4.
fn small(i: usize) -> f32 {
    ((i * 2654435761) % 9) as f32 - 4.0
}

/// Runs one fp32 sparse matmul with `idx[c][m]`; returns dst `[M][N]` or the error.
fn run(pat: SparsityPattern, idx: &[Vec<u8>]) -> trn3emu_core::Result<Vec<Vec<f32>>> {
    let r = pat.ratio();
    let mut dev = Device::new();
    for (c, row) in idx.iter().enumerate().take(KC) {
        let vals: Vec<f32> = (0..M).map(|m| small(c * M + m + 1)).collect();
        put_f32(&mut dev, false, c, 0, &vals);
        let part = dev.cores[0].sbuf.partition_mut(c);
        part[1024..1024 + M].copy_from_slice(row);
        let mv: Vec<f32> = (0..r * N).map(|i| small(7 * (c * r * N + i) + 3)).collect();
        put_f32(&mut dev, false, c, 2048, &mv);
    }
    let text = format!(
        "nc_matmul_sparse dst=psum:float32[0:{M}]+0[[1,{N}]] stationary=sbuf:float32[0:{KC}]+0[[1,{M}]] stationary_index=sbuf:uint8[0:{KC}]+1024[[1,{M}]] moving=sbuf:float32[0:{KC}]+2048[[1,{}]] pattern={} accumulate=false\n",
        r * N,
        pat.name()
    );
    dev.run(&[parse_program(&text)?], &RunOptions::default())?;
    Ok((0..M).map(|m| get_f32(&dev, m, 0, N)).collect())
}

fn patterns() -> impl Iterator<Item = SparsityPattern> {
    (0..7u8).filter_map(SparsityPattern::from_u8)
}

#[test]
fn every_pattern_equals_the_dense_matmul_of_the_decompressed_operand() {
    for pat in patterns() {
        let (s, g) = pat.kept_of();
        let r = pat.ratio();
        // Group j, column m keeps positions (m + t * (g / s) + j) % g for t = 0..s: distinct.
        let idx: Vec<Vec<u8>> = (0..KC)
            .map(|c| {
                (0..M)
                    .map(|m| ((m + (c % s) * (g / s) + c / s) % g) as u8)
                    .collect()
            })
            .collect();
        let got = run(pat, &idx).unwrap();
        // Dense W [K][M] from the compressed pair, dense moving [K][N] with k = r * p + q.
        let k = KC * r;
        let mut w = vec![vec![0f64; M]; k];
        for c in 0..KC {
            for m in 0..M {
                w[(c / s) * g + idx[c][m] as usize][m] = small(c * M + m + 1) as f64;
            }
        }
        let b = |kk: usize, n: usize| {
            let (p, q) = (kk / r, kk % r);
            small(7 * (p * r * N + q * N + n) + 3) as f64
        };
        for (m, row) in got.iter().enumerate() {
            for (n, &x) in row.iter().enumerate() {
                let want: f64 = (0..k).map(|kk| w[kk][m] * b(kk, n)).sum();
                assert_eq!(x as f64, want, "{} m={m} n={n}", pat.name());
            }
        }
    }
}

#[test]
fn bad_indices_fail_at_execution_naming_the_group() {
    let pat = SparsityPattern::M2N4;
    let ok: Vec<Vec<u8>> = (0..KC).map(|c| vec![(c % 2) as u8; M]).collect();
    let mut bad = ok.clone();
    bad[5][3] = 4;
    let e = run(pat, &bad).unwrap_err();
    assert_eq!(
        (e.kind, e.rule),
        (ErrorKind::Value, "sparse_index_out_of_range")
    );
    assert!(e.message.contains("group 2 of column 3"), "{e}");
    let mut bad = ok;
    bad[7][0] = 0;
    let e = run(pat, &bad).unwrap_err();
    assert_eq!(e.rule, "sparse_index_repeated");
    assert!(e.message.contains("group 3 of column 0"), "{e}");
}
