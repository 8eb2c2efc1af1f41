"""Bounded time and memory for any program, and host allocations that fail as errors, not aborts
(issue 18, findings 1 and 2). Each case runs in a fresh interpreter, so its peak resident size
and an address-space cap (`RLIMIT_AS`) concern that case alone."""

import json
import subprocess
import sys
import textwrap

import pytest

resource = pytest.importorskip("resource")

# A 5-instruction runaway loop: the sync stream bumps r0 (mod 64) and triggers a DMA whose source
# row is @s(r0, ...), forever. No engine ever waits on the DMA queue.
DMA_LOOP = """
table = dev.hbm.put(np.zeros((64, 32), np.float32))
p = t3.Program(sync="manual")
r = p.register_alloc(0, engine="sync")
g = p.sbuf((1, 32), np.float32)
p.register_op(dst=r, src=r, op="add", imm=1, engine="sync")
p.register_op(dst=r, src=r, op="bitwise_and", imm=63, engine="sync")
p.dma_copy(dst=g, src=table.ap([[32, 1], [1, 32]], scalar_offset=r), engine="sync")
p.branch(target=1, engine="sync")
"""

# A one-instruction runaway loop.
BRANCH_LOOP = """
p = t3.Program(sync="manual")
p.branch(target=0, engine="sync")
"""

HARNESS = """
import json, resource, sys
import numpy as np
import trn3emu as t3

def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

out = {{}}
dev = t3.Device()
{setup}
base = rss_mib()
try:
{body}
    out["error"] = None
except t3.EmuError as e:
    out["error"] = type(e).__name__
    out["rule"] = e.rule
    out["message"] = str(e)
out["growth_mib"] = rss_mib() - base
print(json.dumps(out))
"""


def run_case(setup: str, body: str, cap_bytes: int | None = None, timeout: float = 300) -> dict:
    """Run `body` (after `setup`) in a fresh interpreter, under an address-space cap if given.
    Returns the JSON it prints; fails on any abort (a non-zero exit)."""
    code = HARNESS.format(setup=textwrap.dedent(setup), body=textwrap.indent(textwrap.dedent(body), "    "))
    if cap_bytes is not None:
        code = f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({cap_bytes}, {cap_bytes}))\n" + code
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_runaway_dma_loop_ends_in_runaway_error_with_bounded_memory():
    # 2^20 executed items (~260k loop iterations). The race log of the DMA queue used to keep
    # every transfer (no engine waits on the queue): memory and time grew without limit.
    out = run_case(
        "dev.max_executed = 1 << 20\n" + DMA_LOOP,
        "dev.run(p, trace=False)",
    )
    assert out["error"] == "RunawayError" and out["rule"] == "runaway_loop"
    assert out["growth_mib"] < 256, out


# The DMA loop beside a vector stream looping on its own tile: the vector stream can still touch
# memory, so the DMA queue's entries cannot be pruned; repeats of one access replace each other.
TWO_LOOPS = (
    DMA_LOOP
    + """
h = p.sbuf((1, 32), np.float32)
top = len(p)
p.memset(dst={tile}, value=1.0, engine="vector")
p.branch(target=top, engine="vector")
"""
)


def test_two_unsynchronised_runaway_loops_have_bounded_memory():
    out = run_case(
        "dev.max_executed = 1 << 20\n" + TWO_LOOPS.format(tile="h"),
        "dev.run(p, trace=False)",
    )
    assert out["error"] == "RunawayError" and out["rule"] == "runaway_loop"
    assert out["growth_mib"] < 256, out


def test_a_race_between_looping_streams_is_still_found():
    import numpy as np
    import trn3emu as t3

    dev = t3.Device()
    dev.max_executed = 1 << 16
    ns = {"dev": dev, "np": np, "t3": t3}
    exec(TWO_LOOPS.format(tile="g"), ns)  # the vector loop writes the DMA's destination
    with pytest.raises(t3.RaceError) as e:
        dev.run(ns["p"], trace=False)
    assert e.value.rule == "data_race" and "dma_copy" in str(e.value) and "memset" in str(e.value)


def test_runaway_branch_loop_with_trace_on_has_bounded_memory():
    # 2^26 steps of a one-instruction loop used to keep 2^26 trace records (4.3 GB); the trace now
    # stops at TRACE_LIMIT (2^21) records and counts the rest.
    out = run_case(BRANCH_LOOP, "dev.run(p)")
    assert out["error"] == "RunawayError" and out["rule"] == "runaway_loop"
    assert out["growth_mib"] < 512, out


def test_trace_limit_per_run_keeps_the_first_records_and_counts_the_rest():
    import numpy as np
    import trn3emu as t3

    dev = t3.Device()
    p = t3.Program(sync="manual")
    t = p.sbuf((4, 4), np.float32)
    for _ in range(5):
        p.memset(dst=t, value=1.0, engine="vector")
    full = dev.run(p)
    assert len(full.trace) == 5 and full.trace_dropped == 0
    cut = dev.run(p, trace_limit=3)
    assert len(cut.trace) == 3 and cut.trace_dropped == 2
    assert cut.executed == 5 and cut.time_ns == full.time_ns


CAP = 3 << 30  # address-space cap: Python, numpy and the emulator fit well within it

# Two HBM tensors of 16 float32 (64 bytes); one DMA naming 2^30 elements through step-0 patterns.
STEP0_DMA = """
a = dev.hbm.put(np.arange(16, dtype=np.float32))
b = dev.hbm.put(np.zeros(16, np.float32))
p = t3.Program()
p.dma_copy(dst=b.ap([[0, 1 << 15], [0, 1 << 15]]), src=a.ap([[0, 1 << 15], [0, 1 << 15]]))
"""


def test_step0_dma_of_4_gib_raises_resource_error_under_a_memory_cap_not_an_abort():
    out = run_case(
        STEP0_DMA,
        """
dev.run(p)
""",
        cap_bytes=CAP,
    )
    # Under the cap the 4 GiB staging buffer cannot exist: an error, not "memory allocation
    # failed" and exit 134. (Without a cap the transfer finishes: every element is a[0].)
    assert out["error"] == "ResourceError" and out["rule"] == "host_allocation_failed", out
    assert "4294967296 bytes" in out["message"] and "src" in out["message"]


def test_device_stays_usable_after_a_resource_error():
    out = run_case(
        STEP0_DMA,
        """
try:
    dev.run(p)
except t3.ResourceError:
    pass
q = t3.Program()
q.dma_copy(dst=b, src=a)
dev.run(q)
assert (dev.hbm.get(b) == np.arange(16, dtype=np.float32)).all()
""",
        cap_bytes=CAP,
    )
    assert out["error"] is None, out


def test_hbm_get_of_30_gib_raises_resource_error_under_a_memory_cap():
    out = run_case(
        "t = dev.hbm.alloc((30 << 28,), np.float32)",
        """
try:
    dev.hbm.get(t)
except MemoryError as e:  # ResourceError is also a MemoryError
    assert isinstance(e, t3.ResourceError), e
    raise
""",
        cap_bytes=CAP,
    )
    assert out["error"] == "ResourceError" and out["rule"] == "host_allocation_failed", out
    assert "32212254720 bytes" in out["message"]
