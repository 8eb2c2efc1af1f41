"""`trn3emu.nki.sparse`: NKI-style wrappers of emulator-level sparse instructions.

NeuronCore-v4's Tensor engine has M:N structured sparsity in hardware but ``nki.isa`` has no API
for it, so the instruction lives in this extension namespace, not under ``nki.isa``:

    import trn3emu.nki.sparse as nsp
    nsp.nc_matmul_sparse(psum_tile, values, index, moving, pattern="4:16", accumulate=False)

inside an ``@nki.jit`` kernel traced by `trn3emu.nki`. Operands are NKI tiles: ``values`` and
``index`` ``[Kc, M]`` from `trn3emu.sparsity.compress`, ``moving`` the dense ``[K, N]`` operand
laid out ``[Kc, g/s, N]`` (docs/sparsity.md). ``pattern`` is ``"4:16"``, ``"m4_n16"`` or a
member of `sparsity_pattern`.
"""

from __future__ import annotations

import enum
import inspect
from typing import Any

from .._asm import ENUMS
from ..sparsity import pattern_name
from .isa import Instruction, _make

#: the ISA enum of patterns (m4_n16 = 4:16, ...)
sparsity_pattern = enum.Enum("sparsity_pattern", {n: n for n in ENUMS["sparsity_pattern"]})

_nc_matmul_sparse = _make("nc_matmul_sparse")


def nc_matmul_sparse(dst, stationary, stationary_index, moving, pattern, accumulate=None, **kwargs: Any) -> Instruction:
    return _nc_matmul_sparse(dst, stationary, stationary_index, moving, pattern_name(pattern), accumulate, **kwargs)


nc_matmul_sparse.__doc__ = _nc_matmul_sparse.__doc__
nc_matmul_sparse.__signature__ = inspect.signature(_nc_matmul_sparse)  # type: ignore[attr-defined]

__all__ = ["nc_matmul_sparse", "sparsity_pattern"]
