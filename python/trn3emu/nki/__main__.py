"""`python -m trn3emu.nki script.py [args]`: run a script with `nki` provided by trn3emu."""

from __future__ import annotations

import runpy
import sys

from . import install


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python -m trn3emu.nki script.py [args...]", file=sys.stderr)
        return 2
    install(legacy=False)
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
