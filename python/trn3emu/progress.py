"""Progress bars (tqdm) for long device runs and long NKI traces.

A bar appears only once the work has lasted `DELAY_S` seconds, and only when it is wanted:
`progress=True` / `False` decide; `progress=None` (the default) follows the `TRN3EMU_PROGRESS`
environment variable ("0" off, "1" on) and otherwise shows bars when stderr is a terminal.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

#: A bar appears once a run or trace has lasted this long (seconds).
DELAY_S = 2.0
#: Environment variable: "0" turns bars off, "1" on (even when stderr is not a terminal).
ENV = "TRN3EMU_PROGRESS"
_OFF = ("0", "false", "off", "no")
_ON = ("1", "true", "on", "yes")


def wanted(progress: bool | None) -> bool:
    """Whether a run or trace should show a bar (once it lasts `DELAY_S`)."""
    if progress is not None:
        return bool(progress)
    env = os.environ.get(ENV, "").strip().lower()
    if env in _OFF:
        return False
    if env in _ON:
        return True
    err = sys.stderr
    try:
        return err is not None and err.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def format_ps(ps: int) -> str:
    """Emulated time in the unit that reads best (ns, µs, ms, s)."""
    for unit, scale in (("s", 10**12), ("ms", 10**9), ("µs", 10**6)):
        if ps >= scale:
            return f"{ps / scale:.3g} {unit}"
    return f"{ps / 1000:.3g} ns"


class _Bar:
    """A tqdm bar made only when the work has lasted `DELAY_S` (short work costs no bar)."""

    def __init__(self, desc: str, unit: str, auto: bool = False) -> None:
        self.desc, self.unit = desc, unit
        self.start = time.monotonic()
        self.bar: Any = None
        #: `auto` (`progress=None`): `wanted(None)` is asked only when the bar would appear, so
        #: short work never asks (an environment lookup and an `isatty` system call: 3-9 µs of a
        #: 20 µs one-instruction run on a KVM host); `off` once it said no.
        self.ask, self.off = auto, False

    def _show(self, done: int, total: int | None, postfix: str | None) -> None:
        if self.bar is None:
            if self.off or time.monotonic() - self.start < DELAY_S:
                return
            if self.ask:
                self.ask = False
                if not wanted(None):
                    self.off = True
                    return
            from tqdm import tqdm

            # The bar counts from the work's start, not from when it appears: elapsed includes the
            # first DELAY_S, the work done so far is an update (not `initial`, which tqdm leaves out
            # of the rate), and the rate is the average since the start (smoothing=0), so the ETA
            # is right from the first refresh.
            self.bar = tqdm(total=total, desc=self.desc, unit=self.unit, unit_scale=True, smoothing=0, file=sys.stderr)
            ago = time.monotonic() - self.start
            self.bar.start_t -= ago
            self.bar.last_print_t -= ago
        if total is not None and self.bar.total != total:
            self.bar.total = total
        if postfix is not None:
            self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class RunProgress(_Bar):
    """The bar of one `Device.run`: instructions and transfers done of the total, emulated time.
    The native run calls it (every 25 ms) with the core's counts."""

    def __init__(self, desc: str = "run", auto: bool = False) -> None:
        super().__init__(desc, "instr", auto)

    def __call__(self, executed: int, total: int | None, emulated_ps: int) -> None:
        self._show(executed, total, f"emulated {format_ps(emulated_ps)}")

    def finish(self, executed: int, end_ps: int) -> None:
        """Show the final counts (if the bar is up) and close it."""
        if self.bar is not None:
            self._show(executed, None, f"emulated {format_ps(end_ps)}")
        self.close()


class TraceProgress(_Bar):
    """The bar of one NKI trace: instructions traced so far (the total is not known)."""

    #: Instructions between two looks at the clock.
    EVERY = 256

    def __init__(self, desc: str = "tracing") -> None:
        super().__init__(desc, "instr")
        self.n = 0

    def tick(self) -> None:
        """One more instruction traced."""
        self.n += 1
        if not self.n % self.EVERY:
            self._show(self.n, None, None)

    def finish(self) -> None:
        if self.bar is not None:
            self._show(self.n, None, None)
        self.close()
