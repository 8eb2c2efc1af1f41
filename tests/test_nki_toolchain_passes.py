"""The legacy toolchain's passes (docs/nki.md, "Compiler passes"): in-place assignment, load reuse,
and `mask=` on `nc_matmul`. Each kernel is written here in the legacy dialect; results are compared
with numpy, and the instruction counts / HBM bytes with the literal program (`passes="literal"`)
and with counts worked out by hand from the kernel's source."""

import re
from collections import Counter

import ml_dtypes
import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import OperandError

BF16 = ml_dtypes.bfloat16
tn.install()

import neuronxcc.nki as lnki  # noqa: E402
import neuronxcc.nki.isa as lisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402


def opcodes(kernel) -> Counter:
    """Instruction count per opcode of the last launch's program (core 0)."""
    text = kernel.last_programs[0].to_text().splitlines()
    return Counter(line.split(".")[0].split()[0] for line in text if line and not line.startswith("."))


def both(fn, *arrays, **options):
    """(result, opcode counts) with the default passes and with the literal program."""
    out = []
    for passes in (None, "literal"):
        k = lnki.jit(fn, passes=passes, **options) if passes else lnki.jit(fn, **options)
        r = k(*arrays)
        out.append((r, opcodes(k), k))
    return out


# ----------------------------------------------------------------------- inplace_assign
def _chain(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    t = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    t[...] = lisa.tensor_tensor(x, y, op=np.add)  # nisa value form
    u = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    u[...] = nl.exp(t)  # nl value form
    u[...] = lisa.tensor_scalar(u, np.multiply, 2.0)  # dst = the operand's own view: in place
    m = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
    m[...] = nl.max(u, axis=1)  # a reduction into a fitting tile
    v = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    v[...] = nl.subtract(u, m)  # [P, 1] column operand
    nl.store(out, v)
    return out


def test_legacy_assignments_write_their_destination():
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((128, 96)).astype(np.float32) for _ in range(2))
    (r, ops, _), (r_lit, ops_lit, _) = both(_chain, a, b)
    u = np.exp(a + b) * 2
    want = u - u.max(axis=1, keepdims=True)
    np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_array_equal(r, r_lit)  # the same bits as the literal program
    # literal: each of the 5 assignments is its op into a temporary plus a Vector tensor_copy;
    # with the pass: the 5 ops write t, u, u, m, v themselves
    assert ops_lit["tensor_copy"] == 5
    assert ops["tensor_copy"] == 0
    assert sum(ops.values()) == sum(ops_lit.values()) - 5 == 2 + 5 + 1


def test_dtype_conversion_keeps_its_copy_where_writing_directly_would_round_differently():
    # bf16 inputs: tensor_tensor's result is bf16 (the promoted input dtype); assigning it to an
    # fp32 tile converts the rounded bf16 values, so writing fp32 directly would keep more bits:
    # the copy stays. An fp32 result assigned to a bf16 tile rounds once either way: fused.
    def k(a, b):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        out2 = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.load(b)
        wide = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        wide[...] = lisa.tensor_tensor(x, y, op=np.multiply)  # bf16 result -> fp32: copy
        narrow = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
        narrow[...] = lisa.tensor_scalar(wide, np.add, 1.0)  # fp32 result -> bf16: direct
        nl.store(out, wide)
        nl.store(out2, narrow)
        return out, out2

    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((64, 40)).astype(BF16) for _ in range(2))
    ((w, n), ops, _), ((w_lit, n_lit), ops_lit, _) = both(k, a, b)
    prod = (a.astype(np.float32) * b.astype(np.float32)).astype(BF16).astype(np.float32)
    np.testing.assert_array_equal(w, prod)  # rounded to bf16 first, as written
    np.testing.assert_array_equal(n, (prod + 1).astype(BF16))
    np.testing.assert_array_equal(w, w_lit)
    np.testing.assert_array_equal(n.view(np.uint16), n_lit.view(np.uint16))
    assert (ops["tensor_copy"], ops_lit["tensor_copy"]) == (1, 2)


