"""Which compiler passes a kernel's trace runs (docs/nki.md, "Passes"; the passes read the kernel
IR, `ir.py`, that tracing records, `record.py`): one switch per pass,
`nki.jit(passes={"liveness": ..., "spill": ...})` per kernel or `TRN3EMU_NKI_PASSES` in the
environment (comma-separated `name=value`, e.g. `liveness=off,spill=off`); the kernel's option
wins. `TRN3EMU_NKI_PASSES=literal` (or `nki.jit(passes="literal")`) switches every pass off: the
program is the kernel's source taken literally.

- `liveness`: "auto" (default: the literal trace first; when it does not fit on chip, or when
  `value_reuse` "on" missed repeats whose earlier results the literal allocation overwrote,
  traced again with tiles freed at their last use), "on" (always), "off" (tiles freed when
  Python drops them).
- `spill`: "on" = "furthest" (default for the legacy `neuronxcc.nki` dialect: the compiler
  spills SBUF to HBM; the tile whose next use is furthest goes first), "lru" (the tile least
  recently used goes first), "off"; the NKI 0.6 dialect defaults to "off" (the new compiler
  preserves the developer's allocation choices: a kernel that does not fit is an error).
- `reduce_init`: "on" (default): `nl.loop_reduce`, and a legacy kernel's `psum += nc_matmul`,
  into a tile no instruction wrote starts from its first value; "off": it reads the tile as it
  is (the matmul: an error).
- `engine_choice`: "on" (default, both dialects): tensor_copy / single-op tensor_scalar left
  without an engine are spread over VectorE / ScalarE / GpSimd (`engine_choice.py`; float
  tensor_tensor stays on VectorE); "off": the ISA's default engine. It runs over the kernel IR
  when one is recorded (decisions in `Call.notes`), else while appending (the same program).
- `value_reuse` (`value_reuse.py`): an instruction repeating an earlier one exactly (same
  encoding) on bytes nothing wrote in between is dropped; "on" also drops a repeat whose result
  goes to another SBUF tile, its reads moved to the earlier result; "exact" only the first kind;
  "dialect" (default: "on" for the legacy dialect, "off" for NKI 0.6), "off".
- `psum_forward` (`psum_forward.py`): "on" (default, both dialects): a partition broadcast's copy
  from PSUM to SBUF is dropped when its readers can read the PSUM result; "off".
- `zero_fill` (`zero_fill.py`): "dialect" (default: on for the legacy dialect, off for NKI 0.6),
  "on", "off": `nl.zeros` of a PSUM tile that an accumulating matmul then writes whole issues no
  memset; the first matmul overwrites (a memset-initialised accumulation is undefined on v2/v3).
- `dead_code` (`dead_code.py`): "off" (default, both dialects: the docs make it a CompileConfig
  option), "on": an instruction whose SBUF / PSUM result no later instruction reads (overwritten
  whole first, or unread at the program's end) is removed; "unused" only those nothing reads or
  overwrites again, "overwritten" only those overwritten whole before any read.
- `copy_forward` (`copy_forward.py`): "off" (default, both dialects), "on": a same-dtype
  `tensor_copy` whose readers can read its source (unchanged until their reads) is dropped, the
  reads moved to the source.
- `nki.jit(compile_config=CompileConfig(...))` (`compile_config.py`) sets `liveness` (allocation
  LINEAR), `engine_choice` (opt_level O0, engine_balancing), `load_reuse` (dma_copy_elim),
  `dead_code` (dead_code_elim, remove_unused_instructions, remove_overwritten_writes) and
  `copy_forward` (tensor_copy_elim, dead_code_elim) where its options name them.
- `lowering` (how the allocation passes' decisions reach the program when `liveness` runs):
  "walk" (default: the recording trace's instructions are moved to where the passes place
  their tiles, the spill / reload copies inserted; the kernel body runs once, `lowering.py`),
  "retrace" (the body is traced a second time with those placements, `liveness.Placer`; also
  what "walk" falls back to when it cannot move an instruction, the reason in
  `KernelIR.passes["lowering"]`).
- `inplace_assign`, `load_reuse` (the legacy toolchain's rewrites, `toolchain.py`): "dialect"
  (default: on for the legacy dialect, off for NKI 0.6, whose compiler preserves the developer's
  choices), "on", "off"; `load_reuse="dma_copy"`: also a kernel's own `nisa.dma_copy` loads, on the
  IR before allocation (so `liveness` "auto" records and lowers), as `CompileConfig(dma_copy_elim=True)`
  asks.
"""

from __future__ import annotations

import os

from ..errors import OperandError
from . import compile_config

