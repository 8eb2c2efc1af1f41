"""`os.fork()` while another thread runs a Device (issue 31, item 5): in the child that Device
raises `ExecutionError` (`device_forked`) at once instead of blocking forever (its lock is held
by a thread that does not exist there), and a new Device works, with the kernels' host threads
rebuilt. Before, the child's first call on the Device blocked forever and Ctrl-C did not free it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CHILD = """
import json, os, sys, threading, time
import numpy as np
import trn3emu as t3

t3.set_num_threads(2)
dev = t3.Device()
x = dev.hbm.put(np.arange(8, dtype=np.float32).reshape(1, 8))
p = t3.Program(sync="manual")
t = p.sbuf((128, 64), np.float32)
p.memset(dst=t, value=0.0, engine="vector")
top = len(p)
p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0, engine="vector")
p.branch(target=top, engine="vector")
started = threading.Event()
def spin():
    started.set()
    try:
        dev.run(p, check_races=False, trace=False, max_seconds=20)
    except t3.EmuError:
        pass
threading.Thread(target=spin, daemon=True).start()
started.wait()
time.sleep(0.5)  # the run holds the device now
pid = os.fork()
if pid == 0:
    out = {}
    t0 = time.monotonic()
    try:
        dev.hbm.get(x)
        out["old"] = "worked"
    except t3.EmuError as e:
        out["old"] = e.rule
    out["old_s"] = time.monotonic() - t0
    try:
        fresh = t3.Device()
        a = np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)
        h = fresh.hbm.put(a)
        q = t3.Program()
        s = q.sbuf((128, 512), np.float32)
        q.dma_copy(dst=s, src=h)
        q.tensor_scalar(dst=s, data=s, op0="multiply", operand0=2.0)
        q.dma_copy(dst=h, src=s)
        fresh.run(q)
        out["new"] = bool((fresh.hbm.get(h) == a * np.float32(2)).all())
    except Exception as e:  # reported, not raised: the child must exit
        out["new"] = repr(e)
    print(json.dumps(out), flush=True)
    os._exit(0)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print(json.dumps({"hung": True}), flush=True)
os._exit(0)
"""


def test_device_in_a_forked_child_raises_at_once_and_a_new_one_works():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], capture_output=True, text=True, timeout=120)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert lines, r.stdout + r.stderr[-2000:]
    out = lines[0]
    assert "hung" not in out, "the child blocked on the Device"
    assert out["old"] == "device_forked" and out["old_s"] < 1.0, out
    assert out["new"] is True, out
