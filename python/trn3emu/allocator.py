"""The on-chip allocator: one per memory (SBUF, PSUM) of one core, shared by `Program.sbuf` /
`Program.psum` and the NKI front end (`nki/_kernel.py`, which tracks tile lifetimes on top).

Policy (docs/nki.md, "Memory"):

- A tile gets one byte range per partition (the same range in every partition of the tile).
- SBUF: ranges start on a 64-byte boundary.
- PSUM: several small tiles share a 2 KiB bank (ranges start on a 64-byte boundary); a tile of at
  most one bank never straddles a bank boundary; a larger tile starts on a bank boundary and
  spans whole banks.
- Rotation: the ranges of the last `ROTATE` tiles freed stay out of reach while another range fits
  (first fit over the rest), so a tile allocated per loop iteration is not handed straight back
  the range the previous iterations still read: iterations rotate over several buffers (a loop
  body freeing k tiles per iteration gives each about ROTATE / k + 1), as with the compiler's
  multi-buffering, and their accesses need not wait for each other. When only
  a recently freed range fits, it is used: rotation never makes an allocation fail. (Rotating over
  the whole memory instead would spread a kernel's tiles over all of SBUF, for no gain in
  overlap beyond a few buffers.)
- Explicit placement (`place`) reserves exactly the range asked for, overlapping whatever explicit
  placement is live (aliasing is the author's intent); automatic tiles then avoid it. An explicit
  range over a live *automatic* tile is never the author's intent (they cannot know where it went):
  it is recorded in `conflicts`, and the NKI front end traces the kernel again with every explicit
  range of `placements` reserved first (`reserve`), so automatic tiles go around them.

A full memory raises `CapacityError` (`onchip_capacity`) naming the tile and what holds the
memory: for PSUM every bank and the tiles in it.
"""

from __future__ import annotations

import weakref

from . import _native
from .errors import AddressError, CapacityError

SBUF_BYTES: int = _native.SBUF_PARTITION_BYTES
PSUM_BYTES: int = _native.PSUM_PARTITION_BYTES
PSUM_BANK: int = _native.PSUM_BANK_BYTES
#: Ranges start on this byte alignment (an allocator policy, not a hardware rule).
ALIGN = 64
#: Recently freed ranges kept out of reach while others fit (loop tiles rotate over ROTATE + 1).
ROTATE = 8


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


