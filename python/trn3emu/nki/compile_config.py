"""`nki.compiler.CompileConfig` and its enumerations (NKI API reference, `nki.compiler`; the
"NKI compile configuration" deep dive and its options reference), and what each option means
for the emulator's passes (`passes.py`; docs/nki.md, "CompileConfig").

`@nki.jit(compile_config=CompileConfig(...))` selects the toolchain's allocation and scheduling
flows and their optimizations. Where an option names something a pass models, it sets that pass
(`passes_for`); the kernel's own `passes=` still wins. The rest are accepted and change nothing:
they act on the compiler's scheduling or on layouts the emulator does not model, and are listed
in the docs. Plain data: this module imports nothing of the package but its errors.
"""

from __future__ import annotations

import dataclasses
import enum

from ..errors import OperandError


class Allocation(enum.Enum):
    """How the tiles get their addresses: graph coloring after tracing (the current flow), or
    linear scan before the rest of compilation (an address from a tile's first write to its last
    read)."""

    COLORING = "coloring"
    LINEAR = "linear"


class AddressRotation(enum.Enum):
    """Which tensors the compiler may move to another address after allocation."""

    AUTO = "auto"
    ENABLE = "enable"
    DISABLE = "disable"


class AllocationMode(enum.Enum):
    """How the linear-scan allocation picks an address for a tile."""

    RING = "ring"
    FAST = "fast"
    MAX_REUSE = "max_reuse"


class SchedulingHeuristic(enum.Enum):
    """Which ready instruction the new scheduling picks next."""

    ASAP = "asap"
    CRITICAL_PATH = "critical_path"
    DMA_PREFETCH = "dma_prefetch"
    TRIVIAL = "trivial"


class OptLevel(enum.Enum):
    """How many optimizations the new flow applies."""

    O0 = 0
    O1 = 1
    O2 = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompileConfig:
    """Per-kernel compile configuration for `nki.jit(compile_config=...)`; every option is
    keyword-only and None (the default) leaves it to the toolchain."""

    allocation: Allocation | None = None
    scheduling: bool | None = None
    opt_level: OptLevel | None = None
    address_rotation: AddressRotation | None = None
    engine_balancing: bool | None = None
    dma_copy_elim: bool | None = None
    tensor_copy_elim: bool | None = None
    dead_code_elim: bool | None = None
    element_widening: bool | None = None
    prefetch_auto: bool | None = None
    split_reused_buffers: bool | None = None
    register_load_reuse: bool | None = None
    remove_unused_instructions: bool | None = None
    remove_overwritten_writes: bool | None = None
    non_ssa_legalization: bool | None = None
    nki_alloc_fallback: bool | None = None
    sbuf_allocation_fallback: bool | None = None
    barrier_check: bool | None = None
    experimental_allocation_mode: AllocationMode | None = None
    experimental_sbuf_allocation_mode: AllocationMode | None = None
    experimental_psum_allocation_mode: AllocationMode | None = None
    experimental_hbm_allocation_mode: AllocationMode | None = None
    experimental_scheduling_heuristic: SchedulingHeuristic | None = None


class SpecializationConfig:
    """Per-kernel specialization options for `nki.jit(specialization_config=...)`: accepted, no
    effect on the emulator (its trace is its specialization)."""

    def __init__(self, **options) -> None:
        self.options = options

    def __repr__(self) -> str:
        return f"SpecializationConfig({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"


#: the enum each enum-valued option takes (the others take a bool)
_ENUMS = {
    "allocation": Allocation,
    "opt_level": OptLevel,
    "address_rotation": AddressRotation,
    "experimental_allocation_mode": AllocationMode,
    "experimental_sbuf_allocation_mode": AllocationMode,
    "experimental_psum_allocation_mode": AllocationMode,
    "experimental_hbm_allocation_mode": AllocationMode,
    "experimental_scheduling_heuristic": SchedulingHeuristic,
}


def check(config) -> None:
    """A `compile_config=` that is not a CompileConfig of valid values raises OperandError."""
    if config is None:
        return
    if not isinstance(config, CompileConfig):
        raise OperandError(
            f"nki.jit(compile_config=...) takes an nki.compiler.CompileConfig, not {type(config).__name__}",
            operand="compile_config",
            rule="nki_compile_config",
        )
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        want = _ENUMS.get(f.name, bool)
        if v is not None and not isinstance(v, want):
            raise OperandError(
                f"CompileConfig.{f.name} takes {'a bool' if want is bool else 'an nki.compiler.' + want.__name__}"
                f" or None, not {v!r}",
                operand="compile_config",
                rule="nki_compile_config",
            )


def passes_for(config) -> dict:
    """The pass settings `config` asks for (`passes.py` names and values); {} for None."""
    if config is None:
        return {}
    out = {}
    if config.allocation is Allocation.LINEAR:
        out["liveness"] = "on"  # (an address from the first write to the last read)
    if config.opt_level is OptLevel.O0 or config.engine_balancing is False:
        out["engine_choice"] = "off"  # (every instruction on its default engine)
    elif config.engine_balancing:
        out["engine_choice"] = "on"
    o2 = config.opt_level is OptLevel.O2 and config.allocation is Allocation.LINEAR
    if config.dma_copy_elim or (o2 and config.dma_copy_elim is None):
        # (a reload of what an earlier dma_copy loaded reads that tile; O2 turns it on in the
        # new flow: "O1, plus ... prefetch_auto, dma_copy_elim and element_widening")
        out["load_reuse"] = "dma_copy"
    elif config.dma_copy_elim is False:
        out["load_reuse"] = "off"
    dead = _dead_code(config)
    if dead is not None:
        out["dead_code"] = dead
    copies = config.tensor_copy_elim
    if copies is None:
        copies = config.dead_code_elim  # (its second half: copies whose readers read the source)
    if copies is not None:
        out["copy_forward"] = "on" if copies else "off"
    return out


def _dead_code(config) -> str | None:
    """The `dead_code` setting of `config`'s dead-code options, or None when it names none:
    `dead_code_elim` removes both kinds of dead instruction, `remove_unused_instructions` those
    whose result nothing reads, `remove_overwritten_writes` those overwritten before any read
    (a False one takes its kind away)."""
    flags = (config.dead_code_elim, config.remove_unused_instructions, config.remove_overwritten_writes)
    if all(f is None for f in flags):
        return None
    kinds = {"unused", "overwritten"} if config.dead_code_elim else set()
    for kind, flag in (("unused", flags[1]), ("overwritten", flags[2])):
        if flag:
            kinds.add(kind)
        elif flag is False:
            kinds.discard(kind)
    if len(kinds) == 2:
        return "on"
    return kinds.pop() if kinds else "off"
