"""The NKI example kernels of examples/, each against an independent numpy reference."""

import ml_dtypes
import numpy as np
import pytest
from nki_util import load_example
from trn3emu import sparsity
from trn3emu.testing import assert_close

BF16 = ml_dtypes.bfloat16


def test_tensor_add_exact_fp16_and_fp32():
    ex = load_example("nki_tensor_add")
    rng = np.random.default_rng(10)
    for dt in (np.float16, np.float32):
        a = rng.standard_normal((256, 1024)).astype(dt)
        b = rng.standard_normal((256, 1024)).astype(dt)
        out = ex.tensor_add(a, b)
        np.testing.assert_array_equal(out, (a.astype(np.float32) + b.astype(np.float32)).astype(dt))


def test_matmul_bf16_against_float64():
    ex = load_example("nki_matmul_bf16")
    rng = np.random.default_rng(11)
    lhs_t = rng.standard_normal((384, 256)).astype(BF16)
    rhs = rng.standard_normal((384, 1024)).astype(BF16)
    out = ex.matmul_bf16(lhs_t, rhs)
    assert out.dtype == BF16 and out.shape == (256, 1024)
    # The documented PE numerics (docs/numerics.md): exact products summed in fp32 in partition
    # order within each 128-row K tile, PSUM += per tile in fp32, then one RNE cast to bf16.
    a32, b32 = lhs_t.astype(np.float32), rhs.astype(np.float32)
    psum = np.zeros((256, 1024), np.float32)
    for k0 in range(0, 384, 128):
        part = np.zeros_like(psum)
        for k in range(k0, k0 + 128):
            part = (part + np.outer(a32[k], b32[k]).astype(np.float32)).astype(np.float32)
        psum = (psum + part).astype(np.float32)
    np.testing.assert_array_equal(out.view(np.uint16), psum.astype(BF16).view(np.uint16))


def test_rmsnorm():
    ex = load_example("nki_rmsnorm")
    rng = np.random.default_rng(12)
    x = rng.standard_normal((384, 768)).astype(np.float32)
    w = rng.standard_normal(768).astype(np.float32)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + ex.EPS) * w
    assert_close(ex.rmsnorm(x, w), ref, rtol=1e-4, atol=1e-5)


def test_lnc2_program_halves_exact():
    ex = load_example("nki_lnc2")
    rng = np.random.default_rng(13)
    x = rng.standard_normal((512, 384)).astype(np.float32)
    bias = rng.standard_normal((512, 1)).astype(np.float32)
    out = ex.scaled_relu[2](x, bias)
    np.testing.assert_array_equal(out, np.maximum(x * np.float32(2) + bias, 0).astype(np.float32))
    res = ex.scaled_relu.last_result
    assert {int(c) for c in res.trace.columns["core"]} == {0, 1}


def test_softmax():
    ex = load_example("nki_softmax")
    x = np.random.default_rng(14).standard_normal((256, 512)).astype(np.float32)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    out = ex.softmax_rows(x)
    assert_close(out, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-6)


def test_layernorm_bn_stats():
    ex = load_example("nki_layernorm")
    rng = np.random.default_rng(15)
    x = (rng.standard_normal((128, 1536)) * 2 + 0.5).astype(np.float32)
    g = rng.standard_normal(1536).astype(np.float32)
    b = rng.standard_normal(1536).astype(np.float32)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + ex.EPS) * g + b
    assert_close(ex.layernorm(x, g, b), ref, rtol=1e-3, atol=1e-4)


def test_cumsum_scan():
    ex = load_example("nki_cumsum")
    x = np.random.default_rng(16).standard_normal((128, 1024)).astype(np.float32)
    ref = np.cumsum(x.astype(np.float64), axis=1)
    assert_close(ex.cumsum_rows(x), ref, rtol=1e-4, atol=1e-4, mode="max")


def test_topk_max8():
    ex = load_example("nki_topk")
    x = np.random.default_rng(17).permutation(128 * 512).reshape(128, 512).astype(np.float32)
    vals, idx = ex.topk_rows(x, 16)
    order = np.argsort(-x, axis=1, kind="stable")[:, :16]
    np.testing.assert_array_equal(vals, np.take_along_axis(x, order, axis=1))
    np.testing.assert_array_equal(idx, order.astype(np.uint32))


def test_mxfp8_matmul_quantize_on_device():
    ex = load_example("nki_mxfp8_matmul")
    rng = np.random.default_rng(18)
    a_t = rng.standard_normal((512, 128)).astype(BF16)
    b = rng.standard_normal((512, 512)).astype(BF16)
    out = ex.mxfp8_matmul(a_t, b)
    assert_close(out, ex.quantize_dequantize(a_t).T @ ex.quantize_dequantize(b), rtol=1e-4, atol=1e-4, mode="max")


@pytest.mark.parametrize("seq", [512, 4096])
def test_flash_attention_causal(seq):
    ex = load_example("nki_flash_attention")
    q_t, k_t, v, scale = ex.make_inputs(seq=seq, d=128)
    out = ex.flash_attention_causal(q_t, k_t, v, scale)
    q, k, vv = q_t.astype(np.float64).T, k_t.astype(np.float64).T, v.astype(np.float64)
    s = q @ k.T * scale
    s[np.triu_indices(seq, 1)] = -np.inf
    p = np.exp(s - s.max(axis=1, keepdims=True))
    assert_close(out, p @ vv / p.sum(axis=1, keepdims=True), rtol=1e-2, atol=1e-2)


def test_cli_demo_runs_an_nki_example(capsys):
    from trn3emu.cli import main

    assert main(["demo", "--nki", "tensor_add"]) == 0
    assert "tensor_add (256, 1024) float16: exact" in capsys.readouterr().out
    assert main(["demo", "--nki", "no_such_example"]) != 0
    assert "no NKI example" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["nki_matmul_bf16", "nki_rmsnorm", "nki_lnc2", "nki_softmax", "nki_cumsum", "nki_topk", "sparse_matmul"]
)
def test_example_main_checks_itself(name, capsys):
    assert load_example(name).main() == 0
    assert "MISMATCH" not in capsys.readouterr().out


def test_sparse_matmul_example_shows_the_speed_up():
    ex = load_example("sparse_matmul")
    w, b = ex.make_inputs(n=1024)
    want = (w.astype(np.float64).T @ b.astype(np.float64)).astype(np.float32)
    values, index = sparsity.compress(w, "4:16")
    np.testing.assert_array_equal(ex.sparse_matmul(values, index, sparsity.moving_layout(b, "4:16")), want)
    np.testing.assert_array_equal(ex.dense_matmul(w, b), want)
    dense, sparse = ex.tensor_unit(ex.dense_matmul), ex.tensor_unit(ex.sparse_matmul)
    assert dense["flops"] == sparse["flops"] == 2 * 512 * 128 * 1024  # dense-equivalent FLOPs
    assert dense["busy_ns"] / sparse["busy_ns"] == pytest.approx(4.0, rel=0.05)
    assert "sparse matmuls (nc_matmul_sparse)" in ex.sparse_matmul.last_result.trace.summary()
