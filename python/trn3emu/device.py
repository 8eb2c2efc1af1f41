"""The device: 8 NeuronCores sharing 144 GiB of (sparsely backed) HBM."""

from __future__ import annotations

import bisect
import warnings
from typing import Any

import numpy as np

from . import _native, interop
from . import progress as _progress
from .dtypes import dtype_name, numpy_dtype
from .errors import (
    AddressError,
    ArgumentTypeError,
    CapacityError,
    DtypeError,
    IdenticalWritesWarning,
    OperandError,
    ResourceError,
    ShapeError,
)
from .program import Program
from .tensor import HbmBlock, Tensor, _check_live, _index, _name, _shape
from .trace import RunResult

HBM_BYTES: int = _native.HBM_BYTES
#: HBM tensors placed automatically start on this byte alignment (an allocator policy).
HBM_ALIGN = 64
#: The numerics options of `Device(...)`: names, allowed values, defaults (from the Rust core).
NUMERICS_OPTIONS: dict[str, dict[str, Any]] = _native.numerics_options()
_DEFAULT = {name: o["default"] for name, o in NUMERICS_OPTIONS.items()}


def _program_list(programs: Any) -> list[Program]:
    """`Device.run`'s argument as a list of Programs (anything else raises ArgumentTypeError)."""
    try:
        progs = list(programs)
    except TypeError:
        progs = [programs]
    for p in progs:
        if not callable(getattr(p, "native", None)):  # a Program (or one of the NKI front end's)
            raise ArgumentTypeError(
                f"Device.run takes a Program or a list of Programs, got {p!r}",
                operand="programs",
                rule="program_expected",
            )
    return progs


def _block_lo(b: HbmBlock) -> int:
    return b.lo


