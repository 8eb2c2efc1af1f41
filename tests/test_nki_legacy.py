"""The legacy `neuronxcc.nki` dialect on the NKI front end: nl.arange / nl.mgrid index expressions,
mask=, par_dim block tiles, in-place `t[...] += u`, value-returning nisa calls, iota / affine_select
from index expressions, and the simulate_kernel / baremetal / benchmark entry points.

The kernels are written here in the legacy style; every expectation is numpy (exact where the
hardware is exact: copies, integer data, small-integer float sums)."""

import ml_dtypes
import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import NotSupportedError, ShapeError

BF16 = ml_dtypes.bfloat16
tn.install()

import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.isa as lisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402


# ------------------------------------------------------------------------- index expressions
def test_mgrid_strided_copy_reverses_blocks_exactly():
    # out[p, j*4 + i] = in[p, i*3 + j]: a per-partition (4, 3) -> (3, 4) transpose by index arithmetic
    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        ip, i, j = nl.mgrid[0 : a.shape[0], 0:4, 0:3]
        o = nl.ndarray(a.shape, dtype=a.dtype)
        o[ip, j * 4 + i] = nl.copy(t[ip, i * 3 + j])
        nl.store(out, value=o)
        return out

    a = np.arange(7 * 12, dtype=np.int16).reshape(7, 12)
    want = a.reshape(7, 4, 3).transpose(0, 2, 1).reshape(7, 12)
    np.testing.assert_array_equal(k(a), want)


def test_index_expression_over_six_free_dims_splits_into_access_patterns():
    # out[p, x, y, z, a, b, c] = 3 src[p, a + x, b + y, c + z] + src[p, a + 1 - x, b + y, c + z]
    # (trilinear-interpolation style): each read needs 6 free dims, which do not merge (two grid
    # axes step along each tensor dim); an access pattern has 4, so each op is issued per (x, y)
    @lnki.jit
    def k(src):
        P, D, H, W = src.shape
        shape = (P, 2, 2, 2, D - 1, H - 1, W - 1)
        out = nl.ndarray(shape, dtype=src.dtype, buffer=nl.shared_hbm)
        t = nl.load(src)
        o = nl.ndarray(shape, dtype=src.dtype, buffer=nl.sbuf)
        i_p, x, y, z, a, b, c = nl.mgrid[0:P, 0:2, 0:2, 0:2, 0 : D - 1, 0 : H - 1, 0 : W - 1]
        o[i_p, x, y, z, a, b, c] = 3.0 * t[i_p, a + x, b + y, c + z] + t[i_p, a + 1 - x, b + y, c + z]
        nl.store(out, o)
        return out

    src = np.random.default_rng(3).standard_normal((16, 4, 5, 6)).astype(np.float32)
    want = np.empty((16, 2, 2, 2, 3, 4, 5), np.float32)
    for x, y, z in np.ndindex(2, 2, 2):
        near = src[:, x : x + 3, y : y + 4, z : z + 5]
        far = src[:, 1 - x : 4 - x, y : y + 4, z : z + 5]
        want[:, x, y, z] = np.float32(3) * near + far
    np.testing.assert_array_equal(k(src), want)
    text = k.last_programs[0].to_text().splitlines()
    ops = [ln.split(".")[0].split()[0] for ln in text if ln and not ln.startswith(".")]
    assert ops.count("tensor_scalar") == 4 and ops.count("tensor_tensor") == 4  # 2 x 2 (x, y) each


def test_arange_hbm_index_with_offsets_and_grid_attrs():
    # rows 2..5 of an HBM tensor, every second column, via i.p / i.x of an mgrid
    @lnki.jit
    def k(a):
        out = nl.ndarray((4, 5), dtype=a.dtype, buffer=nl.shared_hbm)
        i = nl.mgrid[0:4, 0:5]
        t = nl.load(a[i.p + 2, 2 * i.x + 1])
        nl.store(out[i.p, i.x], value=t)
        return out

    a = np.arange(8 * 10, dtype=np.float32).reshape(8, 10)
    np.testing.assert_array_equal(k(a), a[2:6, 1:10:2])


