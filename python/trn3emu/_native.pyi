"""Type stubs for the native module (rust/python/src/*.rs)."""

from collections.abc import Callable
from typing import Any, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "Device",
    "AccessPattern",
    "Program",
    "RangeAllocator",
    "RawTrace",
    "access_pattern",
    "CallPlan",
    "view_geometry",
    "convert_from_f32",
    "convert_to_f32",
    "isa_opcodes",
    "cost_params",
    "hbm_stack",
    "constants",
    "numerics_options",
    "get_num_threads",
    "set_num_threads",
    "set_min_parallel_work",
    "simd_path",
    "limit_simd",
    "fabric_params",
    "ultra_run",
    "ultra_run_dist",
    "NUM_CORES",
    "PARTITIONS",
    "SBUF_PARTITION_BYTES",
    "PSUM_PARTITION_BYTES",
    "PSUM_BANK_BYTES",
    "PSUM_BANKS",
    "HBM_BYTES",
    "NUM_SEMAPHORES",
    "AUTO_SEM_BASE",
    "NUM_REGISTERS",
    "MAX_SYNC",
    "MAX_FREE_DIMS",
    "CHIPLETS",
    "HBM_STACKS",
    "HBM_INTERLEAVE_BYTES",
    "MAX_CHIPS",
    "STREAMS",
]

# Hardware and emulator constants (rust/python/src/info.rs, defined in the core).
NUM_CORES: int
PARTITIONS: int
SBUF_PARTITION_BYTES: int
PSUM_PARTITION_BYTES: int
PSUM_BANK_BYTES: int
PSUM_BANKS: int
HBM_BYTES: int
NUM_SEMAPHORES: int
AUTO_SEM_BASE: int
NUM_REGISTERS: int
MAX_SYNC: int
MAX_FREE_DIMS: int
CHIPLETS: int
HBM_STACKS: int
HBM_INTERLEAVE_BYTES: int
MAX_CHIPS: int
STREAMS: tuple[str, ...]

@final
class AccessPattern:
    def at(self, offset: int) -> AccessPattern: ...

def access_pattern(t: Any) -> Any: ...

@final
class CallPlan:
    def __new__(
        cls,
        opcode: str,
        plan: tuple[Any, ...],
        base: list[Any],
        dsts: list[int] | tuple[int, ...],
        nki_tensor: type,
        slow: Callable[..., Any],
        issued: type | None = None,
    ) -> CallPlan: ...
    def operands(self, values: Any, core: Any, uses: Any) -> tuple[Any, ...] | None: ...
    def append(
        self,
        program: Program,
        values: Any,
        core: Any,
        uses: Any,
        label: Any,
        loc: Any,
        opcodes: set[str],
        bar: Any,
    ) -> int | None: ...

def view_geometry(
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
    start: int,
    onchip: bool,
    es: int,
    key: tuple[Any, ...],
) -> tuple[tuple[int, ...], tuple[int, ...], int, int] | None: ...

@final
class Program:
    def __new__(cls, core: int = 0) -> Program: ...
    @property
    def core(self) -> int: ...
    def __len__(self) -> int: ...
    def append(
        self,
        opcode: str,
        engine: str | None,
        args: tuple[Any, ...],
        waits: list[tuple[int, int]],
        signals: list[tuple[int, int]],
        name: str | None = None,
        resolve_accumulate: bool = True,
    ) -> int: ...
    def set_engine_balance(self, timing: str | None) -> None: ...
    def engine_balance_ps(self) -> tuple[int, int, int] | None: ...
    def unpinned(self) -> list[int]: ...
    def engine_choices(self, timing: str) -> list[tuple[int, str]]: ...
    def set_engine(self, index: int, engine: str) -> None: ...
    def psum_fresh(self, start: int, parts: int, offset: int, nbytes: int) -> None: ...
    def keep_unresolved(self) -> None: ...
    def onchip_operands(self, i: int) -> list[tuple[int, str, int, int, int, int, bool, bool]]: ...
    def append_moved(self, src: Program, i: int, moves: list[tuple[int, int]]) -> int: ...
    def exact_repeats(
        self, rename: bool = False, last: bool = False
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]], int]: ...
    def relative_key(self, i: int, shifts: list[tuple[int, int]], loads: bool = False) -> int | None: ...
    def same_relative(self, i: int, si: list[tuple[int, int]], j: int, sj: list[tuple[int, int]]) -> bool: ...
    def dead_instructions(self, last: bool = True) -> list[tuple[int, str]]: ...
    def forward_copies(
        self, copies: list[int] | None, last: bool = True, any: bool = False
    ) -> tuple[list[int], int]: ...
    def move_operands(self, moves: list[tuple[int, int, int]]) -> None: ...
    def remove(self, indices: list[int]) -> None: ...
    def synced(self) -> Program: ...
    def instruction_names(self) -> list[str | None]: ...
    def instruction_engine(self, i: int) -> str | None: ...
    def instruction_text(self, i: int) -> str | None: ...
    def to_text(self) -> str: ...
    @staticmethod
    def from_text(text: str) -> Program: ...
    def encode(self) -> bytes: ...
    @staticmethod
    def decode(data: bytes) -> Program: ...
    def __eq__(self, value: object, /) -> bool: ...