def _seconds(v: Any) -> float:
    """A time limit in seconds: a real number >= 0 (not a bool or a string)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(
            f"max_seconds must be a number of seconds, got {v!r}", operand="max_seconds", rule="seconds_expected"
        )
    if not v >= 0:
        raise OperandError(f"max_seconds must be >= 0, got {v!r}", operand="max_seconds", rule="int_out_of_range")
    return float(v)


def _nonnegative(v: Any, what: str, hi: int | None = None) -> int:
    """An integer argument in 0..=hi (hi: the widest value the binding takes, e.g. 2^64-1)."""
    n = _index(v, what)
    if n < 0 or (hi is not None and n > hi):
        bound = ">= 0" if hi is None else f"in 0..={hi}"
        raise OperandError(f"{what} must be {bound}, got {n}", operand=what, rule="int_out_of_range")
    return n


#: The widest count / byte limit the native binding takes (a u64).
_U64_MAX = (1 << 64) - 1


class Hbm:
    """Device HBM: put arrays in, allocate outputs, get arrays back.

    Arrays may be numpy, torch CPU tensors, JAX arrays or anything with `__dlpack__` / `__array__`
    (`trn3emu.interop`); `get` answers in the framework of the array `put` copied in (else numpy).
    """

    def __init__(self, native: _native.Device) -> None:
        self._native = native
        self._live: list[HbmBlock] = []  # live allocations, sorted by start address
        self._top = 0  # aligned end of the highest live allocation
        self._holes = False  # whether a free or an explicit placement may have left a gap below _top

    def _auto_address(self, nbytes: int, base: int = 0) -> int:
        """First fit from `base`: the lowest aligned address at or above it whose range overlaps
        no live allocation."""
        if not self._holes and base <= self._top:
            return self._top
        pos, need = base, max(nbytes, 1)
        for b in self._live:
            if b.hi <= pos:
                continue
            if b.lo - pos >= need:
                break
            pos = max(pos, -(-b.hi // HBM_ALIGN) * HBM_ALIGN)
        return pos

    def _place(self, nbytes: int, address: int | None, alias: bool = False, core: int | None = None) -> HbmBlock:
        auto = address is None
        if auto:
            # A core's private tensor goes on its own chiplet's HBM stacks (the upper half of the
            # address space for chiplet 1, docs/cost-model.md), so reaching it costs no die crossing.
            base = 0 if core is None else core * _native.CHIPLETS // Device.NUM_CORES * (HBM_BYTES // _native.CHIPLETS)
            address = self._auto_address(nbytes, base)
            if base and address + nbytes > HBM_BYTES:  # its chiplet's half is full: anywhere
                address = self._auto_address(nbytes)
        else:
            address = _index(address, "address")
        if address < 0 or address + nbytes > HBM_BYTES:
            msg = f"HBM bytes {address}..{address + nbytes} exceed the {HBM_BYTES >> 30} GiB address space"
            if address < 0:
                raise AddressError(msg, operand="address", rule="hbm_out_of_range")
            raise CapacityError(msg, operand="address", rule="hbm_capacity")
        if not auto and not alias:
            for b in self._live:
                if b.lo < address + nbytes and address < b.hi:
                    raise AddressError(
                        f"HBM bytes {address}..{address + nbytes} overlap the live tensor {b.label} at "
                        f"{b.lo}..{b.hi}; free it first, or pass alias=True to share its bytes on purpose",
                        operand="address",
                        rule="hbm_overlap",
                    )
        # Only a placement that succeeds changes the allocator: a refused one leaves it as it was.
        block = HbmBlock(self, address, address + nbytes)
        bisect.insort(self._live, block, key=_block_lo)
        if auto and not self._holes and address == self._top:
            self._top = -(-(address + max(nbytes, 1)) // HBM_ALIGN) * HBM_ALIGN
        else:
            self._holes = True
            self._top = max(self._top, -(-(address + max(nbytes, 1)) // HBM_ALIGN) * HBM_ALIGN)
        return block

    def alloc(
        self,
        shape,
        dtype: Any,
        address: int | None = None,
        name: str = "",
        core: int | None = None,
        alias: bool = False,
    ) -> Tensor:
        """Reserve an HBM tensor (zeros unless written); `address` places it explicitly.

        HBM is shared by every core; `core=k` makes the tensor private to core k (another core's
        program naming it raises MemorySpaceError at assembly) and places it automatically on
        core k's chiplet (Trainium3: cores 4-7 on the upper half's HBM stacks); other automatic
        placements start at address 0, on chiplet 0's stacks.

        Automatic placement (first fit, 64-byte aligned) never overlaps a live tensor, including
        ones placed at an explicit `address`. An explicit `address` over a live tensor raises
        AddressError (`hbm_overlap`) unless `alias=True` asks for the shared bytes on purpose.
        `free(t)` returns the bytes (or use `with dev.hbm.alloc(...) as t:` to free at the end).
        """
        shape = _shape(shape) or (1,)  # a 0-d shape holds one element, as in put() and sbuf()
        if core is not None and not 0 <= _index(core, "core") < Device.NUM_CORES:
            raise AddressError(
                f"core {core} is not a core of the device (0..{Device.NUM_CORES - 1})",
                operand="core",
                rule="tensor_core_out_of_range",
            )
        t = Tensor("hbm", dtype, shape, name=_name(name), core=core)
        block = self._place(t.nbytes, address, alias, core)
        t.offset = block.lo  # (before the label: it names the tensor's address)
        block.label = repr(t)
        t.block = block
        return t

    def free(self, t: Tensor) -> None:
        """Return the bytes of the HBM allocation `t` (or a view of it) belongs to; later
        automatic placements may reuse them. Using `t` or any view of it afterwards (`get`,
        `put`, `write`, an instruction) raises AddressError (`hbm_use_after_free`); freeing it
        again raises AddressError (`hbm_double_free`)."""
        block = t.block if isinstance(t, Tensor) else None
        if block is None or block.owner is not self:
            raise AddressError(
                f"hbm.free needs a tensor allocated by this device's hbm, got {t!r}",
                operand="t",
                rule="hbm_free_not_allocated",
            )
        if not block.live:
            raise AddressError(f"{block.label} was already freed", operand="t", rule="hbm_double_free")
        block.live = False
        i = bisect.bisect_left(self._live, block.lo, key=_block_lo)
        while i < len(self._live) and self._live[i] is not block:
            i += 1
        if i < len(self._live):  # (a block placed before `_reset` is no longer tracked)
            del self._live[i]
        self._holes = True
        if not self._live:
            self._top, self._holes = 0, False

    def _reset(self) -> None:
        """Placement as on a new device (the NKI spare device): forget every allocation."""
        self._live, self._top, self._holes = [], 0, False

    def put(
        self,
        array,
        dtype: Any = None,
        address: int | None = None,
        name: str = "",
        core: int | None = None,
        alias: bool = False,
    ) -> Tensor:
        """Copy an array into HBM. `dtype` reinterprets raw words (e.g. uint32 as float8_e4m3fn_x4).

        `array`: numpy, a torch CPU tensor, a JAX array, or anything with `__dlpack__` /
        `__array__`; bf16 and fp8 are copied bit-exactly. `get` of the tensor (and of its views)
        returns that framework's type.
        """
        a = np.ascontiguousarray(interop.to_numpy(array, "array"))
        name_ = dtype_name(a.dtype) if dtype is None else dtype_name(dtype)
        if a.dtype.itemsize != numpy_dtype(name_).itemsize:
            raise DtypeError(
                f"array of {a.dtype} cannot carry {name_} ({numpy_dtype(name_).itemsize}-byte words)",
                operand="dtype",
                rule="array_itemsize_mismatch",
            )
        t = self.alloc(a.shape if a.ndim else (1,), name_, address, name, core, alias)
        self._native.hbm_write(t.offset, a.reshape(-1).view(np.uint8))
        fw = interop.framework(array)
        t.framework = fw if fw in ("torch", "jax") else None
        return t

    def write(self, t: Tensor, array) -> None:
        """Overwrite an HBM tensor (a contiguous view) with `array` (any array `put` takes; cast
        with numpy if needed)."""
        if t.mem != "hbm" or not t.is_contiguous():
            raise ShapeError(f"write needs a contiguous HBM tensor, got {t!r}", rule="hbm_tensor_expected")
        _check_live(t)
        a = interop.to_numpy(array, "array")
        if a.dtype.kind not in "biufV":  # strings, objects, dates, complex: no value to cast
            raise DtypeError(
                f"hbm.write of a {a.dtype} array into a {t.dtype} tensor: only numeric arrays can be written",
                operand="array",
                rule="dtype_unknown",
            )
        a = np.ascontiguousarray(a.astype(numpy_dtype(t.dtype), copy=False))
        if a.size != t.size:
            raise ShapeError(f"array has {a.size} elements, tensor {t!r} has {t.size}", rule="array_size_mismatch")
        self._native.hbm_write(t.offset, a.reshape(-1).view(np.uint8))

    def get(self, t: Tensor, like: Any = None) -> Any:
        """The tensor's contents as a new array (ml_dtypes for bf16/fp8; raw words for x4).

        The array is of the framework of `like` (an array) if given, else of the array `put`
        copied into `t` (torch in, torch out; JAX in, JAX out), else numpy.
        """
        fw = t.framework if like is None else interop.framework(like)
        a = self._get(t)
        return a if fw in (None, "numpy") else interop.from_numpy(a, fw)

    def _get(self, t: Tensor) -> np.ndarray:
        if t.mem != "hbm":
            raise ShapeError(
                f"hbm.get needs an HBM tensor, got {t!r}; use Device.read for tiles", rule="hbm_tensor_expected"
            )
        _check_live(t)
        es = t.itemsize
        lo = hi = 0
        for n, st in zip(t.shape, t.strides):
            span = (n - 1) * st
            lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
        if t.offset + lo * es < 0:
            raise AddressError(
                f"{t!r} reaches below HBM address 0 (byte {t.offset + lo * es})",
                operand="tensor",
                rule="hbm_out_of_range",
            )
        nbytes = (hi - lo + 1) * es
        try:
            raw = np.empty(nbytes, np.uint8)  # (numpy's allocation: huge pages for large results)
        except MemoryError:
            raise ResourceError(
                f"cannot allocate {nbytes} bytes of host memory for an HBM read", rule="host_allocation_failed"
            ) from None
        self._native.hbm_read_into(t.offset + lo * es, raw)
        dt = numpy_dtype(t.dtype)
        if t.is_contiguous():
            return raw.view(dt).reshape(t.shape)  # a fresh buffer of exactly the tensor's bytes
        view = np.ndarray(t.shape, dt, raw.data, offset=-lo * es, strides=[s * es for s in t.strides])
        return view.copy()

    def holds(self, t: Tensor, array: np.ndarray) -> bool:
        """Whether the contiguous HBM tensor `t` holds exactly the bytes of `array` (no copies)."""
        _check_live(t)
        a = np.ascontiguousarray(interop.to_numpy(array, "array"))
        return self._native.hbm_equals(t.offset, a.reshape(-1).view(np.uint8))

    @property
    def resident_bytes(self) -> int:
        """Host memory backing HBM (1 MiB pages touched so far)."""
        return self._native.hbm_resident_bytes()


class Device:
    """One Trainium3: `run` programs on its cores; `hbm` moves data in and out."""

    NUM_CORES: int = _native.NUM_CORES

    def __init__(
        self,
        rounding: str | None = None,
        seed: int | None = None,
        sr_bits: int = _DEFAULT["sr_bits"],
        fp8_overflow: str = _DEFAULT["fp8_overflow"],
        mx_scale: str = _DEFAULT["mx_scale"],
        timing: str | None = None,
    ) -> None:
        """Numerics options (docs/numerics.md):

        - `rounding`: "rne" (default) or "stochastic" for every fp32 -> bf16/fp16/tf32/fp8 output
          cast of the compute engines and bf16 PSUM writes. None follows the Neuron runtime's
          `NEURON_RT_STOCHASTIC_ROUNDING_EN` environment variable (off when unset).
        - `seed`: stochastic-rounding seed, also the RNG power-on seed; None follows
          `NEURON_RT_STOCHASTIC_ROUNDING_SEED` (0 when unset).
        - `sr_bits`: random bits per stochastic-rounding decision (1..32).
        - `fp8_overflow`: "ieee" (ml_dtypes: e4m3/e5m2 -> Inf, e4m3fn -> NaN) or "saturate" (±max).
        - `mx_scale`: `quantize_mx` scale rule, "nki" (NKI 0.6: 2x the OCP scale) or "ocp".

        `NUMERICS_OPTIONS` (module attribute) lists every option with its values and default.

        `timing`: whose published constants (clocks, data-path widths, PE modes, DMA rates, HBM
        bandwidth) time the runs: "trn1", "trn2" or "trn3" (default; None follows the
        `TRN3EMU_TIMING` environment variable). Functional behaviour stays NeuronCore-v4
        whatever the timing (docs/cost-model.md, "Generation constants").
        """
        self._native = _native.Device(rounding, seed, sr_bits, fp8_overflow, mx_scale, timing)
        self.hbm = Hbm(self._native)

    @property
    def numerics(self) -> dict[str, Any]:
        """The numerics configuration in effect (after environment variables and arguments)."""
        return dict(self._native.numerics())

    @property
    def timing(self) -> str:
        """The generation whose published constants time this device's runs."""
        return self._native.timing

    @property
    def max_executed(self) -> int:
        """Units of work one run may spend before it stops with `RunawayError` (a runaway loop):
        one per instruction and transfer, plus one per 2048 bytes it touches in a program with
        branches; default 2**26 (5-15 s of host time for a loop of any shape). Settable."""
        return self._native.max_executed

    @max_executed.setter
    def max_executed(self, n: int) -> None:
        self._native.max_executed = n

    def programs(self, cores=None, sync: str = "auto") -> list[Program]:
        """One empty Program per core (default: all 8), for a multi-core `run`.

        `p.rank`, `p.peer` and `p.peer_rank` give each program its LNC=2 position; collectives take
        the replica group as `cores=[...]` (default: every core, rank = position in the list).
        """
        cores = range(self.NUM_CORES) if cores is None else cores
        return [Program(core=int(c), sync=sync) for c in cores]

    def run(
        self,
        programs: Program | list[Program],
        check_races: bool = True,
        trace: bool = True,
        progress: bool | None = None,
        trace_limit: int | None = None,
        identical_writes: bool = False,
        max_seconds: float | None = None,
        max_memory: int | None = None,
    ) -> RunResult:
        """Run one program, or one per core concurrently. Releases the GIL while running.

        Ctrl-C stops the run within a few tens of ms (`KeyboardInterrupt`; the device stays
        usable). A run that lasts over 2 s shows a progress bar (instructions and transfers done
        of the total, emulated time) when `progress` is True, or when it is None (the default),
        stderr is a terminal and `TRN3EMU_PROGRESS` is not "0" (docs/limits.md). A run stops
        with `RunawayError` after `max_executed` instructions and transfers. The trace keeps at
        most `trace_limit` records (default `TRACE_LIMIT`, 2^21); items past it run untraced and
        are counted in `RunResult.trace_dropped`. With `identical_writes`, unordered writes of
        identical bytes to the same HBM from different cores are not races: each is an
        `IdenticalWritesWarning` naming both instructions (`RunResult.identical_writes`); the race
        stays an error when the bytes differ or a read is involved. `max_seconds` (default None: no limit) stops
        the run with `RunawayError` (`run_time_limit`) after that much host time; `max_memory`
        (default 32 GiB or half the host's physical memory, whichever is less) bounds the host memory the run adds to HBM's backing and
        any one buffer sized by its operands (`ResourceError`, `run_memory_limit`).
        """
        return _warn_identical(
            self._run(programs, check_races, trace, progress, trace_limit, identical_writes, max_seconds, max_memory)
        )

    def _run(
        self,
        programs,
        check_races: bool = True,
        trace: bool = True,
        progress: bool | None = None,
        trace_limit: int | None = None,
        identical_writes: bool = False,
        max_seconds: float | None = None,
        max_memory: int | None = None,
    ) -> RunResult:
        """`run` without the `IdenticalWritesWarning` (NKI launches issue it at the kernel line)."""
        limit = {} if trace_limit is None else {"trace_limit": _nonnegative(trace_limit, "trace_limit", _U64_MAX)}
        if identical_writes:
            limit["identical_writes"] = True
        if max_seconds is not None:
            limit["max_seconds"] = _seconds(max_seconds)
        if max_memory is not None:
            limit["max_memory"] = _nonnegative(max_memory, "max_memory", _U64_MAX)
        progs = [programs] if isinstance(programs, Program) else _program_list(programs)
        natives = [p.native() for p in progs]
        if progress is not None and not progress:
            return RunResult(self._native.run(natives, check_races, trace, **limit), natives)
        # The default (None) decides whether a bar is wanted only if the run lasts DELAY_S.
        bar = _progress.RunProgress(auto=progress is None)
        try:
            raw = self._native.run(natives, check_races, trace, bar, **limit)
            bar.finish(raw["executed"], raw["end_ps"])
        finally:
            bar.close()
        return RunResult(raw, natives)

    def read(self, tile: Tensor) -> np.ndarray:
        """A tile's contents (SBUF/PSUM of its core, or HBM) as a numpy array, for debugging."""
        if tile.mem == "hbm":
            return self.hbm._get(tile)
        es = tile.itemsize
        core = tile.core or 0
        shape, strides = tile.shape[1:], tile.strides[1:]
        lo = hi = 0
        for n, st in zip(shape, strides):
            span = (n - 1) * st
            lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
        nbytes = (hi - lo + 1) * es
        raw = self._native.onchip_read(core, tile.mem, tile.start, tile.shape[0], tile.offset + lo * es, nbytes)
        dt = numpy_dtype(tile.dtype)
        view = np.ndarray(tile.shape, dt, raw.data, offset=-lo * es, strides=[nbytes] + [s * es for s in strides])
        return view.copy()

    def fill_onchip(self, byte: int) -> None:
        """Fill every SBUF and PSUM byte (e.g. 0xFF makes uninitialised float reads NaN)."""
        self._native.fill_onchip(byte)


def _warn_identical(result: RunResult) -> RunResult:
    """One `IdenticalWritesWarning` per run that found benign cross-core write overlaps: the
    first one's message, and how many more `RunResult.identical_writes` lists."""
    found = result.identical_writes
    if found:
        more = f" (and {len(found) - 1} more: RunResult.identical_writes)" if len(found) > 1 else ""
        warnings.warn(found[0] + more, IdenticalWritesWarning, stacklevel=3)
    return result
