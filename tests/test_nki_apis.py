"""NKI APIs added on the front end: dynamic NkiTensor.select, nl.gather_flattened, nl.random_seed,
nki.collectives.all_to_all / collective_permute. References are numpy (exact: data movement)."""

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import NotSupportedError

tn.install()

import nki  # noqa: E402
import nki.collectives as cc  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


def test_dynamic_select_reads_the_row_chosen_at_run_time():
    @nki.jit
    def k(table, which):
        out = nl.ndarray((1, table.shape[1]), dtype=table.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=which)
        row = nl.ndarray((1, table.shape[1]), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=table.select(0, idx))
        nisa.dma_copy(dst=out, src=row)
        return out

    table = np.arange(5 * 7, dtype=np.float32).reshape(5, 7)
    for r in (0, 3, 4):
        np.testing.assert_array_equal(k(table, np.array([[r]], np.int32)), table[r : r + 1])


def test_gather_flattened_is_a_per_partition_take():
    @nki.jit
    def k(data, idx):
        out = nl.ndarray(idx.shape, dtype=data.dtype, buffer=nl.shared_hbm)
        g = nl.gather_flattened(nl.load(data), nl.load(idx))
        nl.store(out, value=g)
        return out

    rng = np.random.default_rng(3)
    data = rng.standard_normal((16, 4, 8)).astype(np.float32)
    idx = rng.integers(0, 32, (16, 12)).astype(np.uint32)
    want = np.take_along_axis(data.reshape(16, 32), idx.astype(np.int64), axis=1)
    np.testing.assert_array_equal(k(data, idx), want)


def test_random_seed_makes_rand_reproducible():
    @nki.jit
    def k(a, seed):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.random_seed(seed)
        nl.store(out, value=nl.rand(a.shape, dtype=nl.float32))
        return out

    a = np.zeros((8, 64), np.float32)
    x1, x2, y = k(a, 1234), k(a, 1234), k(a, 99)
    np.testing.assert_array_equal(x1, x2)
    assert not np.array_equal(x1, y)
    assert x1.min() >= 0.0 and x1.max() <= 1.0 and len(np.unique(x1)) > 400


@nki.jit
def _a2a_kernel(x):
    pid = nl.program_id(0)
    n = nl.num_programs(0)
    src = nl.ndarray(x.shape[1:], dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x[pid])
    dst = nl.ndarray(x.shape[1:], dtype=x.dtype, buffer=nl.private_hbm)
    cc.all_to_all(srcs=[src], dsts=[dst], replica_group=cc.ReplicaGroup([list(range(n))]), collective_dim=0)
    perm = nl.ndarray(x.shape[1:], dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=perm, src=src)  # ranks that receive nothing keep this
    cc.collective_permute(srcs=[src], dsts=[perm], source_target_pairs=[(0, 1), (1, 2), (2, 0)])
    res = nl.ndarray((n,) + tuple(x.shape[1:]), dtype=x.dtype, buffer=nl.shared_hbm)
    res2 = nl.ndarray((n,) + tuple(x.shape[1:]), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=res[pid], src=dst)
    nisa.dma_copy(dst=res2[pid], src=perm)
    return res, res2


def test_all_to_all_and_collective_permute():
    n, rows, f = 4, 8, 3
    x = np.arange(n * rows * f, dtype=np.float32).reshape(n, rows, f)
    a2a, perm = _a2a_kernel[n](x)
    c = rows // n
    for i in range(n):
        np.testing.assert_array_equal(a2a[i], np.concatenate([x[j][i * c : (i + 1) * c] for j in range(n)]))
    np.testing.assert_array_equal(perm, np.stack([x[2], x[0], x[1], x[3]]))


