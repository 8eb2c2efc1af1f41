"""NKI scalar values: `nki.isa.scalar_load` / `scalar_store` / `scalar_alu` and `nki.isa.NkiScalar`.

An `NkiScalar` is a `registers.VirtualRegister` with a dtype (`int32` or `uint32`) and, when it was
loaded with `engine=`, the one sequencer it lives on (`bound`). Its value exists only on the
device: arithmetic and comparisons are traced into `register_alu` instructions (isa/isa.toml), each
result in a register of its own, and the scalar can be a `scalar_offset` of an access pattern
(`registers.prepare` brings it to the reading engine) or a bound of `nl.fori_loop` (read on the
device, `registers.device_value`).

Widths (docs/nki.md, "NKI scalars"): 32-bit registers, so int32 and uint32 wrap modulo 2**32;
nl.int64 has no NeuronCore dtype here and is refused (rule nki_scalar_int64).

Registers: a scalar's register number returns to a per-trace pool when the scalar is garbage
collected (a view with `scalar_offset=s` keeps `s` alive), so a traced loop of scalar arithmetic
does not use up the 64 register numbers.
"""

from __future__ import annotations

import weakref
from typing import Any

from ..errors import ArgumentTypeError, DtypeError, MemorySpaceError, OperandError, ShapeError
from ..tensor import Reg
from ._kernel import NkiTensor, current, not_supported
from .registers import HOME, VirtualRegister, _call, _registry, ensure_on

#: dtypes a scalar can have (the sequencer's 32-bit registers)
DTYPES = ("int32", "uint32")
ENGINES = ("sync", "vector", "scalar", "gpsimd", "tensor")
#: scalar_alu operators: arithmetic keeps the dtype, comparisons give an int32 0 / 1
ARITH = ("add", "subtract", "multiply", "divide", "fmod", "maximum", "minimum")
COMPARE = ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")
_RANGE = {"int32": (-(1 << 31), (1 << 31) - 1), "uint32": (0, (1 << 32) - 1)}


def _int64_refused(what: str) -> Exception:
    return not_supported(
        f"{what} with nl.int64",
        "the emulated sequencer registers are 32-bit and the core has no int64 dtype; use nl.int32 or nl.uint32",
        rule="nki_scalar_int64",
    )


class NkiScalar(VirtualRegister):
    """One integer computed on the device (`nki.isa.scalar_load`): arithmetic on it is traced."""

    __slots__ = ("dtype",)

    def __repr__(self) -> str:
        at = f" on {self.bound}" if self.bound else ""
        return f"<NkiScalar {self.dtype} r{self.index}{at}>"

    @property
    def engine(self):
        """The sequencer the scalar is bound to (`scalar_load(..., engine=)`), else None."""
        return self.bound

    __hash__ = VirtualRegister.__hash__

    def __add__(self, other):
        return scalar_alu(self, other, "add")

    def __radd__(self, other):
        return scalar_alu(other, self, "add")

    def __sub__(self, other):
        return scalar_alu(self, other, "subtract")

    def __rsub__(self, other):
        return scalar_alu(other, self, "subtract")

    def __mul__(self, other):
        return scalar_alu(self, other, "multiply")

    def __rmul__(self, other):
        return scalar_alu(other, self, "multiply")

    def __neg__(self):
        return scalar_alu(self, -1, "multiply")  # (wrapping: -INT32_MIN is INT32_MIN, as on the device)

    def __pos__(self):
        return self

    def __lt__(self, other):
        return scalar_alu(self, other, "less")

    def __le__(self, other):
        return scalar_alu(self, other, "less_equal")

    def __gt__(self, other):
        return scalar_alu(self, other, "greater")

    def __ge__(self, other):
        return scalar_alu(self, other, "greater_equal")

    def __eq__(self, other):  # type: ignore[override]
        return scalar_alu(self, other, "equal")

    def __ne__(self, other):  # type: ignore[override]
        return scalar_alu(self, other, "not_equal")

    def _no_operator(self, *_):
        raise not_supported(
            "/, // and % on an NkiScalar",
            "Python's floor semantics are not the device's; use nisa.scalar_alu(a, b, op=nl.divide / nl.fmod)",
            rule="nki_scalar_operator",
        )

    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _no_operator


def _engine_name(engine: Any) -> str | None:
    if engine is None:
        return None
    name = engine if isinstance(engine, str) else getattr(engine, "name", None)
    if name == "unknown":
        return None
    if name not in ENGINES:
        raise OperandError(
            f"engine must be one of {', '.join(ENGINES)} (or nki.isa.engine.*), got {engine!r}",
            operand="engine",
            rule="nki_scalar_engine_name",
        )
    return name


