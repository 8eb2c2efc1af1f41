"""The cores of one device on host threads (issue 19, outcome 5): a run with 2 threads executes
independent cores' compute instructions in parallel, and everything it reports is the same as with
one thread: results, every trace record (order and timestamps), race reports, limits and errors
(with two failing cores, the one a single thread meets first). Outputs are also checked against
numpy where that is cheap."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import ml_dtypes
import numpy as np
import pytest
import trn3emu as t3
from trn3emu import errors

BF16 = ml_dtypes.bfloat16
F32 = np.float32


@pytest.fixture(autouse=True)
def _restore_threads():
    yield
    t3.set_num_threads(0)


def _matmul_core(dev, p, rng, size=256):
    """A tiled bf16 matmul C = A^T B on p's core (small integers: exact in fp32), then exp of C/64
    on ScalarE; returns (output tensors, numpy references or None)."""
    a = rng.integers(-3, 4, size=(size, 128)).astype(BF16)
    b = rng.integers(-3, 4, size=(size, 512)).astype(BF16)
    ha, hb = dev.hbm.put(a), dev.hbm.put(b)
    out = dev.hbm.alloc((128, 512), F32)
    ex = dev.hbm.alloc((128, 512), F32)
    kt = size // 128
    ta = [p.sbuf((128, 128), BF16) for _ in range(kt)]
    tb = [p.sbuf((128, 512), BF16) for _ in range(kt)]
    for i in range(kt):
        p.dma_copy(dst=ta[i], src=ha[i * 128 : (i + 1) * 128, :])
        p.dma_copy(dst=tb[i], src=hb[i * 128 : (i + 1) * 128, :])
    acc = p.psum((128, 512), F32)
    for i in range(kt):
        p.nc_matmul(dst=acc, stationary=ta[i], moving=tb[i], accumulate=i > 0)
    c = p.sbuf((128, 512), F32)
    p.tensor_copy(dst=c, src=acc)
    e = p.sbuf((128, 512), F32)
    p.activation(dst=e, op="exp", data=c, scale=1.0 / 64)
    p.dma_copy(dst=out, src=c)
    p.dma_copy(dst=ex, src=e)
    ref = a.astype(np.float64).T @ b.astype(np.float64)
    return [out, ex], [ref.astype(F32), None]


def _mixed(dev, rng):
    """Cores 0-3 independent matmuls; cores 4 and 5 hand an HBM tensor over through a core_barrier
    while computing; cores 4-7 all_reduce a tile and keep computing after it."""
    progs = [t3.Program(core=k) for k in range(8)]
    outs, refs = [], []
    for k in range(4):
        o, r = _matmul_core(dev, progs[k], rng)
        outs += o
        refs += r
    x = rng.integers(-50, 50, size=(64, 32)).astype(F32)
    shared = dev.hbm.alloc((64, 32), F32)
    got = dev.hbm.alloc((64, 32), F32)
    p4, p5 = progs[4], progs[5]
    t = p4.sbuf((64, 32), F32)
    p4.dma_copy(dst=t, src=dev.hbm.put(x))
    p4.tensor_scalar(dst=t, data=t, op0="multiply", operand0=2.0, engine="vector")
    p4.dma_copy(dst=shared, src=t)
    for p in (p4, p5):
        w = p.sbuf((128, 512), F32)
        p.memset(dst=w, value=float(p.core), engine="gpsimd")
        p.tensor_tensor(dst=w, data1=w, data2=w, op="multiply", engine="vector")
        p.core_barrier(data=shared, cores=[0, 1])  # the LNC=2 pair (4, 5)
    r5 = p5.sbuf((64, 32), F32)
    p5.dma_copy(dst=r5, src=shared)
    p5.tensor_scalar(dst=r5, data=r5, op0="add", operand0=1.0, engine="vector")
    p5.dma_copy(dst=got, src=r5)
    outs.append(got)
    refs.append(x * 2 + 1)
    vals = {k: rng.integers(-100, 100, size=(32, 16)).astype(F32) for k in range(4, 8)}
    for k in range(4, 8):
        p = progs[k]
        src = dev.hbm.put(vals[k])
        dst = dev.hbm.alloc((32, 16), F32)
        p.all_reduce(dst=dst, src=src, cores=[4, 5, 6, 7])
        s = p.sbuf((32, 16), F32)
        p.dma_copy(dst=s, src=dst)
        p.tensor_scalar(dst=s, data=s, op0="multiply", operand0=float(k), engine="vector")
        fin = dev.hbm.alloc((32, 16), F32)
        p.dma_copy(dst=fin, src=s)
        outs.append(fin)
        refs.append(sum(vals.values()) * k)
    return progs, outs, refs


def _plain(x):
    """Trace columns as comparable values (arrays as their dtype and bytes)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return (x.dtype.str, x.shape, x.tobytes())
    return x


