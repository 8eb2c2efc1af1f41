"""NKI 0.8.0 standalone and multi-rank entry points: `nki.execute`, `nki.multi_rank_simulate`,
`nki.multi_rank_execute`.

On the emulator there is no NEFF and no Neuron runtime: `execute(kernel, *args, **kwargs)` traces
and runs the kernel on the emulated device exactly as `nki.simulate(kernel)(*args, **kwargs)` does,
and the multi-rank forms run one rank per logical core of an emulated UltraServer (`spmd.py`: rank
r on core r, or cores 2r, 2r+1 for `kernel[2]`; chip = core // 8), all ranks in one run, so
`nki.collectives` between ranks execute on the emulated fabric. Every rank runs the same kernel
specialization: tensor arguments may differ in contents only (same shape and dtype), every other
argument must be equal on every rank (docs/nki.md, "Standalone and multi-rank runs").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, OperandError
from ._kernel import Kernel, _Launcher, simulate
from .spmd import Spmd


def execute(kernel, *args: Any, **kwargs: Any) -> Any:
    """`nki.execute(kernel, *args, **kwargs)`: the kernel's return value, run on the emulated
    device as `nki.simulate(kernel)(*args, **kwargs)` runs it (`kernel` a `nki.jit` kernel, a plain
    function, or `kernel[2]`)."""
    __tracebackhide__ = True  # noqa: F841
    return simulate(_callable(kernel, "execute"))(*args, **kwargs)


def _callable(kernel, api: str):
    if not callable(kernel):
        raise ArgumentTypeError(
            f"nki.{api}: kernel must be a nki.jit kernel or a plain Python function, got {type(kernel).__name__}",
            operand="kernel",
            rule="nki_standalone_kernel",
        )
    return kernel


def _pairs(per_rank_inputs, world: int, api: str) -> list:
    """`per_rank_inputs` as a list of (args tuple, kwargs dict) in rank order."""
    if isinstance(per_rank_inputs, Mapping):
        keys = sorted(per_rank_inputs, key=lambda k: (not isinstance(k, int), k if isinstance(k, int) else 0))
        if set(per_rank_inputs) != set(range(world)):
            raise OperandError(
                f"nki.{api}: per_rank_inputs has keys {keys}; a mapping needs one key for each rank "
                f"0..{world - 1} (world_size={world})",
                operand="per_rank_inputs",
                rule="nki_multi_rank_inputs",
            )
        entries = [per_rank_inputs[r] for r in range(world)]
    elif isinstance(per_rank_inputs, (list, tuple)):
        entries = list(per_rank_inputs)
        if len(entries) != world:
            raise OperandError(
                f"nki.{api}: per_rank_inputs has {len(entries)} entries for world_size={world}",
                operand="per_rank_inputs",
                rule="nki_multi_rank_inputs",
            )
    else:
        raise ArgumentTypeError(
            f"nki.{api}: per_rank_inputs is a sequence in rank order or a mapping rank -> (args, kwargs), "
            f"got {type(per_rank_inputs).__name__}",
            operand="per_rank_inputs",
            rule="nki_multi_rank_inputs",
        )
    pairs = []
    for r, e in enumerate(entries):
        if not (
            isinstance(e, (tuple, list))
            and len(e) == 2
            and isinstance(e[0], (tuple, list))
            and isinstance(e[1], Mapping)
        ):
            raise ArgumentTypeError(
                f"nki.{api}: rank {r}'s input must be an (args tuple, kwargs dict) pair, got {e!r:.80}",
                operand="per_rank_inputs",
                rule="nki_multi_rank_inputs",
            )
        pairs.append((tuple(e[0]), dict(e[1])))
    return pairs


def _same_static(a, b) -> bool:
    if a is b:
        return True
    try:
        eq = a == b
        if isinstance(eq, (bool, np.bool_)) and eq:
            return True
    except Exception:  # noqa: BLE001 - an object whose == raises is compared by its repr below
        pass
    # objects without a value equality (a ReplicaGroup built on each rank): equal when of one type
    # and the same repr (a default repr names the object's id, so distinct such objects differ)
    return type(a) is type(b) and repr(a) == repr(b)


def _check_specialization(pairs: list, api: str) -> None:
    """Every rank passes the same parameters; arrays agree in shape and dtype, the rest are equal."""
    args0, kw0 = pairs[0]
    for r, (args, kw) in enumerate(pairs[1:], start=1):
        if len(args) != len(args0) or set(kw) != set(kw0):
            raise OperandError(
                f"nki.{api}: rank {r} passes {len(args)} positional argument(s) and keywords "
                f"{sorted(kw)}, rank 0 {len(args0)} and {sorted(kw0)}: every rank runs the same kernel "
                "specialization, so every rank passes the same parameters",
                operand="per_rank_inputs",
                rule="nki_multi_rank_specialization",
            )
        named = [(f"argument {i}", args0[i], args[i]) for i in range(len(args))]
        named += [(f"keyword {k!r}", kw0[k], kw[k]) for k in kw0]
        for what, v0, v in named:
            t0, t = hasattr(v0, "shape") and hasattr(v0, "dtype"), hasattr(v, "shape") and hasattr(v, "dtype")
            if t0 or t:
                if not (t0 and t) or tuple(v0.shape) != tuple(v.shape) or str(v0.dtype) != str(v.dtype):
                    raise OperandError(
                        f"nki.{api}: {what} of rank {r} is {_describe(v)}, rank 0's {_describe(v0)}: tensor "
                        "arguments may differ across ranks in contents only (same shape and dtype)",
                        operand="per_rank_inputs",
                        rule="nki_multi_rank_specialization",
                    )
            elif not _same_static(v0, v):
                raise OperandError(
                    f"nki.{api}: {what} of rank {r} is {v!r:.60}, rank 0's {v0!r:.60}: non-tensor "
                    "arguments are static and must be equal on every rank",
                    operand="per_rank_inputs",
                    rule="nki_multi_rank_specialization",
                )


def _describe(v) -> str:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return f"a {v.dtype} tensor of shape {tuple(v.shape)}"
    return f"{v!r:.60}"


def multi_rank_simulate(kernel, *, world_size: int, per_rank_inputs) -> list[Any]:
    """`nki.multi_rank_simulate(kernel, world_size=W, per_rank_inputs=...)`: rank r runs
    `kernel(*args, **kwargs)` with its (args, kwargs) pair; the W results in rank order (module doc)."""
    __tracebackhide__ = True  # noqa: F841
    return _multi_rank(kernel, world_size, per_rank_inputs, "multi_rank_simulate")


def multi_rank_execute(kernel, *, world_size: int, per_rank_inputs) -> list[Any]:
    """`nki.multi_rank_execute`: on the emulator the same run as `multi_rank_simulate`."""
    __tracebackhide__ = True  # noqa: F841
    return _multi_rank(kernel, world_size, per_rank_inputs, "multi_rank_execute")


def _multi_rank(kernel, world_size, per_rank_inputs, api: str) -> list[Any]:
    __tracebackhide__ = True  # noqa: F841
    kernel = _callable(kernel, api)
    lnc = 1
    if isinstance(kernel, _Launcher):  # kernel[2]: each rank a logical core of 2 physical cores
        if len(kernel.grid) != 1 or kernel.grid[0] not in (1, 2):
            raise OperandError(
                f"nki.{api}: a rank runs on one logical NeuronCore of 1 or 2 physical cores; "
                f"kernel[{', '.join(map(str, kernel.grid))}] is not one",
                operand="kernel",
                rule="nki_spmd_world",
            )
        kernel, lnc = kernel.kernel, int(kernel.grid[0])
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ArgumentTypeError(
            f"nki.{api}: world_size must be a positive int, got {world_size!r}",
            operand="world_size",
            rule="nki_spmd_world",
        )
    world = int(world_size)
    pairs = _pairs(per_rank_inputs, world, api)
    _check_specialization(pairs, api)
    if not isinstance(kernel, Kernel):
        kernel = simulate(kernel)
    return Spmd(kernel, world, lnc).run_pairs(pairs)
