"""Stream buffers (NKI 0.8 / SDK 2.34): `nl.alloc_stream_buffers` and `NkiStreamBuffers`.

One logical step through a view is the view integer-indexed at coordinate `dim` (every other
coordinate kept): an `NkiTensor`, `NkiTileGrid` or `NkiBlockGrid`. `alloc_stream_buffers` allocates
`num_slots` independent on-chip tensors, each of the capacity of a full step, when called;
`buffers[k]` is step `k`'s view of slot `k % num_slots` (the same abstraction as the step). A
partial final step of a grid is a clamped view over its full-capacity slot. Selecting a slot
allocates nothing and emits nothing: the slots are ordinary allocations, so the automatic
synchronisation orders a write of a slot after the earlier reads of the same slot (docs/nki.md,
"Stream buffers").
"""

from __future__ import annotations

import math

from ..errors import AddressError, ArgumentTypeError, CapacityError, MemorySpaceError, ShapeError
from ..tensor import Reg
from . import _memory
from ._kernel import ONCHIP, NkiTensor, as_dtype, current, not_supported
from .grids import NkiGrid, _fresh_dims, alloc_tiles


def _int_arg(value, what: str, rule: str) -> int:
    if type(value) is not int:
        raise ArgumentTypeError(
            f"alloc_stream_buffers: {what} is a Python int, got {type(value).__name__} {value!r}",
            operand=what,
            rule=rule,
        )
    return value


class NkiStreamBuffers:
    """A pool of `num_slots` on-chip slots addressed by logical stream step (`buffers[k]`)."""

    __slots__ = ("_view", "_dim", "_slots", "num_slots", "buffer", "dtype", "name")

    def __init__(self, *_, **__) -> None:
        raise ArgumentTypeError(
            "NkiStreamBuffers come from nl.alloc_stream_buffers(), not a constructor",
            rule="nki_stream_buffers_constructor",
        )

    # ------------------------------------------------------------------------------ attributes
    @property
    def shape(self) -> tuple:
        """The source view's shape (the stream domain is `range(shape[dim])`)."""
        return self._view.shape

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def num_steps(self) -> int:
        """Logical steps of the stream: `view.shape[dim]` (emulator attribute)."""
        return self._view.shape[self._dim]

    # ------------------------------------------------------------------------------ indexing
    def __getitem__(self, k):
        if type(k) is not int:
            if isinstance(k, (Reg, NkiTensor)):  # (an NkiScalar, a VirtualRegister, a scalar tile)
                raise not_supported(
                    f"a run-time stream-buffer index ({type(k).__name__})",
                    "stream-buffer indices are compile-time Python ints",
                    rule="nki_stream_index_runtime",
                )
            raise ArgumentTypeError(
                f"a stream-buffer index is a nonnegative Python int, got {type(k).__name__} {k!r}",
                operand="key",
                rule="nki_stream_index_type",
            )
        if k < 0:
            raise not_supported(
                f"a negative stream-buffer index ({k})",
                "indices count logical steps from 0",
                rule="nki_stream_index_negative",
            )
        if k >= self.num_steps:
            raise AddressError(
                f"stream-buffer index {k} is outside the stream's {self.num_steps} steps (view.shape[{self._dim}])",
                operand="key",
                rule="nki_stream_index_out_of_range",
            )
        slot = self._slots[k % self.num_slots]
        view = self._view
        if not isinstance(view, NkiGrid):
            return slot
        return self._grid_step(slot, k)

    def _grid_step(self, slot, k: int):
        """Step `k`'s grid over `slot` (an alloc_tiles grid of the full step's extent): the
        step's own extents (a partial final step clamped), with the step's consumed coordinates
        consumed again."""
        view = self._view
        key = (slice(None),) * self._dim + (k,)
        step = view[key]
        ext = step.element_shape
        block = getattr(view, "_block_shape", None)
        dims = _fresh_dims([(0, e, False) for e in ext], view._tile, block)
        grid = type(view)._make(slot._src, dims, view._tile, slot._rank2, block)
        consume = tuple(slice(None) if d.kept else 0 for d in step._dims if not d.dropped)
        return grid[consume] if any(type(c) is int for c in consume) else grid

    def __iter__(self):
        raise not_supported(
            "iterating over NkiStreamBuffers", "index it with range(view.shape[dim])", rule="nki_stream_iteration"
        )

    def __len__(self):
        raise not_supported(
            "len() of NkiStreamBuffers", "the stream has view.shape[dim] steps", rule="nki_stream_iteration"
        )

    def __repr__(self) -> str:
        return (
            f"<NkiStreamBuffers {self.num_slots} slots over {type(self._view).__name__} shape={self.shape} "
            f"dim={self._dim} {self.buffer} {self.dtype}>"
        )