DEFAULTS = {
    "liveness": "auto",
    "spill": "dialect",
    "reduce_init": "on",
    "inplace_assign": "dialect",
    "load_reuse": "dialect",
    "engine_choice": "on",
    "value_reuse": "dialect",
    "psum_forward": "on",
    "zero_fill": "dialect",
    "dead_code": "off",
    "copy_forward": "off",
    "lowering": "walk",
}
VALUES = {
    "liveness": ("auto", "on", "off"),
    "spill": ("on", "furthest", "lru", "off", "dialect"),
    "reduce_init": ("on", "off"),
    "inplace_assign": ("on", "off", "dialect"),
    "load_reuse": ("on", "dma_copy", "off", "dialect"),
    "engine_choice": ("on", "off", "dialect"),
    "value_reuse": ("on", "exact", "off", "dialect"),
    "psum_forward": ("on", "off", "dialect"),
    "zero_fill": ("on", "off", "dialect"),
    "dead_code": ("on", "unused", "overwritten", "off"),
    "copy_forward": ("on", "off"),
    "lowering": ("walk", "retrace"),
}


def _parse(spec, where: str) -> dict:
    if spec is None or spec == "":
        return {}
    if spec == "literal":
        return {name: "off" for name, values in VALUES.items() if "off" in values}
    if isinstance(spec, str):
        items = {}
        for part in spec.split(","):
            name, _, value = part.strip().partition("=")
            items[name.strip()] = value.strip()
        spec = items
    out = {}
    for name, value in dict(spec).items():
        if value is True:
            value = "on"
        elif value is False:
            value = "off"
        if name not in VALUES or value not in VALUES[name]:
            raise OperandError(
                f"{where}: unknown pass setting {name}={value!r} (passes: "
                + "; ".join(f"{n} in {', '.join(v)}" for n, v in VALUES.items())
                + "; or 'literal')",
                operand="passes",
                rule="nki_pass_setting",
            )
        out[name] = value
    return out


def settings(kernel) -> dict:
    """The pass settings of `kernel`: defaults, then TRN3EMU_NKI_PASSES, then what its
    `nki.jit(compile_config=)` asks for (`compile_config.passes_for`), then `nki.jit(passes=)`."""
    out = dict(DEFAULTS)
    out.update(_parse(os.environ.get("TRN3EMU_NKI_PASSES"), "TRN3EMU_NKI_PASSES"))
    out.update(compile_config.passes_for(kernel.options.get("compile_config")))
    out.update(_parse(kernel.options.get("passes"), "nki.jit(passes=)"))
    return out


def legacy_dialect(kernel) -> bool:
    """True for a kernel of the legacy `neuronxcc.nki` dialect: made by its `jit`,
    `simulate_kernel` or `baremetal`, or (through `nki.simulate`) defined in a module that
    imports `neuronxcc`."""
    d = kernel.options.get("dialect")
    if d is not None:
        return d == "legacy"
    fn = getattr(kernel.fn, "__wrapped__", kernel.fn)
    g = getattr(fn, "__globals__", {})
    for v in g.values():
        name = getattr(v, "__name__", "")
        if isinstance(name, str) and name.startswith("neuronxcc"):
            return True
    for cell in getattr(fn, "__closure__", None) or ():  # (a kernel defined where it imports them)
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        name = getattr(v, "__name__", "")
        if (
            isinstance(name, str)
            and name.startswith("neuronxcc")
            or getattr(v, "__module__", "") == __package__ + ".legacy"
        ):
            return True
    return False


def allocation(kernel) -> tuple[str, str | None]:
    """(liveness mode: "auto" / "on" / "literal", the spill rule: "furthest" / "lru" / None)."""
    s = settings(kernel)
    spill = s["spill"]
    if spill == "dialect":
        spill = "on" if legacy_dialect(kernel) else "off"
    mode = {"auto": "auto", "on": "on", "off": "literal"}[s["liveness"]]
    if mode == "auto" and s["load_reuse"] == "dma_copy":
        mode = "on"  # (the kernel's own dma_copy reloads are found on the IR, before allocation)
    if spill == "off" or mode == "literal":
        return mode, None
    return mode, "furthest" if spill == "on" else spill


def lowering(kernel) -> str:
    """How the allocation passes' program is lowered: "walk" or "retrace" (module doc)."""
    return settings(kernel)["lowering"]


def value_reuse(kernel) -> str:
    """The `value_reuse` mode: "on" (repeats dropped, also into another tile), "exact", "off"."""
    v = settings(kernel)["value_reuse"]
    if v == "dialect":
        return "on" if legacy_dialect(kernel) else "off"
    return v


def enabled(kernel, name: str) -> bool:
    """Whether an on/off pass is on for `kernel`: any setting but "off" ("dialect": on for the
    legacy dialect; a wider one such as `load_reuse="dma_copy"` is on)."""
    v = settings(kernel)[name]
    if v == "dialect":
        return legacy_dialect(kernel)
    return v != "off"


def dma_copy_loads(kernel) -> bool:
    """`load_reuse="dma_copy"`: a kernel's own `nisa.dma_copy` loads are reused as `nl.load`s are
    (on the IR, before allocation; `CompileConfig(dma_copy_elim=True)` asks for it)."""
    return settings(kernel)["load_reuse"] == "dma_copy"