class Allocator:
    """First-fit allocator of per-partition byte ranges of one memory of one core, rotating over
    recently freed ranges (`bank` > 0: the PSUM bank rules). The ranges are kept and searched by
    `_native.RangeAllocator` (the scan runs once per tile a kernel allocates); this class keeps
    the labels, the owners and the messages."""

    def __init__(self, what: str, capacity: int, align: int = ALIGN, bank: int = 0) -> None:
        self.what, self.capacity, self.align, self.bank = what, capacity, align, bank
        self._live: dict[int, tuple[int, int, str]] = {}  # key -> (lo, hi, label)
        # Tracked owners: weak reference -> key (a reference hashes as its owner did, identity for
        # the owners tracked here, and keeps that hash once the owner is gone). When an owner dies
        # its reference is appended to `_dead` by `list.append` itself, C code that runs no Python
        # bytecode: a Ctrl-C arriving then is raised in the kernel's code, never inside a
        # finalizer (where Python would print "Exception ignored" and swallow it).
        self._owners: dict[weakref.ref, int] = {}
        self._dead: list[weakref.ref] = []
        self._on_dead = self._dead.append  # the owners' weakref callback (bound once)
        self._ranges = _native.RangeAllocator(
            capacity, align, bank, ROTATE, self._live, self._owners, self._dead, self._on_dead
        )
        #: `alloc_owned(nbytes, label, owner)`: `alloc` + `track` in one step for an int `nbytes`
        #: >= 1 (freeing the ranges of dead owners first, as `live` does): the byte offset, or None
        #: when no range fits (nothing done; `alloc` raises the error that says why). Native: the
        #: tile allocation of every `nl.ndarray` in a traced loop.
        self.alloc_owned = self._ranges.alloc_owned
        #: keys of explicitly placed ranges (`place`, `reserve`); every other live range is automatic
        self._explicit: set[int] = set()
        #: every explicit range placed: (lo, hi) -> the label of its first tile
        self.placements: dict[tuple[int, int], str] = {}
        #: explicit ranges placed over a live automatic tile: ((lo, hi, label), (lo, hi, label))
        self.conflicts: list[tuple[tuple[int, int, str], tuple[int, int, str]]] = []

    @classmethod
    def sbuf(cls) -> Allocator:
        return cls("SBUF", SBUF_BYTES, ALIGN)

    @classmethod
    def psum(cls) -> Allocator:
        return cls("PSUM", PSUM_BYTES, ALIGN, PSUM_BANK)

    def track(self, owner: object, key: int) -> None:
        """Free `key`'s range once `owner` (hashed by identity) is garbage."""
        self._owners[weakref.ref(owner, self._on_dead)] = key

    @property
    def live(self) -> dict[int, tuple[int, int, str]]:
        """The ranges in use: key -> (lo, hi, label), after freeing those of dead owners."""
        dead = self._dead
        while dead:
            self._release(self._owners.pop(dead.pop()))
        return self._live

    @property
    def _recent(self) -> list[tuple[int, int]]:
        """The recently freed ranges (lo, hi), oldest first: out of reach while others fit."""
        return self._ranges.recent()

    def _release(self, key: int) -> None:
        if self._live.pop(key, None) is not None:
            self._explicit.discard(key)
            self._ranges.release(key)  # (stays out of reach while among the ROTATE most recent)

    def alloc(self, nbytes: int, label: str) -> tuple[int, int]:
        """Place `nbytes` per partition; returns (key, byte offset) or raises CapacityError."""
        got = self.try_alloc(nbytes, label)
        if got is None:
            raise CapacityError(self._overflow(max(int(nbytes), 1), label), operand="shape", rule="onchip_capacity")
        return got

    def try_alloc(self, nbytes: int, label: str) -> tuple[int, int] | None:
        """`alloc`, but None when nothing fits: for callers that make room and retry (building
        the overflow message walks every live tile, too slow to do per retry when full)."""
        nbytes = max(int(nbytes), 1)
        if self._dead:
            self.live  # noqa: B018 (frees the ranges of dead owners)
        got = self._ranges.alloc(nbytes)  # rotation: not a just-freed range, unless nothing else fits
        if got is None:
            return None
        key, pos = got
        self._live[key] = (pos, pos + nbytes, label)
        return got

    def place(self, offset: int, nbytes: int, label: str, error: type = CapacityError) -> int:
        """Reserve an explicit range (may overlap live tiles: aliasing is the kernel's intent)."""
        if offset < 0 or offset + nbytes > self.capacity:
            raise error(
                f"{self.what} overflow: {label} at byte {offset} needs {nbytes} bytes per partition, "
                f"beyond the {self.capacity} bytes of a partition",
                operand="address",
                rule="tile_address_out_of_range",
            )
        hi = offset + nbytes
        for lo_a, hi_a, lb_a in (r for k, r in self.live.items() if k not in self._explicit):
            if lo_a < hi and offset < hi_a:
                self.conflicts.append(((offset, hi, label), (lo_a, hi_a, lb_a)))
        key = self._ranges.place(offset, nbytes)
        self._live[key] = (offset, hi, label)
        self._explicit.add(key)
        self.placements.setdefault((offset, hi), label)
        return key

    def reserve(self, lo: int, hi: int, label: str) -> None:
        """Hold [lo, hi) for the whole program (never freed): a range the kernel places
        explicitly later, kept out of the automatic tiles' way (module docs)."""
        key = self._ranges.place(lo, hi - lo)
        self._live[key] = (lo, hi, label)
        self._explicit.add(key)

    def free(self, key: int) -> None:
        self._release(key)

    def free_at(self, offset: int) -> None:
        """Free the most recent live range starting at `offset` (`Program.free`)."""
        for key in sorted(self.live, reverse=True):
            if self._live[key][0] == offset:
                self._release(key)
                return

    # ------------------------------------------------------------------------------ messages
    def _overflow(self, nbytes: int, label: str) -> str:
        used = sorted(self.live.values())
        head = f"{self.what} overflow: {label} needs {nbytes} bytes per partition and no {self.what} allocation fits"
        if nbytes > self.capacity:
            return (
                f"{head}: a partition has {self.capacity} bytes in all. fix: split the tile's free dim "
                f"into tiles of at most {self.capacity // 2 if self.bank is None else self.bank} bytes per "
                "partition and loop over them"
            )
        if self.bank:
            rule = (
                f"tiles of at most {self.bank} bytes share a bank but never straddle one"
                if nbytes <= self.bank
                else f"a tile over {self.bank} bytes needs {_up(nbytes, self.bank) // self.bank} free whole banks"
            )
            return (
                f"{head} ({rule}); {self._banks(used)}. fix: accumulate in tiles of at most {self.bank} bytes "
                f"per partition (one bank: [128, {self.bank // 4}] fp32), copy each finished one to SBUF, "
                "and allocate accumulators inside the loop that uses them so they are freed after it"
            )
        return (
            f"{head}: {_covered(used)} of {self.capacity} bytes per partition are held by {len(used)} live tiles "
            f"(largest free gap {_largest_gap(used, self.capacity, self.align)} bytes), the largest: "
            + _holders(used)
            + ". fix: make fewer tiles live at once (allocate each inside the loop that uses it, so it is "
            "freed after its iteration; drop references to finished tiles), or use smaller tiles"
        )

    def _banks(self, used: list) -> str:
        rows: list[list] = []  # [first bank, last bank, what holds each, the held ranges]
        for b in range(self.capacity // self.bank):
            lo_b, hi_b = b * self.bank, (b + 1) * self.bank
            held = [(lo, hi, lb) for lo, hi, lb in used if lo < hi_b and hi > lo_b]
            if not held:
                what = "free"
            else:
                n = _covered([(max(lo, lo_b), min(hi, hi_b), lb) for lo, hi, lb in held])
                what = f"({n} of {self.bank} bytes): " + ", ".join(lb for _, _, lb in held)
            if rows and rows[-1][3] == held and (not held or len(held) == 1):
                rows[-1][1] = b  # one wide tile over several banks (or free banks): named once
            else:
                rows.append([b, b, what, held])
        parts = []
        for first, last, what, _ in rows:
            banks = f"bank {first}" if first == last else f"banks {first}-{last}"
            parts.append(f"{banks}: free" if what == "free" else f"{banks} {what}")
        return "banks: " + "; ".join(parts)


def _holders(used: list) -> str:
    """The live tiles holding the most bytes, tiles of one label counted together."""
    by: dict[str, list[int]] = {}
    for lo, hi, lb in used:
        by.setdefault(lb, []).append(hi - lo)
    top = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:4]
    out = [(f"{len(n)} x " if len(n) > 1 else "") + f"{lb} ({sum(n)} bytes)" for lb, n in top]
    if len(by) > 4:
        out.append(f"and {len(by) - 4} more")
    return "; ".join(out)


def _covered(ranges: list) -> int:
    total, end = 0, 0
    for lo, hi, _ in sorted(ranges):
        lo = max(lo, end)
        if hi > lo:
            total += hi - lo
        end = max(end, hi)
    return total


def _largest_gap(ranges: list, capacity: int, align: int) -> int:
    best, pos = 0, 0
    for lo, hi, _ in sorted(ranges):
        best = max(best, lo - pos)
        pos = max(pos, _up(hi, align))
    return max(best, capacity - pos)


__all__ = ["Allocator", "AddressError", "CapacityError", "ALIGN", "PSUM_BANK", "PSUM_BYTES", "SBUF_BYTES"]
