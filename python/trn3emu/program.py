"""The assembler: a Program collects the instructions of one core.

Every method of `AssemblerMixin` (one per nki.isa instruction, generated from isa/isa.toml) takes
NKI's operand names and appends one instruction; validation happens at once, in Rust, so a bad
operand raises where it is written. Synchronisation is automatic by default (`sync="auto"`: the
semaphores the data dependencies need are added at run time); `sync="manual"` leaves every wait
and signal to the author (`wait=[(sem, value)]`, `signal=[(sem, delta)]` or `signal=sem`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from . import _native
from ._asm import INSTRUCTIONS, AssemblerMixin
from .allocator import Allocator
from .errors import AddressError, ArgumentTypeError, MemorySpaceError, OperandError, SemaphoreError
from .tensor import MAX_FREE_DIMS, Reg, Tensor, _check_live, _index, _shape

# Hardware facts, from the Rust core.
PARTITIONS: int = _native.PARTITIONS
SBUF_PARTITION_BYTES: int = _native.SBUF_PARTITION_BYTES
PSUM_PARTITION_BYTES: int = _native.PSUM_PARTITION_BYTES
PSUM_BANK_BYTES: int = _native.PSUM_BANK_BYTES
NUM_REGISTERS: int = _native.NUM_REGISTERS
#: SBUF tiles start on this byte alignment (an allocator policy, not a hardware rule).
SBUF_ALIGN = 64


def _enum_name(v: Any) -> Any:
    if v is None or isinstance(v, (str, bool, int, float, tuple, list)):
        return v
    name = getattr(v, "name", None) or getattr(v, "__name__", None)
    return name if isinstance(name, str) else v


_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _params(opcode: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(operand names, operand kinds) of an instruction, from the generated ISA table."""
    p = _PARAMS.get(opcode)
    if p is None:
        params = INSTRUCTIONS.get(opcode, (0, (), ()))[2]
        p = _PARAMS[opcode] = (tuple(n for n, _k, _e in params), tuple(k for _n, k, _e in params))
    return p


_AP_CACHE: dict[tuple, Any] = {}


def _sync_list(v: Any, operand: str) -> list:
    """A `wait=` / `signal=` value as a list (a non-iterable is a SemaphoreError, not a TypeError).
    An object with `__getitem__` but no `__iter__` (a Tensor) is not iterable either: `list()`
    would index it 0, 1, 2, ... until IndexError (a tensor of 2**33 rows: a hang)."""
    try:
        if not hasattr(type(v), "__iter__"):
            raise TypeError
        return list(v)
    except TypeError:
        raise SemaphoreError(
            f"{operand}= takes (semaphore, value) pairs, got {v!r}", operand=operand, rule="sync_list_malformed"
        ) from None


def _ap_of(t: Tensor) -> Any:
    """`t.to_ap()`, memoised on the view's geometry (assembly loops reuse the same few views) as
    the native `AccessPattern` read from it (appends take it without reading the tuple again)."""
    if t.dyn is not None:
        return t.to_ap()
    shape, strides = t.shape, t.strides
    key = (t.mem, t.dtype, t.start, t.offset, shape, strides)
    ap = _AP_CACHE.get(key)
    if ap is None:
        if len(_AP_CACHE) > 4096:
            _AP_CACHE.clear()
        if t.mem == "hbm" and 2 <= len(shape) <= MAX_FREE_DIMS + 1:  # (`to_ap` of an HBM view, no dims to merge)
            tup = ("hbm", t.dtype, 0, shape[0], strides[0], t.offset, list(zip(strides[1:], shape[1:])))
        else:
            tup = t.to_ap()
        ap = _AP_CACHE[key] = _native.access_pattern(tup)
    return ap


