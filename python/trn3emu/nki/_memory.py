"""On-chip memory for traced kernels: the allocator is `trn3emu.allocator` (shared with
`Program`); this module holds the constants and checks the front end adds.

A tile's range is returned to the allocator when the last Python reference to the tile (or any
view of it) goes away, so a loop body that allocates a tile per iteration reuses memory, as the
compiler's allocator does; the allocator's rotation hands consecutive iterations
different ranges while memory allows, and the reuse is ordered by the automatic synchronisation
(WAR/WAW dependencies).
"""

from __future__ import annotations

from .. import _native
from ..allocator import Allocator  # noqa: F401  (re-exported: the one allocator)
from ..errors import AddressError

#: NeuronCore-v4 per-partition capacities (reference §1.3), from the Rust core.
SBUF_BYTES: int = _native.SBUF_PARTITION_BYTES
PSUM_BYTES: int = _native.PSUM_PARTITION_BYTES
PSUM_BANK: int = _native.PSUM_BANK_BYTES
PARTITIONS: int = _native.PARTITIONS
#: SBUF tiles start on this byte alignment (an allocator policy, not a hardware rule).
SBUF_ALIGN = 64


def check_partitions(start: int, parts: int, label: str) -> None:
    if parts > PARTITIONS or start < 0 or start + parts > PARTITIONS:
        raise AddressError(
            f"{label} spans partitions {start}..{start + parts}, beyond the {PARTITIONS} partitions. "
            f"fix: tile the first (partition) dim into pieces of at most {PARTITIONS} rows and loop over them",
            operand="shape",
            rule="partitions_out_of_range",
        )