def _outcome(dev, progs, outs, **kw):
    """Everything a run reports: outputs' bits, time, counts, every raw trace column, or the error."""
    try:
        r = dev.run(progs, **kw)
    except errors.EmuError as e:
        return ("error", type(e).__name__, str(e), e.rule)
    trace = _plain(r._raw_trace.columns())
    data = [dev.hbm.get(o).tobytes() for o in outs]
    return ("ok", r.time_ns, r.executed, r.trace_dropped, r.identical_writes, trace, data)


def _both(build, **kw):
    """`build(dev, rng)` run on a fresh device with 1 and with 2 threads: the two outcomes."""
    res = []
    for n in (1, 2):
        t3.set_num_threads(n)
        dev = t3.Device(rounding="stochastic", seed=5)
        progs, outs, _ = build(dev, np.random.default_rng(3))
        res.append(_outcome(dev, progs, outs, **kw))
    return res


@pytest.mark.parametrize("races", [True, False])
def test_mixed_program_is_identical_on_1_and_2_threads(races):
    one, two = _both(_mixed, check_races=races)
    assert one[0] == "ok", one
    assert one == two


def test_mixed_program_matches_numpy_on_2_threads():
    t3.set_num_threads(2)
    dev = t3.Device()
    progs, outs, refs = _mixed(dev, np.random.default_rng(3))
    dev.run(progs)
    for o, ref in zip(outs, refs):
        if ref is not None:
            np.testing.assert_array_equal(dev.hbm.get(o), ref)
    # exp(C / 64) against numpy within the activation's documented error (a few ulp).
    c, e = dev.hbm.get(outs[0]), dev.hbm.get(outs[1])
    np.testing.assert_allclose(e, np.exp(c.astype(np.float64) / 64), rtol=1e-5)


def test_perfetto_export_is_identical(tmp_path):
    paths = []
    for n in (1, 2):
        t3.set_num_threads(n)
        dev = t3.Device()
        progs, _, _ = _mixed(dev, np.random.default_rng(3))
        paths.append(dev.run(progs).trace.to_perfetto(tmp_path / f"t{n}.json"))
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_cross_core_race_is_reported_identically():
    def build(dev, rng):
        progs, outs, refs = _mixed(dev, rng)
        shared = dev.hbm.alloc((64, 32), F32)
        p6, p7 = progs[6], progs[7]
        t6 = p6.sbuf((64, 32), F32)
        p6.memset(dst=t6, value=7.0, engine="vector")
        p6.activation(dst=t6, op="exp", data=t6)
        p6.dma_copy(dst=shared, src=t6)
        t7 = p7.sbuf((64, 32), F32)
        p7.tensor_copy(dst=t7, src=p7.sbuf((64, 32), F32), engine="vector")
        p7.dma_copy(dst=t7, src=shared)
        return progs, outs, refs

    one, two = _both(build)
    assert one[:2] == ("error", "RaceError") and one[3] == "data_race", one
    assert "core 6" in one[2] and "core 7" in one[2]
    assert one == two
    # Without race checks the run completes, identically.
    one, two = _both(build, check_races=False)
    assert one[0] == "ok" and one == two


def _bad_gather(p, late: int):
    """An nc_n_gather whose indices (memset to 1000) lie outside data's 64 elements: a run-time
    error on p's core after `late` [128, 512] multiplies on the same engine."""
    w = p.sbuf((128, 512), F32)
    p.memset(dst=w, value=1.0, engine="gpsimd")
    for _ in range(late):
        p.tensor_tensor(dst=w, data1=w, data2=w, op="multiply", engine="gpsimd")
    data = p.sbuf((128, 64), F32)
    p.memset(dst=data, value=0.0, engine="gpsimd")
    idx = p.sbuf((128, 8), np.uint32)
    p.memset(dst=idx, value=1000, engine="gpsimd")
    p.nc_n_gather(dst=p.sbuf((128, 8), F32), data=data, indices=idx, engine="gpsimd")


@pytest.mark.parametrize("early", [1, 6])
def test_two_failing_cores_raise_the_error_one_thread_meets_first(early):
    late = 7 if early == 1 else 1

    def build(dev, rng):
        progs, outs, refs = _mixed(dev, rng)
        _bad_gather(progs[early], 2)
        _bad_gather(progs[late], 12)
        return progs, outs, refs

    one, two = _both(build)
    assert one[:2] == ("error", "AddressError") and one[3] == "gather_index_out_of_range", one
    assert f"(core {early})" in one[2]
    assert one == two