def test_sum_over_inner_pool_axes_of_a_5d_view():
    # 2x2 average pooling of (C, H, W) through a 5-D index view and a reduction over axes 2 and 4
    @lnki.jit
    def k(x):
        c, h, w = x.shape
        out = nl.ndarray((c, h // 2, w // 2), dtype=x.dtype, buffer=nl.shared_hbm)
        i0, i1, i2, i3, i4 = nl.mgrid[0:c, 0 : h // 2, 0:2, 0 : w // 2, 0:2]
        t = nl.load(x)
        s = nl.sum(t[i0, 2 * i1 + i2, 2 * i3 + i4], axis=[2, 4])
        nl.store(out, value=s * 0.25)
        return out

    x = np.arange(3 * 4 * 6, dtype=np.float32).reshape(3, 4, 6)
    want = x.reshape(3, 2, 2, 3, 2).sum(axis=(2, 4)) * 0.25
    np.testing.assert_array_equal(k(x), want)


def test_index_expression_rules():
    @lnki.jit
    def partition_strided(a):
        t = nl.load(a)
        ip = nl.arange(2)[:, None]
        nl.copy(t[2 * ip, 0])

    with pytest.raises(NotSupportedError, match="partition index"):
        partition_strided(np.zeros((4, 4), np.float32))

    @lnki.jit
    def out_of_bounds(a):
        ip, jf = nl.arange(4)[:, None], nl.arange(8)[None, :]
        nl.load(a[ip, jf])

    with pytest.raises(ShapeError, match="outside"):
        out_of_bounds(np.zeros((4, 4), np.float32))

    with pytest.raises(NotSupportedError, match="affine"):
        nl.arange(4)[:, None] * nl.arange(4)[None, :]


# ------------------------------------------------------------------------------------- masks
def test_masked_tiles_cover_a_ragged_tensor():
    # a (200, 300) tensor in 128 x 256 tiles; the edges are loaded, computed and stored under masks
    @lnki.jit
    def k(a):
        n, m = a.shape
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ip, jf = nl.arange(128)[:, None], nl.arange(256)[None, :]
        for r in nl.affine_range((n + 127) // 128):
            for c in nl.affine_range((m + 255) // 256):
                mask = (r * 128 + ip < n) & (c * 256 + jf < m)
                t = nl.load(a[r * 128 + ip, c * 256 + jf], mask=mask)
                u = nl.multiply(t, 2.0, mask=mask)
                v = nl.add(u, 1.0, mask=mask)
                nl.store(out[r * 128 + ip, c * 256 + jf], value=v, mask=mask)
        return out

    a = np.random.default_rng(0).standard_normal((200, 300)).astype(np.float32)
    np.testing.assert_array_equal(k(a), a * np.float32(2) + np.float32(1))


def test_mask_on_value_returning_isa_leaves_the_rest_untouched():
    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        ip, jf = nl.arange(a.shape[0])[:, None], nl.arange(a.shape[1])[None, :]
        lisa.tensor_scalar(t[ip, jf], np.multiply, 10.0, dst=t[ip, jf], mask=(ip < 3) & (jf >= 2))
        nl.store(out, value=t)
        return out

    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    want = a.copy()
    want[:3, 2:] *= 10
    np.testing.assert_array_equal(k(a), want)


def test_mask_selecting_nothing_issues_no_instruction():
    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        ip = nl.arange(4)[:, None]
        nl.store(out, value=t)
        nl.store(out, value=nl.multiply(t, 0.0), mask=(ip > 10))
        return out

    a = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(k(a), a)


# -------------------------------------------------------------------- par_dim and in-place ops
def test_par_dim_block_tiles_and_inplace_accumulation():
    @lnki.jit
    def k(a):
        nb, p, f = a.shape
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((nb, nl.par_dim(p), f), dtype=nl.float32)
        for _rep in nl.affine_range(3):
            for b in nl.affine_range(nb):
                acc[b, 0:p, 0:f] += nl.load(a[b])
        for b in nl.affine_range(nb):
            acc[b, 0:p, 0:f] -= 1.0
            nl.store(out[b], value=acc[b, 0:p, 0:f])
        return out

    a = np.arange(2 * 8 * 6, dtype=np.float32).reshape(2, 8, 6)
    np.testing.assert_array_equal(k(a), 3 * a - 1)


def test_inplace_ops_on_new_style_tiles():
    import nki
    import nki.isa as nisa

    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        u = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=u, src=b)
        t[...] *= u
        t[:, 0:2] += 1.0
        nisa.dma_copy(dst=out, src=t)
        return out

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 3.0, np.float32)
    want = a * 3
    want[:, :2] += 1
    np.testing.assert_array_equal(k(a, b), want)


def test_inplace_ops_on_value_op_results():
    # `t = nl.add(x, y); t += y` and `t *= 2.0`: the pending result of an nl op updated in place
    # (the pending result's slot once hid the in-place method: a TypeError)
    @lnki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        t = nl.add(x, y)
        t += y
        u = nl.multiply(x, y)
        u *= 2.0
        nl.store(out, value=nl.subtract(t, u))
        return out

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 3.0, np.float32)
    np.testing.assert_array_equal(k(a, b), (a + b + b) - (a * b * 2))


# ------------------------------------------------------------------ value-returning nisa calls
def test_value_returning_isa_ops_match_numpy():
    @lnki.jit
    def k(x, w, s):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        red = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        xt, wt, st = nl.load(x), nl.load(w), nl.load(s)
        e = lisa.activation(op=np.exp, data=xt, scale=st)  # exp(x * s[p])
        prod = lisa.tensor_tensor(e, wt, op=np.multiply)
        scan = lisa.tensor_tensor_scan(wt, prod, initial=0.0, op0=np.multiply, op1=np.add)
        mx = lisa.tensor_reduce(np.max, scan, axis=(1,), keepdims=True)
        nl.store(out, value=scan)
        nl.store(red, value=mx)
        return out, red

    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 32)).astype(np.float32) * 0.3
    w = rng.uniform(0.5, 1.0, (16, 32)).astype(np.float32)
    s = rng.uniform(-1, 1, (16, 1)).astype(np.float32)
    got, gred = k(x, w, s)
    prod = np.exp(x.astype(np.float64) * s) * w
    want = np.zeros_like(prod)
    acc = np.zeros(16)
    for j in range(32):
        acc = w[:, j] * acc + prod[:, j]
        want[:, j] = acc
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(gred[:, 0], want.max(axis=1), rtol=2e-5, atol=1e-6)


