"""`nki.typing`: annotation names kernels import (`from nki.typing import tensor`)."""

from __future__ import annotations

from ._kernel import NkiTensor, missing_attribute

tensor = NkiTensor
mutable_tensor = NkiTensor
# The legacy `neuronxcc.nki.typing` also names the markers alone (nkipy re-exports them at import);
# annotations only, the emulator's tensors are all writable.
mutable = NkiTensor
immutable = NkiTensor


def scalar(t) -> int:
    """`range(scalar(tile))` (public nki-samples kernels, `neuronxcc.nki.typing.scalar`; not in the
    NKI docs): the value of the 1x1 int32 / uint32 tile `t` as read on the device. The tile is
    loaded into a register (`nisa.scalar_load`'s rules) and read as a device loop's bound is
    (`registers.device_value`: the kernel so far runs, tracing continues), so the loop it bounds
    runs that many times, unrolled. Returns a Python int."""
    from .registers import device_value
    from .scalars import scalar_load

    return device_value(scalar_load(t))


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing_attribute(f"nki.typing.{name}", list(globals()))
