"""NKI virtual registers (`nisa.register_alloc`, `register_move`, `register_load`, `register_store`)
on the core's per-engine sequencer registers.

Each engine has its own 64 registers and an instruction reads the registers of the engine that
executes it. A `VirtualRegister` is one register number; its value is written on one home engine
(`sync`) and copied, when an instruction on another engine reads it (an `iota` offset on GpSimd,
a DMA triggered from another queue, a `.ap(scalar_offset=reg)` view), through a 1x1 int32 SBUF
scratch tile (`register_store` on the home engine, `register_load` on the reader): automatic
synchronisation orders that copy like any other data dependency.

Registers hold values known only on the device: Python control flow on them (`while reg:`,
`int(reg)`, `range(reg)`) raises "not supported".

Device loops (`nl.dynamic_range`, `nl.fori_loop` / `nl.while_loop` with register bounds or
conditions) are not compiled to `branch` instructions (automatic synchronisation assumes every
instruction runs once). Instead `device_value` ends the program traced so far, runs it on the
device, reads the register there, and tracing continues in a new program with the loop unrolled
to the trip count the device computed (a host round trip per loop bound / condition). Results are
those of the device loop; the trace shows one run per segment. Memories persist across runs;
live virtual registers are saved to their scratch tiles and reloaded, but PSUM matmul first-write
state and activation accumulators start fresh in each segment (as for any new run). Single-program
launches only (a grid's programs would need to stop together).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from .._asm import INSTRUCTIONS
from ..errors import OperandError
from ..tensor import Reg
from . import engine_choice, value_reuse
from ._kernel import DTYPES, KernelProgram, NkiTensor, current, not_supported, upcalls

HOME = "sync"


class VirtualRegister(Reg):
    """A register number plus the engines whose copy holds its current value."""

    # bound: the one engine an NkiScalar loaded with `engine=` lives on (scalars.py), else None
    __slots__ = ("valid", "scratch", "ctx", "bound", "__weakref__")

    def __bool__(self):
        raise not_supported(
            "a register value in Python control flow",
            "register values exist only on the device while it runs",
            rule="nki_register_value",
        )

    def __int__(self):
        raise not_supported(
            "int() of a register", "register values exist only on the device while it runs", rule="nki_register_value"
        )

    __index__ = __int__

    def __repr__(self) -> str:
        return f"<VirtualRegister r{self.index}>"


def _registry(ctx) -> weakref.WeakValueDictionary:
    """Register number -> the live VirtualRegister holding it. Weak: an NkiScalar that dies gives
    its number back (scalars.py); `register_alloc`'s registers are kept alive in `ctx.vreg_keep`."""
    regs = getattr(ctx, "vregs", None)
    if regs is None:
        regs = ctx.vregs = weakref.WeakValueDictionary()
        ctx.vreg_keep = []
    return regs


def register_alloc(x: Any = None) -> VirtualRegister:
    """A new virtual register, optionally initialised from an int, a register or a 1-element tensor."""
    ctx = current()
    r = ctx.program.register_alloc()
    v = VirtualRegister(r.index)
    v.valid, v.scratch, v.ctx, v.bound = set(), None, ctx, None
    _registry(ctx)[v.index] = v
    ctx.vreg_keep.append(v)
    if isinstance(x, NkiTensor):
        register_load(v, x)
    elif x is not None:
        register_move(v, x)
    return v


def _check(dst, what: str) -> VirtualRegister:
    if not isinstance(dst, VirtualRegister):
        raise OperandError(
            f"{what}: dst must be a register from nisa.register_alloc, got {dst!r}",
            operand="dst",
            rule="nki_register_dst",
        )
    return dst


def _call(op: str, **tiles) -> dict:
    """The kernel IR's call of `nisa.op` (these calls append to the program themselves, past the
    `nki.isa` wrapper that records the others): `tiles` are its tile operands (`dst` written);
    returns them as the IR pass hands them back (a spilled tile's view moved to where it is)."""
    ctx = current()
    if ctx.ir is None:
        return tiles
    _, kw = ctx.ir.call(ctx, (), tiles, op, (), _WRITES)
    return kw


_WRITES = frozenset(("dst",))


def register_move(dst, src=None, imm=None, name=None):
    """dst = an integer constant or another register's value (on the home engine)."""
    dst = _check(dst, "register_move")
    _call("register_move")
    src = imm if src is None else src
    if isinstance(src, VirtualRegister):
        ensure_on(src, HOME)
        current().program.register_move(dst=dst, src=Reg(src.index), engine=HOME, name=name)
    else:
        current().program.register_move(dst=dst, src=int(src), engine=HOME, name=name)
    dst.valid = {HOME}


def register_load(dst, src, name=None):
    """dst = the single 32-bit value of `src` (SBUF or HBM, 1 element)."""
    dst = _check(dst, "register_load")
    src = _call("register_load", src=src)["src"]
    current().program.register_load(dst=Reg(dst.index), src=src.tensor, engine=HOME, name=name)
    dst.valid = {HOME}