def test_value_returning_matmul_psum_accumulation_and_transpose():
    @lnki.jit
    def k(at, b):
        kk, m = at.shape
        out = nl.ndarray((m, b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        tr = nl.ndarray((m, kk), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((m, b.shape[1]), dtype=nl.float32, buffer=nl.psum)
        for c in nl.affine_range(kk // 32):
            acc += lisa.nc_matmul(nl.load(at[c * 32 : (c + 1) * 32, :]), nl.load(b[c * 32 : (c + 1) * 32, :]))
        nl.store(out, value=acc)
        nl.store(tr, value=lisa.nc_transpose(nl.load(at)))
        return out, tr

    rng = np.random.default_rng(2)
    at = rng.integers(-4, 5, (64, 16)).astype(np.float32)
    b = rng.integers(-4, 5, (64, 24)).astype(np.float32)
    got, tr = k(at, b)
    np.testing.assert_array_equal(got, at.T @ b)  # small integers: exact in fp32
    np.testing.assert_array_equal(tr, at.T)


def test_iota_and_affine_select_from_index_expressions():
    @lnki.jit
    def k(x):
        p, f = x.shape
        vals = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.shared_hbm)
        causal = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.shared_hbm)
        ip, jf = nl.arange(p)[:, None], nl.arange(f)[None, :]
        nl.store(vals, value=lisa.iota(3 * ip + 2 * jf + 1, dtype=nl.float32))
        nl.store(causal, value=lisa.affine_select(pred=(ip >= jf), on_true_tile=nl.load(x), on_false_value=-9.0))
        return vals, causal

    x = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    vals, causal = k(x)
    p, f = np.meshgrid(np.arange(6), np.arange(8), indexing="ij")
    np.testing.assert_array_equal(vals, 3 * p + 2 * f + 1)
    np.testing.assert_array_equal(causal, np.where(p >= f, x, -9.0))


def test_legacy_memset_and_dtype_cast():
    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
        m = lisa.memset((a.shape[0], a.shape[1]), 5, dtype=nl.float32)
        s = lisa.tensor_tensor(nl.load(a), m, op=np.add, dtype=nl.int32)
        nl.store(out, value=s)
        return out

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = k(a)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, (a + 5).astype(np.int32))


# ------------------------------------------------------------------------------ entry points
def test_legacy_entry_points_run_on_the_emulator():
    def add_one(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(nl.load(a), 1.0))
        return out

    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(lnki.simulate_kernel(lnki.jit(add_one), a), a + 1)
    np.testing.assert_array_equal(lnki.simulate_kernel(lnki.baremetal(add_one), a), a + 1)
    np.testing.assert_array_equal(lnki.jit(mode="simulation")(add_one)(a), a + 1)
    np.testing.assert_array_equal(lnki.baremetal(save_neff_name="x.neff")(add_one)(a), a + 1)
    bench = lnki.benchmark(warmup=1, iters=2)(add_one)
    np.testing.assert_array_equal(bench(a), a + 1)
    assert bench.benchmark_result.nc_latency.get_latency_percentile(50) > 0
    with pytest.raises(NotSupportedError, match="not supported: neuronxcc.nki.isa.no_such_op"):
        lisa.no_such_op  # noqa: B018


# --------------------------------------------------------------- run-time indices, allocation
def test_runtime_index_from_a_tile_reads_the_chosen_columns():
    @lnki.jit
    def k(src, offs):
        out = nl.ndarray((src.shape[0], offs.shape[1]), dtype=src.dtype, buffer=nl.shared_hbm)
        s = nl.load(src)
        o = nl.load(offs)
        res = nl.ndarray((src.shape[0], offs.shape[1]), dtype=src.dtype)
        ip, jf = nl.mgrid[0 : src.shape[0], 0:1]
        for i in nl.affine_range(offs.shape[1]):
            res[ip, i + jf] = lisa.tensor_copy_dynamic_src(s[ip, o[0, i] + jf])
        nl.store(out, value=res)
        return out

    src = np.arange(16 * 40, dtype=np.float32).reshape(16, 40)
    offs = np.array([[7, 0, 39, 12, 12]], np.int32)
    np.testing.assert_array_equal(k(src, offs), src[:, offs[0]])


def test_direct_allocation_places_tiles_where_the_function_says():
    import neuronxcc.nki.compiler as ncc

    def at(base):
        return lambda idx, p, f: (0, base)

    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((nl.par_dim(a.shape[0]), a.shape[1]), dtype=a.dtype, buffer=ncc.sbuf.alloc(at(4096)))
        alias = nl.ndarray((a.shape[0], a.shape[1]), dtype=a.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=4096))
        acc = nl.ndarray((a.shape[0], a.shape[1]), dtype=nl.float32, buffer=ncc.psum.mod_alloc(base_bank=3))
        t[...] = nl.load(a)
        acc[...] = nl.copy(alias)  # alias shares t's bytes
        nl.store(out, value=acc)
        return out, t.tensor.offset, acc.tensor.offset

    a = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    got, t_off, acc_off = k(a)
    np.testing.assert_array_equal(got, a)
    assert (t_off, acc_off) == (4096, 3 * 2048)


