"""`nki.typing`: annotation names kernels import (`from nki.typing import tensor`)."""

from __future__ import annotations

from ._kernel import NkiTensor, missing_attribute

tensor = NkiTensor
mutable_tensor = NkiTensor
# The legacy `neuronxcc.nki.typing` also names the markers alone (nkipy re-exports them at import);
# annotations only, the emulator's tensors are all writable.
mutable = NkiTensor
immutable = NkiTensor


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing_attribute(f"nki.typing.{name}", list(globals()))