def _new_scalar(ctx, dtype: str, bound: str | None) -> NkiScalar:
    """A scalar in a register number of the trace's pool (numbers of dead scalars), else a new one."""
    pool = getattr(ctx, "scalar_pool", None)
    if pool is None:
        pool = ctx.scalar_pool = []
    regs = _registry(ctx)
    index = None
    while pool:
        i = pool.pop()
        if i not in regs:
            index = i
            break
    if index is None:
        index = ctx.program.register_alloc().index
    s = NkiScalar(index)
    s.valid, s.scratch, s.ctx, s.bound, s.dtype = set(), None, ctx, bound, dtype
    regs[index] = s
    weakref.finalize(s, pool.append, index)
    return s


def _check_tile(t: Any, instr: str, operand: str) -> NkiTensor:
    """The operand rules shared by scalar_load's src and scalar_store's dst."""
    if not isinstance(t, NkiTensor):
        raise ArgumentTypeError(
            f"nki.isa.{instr}: {operand} must be a 1x1 tile (an NkiTensor), got {type(t).__name__}",
            operand=operand,
            rule="nki_scalar_operand_type",
        )
    if t.buffer == "psum" or t.tensor.mem == "psum":
        raise MemorySpaceError(
            f"nki.isa.{instr}: {operand} is in PSUM; scalar loads and stores use SBUF or HBM tiles "
            f"(copy through SBUF with nisa.tensor_copy)",
            operand=operand,
            rule="nki_scalar_psum",
        )
    tt = t.tensor
    if tt.mem == "hbm":
        ctx = current()
        block = getattr(tt, "block", None)
        if block is None or block.lo not in ctx.hbm_labels:
            raise MemorySpaceError(
                f"nki.isa.{instr}: {operand} is a kernel argument (or a view of one); scalar loads and "
                f"stores use the kernel's own tiles: copy the value with nisa.dma_copy first",
                operand=operand,
                rule="nki_scalar_kernel_argument",
            )
    n = 1
    for d in tt.shape:
        n *= int(d)
    if n != 1:
        raise ShapeError(
            f"nki.isa.{instr}: {operand} must name exactly one element (a 1x1 tile), got shape {tuple(tt.shape)}",
            operand=operand,
            rule="nki_scalar_one_element",
        )
    dt = str(tt.dtype)
    if dt == "int64":
        raise _int64_refused(f"nki.isa.{instr}")
    if dt not in DTYPES:
        raise DtypeError(
            f"nki.isa.{instr}: {operand} must be int32 or uint32 (an integer scalar), got {dt}",
            operand=operand,
            rule="nki_scalar_dtype",
        )
    return t


def scalar_load(src, engine=None, name=None) -> NkiScalar:
    """The value of the 1x1 int32 / uint32 tile `src` (SBUF or HBM, not a kernel argument) as an
    NkiScalar; with `engine`, loaded on and bound to that sequencer."""
    _check_tile(src, "scalar_load", "src")
    eng = _engine_name(engine)
    ctx = current()
    src = _call("scalar_load", src=src)["src"]
    s = _new_scalar(ctx, str(src.tensor.dtype), eng)
    at = eng or HOME
    ctx.program.scalar_load(dst=Reg(s.index), src=src.tensor, engine=at, name=name)
    s.valid = {at}
    return s


def scalar_store(dst, value, engine=None, name=None) -> None:
    """`dst` (a 1x1 tile of value's dtype, SBUF or HBM) = value, written by `engine`'s sequencer.
    Without `engine` one store is issued (on the sync sequencer): the documented replication onto
    every sequencer writes the same value, so the result is the same."""
    if not isinstance(value, NkiScalar):
        raise ArgumentTypeError(
            f"nki.isa.scalar_store: value must be an NkiScalar (from nisa.scalar_load or scalar "
            f"arithmetic), got {type(value).__name__}; write a constant with nisa.memset",
            operand="value",
            rule="nki_scalar_store_value",
        )
    _check_tile(dst, "scalar_store", "dst")
    if str(dst.tensor.dtype) != value.dtype:
        raise DtypeError(
            f"nki.isa.scalar_store: dst is {dst.tensor.dtype} but value is an {value.dtype} scalar; "
            f"store at the scalar's own dtype",
            operand="dst",
            rule="nki_scalar_store_dtype",
        )
    eng = _engine_name(engine)
    if eng is None and value.bound is not None:
        raise OperandError(
            f"nki.isa.scalar_store without engine= needs the value on every sequencer, but {value!r} is "
            f"bound to {value.bound!r}; pass engine={value.bound!r}",
            operand="value",
            rule="nki_scalar_engine",
        )
    at = eng or HOME
    ctx = current()
    dst = _call("scalar_store", dst=dst)["dst"]
    ensure_on(value, at)
    ctx.program.scalar_store(dst=dst.tensor, value=Reg(value.index), engine=at, name=name)


def _fold(a: int, b: int, op: str):
    """Both operands Python ints: evaluated while tracing (Python int, or bool for a comparison)."""
    if op in COMPARE:
        return {
            "less": a < b,
            "less_equal": a <= b,
            "greater": a > b,
            "greater_equal": a >= b,
            "equal": a == b,
            "not_equal": a != b,
        }[op]
    if op in ("divide", "fmod"):
        if b == 0:
            raise OperandError(f"nki.isa.scalar_alu: {op} by zero", operand="data2", rule="nki_scalar_divide_by_zero")
        q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # rounded toward zero
        return q if op == "divide" else a - q * b
    return {"add": a + b, "subtract": a - b, "multiply": a * b, "maximum": max(a, b), "minimum": min(a, b)}[op]


