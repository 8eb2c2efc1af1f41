"""Kernel errors show the kernel's own frames: the front end's frames (files of the trn3emu
package) between the launch and the error are cut from the traceback, so the last frame shown is
the kernel line that made the error. `TRN3EMU_NKI_TRACEBACK=full` keeps every frame (for
debugging the emulator); an `InternalError` and any error raised inside the package that is not a
trn3emu error (an emulator bug) keep theirs too.

Errors found while the traced program runs (races, deadlocks) and `IdenticalWritesWarning` come
from the device, after the kernel function returned: their instructions carry the kernel line
(`name=file.py:LINE`), so the error is rewritten around it - the line and its source text as the
innermost traceback frame, each side named by core and kernel line, the instruction text once, and
a `fix:` line - and the warning is issued at that line (`warnings.warn_explicit`)."""

from __future__ import annotations

import linecache
import os
import re
import sys
import types
import warnings

from ..errors import DeadlockError, EmuError, ExecutionError, IdenticalWritesWarning, InternalError, RaceError
from ._frames import _LOC, _internal


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
    return _chain(kept)


def _chain(entries: list, tail: types.TracebackType | None = None) -> types.TracebackType | None:
    out = tail
    for t in reversed(entries):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def wanted(exc: BaseException) -> bool:
    """Whether `exc` (raised by a launch) gets the kernel-first traceback."""
    if os.environ.get("TRN3EMU_NKI_TRACEBACK", "") == "full" or isinstance(exc, InternalError):
        return False
    return isinstance(exc, EmuError) or _innermost_is_user(exc.__traceback__)


def present(exc: BaseException, kernel=None) -> BaseException:
    """`exc` as a launch raises it: kernel frames only, printed once (the front end's own
    handling of an earlier error - e.g. an allocation retried after evicting - is not shown as
    "During handling of the above exception"), and a run-time error rewritten around its kernel
    line (module docstring). Errors `wanted` refuses come back untouched."""
    if not wanted(exc):
        return exc
    tb = filtered(exc)
    if isinstance(exc, EmuError):
        exc.__suppress_context__ = True
        if isinstance(exc.__cause__, EmuError):
            exc.__cause__ = None
        if isinstance(exc, ExecutionError):
            site = _rewrite(exc, kernel)
            if site is not None:
                path, line, name = site
                tail = _frame_at(exc, path, line, name)
                if tail is not None:
                    tb = _chain(_entries(tb), tail)
    return exc.with_traceback(tb)


def _entries(tb) -> list:
    out = []
    while tb is not None:
        out.append(tb)
        tb = tb.tb_next
    return out


# ----------------------------------------------------------------------------------- run time
#: one side of a run-time error in the device's message: `core K #I `instruction text``
_SIDE = re.compile(r"core (\d+) #(\d+) `([^`]*)`")
_NAME = re.compile(r"\bname=(\S+?):(\d+)\b")
_PREFIX = re.compile(r"^instruction #\d+ `[^`]*`: ")


def _sides(msg: str) -> list[tuple[int, str, str, int]]:
    """(core, instruction text, file, line) of each instruction the message names with a kernel line."""
    out = []
    for m in _SIDE.finditer(msg):
        n = _NAME.search(m.group(3))
        if n is not None:
            out.append((int(m.group(1)), m.group(3), n.group(1), int(n.group(2))))
    return out


def _source(basename: str, line: int, kernel) -> tuple[str, str] | None:
    """(full path, function name) of the kernel line `basename:line`: the code objects the trace
    met (`_frames._LOC`), else the kernel function's own file."""
    loc = f"{basename}:{line}"
    for code, where in list(_LOC.values()):
        if where == loc:
            return code.co_filename, code.co_name
    fn = getattr(kernel, "fn", None)
    code = getattr(fn, "__code__", None)
    if code is not None and os.path.basename(code.co_filename) == basename:
        return code.co_filename, code.co_name
    return None


def _text(path: str | None, line: int) -> str:
    return linecache.getline(path, line).strip() if path else ""


def _rewrite(exc: EmuError, kernel) -> tuple[str, int, str] | None:
    """Rewrite a run-time error's message around its kernel lines; the (path, line, function)
    of its first side (the innermost frame to show), or None when no side has a kernel line."""
    msg = str(exc)
    sides = _sides(msg)
    if not sides:
        return None
    body = _PREFIX.sub("", msg)

    def short(m: re.Match) -> str:
        n = _NAME.search(m.group(3))
        return f"core {m.group(1)} ({n.group(1)}:{n.group(2)})" if n else f"core {m.group(1)}"

    lines = [_SIDE.sub(short, body)]
    seen: dict[tuple[str, int], list[int]] = {}
    for core, _, base, line in sides:
        cores = seen.setdefault((base, line), [])
        if core not in cores:
            cores.append(core)
    where = {}
    for (base, line), cores in seen.items():
        src = _source(base, line, kernel)
        where[(base, line)] = src
        text = _text(src[0] if src else None, line)
        which = ", ".join(f"core {c}" for c in cores)
        lines.append(f"  {base}:{line} ({which}): {text}" if text else f"  {base}:{line} ({which})")
    # the side to show: the instruction that found the race; of a deadlock, the one waiting in
    # a collective (the other cores never reach it), else the first blocked one
    key = sides[-1]
    if isinstance(exc, DeadlockError):
        waiting = [s for s in sides if re.search(re.escape(s[1]) + r"` waits in ", body)]
        key = waiting[0] if waiting else sides[0]
    lines.append(f"  instruction: {_NAME.sub('', key[1]).rstrip()}")
    lines.append("fix: " + _fix(exc, sides, body))
    exc.args = ("\n".join(lines),)
    base, line = key[2], key[3]
    src = where.get((base, line))
    return (src[0], line, src[1]) if src else None


