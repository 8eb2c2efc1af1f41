"""Ctrl-C and progress bars, for real: a child process is sent SIGINT during a long
`Device.run` and during the NKI tracing of a big kernel (20 times each) and must raise
KeyboardInterrupt within 0.5 s, never swallow it, and leave the device usable; long runs and
traces show a tqdm bar on a pseudo-terminal, and none with progress=False or without a terminal.
"""

import concurrent.futures
import fcntl
import os
import pty
import queue
import random
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time

import pytest
import tqdm

REPS = 20
#: Ctrl-C must take effect within this (the issue asks 0.2 s; margin for a loaded 2-core VM).
LATENCY_S = 0.5

CHILD_COMMON = """
import sys, time
import numpy as np
import trn3emu as t3
import trn3emu.nki as nki
import trn3emu.nki.isa as nisa
import trn3emu.nki.language as nl


def long_loop(iterations):
    # One program that runs for seconds: a vector-engine loop of [128, 64] adds.
    p = t3.Program(sync="manual")
    t = p.sbuf((128, 64), np.float32)
    p.memset(dst=t, value=0.0, engine="vector")
    i = p.register_alloc(0, engine="vector")
    top = len(p)
    p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0, engine="vector")
    p.register_op(dst=i, src=i, op="add", imm=1, engine="vector")
    p.branch(target=top, cmp="lt", reg=i, imm=iterations, engine="vector")
    return p


def small_check(dev, seed):
    # A small program on `dev`, against numpy: y = x * 3 + 1.
    x = np.random.default_rng(seed).standard_normal((128, 32)).astype(np.float32)
    hx = dev.hbm.put(x)
    hy = dev.hbm.alloc((128, 32), np.float32)
    p = t3.Program()
    t = p.sbuf((128, 32), np.float32)
    p.dma_copy(dst=t, src=hx)
    p.tensor_scalar(dst=t, data=t, op0="multiply", operand0=3.0, op1="add", operand1=1.0, engine="vector")
    p.dma_copy(dst=hy, src=t)
    dev.run(p)
    np.testing.assert_array_equal(dev.hbm.get(hy), x * np.float32(3) + np.float32(1))


@nki.jit
def chain(x, n):
    # n dependent adds, each into a new tile (tiles die and are freed all along the trace).
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    for _ in range(n):
        u = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=u, data=t, op0=nl.add, operand0=1.0)
        t = u
    nisa.dma_copy(dst=out, src=t)
    return out
"""

INTERRUPT_CHILD = """
import signal
# A suite started in the background of a non-interactive shell ignores SIGINT and a child inherits
# that (Python then installs no handler): install Python's own, as an interactive run has it.
signal.signal(signal.SIGINT, signal.default_int_handler)
mode, reps = sys.argv[1], int(sys.argv[2])
dev = t3.Device()
big = long_loop(5_000_000)  # ~10 s if it ran to the end
x_big = np.zeros((128, 4), np.float32)
for rep in range(reps):
    print("go", rep, flush=True)
    try:
        if mode == "run":
            dev.run(big, check_races=False, trace=False)
        else:
            chain(x_big, 200_000)  # ~15 s of tracing if it ran to the end
        print("completed", rep, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        print("caught", rep, repr(time.monotonic()), flush=True)
    if mode == "run":
        small_check(dev, rep)
    else:
        x = np.random.default_rng(rep).standard_normal((128, 4)).astype(np.float32)
        np.testing.assert_array_equal(chain(x, 3), x + np.float32(1) + np.float32(1) + np.float32(1))
    print("ok", rep, flush=True)
print("done", flush=True)
"""


def _child(script: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(CHILD_COMMON) + textwrap.dedent(script)]


class _Lines:
    """The child's stdout lines, read by a thread (a buffered pipe and select() do not mix)."""

    def __init__(self, proc) -> None:
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True).start()

    def _pump(self, f) -> None:
        for line in f:
            self.q.put(line.strip())
        self.q.put("<eof>")

    def next(self, timeout: float) -> str:
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child silent for {timeout} s") from None


