"""`nki.compiler`: compiler hints. Scheduling hints are accepted and have no effect (the emulator
schedules by data dependencies); the direct allocation APIs (`sbuf.alloc`, `sbuf.mod_alloc`,
`psum.alloc`, `psum.mod_alloc`) place tiles and the blocks of block tiles (`blocks.py`)."""

from __future__ import annotations

import contextlib
import inspect

from .. import _native
from ._kernel import missing_attribute
from .compile_config import (  # noqa: F401 (`nki.compiler.CompileConfig` and its enumerations)
    AddressRotation,
    Allocation,
    AllocationMode,
    CompileConfig,
    OptLevel,
    SchedulingHeuristic,
    SpecializationConfig,
)


@contextlib.contextmanager
def no_reorder():
    yield


def enable_stack_allocator(*args, **kwargs):
    """Accepted: trn3emu.nki always uses its own allocator."""
    if args and callable(args[0]):
        return args[0]
    return lambda f: f


def skip_middle_end_transformations(f=None, **kwargs):
    return f if f is not None else (lambda g: g)


#: bytes per partition of one PSUM bank (from the Rust core)
PSUM_BANK_BYTES: int = _native.PSUM_BANK_BYTES


class AllocatedBuffer:
    """`buffer=ncc.sbuf.alloc(func)` / `ncc.sbuf.mod_alloc(...)` / `ncc.psum.alloc(func)` /
    `ncc.psum.mod_alloc(...)`: a buffer kind plus the function placing a tile,
    func(block_index, partition_size, free_bytes) -> (partition, byte address), or for PSUM
    (bank, partition, byte address within the bank). Tiles without block dims use block_index ()."""

    def __init__(self, kind: str, func) -> None:
        self.buffer, self.func = kind, func
        self._by_name = _takes_named(func)

    def _place(self, idx: tuple, pdim_size: int, fdim_size: int):
        # The API pages name the arguments idx, pdim_size, fdim_size; kernels bind other
        # parameters of their placing function first (functools.partial(f, bank_map=...), as
        # nki-samples' allocated attention does), which only a call by name reaches.
        if self._by_name:
            return self.func(idx=idx, pdim_size=pdim_size, fdim_size=fdim_size)
        return self.func(idx, pdim_size, fdim_size)

    def address(self, shape, itemsize: int, idx: tuple = ()) -> tuple:
        free = itemsize
        for n in shape[1:]:
            free *= int(n)
        placed = tuple(self._place(tuple(idx), int(shape[0]), free))
        if len(placed) == 3:  # PSUM form: (bank, partition, address in the bank)
            bank, p, b = (int(x) for x in placed)
            return p, bank * PSUM_BANK_BYTES + b
        p, b = placed
        return int(p), int(b)

    def block_placer(self, shape: tuple, pd: int, itemsize: int):
        """For a block tile `(blocks..., P, free...)`: block index -> the address of its tile."""
        tile = tuple(shape[pd:])
        return lambda idx: self.address(tile, itemsize, idx)


def _modulo(base: int, tiles: tuple, scale: int):
    """NKI's modulo allocation: block index i -> base + linear(i mod tiles) * scale."""

    def f(idx):
        shape = tuple(tiles) or (1,) * len(idx)
        lin, mult = 0, 1
        for i, n in reversed(list(zip(idx, shape))):
            lin += (i % n) * mult
            mult *= n
        return base + lin * scale

    return f


class _Space:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def auto_alloc(self, *args, **kwargs) -> str:
        """Let the allocator place the tile (the default)."""
        return self.kind

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise missing_attribute(f"nki.compiler.{self.kind}.{name}")

    def alloc(self, func) -> AllocatedBuffer:
        return AllocatedBuffer(self.kind, func)

    def mod_alloc(
        self,
        base_addr=0,
        *,
        base_bank=None,
        num_bank_tiles=(),
        base_partition=0,
        num_par_tiles=(),
        num_free_tiles=(),
    ):
        bank = _modulo(int(base_bank or 0), tuple(num_bank_tiles), 1)

        def func(idx, pdim_size, fdim_size):
            p = _modulo(int(base_partition), tuple(num_par_tiles), pdim_size)(idx)
            b = _modulo(int(base_addr), tuple(num_free_tiles), fdim_size)(idx)
            return (bank(idx), p, b) if self.kind == "psum" else (p, b)

        return AllocatedBuffer(self.kind, func)


def _takes_named(func) -> bool:
    """Whether `func` can be called with idx=, pdim_size=, fdim_size= by name."""
    try:
        inspect.signature(func).bind(idx=(), pdim_size=1, fdim_size=1)
    except (TypeError, ValueError):
        return False
    return True


sbuf = _Space("sbuf")
psum = _Space("psum")


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing_attribute(f"nki.compiler.{name}", list(globals()))
