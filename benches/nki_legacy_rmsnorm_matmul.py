"""A large legacy-dialect (`neuronxcc.nki`) kernel: RMSNorm of x [M, K] scaled by gamma, times
w [K, N] (benches/test_bench_nki_legacy.py). Written in the legacy style the third-party kernels
of issue 27 use: value-returning `nisa.*` / `nl.*` calls assigned into preallocated tiles, and the
weight loaded inside the row loop (the legacy compiler wrote those assignments in place and loaded
the weight once: passes `inplace_assign`, `load_reuse`)."""

import numpy as np
import trn3emu.nki as tn

tn.install()

import neuronxcc.nki as nki  # noqa: E402
import neuronxcc.nki.isa as nisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402

EPS = 1e-6


def rmsnorm_matmul(x, gamma, w):
    """out = (x / sqrt(mean(x^2, axis=1) + EPS) * gamma) @ w; x, gamma [1, K], w bf16."""
    m, k = x.shape
    n = w.shape[1]
    out = nl.ndarray((m, n), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(m // 128):
        xt = nl.load(x[i * 128 : (i + 1) * 128, :])
        sq = nl.ndarray((128, k), dtype=nl.float32, buffer=nl.sbuf)
        sq[...] = nisa.activation(op=nl.square, data=xt, dtype=nl.float32)
        ss = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        ss[...] = nisa.tensor_reduce(np.add, sq, axis=(1,), keepdims=True)
        rs = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        rs[...] = nisa.tensor_scalar(ss, np.multiply, 1.0 / k, op1=np.add, operand1=EPS)
        rs[...] = nl.rsqrt(rs)
        g = nl.load(gamma)  # loop-invariant
        xn = nl.ndarray((128, k), dtype=x.dtype, buffer=nl.sbuf)
        xn[...] = nisa.tensor_scalar(xt, np.multiply, rs, dtype=nl.float32)
        xn[...] = nl.multiply(xn, g)
        xts = []
        for kk in nl.affine_range(k // 128):
            tp = nisa.nc_transpose(xn[:, kk * 128 : (kk + 1) * 128])
            xs = nl.ndarray((128, 128), dtype=x.dtype, buffer=nl.sbuf)
            xs[...] = nisa.tensor_copy(tp)
            xts.append(xs)
        for j in nl.affine_range(n // 512):
            acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
            for kk in nl.affine_range(k // 128):
                wt = nl.load(w[kk * 128 : (kk + 1) * 128, j * 512 : (j + 1) * 512])  # loop-invariant in i
                acc += nisa.nc_matmul(xts[kk], wt)
            res = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
            res[...] = nisa.tensor_copy(acc, dtype=x.dtype)
            nl.store(out[i * 128 : (i + 1) * 128, j * 512 : (j + 1) * 512], value=res)
    return out


def reference(x, gamma, w):
    x32 = x.astype(np.float32)
    r = 1 / np.sqrt((x32 * x32).mean(axis=1, keepdims=True) + EPS)
    xn = (x32 * r).astype(x.dtype).astype(np.float32) * gamma.astype(np.float32)
    return xn.astype(x.dtype).astype(np.float32) @ w.astype(np.float32)


def kernel(**options):
    return nki.jit(rmsnorm_matmul, **options)
