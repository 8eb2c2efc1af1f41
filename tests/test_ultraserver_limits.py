"""UltraServer.run honours Ctrl-C and takes `max_seconds` / `max_memory` like `Device.run`
(issue 31, item 4). Before: Ctrl-C was raised 32 s later, at the step limit, and both keywords
were a bare TypeError."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import trn3emu as t3

# A child process runs an endless loop on chip 1 of a two-chip UltraServer; a thread sends
# SIGINT to the process `delay` s into the run. It prints how long after the signal the
# KeyboardInterrupt came, then checks both chips still run a small program.
CHILD = """
import json, os, signal, sys, threading, time
import numpy as np
import trn3emu as t3

signal.signal(signal.SIGINT, signal.default_int_handler)
us = t3.UltraServer(chips=2)
p = t3.Program(sync="manual", chip=1)
t = p.sbuf((128, 64), np.float32)
p.memset(dst=t, value=0.0, engine="vector")
top = len(p)
p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0, engine="vector")
p.branch(target=top, engine="vector")
lat = []
for rep in range(int(sys.argv[1])):
    sent = []
    def kick():
        time.sleep(0.3 + 0.1 * rep)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=kick, daemon=True).start()
    try:
        us.run(p, check_races=False, trace=False)
        print(json.dumps({"error": "completed"})); sys.exit(1)
    except KeyboardInterrupt:
        lat.append(time.monotonic() - sent[0])
for chip in (0, 1):
    q = t3.Program(chip=chip)
    x = us.chip(chip).hbm.put(np.arange(8, dtype=np.float32).reshape(1, 8))
    s = q.sbuf((1, 8), np.float32)
    q.dma_copy(dst=s, src=x)
    q.tensor_scalar(dst=s, data=s, op0="multiply", operand0=2.0)
    q.dma_copy(dst=x, src=s)
    us.run(q)
    assert (us.chip(chip).hbm.get(x) == 2 * np.arange(8, dtype=np.float32)).all()
print(json.dumps({"latency": lat}))
"""


def test_ultraserver_run_raises_keyboard_interrupt_promptly():
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), "5"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["latency"]) == 5 and max(out["latency"]) < 0.5, out  # Device.run: 2-33 ms


def _loop(chip: int) -> t3.Program:
    p = t3.Program(sync="manual", chip=chip)
    t = p.sbuf((128, 64), np.float32)
    p.memset(dst=t, value=0.0, engine="vector")
    top = len(p)
    p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0, engine="vector")
    p.branch(target=top, engine="vector")
    return p


def test_ultraserver_run_max_seconds_stops_a_loop():
    import time

    us = t3.UltraServer(chips=2)
    t0 = time.monotonic()
    with pytest.raises(t3.RunawayError) as e:
        us.run([_loop(0), _loop(1)], check_races=False, trace=False, max_seconds=0.3)
    took = time.monotonic() - t0
    assert e.value.rule == "run_time_limit" and "max_seconds" in str(e.value)
    assert 0.3 <= took < 2.0, took


def test_ultraserver_run_max_memory_stops_a_loop_backing_hbm_pages():
    us = t3.UltraServer(chips=2)
    mib = 1 << 20
    big = us.chip(1).hbm.alloc((512, mib // 4), np.float32)
    p = t3.Program(sync="manual", chip=1)
    r = p.register_alloc(0, engine="sync")
    g = p.sbuf((1, 32), np.float32)
    top = len(p)
    p.dma_copy(dst=big.ap([[mib // 4, 1], [1, 32]], scalar_offset=r), src=g, engine="sync")
    p.register_op(dst=r, src=r, op="add", imm=1, engine="sync")
    p.branch(target=top, cmp="lt", reg=r, imm=512, engine="sync")
    with pytest.raises(t3.ResourceError) as e:
        us.run(p, trace=False, max_memory=16 * mib)
    assert e.value.rule == "run_memory_limit" and "chip 1" in str(e.value)
    assert us.chip(1).hbm.resident_bytes < 64 * mib


@pytest.mark.parametrize(
    "kw, rule",
    [({"max_seconds": -1}, "int_out_of_range"), ({"max_seconds": "x"}, "seconds_expected"), ({"max_memory": -1}, "int_out_of_range")],
)
def test_ultraserver_run_checks_its_limits(kw, rule):
    us = t3.UltraServer(chips=1)
    with pytest.raises(t3.EmuError) as e:
        us.run(t3.Program(), **kw)
    assert e.value.rule == rule
