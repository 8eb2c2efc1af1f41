"""Host threads and SIMD path of the emulator's kernels.

Results are bit-identical for every thread count and SIMD path; these settings only change speed.
The default thread count is ``TRN3EMU_NUM_THREADS`` if set (read once per process), else 1
(threads are opt-in: the extra threads spin on their cores while a device runs, and only
instructions of 2^23 operations and up, such as 128x128x512 matmuls, are split). The threads are private to trn3emu and rebuilt in a child
process after ``os.fork``. ``TRN3EMU_SIMD=avx512|avx2+fma|portable`` narrows the SIMD path at
import (the same as ``_native.limit_simd``), e.g. to time an AVX2-only host's path on an AVX-512 one.
"""

import os

from . import _native, errors


def get_num_threads() -> int:
    """Host threads a run's kernels use."""
    return int(_native.get_num_threads())


def set_num_threads(n: int) -> None:
    """Use ``n`` host threads from the next run on (``0`` restores the default)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise errors.ValidationError(
            f"num_threads must be a non-negative int, got {n!r}", operand="n", rule="num_threads_invalid"
        )
    _native.set_num_threads(n)


def simd_path() -> str:
    """The kernels' SIMD path on this host: ``"avx512"``, ``"avx2+fma"`` or ``"portable"``."""
    return str(_native.simd_path())


def limit_simd_from_env(environ=os.environ) -> None:
    """Narrow the SIMD path to ``TRN3EMU_SIMD`` if set (an unknown name raises ValidationError
    ``unknown_simd_path``); a path wider than the host's leaves the host's best."""
    name = environ.get("TRN3EMU_SIMD", "").strip()
    if name:
        _native.limit_simd(name)


limit_simd_from_env()