def register_store(dst, src, name=None):
    """The register's value -> the 1-element tensor `dst`."""
    src = _check(src, "register_store")
    dst = _call("register_store", dst=dst)["dst"]
    ensure_on(src, HOME)
    current().program.register_store(dst=dst.tensor, src=Reg(src.index), engine=HOME, name=name)


def ensure_on(v: VirtualRegister, engine: str) -> None:
    """Make engine's copy of v current (store on an engine holding it, load on `engine`)."""
    if engine in v.valid:
        return
    bound = getattr(v, "bound", None)
    if bound is not None:
        raise OperandError(
            f"{v!r} was loaded with engine={bound!r} and lives on that sequencer only; an instruction "
            f"on {engine!r} reads it (issue the instruction on {bound!r}, or load the scalar without engine=)",
            operand="scalar",
            rule="nki_scalar_engine",
        )
    if not v.valid:
        raise OperandError(
            f"register r{v.index} is read before any value was written to it",
            operand="register",
            rule="nki_register_unset",
        )
    prog = v.ctx.program
    if v.scratch is None:
        v.scratch = upcalls.ndarray((1, 1), DTYPES["int32"], buffer="sbuf", name=f"vreg{v.index}")
    src_engine = HOME if HOME in v.valid else next(iter(sorted(v.valid)))
    prog.register_store(dst=v.scratch.tensor, src=Reg(v.index), engine=src_engine)
    prog.register_load(dst=Reg(v.index), src=v.scratch.tensor, engine=engine)
    v.valid.add(engine)


def prepare(ctx, opname: str, call: dict) -> None:
    """Before `opname` is emitted with `call`: bring every register it reads up to date on the
    engine that will execute it (the given engine, else the instruction's default engine)."""
    regs = ctx.vregs
    eng = call.get("engine")
    unpinned = eng in (None, "unknown")
    if unpinned:
        eng = INSTRUCTIONS[opname][1][0]
    read = False
    for k, v in list(call.items()):
        if isinstance(v, VirtualRegister):
            ensure_on(v, eng)
            call[k] = Reg(v.index)
            read = True
        else:
            dyn = getattr(v, "dyn", None)
            if dyn is not None and dyn[0] == "s" and isinstance(dyn[1], int) and dyn[1] in regs:
                ensure_on(regs[dyn[1]], eng)
                read = True
    if read and unpinned:
        # the register is current on `eng` only: an unpinned DMA must not move to another queue
        # (a run-time offset of an SBUF view read from a register_alloc / scalar_load register)
        call["engine"] = eng


def device_value(v) -> int:
    """The value register `v` holds at this point of the kernel, computed by running the program
    traced so far (see the module doc); tracing continues in a fresh program."""
    if not isinstance(v, VirtualRegister):
        return int(v)
    ctx = v.ctx
    if math.prod(ctx.launch.grid) != 1:
        raise not_supported(
            "a loop bound or condition read from a register in a multi-program launch",
            "the emulator reads it by running the program traced so far; only single-program launches",
            rule="nki_register_read_multiprogram",
        )
    regs = ctx.vregs
    for r in list(regs.values()):  # save every live register: registers start fresh in a new run
        if r.valid:
            if r.scratch is None:
                r.scratch = upcalls.ndarray((1, 1), DTYPES["int32"], buffer="sbuf", name=f"vreg{r.index}")
            src = HOME if HOME in r.valid else next(iter(sorted(r.valid)))
            ctx.program.register_store(dst=r.scratch.tensor, src=Reg(r.index), engine=src)
    if v.scratch is None:
        raise OperandError(
            f"register r{v.index} is read before any value was written to it",
            operand="register",
            rule="nki_register_unset",
        )
    # The trace now depends on device data: a cache of traced programs must not replay it.
    ctx.launch.kernel.device_dependent = True
    options = ctx.launch.kernel.options
    engine_choice.run(ctx)  # (the pass over the kernel IR decides this segment's engines before it runs)
    value_reuse.run(ctx, last=False)  # (repeats dropped before the segment runs)
    result = ctx.device.run(
        [ctx.program], check_races=True, trace=options.get("trace", True), progress=options.get("progress")
    )
    if not hasattr(ctx, "segments"):
        ctx.segments = []
    ctx.segments.append((ctx.program, result))
    value = int(np.asarray(ctx.device.read(v.scratch.tensor)).reshape(-1)[0])
    if getattr(v, "dtype", None) == "uint32":  # (an unsigned NkiScalar: the scratch tile holds its bits)
        value &= 0xFFFFFFFF
    old = ctx.program
    ctx.program = KernelProgram(core=ctx.core)
    ctx.program._next_reg = old._next_reg  # register numbers stay allocated across segments
    if ctx.ir is not None and hasattr(ctx.ir, "segment"):
        ctx.ir.segment += 1  # (the kernel IR's calls from now on are in the next program)
    engine_choice.configure(ctx)  # (every segment balances its unpinned instructions)
    for r in list(regs.values()):
        if r.valid:
            eng = getattr(r, "bound", None) or HOME  # (a bound NkiScalar stays on its engine)
            ctx.program.register_load(dst=Reg(r.index), src=r.scratch.tensor, engine=eng)
            r.valid = {eng}
    return value
