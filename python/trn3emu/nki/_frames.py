"""Which source files are the package's own and which are the user's (kernels, and the shipped
examples, which are user code), and the cache of kernel source lines: the tracer (`_kernel`) and
the traceback filter (`_traceback`) both read them, so they sit below both."""

from __future__ import annotations

import os
import types

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLES = os.path.join(_PKG, "examples") + os.sep  # shipped example kernels are user code

#: file name -> whether it lies inside the package (not the examples)
_INTERNAL: dict[str, bool] = {}


def _internal(filename: str) -> bool:
    v = _INTERNAL.get(filename)
    if v is None:
        path = os.path.abspath(filename)
        v = _INTERNAL[filename] = path.startswith(_PKG) and not path.startswith(_EXAMPLES)
    return v


#: (id of a code object, instruction offset) -> (the code object, "file:line"): the line of an
#: offset is found by decoding the code's line table from its start, so it is looked up once per
#: call site (the code object held in the value keeps its id from being reused)
#: (filled by `_kernel.source_line`)
_LOC: dict[tuple[int, int], tuple[types.CodeType, str]] = {}
