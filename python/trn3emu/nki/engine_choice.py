"""Engine choice for the instructions a kernel leaves unpinned (docs/nki.md, "Engine choice").

`tensor_copy` and single-op `tensor_scalar` without an `engine` - the `nl.*` element-wise ops,
copies and PSUM -> SBUF evacuations the front end emits, and `nki.isa` calls with the default
`engine=unknown` ("let compiler select best engine", NKI API pages) - are spread over VectorE,
ScalarE and GpSimd by the core assembler's balancing rule (`rust/core/src/engine_choice.rs`):
engines that give the same bits, ordered by affinity, least modelled busy time wins. Float
`tensor_tensor` stays on VectorE (the fused Mamba tutorial's trn1 profile).

The pass `engine_choice` (`nki/passes.py`: `nki.jit(passes={"engine_choice": "off"})` or
`TRN3EMU_NKI_PASSES=engine_choice=off`) switches it off: every unpinned instruction on the ISA's
default engine, stores on the scalar queue (the literal program)."""

from __future__ import annotations

import os

from . import passes


def configure(program, kernel) -> None:
    """Set the engine rule of a kernel program's assembler before anything is traced into it;
    balancing uses the costs of the run's timing generation (`TRN3EMU_TIMING`, default trn3)."""
    if passes.enabled(kernel, "engine_choice"):
        program._native.set_engine_balance(os.environ.get("TRN3EMU_TIMING") or "trn3")


def store_engine(program, literal: str):
    """The trigger engine of a front-end store: None (the balancing rule's rule 4: the engine
    that last wrote the source) when the program balances, else `literal` (the fixed queue)."""
    return None if program._native.engine_balance_ps() is not None else literal
