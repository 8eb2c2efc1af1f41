"""trn3emu: an emulator of the AWS Trainium3 chip (8 x NeuronCore-v4).

import numpy as np, ml_dtypes, trn3emu as t3
dev = t3.Device()
a = dev.hbm.put(np.ones((128, 512), np.float32))
p = t3.Program()
x = p.sbuf((128, 512), ml_dtypes.bfloat16)
p.dma_copy(dst=x, src=a)
result = dev.run(p)
"""

from . import errors, sparsity
from ._asm import ENUMS, INSTRUCTIONS
from .device import Device, Hbm
from .dtypes import dtype_name, numpy_dtype, pack_x4, unpack_x4
from .errors import *  # noqa: F403
from .errors import AccumulateWarning, EmuError, IdenticalWritesWarning, ReadOnlyInputWarning
from .program import Program
from .tensor import Reg, Tensor
from .threads import get_num_threads, set_num_threads, simd_path
from .trace import RunResult, Trace
from .ultra import UltraResult, UltraServer

__version__ = "0.1.0"

__all__ = [
    "Device",
    "Hbm",
    "Program",
    "Tensor",
    "Reg",
    "Trace",
    "RunResult",
    "UltraServer",
    "UltraResult",
    "EmuError",
    "AccumulateWarning",
    "IdenticalWritesWarning",
    "ReadOnlyInputWarning",
    "errors",
    "sparsity",
    "ENUMS",
    "INSTRUCTIONS",
    "dtype_name",
    "numpy_dtype",
    "pack_x4",
    "unpack_x4",
    "get_num_threads",
    "set_num_threads",
    "simd_path",
] + errors.__all__