def _fix(exc: EmuError, sides: list, body: str) -> str:
    """One concrete fix for a run-time error of a kernel."""
    cores = {s[0] for s in sides}
    if isinstance(exc, RaceError):
        if len(cores) > 1 and "both writes" in body:
            return (
                "the cores write the same bytes: give each its own part of the output, indexed by "
                "nl.program_id(0) (e.g. out[pid * n:(pid + 1) * n]), or store from one core only "
                "(`if nl.program_id(0) == 0:`)"
            )
        if len(cores) > 1:
            return (
                "one core reads bytes another writes with nothing ordering them: index each core's "
                "part by nl.program_id(0), or put a collective (barrier) between the write and the read"
            )
        return (
            "two engines of one core touch these bytes unordered: trace with sync='auto' (the "
            "default, adds the semaphores), or add signal=/wait= between the two instructions"
        )
    if isinstance(exc, DeadlockError):
        if "never reach their matching one" in body or "collective" in body:
            return (
                "every core of a replica group must call the same collectives in the same order: "
                "move the collective out of the branch on nl.program_id, or call it on every core"
            )
        return "a wait= that nothing signals: check the semaphore's signal= counts, or trace with sync='auto'"
    return "see the kernel line above"


def _frame_at(exc: BaseException, path: str, line: int, name: str) -> types.TracebackType | None:
    """A traceback entry at `path:line` in function `name` (shown with its source text, no
    column carets), for an error the device found after the kernel function returned."""
    try:
        code = compile("\n" * (line - 1) + "raise __exc", path, "exec").replace(co_name=name)
        code = _no_columns(code, line)
    except (SyntaxError, ValueError, TypeError):
        return None
    context, suppress, old = exc.__context__, exc.__suppress_context__, exc.__traceback__
    tb = None
    try:
        exec(code, {"__exc": exc.with_traceback(None)})  # (raising adds to a traceback it has)
    except BaseException as e:  # noqa: BLE001 (it is `exc`)
        if e is exc and e.__traceback__ is not None:
            tb = e.__traceback__.tb_next
    exc.__context__, exc.__suppress_context__, exc.__traceback__ = context, suppress, old
    return tb


def _no_columns(code: types.CodeType, line: int) -> types.CodeType:
    """`code` with every instruction on `line` and no column range (Python >= 3.11 location
    table, "no column" entries), so a traceback shows the line without carets."""
    if sys.version_info < (3, 11):
        return code
    n = len(code.co_code) // 2
    table, delta = bytearray(), line - code.co_firstlineno
    while n:
        k = min(n, 8)
        n -= k
        table.append(0x80 | (13 << 3) | (k - 1))
        v = (-delta << 1) | 1 if delta < 0 else delta << 1
        while v >= 64:
            table.append(0x40 | (v & 63))
            v >>= 6
        table.append(v)
        delta = 0
    return code.replace(co_linetable=bytes(table))


def warn_identical(found: list[str], kernel) -> None:
    """One `IdenticalWritesWarning` for a launch's identical cross-core writes, issued at the
    kernel line of the store (not in the front end; `warnings` shows that line's source), naming
    both cores, with the fix."""
    first = found[0]
    sides = _sides(first)
    more = f" (and {len(found) - 1} more: kernel.last_result.identical_writes)" if len(found) > 1 else ""
    if not sides:
        warnings.warn(first + more, IdenticalWritesWarning, stacklevel=4)
        return
    base, line = sides[0][2], sides[0][3]
    src = _source(base, line, kernel)
    body = _SIDE.sub(lambda m: f"core {m.group(1)}", first)
    msg = (
        f"{body}{more}\n  instruction: {_NAME.sub('', sides[0][1]).rstrip()}"
        "\nfix: store from one core only (`if nl.program_id(0) == 0:`) or give each core its own part "
        "of the output by nl.program_id(0); nki.jit(identical_writes='error') makes this an error"
    )
    if src is None:  # (no file to point at: the line in the message)
        warnings.warn(f"{base}:{line}: {msg}", IdenticalWritesWarning, stacklevel=4)
        return
    fn = getattr(kernel, "fn", None)
    glob = getattr(fn, "__globals__", None) if fn is not None else None
    if glob is None or os.path.basename(glob.get("__file__") or "") != base:
        glob = None
    registry = glob.setdefault("__warningregistry__", {}) if glob is not None else None
    warnings.warn_explicit(
        msg,
        IdenticalWritesWarning,
        src[0],
        line,
        module=glob.get("__name__") if glob else None,
        registry=registry,
        module_globals=glob,
    )