def _imm(v: int, dtype: str, operand: str) -> int:
    """A Python int operand as the 32-bit immediate of a `dtype` scalar's operation."""
    lo, hi = _RANGE[dtype]
    if not lo <= v <= hi:
        raise OperandError(
            f"nki.isa.scalar_alu: {operand}={v} does not fit an {dtype} scalar ({lo}..{hi})",
            operand=operand,
            rule="nki_scalar_immediate_range",
        )
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def scalar_alu(data1, data2, op, name=None):
    """`op(data1, data2)` on NkiScalars / Python ints (`op` an ISA operator name here; the
    `nki.isa.scalar_alu` wrapper turns nl tokens into it). See the module doc."""
    s1, s2 = isinstance(data1, NkiScalar), isinstance(data2, NkiScalar)
    for k, d in (("data1", data1), ("data2", data2)):
        if (
            not isinstance(d, (NkiScalar, int))
            or isinstance(d, bool)
            or (isinstance(d, VirtualRegister) and not isinstance(d, NkiScalar))
        ):
            raise ArgumentTypeError(
                f"nki.isa.scalar_alu: {k} must be an NkiScalar or a Python int, got {type(d).__name__}",
                operand=k,
                rule="nki_scalar_operand_type",
            )
    if op not in ARITH and op not in COMPARE:
        raise not_supported(
            f"nki.isa.scalar_alu op={op}",
            f"scalar operators are {', '.join(ARITH + COMPARE)}",
            rule="nki_scalar_op",
        )
    if not s1 and not s2:
        return _fold(int(data1), int(data2), op)
    dtype = data1.dtype if s1 else data2.dtype
    if s1 and s2 and data1.dtype != data2.dtype:
        raise DtypeError(
            f"nki.isa.scalar_alu: operands are {data1.dtype} and {data2.dtype} scalars; both must have the same "
            f"width and signedness",
            operand="data2",
            rule="nki_scalar_dtype_mismatch",
        )
    bounds = {d.bound for d in (data1, data2) if isinstance(d, NkiScalar) and d.bound is not None}
    if len(bounds) > 1:
        raise OperandError(
            f"nki.isa.scalar_alu: the operands are bound to different sequencers ({', '.join(sorted(bounds))})",
            operand="data2",
            rule="nki_scalar_engine",
        )
    bound = next(iter(bounds), None)
    at = bound or HOME
    ctx = current()
    unsigned = dtype == "uint32"
    prog = ctx.program
    _call("register_alu")

    def operand(v, k):
        if isinstance(v, NkiScalar):
            ensure_on(v, at)
            return Reg(v.index)
        return _imm(int(v), dtype, k)

    out = _new_scalar(ctx, "int32" if op in COMPARE else dtype, bound)
    dst = Reg(out.index)
    if s1:
        a = Reg(data1.index)
        ensure_on(data1, at)
    else:  # (an int first operand: into the result register first)
        prog.register_move(dst=dst, src=_imm(int(data1), dtype, "data1"), engine=at)
        a = dst
    b = operand(data2, "data2")
    if op == "fmod":  # a - trunc(a / b) * b
        q = _new_scalar(ctx, dtype, bound)
        prog.register_alu(dst=Reg(q.index), src0=a, src1=b, op="divide", unsigned=unsigned, engine=at)
        prog.register_alu(dst=Reg(q.index), src0=Reg(q.index), src1=b, op="multiply", engine=at)
        prog.register_alu(dst=dst, src0=a, src1=Reg(q.index), op="subtract", engine=at, name=name)
    else:
        prog.register_alu(dst=dst, src0=a, src1=b, op=op, unsigned=unsigned, engine=at, name=name)
    out.valid = {at}
    return out


def isa_scalar_load(dst: VirtualRegister, src, engine=None, name=None) -> None:
    """The ISA form `scalar_load(dst=register, src=tile)` (a register from `register_alloc`)."""
    at = _engine_name(engine) or HOME
    src = _call("scalar_load", src=src)["src"]
    current().program.scalar_load(dst=Reg(dst.index), src=src.tensor, engine=at, name=name)
    dst.valid = {at}


def isa_scalar_store(dst, value: VirtualRegister, engine=None, name=None) -> None:
    """The ISA form `scalar_store(dst=tile, value=register)` of a `register_alloc` register."""
    at = _engine_name(engine) or HOME
    dst = _call("scalar_store", dst=dst)["dst"]
    ensure_on(value, at)
    current().program.scalar_store(dst=dst.tensor, value=Reg(value.index), engine=at, name=name)


def loop_scalar() -> NkiScalar:
    """The int32 NkiScalar of a device loop's iteration value (`nl.fori_loop` bounded by scalars)."""
    return _new_scalar(current(), "int32", None)
