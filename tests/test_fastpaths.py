"""The streaming / fused data paths keep the materialising semantics: every input is read before
the destination is written (aliasing), stochastic-rounding indices stay row-major, strided,
reversed, broadcast and chunk-crossing patterns give the numpy answer. References are numpy /
ml_dtypes computed in the test on a copy of the original memory.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3

W = 96  # arena columns (fp32 elements per partition)


def _arena(dev, p, rng, cols=W, dtype=np.float32):
    """An SBUF [128, cols] tile filled from HBM with random values; returns (tile, values)."""
    vals = rng.standard_normal((128, cols)).astype(dtype)
    t = p.sbuf((128, cols), dtype)
    p.dma_copy(dst=t, src=dev.hbm.put(vals))
    return t, vals


def _run(dev, p, tile):
    dev.run(p)
    return dev.read(tile)


@pytest.mark.parametrize(
    "dst_sl, a_sl, b_sl",
    [
        # in place on data1 (streamed: each chunk is read before it is written)
        ((slice(0, 128), slice(0, 40)), (slice(0, 128), slice(0, 40)), (slice(0, 128), slice(40, 80))),
        # other partitions (the start-partition rule keeps equal-sized operands from partly
        # overlapping across partitions)
        ((slice(32, 64), slice(0, 40)), (slice(0, 32), slice(0, 40)), (slice(96, 128), slice(0, 40))),
        ((slice(0, 32), slice(0, 40)), (slice(32, 64), slice(0, 40)), (slice(64, 96), slice(8, 48))),
        # dst shifted by one element inside the same partitions
        ((slice(0, 128), slice(1, 41)), (slice(0, 128), slice(0, 40)), (slice(0, 128), slice(50, 90))),
        ((slice(0, 128), slice(0, 40)), (slice(0, 128), slice(1, 41)), (slice(0, 128), slice(50, 90))),
        # disjoint (the fused single-pass path)
        ((slice(0, 128), slice(80, 96)), (slice(0, 128), slice(0, 16)), (slice(0, 128), slice(16, 32))),
    ],
)
@pytest.mark.parametrize("op, f", [("subtract", np.subtract), ("maximum", np.maximum)])
def test_tensor_tensor_aliasing_reads_before_writes(dev, rng, dst_sl, a_sl, b_sl, op, f):
    p = t3.Program()
    t, vals = _arena(dev, p, rng)
    p.tensor_tensor(dst=t[dst_sl], data1=t[a_sl], data2=t[b_sl], op=op)
    want = vals.copy()
    want[dst_sl] = f(vals[a_sl], vals[b_sl])
    np.testing.assert_array_equal(_run(dev, p, t).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("cols", [1, 3, 2047, 2048, 2049, 5000])
def test_tensor_scalar_rows_and_chunks(dev, rng, cols):
    """Per-partition operands with short rows (batched into one block) and long rows (chunked)."""
    p = t3.Program()
    x, xv = _arena(dev, p, rng, cols)
    c, cv = _arena(dev, p, rng, 1)
    out = p.sbuf((128, cols), np.float32)
    p.tensor_scalar(dst=out, data=x, op0="multiply", operand0=c, op1="subtract", operand1=0.5, reverse1=True)
    want = np.float32(0.5) - xv * cv
    np.testing.assert_array_equal(_run(dev, p, out).view(np.uint32), want.view(np.uint32))


def test_tensor_scalar_in_place_column(dev, rng):
    p = t3.Program()
    x, xv = _arena(dev, p, rng, 1)
    for _ in range(3):
        p.tensor_scalar(dst=x, data=x, op0="add", operand0=1.25, op1="maximum", operand1=0.0)
    want = xv
    for _ in range(3):
        want = np.maximum(want + np.float32(1.25), np.float32(0.0))
    np.testing.assert_array_equal(_run(dev, p, x).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("cols", [15, 16, 128, 255, 256, 4096])
def test_long_rows_in_place(dev, rng, cols):
    """Exactly in-place elementwise ops on rows long enough for the fused in-place pass (and one
    just below it; tensor_tensor / tensor_scalar run in place from 16 elements on, activation
    from 256): tensor_tensor with both inputs the destination, tensor_scalar, and activation
    exp / silu (the fast kernels), each reading the old values."""
    p = t3.Program()
    x, xv = _arena(dev, p, rng, cols)
    y, yv = _arena(dev, p, rng, cols)
    p.tensor_tensor(dst=x, data1=x, data2=x, op="multiply")
    p.tensor_scalar(dst=x, data=x, op0="multiply", operand0=-0.5)
    p.tensor_tensor(dst=x, data1=y, data2=x, op="subtract")
    p.activation(dst=x, op="exp", data=x)
    p.activation(dst=y, op="silu", data=y, scale=2.0)
    got = _run(dev, p, x)
    want = np.exp((yv - (xv * xv) * np.float32(-0.5)).astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    v = (yv * np.float32(2.0)).astype(np.float64)
    e = np.exp(-np.abs(v))
    silu = (v * np.where(v >= 0, 1.0, e) / (1.0 + e)).astype(np.float32)
    np.testing.assert_array_equal(dev.read(y).view(np.uint32), silu.view(np.uint32))


def test_strided_reversed_and_broadcast_views(dev, rng):
    """Reversed inner step, a two-level strided source, and a step-0 (broadcast) source."""
    p = t3.Program()
    t, vals = _arena(dev, p, rng)
    out = p.sbuf((128, 4, 6), np.float32)
    rev = t.ap([[W, 128], [6, 4], [-1, 6]], offset=5)  # [r, i, j] = vals[r, 6 i + 5 - j]
    bc = t.ap([[W, 128], [0, 4], [1, 6]], offset=40)  # [r, i, j] = vals[r, 40 + j]
    p.tensor_tensor(dst=out, data1=rev, data2=bc, op="add")
    idx = 6 * np.arange(4)[:, None] + 5 - np.arange(6)[None, :]
    want = vals[:, idx] + vals[:, 40 + np.arange(6)][:, None, :]
    np.testing.assert_array_equal(_run(dev, p, out).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(
    "dtype",
    [ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2],
)
def test_cast_copy_bitwise_against_ml_dtypes(dev, rng, dtype):
    """fp32 -> narrow casts on a strided source, every element bit-exact with ml_dtypes (RNE)."""
    n = 3000
    bits = rng.integers(0, 2**32, (128, 2 * n), dtype=np.uint32)
    # Keep the magnitudes near each format's range so rounding, subnormals and overflow all occur.
    scale = {np.float16: 2**-10, ml_dtypes.bfloat16: 1.0}.get(dtype, 2**-12)
    mant = (bits >> 9).astype(np.float32) / 2**23 + 1
    expo = (bits % 40).astype(np.int32) - 20
    src = (np.where(bits & 1, -1, 1) * mant * np.exp2(expo) * scale).astype(np.float32)
    src[0, :6] = [np.inf, -np.inf, 0.0, -0.0, 1e30, -1e-30]
    if dtype is not np.float16:  # numpy's fp16 NaN keeps payload bits (documented difference)
        src[1, :2] = [np.nan, -np.nan]
    p = t3.Program()
    t = p.sbuf((128, 2 * n), np.float32)
    p.dma_copy(dst=t, src=dev.hbm.put(src))
    out = p.sbuf((128, n), dtype)
    p.tensor_copy(dst=out, src=t[:, ::2])
    got = _run(dev, p, out)
    with np.errstate(over="ignore"):
        want = src[:, ::2].astype(dtype)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_memset_strided_leaves_the_gaps(dev, rng):
    p = t3.Program()
    t, vals = _arena(dev, p, rng)
    p.memset(dst=t[:, 1::3], value=2.5)
    want = vals.copy()
    want[:, 1::3] = 2.5
    np.testing.assert_array_equal(_run(dev, p, t).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("cols", [1, 4100])
def test_bitwise_int8_raw_path(dev, rng, cols):
    a = rng.integers(-128, 128, (128, cols), dtype=np.int8)
    b = rng.integers(-128, 128, (128, cols), dtype=np.int8)
    p = t3.Program()
    ta = p.sbuf((128, cols), np.int8)
    tb = p.sbuf((128, cols), np.int8)
    out = p.sbuf((128, cols), np.int32)
    p.dma_copy(dst=ta, src=dev.hbm.put(a))
    p.dma_copy(dst=tb, src=dev.hbm.put(b))
    p.tensor_tensor(dst=out, data1=ta, data2=tb, op="bitwise_xor")
    want = a.astype(np.int32) ^ b.astype(np.int32)
    np.testing.assert_array_equal(_run(dev, p, out), want)


def test_fused_path_with_a_psum_input(dev, rng):
    """fp32 add with data2 in PSUM: the fused pass reads across the two memories."""
    p = t3.Program()
    a, av = _arena(dev, p, rng, 512)
    b, bv = _arena(dev, p, rng, 512)
    ps = p.psum((128, 512), np.float32)
    p.tensor_copy(dst=ps, src=b)
    out = p.sbuf((128, 512), np.float32)
    p.tensor_tensor(dst=out, data1=a, data2=ps, op="add")
    np.testing.assert_array_equal(_run(dev, p, out).view(np.uint32), (av + bv).view(np.uint32))


M64 = (1 << 64) - 1


def _mix64(z):
    """SplitMix64 finaliser on Python ints or uint64 arrays (docs/numerics.md)."""
    if isinstance(z, int):
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & M64
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & M64
        return z ^ (z >> 31)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@pytest.mark.parametrize("cols", [1, 2500])
def test_stochastic_rounding_index_order_streamed(rng, cols):
    """SR bits of a streamed cast follow the documented counter: element i (row-major over dst)
    draws mix64(key + i * phi) >> 32; bf16 rounds up iff (dropped 16 bits << 16) > that word."""
    seed = 7
    vals = rng.standard_normal((128, cols)).astype(np.float32)
    dev = t3.Device(rounding="stochastic", seed=seed)
    load = t3.Program()
    t = load.sbuf((128, cols), np.float32, address=0)
    load.dma_copy(dst=t, src=dev.hbm.put(vals))
    dev.run(load)  # run 0
    cast = t3.Program(sync="manual")
    src = cast.sbuf((128, cols), np.float32, address=0)
    out = cast.sbuf((128, cols), ml_dtypes.bfloat16)
    cast.tensor_copy(dst=out, src=src, engine="vector")  # run 1, instruction 0, core 0
    dev.run(cast)
    got = dev.read(out).view(np.uint16)

    key = _mix64(_mix64(seed ^ 0x54524E3353520000) ^ _mix64((0 << 56) ^ (1 << 24) ^ 0))
    i = np.arange(128 * cols, dtype=np.uint64)
    with np.errstate(over="ignore"):
        r = (_mix64(np.uint64(key) + i * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)).reshape(128, cols)
    u = vals.view(np.uint32).astype(np.uint64)
    up = ((u & np.uint64(0xFFFF)) << np.uint64(16)) > r
    want = ((u >> np.uint64(16)) + up).astype(np.uint16)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("parts", [37, 128])
def test_activation_register_sum_is_sequential_per_lane(dev, rng, parts):
    """The add registers fold fp32 results in free-index order per lane (interleaved lanes must
    not change that): compare with numpy's sequential accumulate, on values whose sum is order
    sensitive; a second instruction with reduce_cmd=reduce continues from the registers."""
    n = 300
    x = (rng.standard_normal((parts, n)) * np.exp2(rng.integers(-20, 20, (parts, n)))).astype(np.float32)
    p = t3.Program()
    t = p.sbuf((parts, n), np.float32)
    p.dma_copy(dst=t, src=dev.hbm.put(x))
    sq = p.sbuf((parts, n), np.float32)
    res = p.sbuf((parts, 1), np.float32)
    p.activation(dst=sq, op="copy", data=t, reduce_op="add", reduce_cmd="reset_reduce")
    p.activation(dst=sq, op="copy", data=t, reduce_op="add", reduce_cmd="reduce", reduce_res=res)
    dev.run(p)
    seq = np.add.accumulate(np.concatenate([x, x], axis=1), axis=1, dtype=np.float32)[:, -1:]
    np.testing.assert_array_equal(dev.read(res).view(np.uint32), seq.view(np.uint32))


@pytest.mark.parametrize("op, ufunc", [("add", np.add), ("maximum", np.fmax), ("multiply", np.multiply)])
def test_tensor_reduce_left_to_right_per_group(dev, rng, op, ufunc):
    """tensor_reduce over the last axis of [P, 5, 13]: each of the 5 groups per partition folds
    left to right from its first element (numpy's sequential accumulate), negate after."""
    x = (rng.standard_normal((128, 5, 13)) * np.exp2(rng.integers(-15, 15, (128, 5, 13)))).astype(np.float32)
    if op == "multiply":
        x = (1 + x * 1e-3).astype(np.float32)
    p = t3.Program()
    t = p.sbuf((128, 5, 13), np.float32)
    p.dma_copy(dst=t, src=dev.hbm.put(x))
    out = p.sbuf((128, 5), np.float32)
    p.tensor_reduce(dst=out, op=op, data=t, axis=2, negate=True)
    dev.run(p)
    want = -ufunc.accumulate(x, axis=2, dtype=np.float32)[:, :, -1]
    np.testing.assert_array_equal(dev.read(out).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("shift", [1, -1, 0])
@pytest.mark.parametrize("cast", [False, True])
def test_dma_sbuf_to_sbuf_overlapping_partitions(dev, rng, shift, cast):
    """DMA has no start-partition rule, so a copy can overlap its source across partitions:
    the result is the source as it was before the copy (every element read before written)."""
    p = t3.Program()
    t, vals = _arena(dev, p, rng)
    lo = 1 if shift < 0 else 0
    src = t[lo : lo + 100, 0:40]
    dst = t[lo + shift : lo + shift + 100, 3:43]
    if cast:  # same bytes reinterpreted through a bf16 round trip is not a copy: cast to int32
        out = p.sbuf((128, 40), np.int32)
        p.dma_copy(dst=out[lo + shift : lo + shift + 100, :], src=src)
    p.dma_copy(dst=dst, src=src)
    got = _run(dev, p, t)
    want = vals.copy()
    want[lo + shift : lo + shift + 100, 3:43] = vals[lo : lo + 100, 0:40]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    if cast:
        r = np.clip(np.round(vals[lo : lo + 100, 0:40].astype(np.float64)), -(2**31), 2**31 - 1)
        np.testing.assert_array_equal(dev.read(out)[lo + shift : lo + shift + 100], r.astype(np.int32))


@pytest.mark.parametrize("op, f", [("add", np.add), ("multiply", np.multiply), ("maximum", np.fmax)])
def test_bf16_fused_matches_fp32_then_rne(dev, rng, op, f):
    """bf16 tensor_tensor (the fused single pass): exact widening, one fp32 op, RNE to bf16,
    bit-exact with ml_dtypes; includes inf, NaN (in one operand), subnormals and overflow."""
    a = (rng.standard_normal((128, 700)) * np.exp2(rng.integers(-130, 127, (128, 700)))).astype(np.float32)
    b = (rng.standard_normal((128, 700)) * np.exp2(rng.integers(-130, 127, (128, 700)))).astype(np.float32)
    a[0, :4] = [np.inf, -np.inf, np.nan, 3e38]
    b[0, :4] = [1.0, 2.0, 5.0, 3e38]
    a, b = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    p = t3.Program()
    ta, tb = p.sbuf((128, 700), ml_dtypes.bfloat16), p.sbuf((128, 700), ml_dtypes.bfloat16)
    p.dma_copy(dst=ta, src=dev.hbm.put(a))
    p.dma_copy(dst=tb, src=dev.hbm.put(b))
    out = p.sbuf((128, 700), ml_dtypes.bfloat16)
    p.tensor_tensor(dst=out, data1=ta, data2=tb, op=op)
    dev.run(p)
    with np.errstate(over="ignore", invalid="ignore"):
        want = f(a.astype(np.float32), b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(dev.read(out).view(np.uint16), want.view(np.uint16))


def test_auto_sync_reused_until_the_program_grows(dev, rng):
    """`Program.native()` synchronises once per program length: a run after more instructions
    were appended uses the new ones (with their semaphores), a repeat run the cached program."""
    x = rng.standard_normal((128, 8)).astype(np.float32)
    p = t3.Program()
    t = p.sbuf((128, 8), np.float32)
    p.dma_copy(dst=t, src=dev.hbm.put(x))
    p.tensor_scalar(dst=t, data=t, op0="multiply", operand0=2.0)
    first = p.native()
    assert p.native() is first
    dev.run(p)
    np.testing.assert_array_equal(dev.read(t), x * np.float32(2.0))
    out = dev.hbm.alloc((128, 8), np.float32)
    p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0, engine="gpsimd")
    p.dma_copy(dst=out, src=t)
    assert p.native() is not first and len(p.native()) == 4
    dev.run(p)
    np.testing.assert_array_equal(dev.hbm.get(out), x * np.float32(2.0) + np.float32(1.0))


def test_run_time_accumulate_state_resets_every_run(dev, rng):
    """accumulate absent (resolved per element at run time): each run starts with no PSUM
    element matmul-written, also when the bitmap is only cleared for runs that wrote PSUM."""
    a = rng.integers(-3, 4, (128, 128)).astype(np.float32)
    b = rng.integers(-3, 4, (128, 64)).astype(np.float32)
    load = t3.Program()
    ta, tb = load.sbuf((128, 128), np.float32), load.sbuf((128, 64), np.float32)
    load.dma_copy(dst=ta, src=dev.hbm.put(a))
    load.dma_copy(dst=tb, src=dev.hbm.put(b))
    dev.run(load)
    text = (
        ".core 0\n"
        + (
            "nc_matmul.tensor dst=psum:float32[0:128]+0[[1,64]] stationary=sbuf:float32[0:128]+0[[1,128]] "
            f"moving=sbuf:float32[0:128]+{ta.offset + 512}[[1,64]]\n"
        )
        * 2
    )
    assert tb.offset == ta.offset + 512
    mm = t3.Program.from_text(text)
    ps = t3.Program(sync="manual").psum((128, 64), np.float32)
    want = 2 * (a.T @ b)  # exact in fp32 (small integers)
    for i in range(3):  # back to back, then after a run without PSUM writes
        dev.run(mm)
        np.testing.assert_array_equal(dev.read(ps), want)
        if i == 1:
            dev.run(load)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.int8])
