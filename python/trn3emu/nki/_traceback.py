"""Kernel errors show the kernel's own frames: the front end's frames (files of the trn3emu
package) between the launch and the error are cut from the traceback, so the last frame shown is
the kernel line that made the error. `TRN3EMU_NKI_TRACEBACK=full` keeps every frame (for
debugging the emulator); an `InternalError` and any error raised inside the package that is not a
trn3emu error (an emulator bug) keep theirs too."""

from __future__ import annotations

import os
import types

from ..errors import EmuError, InternalError


def _internal(filename: str) -> bool:
    from ._kernel import _internal as inside

    return inside(filename)


def _innermost_is_user(tb) -> bool:
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and not _internal(last.tb_frame.f_code.co_filename)


def filtered(exc: BaseException) -> types.TracebackType | None:
    """`exc`'s traceback without the package's frames; None when nothing else is left."""
    kept = []
    tb = exc.__traceback__
    while tb is not None:
        if not _internal(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def wanted(exc: BaseException) -> bool:
    """Whether `exc` (raised by a launch) gets the kernel-first traceback."""
    if os.environ.get("TRN3EMU_NKI_TRACEBACK", "") == "full" or isinstance(exc, InternalError):
        return False
    return isinstance(exc, EmuError) or _innermost_is_user(exc.__traceback__)