def test_overlapping_source_and_destination_keep_the_copy():
    # a shift by one column within one tile: writing in place would read already-shifted
    # elements on a streaming engine, so the result goes through a temporary as written
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        t[...] = lisa.tensor_copy(x)  # fused: no overlap
        t[:, 1:] = lisa.tensor_scalar(t[:, :-1], np.add, 1.0)  # overlaps, not the same view: copy
        nl.store(out, t)
        return out

    a = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
    (r, ops, _), (r_lit, ops_lit, _) = both(k, a)
    want = a.copy()
    want[:, 1:] = a[:, :-1] + 1
    np.testing.assert_array_equal(r, want)
    np.testing.assert_array_equal(r_lit, want)
    # literal: tensor_copy (the op) + copy, tensor_scalar + copy; passes: the first copy only fused
    assert (ops["tensor_copy"], ops_lit["tensor_copy"]) == (2, 3)


def test_broadcasting_assignment_keeps_the_copy():
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        t[...] = nl.max(x, axis=1, keepdims=True)  # [P, 1] broadcast along the free dim
        nl.store(out, t)
        return out

    a = np.random.default_rng(2).standard_normal((32, 16)).astype(np.float32)
    (r, ops, _), (_, ops_lit, _) = both(k, a)
    np.testing.assert_array_equal(r, np.broadcast_to(a.max(axis=1, keepdims=True), a.shape))
    assert ops["tensor_copy"] == ops_lit["tensor_copy"] == 1


def test_nki_06_kernels_stay_literal_unless_asked():
    import nki
    import nki.language as nl6

    def k(a):
        out = nl6.ndarray(a.shape, a.dtype, buffer=nl6.shared_hbm)
        x = nl6.load(a)
        t = nl6.ndarray(a.shape, a.dtype, buffer=nl6.sbuf)
        t[...] = nl6.exp(x)
        nl6.store(out, t)
        return out

    a = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
    literal = nki.jit(k)
    np.testing.assert_allclose(literal(a), np.exp(a), rtol=1e-6)
    assert opcodes(literal)["tensor_copy"] == 1  # NKI 0.6: as written
    asked = nki.jit(k, passes={"inplace_assign": "on"})
    np.testing.assert_array_equal(asked(a), literal(a))
    assert opcodes(asked)["tensor_copy"] == 0


def test_pass_switch_errors_and_environment(monkeypatch):
    a = np.ones((4, 4), np.float32)
    with pytest.raises(OperandError, match="inplace_assign=") as ei:
        lnki.jit(_chain, passes={"inplace_assign": "sometimes"})(a, a)
    assert ei.value.rule == "nki_pass_setting"
    monkeypatch.setenv("TRN3EMU_NKI_PASSES", "inplace_assign=off")
    k = lnki.jit(_chain)
    k(a, a)
    assert opcodes(k)["tensor_copy"] == 5
    monkeypatch.setenv("TRN3EMU_NKI_PASSES", "inplace_assign=on")
    k(a, a)  # the environment is part of the trace cache's key: traced again
    assert opcodes(k)["tensor_copy"] == 0