class Program(AssemblerMixin):
    """Instructions for one NeuronCore. `Program(core=k)` targets core k; in an UltraServer
    `Program(chip=c, core=k)` targets core k of chip c (docs/ultraserver.md)."""

    def __init__(self, core: int = 0, sync: str = "auto", chip: int = 0) -> None:
        if sync not in ("auto", "manual"):
            raise OperandError(
                f"sync must be 'auto' or 'manual', got {sync!r}", operand="sync", rule="sync_mode_unknown"
            )
        chip = _index(chip, "chip")
        if not 0 <= chip < _native.MAX_CHIPS:
            raise OperandError(
                f"chip must be in 0..{_native.MAX_CHIPS} (chips of the largest UltraServer), got {chip}",
                operand="chip",
                rule="chip_out_of_range",
            )
        self._native = _native.Program(core)
        self.core = core
        self.chip = chip
        self.sync = sync
        self._sbuf = Allocator.sbuf()
        self._psum = Allocator.psum()
        self._next_sem = 0
        self._next_reg = 0
        self._synced: tuple[int, _native.Program] | None = None
        #: per `Hbm` whose tensors the program names (by its weak reference): the first use,
        #: (instruction index, opcode, operand index, tensor repr); UltraServer runs check the chip
        self._hbm_uses: dict[Any, tuple[int, str, int, str]] = {}

    # ------------------------------------------------------------------------------ multi-core
    @property
    def rank(self) -> int:
        """Rank of this core in its LNC=2 pair (cores 2i and 2i+1 are ranks 0 and 1): `nl.program_id(0)`."""
        return self.core % 2

    @property
    def global_core(self) -> int:
        """This core's id in an UltraServer's replica groups: chip * 8 + core."""
        return self.chip * _native.NUM_CORES + self.core

    @property
    def peer(self) -> int:
        """The other core of this core's LNC=2 pair (the partner of `sendrecv` and `core_barrier`)."""
        return self.core ^ 1

    @property
    def peer_rank(self) -> int:
        """The rank of `peer` (what `sendrecv` takes as `send_to_rank` / `recv_from_rank`)."""
        return 1 - self.rank

    # ------------------------------------------------------------------------------ allocation
    def _tile(self, mem: str, shape, dtype, address, name: str) -> Tensor:
        shape = _shape(shape)
        if len(shape) < 2:
            shape = shape + (1,)
        t = Tensor(mem, dtype, shape, name=name, core=self.core)
        if shape[0] > PARTITIONS:
            raise AddressError(
                f"{mem} tile {name or ''} spans {shape[0]} partitions (at most {PARTITIONS})",
                operand="shape",
                rule="tile_partitions_out_of_range",
            )
        nbytes = t.nbytes // shape[0]
        alloc = self._sbuf if mem == "sbuf" else self._psum
        label = repr(name) if name else str(shape)
        if address is None:
            t.offset = alloc.alloc(nbytes, label)[1]
        else:
            start, off = address if isinstance(address, (tuple, list)) else (0, address)
            start, off = _index(start, "address"), _index(off, "address")
            if start < 0:
                raise AddressError(
                    f"{mem} tile start partition {start} is negative",
                    operand="address",
                    rule="tile_partitions_out_of_range",
                )
            if mem == "psum" and off % PSUM_BANK_BYTES:
                raise AddressError(
                    f"PSUM tiles start on a {PSUM_BANK_BYTES}-byte bank boundary, address {off} is not",
                    operand="address",
                    rule="psum_tile_bank_alignment",
                )
            alloc.place(off, nbytes, label, error=AddressError)
            t.offset, t.start = int(off), int(start)
            if t.start + shape[0] > PARTITIONS:
                raise AddressError(
                    f"partitions {t.start}..{t.start + shape[0]} exceed {PARTITIONS}",
                    operand="address",
                    rule="tile_partitions_out_of_range",
                )
        if mem == "psum":
            self._native.psum_fresh(t.start, shape[0], t.offset, nbytes)
        return t

    def sbuf(self, shape, dtype, address=None, name: str = "") -> Tensor:
        """Allocate an SBUF tile (dim 0 = partitions). `address` = byte offset or (partition, byte offset)."""
        return self._tile("sbuf", shape, dtype, address, name)

    def psum(self, shape, dtype="float32", address=None, name: str = "") -> Tensor:
        """Allocate a PSUM tile (small tiles share a 2 KiB bank, never straddling one; larger ones start
        on a bank boundary); the next matmul with accumulate=None overwrites it."""
        return self._tile("psum", shape, dtype, address, name)

    def free(self, tile: Tensor) -> None:
        """Return a tile's bytes to its allocator (the view stays usable; reuse is the author's call)."""
        (self._sbuf if tile.mem == "sbuf" else self._psum).free_at(tile.offset)

    def semaphore(self) -> int:
        """A fresh semaphore id for manual synchronisation."""
        if self._next_sem >= _native.AUTO_SEM_BASE:
            raise SemaphoreError(
                f"out of semaphores (ids 0..{_native.AUTO_SEM_BASE - 1} are for programs)", rule="out_of_semaphores"
            )
        self._next_sem += 1
        return self._next_sem - 1

    def register_alloc(self, init: int | None = None, engine: Any = "sync") -> Reg:
        """A fresh register number (r0..r63, `NUM_REGISTERS` per engine); with `init`, a `register_move` on `engine` sets it
        there (each engine has its own 64 registers; use the register on the engine that set it)."""
        if self._next_reg >= NUM_REGISTERS:
            raise OperandError(
                f"out of registers ({NUM_REGISTERS} per engine sequencer)", operand="register", rule="out_of_registers"
            )
        r = Reg(self._next_reg)
        self._next_reg += 1
        if init is not None:
            self.register_move(dst=r, src=int(init), engine=engine)
        return r

    @contextlib.contextmanager
    def fori_loop(self, lower: int, upper: int, step: int = 1, engine: Any = "sync") -> Iterator[Reg]:
        """A runtime loop on one engine's stream (NKI's `nl.fori_loop`): the body assembled inside
        the `with` block runs for i = lower, lower + step, ... while i < upper (i > upper for a
        negative step); the yielded register holds i. The body must stay on `engine` (a branch
        jumps within its own engine's stream; DMAs it triggers may go anywhere). Programs with
        loops need `sync="manual"`.

            with p.fori_loop(0, 8, engine="sync") as i:
                p.dma_copy(dst=out.ap([[n, 1], [1, n]], scalar_offset=i), src=t, engine="sync")
        """
        lower, upper, step = int(lower), int(upper), int(step)
        if step == 0 or (upper - lower) * step <= 0:
            raise OperandError(
                f"fori_loop({lower}, {upper}, {step}) would run zero times or never end",
                operand="step",
                rule="fori_loop_empty_or_endless",
            )
        eng = _enum_name(engine)
        i = self.register_alloc(lower, engine=eng)
        top = len(self)
        yield i
        for k in range(top, len(self)):
            if self._native.instruction_engine(k) != eng:
                head = self.instruction(k).split(" ", 1)[0]
                raise OperandError(
                    f"fori_loop body instruction #{k} `{head}` is not on the loop's engine {eng}",
                    operand="engine",
                    rule="fori_loop_engine_mismatch",
                )
        self.register_op(dst=i, src=i, op="add", imm=step, engine=eng)
        self.branch(target=top, cmp="lt" if step > 0 else "gt", reg=i, imm=upper, engine=eng)

    def _check_chip(self, chips: list) -> None:
        """In an UltraServer run (`chips`: its devices): every HBM tensor the program names must
        be its own chip's (data moves between chips only through collectives)."""
        if not self._hbm_uses:
            return
        mine = chips[self.chip].hbm
        for ref, (k, opcode, i, what) in self._hbm_uses.items():
            hbm = ref()
            if hbm is None or hbm is mine:
                continue
            names = _params(opcode)[0]
            operand = names[i] if i < len(names) else f"#{i}"
            whose = next((f"chip {c}'s" for c, d in enumerate(chips) if d.hbm is hbm), "another device's")
            raise MemorySpaceError(
                f"instruction #{k} {opcode} operand {operand}: HBM tensor {what} is {whose} HBM, this program "
                f"runs on chip {self.chip}; chips exchange data only through collectives",
                operand=operand,
                rule="hbm_tensor_wrong_chip",
            )

    # -------------------------------------------------------------------------------- assembly
    def _emit(self, opcode: str, engine: Any, name: Any, wait: Any, signal: Any, args: tuple) -> int:
        # The hot path of assembly: plain Python per operand, one native call per instruction
        # (which parses, validates and appends; errors name the instruction and operand).
        if opcode == "register_move" and len(args) == 2 and isinstance(args[1], Reg):
            # NKI's register_move also copies a register: that is register_op(add, 0).
            return self._emit("register_op", engine, name, wait, signal, (args[0], args[1], "add", 0))
        conv = []
        append = conv.append
        new_uses = None  # HBM allocators this program names for the first time
        for i, a in enumerate(args):
            ta = type(a)
            if ta is str or ta is float or a is None or ta is bool or ta is int:
                append(a)
            elif isinstance(a, Tensor):
                if a.core is not None and a.core != self.core:
                    what = "private HBM tensor" if a.mem == "hbm" else "tile"
                    raise MemorySpaceError(
                        f"{opcode}: {what} {a!r} belongs to core {a.core}, this program runs on core {self.core}",
                        rule="core_private_memory",
                    )
                blk = a.block
                if blk is not None:
                    if not blk.live:
                        _check_live(a)
                    try:
                        known = blk._owner in self._hbm_uses
                    except TypeError:  # a weak reference first hashed after its device is gone
                        known = True
                    if not known:
                        new_uses = [*(new_uses or ()), (blk._owner, i, a)]
                append(_ap_of(a))
            elif isinstance(a, Reg):
                names, kinds = _params(opcode)
                if i < len(kinds) and kinds[i] not in ("reg", "i32_or_reg"):
                    raise OperandError(
                        f"{opcode}: operand {names[i]} takes a {kinds[i]}, not register {a!r}",
                        operand=names[i],
                        rule="register_not_allowed",
                    )
                # "rN" tells a register from an integer immediate in an i32_or_reg operand.
                append(f"r{a.index}" if i < len(kinds) and kinds[i] == "i32_or_reg" else a.index)
            else:
                append(_enum_name(a))
        if wait:
            if isinstance(wait, tuple) and len(wait) == 2 and all(isinstance(x, int) for x in wait):
                wait = [wait]
            wait = _sync_list(wait, "wait")
        else:
            wait = []
        if isinstance(signal, int):
            signal = [(signal, 1)]
        elif not signal:
            signal = []
        elif isinstance(signal, tuple) and len(signal) == 2 and all(isinstance(x, int) for x in signal):
            signal = [signal]
        else:
            signal = _sync_list(signal, "signal")
        if engine is not None and type(engine) is not str:
            engine = _enum_name(engine)
        k = self._native.append(opcode, engine, tuple(conv), wait, signal, name)
        if new_uses:
            for owner, i, a in new_uses:
                self._hbm_uses.setdefault(owner, (k, opcode, i, repr(a)))
        return k

    # ----------------------------------------------------------------------------- text/binary
    def __len__(self) -> int:
        return len(self._native)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and self._native == other._native

    def __repr__(self) -> str:
        chip = f"chip={self.chip} " if self.chip else ""
        return f"<Program {chip}core={self.core} sync={self.sync} instructions={len(self)}>"

    def instruction(self, i: int) -> str:
        """Text of instruction `i`."""
        t = self._native.instruction_text(i)
        if t is None:
            raise IndexError(i)
        return t

    def native(self) -> _native.Program:
        """The program that runs: with automatic semaphores when sync='auto' (computed once per
        program length: instructions are only ever appended, so repeated runs reuse it)."""
        if self.sync != "auto":
            return self._native
        n = len(self._native)
        cached = getattr(self, "_synced", None)
        if cached is None or cached[0] != n:
            cached = self._synced = (n, self._native.synced())
        return cached[1]

    def to_text(self, synced: bool = False) -> str:
        """Text assembly (round-trips through `from_text`); `synced=True` shows the added semaphores."""
        return (self.native() if synced else self._native).to_text()

    def encode(self, synced: bool = False) -> bytes:
        """Binary encoding (docs/encoding.md); round-trips through `decode`."""
        return (self.native() if synced else self._native).encode()

    @classmethod
    def _wrap(cls, nat: _native.Program, sync: str) -> Program:
        p = cls.__new__(cls)
        p._native, p.core, p.sync = nat, nat.core, sync
        p._sbuf = Allocator.sbuf()
        p._psum = Allocator.psum()
        p._next_sem = 0
        p._next_reg = 0
        p._synced = None
        p._hbm_uses = {}
        return p

    @classmethod
    def from_text(cls, text: str, sync: str = "manual") -> Program:
        if isinstance(text, str) and text.startswith("\ufeff"):
            text = text[1:]  # a UTF-8 byte-order mark (editors on Windows save one) is not text
        return cls._wrap(_native.Program.from_text(text), sync)

    @classmethod
    def decode(cls, data: bytes, sync: str = "manual") -> Program:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            # bytes(n) of an int would make n zero bytes (2**40: a MemoryError; -1: a ValueError)
            raise ArgumentTypeError(
                f"Program.decode takes bytes, got {type(data).__name__}", operand="data", rule="bytes_expected"
            )
        return cls._wrap(_native.Program.decode(bytes(data)), sync)
