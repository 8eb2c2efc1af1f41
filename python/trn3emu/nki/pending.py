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

from . import indexing
from . import isa as nisa
from ._kernel import END_OF_TRACE, NkiTensor, current

_PENDING: list = []


def _flush_pending() -> None:
    """Issue the pending results (before any other instruction, so program order is kept)."""
    while _PENDING:
        p = _PENDING[0]
        if p._ctx is not current():  # left over from a finished trace: never used, never issued
            _PENDING.pop(0)
            continue
        p._issue(None)


class Pending(NkiTensor):
    """A result whose last instruction is not issued yet (`emit(dst)` issues it into dst;
    `accumulate(dst)`, when given, issues it adding into dst). After a fused assignment the
    result is a view of the tile it was written into."""

    __slots__ = ("_spec", "_emit", "_ctx", "_acc")

    def __init__(self, spec, emit, accumulate=None) -> None:  # `_t` / `_block` stay unset until issued
        self.buffer, self.name = spec[2], ""
        self._spec, self._emit, self._ctx, self._acc = spec, emit, current(), accumulate
        _PENDING.append(self)

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
        for i, p in enumerate(_PENDING):
            if p is self:
                del _PENDING[i]
                break

    def _issue(self, dst, accumulate: bool = False) -> None:
        self._unlist()
        if dst is None:
            from . import language as nl

            shape, dtype, buf = self._spec
            dst = nl.ndarray(shape, dtype, buffer=buf)
        masks = indexing._MASKS[:]  # issued as written: outside any mask= of the call that uses it
        indexing._MASKS.clear()
        try:
            (self._acc if accumulate else self._emit)(dst)
        finally:
            indexing._MASKS[:] = masks
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
    for p in [p for p in _PENDING if p._ctx is ctx and p._spec[2] == "sbuf"]:
        if p._pending():
            p._issue(None)
    _PENDING[:] = [p for p in _PENDING if p._ctx is not ctx]  # unused PSUM results: never issued


END_OF_TRACE.append(_finish)
