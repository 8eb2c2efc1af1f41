"""Engine choice for the instructions a kernel leaves unpinned (docs/nki.md, "Engine choice").

`tensor_copy` and single-op `tensor_scalar` without an `engine` - the `nl.*` element-wise ops,
copies and PSUM -> SBUF evacuations the front end emits, and `nki.isa` calls with the default
`engine=unknown` ("let compiler select best engine", NKI API pages) - are spread over VectorE,
ScalarE and GpSimd by the core's balancing rule (`rust/core/src/engine_choice.rs`): engines that
give the same bits, ordered by affinity, least modelled busy time wins; front-end stores are
triggered by the engine that last wrote their source. Float `tensor_tensor` stays on VectorE (the
fused Mamba tutorial's trn1 profile).

Two ways to run the same rule (it reads only the instructions before each one, so both give the
same program, `tests/test_nki_engine_choice.py`):

- a pass over the kernel IR, when the trace records it (`nki.jit(ir=True)`, `TRN3EMU_NKI_IR=1`,
  the lowering trace of the liveness pass): the program is traced with every unpinned instruction
  on its ISA default engine; `run` then replays the rule over the finished program
  (`Program.engine_choices`), writes each decision into the IR (`Call.notes["engine_choice"]`:
  ((instruction index, engine), ...) on the call that issued it, and a line in
  `KernelIR.passes`), and lowers: `lower` gives each instruction the engine its call's note names;
- fused into the append (`Program.set_engine_balance`), when no IR is recorded: recording costs
  about as much as tracing itself (docs/nki.md, "The kernel IR"), so the default trace decides
  each engine as the instruction is appended, with the same rule.

The pass `engine_choice` (`nki/passes.py`: `nki.jit(passes={"engine_choice": "off"})` or
`TRN3EMU_NKI_PASSES=engine_choice=off`) switches both off: every unpinned instruction on the ISA's
default engine, stores on the scalar queue (the literal program)."""

from __future__ import annotations

import os
from bisect import bisect_right

from . import passes

#: engine names as the dump shows them
_ENGINE_NAMES = {"vector": "VectorE", "scalar": "ScalarE", "gpsimd": "GpSimd", "act": "ScalarE", "pool": "GpSimd"}


def configure(ctx) -> None:
    """Set the engine rule of `ctx.program` (a kernel program, or a device loop's next segment)
    before anything is traced into it: the pass over the IR when the trace records one (`run`
    decides after tracing), else the assembler's balancing while appending; balancing uses the
    costs of the run's timing generation (`TRN3EMU_TIMING`, default trn3)."""
    program = ctx.program
    if not passes.enabled(ctx.launch.kernel, "engine_choice"):
        return
    timing = os.environ.get("TRN3EMU_TIMING") or "trn3"
    ir = ctx.ir
    if ir is not None and ir.mode in ("record", "emit"):
        program.engine_pass = timing
    else:
        program._native.set_engine_balance(timing)


def store_engine(program, literal: str):
    """The trigger engine of a front-end store: None (the balancing rule's rule 4: the engine
    that last wrote the source) when the program balances, else `literal` (the fixed queue)."""
    if program.engine_pass is not None or program._native.engine_balance_ps() is not None:
        return None
    return literal


def run(ctx) -> None:
    """The pass over the kernel IR for the program `ctx.program` (the calls of the IR's current
    segment): decide the engine of every instruction appended without one, write the decisions
    into the IR, then lower them into the program (`lower`). Nothing when the program balances
    while appending or the pass is off."""
    program = ctx.program
    timing = program.engine_pass
    rec = ctx.ir
    if timing is None or rec is None:
        return
    ir = rec.ir
    segment = getattr(rec, "segment", 0)
    calls = [c for c in ir.calls if c.segment == segment and c.instr >= 0]
    starts = [c.instr for c in calls]
    native = program._native
    decided: dict[int, list] = {}
    loose = []  # (instructions before the segment's first call: none in practice)
    for index, engine in native.engine_choices(timing):
        k = bisect_right(starts, index) - 1
        if k < 0:
            loose.append((index, engine))
        else:
            decided.setdefault(k, []).append((index, engine))
    counts: dict[str, int] = {}
    moved = 0
    for k, pairs in decided.items():
        calls[k].notes["engine_choice"] = tuple(pairs)
        for index, engine in pairs:
            counts[engine] = counts.get(engine, 0) + 1
            moved += native.instruction_engine(index) != engine
    for index, engine in loose:
        counts[engine] = counts.get(engine, 0) + 1
        moved += native.instruction_engine(index) != engine
    total = sum(counts.values())
    if total:
        spread = ", ".join(f"{_ENGINE_NAMES.get(e, e)} {n}" for e, n in sorted(counts.items(), key=lambda x: -x[1]))
        seg = f" (segment {segment})" if segment else ""
        line = f"{total} unpinned instructions{seg}: {spread}; {moved} off their ISA default engine"
        prev = ir.passes.get("engine_choice")
        ir.passes["engine_choice"] = line if prev is None else f"{prev}; {line}"
    lower(ir, program, segment)
    for index, engine in loose:
        native.set_engine(index, engine)


def lower(ir, program, segment: int = 0) -> None:
    """Give each instruction of `program` (segment `segment` of the IR) the engine its call's
    `engine_choice` note names."""
    native = program._native
    for c in ir.calls:
        if c.segment != segment:
            continue
        pairs = c.notes.get("engine_choice")
        if pairs:
            for index, engine in pairs:
                native.set_engine(index, engine)