@final
class RangeAllocator:
    def __new__(
        cls,
        capacity: int,
        align: int,
        bank: int,
        rotate: int,
        live: dict[Any, Any],
        owners: dict[Any, Any],
        dead: list[Any],
        on_dead: Any,
    ) -> RangeAllocator: ...
    def alloc(self, nbytes: int) -> tuple[int, int] | None: ...
    def alloc_owned(self, nbytes: int, label: Any, owner: Any) -> int | None: ...
    def place(self, offset: int, nbytes: int) -> int: ...
    def recent(self) -> list[tuple[int, int]]: ...
    def release(self, key: int) -> None: ...

@final
class Device:
    def __new__(
        cls,
        rounding: str | None = None,
        seed: int | None = None,
        sr_bits: int | None = None,
        fp8_overflow: str | None = None,
        mx_scale: str | None = None,
        timing: str | None = None,
    ) -> Device: ...
    def numerics(self) -> dict[str, str | int]: ...
    @property
    def timing(self) -> str: ...
    def hbm_write(self, addr: int, data: npt.NDArray[np.uint8]) -> None: ...
    def hbm_zero(self, addr: int, nbytes: int) -> None: ...
    def hbm_equals(self, addr: int, data: npt.NDArray[np.uint8]) -> bool: ...
    def hbm_read(self, addr: int, nbytes: int) -> npt.NDArray[np.uint8]: ...
    def hbm_read_into(self, addr: int, out: npt.NDArray[np.uint8]) -> None: ...
    def hbm_resident_bytes(self) -> int: ...
    def onchip_read(
        self, core: int, mem: str, start: int, parts: int, offset: int, nbytes: int
    ) -> npt.NDArray[np.uint8]: ...
    def fill_onchip(self, byte: int) -> None: ...
    @property
    def max_executed(self) -> int: ...
    @max_executed.setter
    def max_executed(self, n: int) -> None: ...
    def run(
        self,
        programs: list[Program],
        check_races: bool = True,
        trace: bool = True,
        progress: Callable[[int, int | None, int], object] | None = None,
        trace_limit: int = ...,
        identical_writes: bool = False,
        max_seconds: float | None = None,
        max_memory: int = ...,
    ) -> dict[str, Any]: ...

@final
class RawTrace:
    """A run's trace held natively; `columns()` builds the numpy columns on demand."""

    def columns(self) -> dict[str, Any]: ...

def convert_from_f32(
    dtype: str, bits: npt.NDArray[np.uint32], saturate: bool = False, out: npt.NDArray[np.uint32] | None = None
) -> npt.NDArray[np.uint32]: ...
def convert_to_f32(
    dtype: str, codes: npt.NDArray[np.uint32], out: npt.NDArray[np.float32] | None = None
) -> npt.NDArray[np.float32]: ...
def isa_opcodes() -> list[tuple[int, str]]: ...
def cost_params(timing: str | None = None) -> dict[str, Any]: ...
def hbm_stack(addr: int) -> int: ...
def constants() -> dict[str, int]: ...
def numerics_options() -> dict[str, dict[str, Any]]: ...
def get_num_threads() -> int: ...
def set_num_threads(n: int) -> None: ...
def set_min_parallel_work(n: int) -> None: ...
def simd_path() -> str: ...
def limit_simd(path: str | None = None) -> bool: ...
def fabric_params() -> dict[str, Any]: ...
def ultra_run(
    devices: list[Device],
    programs: list[tuple[int, Program]],
    check_races: bool = True,
    trace: bool = True,
    trace_limit: int = ...,
    latency_ns: float | None = None,
    link_bytes_per_ns: float | None = None,
    mesh_max_bytes: int | None = None,
    max_seconds: float | None = None,
    max_memory: int = ...,
    progress: Callable[[int, int | None, int], None] | None = None,
) -> dict[str, Any]: ...
def ultra_run_dist(
    devices: list[Device],
    programs: list[tuple[int, Program]],
    owner: list[int],
    me: int,
    procs: int,
    exchange: Callable[[npt.NDArray[np.uint8], list[int]], tuple[npt.NDArray[np.uint8], list[int]]],
    check_races: bool = True,
    trace: bool = True,
    trace_limit: int = ...,
    latency_ns: float | None = None,
    link_bytes_per_ns: float | None = None,
    mesh_max_bytes: int | None = None,
) -> dict[str, Any]: ...
