"""Throughput of the emulator against this host's own limits, measured in the same run.

pytest benches/ --benchmark-only --benchmark-save=base      # record
pytest benches/ --benchmark-only --benchmark-compare --benchmark-compare-fail=median:10%
"""

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from hosttime import median_s

BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("dtype", [BF16, np.float32], ids=["bf16", "fp32"])
def test_matmul_tile(benchmark, dtype):
    """One nc_matmul 128x128x512 tile (plus run overhead), GFLOP/s vs numpy sgemm of the same shape."""
    dev = t3.Device()
    p = t3.Program(sync="manual")
    a = p.sbuf((128, 128), dtype)
    b = p.sbuf((128, 512), dtype)
    acc = p.psum((128, 512), np.float32)
    p.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=False)
    benchmark(dev.run, p, check_races=False, trace=False)
    x = np.random.rand(128, 128).astype(np.float32)
    y = np.random.rand(128, 512).astype(np.float32)
    host = median_s(lambda: x.T @ y, 20)
    flop = 2 * 128 * 128 * 512
    emu = benchmark.stats.stats.median
    benchmark.extra_info.update(
        emulated_gflops=flop / emu / 1e9, host_sgemm_gflops=flop / host / 1e9, fraction_of_host=host / emu
    )


def test_tensor_tensor_add(benchmark):
    """tensor_tensor add fp32 on [128, 4096], GB/s vs numpy add on the same data."""
    dev = t3.Device()
    p = t3.Program(sync="manual")
    a = p.sbuf((128, 4096), np.float32)
    b = p.sbuf((128, 4096), np.float32)
    c = p.sbuf((128, 4096), np.float32)
    p.tensor_tensor(dst=c, data1=a, data2=b, op="add")
    benchmark(dev.run, p, check_races=False, trace=False)
    x = np.random.rand(128, 4096).astype(np.float32)
    y = np.random.rand(128, 4096).astype(np.float32)
    host = median_s(lambda: np.add(x, y), 20)
    nbytes = 3 * x.nbytes
    emu = benchmark.stats.stats.median
    benchmark.extra_info.update(
        emulated_gbps=nbytes / emu / 1e9, host_gbps=nbytes / host / 1e9, fraction_of_host=host / emu
    )


def test_python_assembly(benchmark):
    """Instructions assembled per second from Python."""
    n = 2000

    def assemble():
        p = t3.Program(sync="manual")
        t = p.sbuf((128, 1), np.float32)
        for _ in range(n):
            p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0)
        return p

    benchmark(assemble)
    benchmark.extra_info["instructions_per_s"] = n / benchmark.stats.stats.median


def test_one_instruction_run(benchmark):
    """The fixed cost of a `Device.run`: a one-instruction program ([128, 1] memset, core 0),
    race checks and trace off; extra_info splits it into the native run and the Python wrapper.
    Every single-instruction benchmark above pays it once per round."""
    dev = t3.Device()
    p = t3.Program(sync="manual")
    t = p.sbuf((128, 1), np.float32)
    p.memset(dst=t, value=2.0, engine="vector")
    res = benchmark(dev.run, p, check_races=False, trace=False)
    assert res.executed == 1
    np.testing.assert_array_equal(dev.read(t), np.full((128, 1), 2.0, np.float32))
    natives = [p.native()]
    native = median_s(lambda: dev._native.run(natives, False, False), 2000)
    emu = benchmark.stats.stats.median
    benchmark.extra_info.update(
        runs_per_s=1 / emu,
        native_over_run=native / emu,
        run_us=emu * 1e6,
        native_run_us=native * 1e6,
        python_us=(emu - native) * 1e6,
    )


@pytest.mark.parametrize("checks", [False, True], ids=["fast", "races+trace"])
def test_tiny_instruction_dispatch(benchmark, checks):
    """[128, 1] tensor_scalar instructions executed per second: race checks and trace off
    ("fast") and with the defaults (both on)."""
    n = 2000
    dev = t3.Device()
    p = t3.Program(sync="manual")
    t = p.sbuf((128, 1), np.float32)
    p.memset(dst=t, value=0.0, engine="vector")
    for _ in range(n):
        p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0, engine="vector")
    res = benchmark(dev.run, p, check_races=checks, trace=checks)
    assert res.executed == n + 1
    np.testing.assert_array_equal(dev.read(t), np.full((128, 1), float(n), np.float32))
    benchmark.extra_info["instructions_per_s"] = (n + 1) / benchmark.stats.stats.median
