"""pytest plugin: with `-p trn3emu.nki.pytest_plugin` on the command line (or `pytest_plugins` in a
conftest), `import nki` resolves to trn3emu for the whole session when NKI_SIMULATOR=1 or
TRN3EMU_NKI=1 is set; the `nki` fixture installs it for one test and returns the module."""

from __future__ import annotations

import os

import pytest

from . import install, installed, uninstall


def pytest_configure(config) -> None:
    if os.environ.get("NKI_SIMULATOR") == "1" or os.environ.get("TRN3EMU_NKI") == "1":
        install()


@pytest.fixture
def nki():
    was = installed()
    install()
    import nki as mod

    yield mod
    if not was:
        uninstall()