def test_psum_allocation_functions_name_a_bank():
    import neuronxcc.nki.compiler as ncc

    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        # PSUM placement functions return (bank, partition, byte address in the bank)
        acc = nl.ndarray(a.shape, dtype=nl.float32, buffer=ncc.psum.alloc(lambda idx, p, f: (5, 0, 0)))
        mod = nl.ndarray(a.shape, dtype=nl.float32, buffer=ncc.psum.mod_alloc(base_addr=0, base_bank=2))
        acc[...] = nl.load(a)
        mod[...] = nl.copy(acc)
        nl.store(out, value=mod)
        return out, acc.tensor.offset, mod.tensor.offset

    a = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    got, acc_off, mod_off = k(a)
    np.testing.assert_array_equal(got, a)
    assert (acc_off, mod_off) == (5 * 2048, 2 * 2048)


def test_returned_sbuf_tiles_come_back_as_arrays_and_store_fills_scalars():
    @lnki.jit
    def k(a):
        filled = nl.ndarray((200, 3), dtype=nl.int32, buffer=nl.shared_hbm)
        nl.store(filled, 7)
        return nl.multiply(nl.load(a), 3.0), filled

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    tile, filled = k(a)
    np.testing.assert_array_equal(tile, a * 3)
    np.testing.assert_array_equal(filled, np.full((200, 3), 7, np.int32))


def test_fp_info_namespaces_and_ordered_nc_version():
    assert nl.fp32.min == float(np.finfo(np.float32).min) and nl.fp16.max == 65504.0
    assert nl.bf16.max == float(ml_dtypes.finfo(BF16).max)
    assert lisa.nc_version.gen2 < lisa.nc_version.gen3 < lisa.get_nc_version()
    # host-side code (outside a kernel) sees no launch: no values
    assert (nl.program_ndim(), nl.num_programs(), nl.program_id(0)) == (None, None, None)


def test_double_row_generation_spelling_and_block_tile_whole_index():
    @lnki.jit
    def k(a, b):
        out = nl.ndarray((a.shape[2], b.shape[2]), dtype=nl.float32, buffer=nl.shared_hbm)
        blk = nl.ndarray((2, nl.par_dim(a.shape[0]), a.shape[2]), dtype=a.dtype)
        blk[1] = nl.load(a[:, 0, :])
        c = lisa.nc_matmul(nl.load(a), nl.load(b), perf_mode="double_row_gen3")
        nl.store(out, value=c)
        return out

    a = np.ones((128, 2, 16), dtype=ml_dtypes.float8_e5m2)
    b = np.full((128, 2, 64), 2.0, dtype=ml_dtypes.float8_e5m2)
    want = np.einsum("kli,klj->ij", a.astype(np.float32), b.astype(np.float32))
    np.testing.assert_array_equal(k(a, b), want)


def test_view_dims_follow_the_key_and_masked_bn_stats():
    # dims come from the key positions (a size-1 mgrid index first gives a [1, F] view), and
    # bn_stats under a mask sees only the masked columns of a ragged last chunk.
    @lnki.jit
    def k(x, w):
        f = x.shape[1]
        mv = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
        wrow = nl.ndarray((1, f), dtype=w.dtype, buffer=nl.shared_hbm)
        ip, jf, one = nl.mgrid[0 : x.shape[0], 0:f, 0:1]
        wt = nl.load(w.reshape((1, f))[one, jf])
        nl.store(wrow, value=wt)
        t = nl.load(x)
        ib, js = nl.mgrid[0:512, 0:6]
        n = (f + 511) // 512
        stats = nl.ndarray((x.shape[0], 6 * n), dtype=nl.float32)
        for c in nl.affine_range(n):
            stats[ip, c * 6 + js] = lisa.bn_stats(t[ip, c * 512 + ib], mask=(c * 512 + ib < f), dtype=nl.float32)
        nl.store(mv, value=lisa.bn_aggr(stats))
        return mv, wrow

    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 700)).astype(np.float32)
    w = rng.standard_normal(700).astype(np.float32)
    mv, wrow = k(x, w)
    np.testing.assert_array_equal(wrow, w[None, :])
    np.testing.assert_allclose(mv[:, 0], x.astype(np.float64).mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mv[:, 1], x.astype(np.float64).var(1), rtol=1e-4, atol=1e-6)


def test_legacy_dma_transpose_returns_the_transposed_tile_and_lazy_zeros():
    @lnki.jit
    def k(a):
        out = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((a.shape[1], a.shape[0]), dtype=nl.float32, buffer=nl.psum, lazy_initialization=True)
        t = lisa.dma_transpose(nl.load(a))
        acc += nl.copy(t, dtype=nl.float32)
        nl.store(out, value=nl.copy(acc, dtype=a.dtype))
        return out

    a = (np.arange(16 * 32) % 251).astype(BF16).reshape(16, 32)
    np.testing.assert_array_equal(k(a), a.T)


def test_assigning_a_masked_result_writes_only_the_masked_part():
    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        ip, jf = nl.mgrid[0 : a.shape[0], 0 : a.shape[1]]
        t[...] = nl.multiply(t, 10.0, mask=(jf < 2))  # columns >= 2 keep their values
        t[...] = lisa.tensor_scalar(t, np.add, 1.0, mask=False)  # masked off entirely: no change
        t[...] = lisa.affine_select(pred=(ip >= jf), on_true_tile=t, on_false_value=-1.0, mask=(jf >= 3))
        nl.store(out, value=t)
        return out

    a = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    want = a.copy()
    want[:, :2] *= 10
    p, f = np.meshgrid(np.arange(4), np.arange(6), indexing="ij")
    want = np.where((f >= 3) & (p < f), -1.0, want)
    np.testing.assert_array_equal(k(a), want)