@pytest.mark.parametrize("policy", ["ieee", "saturate"])
def test_dma_casts_between_hbm_and_sbuf(rng, dtype, policy):
    """DMA casts stream HBM rows through small buffers (rows longer than one chunk too): the
    same bits as ml_dtypes RNE (fp8 overflow per the device policy; ints round and saturate)."""
    dev = t3.Device(fp8_overflow=policy)
    x = (rng.standard_normal((6, 5000)) * 300).astype(np.float32)
    x[0, :3] = [1e6, -1e6, np.inf]
    p = t3.Program()
    t = p.sbuf((6, 5000), dtype)
    p.dma_copy(dst=t, src=dev.hbm.put(x))  # HBM fp32 -> SBUF narrow
    back = dev.hbm.alloc((6, 5000), np.float32)
    p.dma_copy(dst=back, src=t)  # SBUF narrow -> HBM fp32 (exact widening)
    dev.run(p)
    if dtype is np.int8:
        want = np.clip(np.round(x.astype(np.float64)), -128, 127).astype(np.int8)
    else:
        with np.errstate(over="ignore"):
            want = x.astype(dtype)
        if policy == "saturate" and dtype is ml_dtypes.float8_e4m3fn:
            fin = np.isfinite(x)
            want = np.where(fin, np.clip(x, -448, 448), x).astype(dtype)
    np.testing.assert_array_equal(dev.read(t).view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(dev.hbm.get(back), want.astype(np.float32))


def test_fused_path_writing_psum(dev, rng):
    """fp32 tensor_tensor and tensor_scalar with the destination in PSUM, inputs in SBUF and
    PSUM (the fused pass splits the destination buffer around a same-memory input)."""
    p = t3.Program()
    a, av = _arena(dev, p, rng, 256)
    b, bv = _arena(dev, p, rng, 256)
    ps_in = p.psum((128, 256), np.float32)
    p.tensor_copy(dst=ps_in, src=b)
    ps_out = p.psum((128, 256), np.float32)
    p.tensor_tensor(dst=ps_out, data1=a, data2=ps_in, op="subtract")
    p.tensor_scalar(dst=ps_in, data=ps_out, op0="multiply", operand0=3.0)
    dev.run(p)
    np.testing.assert_array_equal(dev.read(ps_out), av - bv)
    np.testing.assert_array_equal(dev.read(ps_in), (av - bv) * np.float32(3.0))