# ------------------------------------------------------------------- mask= on nc_matmul
def _tiled_matmul(lhsT, rhs, indexed: bool):
    """out[M, N] = lhsT.T @ rhs in 128 x 128 x 512 tiles; the last tile of every dim is partial
    and masked, as legacy kernels write it."""
    kk, mm = lhsT.shape
    nn = rhs.shape[1]
    out = nl.ndarray((mm, nn), nl.float32, buffer=nl.shared_hbm)
    i_k, i_m = nl.mgrid[0:128, 0:128]
    j_k, i_n = nl.mgrid[0:128, 0:512]
    o_m, o_n = nl.mgrid[0:128, 0:512]
    for m in nl.affine_range((mm + 127) // 128):
        for n in nl.affine_range((nn + 511) // 512):
            acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range((kk + 127) // 128):
                a = nl.load(lhsT[k * 128 + i_k, m * 128 + i_m], mask=(k * 128 + i_k < kk) & (m * 128 + i_m < mm))
                b = nl.load(rhs[k * 128 + j_k, n * 512 + i_n], mask=(k * 128 + j_k < kk) & (n * 512 + i_n < nn))
                mask = (k * 128 + i_k < kk) & (m * 128 + i_m < mm) & (n * 512 + i_n < nn)
                if indexed:
                    acc += lisa.nc_matmul(a[i_k, i_m], b[j_k, i_n], mask=mask)
                else:
                    acc += lisa.nc_matmul(a, b, mask=mask)
            res = nl.copy(acc)
            nl.store(out[m * 128 + o_m, n * 512 + o_n], value=res, mask=(m * 128 + o_m < mm) & (n * 512 + o_n < nn))
    return out


@pytest.mark.parametrize("indexed", [True, False])
def test_masked_last_matmul_tiles_against_numpy(indexed):
    # K = 200 (tiles of 128 + 72 rows), M = 160 (128 + 32 columns), N = 600 (512 + 88): every
    # dimension's last tile is partial; small integers make every fp32 sum exact
    rng = np.random.default_rng(4)
    lhsT = rng.integers(-4, 5, (200, 160)).astype(np.float32)
    rhs = rng.integers(-4, 5, (200, 600)).astype(np.float32)
    k = lnki.jit(_tiled_matmul)
    r = k(lhsT, rhs, indexed)
    np.testing.assert_array_equal(r, lhsT.T @ rhs)
    assert opcodes(k)["nc_matmul"] == 2 * 2 * 2  # one per (m, n, k) tile, partial ones included


def test_masked_matmul_value_written_into_a_psum_target():
    # `psum[...] = nc_matmul(..., mask=)` writes the kept block only; the rest keeps its values
    @lnki.jit
    def k(lhsT, rhs):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        i_k, i_m = nl.mgrid[0:128, 0:128]
        j_k, i_n = nl.mgrid[0:128, 0:64]
        a = nl.load(lhsT)
        b = nl.load(rhs)
        ps = nl.full((128, 64), -1.0, nl.float32, buffer=nl.psum)
        ps[...] = lisa.nc_matmul(a[i_k, i_m], b[j_k, i_n], mask=(i_k < 100) & (i_m < 90) & (i_n < 50))
        nl.store(out, nl.copy(ps))
        return out

    rng = np.random.default_rng(5)
    lhsT = rng.integers(-3, 4, (128, 128)).astype(np.float32)
    rhs = rng.integers(-3, 4, (128, 64)).astype(np.float32)
    want = np.full((128, 64), -1.0, np.float32)
    want[:90, :50] = lhsT[:100, :90].T @ rhs[:100, :50]
    np.testing.assert_array_equal(k(lhsT, rhs), want)


# ----------------------------------------------------------------------------- load_reuse
def _hbm_bytes(kernel) -> int:
    return int(kernel.last_result.trace.dma["hbm_bytes"].sum())


def _row_loop(x, w):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        xt = nl.load(x[i * 128 : (i + 1) * 128, :])
        wt = nl.load(w)  # loop-invariant: the same HBM bytes every iteration
        nl.store(out[i * 128 : (i + 1) * 128, :], nl.multiply(xt, wt))
    return out


def test_loop_invariant_load_is_read_from_hbm_once():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1024, 256)).astype(np.float32)
    w = rng.standard_normal((128, 256)).astype(np.float32)
    (r, ops, k), (r_lit, ops_lit, k_lit) = both(_row_loop, x, w)
    np.testing.assert_array_equal(r, x * np.tile(w, (8, 1)))
    np.testing.assert_array_equal(r, r_lit)
    tile = 128 * 256 * 4
    # HBM bytes (read + written): x (8 tiles) + w + out (8 tiles); literally w is read 8 times
    assert _hbm_bytes(k) == (8 + 1 + 8) * tile
    assert _hbm_bytes(k_lit) == (8 + 8 + 8) * tile
    assert (ops["dma_copy"], ops_lit["dma_copy"]) == (17, 24)


def _per_head(x, c):
    """RoPE's loop shape: a [128, F] table per row tile, every head's rows once; no view is ever
    loaded twice."""
    heads, rows, f = x.shape
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for s in nl.affine_range(rows // 128):
        ct = nl.load(c[s * 128 : (s + 1) * 128, :])
        for h in nl.affine_range(heads):
            xt = nl.load(x[h, s * 128 : (s + 1) * 128, :])
            nl.store(out[h, s * 128 : (s + 1) * 128, :], nl.multiply(xt, ct))
    return out


def _load_ranges(kernel) -> set:
    """The SBUF byte offsets the program's loads write."""
    ops = kernel.last_result.trace.dma["operands"]
    return {int(m.group(1)) for o in ops if (m := re.search(r"dst=sbuf:\w+\[0:128\]\+(\d+)", o))}


def test_loads_that_never_repeat_keep_no_idle_tiles():
    """A site whose view changes with every loop around it keeps no idle tiles past its
    iteration. Before, every load's tile stayed cached until SBUF was full: here 68 loads in 68
    ranges (RoPE 64 x 4096 x 128: SBUF filled, then each freed range was reused at once, and the
    program was modelled 12.4 ms instead of 7.2). Now only the first outer iteration's 17 tiles
    are kept while the sites are not classified yet."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((16, 512, 64)).astype(np.float32)
    c = rng.standard_normal((512, 64)).astype(np.float32)
    k_on = lnki.jit(_per_head)
    k_off = lnki.jit(_per_head, passes={"load_reuse": "off"})
    want = x * c[None]
    for k in (k_on, k_off):
        np.testing.assert_array_equal(k(x, c), want)
    assert k_on.last_programs[0].loads_reused == 0
    assert len(_load_ranges(k_on)) <= 1 + 16 + len(_load_ranges(k_off)) < 68


def _nested_invariant(x, w):
    """w's K row tiles are loaded in an inner loop, the same ones for every outer iteration: the
    view changes with the inner loop, not the outer one."""
    kt = w.shape[0] // 128
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        acc = nl.zeros((128, x.shape[1]), nl.float32, buffer=nl.sbuf)
        for k in nl.affine_range(kt):
            wt = nl.load(w[k * 128 : (k + 1) * 128, :])
            acc[...] = nl.add(acc, wt)
        xt = nl.load(x[i * 128 : (i + 1) * 128, :])
        nl.store(out[i * 128 : (i + 1) * 128, :], nl.multiply(xt, acc))
    return out


def test_a_load_invariant_in_an_outer_loop_is_read_once_per_view():
    rng = np.random.default_rng(10)
    x = rng.integers(-3, 4, (512, 128)).astype(np.float32)
    w = rng.integers(-3, 4, (384, 128)).astype(np.float32)
    (r, ops, k), (r_lit, ops_lit, _) = both(_nested_invariant, x, w)
    wsum = w.reshape(3, 128, 128).sum(axis=0)
    np.testing.assert_array_equal(r, x * np.tile(wsum, (4, 1)))
    np.testing.assert_array_equal(r_lit, r)
    # 4 outer iterations x 3 weight tiles: read once each (3), then from SBUF (9); x: 4, out: 4
    assert k.last_programs[0].loads_reused == 9
    assert (ops["dma_copy"], ops_lit["dma_copy"]) == (3 + 4 + 4, 12 + 4 + 4)


def _twice_per_iteration(x):
    """The same view loaded at two sites in each iteration: the second reads the first's tile,
    also once the first site is known to change its view every iteration."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        a = nl.load(x[i * 128 : (i + 1) * 128, :])
        b = nl.multiply(a, 2.0)
        del a
        a2 = nl.load(x[i * 128 : (i + 1) * 128, :])
        nl.store(out[i * 128 : (i + 1) * 128, :], nl.add(b, a2))
    return out


def test_a_view_loaded_twice_in_one_iteration_is_read_once():
    rng = np.random.default_rng(11)
    x = rng.integers(-3, 4, (512, 128)).astype(np.float32)
    (r, ops, k), (r_lit, ops_lit, _) = both(_twice_per_iteration, x)
    np.testing.assert_array_equal(r, 3 * x)
    np.testing.assert_array_equal(r_lit, r)
    assert k.last_programs[0].loads_reused == 4
    assert (ops["dma_copy"], ops_lit["dma_copy"]) == (4 + 4, 8 + 4)


def test_loop_invariant_load_is_read_once_under_the_liveness_lowering():
    """With the liveness lowering (which places tiles itself) the reuse is found on the kernel IR
    before allocation (`value_reuse.plan_ir`): the first load's tile lives until the last
    iteration's multiply reads it. Off: every iteration loads."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1024, 256)).astype(np.float32)
    w = rng.standard_normal((128, 256)).astype(np.float32)
    tile = 128 * 256 * 4
    got = {}
    for setting in ("on", "off"):
        # (value_reuse off: its rule over the finished program drops a reload that lands on
        # the bytes of the one before, unchanged: "exact" in docs/nki.md)
        passes = {"liveness": "on", "load_reuse": setting, "value_reuse": "off"}
        k = lnki.jit(_row_loop, passes=passes, ir=True)
        r = k(x, w)
        np.testing.assert_array_equal(r, x * np.tile(w, (8, 1)))
        got[setting] = (_hbm_bytes(k), opcodes(k)["dma_copy"], k.last_ir)
    assert got["on"][:2] == ((8 + 1 + 8) * tile, 17)
    assert got["off"][:2] == ((8 + 8 + 8) * tile, 24)
    ir = got["on"][2]
    assert ir.passes["load_reuse"].startswith("7 loads read from SBUF, found before allocation, from 1 kernel lines")
    dropped = [c for c in ir.calls if "load_reuse" in c.notes]
    assert len(dropped) == 7 and all(c.origin == "nl.load" and c.reads == c.hbm_reads == () for c in dropped)
    assert "load_reuse" not in got["off"][2].passes


def _store_between(x, w):
    """The loop-invariant weight is rewritten in HBM (a store into `w`) every other iteration:
    the load after a store reads HBM again."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        wt = nl.load(w)
        xt = nl.load(x[i * 128 : (i + 1) * 128, :])
        nl.store(out[i * 128 : (i + 1) * 128, :], nl.multiply(xt, wt))
        if i % 2 == 1:
            nl.store(w, nl.add(wt, 1.0))
    return out


def test_a_load_after_a_write_to_its_hbm_tensor_is_kept_under_the_liveness_lowering():
    rng = np.random.default_rng(7)
    x = rng.integers(-4, 5, (1024, 256)).astype(np.float32)
    w = rng.integers(-4, 5, (128, 256)).astype(np.float32)
    want = np.concatenate([x[i * 128 : (i + 1) * 128] * (w + i // 2) for i in range(8)])
    k = lnki.jit(_store_between, passes={"liveness": "on"}, ir=True)
    np.testing.assert_array_equal(k(x, w.copy()), want)
    # 8 loads of w written every other iteration: the loads right after a store (3 of them, and
    # the first) read HBM, the others (4) the tile of the load before them
    assert k.last_ir.passes["load_reuse"].startswith("4 loads read from SBUF")
    assert opcodes(k)["dma_copy"] == 8 + 4 + 8 + 4


def test_dma_copy_loads_into_fresh_tiles_are_kept_under_the_liveness_lowering():
    """Only `nl.load`s are reused (the pass `load_reuse`'s scope): a kernel that reloads with
    `nisa.dma_copy` into fresh tiles asks for the DMA (the fused Mamba tutorial's v1 is measured
    slower than v2 for it)."""

    def k(x, w):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(x.shape[0] // 128):
            wt = nl.ndarray(w.shape, w.dtype, buffer=nl.sbuf)
            lisa.dma_copy(dst=wt, src=w)
            xt = nl.load(x[i * 128 : (i + 1) * 128, :])
            nl.store(out[i * 128 : (i + 1) * 128, :], nl.multiply(xt, wt))
        return out

    rng = np.random.default_rng(8)
    x = rng.standard_normal((512, 256)).astype(np.float32)
    w = rng.standard_normal((128, 256)).astype(np.float32)
    kern = lnki.jit(k, passes={"liveness": "on", "value_reuse": "off"}, ir=True)  # (as above)
    np.testing.assert_array_equal(kern(x, w), x * np.tile(w, (4, 1)))
    assert opcodes(kern)["dma_copy"] == 4 * 3 and "load_reuse" not in kern.last_ir.passes


def _row_loop_assigned(x, w, scale_every):
    # the weight tile is allocated once and reloaded by assignment every iteration; every
    # `scale_every`-th iteration writes it (0: never), so the next reload must read HBM again
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    wt = nl.ndarray(w.shape, w.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(x.shape[0] // 128):
        xt = nl.load(x[i * 128 : (i + 1) * 128, :])
        wt[...] = nl.load(w)
        nl.store(out[i * 128 : (i + 1) * 128, :], nl.multiply(xt, wt))
        if scale_every and i % scale_every == 0:
            wt[...] = nl.multiply(wt, 2.0)
    return out


@pytest.mark.parametrize("scale_every, w_loads", [(0, 1), (2, 5), (1, 8)])
def test_assigned_reload_of_the_same_tile_is_read_from_hbm_once_until_the_tile_is_written(scale_every, w_loads):
    """`wt[...] = nl.load(w)` into the tile that already holds w (unwritten since) issues no DMA;
    after a write to wt (iterations 0, 2, 4, 6 with scale_every=2) the next reload reads HBM."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1024, 256)).astype(np.float32)
    w = rng.standard_normal((128, 256)).astype(np.float32)
    (r, ops, k), (r_lit, ops_lit, k_lit) = both(lambda a, b: _row_loop_assigned(a, b, scale_every), x, w)
    np.testing.assert_array_equal(r, x * np.tile(w, (8, 1)))
    np.testing.assert_array_equal(r, r_lit)
    tile = 128 * 256 * 4
    assert _hbm_bytes(k) == (8 + w_loads + 8) * tile
    assert _hbm_bytes(k_lit) == (8 + 8 + 8) * tile
    assert (ops["dma_copy"], ops_lit["dma_copy"]) == (16 + w_loads, 24)


def test_a_write_to_the_hbm_range_or_the_tile_makes_the_next_load_read_hbm():
    # w is loaded, then overwritten in HBM by a store, then loaded again: the second load must
    # see the new bytes; a tile the kernel changed in place is not reused either
    def k(w):
        out = nl.ndarray((3 * 128, 64), w.dtype, buffer=nl.shared_hbm)
        a = nl.load(w)
        nl.store(out[0:128, :], a)
        del a
        t = nl.full((128, 64), 5.0, w.dtype, buffer=nl.sbuf)
        nl.store(w, t)  # the HBM range changes
        b = nl.load(w)
        b[...] = nl.add(b, 1.0)  # the tile changes
        nl.store(out[128:256, :], b)
        del b
        c = nl.load(w)  # must read 5.0 from HBM again, not b's 6.0
        nl.store(out[256:384, :], c)
        return out

    w = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    want = np.concatenate([w, np.full_like(w, 6.0), np.full_like(w, 5.0)])
    for passes in (None, "literal"):  # (each run writes its own copy of w)
        kernel = lnki.jit(k, passes=passes)
        np.testing.assert_array_equal(kernel(w.copy()), want)
        assert opcodes(kernel)["dma_copy"] == 3 + 4  # 3 loads, 4 stores: nothing reused


def test_reused_loads_never_crowd_out_other_tiles():
    # 40 distinct 1 MiB row blocks streamed through SBUF (32 MiB): idle cached tiles are released
    # as memory fills, so the kernel runs exactly as the literal one does
    def k(x):
        out = nl.ndarray((128, 2048), x.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 2048), x.dtype, buffer=nl.sbuf)
        for i in nl.affine_range(x.shape[0] // 128):
            acc[...] = nl.add(acc, nl.load(x[i * 128 : (i + 1) * 128, :]))
        nl.store(out, acc)
        return out

    x = np.random.default_rng(7).integers(-8, 9, (40 * 128, 2048)).astype(np.float32)
    (r, ops, _), (r_lit, ops_lit, _) = both(k, x)
    np.testing.assert_array_equal(r, x.reshape(40, 128, 2048).sum(axis=0))
    np.testing.assert_array_equal(r, r_lit)
    assert ops["dma_copy"] == ops_lit["dma_copy"] == 41


def test_masked_nl_matmul_writes_the_kept_block():
    # nl.matmul(mask=) returned a pending result issued outside its mask: the whole product was
    # written; now the kept [90, 50] block only, as nc_matmul(mask=)
    @lnki.jit
    def k(lhsT, rhs):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        i_k, i_m = nl.mgrid[0:128, 0:128]
        j_k, i_n = nl.mgrid[0:128, 0:64]
        a = nl.load(lhsT)
        b = nl.load(rhs)
        ps = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        ps[...] = nl.matmul(a[i_k, i_m], b[j_k, i_n], transpose_x=True, mask=(i_k < 100) & (i_m < 90) & (i_n < 50))
        nl.store(out, nl.copy(ps))
        return out

    rng = np.random.default_rng(8)
    lhsT = rng.integers(-3, 4, (128, 128)).astype(np.float32)
    rhs = rng.integers(-3, 4, (128, 64)).astype(np.float32)
    want = np.zeros((128, 64), np.float32)
    want[:90, :50] = lhsT[:100, :90].T @ rhs[:100, :50]
    np.testing.assert_array_equal(k(lhsT, rhs), want)


def test_pending_results_are_named_after_the_line_that_made_them():
    # a result issued later (at its first use) still carries its own call's line in the trace
    import inspect

    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)  # line +2
        r = nl.exp(x)  # line +3
        s = nl.negative(r)  # line +4
        nl.store(out, nl.add(r, s))  # line +5: where r and s are first issued
        return out

    first = inspect.getsourcelines(k)[1]
    kernel = lnki.jit(k)
    a = np.zeros((4, 4), np.float32)
    np.testing.assert_array_equal(kernel(a), np.zeros_like(a))
    names = {}
    for line in kernel.last_programs[0].to_text().splitlines()[1:]:
        names.setdefault(line.split(".")[0], line.rsplit("name=", 1)[1])
    base = "test_nki_toolchain_passes.py:"
    assert names["dma_copy"] == base + str(first + 2)
    assert names["activation"] == base + str(first + 3)


def test_a_pending_result_reading_an_earlier_pending_load():
    # the activation (pending) holds the scale's load (pending, made before it): issuing the load
    # must not issue the activation in the middle of the load's own DMA (the fused Mamba
    # tutorial's `activation(exp, data=delta_i, scale=A_i)`)
    @lnki.jit
    def k(a, col):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)
        assert x.shape == a.shape  # (x is issued here, before the scale's load is made)
        s = nl.load(col)
        y = lisa.activation(op=nl.exp, data=x, scale=s)
        nl.store(out, y)
        return out

    rng = np.random.default_rng(9)
    a = rng.standard_normal((128, 32)).astype(np.float32)
    col = rng.standard_normal((128, 1)).astype(np.float32)
    np.testing.assert_allclose(k(a, col), np.exp(a * col), rtol=1e-5)
    assert opcodes(k)["dma_copy"] == 3  # two loads and the store (the scale was loaded twice)


# ------------------------------------------------------------------------------ zero_fill
def _zero_then_accumulate(lhsT, rhs):
    """The legacy tutorials' accumulation: a PSUM tile from nl.zeros, `+=` one matmul per K tile."""
    kk, mm = lhsT.shape
    nn = rhs.shape[1]
    out = nl.ndarray((mm, nn), nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(mm // 128):
        for n in nl.affine_range(nn // 512):
            acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(kk // 128):
                a = nl.load(lhsT[k * 128 : (k + 1) * 128, m * 128 : (m + 1) * 128])
                b = nl.load(rhs[k * 128 : (k + 1) * 128, n * 512 : (n + 1) * 512])
                acc += lisa.nc_matmul(a, b)
            nl.store(out[m * 128 : (m + 1) * 128, n * 512 : (n + 1) * 512], value=nl.copy(acc))
    return out


def test_a_zero_filled_psum_accumulation_starts_with_an_overwrite():
    """nl.zeros + `+=` matmuls: no memset, each tile's first matmul overwrites (a memset-started
    accumulation is undefined on v2/v3); the same bits as the literal memset + accumulations,
    also where a column sum is made of negative zeros (+0.0 + -0.0 is +0.0; the PE's sum starts
    from +0.0 too)."""
    rng = np.random.default_rng(12)
    lhsT = rng.integers(-3, 4, (256, 256)).astype(np.float32)
    rhs = rng.integers(-3, 4, (256, 1024)).astype(np.float32)
    lhsT[:, 5] = 0.0  # row 5 of the product: 0 * x, negative zeros where x < 0
    rhs[:, 7] = -1.0  # column 7: every product of row 5 is -0.0
    (r, ops, k), (r_lit, ops_lit, k_lit) = both(_zero_then_accumulate, lhsT, rhs)
    np.testing.assert_array_equal(r, lhsT.T @ rhs)
    assert np.array_equal(r.view(np.uint32), r_lit.view(np.uint32))
    assert r[5, 7] == 0.0 and not np.signbit(r[5, 7])
    tiles = 2 * 2
    assert (ops["memset"], ops_lit["memset"]) == (0, tiles)
    assert ops["nc_matmul"] == ops_lit["nc_matmul"] == tiles * 2
    text = k.last_programs[0].to_text().lower()
    assert (text.count("accumulate=false"), text.count("accumulate=true")) == (tiles, tiles)
    assert k.last_result.time_ns <= k_lit.last_result.time_ns
    off = lnki.jit(_zero_then_accumulate, passes={"zero_fill": "off"})
    np.testing.assert_array_equal(off(lhsT, rhs), r)
    assert opcodes(off)["memset"] == tiles


def test_a_zero_filled_tile_read_or_partly_written_gets_its_fill():
    """The fill is deferred, not dropped, when anything else uses the tile first: a read before
    the accumulation sees zeros, and a masked matmul (part of the tile) keeps zeros elsewhere; a
    tile never used gets none. (PSUM starts as NaN: a missing fill shows.)"""

    @lnki.jit(fill=0xFF)
    def k(a, b):
        out = nl.ndarray((2, 128, 512), nl.float32, buffer=nl.shared_hbm)
        unused = nl.zeros((128, 512), nl.float32, buffer=nl.psum)  # noqa: F841
        acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        before = nl.copy(acc)  # (pending: issued after the fill, before the matmul)
        acc += lisa.nc_matmul(nl.load(a), nl.load(b))
        nl.store(out[0], value=before)
        part = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        i_k, i_n = nl.mgrid[0:128, 0:512]
        part += lisa.nc_matmul(nl.load(a), nl.load(b)[i_k, i_n], mask=(i_n < 300))
        nl.store(out[1], value=nl.add(part, nl.copy(acc)))
        return out

    rng = np.random.default_rng(13)
    a = rng.integers(-3, 4, (128, 128)).astype(np.float32)
    b = rng.integers(-3, 4, (128, 512)).astype(np.float32)
    r = k(a, b)
    prod = a.T @ b
    masked = np.where(np.arange(512) < 300, prod, 0.0)
    np.testing.assert_array_equal(r[0], np.zeros((128, 512), np.float32))
    np.testing.assert_array_equal(r[1], prod + masked)
    assert opcodes(k)["memset"] == 2  # acc's (read first) and part's (masked); not the unused tile's


def test_zero_fill_keeps_the_memset_in_nki_06_kernels():
    @tn.jit
    def k(a, b):
        import nki.isa as nisa06
        import nki.language as nl06

        out = nl06.ndarray((128, 512), nl06.float32, buffer=nl06.shared_hbm)
        ta = nl06.ndarray(a.shape, a.dtype, buffer=nl06.sbuf)
        tb = nl06.ndarray(b.shape, b.dtype, buffer=nl06.sbuf)
        nisa06.dma_copy(dst=ta, src=a)
        nisa06.dma_copy(dst=tb, src=b)
        acc = nl06.zeros((128, 512), nl06.float32, buffer=nl06.psum)
        nisa06.nc_matmul(dst=acc, stationary=ta, moving=tb, accumulate=True)
        res = nl06.ndarray((128, 512), nl06.float32, buffer=nl06.sbuf)
        nisa06.tensor_copy(dst=res, src=acc)
        nisa06.dma_copy(dst=out, src=res)
        return out

    rng = np.random.default_rng(14)
    a = rng.integers(-3, 4, (128, 128)).astype(np.float32)
    b = rng.integers(-3, 4, (128, 512)).astype(np.float32)
    np.testing.assert_array_equal(k(a, b), a.T @ b)
    assert opcodes(k)["memset"] == 1


def test_a_zero_filled_psum_block_tile_starts_each_block_with_an_overwrite():
    """The same for the blocks of an `nl.zeros` PSUM block tile (each filled at its first use)."""

    @lnki.jit(fill=0xFF)
    def k(a, b):
        out = nl.ndarray((2, 128, 512), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((2, nl.par_dim(128), 512), nl.float32, buffer=nl.psum)
        for j in nl.affine_range(2):
            for i in nl.affine_range(a.shape[0] // 128):
                acc[j] += lisa.nc_matmul(nl.load(a[i * 128 : (i + 1) * 128]), nl.load(b[j, i * 128 : (i + 1) * 128]))
            nl.store(out[j], value=nl.copy(acc[j]))
        return out

    rng = np.random.default_rng(15)
    a = rng.integers(-3, 4, (256, 128)).astype(np.float32)
    b = rng.integers(-3, 4, (2, 256, 512)).astype(np.float32)
    r = k(a, b)
    for j in range(2):
        np.testing.assert_array_equal(r[j], a.T @ b[j])
    assert opcodes(k)["memset"] == 0
    off = lnki.jit(k.fn, passes={"zero_fill": "off"}, fill=0xFF)
    np.testing.assert_array_equal(off(a, b), r)
    assert opcodes(off)["memset"] == 2