@nki.jit
def _ring_kernel(x):
    pid = nl.program_id(0)
    n = nl.num_programs(0)
    group = cc.ReplicaGroup([list(range(n))])
    src = nl.ndarray(x.shape[1:], dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x[pid])
    got = nl.ndarray(x.shape[1:], dtype=x.dtype, buffer=nl.private_hbm)
    cc.collective_permute_implicit([[src]], [[got]], group)
    t = nl.load(src)
    red = nl.ndarray(x.shape[1:], dtype=x.dtype, buffer=nl.private_hbm)
    cc.collective_permute_implicit_reduce([[t]], [[t]], [[red]], group, op=nl.add)
    rid = cc.collective_permute_implicit_current_processing_rank_id(1, group)
    rid_t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(rid_t, rid)
    res = nl.ndarray((n,) + tuple(x.shape[1:]), dtype=x.dtype, buffer=nl.shared_hbm)
    res2 = nl.ndarray((n,) + tuple(x.shape[1:]), dtype=x.dtype, buffer=nl.shared_hbm)
    rids = nl.ndarray((n, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=res[pid], src=got)
    nisa.dma_copy(dst=res2[pid], src=red)
    nisa.dma_copy(dst=rids[pid : pid + 1, :], src=rid_t)
    return res, res2, rids


def test_implicit_ring_permutes_receive_from_the_predecessor():
    n = 4
    x = np.arange(n * 2 * 3, dtype=np.float32).reshape(n, 2, 3)
    got, red, rids = _ring_kernel[n](x)
    pred = [(r - 1) % n for r in range(n)]
    np.testing.assert_array_equal(got, x[pred])
    np.testing.assert_array_equal(red, 2 * x[pred])
    np.testing.assert_array_equal(rids[:, 0], pred)


def test_registers_load_store_and_cross_engine_use():
    @nki.jit
    def k(table, which):
        out = nl.ndarray((1, table.shape[1]), dtype=table.dtype, buffer=nl.shared_hbm)
        idx_out = nl.ndarray((1, 8), dtype=nl.int32, buffer=nl.shared_hbm)
        w = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=w, src=which)
        r = nisa.register_alloc()
        nisa.register_load(r, w)
        r2 = nisa.register_alloc(0)
        nisa.register_move(r2, r)  # copy of a register
        row = nl.ndarray((1, table.shape[1]), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=table.ap([[table.shape[1], 1], [1, table.shape[1]]], scalar_offset=r2))
        nisa.dma_copy(dst=out, src=row)
        it = nl.ndarray((1, 8), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(it, pattern=[[1, 8]], offset=r)  # GpSimd reads the register set on another engine
        nisa.dma_copy(dst=idx_out, src=it)
        back = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_store(back, r2)
        return out, idx_out

    table = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    for r in (1, 5):
        row, it = k(table, np.array([[r]], np.int32))
        np.testing.assert_array_equal(row, table[r : r + 1])
        np.testing.assert_array_equal(it, r + np.arange(8, dtype=np.int32)[None, :])


def test_registers_are_device_values():
    @nki.jit
    def k(a):
        r = nisa.register_alloc(3)
        if r:
            pass

    with pytest.raises(NotSupportedError, match="Python control flow"):
        k(np.zeros((1, 1), np.float32))

    @nki.jit
    def k2(a):
        r = nisa.register_alloc(3)
        for _ in nl.dynamic_range(r):
            pass

    with pytest.raises(NotSupportedError, match="multi-program launch"):
        k2[2](np.zeros((1, 1), np.float32))


@nki.jit
def _device_loops_kernel(a, n):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    total = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.load(a)
    cnt = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cnt, src=n)
    r = nisa.register_alloc()
    nisa.register_load(r, cnt)
    for _ in nl.dynamic_range(r):  # n iterations, n read on the device
        t[...] += 1.0

    def halve_and_count_down(c):  # while c: t *= 2; c -= 1 (the condition lives in SBUF)
        t[...] *= 2.0
        nisa.tensor_scalar(cnt, cnt, op0=nl.add, operand0=-1)
        nxt = nisa.register_alloc()
        nisa.register_load(nxt, cnt)
        return nxt

    nl.while_loop(r, halve_and_count_down)
    acc = nl.zeros((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    one = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)

    def add_i(i):  # i is a register: iota writes its value
        nisa.iota(one, pattern=[[0, 1]], offset=i)
        nisa.tensor_tensor(acc, acc, one, op=nl.add)

    nl.fori_loop(0, r, add_i)
    nl.store(out, value=t)
    nisa.dma_copy(dst=total, src=acc)
    return out, total


def test_device_loops_read_their_bounds_on_the_device():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for n in (0, 1, 3):
        out, total = _device_loops_kernel(a, np.array([[n]], np.int32))
        np.testing.assert_array_equal(out, (a + n) * 2.0**n)
        assert int(total[0, 0]) == sum(range(n))
    assert _device_loops_kernel.device_dependent  # traces depend on device data: never replay them


def test_static_dynamic_range_and_while_loop_unroll():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        for _ in nl.dynamic_range(3):
            t[...] += 1.0

        def body(r):
            t[...] *= 2.0
            return r - 1

        nl.while_loop(2, body)
        nl.store(out, value=t)
        return out

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(k(a), (a + 3) * 4)


def test_tile_operators_compare_and_combine_elementwise():
    @nki.jit
    def k(a, b):
        outs = [nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(6)]
        x, y = nl.load(a), nl.load(b)
        vals = [
            nl.where(x > 0.0, x, 0.0),
            (x >= y).astype(nl.float32),
            nl.equal(x, y).astype(nl.float32),
            abs(x) ** 2.0,
            1.0 / (abs(x) + 1.0),
            (x < y) & (x != 0.0),
        ]
        for o, v in zip(outs, vals):
            nl.store(o, value=nl.copy(v, dtype=nl.float32))
        assert not (x == None) and x != "token"  # noqa: E711 (identity semantics for other objects)
        assert x in [y, x] and [y, x].index(x) == 1 and x != y  # tile vs tile: identity (lists work)
        assert isinstance(x == 0.0, nl.NkiTensor)  # tile vs number: elementwise
        return tuple(outs)

    a = np.array([[-2.0, 0.0, 1.5, 3.0]], np.float32)
    b = np.array([[-2.0, 1.0, 1.0, 4.0]], np.float32)
    r = k(a, b)
    np.testing.assert_array_equal(r[0], np.maximum(a, 0))
    np.testing.assert_array_equal(r[1], (a >= b).astype(np.float32))
    np.testing.assert_array_equal(r[2], (a == b).astype(np.float32))
    np.testing.assert_allclose(r[3], a**2, rtol=1e-6)
    np.testing.assert_allclose(r[4], 1 / (np.abs(a) + 1), rtol=1e-6)
    np.testing.assert_array_equal(r[5], ((a < b) & (a != 0)).astype(np.float32))


def test_nl_matmul_promotes_a_narrow_operand_paired_with_fp32():
    @nki.jit
    def k(x, y):
        out = nl.ndarray((x.shape[1], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.matmul(nl.load(x), nl.load(y), transpose_x=True)  # fp32 x bf16 -> both fp32 on the PE
        nl.store(out, value=p)
        return out

    import ml_dtypes

    rng = np.random.default_rng(9)
    x = rng.integers(-3, 4, (32, 8)).astype(np.float32)
    y = rng.integers(-3, 4, (32, 16)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(k(x, y), x.T @ y.astype(np.float32))  # small integers: exact


def test_nl_matmul_copies_a_psum_operand_to_sbuf():
    """y = nl.transpose(v) lives in PSUM; the PE reads SBUF, so nl.matmul copies it out first."""

    @nki.jit
    def k(a, v):
        out = nl.ndarray((a.shape[0], v.shape[0]), dtype=nl.float32, buffer=nl.shared_hbm)
        vt = nl.transpose(nl.load(v))  # [K, N] in PSUM
        nl.store(out, value=nl.matmul(nl.load(a), vt))  # [M, K] @ [K, N]
        return out

    rng = np.random.default_rng(11)
    a = rng.integers(-3, 4, (16, 32)).astype(np.float32)
    v = rng.integers(-3, 4, (8, 32)).astype(np.float32)
    np.testing.assert_array_equal(k(a, v), a @ v.T)  # small integers: exact


def test_tensor_reduce_accepts_minor_first_axis_numbering():
    @nki.jit
    def k(a):
        out1 = nl.ndarray((a.shape[0], a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray((a.shape[0], a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        r1 = nl.ndarray((a.shape[0], a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        r2 = nl.ndarray((a.shape[0], a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r1, op=nl.maximum, data=t, axis=1)  # older numbering: the last dim
        nisa.tensor_reduce(dst=r2, op=nl.maximum, data=t, axis=(2,))  # documented numbering
        nl.store(out1, value=r1)
        nl.store(out2, value=r2)
        return out1, out2

    a = np.random.default_rng(2).standard_normal((4, 3, 5)).astype(np.float32)
    r1, r2 = k(a)
    np.testing.assert_array_equal(r1, a.max(axis=2))
    np.testing.assert_array_equal(r2, a.max(axis=2))


def test_flatten_dims_merges_contiguous_dims():
    @nki.jit
    def k(a):
        out = nl.ndarray((a.shape[0] * a.shape[1], a.shape[2]), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((a.shape[2], a.shape[0], a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        flat_hbm = a.flatten_dims(start_dim=0, end_dim=1)  # [B*S, H]
        nisa.dma_copy(dst=out, src=flat_hbm)
        nisa.dma_copy(dst=t.flatten_dims(1, 2), src=flat_hbm.permute(1, 0))  # on chip: free dims only
        with pytest.raises(ShapeError, match="partition"):
            t.flatten_dims(0, 1)
        return out

    from trn3emu.errors import ShapeError

    a = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(k(a), a.reshape(6, 4))


def test_reshape_dim_splits_one_dim():
    @nki.jit
    def k(a):
        out = nl.ndarray((a.shape[0], 3, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        assert not t.is_indirect()
        nisa.tensor_copy(
            dst=nl.ndarray((a.shape[0], 3, 4), dtype=a.dtype, buffer=nl.sbuf), src=t.reshape_dim(1, (3, 4))
        )
        nisa.dma_copy(dst=out, src=a.reshape_dim(1, (3, 4)))
        return out

    a = np.arange(2 * 12, dtype=np.float32).reshape(2, 12)
    np.testing.assert_array_equal(k(a), a.reshape(2, 3, 4))


def test_atomic_rmw_scatter_adds_rows_chosen_by_an_index_tile():
    @nki.jit
    def k(table, idx, vals):
        out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(table))
        i_f = nl.arange(table.shape[1])[None, :]
        nl.atomic_rmw(out[nl.load(idx), i_f], value=nl.load(vals), op=np.add)
        return out

    rng = np.random.default_rng(6)
    table = rng.integers(-5, 5, (10, 8)).astype(np.float32)
    idx = np.array([[7], [2], [9], [0]], np.int32)
    vals = rng.integers(-5, 5, (4, 8)).astype(np.float32)
    want = table.copy()
    want[idx[:, 0]] += vals
    np.testing.assert_array_equal(k(table, idx, vals), want)


def test_atomic_rmw_tile_mask_skips_cleared_rows():
    @nki.jit
    def k(table, idx, vals):
        out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(table))
        it = nl.load(idx)
        i_f = nl.arange(table.shape[1])[None, :]
        valid = (it != np.iinfo(np.int32).max).astype(nl.int1)
        nl.atomic_rmw(out[it, i_f], value=nl.load(vals), op=np.add, mask=valid)
        return out

    rng = np.random.default_rng(8)
    table = rng.integers(-5, 5, (10, 8)).astype(np.float32)
    sentinel = np.iinfo(np.int32).max
    idx = np.array([[7], [sentinel], [9], [sentinel], [1]], np.int32)  # cleared rows repeat the sentinel
    vals = rng.integers(-5, 5, (5, 8)).astype(np.float32)
    want = table.copy()
    for r, i in enumerate(idx[:, 0]):
        if i != sentinel:
            want[i] += vals[r]
    np.testing.assert_array_equal(k(table, idx, vals), want)


def test_runtime_offset_tiles_live_as_long_as_their_view():
    # the offset tile is a temporary: its memory must not be reused while the view can still run
    @nki.jit
    def k(table, which):
        out = nl.ndarray((1, table.shape[1]), dtype=table.dtype, buffer=nl.shared_hbm)
        view = table.ap([[table.shape[1], 1], [1, table.shape[1]]], scalar_offset=nl.load(which))
        junk = nl.full((1, 1), 3, dtype=nl.int32, buffer=nl.sbuf)  # would land on the freed index tile
        row = nl.ndarray((1, table.shape[1]), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=view)
        nisa.dma_copy(dst=out, src=row)
        del junk
        return out

    table = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    np.testing.assert_array_equal(k(table, np.array([[5]], np.int32)), table[5:6])


def test_trace_time_tensors_become_shared_constants():
    import nki.tensor as ntensor

    @nki.jit
    def k(x):
        eye = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=eye, src=nl.shared_constant(ntensor.identity(8, dtype=nl.int8), dtype=nl.float32))
        ramp = nl.shared_constant(ntensor.arange(0, 16, 2, dtype=nl.int32), dtype=nl.float32)
        ones = nl.shared_constant(ntensor.zeros((8, 8), dtype=nl.int8) + 1, dtype=nl.int16)
        out = nl.ndarray((3, 8, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        nisa.tensor_tensor(dst=xs, data1=xs, data2=eye, op=nl.multiply)
        nisa.dma_copy(dst=out[0], src=xs)
        nisa.dma_copy(dst=out[1], src=ramp.reshape((1, 8)).broadcast(0, 8))
        o16 = nl.ndarray((8, 8), dtype=nl.int16, buffer=nl.sbuf)
        nisa.dma_copy(dst=o16, src=ones)
        nisa.tensor_copy(dst=xs, src=o16)
        nisa.dma_copy(dst=out[2], src=xs)
        return out

    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    got = k(x)
    np.testing.assert_array_equal(got[0], np.diag(np.diag(x)))
    np.testing.assert_array_equal(got[1], np.tile(np.arange(0, 16, 2, dtype=np.float32), (8, 1)))
    np.testing.assert_array_equal(got[2], np.ones((8, 8), np.float32))
    with pytest.raises(NotSupportedError, match="nki.tensor.nonexistent"):
        ntensor.nonexistent  # noqa: B018


def test_truth_value_of_hbm_arguments_is_existence_and_of_tiles_unsupported():
    @nki.jit
    def k(a, bias=None):
        t = nl.load(a)
        if bias:  # optional HBM argument given or not
            t = nl.add(t, nl.load(bias))
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=t)
        return out

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(k(a), a)
    np.testing.assert_array_equal(k(a, np.ones_like(a)), a + 1)

    @nki.jit
    def branchy(a):
        if nl.load(a) > 0:  # a data-dependent branch
            pass
        return a

    with pytest.raises(NotSupportedError, match="truth value of an on-chip tile"):
        branchy(a)


def test_nki_tensor_module_still_names_the_tensor_type():
    @nki.jit
    def k(a):
        assert isinstance(a, nki.tensor) and not isinstance(3, nki.tensor)
        assert nki.tensor[128, 64] is type(a)  # the subscripted annotation form
        return a

    a = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(k(a), a)
    with pytest.raises(NotSupportedError, match="nki.tensor.missing"):
        nki.tensor.missing  # noqa: B018


def test_host_code_sees_no_launch_and_falls_back_to_the_requested_program_count():
    # nki-library's pattern: size an LNC config on the host, `count or requested`
    requested = 2
    host_count = nl.num_programs(axes=0) if nl.program_ndim() != 0 else 1
    n_prgs = host_count or requested
    assert (nl.program_ndim(), nl.num_programs(), nl.program_id(0)) == (None, None, None)

    @nki.jit
    def k(a):
        assert nl.num_programs(axes=0) == n_prgs  # the launch matches the host config
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        rows = a.shape[0] // n_prgs
        pid = nl.program_id(0)
        t = nl.load(a[pid * rows : (pid + 1) * rows])
        nl.store(out[pid * rows : (pid + 1) * rows], value=nl.multiply(t, float(pid + 1)))
        return out

    a = np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(k[n_prgs](a), np.repeat([[1.0], [2.0]], 2, axis=0) * a)