@pytest.mark.parametrize("mode", ["run", "trace"])
def test_sigint_raises_keyboard_interrupt_promptly_and_never_is_swallowed(mode):
    env = dict(os.environ, TRN3EMU_PROGRESS="0")
    proc = subprocess.Popen(
        _child(INTERRUPT_CHILD) + [mode, str(REPS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        env=env,
    )
    lines = _Lines(proc)
    delays = random.Random(16)
    latencies = []
    try:
        for rep in range(REPS):
            assert lines.next(60) == f"go {rep}"
            # Land anywhere in the first part of the run / trace (tracing: tiles being freed).
            time.sleep(delays.uniform(0.1, 0.6))
            sent = time.monotonic()
            proc.send_signal(signal.SIGINT)
            line = lines.next(30)
            assert line.startswith(f"caught {rep} "), f"rep {rep}: {line!r} (the interrupt was swallowed)"
            latencies.append(float(line.split()[2]) - sent)
            assert lines.next(60) == f"ok {rep}"
        assert lines.next(60) == "done"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    proc.stderr.close()
    proc.stdout.close()
    assert "Exception ignored" not in err and "Traceback" not in err, err
    assert max(latencies) < LATENCY_S, sorted(latencies)


PROGRESS_CHILD = """
progress = {"default": None, "off": False}[sys.argv[1]]
SECONDS = 6.0  # each of the run and the trace: well over the 2 s after which a bar appears (3x:
# the work is sized from a short timing, and a shared machine can run faster later)


def adds(n):
    # straight-line work (its total is known): [128, 2048] adds
    p = t3.Program(sync="manual")
    t = p.sbuf((128, 2048), np.float32)
    p.memset(dst=t, value=0.0, engine="vector")
    for _ in range(n):
        p.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0, engine="vector")
    return p, t


def timed(f):
    t0 = time.monotonic()
    f()
    return time.monotonic() - t0


# Size the work for this machine (the bar must have a chance to appear).
dev = t3.Device()
small, _ = adds(2000)
run_n = int(2000 * SECONDS / timed(lambda: dev.run(small, check_races=False, trace=False, progress=False)))
x = np.zeros((128, 4), np.float32)
quiet = nki.jit(chain.fn, progress=False)
trace_n = int(5000 * SECONDS / timed(lambda: quiet(x, 5000)))
print("sizes", run_n, trace_n, flush=True)
p, t = adds(run_n)
res = dev.run(p, check_races=False, trace=False, progress=progress)
assert res.executed == run_n + 1
assert float(dev.read(t)[0, 0]) == float(run_n)
kernel = nki.jit(chain.fn, progress=progress) if progress is not None else chain
assert float(kernel(x, trace_n)[0, 0]) == float(trace_n)
print("finished", flush=True)
"""


def _under_pty(args: list[str], env: dict) -> str:
    """Run `args` with stdin, stdout and stderr on a pseudo-terminal; its output."""
    master, slave = pty.openpty()
    # A new pseudo-terminal is 0 x 0; a real one has a size (tqdm fits its bar to the width).
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        assert proc.wait(120) == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def _env() -> dict:
    env = dict(os.environ)
    env.pop("TRN3EMU_PROGRESS", None)
    return env


def _run_bar(out: str) -> bool:
    return "run: " in out and "instr" in out


def _twice(check) -> None:
    """Timing-dependent checks on a shared VM: a second attempt before failing."""
    try:
        check()
    except AssertionError:
        check()


def test_progress_bars_on_a_terminal():
    _twice(_check_progress_bars)


def _check_progress_bars():
    out = _under_pty(_child(PROGRESS_CHILD) + ["default"], _env())
    assert "finished" in out, out
    lines = out.replace("\r", "\n").splitlines()
    sizes = next(ln for ln in lines if ln.startswith("sizes ")).split()
    total = tqdm.tqdm.format_sizeof(int(sizes[1]) + 1)  # the adds and the memset, as tqdm writes it
    # The run's bar: done / total, the emulated time; it ends at 100 %.
    run_lines = [ln for ln in lines if ln.startswith("run: ")]
    assert run_lines, out
    assert any(f"/{total} [" in ln and "emulated" in ln for ln in run_lines), run_lines
    # (the traced kernel's own device run may draw a second "run:" bar after it)
    assert any("100%" in ln and f"{total}/{total}" in ln for ln in run_lines), run_lines
    # The trace's bar: instructions traced so far (no total).
    trace_lines = [ln for ln in lines if ln.startswith("tracing chain: ")]
    assert trace_lines and "instr" in trace_lines[-1], out


def _piped(args: list[str], env: dict) -> str:
    """Run `args` with stdout and stderr on pipes (not a terminal); its stdout and stderr."""
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def test_no_progress_bars_when_off_or_not_a_terminal():
    _twice(_check_no_progress_bars)


def _check_no_progress_bars():
    args = _child(PROGRESS_CHILD) + ["default"]
    off = _child(PROGRESS_CHILD) + ["off"]
    quiet = dict(_env(), TRN3EMU_PROGRESS="0")
    # progress=False (Device.run and the kernel option) and the environment switch, on a
    # terminal; the defaults without a terminal. The three children run side by side.
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        outs = [
            ex.submit(_under_pty, off, _env()),
            ex.submit(_under_pty, args, quiet),
            ex.submit(_piped, args, _env()),
        ]
        outs = [f.result() for f in outs]
    for out in outs:
        assert "finished" in out and not _run_bar(out) and "tracing" not in out, out


def test_the_step_limit_is_settable_and_a_runaway_leaves_the_device_usable():
    import numpy as np
    import trn3emu as t3

    dev = t3.Device()
    assert dev.max_executed == 2**26
    dev.max_executed = 1000
    p = t3.Program(sync="manual")
    p.nop(engine="gpsimd")
    p.branch(target=0, engine="gpsimd")
    with pytest.raises(t3.RunawayError) as e:
        dev.run(p)
    assert e.value.rule == "runaway_loop"
    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    hx = dev.hbm.put(x)
    q = t3.Program()
    t = q.sbuf((128, 8), np.float32)
    q.dma_copy(dst=t, src=hx)
    q.tensor_scalar(dst=t, data=t, op0="multiply", operand0=2.0, engine="vector")
    q.dma_copy(dst=hx, src=t)
    dev.run(q)
    np.testing.assert_array_equal(dev.hbm.get(hx), x * 2)


def test_the_default_asks_whether_a_bar_is_wanted_only_when_the_run_lasts(monkeypatch):
    """progress=None decides (environment, isatty) only once a run has lasted DELAY_S: a short
    run never asks; a long one asks once, and shows no bar when the answer is no."""
    import numpy as np
    import trn3emu as t3
    from trn3emu import progress

    calls = []
    monkeypatch.setattr(progress, "wanted", lambda p: calls.append(p) or False)
    dev = t3.Device()
    p = t3.Program(sync="manual")
    t = p.sbuf((128, 4), np.float32)
    p.memset(dst=t, value=3.0, engine="vector")
    for _ in range(50):
        dev.run(p)
    np.testing.assert_array_equal(dev.read(t), np.full((128, 4), 3.0, np.float32))
    assert calls == []
    bar = progress.RunProgress(auto=True)
    bar(1, 10, 0)  # before DELAY_S: nothing asked, nothing shown
    assert calls == [] and bar.bar is None
    bar.start -= progress.DELAY_S
    for done in range(2, 6):
        bar(done, 10, 1000)
    bar.finish(10, 2000)
    assert calls == [None] and bar.bar is None