def test_static_cast_on_host_arrays_and_tiles():
    x = np.array([1.7, -2.2], np.float64)
    got = nl.static_cast(x, nl.bfloat16)
    assert got.dtype == BF16 and np.array_equal(got, x.astype(BF16))

    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
        nl.store(out, value=nl.static_cast(nl.load(a), nl.int32))
        return out

    np.testing.assert_array_equal(k(np.array([[1.0, 2.0, -3.0]], np.float32)), [[1, 2, -3]])


def test_spmd_dim_with_nc_multiplies_the_grid_axis():
    assert nl.spmd_dim(3, nl.nc(2)) == 6

    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ix = nl.program_id(0) * 4 + nl.arange(4)[:, None]
        iy = nl.arange(a.shape[1])[None, :]
        nl.store(out[ix, iy], value=nl.add(nl.load(a[ix, iy]), nl.program_id(0)))
        return out

    a = np.zeros((4 * 6, 8), np.float32)
    want = np.repeat(np.arange(6, dtype=np.float32), 4)[:, None] * np.ones((1, 8), np.float32)
    np.testing.assert_array_equal(k[nl.spmd_dim(3, nl.nc(2))](a), want)


def test_compiler_allocation_spaces_name_unsupported_apis():
    import neuronxcc.nki.compiler as ncc

    assert ncc.sbuf.auto_alloc() == "sbuf" and ncc.psum.auto_alloc() == "psum"
    with pytest.raises(NotSupportedError, match="not supported: nki.compiler.sbuf.no_such_alloc"):
        ncc.sbuf.no_such_alloc  # noqa: B018
    with pytest.raises(NotSupportedError, match="not supported: nki.language.no_such_api"):
        nl.no_such_api  # noqa: B018


def test_legacy_all_reduce_over_program_axes():
    @lnki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(1)
        t = nl.load(x[i, j])
        r = nl.all_reduce(t, op=np.add, program_axes=[0])  # sum over i for each j
        nl.store(out[i, j], value=r)
        return out

    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    want = np.broadcast_to(x.sum(axis=0, keepdims=True), x.shape)
    np.testing.assert_array_equal(k[2, 3](x), want)


def test_value_returning_local_gather_is_partition_by_index_by_element():
    @lnki.jit
    def k(src, idx):
        return lisa.local_gather(nl.load(src), nl.load(idx), num_elem_per_idx=2, num_valid_indices=3)

    rng = np.random.default_rng(3)
    src = rng.standard_normal((32, 8, 2)).astype(np.float32)
    idx = (rng.integers(0, 8, (32, 2)) * 2).astype(np.uint16)  # element offsets of 2-element pairs
    got = k(src, idx)
    assert got.shape == (32, 3, 2)
    flat = src.reshape(32, 16)
    for g in range(2):  # GpSimd core g: partitions 16g..16g+15 share its index list
        offs = idx[16 * g : 16 * g + 16].flatten(order="F")[:3]
        for p in range(16 * g, 16 * g + 16):
            want = np.stack([flat[p, o : o + 2] for o in offs])
            np.testing.assert_array_equal(got[p], want)


