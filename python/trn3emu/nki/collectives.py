"""`nki.collectives`: not modelled by the front end yet (every name raises "not supported")."""

from __future__ import annotations

from ._kernel import missing_attribute


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing_attribute(f"nki.collectives.{name}")
