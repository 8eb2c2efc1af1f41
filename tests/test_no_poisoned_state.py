"""Issue 18, "no poisoned state": every failed call leaves Device, Program and allocators as they
were. One test per error path: the observable state (HBM allocator placements and the next
automatic address, host memory backing HBM, a sentinel tensor's bytes; a Program's instructions
and its SBUF/PSUM allocators) is compared before and after, and a good call afterwards gives what
it gives on a fresh device."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu as t3

F32 = np.float32
SENTINEL = np.arange(1000, dtype=F32) * 3 - 7


def _hbm_state(dev: t3.Device) -> tuple:
    h = dev.hbm
    return tuple((b.lo, b.hi, b.live) for b in h._live), h._top, h._holes, h.resident_bytes


def _program_state(p: t3.Program) -> tuple:
    return len(p), p.to_text(), dict(p._sbuf.live), dict(p._psum.live), list(p._sbuf._recent)


def _state(dev, sentinel, *programs) -> tuple:
    return _hbm_state(dev), dev.hbm.get(sentinel).tobytes(), dev.max_executed, [_program_state(p) for p in programs]


def _good_run(dev: t3.Device) -> tuple:
    """A small program's result and timing: the same on a used device as on a fresh one (it
    touches no HBM, so the HBM state stays comparable)."""
    p = t3.Program()
    s = p.sbuf((128, 16), F32)
    d = p.sbuf((128, 16), F32)
    p.memset(dst=s, value=1.5)
    p.activation(dst=d, op="copy", data=s, scale=2.0)
    r = dev.run(p)
    np.testing.assert_array_equal(dev.read(d), np.full((128, 16), 3.0, F32))
    return r.executed, r.time_ns


FRESH = None


def _fresh_good_run() -> tuple:
    global FRESH
    if FRESH is None:
        FRESH = _good_run(t3.Device())
    return FRESH


@pytest.fixture
def setup():
    dev = t3.Device()
    other = dev.hbm.put(np.ones(64, F32))
    sentinel = dev.hbm.put(SENTINEL, name="sentinel")
    dev.hbm.free(other)  # a hole below the sentinel: placement state is not trivial
    p = t3.Program()
    a = p.sbuf((128, 64), F32, name="a")
    acc = p.psum((128, 128), F32, name="acc")
    p.memset(dst=a, value=1.0)
    p.memset(dst=acc, value=0.0)
    return dev, sentinel, p, (a, acc)


def _assert_unchanged(setup, call, error=t3.EmuError, rule: str | None = None):
    dev, sentinel, p, _ = setup
    before = _state(dev, sentinel, p)
    with pytest.raises(error) as e:
        call(dev, p)
    if rule is not None:
        assert e.value.rule == rule, e.value
    assert _state(dev, sentinel, p) == before
    assert _good_run(dev) == _fresh_good_run()
    assert _state(dev, sentinel, p) == before
    return e.value


# ------------------------------------------------------------------ HBM calls
HBM_FAILURES = {
    "alloc_over_capacity": (lambda d, p: d.hbm.alloc((1 << 40,), F32), "hbm_capacity"),
    "alloc_negative_address": (lambda d, p: d.hbm.alloc((4,), F32, address=-64), "hbm_out_of_range"),
    "alloc_overlapping_explicit": (
        lambda d, p: d.hbm.alloc((4,), F32, address=d.hbm._live[0].lo),
        "hbm_overlap",
    ),
    "alloc_non_integer_shape": (lambda d, p: d.hbm.alloc((1.5,), F32), None),
    "alloc_bad_core": (lambda d, p: d.hbm.alloc((4,), F32, core=99), "tensor_core_out_of_range"),
    "put_itemsize_mismatch": (lambda d, p: d.hbm.put(np.ones(4, F32), dtype="bfloat16"), "array_itemsize_mismatch"),
    "put_over_capacity": (lambda d, p: d.hbm.put(np.ones(4, F32), address=(1 << 40) * 1024), None),
    "put_not_an_array": (lambda d, p: d.hbm.put(object()), None),
    "write_wrong_size": (None, "array_size_mismatch"),
    "get_tile": (None, "hbm_tensor_expected"),
    "get_below_address_zero": (
        lambda d, p: d.hbm.get(t3.Tensor("hbm", "float32", (4,), strides=(-(1 << 20),))),
        "hbm_out_of_range",
    ),
    "free_twice": (None, "hbm_double_free"),
    "use_after_free": (None, "hbm_use_after_free"),
}


@pytest.mark.parametrize("case", sorted(HBM_FAILURES))
def test_failed_hbm_call_changes_nothing(setup, case):
    dev, sentinel, p, tiles = setup
    call, rule = HBM_FAILURES[case]
    if case == "write_wrong_size":
        call = lambda d, p: d.hbm.write(sentinel, np.ones(3, F32))  # noqa: E731
    elif case == "get_tile":
        call = lambda d, p: d.hbm.get(tiles[0])  # noqa: E731
    elif case in ("free_twice", "use_after_free"):
        t = dev.hbm.put(np.zeros(8, F32))
        dev.hbm.free(t)
        call = (lambda d, p: d.hbm.free(t)) if case == "free_twice" else (lambda d, p: d.hbm.get(t))  # noqa: E731
    _assert_unchanged(setup, call, rule=rule)


# ------------------------------------------------------------------ Program appends
PROGRAM_FAILURES = {
    "sbuf_overflow": lambda d, p, a: p.sbuf((128, 1 << 20), F32),
    "psum_overflow": lambda d, p, a: p.psum((128, 4096), F32),
    "tile_address_out_of_range": lambda d, p, a: p.sbuf((128, 64), F32, address=(0, 1 << 30)),
    "shape_mismatch": lambda d, p, a: p.tensor_copy(dst=a[0], src=p._test_small),
    "bad_engine": lambda d, p, a: p.memset(dst=a[0], value=1.0, engine="nonesuch"),
    "bad_opcode_operand": lambda d, p, a: p.activation(dst=a[0], op="nonesuch", data=a[0]),
    "hbm_dst_of_compute": lambda d, p, a: p.memset(dst=p._test_hbm, value=1.0),
}


@pytest.mark.parametrize("case", sorted(PROGRAM_FAILURES))
def test_failed_program_append_changes_nothing(setup, case):
    dev, sentinel, p, tiles = setup
    p._test_small = p.sbuf((128, 8), F32, name="small")
    p._test_hbm = sentinel.reshape(10, 100)
    call = PROGRAM_FAILURES[case]
    e = _assert_unchanged(setup, lambda d, p: call(d, p, tiles))
    assert isinstance(e, t3.EmuError)
    dev.run(p)  # the program itself still runs
    np.testing.assert_array_equal(dev.read(tiles[0]), np.ones((128, 64), F32))


# ------------------------------------------------------------------ failed runs
def _race(dev, p):
    q = t3.Program(sync="manual")
    a = q.sbuf((128, 64), F32)
    b = q.sbuf((128, 64), F32)
    q.memset(dst=a, value=2.5)
    q.activation(dst=b, op="copy", data=a, scale=2.0)
    dev.run(q)


def _branch_loop():
    q = t3.Program(sync="manual")
    q.branch(target=0, engine="sync")
    return q


def _runaway(dev, p):
    old = dev.max_executed
    dev.max_executed = 1000
    try:
        dev.run(_branch_loop(), trace=False)
    finally:
        dev.max_executed = old


def _time_limit(dev, p):
    dev.max_executed, old = 1 << 50, dev.max_executed
    try:
        dev.run(_branch_loop(), trace=False, max_seconds=0.05)
    finally:
        dev.max_executed = old


def _memory_limit(dev, p):
    src = dev.hbm._live[-1]  # the sentinel's block
    q = t3.Program()
    a = t3.Tensor("hbm", "float32", (16,), offset=src.lo)
    q.dma_copy(dst=a.ap([[0, 1 << 15], [0, 1 << 15]]), src=a.ap([[0, 1 << 15], [0, 1 << 15]]))
    dev.run(q, max_memory=1 << 30)


def _deadlock(dev, p):
    q = t3.Program(sync="manual")
    s = q.sbuf((1, 8), F32)
    sem = q.semaphore()
    q.memset(dst=s, value=1.0, wait=[(sem, 1)])
    dev.run(q)


RUN_FAILURES = {
    "race": (_race, t3.RaceError, None),
    "runaway": (_runaway, t3.RunawayError, "runaway_loop"),
    "time_limit": (_time_limit, t3.RunawayError, "run_time_limit"),
    "memory_limit": (_memory_limit, t3.ResourceError, "run_memory_limit"),
    "deadlock": (_deadlock, t3.DeadlockError, None),
}


@pytest.mark.parametrize("case", sorted(RUN_FAILURES))
def test_failed_run_changes_nothing_it_did_not_write(setup, case):
    dev, sentinel, p, tiles = setup
    call, error, rule = RUN_FAILURES[case]
    runs = dev.runs if hasattr(dev, "runs") else None
    _assert_unchanged(setup, call, error=error, rule=rule)
    if runs is not None:
        assert dev.runs >= runs
    dev.run(p)  # the setup program still runs, with its results
    np.testing.assert_array_equal(dev.read(tiles[0]), np.ones((128, 64), F32))