def test_step_limit_and_time_limit_on_2_threads():
    def run(n, **kw):
        t3.set_num_threads(n)
        dev = t3.Device()
        progs, outs, _ = _mixed(dev, np.random.default_rng(3))
        dev.max_executed = 100
        return _outcome(dev, progs, outs, **kw)

    one, two = run(1), run(2)
    assert one[:2] == ("error", "RunawayError") and one[3] == "runaway_loop"
    assert one == two
    t3.set_num_threads(2)
    dev = t3.Device()
    progs, _, _ = _mixed(dev, np.random.default_rng(3))
    with pytest.raises(errors.RunawayError) as e:
        dev.run(progs, max_seconds=0.0)
    assert e.value.rule == "run_time_limit"
    # The device stays usable.
    progs, outs, refs = _mixed(dev, np.random.default_rng(3))
    dev.run(progs)
    np.testing.assert_array_equal(dev.hbm.get(outs[-1]), refs[-1])


def test_memory_limit_is_identical_on_1_and_2_threads():
    """max_memory (here 1 kB: the all_reduce's buffers exceed it) stops both runs alike."""
    one, two = _both(_mixed, max_memory=1000)
    assert one[:2] == ("error", "ResourceError") and one[3] == "run_memory_limit", one
    assert one == two


_ENV_CHILD = textwrap.dedent(
    """
    import hashlib, json, sys
    import numpy as np
    import trn3emu as t3
    sys.path.insert(0, sys.argv[1])
    from test_cores_parallel import _mixed, _outcome
    dev = t3.Device(rounding="stochastic", seed=5)
    progs, outs, _ = _mixed(dev, np.random.default_rng(3))
    print(json.dumps([t3.get_num_threads(), hashlib.sha256(repr(_outcome(dev, progs, outs)).encode()).hexdigest()]))
    """
)


def test_env_thread_count_gives_the_same_run():
    here = os.path.dirname(os.path.abspath(__file__))
    got = {}
    for n in ("1", "2"):
        env = dict(os.environ, TRN3EMU_NUM_THREADS=n)
        out = subprocess.run(
            [sys.executable, "-c", _ENV_CHILD, here], env=env, capture_output=True, text=True, check=True
        )
        threads, digest = json.loads(out.stdout.strip().splitlines()[-1])
        assert threads == int(n)
        got[n] = digest
    assert got["1"] == got["2"]


_SIGINT_CHILD = textwrap.dedent(
    """
    import signal, sys
    import numpy as np
    import trn3emu as t3
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def long_loop(core, iterations, out=None):
        p = t3.Program(core=core, sync="manual")
        t = p.sbuf((128, 512), np.float32)
        p.memset(dst=t, value=0.0, engine="vector")
        i = p.register_alloc(0, engine="vector")
        top = len(p)
        p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0, engine="vector")
        p.register_op(dst=i, src=i, op="add", imm=1, engine="vector")
        p.branch(target=top, cmp="lt", reg=i, imm=iterations, engine="vector")
        if out is not None:
            p.dma_copy(dst=out, src=t, engine="vector")
        return p

    dev = t3.Device()
    progs = [long_loop(c, 2_000_000) for c in range(4)]
    for rep in range(3):
        print("go", rep, flush=True)
        try:
            dev.run(progs, check_races=False, trace=False)
            print("completed", flush=True)
            sys.exit(1)
        except KeyboardInterrupt:
            print("caught", rep, flush=True)
        out = [dev.hbm.alloc((128, 512), np.float32) for _ in range(4)]
        dev.run([long_loop(c, 5, out[c]) for c in range(4)])
        assert all((dev.hbm.get(o) == 5).all() for o in out)
        print("ok", rep, flush=True)
    """
)


def test_ctrl_c_stops_a_2_thread_multicore_run():
    env = dict(os.environ, TRN3EMU_NUM_THREADS="2", TRN3EMU_PROGRESS="0")
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGINT_CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        for rep in range(3):
            assert proc.stdout.readline().strip() == f"go {rep}"
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            assert proc.stdout.readline().strip() == f"caught {rep}"
            assert proc.stdout.readline().strip() == f"ok {rep}", proc.stderr.read()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_time_limit_stops_queued_work_promptly():
    """All of this run's work is compute the scheduler queues: the time limit must still stop it
    long before the whole run would end (the scheduler stays close to the execution)."""

    def adds(core, n):
        p = t3.Program(core=core)
        t = p.sbuf((128, 512), F32)
        p.memset(dst=t, value=0.0, engine="vector")
        for _ in range(n):
            p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0, engine="vector")
        return p

    progs = [adds(c, 3000) for c in range(8)]
    dev = t3.Device()
    t3.set_num_threads(2)
    t0 = time.perf_counter()
    dev.run(progs, check_races=False, trace=False)
    full = time.perf_counter() - t0
    t0 = time.perf_counter()
    with pytest.raises(errors.RunawayError):
        dev.run(progs, check_races=False, trace=False, max_seconds=0.01)
    assert time.perf_counter() - t0 < full / 3
