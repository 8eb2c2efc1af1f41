"""trn3emu.nki: run NKI kernels (NKI 0.6 to 0.8, `import nki`) unchanged on the emulator.

    import trn3emu.nki
    trn3emu.nki.install()          # registers `nki`, `nki.isa`, `nki.language`, ... in sys.modules
    import nki, nki.isa as nisa, nki.language as nl

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        ...
        return out

    y = add(a_np, b_np)            # numpy in, numpy out; also nki.simulate(add)(a_np, b_np), add[2](...)

Activation without code changes: the pytest plugin (`-p trn3emu.nki.pytest_plugin`, automatic when
NKI_SIMULATOR=1 or TRN3EMU_NKI=1), or `python -m trn3emu.nki script.py`.
"""

from __future__ import annotations

import sys
import types

from ..dtypes import numpy_dtype
from . import collectives, compiler, isa, language, lnc, sparse, typing
from . import tracetime as tensor
from ._kernel import Kernel, NkiTensor, jit, missing_attribute, resolve_target, simulate
from .jaxcall import jax_call
from .profiling import benchmark, profile
from .spmd import spmd
from .standalone import execute, multi_rank_execute, multi_rank_simulate

#: module names registered by install() -> the module object
_ALIASES = {
    "nki": sys.modules[__name__],
    "nki.isa": isa,
    "nki.language": language,
    "nki.typing": typing,
    "nki.compiler": compiler,
    "nki.collectives": collectives,
    "nki.lnc": lnc,
}


def _extra_modules() -> dict:
    """`nki.isa.constants`, `nki.dtype`, `nki.tensor` as thin modules (harnesses import them)."""
    constants = types.ModuleType("nki.isa.constants")
    for n in ("engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "dma_engine", "nc_version"):
        setattr(constants, n, getattr(isa, n))
    dtype = types.ModuleType("nki.dtype")
    for n, v in vars(language).items():
        if isinstance(v, str) and type(v).__name__ == "Dtype":
            setattr(dtype, n, v)
    isa.constants = constants
    lconst = types.ModuleType("nki.language.constants")  # legacy kernels import sizeinbytes from here
    lconst.sizeinbytes = lambda dt: int(numpy_dtype(dt).itemsize)
    language.constants = lconst
    return {
        "nki.isa.constants": constants,
        "nki.dtype": dtype,
        "nki.tensor": tensor,
        "nki.language.constants": lconst,
    }


_EXTRA = _extra_modules()
dtype = _EXTRA["nki.dtype"]


_saved: dict = {}


_LEGACY: dict = {}


def _legacy_modules() -> dict:
    """`neuronxcc.nki.*`: the legacy dialect (value-returning isa, masks, simulate_kernel, ...)."""
    if not _LEGACY:
        from . import legacy as _lg

        pkg = _lg.make_package(sys.modules[__name__])
        mods = {"neuronxcc." + k: v for k, v in dict(_ALIASES, **_EXTRA).items()}
        mods["neuronxcc.nki"] = pkg
        mods["neuronxcc.nki.isa"] = _lg.isa
        root = types.ModuleType("neuronxcc")
        root.nki = pkg
        mods["neuronxcc"] = root
        _LEGACY.update(mods)
    return _LEGACY


def install(legacy: bool = True) -> None:
    """Register trn3emu's front end as `nki` (and submodules) in sys.modules, and the legacy
    dialect as `neuronxcc.nki` (and submodules) unless `legacy=False`.

    Idempotent; `uninstall()` restores whatever was there before.
    """
    mods = dict(_ALIASES, **_EXTRA)
    if legacy:
        mods.update(_legacy_modules())
    for name, mod in mods.items():
        if name not in _saved:
            _saved[name] = sys.modules.get(name)
        sys.modules[name] = mod


def uninstall() -> None:
    """Undo install()."""
    for name, prev in list(_saved.items()):
        if prev is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = prev
    _saved.clear()


def installed() -> bool:
    return sys.modules.get("nki") is sys.modules[__name__]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing_attribute(f"nki.{name}", list(globals()))


__all__ = [
    "install",
    "uninstall",
    "installed",
    "jit",
    "spmd",
    "jax_call",
    "simulate",
    "execute",
    "multi_rank_simulate",
    "multi_rank_execute",
    "profile",
    "benchmark",
    "Kernel",
    "NkiTensor",
    "tensor",
    "isa",
    "language",
    "sparse",
    "typing",
    "compiler",
    "collectives",
    "resolve_target",
]
