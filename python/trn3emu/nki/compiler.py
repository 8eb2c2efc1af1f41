"""`nki.compiler`: compiler hints. Scheduling hints are accepted and have no effect (the emulator
schedules by data dependencies); allocation APIs are not supported."""

from __future__ import annotations

import contextlib

from ._kernel import missing_attribute


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


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing_attribute(f"nki.compiler.{name}")