def test_value_returning_matmul_assigned_into_psum_needs_no_extra_bank():
    # 8 live PSUM tiles fill the 8 banks; `psum[...] = nisa.nc_matmul(...)` writes into psum directly
    @lnki.jit
    def k(a, b):
        ts = [lisa.nc_transpose(nl.load(a)) for _ in range(4)]  # 4 PSUM results stay live
        accs = [nl.ndarray((a.shape[0], b.shape[1]), dtype=nl.float32, buffer=nl.psum) for _ in range(4)]
        bt = nl.load(b)
        for i in range(4):
            accs[i][...] = lisa.nc_matmul(ts[i], bt)  # the transposes go through SBUF as operands
        out = nl.ndarray((4, a.shape[0], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in range(4):
            nl.store(out[i], value=nl.copy(accs[i]))
        return out

    rng = np.random.default_rng(9)
    a = rng.standard_normal((32, 16)).astype(np.float32)
    b = rng.standard_normal((16, 24)).astype(np.float32)
    got = k(a, b)
    for i in range(4):
        np.testing.assert_allclose(got[i], a @ b, rtol=1e-5, atol=1e-5)  # stationary a^T: [K, M] -> a @ b


def test_pending_legacy_result_keeps_program_order():
    # the result is issued before the next instruction: changing an input afterwards does not reach it
    @lnki.jit
    def k(a, b):
        at, bt = nl.load(a), nl.load(b)
        r = lisa.nc_matmul(at, bt)  # [K, M] x [K, N] -> [M, N]
        at[...] = nl.multiply(at, 0.0)
        out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=nl.copy(r))
        return out

    rng = np.random.default_rng(10)
    a = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal((16, 12)).astype(np.float32)
    np.testing.assert_allclose(k(a, b), a.T @ b, rtol=1e-5, atol=1e-5)


def test_loop_reduce_accumulates_into_the_assignment_target():
    @lnki.jit
    def k(a):
        acc = nl.zeros((a.shape[1], a.shape[2]), dtype=nl.float32, buffer=nl.sbuf)
        best = nl.full((a.shape[1], a.shape[2]), -1e30, dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(a.shape[0]):
            t = nl.load(a[i])
            acc[...] = nl.loop_reduce(t, op=np.add, loop_indices=[i], dtype=nl.float32)
            best[...] = nl.loop_reduce(t, op=np.maximum, loop_indices=[i], mask=(i != 1))  # skips i == 1
        out = nl.ndarray((2, a.shape[1], a.shape[2]), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], value=acc)
        nl.store(out[1], value=best)
        return out

    a = np.random.default_rng(12).standard_normal((4, 8, 16)).astype(np.float32)
    got = k(a)
    np.testing.assert_allclose(got[0], ((a[0] + a[1]) + a[2]) + a[3], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[1], np.maximum.reduce(a[[0, 2, 3]]))
    with pytest.raises(NotSupportedError, match="loop_reduce result used"):
        nl.loop_reduce(None, op=np.add, loop_indices=[0]).shape  # noqa: B018


def test_view_dims_after_the_first_key_follow_the_grid_axes():
    # windows[c, oh, ow, kh, kw] = x[c, 2*oh + kh, 2*ow + kw]: a 2x2 stride-2 max pool
    @lnki.jit
    def k(x):
        c, h, w = x.shape
        i0 = nl.arange(c)[:, None, None, None, None]
        i1 = nl.arange(h // 2)[None, :, None, None, None]
        i2 = nl.arange(w // 2)[None, None, :, None, None]
        i3 = nl.arange(2)[None, None, None, :, None]
        i4 = nl.arange(2)[None, None, None, None, :]
        t = nl.load(x)
        # a two-index mask that holds on the whole grid restricts nothing
        m = nl.max(t[i0, 2 * i1 + i3, 2 * i2 + i4], axis=[3, 4], mask=(2 * i1 + i3 < h) & (2 * i2 + i4 >= 0))
        out = nl.ndarray((c, h // 2, w // 2), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=m)
        return out

    x = np.random.default_rng(13).standard_normal((4, 6, 8)).astype(np.float32)
    want = x.reshape(4, 3, 2, 4, 2).max(axis=(2, 4))
    np.testing.assert_array_equal(k(x), want)


def test_two_index_masks_hold_everywhere_nowhere_or_are_refused():
    @lnki.jit
    def k(x, lim):
        i_p, i_f = nl.mgrid[0 : x.shape[0], 0 : x.shape[1]]
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.zeros(x.shape, dtype=x.dtype, buffer=nl.sbuf))
        nl.store(out[i_p, i_f], value=nl.load(x), mask=(i_p + i_f < lim))
        return out

    x = np.ones((4, 5), np.float32)
    np.testing.assert_array_equal(k(x, 100), x)  # true on the whole grid
    np.testing.assert_array_equal(k(x, 0), np.zeros_like(x))  # false everywhere: nothing stored
    with pytest.raises(NotSupportedError, match="on two indices"):
        k(x, 4)  # a triangle


def test_language_constants_sizeinbytes():
    import nki.language.constants as lc
    from neuronxcc.nki.language.constants import sizeinbytes

    assert lc.sizeinbytes is sizeinbytes
    assert [sizeinbytes(d) for d in (nl.bfloat16, nl.float32, nl.int8, np.float16)] == [2, 4, 1, 2]


def test_masked_transpose_of_a_ragged_tile():
    # the mask names the source's rows and columns; the transposed result has them swapped
    @lnki.jit
    def k(x):
        b, n = x.shape
        out = nl.ndarray((n, b), dtype=x.dtype, buffer=nl.shared_hbm)
        i = nl.arange(128)[:, None]
        j = nl.arange(128)[None, :]
        src = nl.ndarray((128, 128), dtype=x.dtype, buffer=nl.sbuf)
        src[i, j] = nl.load(x[i, j], mask=(i < b) & (j < n))
        p = nl.arange(128)[:, None]
        q = nl.arange(128)[None, :]
        t = nl.ndarray((128, 128), dtype=x.dtype, buffer=nl.sbuf)
        t[p, q] = lisa.nc_transpose(src[i, j], mask=(i < b) & (j < n))
        nl.store(out[p, q], t[p, q], mask=(q < b) & (p < n))
        return out

    x = np.random.default_rng(14).standard_normal((22, 100)).astype(np.float32)
    np.testing.assert_array_equal(k(x), x.T)


def test_ds_window_past_the_end_needs_and_takes_a_mask():
    @lnki.jit
    def k(x):
        n, f = x.shape
        out = nl.ndarray((n, f), dtype=x.dtype, buffer=nl.shared_hbm)
        for t in nl.affine_range((n + 127) // 128):
            i_p, i_f = nl.mgrid[0:128, 0:f]
            # the window keeps 128 rows; the mask drops those past the end
            tile = nl.load(x[nl.ds(t * 128, 128), :], mask=(t * 128 + i_p < n)).reshape((128, f))
            nl.store(out[nl.ds(t * 128, 128), :], value=nl.multiply(tile, 2.0), mask=(t * 128 + i_p < n))
        return out

    x = np.random.default_rng(15).standard_normal((150, 6)).astype(np.float32)
    np.testing.assert_array_equal(k(x), x * 2)

    @lnki.jit
    def unmasked(x):
        return nl.load(x[nl.ds(0, 128), :])

    with pytest.raises(ShapeError, match="outside"):
        unmasked(x[:50])


def test_hbm_index_views_take_the_grid_axes_in_order_a_transposed_store_and_load():
    """An HBM view's dims follow the index grid's axes (numpy's advanced indexing), not the key's
    positions: `out[q0 + i_f, i_p] = tile[P, F]` stores the tile transposed (the Stable Diffusion
    attention tutorial's output store) and `nl.load(x[q0 + i_f, i_p])` loads a transposed block.
    Integer data, so every element is compared exactly against numpy's transpose."""

    @lnki.jit
    def k(a, x):
        p, f = a.shape
        out = nl.ndarray((2 * f, p), dtype=a.dtype, buffer=nl.shared_hbm)
        back = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(p)[:, None]
        i_f = nl.arange(f)[None, :]
        t = nl.load(a)
        for b in nl.affine_range(2):
            nl.store(out[b * f + i_f, i_p], value=t)  # [P, F] tile into rows b*F.. of out[2F, P]
        nl.store(back, value=nl.load(x[f + i_f, i_p]))  # a [P, F] tile of x[F.., :] transposed
        return out, back

    rng = np.random.default_rng(16)
    a = rng.integers(-(2**31), 2**31, (64, 96), dtype=np.int64).astype(np.int32)
    x = rng.integers(-(2**31), 2**31, (192, 64), dtype=np.int64).astype(np.int32)
    out, back = k(a, x)
    np.testing.assert_array_equal(out, np.concatenate([a.T, a.T]))
    np.testing.assert_array_equal(back, x[96:].T)


def test_an_hbm_view_without_grid_axis_0_has_a_size_1_partition_dim():
    """`w[i_f]` with i_f = arange(F)[None, :] indexes grid axis 1 only: the view is [1, F] (numpy
    gives w[i_f] the shape (1, F)), a one-partition tile."""

    @lnki.jit
    def k(w):
        f = w.shape[0]
        row = nl.ndarray((1, f), dtype=w.dtype, buffer=nl.shared_hbm)
        i_f = nl.arange(f)[None, :]
        t = nl.load(w[i_f])
        assert tuple(t.shape) == (1, f)
        nl.store(row, value=t)
        return row

    w = np.arange(300, dtype=np.int32) * 7 - 1000
    np.testing.assert_array_equal(k(w), w[None, :])


def test_placing_functions_get_their_arguments_by_name_reshape_by_keyword_and_finfo():
    """The direct-allocation API pages name the placing function's arguments (idx, pdim_size,
    fdim_size): nki-samples' allocated attention binds its own first parameter with
    functools.partial(f, bank_map=...), which works only when they are passed by name. Legacy
    kernels also call `t.reshape(shape=...)` and `nl.finfo(dtype).min`."""
    import functools

    import neuronxcc.nki.compiler as ncc

    def bank_of(bank_map, idx, pdim_size, fdim_size):
        return (bank_map[idx], 0, 0)

    @lnki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        flat = nl.ndarray((a.shape[0] * a.shape[1],), dtype=a.dtype, buffer=nl.shared_hbm)
        acc = nl.ndarray(a.shape, dtype=nl.float32, buffer=ncc.psum.alloc(functools.partial(bank_of, bank_map={(): 6})))
        acc[...] = nl.load(a)
        t = nl.copy(acc, dtype=a.dtype)
        nl.store(out, value=t)
        nl.store(flat.reshape(shape=a.shape), value=t)
        return out, flat, acc.tensor.offset

    a = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    got, flat, acc_off = k(a)
    np.testing.assert_array_equal(got, a)
    np.testing.assert_array_equal(flat, a.ravel())
    assert acc_off == 6 * 2048
    assert nl.finfo(nl.bfloat16).min == float(ml_dtypes.finfo(BF16).min)
    assert nl.finfo(np.float32).max == float(np.finfo(np.float32).max)


def test_a_slice_past_the_end_is_a_view_a_mask_brings_in_bounds():
    """nki-samples' adaptive average pool slices its last partial tile of rows past the end under
    `mask=(i_p < N)`: in the legacy dialect such a slice is an out-of-bounds view like an index
    expression past the end, usable once a mask brings it in bounds; without a mask it is an
    error at the instruction. (NKI 0.6 refuses the slice itself: test_nki_mistakes.)"""

    def make(masked):
        @lnki.jit
        def k(a):
            n = a.shape[0]
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            for t in nl.affine_range((n + 127) // 128):
                i_p = nl.arange(128)[:, None] + t * 128
                buf = nl.ndarray((128, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
                if masked:
                    lisa.dma_copy(src=a[t * 128 : t * 128 + 128, :], dst=buf, mask=(i_p < n))
                    nl.store(out[t * 128 : t * 128 + 128, :], value=buf, mask=(i_p < n))
                else:
                    lisa.dma_copy(src=a[t * 128 : t * 128 + 128, :], dst=buf)
            return out

        return k

    a = np.arange(200 * 6, dtype=np.int32).reshape(200, 6) * 3 - 7
    np.testing.assert_array_equal(make(True)(a), a)
    with pytest.raises(ShapeError) as e:
        make(False)(a)
    assert e.value.rule == "nki_index_out_of_bounds"


def test_fewer_block_indices_give_the_block_tile_of_the_remaining_block_dims():
    """`t[h]` of a (heads, tiles, par_dim(P), 1) block tile handed to a helper that indexes
    `[i, :, 0]` (nki-samples' flash attention backward, `dy_o_sum[i_q_head]`): writes through the
    sub-view land in t's own blocks. Row sums of integers: exact."""

    def rowsums(dst, x_hbm, tiles):
        for i in nl.affine_range(tiles):
            dst[i, :, 0] = nisa_sum(nl.load(x_hbm[i * 128 : (i + 1) * 128, :]))

    def nisa_sum(t):
        return lisa.tensor_reduce(np.add, data=t, axis=(1,), dtype=nl.float32)

    @lnki.jit
    def k(x):
        heads, rows, f = x.shape
        tiles = rows // 128
        out = nl.ndarray((heads, tiles, 128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((heads, tiles, nl.par_dim(128), 1), dtype=nl.float32)
        for h in nl.affine_range(heads):
            rowsums(acc[h], x[h], tiles)
        for h in nl.affine_range(heads):
            for i in nl.affine_range(tiles):
                nl.store(out[h, i], value=acc[h, i])
        return out

    x = np.random.default_rng(17).integers(-100, 100, (3, 256, 40)).astype(np.float32)
    got = k(x)
    np.testing.assert_array_equal(got[..., 0], x.sum(axis=2).reshape(3, 2, 128))


def test_legacy_pe_transpose_returns_its_input_dtype():
    """A value-returning `nisa.nc_matmul(x, identity, is_transpose=True)` writes x's dtype (fp16 here),
    not the fp32 of a matmul (nki-samples' allocated fused RMSNorm-QKV transposes fp16 tiles so);
    the transposed bits equal numpy's transpose."""

    @lnki.jit
    def k(x, ident):
        out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        i = nl.load(ident)
        tp = lisa.nc_matmul(t, i, is_transpose=True)
        assert tp.dtype == nl.float16
        nl.store(out, value=nl.copy(tp, dtype=x.dtype))
        return out

    x = np.random.default_rng(19).standard_normal((128, 96)).astype(np.float16)
    got = k(x, np.eye(128, dtype=np.float16))
    np.testing.assert_array_equal(got.view(np.uint16), x.T.view(np.uint16))


def test_a_masked_row_gather_reads_only_the_kept_rows():
    """`nl.load(t[b, idx, i_f], mask=(i_p < n))` (nki-samples' nearest-neighbour resize gathers a
    last partial tile of rows so): the mask keeps rows 0..n of the gather, each still reading the
    row its index names; the rows past n are neither read (their indices may be out of range) nor
    written. Integer data, compared exactly with numpy's fancy indexing."""

    @lnki.jit
    def k(table, idx, n):
        out = nl.ndarray((128, table.shape[2]), dtype=table.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(table.shape[2])[None, :]
        rows = nl.load(idx)
        got = nl.load(table[1, rows, i_f], mask=(i_p < n))
        nl.store(out[i_p, i_f], value=got, mask=(i_p < n))
        return out

    rng = np.random.default_rng(23)
    table = rng.integers(-(2**31), 2**31, (2, 50, 24), dtype=np.int64).astype(np.int32)
    n = 70
    idx = np.full((128, 1), 10**6, dtype=np.int32)  # rows past n name no row of the table
    idx[:n, 0] = rng.integers(0, 50, n)
    got = k(table, idx, n)
    np.testing.assert_array_equal(got[:n], table[1, idx[:n, 0]])


def test_a_row_gather_sliced_past_its_first_rows_uses_their_indices():
    """A slice lo:hi of a row gather's rows reads with index-tile rows lo:hi (not 0:hi-lo)."""

    @lnki.jit
    def k(table, idx):
        out = nl.ndarray((32, table.shape[1]), dtype=table.dtype, buffer=nl.shared_hbm)
        rows = nl.load(idx)
        g = table[rows, nl.arange(table.shape[1])[None, :]]
        nl.store(out, value=nl.load(g[16:48]))
        return out

    rng = np.random.default_rng(29)
    table = rng.integers(-1000, 1000, (40, 12)).astype(np.int32)
    idx = rng.integers(0, 40, (64, 1)).astype(np.int32)
    np.testing.assert_array_equal(k(table, idx), table[idx[16:48, 0]])


def test_iota_of_mgrid_variables_spans_the_whole_grid():
    """numpy's mgrid arrays are dense, so `3 * g.y + g.z` of `g = nl.mgrid[0:P, 0:X, 0:Y, 0:Z]` has
    the whole grid's shape; `nisa.iota` of it is a [P, X, Y, Z] tile (nki-samples' select-and-scatter
    compares it element-wise with a [P, X, Y, Z] mask). An `nl.arange` expression stays open."""

    @lnki.jit
    def k():
        dense = nl.ndarray((4, 5, 3, 3), dtype=nl.int32, buffer=nl.shared_hbm)
        open_ = nl.ndarray((1, 7), dtype=nl.int32, buffer=nl.shared_hbm)
        g = nl.mgrid[0:4, 0:5, 0:3, 0:3]
        t = lisa.iota(3 * g.y + g.z, dtype=nl.int32)
        assert tuple(t.shape) == (4, 5, 3, 3)
        nl.store(dense, value=t)
        nl.store(open_, value=lisa.iota(2 * nl.arange(7)[None, :] + 1, dtype=nl.int32))
        return dense, open_

    dense, open_ = k()
    p, x, y, z = np.mgrid[0:4, 0:5, 0:3, 0:3]
    np.testing.assert_array_equal(dense, 3 * y + z)
    np.testing.assert_array_equal(open_, (2 * np.arange(7) + 1)[None, :])
