"""The legacy toolchain's rewrites asked about while tracing: whether the kernel being traced runs
pass `inplace_assign` / `load_reuse` (switches and defaults: `passes.py`; docs/nki.md, "Passes").
The answer is worked out once per program's trace (it is asked for every value-returning call)."""

from __future__ import annotations

from . import passes
from ._kernel import tracing

NAMES = ("inplace_assign", "load_reuse", "zero_fill")


def enabled(name: str, ctx=None) -> bool:
    """Whether the kernel being traced applies pass `name` (False outside a trace); `ctx`: its
    trace context, when the caller has it."""
    if ctx is None:
        ctx = tracing()
        if ctx is None:
            return False
    on = ctx.__dict__.get("_toolchain_passes")
    if on is None:
        kernel = ctx.launch.kernel
        on = ctx._toolchain_passes = frozenset(n for n in NAMES if passes.enabled(kernel, n))
    return name in on
