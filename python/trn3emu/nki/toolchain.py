"""Which of the NKI toolchain's transformations a kernel's trace applies (docs/nki.md, "Compiler
passes").

The emulator runs a kernel's source; the hardware runs what the NKI toolchain made of it. The
legacy `neuronxcc` compiler rewrote a kernel's program (it wrote `t[...] = op(...)` in place, it
loaded loop-invariant data once); NKI 0.6's compiler "preserves the developer's choices". So each
pass is on by default for legacy-dialect kernels only, and any pass can be switched off (or on)
to see the literal program:

- `nki.jit(passes=...)` per kernel: `"literal"` (or `False`, `()`) none, `"all"` (or `True`)
  every pass, a list of pass names exactly those, a dict `{name: bool}` changes the default;
- `TRN3EMU_NKI_PASSES` per process (part of the trace cache's key), when the kernel gives no
  `passes=`: `literal`, `all`, or a comma-separated list where `name` / `+name` turns a pass on
  and `-name` off (relative to the default; a list of plain names only turns those on).
"""

from __future__ import annotations

import os
import types

from ..errors import ArgumentTypeError
from ._kernel import tracing

#: pass name -> what it does (each documented in docs/nki.md, "Compiler passes")
PASSES = {
    "inplace_assign": "`t[...] = op(...)` writes t itself (no temporary tile plus copy) where that is exact",
    "load_reuse": "a reload of HBM bytes unchanged since a load whose tile is still in SBUF reads that tile",
}

ENV = "TRN3EMU_NKI_PASSES"

#: kernel options naming the dialect (set by the `neuronxcc.nki` entry points)
LEGACY, NKI = "legacy", "nki"


def dialect(kernel) -> str:
    """ "legacy" for a `neuronxcc.nki` kernel, else "nki": the kernel's `dialect=` option (the
    legacy entry points set it), else what the kernel's function refers to (a module or
    function of the legacy dialect among its globals or closure)."""
    d = kernel.options.get("dialect")
    if d is None:
        d = kernel.__dict__.get("_dialect")
        if d is None:
            d = kernel._dialect = _guess_dialect(getattr(kernel, "fn", None))
    return d


def _legacy_object(v) -> bool:
    if isinstance(v, types.ModuleType):
        return v.__name__.startswith("neuronxcc")
    return getattr(v, "__module__", None) == "trn3emu.nki.legacy" and callable(v)


def _guess_dialect(fn) -> str:
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return NKI
    names = set(code.co_names)
    g = getattr(fn, "__globals__", {})
    if any(_legacy_object(g.get(n)) for n in names):
        return LEGACY
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            if _legacy_object(cell.cell_contents):
                return LEGACY
        except ValueError:  # an empty cell
            continue
    return NKI


def _parse(spec, default: set, where: str) -> set:
    if spec is None:
        return default
    if spec is True or spec == "all":
        return set(PASSES)
    if spec is False or spec == "literal" or spec == "none" or spec == "":
        return set()
    if isinstance(spec, dict):
        on = set(default)
        for k, v in spec.items():
            _check(k, where)
            (on.add if v else on.discard)(k)
        return on
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
        if any(s[0] in "+-" for s in items):
            on = set(default)
            for s in items:
                name = s.lstrip("+-")
                _check(name, where)
                (on.discard if s[0] == "-" else on.add)(name)
            return on
        spec = items
    try:
        names = list(spec)
    except TypeError:
        raise ArgumentTypeError(
            f"{where}={spec!r}: passes are 'literal', 'all', a list of names or a dict",
            operand="passes",
            rule="nki_passes_form",
        ) from None
    for n in names:
        _check(n, where)
    return set(names)


def _check(name, where: str) -> None:
    if name not in PASSES:
        raise ArgumentTypeError(
            f"{where}: no compiler pass {name!r} (passes: {', '.join(PASSES)})",
            operand="passes",
            rule="nki_unknown_pass",
        )


def passes_for(kernel) -> frozenset:
    """The passes a trace of `kernel` applies (its option, else the environment, else the
    dialect's default), worked out once per kernel and environment value."""
    env = os.environ.get(ENV)
    cached = kernel.__dict__.get("_passes")
    if cached is not None and cached[0] == env:
        return cached[1]
    default = set(PASSES) if dialect(kernel) == LEGACY else set()
    opt = kernel.options.get("passes")
    on = _parse(opt, default, "nki.jit(passes)") if opt is not None else _parse(env, default, ENV)
    out = frozenset(on)
    kernel._passes = (env, out)
    return out


def enabled(name: str) -> bool:
    """Whether the kernel being traced applies pass `name` (False outside a trace)."""
    ctx = tracing()
    if ctx is None:
        return False
    on = ctx.__dict__.get("_passes")
    if on is None:
        on = ctx._passes = passes_for(ctx.launch.kernel)
    return name in on
