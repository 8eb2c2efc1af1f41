"""Issue 31 item 3: NKI tracing is thread-safe. Each trace has its own context (a context
variable, not a module global), so kernels traced in several threads at once give the results
serial calls give, and a kernel launched on host arrays while another kernel traces runs as a
launch of its own without touching the outer trace."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import NotSupportedError

tn.install()

import nki  # noqa: E402
import nki.language as nl  # noqa: E402

ROWS = 128


def _fma(x, y):
    """out = x * y + x, 128 rows at a time (several instructions per row block)."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // ROWS):
        a = nl.load(x[i * ROWS : (i + 1) * ROWS, :])
        b = nl.load(y[i * ROWS : (i + 1) * ROWS, :])
        nl.store(out[i * ROWS : (i + 1) * ROWS, :], nl.add(nl.multiply(a, b), a))
    return out


def _inputs(n: int):
    rng = np.random.default_rng(31)
    shapes = [(128, 64), (256, 32), (384, 16)]  # traces of different lengths interleave
    return [tuple(rng.standard_normal(shapes[i % len(shapes)], dtype=np.float32) for _ in range(2)) for i in range(n)]


@pytest.fixture
def fine_switching():
    """Switch threads every microsecond so traces interleave instruction by instruction."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.mark.parametrize("cache", [False, True])
def test_a_thread_pool_calling_one_kernel_gives_the_serial_results(cache, fine_switching):
    k = nki.jit(_fma, cache=cache)
    inputs = _inputs(12)
    serial = [k(x, y) for x, y in inputs]
    for (x, y), s in zip(inputs, serial):  # an independent reference: fp32 multiply, then add
        np.testing.assert_array_equal(s, x * y + x)
    calls = list(range(96))

    def call(i):
        x, y = inputs[i % len(inputs)]
        return k(x, y)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(call, calls))
    for i, r in zip(calls, results):
        s = serial[i % len(inputs)]
        assert r.dtype == s.dtype and r.shape == s.shape
        assert r.view(np.uint32).tobytes() == s.view(np.uint32).tobytes(), f"call {i}"


def test_threads_tracing_different_kernels_at_once(fine_switching):
    def _neg(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.negative(nl.load(x)))
        return out

    kernels = [nki.jit(_fma, cache=False), nki.jit(_neg, cache=False)]
    x, y = _inputs(1)[0]
    want = [x * y + x, -x]

    def call(i):
        k = kernels[i % 2]
        return i % 2, (k(x, y) if i % 2 == 0 else k(x))

    with ThreadPoolExecutor(max_workers=4) as pool:
        for which, r in pool.map(call, range(48)):
            np.testing.assert_array_equal(r, want[which])


def _copy(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def test_a_launch_on_host_arrays_inside_a_trace_runs_as_its_own_launch():
    inner = nki.jit(_copy, cache=False)
    host = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    seen = []

    @nki.jit(cache=False)
    def outer(x):
        a = nl.load(x)  # the outer trace has begun
        seen.append(inner(host))  # host data: a launch of its own, on its own device
        seen.append(inner[1](host * 2))  # and with a grid
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(a, a))
        return out

    x = np.linspace(-3, 3, 128 * 16, dtype=np.float32).reshape(128, 16)
    np.testing.assert_array_equal(outer(x), x + x)
    assert len(seen) == 2
    assert isinstance(seen[0], np.ndarray) and isinstance(seen[1], np.ndarray)
    np.testing.assert_array_equal(seen[0], host)
    np.testing.assert_array_equal(seen[1], host * 2)
    assert outer.last_programs and len(outer.last_programs) == 1  # the outer launch's own programs


def test_a_kernel_called_on_tiles_inside_a_trace_is_still_inlined():
    @nki.jit
    def double(t):
        return nl.add(t, t)

    @nki.jit(cache=False)
    def outer(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, double(nl.load(x)))
        return out

    x = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
    np.testing.assert_array_equal(outer(x), x + x)


def test_a_grid_launch_on_tiles_inside_a_trace_names_both_kernels():
    @nki.jit
    def helper(t):
        return t

    @nki.jit(cache=False)
    def outer(x):
        helper[2](nl.load(x))
        return x

    with pytest.raises(NotSupportedError) as e:
        outer(np.zeros((128, 4), np.float32))
    assert e.value.rule == "nki_nested_launch"
    assert "helper[2]" in str(e.value) and "outer" in str(e.value)


def test_a_launch_from_another_thread_while_a_kernel_traces():
    """Thread A stops in the middle of its trace; thread B launches a kernel on host arrays
    (before: B saw A's trace, ran its kernel body inline into it and broke both)."""
    inner = nki.jit(_copy, cache=False)
    paused, resume = threading.Event(), threading.Event()
    out: dict = {}

    @nki.jit(cache=False)
    def outer(x):
        a = nl.load(x)
        paused.set()
        assert resume.wait(30)
        o = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(o, nl.multiply(a, a))
        return o

    x = np.linspace(-2, 2, 128 * 8, dtype=np.float32).reshape(128, 8)
    host = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)

    def run_outer():
        try:
            out["outer"] = outer(x)
        except Exception as e:  # noqa: BLE001 - checked below
            out["outer"] = e

    t = threading.Thread(target=run_outer)
    t.start()
    try:
        assert paused.wait(30)
        out["inner"] = inner(host)  # this thread: no trace of its own
    finally:
        resume.set()
        t.join(60)
    np.testing.assert_array_equal(out["inner"], host)
    assert not isinstance(out["outer"], Exception), out["outer"]
    np.testing.assert_array_equal(out["outer"], x * x)
