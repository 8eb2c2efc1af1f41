"""On-chip memory for traced kernels: a real SBUF/PSUM allocator with capacity, alignment,
explicit placement and aliasing.

Tiles get byte ranges per partition (one range serves every partition of the tile, as on
hardware). An automatically placed tile never overlaps a live tile; a tile placed with
`address=` goes exactly where the kernel says, overlapping whatever is there (that is how
kernels alias on purpose), and automatic tiles then avoid it. A tile's range is returned to
the allocator when the last Python reference to the tile (or any view of it) goes away, so a
loop body that allocates a tile per iteration reuses one range, as the compiler's allocator
does; the reuse is ordered by the automatic synchronisation (WAR/WAW dependencies).
"""

from __future__ import annotations

import itertools
import weakref

from .. import _native
from ..errors import AddressError, CapacityError

#: NeuronCore-v4 per-partition capacities (reference §1.3), from the Rust core.
SBUF_BYTES: int = _native.SBUF_PARTITION_BYTES
PSUM_BYTES: int = _native.PSUM_PARTITION_BYTES
PSUM_BANK: int = _native.PSUM_BANK_BYTES
PARTITIONS: int = _native.PARTITIONS
#: SBUF tiles start on this byte alignment (an allocator policy, not a hardware rule).
SBUF_ALIGN = 64


class Allocator:
    """First-fit allocator of per-partition byte ranges of one memory (SBUF or PSUM) of one core."""

    def __init__(self, what: str, capacity: int, align: int) -> None:
        self.what, self.capacity, self.align = what, capacity, align
        self._live: dict[int, tuple[int, int, str]] = {}  # key -> (lo, hi, label)
        self._keys = itertools.count()
        # Tracked owners: id(weak reference) -> (the reference, key). When an owner dies its
        # reference is appended to `_dead` by `list.append` itself, C code that runs no Python
        # bytecode: a Ctrl-C arriving then is raised in the kernel's code, never inside a
        # finalizer (where Python would print "Exception ignored" and swallow it).
        self._owners: dict[int, tuple[weakref.ref, int]] = {}
        self._dead: list[weakref.ref] = []

    def track(self, owner: object, key: int) -> None:
        """Free `key`'s range once `owner` is garbage."""
        r = weakref.ref(owner, self._dead.append)
        self._owners[id(r)] = (r, key)

    @property
    def live(self) -> dict[int, tuple[int, int, str]]:
        """The ranges in use: key -> (lo, hi, label), after freeing those of dead owners."""
        dead = self._dead
        while dead:
            _, key = self._owners.pop(id(dead.pop()))
            self._live.pop(key, None)
        return self._live

    def alloc(self, nbytes: int, label: str) -> tuple[int, int]:
        """Place `nbytes` per partition; returns (key, byte offset) or raises CapacityError."""
        pos = 0
        for lo, hi, _ in sorted(self.live.values()):
            if lo - pos >= nbytes:
                break
            pos = max(pos, -(-hi // self.align) * self.align)
        if pos + nbytes > self.capacity:
            used = sorted(self.live.values())
            in_use = _covered(used)
            raise CapacityError(
                f"{self.what} overflow: {label} needs {nbytes} bytes per partition, but {in_use} of "
                f"{self.capacity} bytes per partition are held by {len(used)} live tiles "
                f"(largest free gap {_largest_gap(used, self.capacity, self.align)} bytes)",
                operand="shape",
                rule="onchip_capacity",
            )
        key = next(self._keys)
        self._live[key] = (pos, pos + nbytes, label)
        return key, pos

    def place(self, offset: int, nbytes: int, label: str) -> int:
        """Reserve an explicit range (may overlap live tiles: aliasing is the kernel's intent)."""
        if offset < 0 or offset + nbytes > self.capacity:
            raise CapacityError(
                f"{self.what} overflow: {label} at byte {offset} needs {nbytes} bytes per partition, "
                f"beyond the {self.capacity} bytes of a partition",
                operand="address",
                rule="tile_address_out_of_range",
            )
        key = next(self._keys)
        self._live[key] = (offset, offset + nbytes, label)
        return key

    def free(self, key: int) -> None:
        self._live.pop(key, None)


def _covered(ranges: list) -> int:
    total, end = 0, 0
    for lo, hi, _ in ranges:
        lo = max(lo, end)
        if hi > lo:
            total += hi - lo
        end = max(end, hi)
    return total


def _largest_gap(ranges: list, capacity: int, align: int) -> int:
    best, pos = 0, 0
    for lo, hi, _ in ranges:
        best = max(best, lo - pos)
        pos = max(pos, -(-hi // align) * align)
    return max(best, capacity - pos)


def check_partitions(start: int, parts: int, label: str) -> None:
    if parts > PARTITIONS or start < 0 or start + parts > PARTITIONS:
        raise AddressError(
            f"{label} spans partitions {start}..{start + parts}, beyond the {PARTITIONS} partitions",
            operand="shape",
            rule="partitions_out_of_range",
        )
