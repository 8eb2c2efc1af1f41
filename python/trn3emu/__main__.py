"""`python -m trn3emu ...` = the `trn3emu` command."""

import sys

from .cli import main

sys.exit(main())
