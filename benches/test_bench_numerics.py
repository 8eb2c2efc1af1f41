"""Conversion throughput of the Rust converters (one host thread; GIL released), G elements/s.

Target (issue 3): f32 -> bf16 and fp8 decode at >= 1 G elements/s per thread. The numbers include
the Python call and the output allocation; extra_info records numpy's own casts for comparison.
N = 2^18 keeps the buffers cache-resident: with 2^24 elements a fresh 64 MiB output is page-faulted
in on every call and the allocator, not the converter, dominates.
"""

import ml_dtypes
import numpy as np
import pytest
from hosttime import median_s
from trn3emu import _native

N = 1 << 18


def test_f32_to_bf16(benchmark):
    bits = np.random.default_rng(0).integers(0, 2**32, N, dtype=np.uint32)
    benchmark(_native.convert_from_f32, "bfloat16", bits)
    x = bits.view(np.float32)
    host = median_s(lambda: x.astype(ml_dtypes.bfloat16), 10)
    benchmark.extra_info.update(
        g_elements_per_s=N / benchmark.stats.stats.median / 1e9, ml_dtypes_g_per_s=N / host / 1e9
    )


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_decode(benchmark, name):
    codes = np.random.default_rng(1).integers(0, 256, N, dtype=np.uint32)
    benchmark(_native.convert_to_f32, name, codes)
    c8 = codes.astype(np.uint8).view(getattr(ml_dtypes, name))
    host = median_s(lambda: c8.astype(np.float32), 10)
    benchmark.extra_info.update(
        g_elements_per_s=N / benchmark.stats.stats.median / 1e9, ml_dtypes_g_per_s=N / host / 1e9
    )


def test_f32_to_fp8(benchmark):
    bits = np.random.default_rng(2).integers(0, 2**32, N, dtype=np.uint32)
    benchmark(_native.convert_from_f32, "float8_e4m3fn", bits)
    benchmark.extra_info.update(g_elements_per_s=N / benchmark.stats.stats.median / 1e9)


BIG = 1 << 24


@pytest.mark.parametrize("into", [False, True], ids=["alloc", "out"])
@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn"])
def test_f32_encode_16m(benchmark, name, into):
    """16 M-element fp32 -> bf16 / fp8 encodes: with a fresh output array per call (page faults
    included) and into a preallocated `out` (the converter alone). Host: ml_dtypes astype."""
    bits = np.random.default_rng(5).standard_normal(BIG).astype(np.float32).view(np.uint32)
    out = np.empty(BIG, np.uint32) if into else None
    benchmark(_native.convert_from_f32, name, bits, out=out)
    x = bits.view(np.float32)
    host = median_s(lambda: x.astype(getattr(ml_dtypes, name)), 5)
    g = BIG / benchmark.stats.stats.median / 1e9
    benchmark.extra_info.update(
        g_elements_per_s=g, ml_dtypes_g_per_s=BIG / host / 1e9, fraction_of_host=g / (BIG / host / 1e9)
    )


@pytest.mark.parametrize("into", [False, True], ids=["alloc", "out"])
def test_fp8_decode_16m(benchmark, into):
    """16 M float8_e4m3fn codes -> fp32, fresh output vs preallocated `out`; host: ml_dtypes."""
    codes = np.random.default_rng(6).integers(0, 256, BIG, dtype=np.uint32)
    out = np.empty(BIG, np.float32) if into else None
    benchmark(_native.convert_to_f32, "float8_e4m3fn", codes, out=out)
    c8 = codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    host = median_s(lambda: c8.astype(np.float32), 5)
    g = BIG / benchmark.stats.stats.median / 1e9
    benchmark.extra_info.update(
        g_elements_per_s=g, ml_dtypes_g_per_s=BIG / host / 1e9, fraction_of_host=g / (BIG / host / 1e9)
    )
