"""The tracing fast paths (issue 17, NKI tracing speed) against independent references:

- the on-chip allocator's native range search (`_native.RangeAllocator`, behind
  `trn3emu.allocator.Allocator`) against a plain-Python model of the documented policy (first fit
  over live and the last ROTATE freed ranges, then over live ones alone; 64-byte alignment; PSUM
  tiles never straddle a 2 KiB bank, larger ones start on a bank), on random alloc/free sequences;
- `nki.isa` calls taken by the one-step append (`nki/_emit.py`) against the same instructions
  built through `Program`'s assembler methods (the general path), operand by operand;
- call forms the one-step path must leave to the general one still raise their errors.
"""

import numpy as np
import pytest
import trn3emu as t3
import trn3emu.nki as tn
from trn3emu.allocator import ALIGN, PSUM_BANK, PSUM_BYTES, ROTATE, SBUF_BYTES, Allocator
from trn3emu.errors import CapacityError, NotSupportedError

tn.install()
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


# ------------------------------------------------------------------------------- allocator
class _ModelAllocator:
    """The allocation policy of docs/nki.md "Memory", written out plainly (lists, no bisection)."""

    def __init__(self, capacity: int, bank: int) -> None:
        self.capacity, self.bank = capacity, bank
        self.live: dict[int, tuple[int, int]] = {}
        self.recent: list[tuple[int, int]] = []  # oldest first, at most ROTATE
        self.next_key = 0

    def _start(self, pos: int, n: int) -> int:
        s = -(-pos // ALIGN) * ALIGN
        b = self.bank
        if b and (n > b or s // b != (s + n - 1) // b):
            s = -(-s // b) * b
        return s

    def _first_fit(self, n: int, ranges: list) -> int | None:
        pos = 0
        for lo, hi in sorted(ranges):
            s = self._start(pos, n)
            if s + n <= lo:
                return s
            pos = max(pos, hi)
        s = self._start(pos, n)
        return s if s + n <= self.capacity else None

    def alloc(self, n: int) -> int | None:
        live = list(self.live.values())
        pos = self._first_fit(n, live + self.recent)
        if pos is None:
            pos = self._first_fit(n, live)
        if pos is None:
            return None
        self.live[self.next_key] = (pos, pos + n)
        self.next_key += 1
        return pos

    def free(self, key: int) -> None:
        r = self.live.pop(key)
        self.recent = (self.recent + [r])[-ROTATE:]


@pytest.mark.parametrize("what", ["sbuf", "psum"])
@pytest.mark.parametrize("seed", range(4))
def test_allocator_places_tiles_as_the_documented_policy(what, seed):
    rng = np.random.default_rng(seed)
    capacity, bank = (SBUF_BYTES, 0) if what == "sbuf" else (PSUM_BYTES, PSUM_BANK)
    real = Allocator.sbuf() if what == "sbuf" else Allocator.psum()
    model = _ModelAllocator(capacity, bank)
    sizes = [4, 64, 200, 512, 1536, 2048, 4096] if what == "psum" else [64, 1000, 2048, 8192, 40000]
    keys: list[tuple[int, int]] = []  # (real key, model key)
    for step in range(600):
        if keys and rng.random() < 0.45:
            real_key, model_key = keys.pop(int(rng.integers(len(keys))))
            real.free(real_key)
            model.free(model_key)
            continue
        n = int(rng.choice(sizes))
        want = model.alloc(n)
        if want is None:
            with pytest.raises(CapacityError):
                real.alloc(n, f"t{step}")
            continue
        key, got = real.alloc(n, f"t{step}")
        assert got == want, f"step {step}: {n} bytes placed at {got}, the policy says {want}"
        keys.append((key, model.next_key - 1))
        assert real._recent == model.recent
    assert {lo for lo, _, _ in real.live.values()} == {lo for lo, _ in model.live.values()}


def test_allocator_frees_a_dead_owners_range_once():
    a = Allocator.sbuf()

    class Owner:
        pass

    owner = Owner()
    key, off = a.alloc(1024, "x")
    a.track(owner, key)
    del owner
    assert key not in a.live  # freed when its owner died
    a.free(key)  # a second free of the key changes nothing
    assert a._recent == [(off, off + 1024)]
    # alloc + track in one step: the same placement, freed with its owner; None when full
    owner = Owner()
    off2 = a.alloc_owned(512, "y", owner)
    assert off2 == 1024 and [lo for lo, _, _ in a.live.values()] == [1024]
    del owner
    assert a.live == {} and a._recent == [(off, off + 1024), (1024, 1536)]
    assert a.alloc_owned(SBUF_BYTES + 1, "z", Owner()) is None and a.live == {}


def test_allocator_alloc_owned_places_as_alloc_and_track():
    """The native one-step `alloc_owned` against `alloc` + `track` on random sequences of
    allocations and owner deaths (several owners dying between allocations): the same offsets,
    live ranges and recently freed ranges."""
    import random

    class Owner:
        pass

    rng = random.Random(5)
    for bank in (0, 2048):
        a, b = Allocator("X", 64 * 1024, 64, bank), Allocator("X", 64 * 1024, 64, bank)
        held_a, held_b = [], []
        for step in range(400):
            for _ in range(rng.choice((0, 0, 1, 2, 3))):
                if held_a:
                    i = rng.randrange(len(held_a))
                    del held_a[i], held_b[i]
            n = rng.choice((64, 100, 512, 2048, 4096))
            oa, ob = Owner(), Owner()
            off = a.alloc_owned(n, f"t{step}", oa)
            key, off_b = b.alloc(n, f"t{step}")
            b.track(ob, key)
            assert off == off_b
            held_a.append(oa)
            held_b.append(ob)
            assert sorted(a._live.values()) == sorted(b._live.values())
        assert a.live == b.live and a._recent == b._recent


# ------------------------------------------------------------------------ one-step append
def _kernel_instructions(body, *arrays):
    """The text of every instruction `body` traces (labels dropped: they name source lines)."""

    @nki.jit(cache=False)
    def k(*hbm):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        body(out, *hbm)
        return out

    k(*arrays)
    (prog,) = k.last_programs
    return [prog._native.instruction_text(i).split(" name=")[0] for i in range(len(prog))]


def _tiles(p: t3.Program):
    """The tiles `_body` allocates, at the addresses the kernel's allocator gives them."""
    a = p.sbuf((128, 512), np.float32)
    b = p.sbuf((128, 512), np.float32)
    ps = p.psum((128, 512), np.float32)
    col = p.sbuf((128, 1), np.float32)
    return a, b, ps, col


def _body(out, x):
    a = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    col = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.tensor_scalar(b, a, op0=nl.multiply, operand0=2)  # positional, an int immediate
    nisa.activation(dst=ps, op=nl.exp, data=b, scale=0.5, bias=None)
    nisa.tensor_reduce(col, nl.maximum, a, (1,), keepdims=True)  # the reduce wrapper: positional
    nisa.tensor_scalar(dst=b, data=ps, op0="add", operand0=col, reverse0=True)
    nisa.memset(a[:, 0:128], value=3)
    nisa.tensor_copy(dst=a[:, 128:256], src=b[:, 0:128], engine=nisa.vector_engine)
    nisa.dma_copy(dst=out, src=b)


def test_one_step_append_matches_the_assembler(monkeypatch):
    """The kernel's instructions equal the assembler's for the same operands (the kernel's HBM:
    x then out on a fresh device, as placed here; nki.isa takes f32 immediates as floats).
    Engines as the raw assembler picks them: the ISA defaults (no engine balancing)."""
    monkeypatch.setenv("TRN3EMU_NKI_PASSES", "engine_choice=off")
    x = np.ones((128, 512), np.float32)
    got = _kernel_instructions(_body, x)
    p = t3.Program()
    a, b, ps, col = _tiles(p)
    dev = t3.Device()
    xh = dev.hbm.put(x)
    out = dev.hbm.alloc((128, 512), np.float32)
    p.dma_copy(dst=a, src=xh)
    p.tensor_scalar(dst=b, data=a, op0="multiply", operand0=2.0)
    p.activation(dst=ps, op="exp", data=b, scale=0.5)
    p.tensor_reduce(dst=col, op="maximum", data=a, axis=[1], keepdims=True)
    p.tensor_scalar(dst=b, data=ps, op0="add", operand0=col, reverse0=True)
    p.memset(dst=a[:, 0:128], value=3)
    p.tensor_copy(dst=a[:, 128:256], src=b[:, 0:128], engine="vector")
    p.dma_copy(dst=out, src=b)
    want = [p._native.instruction_text(i).split(" name=")[0] for i in range(len(p))]
    assert len(got) == 8
    assert got == want


def test_argument_given_twice_is_still_a_call_form_error():
    def body(out, x):
        a = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(a, dst=a, src=a)

    with pytest.raises(NotSupportedError) as ei:
        _kernel_instructions(body, np.ones((128, 512), np.float32))
    assert ei.value.rule == "nki_call_form"


def test_a_tile_of_another_program_is_refused_after_its_first_use():
    """A tile used by its own program (its access pattern then known) is still refused in
    another program of the launch (another core's SBUF)."""
    from trn3emu.errors import MemorySpaceError

    kept = {}

    @nki.jit(cache=False)
    def k(x):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=t, value=1.0)
            nisa.memset(dst=t, value=2.0)
            kept["t"] = t
        else:
            u = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=u, src=kept["t"])
        return out

    with pytest.raises(MemorySpaceError) as ei:
        k[2](np.ones((128, 512), np.float32))
    assert ei.value.rule == "core_private_memory"


def test_garbage_collector_paused_while_tracing_and_restored():
    """Automatic collection is off while the kernel body is traced (`nki/gc_pause.py`), back on
    after the call, also when the trace raises; a collector the caller turned off stays off."""
    import gc

    seen = []

    @nki.jit(cache=False)
    def k(x, fail):
        seen.append(gc.isenabled())
        t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        if fail:
            raise ValueError("kernel error")
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.ones((128, 512), np.float32)
    assert gc.isenabled()
    np.testing.assert_array_equal(k(x, False), x)
    assert seen == [False] and gc.isenabled()
    with pytest.raises(ValueError, match="kernel error"):
        k(x, True)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        k(x, False)
        assert not gc.isenabled()
    finally:
        gc.enable()


def _helper_op(lnl, a, b):
    return lnl.multiply(a, b)  # HELPER-LINE


def test_value_op_instructions_carry_the_innermost_kernel_line():
    """A legacy value op's instructions are named after the innermost line outside the package
    that called the op (`TraceContext.user_f` stands in for the frame walk inside the op, and is
    restored when the op returns): a helper's line for the op it calls, the kernel's own line for
    the ops called there; a pending load is named after its own line, wherever it is issued."""
    import inspect

    import neuronxcc.nki as lnki
    import neuronxcc.nki.language as lnl

    @lnki.jit
    def k(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        t = lnl.load(x)  # LOAD-LINE
        u = _helper_op(lnl, t, t)
        lnl.store(out, value=lnl.add(u, t))  # ADD-LINE
        return out

    src, start = inspect.getsourcelines(k.fn if hasattr(k, "fn") else k)
    lines = {tag: start + i for i, s in enumerate(src) for tag in ("LOAD-LINE", "ADD-LINE") if tag in s}
    hsrc, hstart = inspect.getsourcelines(_helper_op)
    helper_line = hstart + next(i for i, s in enumerate(hsrc) if "HELPER-LINE" in s)
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    np.testing.assert_array_equal(k(x), x * x + x)
    texts = [p._native.instruction_text(i) for p in k.last_programs for i in range(len(p))]
    got = [(t.split(".", 1)[0], t.rsplit(" name=", 1)[1]) for t in texts]
    me = "test_nki_trace_paths.py"
    assert got == [
        ("dma_copy", f"{me}:{lines['LOAD-LINE']}"),  # the load, issued at its first use
        ("tensor_tensor", f"{me}:{helper_line}"),  # called by the helper
        ("tensor_tensor", f"{me}:{lines['ADD-LINE']}"),
        ("dma_copy", f"{me}:{lines['ADD-LINE']}"),  # the store
    ]
