"""Pending results: the faithful lowering of `dst[...] = op(...)` and `psum[...] += matmul(...)`.

A value-returning call whose result the kernel usually assigns straight away (`nl.load`,
`nl.matmul`, the legacy dialect's PSUM results of `nc_matmul` / PE `nc_transpose`) returns a
`Pending` tile: its last instruction is not issued yet.

- `tile[...] = nl.load(src)` issues that one DMA with `tile` as its dst (no temporary tile, no
  copy), as the compiler does; likewise `psum[...] = nl.matmul(...)` / `nisa.nc_matmul(...)`.
- `psum[...] += nisa.nc_matmul(a, b)` / `+= nl.matmul(...)` issues one accumulating matmul
  (`accumulate=True`) into `psum`, not a matmul into a temporary plus a copy and an add.
- Any other use of the result (reading its shape, passing it to an instruction), or the kernel's
  next instruction, issues it into a fresh tile first, so instructions keep their program order.
  A PSUM result never used and not followed by another instruction is not issued; a load is
  issued when the kernel body returns (its operands are checked like every instruction's).
"""

from __future__ import annotations

from ..errors import EmuError
from . import indexing
from . import isa as nisa
from ._kernel import END_OF_TRACE, NkiTensor, current


def _flush_pending() -> None:
    """Issue the trace's pending results (before any other instruction, so program order is kept)."""
    pending = current().pending
    while pending:
        pending[0]._issue(None)


class Pending(NkiTensor):
    """A result whose last instruction is not issued yet (`emit(dst)` issues it into dst;
    `accumulate(dst)`, when given, issues it adding into dst). After a fused assignment the
    result is a view of the tile it was written into."""

    __slots__ = ("_spec", "_emit", "_ctx", "_acc", "_origin")

    def __init__(self, spec, emit, accumulate=None, origin: str = "") -> None:
        # `_t` / `_block` stay unset until issued; `origin` names the call that made the result
        self.buffer, self.name = spec[2], ""
        self._spec, self._emit, self._ctx, self._acc, self._origin = spec, emit, current(), accumulate, origin
        self._ctx.pending.append(self)

    def __getattr__(self, name: str):
        if name in ("_t", "_block"):
            self._issue(None)
            return object.__getattribute__(self, name)
        return super().__getattr__(name)

    def _pending(self) -> bool:
        try:
            object.__getattribute__(self, "_t")
            return False
        except AttributeError:
            return True

    def _unlist(self) -> None:
        pending = self._ctx.pending
        for i, p in enumerate(pending):
            if p is self:
                del pending[i]
                break

    def _issue(self, dst, accumulate: bool = False) -> None:
        self._unlist()
        if dst is None:
            from . import language as nl

            shape, dtype, buf = self._spec
            dst = nl.ndarray(shape, dtype, buffer=buf)
        active_masks = current().masks
        masks = active_masks[:]  # issued as written: outside any mask= of the call that uses it
        active_masks.clear()
        try:
            (self._acc if accumulate else self._emit)(dst)
        except EmuError as e:  # name the call that made the result, not the one that used it
            notes = getattr(e, "__notes__", ())
            if self._origin and not any("issued by " in n for n in notes):
                e.add_note(f"  issued by {self._origin} (part of its lowering)")
            raise
        finally:
            active_masks[:] = masks
        self._t, self._block = dst._t, dst._block

    def _matches(self, dst) -> bool:
        shape, dtype, buf = self._spec
        if not self._pending() or indexing.active() or not isinstance(dst, NkiTensor) or isinstance(dst, Pending):
            return False
        return dst.buffer == buf and tuple(dst.shape) == tuple(shape) and dst.dtype == dtype

    def _fuse_into(self, dst) -> bool:
        """`dst[...] = self`: issue into dst when it is the same kind of tile; else False."""
        if not self._matches(dst):
            return False
        self._issue(dst)
        return True

    def _accumulate_into(self, dst) -> bool:
        """`dst[...] += self`: one accumulating instruction into dst when possible; else False."""
        if self._acc is None or not self._matches(dst):
            return False
        self._issue(dst, accumulate=True)
        return True


nisa._before_issue.append(_flush_pending)


def _finish(ctx) -> None:
    """End of a program's trace: issue its pending loads (SBUF results), forget the rest."""
    for p in [p for p in ctx.pending if p._spec[2] == "sbuf"]:
        if p._pending():
            p._issue(None)
    ctx.pending.clear()  # unused PSUM results: never issued


END_OF_TRACE.append(_finish)