def alloc_stream_buffers(
    view, *, buffer, dim, num_slots=2, dtype=None, transpose_axes=None, address=None, name=""
) -> NkiStreamBuffers:
    """`nl.alloc_stream_buffers(view, *, buffer, dim, num_slots=2, ...)`: `num_slots` independent
    SBUF or PSUM slots, each the capacity of one step of `view` along `dim`."""
    if not isinstance(view, (NkiTensor, NkiGrid)):
        raise ArgumentTypeError(
            f"alloc_stream_buffers takes an NkiTensor, NkiTileGrid or NkiBlockGrid, got {type(view).__name__}",
            operand="view",
            rule="nki_stream_view_type",
        )
    if type(buffer) is not str:
        raise ArgumentTypeError(
            f"alloc_stream_buffers: buffer is an NKI memory region (nl.sbuf or nl.psum), got {buffer!r}",
            operand="buffer",
            rule="nki_stream_buffer",
        )
    if buffer not in ONCHIP:
        raise MemorySpaceError(
            f"alloc_stream_buffers: slots are on chip (nl.sbuf or nl.psum), got {buffer!r}",
            operand="buffer",
            rule="nki_stream_buffer",
        )
    dim = _int_arg(dim, "dim", "nki_stream_dim")
    rank = len(view.shape)
    if not 0 <= dim < rank:
        raise ShapeError(
            f"alloc_stream_buffers: dim {dim} is not a coordinate of the view's shape {view.shape}",
            operand="dim",
            rule="nki_stream_dim",
        )
    num_slots = _int_arg(num_slots, "num_slots", "nki_stream_num_slots")
    if num_slots < 1:
        raise ShapeError(
            f"alloc_stream_buffers: num_slots is at least 1, got {num_slots}",
            operand="num_slots",
            rule="nki_stream_num_slots",
        )
    if transpose_axes is not None:
        raise not_supported(
            "alloc_stream_buffers(transpose_axes=...)",
            "allocate the transposed slots with nl.ndarray and index them by k % n",
            rule="nki_stream_transpose_axes",
        )
    if address is not None:
        raise not_supported(
            "alloc_stream_buffers(address=...)",
            "the placement of several slots from one address is not documented; slots are placed by the allocator",
            rule="nki_stream_address",
        )
    if name is None:
        name = ""
    if type(name) is not str:
        raise ArgumentTypeError(
            f"alloc_stream_buffers: name is a str, got {name!r}", operand="name", rule="nki_stream_name"
        )
    dt = as_dtype(dtype if dtype is not None else view.dtype)
    ctx = current()
    label = name or "stream"
    if isinstance(view, NkiGrid):
        if any(d.dyn is not None for d in view._dims):
            raise not_supported(
                "stream buffers over a grid selected at a run-time index", rule="nki_stream_view_runtime"
            )
        step0 = view[(slice(None),) * dim + (0,)]
        cap = step0.element_shape  # (step 0 is a full step: only the last cell along dim is clamped)
        tile = view._tile
        rows = -(-cap[0] // tile[0]) if cap[0] > _memory.PARTITIONS else 1
        _check_capacity(rows * math.prod(cap[1:]) * dt.itemsize, num_slots, buffer, label)
        slots = []
        for i in range(num_slots):
            g = alloc_tiles(tile_shape=tile, element_shape=cap, buffer=buffer, dtype=dt, name=f"{label}_slot{i}")
            slots.append(g)
    else:
        shape = view.shape[:dim] + view.shape[dim + 1 :]
        if not shape:
            raise ShapeError(
                f"alloc_stream_buffers: a step of the rank-1 view {view.shape} is one element, not a tensor",
                operand="view",
                rule="nki_stream_step_rank",
            )
        _check_capacity(math.prod(shape[1:]) * dt.itemsize, num_slots, buffer, label)
        slots = [ctx.alloc(shape, dt, buffer, f"{label}_slot{i}") for i in range(num_slots)]
    sb = object.__new__(NkiStreamBuffers)
    sb._view, sb._dim, sb._slots, sb.num_slots = view, dim, tuple(slots), num_slots
    sb.buffer, sb.dtype, sb.name = buffer, dt, name
    return sb


def _check_capacity(slot_bytes: int, num_slots: int, buffer: str, label: str) -> None:
    """The pool's bytes per partition (each slot on the allocator's 64-byte alignment) fit the
    memory at all: a clear error before the allocator's, which names only the slot it could not place."""
    cap = _memory.SBUF_BYTES if buffer == "sbuf" else _memory.PSUM_BYTES
    align = _memory.SBUF_ALIGN
    need = num_slots * (-(-max(slot_bytes, 1) // align) * align)
    if need > cap:
        raise CapacityError(
            f"alloc_stream_buffers {label!r}: {num_slots} slots of {slot_bytes} bytes per partition need {need} bytes, "
            f"more than the {cap} bytes of a {buffer} partition; use fewer slots or a smaller step",
            operand="num_slots",
            rule="nki_stream_capacity",
        )
