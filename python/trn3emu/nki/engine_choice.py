"""Engine choice for the instructions a kernel leaves unpinned (docs/nki.md, "Engine choice").

`tensor_copy`, `tensor_scalar` and `tensor_tensor` without an `engine` - the `nl.*` element-wise
ops, copies and PSUM -> SBUF evacuations the front end emits, and `nki.isa` calls with the default
`engine=unknown` ("let compiler select best engine", NKI API pages) - are spread over VectorE,
ScalarE and GpSimd by the core assembler's balancing rule (`rust/core/src/engine_choice.rs`):
engines that give the same bits, ordered by affinity, least modelled busy time wins.

Switch: `nki.jit(engine_choice=...)` or `TRN3EMU_NKI_ENGINE_CHOICE`: `"balance"` (default) or
`"isa"` (the ISA's fixed default engine, VectorE for almost everything: the literal program)."""

from __future__ import annotations

import os

from ..errors import OperandError

#: environment variable selecting the rule when the kernel's `engine_choice=` option is not given
ENV = "TRN3EMU_NKI_ENGINE_CHOICE"
MODES = ("balance", "isa")


def mode(options: dict) -> str:
    """The rule a kernel launch uses: its `engine_choice=` option, else the environment, else balance."""
    m = options.get("engine_choice") or os.environ.get(ENV) or "balance"
    if m not in MODES:
        raise OperandError(
            f"engine_choice={m!r}: expected one of {', '.join(MODES)} (nki.jit option or {ENV})",
            rule="unknown_engine_choice",
        )
    return m


def configure(program, options: dict) -> None:
    """Set the engine rule of a kernel program's assembler before anything is traced into it;
    balancing uses the costs of the run's timing generation (`TRN3EMU_TIMING`, default trn3)."""
    if mode(options) == "balance":
        program._native.set_engine_balance(os.environ.get("TRN3EMU_TIMING") or "trn3")


def store_engine(program, literal: str):
    """The trigger engine of a front-end store: None (the balancing rule's rule 4: the engine
    that last wrote the source) when the program balances, else `literal` (the fixed queue)."""
    return None if program._native.engine_balance_ps() is not None else literal
