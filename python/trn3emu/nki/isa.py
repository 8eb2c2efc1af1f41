"""`nki.isa`: every NeuronCore-v4 instruction, dst first, appended to the traced kernel's Program.

The functions are generated from the ISA tables (`trn3emu._asm.INSTRUCTIONS`): each takes NKI's
operand names and order, accepts NKI tensors, op tokens (`nl.add`, `np.exp`, strings) and enum
members, and returns an `Instruction` handle with `.depends_on(...)`. Semantics live in the core.
"""

from __future__ import annotations

import enum
import inspect
from sys import _getframe
from typing import Any

import numpy as np

from .. import _native
from .._asm import ENUMS, INSTRUCTIONS, AssemblerMixin
from ..errors import NotSupportedError
from ..program import _enum_name
from . import _emit, _kernel
from . import indexing as _indexing
from . import load_reuse as _load_reuse
from ._kernel import NkiTensor, current, not_supported, tracing

# ------------------------------------------------------------------------------------- enums
engine = enum.Enum("engine", {n: i for i, n in enumerate(ENUMS["engine"])})
reduce_cmd = enum.Enum("reduce_cmd", {n: i for i, n in enumerate(ENUMS["reduce_cmd"])})
dge_mode = enum.Enum("dge_mode", {n: i for i, n in enumerate(ENUMS["dge_mode"])})
oob_mode = enum.Enum("oob_mode", {n: i for i, n in enumerate(ENUMS["oob_mode"])})
matmul_perf_mode = enum.Enum("matmul_perf_mode", {n: n for n in ENUMS["matmul_perf_mode"]})
dma_engine = enum.Enum("dma_engine", {n: i for i, n in enumerate(ENUMS["dma_engine"])})
nc_version = enum.IntEnum("nc_version", {"gen2": 2, "gen3": 3, "gen4": 4})  # ordered: kernels compare versions

tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
sync_engine = engine.sync
unknown_engine = engine.unknown


def get_nc_version():
    """The NeuronCore generation being emulated: always gen4 (Trainium3)."""
    return nc_version.gen4


# Op-token spellings that differ from the ISA's operator names.
_OP_ALIASES = {
    "max": "maximum",
    "amax": "maximum",
    "min": "minimum",
    "amin": "minimum",
    "true_divide": "divide",
    "identity": "copy",
    "sum": "add",
    "negative": None,
    "absolute": "abs",
    "arctan2": None,
    "bitwise_not": "invert",
    "logical_not": "logical_not",
}


#: id of an op token seen before -> (the token, its name): kernels pass the same few tokens
_OP_NAMES: dict[int, tuple[Any, str]] = {}


def op_name(v: Any) -> Any:
    """ISA operator / activation name of an op token (nl function, numpy ufunc, enum, string)."""
    hit = _OP_NAMES.get(id(v))
    if hit is not None and hit[0] is v:
        return hit[1]
    if v is None or isinstance(v, (bool, int, float)):
        return v
    name = _op_name(v)
    if len(_OP_NAMES) > 1024:
        _OP_NAMES.clear()
    _OP_NAMES[id(v)] = (v, name)  # (the token held: its id is not reused)
    return name


def _op_name(v: Any) -> str:
    name = v if isinstance(v, str) else getattr(v, "name", None) or getattr(v, "__name__", None)
    if not isinstance(name, str):
        raise not_supported(f"op token {v!r}", rule="nki_op_token")
    if name in _OP_ALIASES:
        alias = _OP_ALIASES[name]
        if alias is None:
            raise not_supported(f"op {name}", "no NeuronCore ALU or activation function", rule="nki_op_unsupported")
        return alias
    return name


_new = object.__new__


class Instruction:
    """The handle an `nki.isa` call returns; `.depends_on(*others)` orders it after them."""

    __slots__ = ("ctx", "index", "opcode", "__weakref__")

    def __init__(self, ctx, index: int, opcode: str) -> None:
        self.ctx, self.index, self.opcode = ctx, index, opcode

    def depends_on(self, *others) -> Instruction:
        # Automatic synchronisation already orders every data dependency; an explicit edge
        # between independent instructions only constrains the schedule, which the emulator
        # does not need for correctness. Accepted so kernels run unchanged (documented).
        return self

    def __repr__(self) -> str:
        return f"<nki.isa {self.opcode} #{self.index}>"


_ENUM_KINDS = {"alu_op", "act_fn"}


def _engine_name(v: Any) -> Any:
    return None if v is None else getattr(v, "name", v)


def _tensor_or(rest):
    """A converter that unwraps NKI tensors, else applies `rest`."""

    def conv(v: Any) -> Any:
        if isinstance(v, NkiTensor):
            return v.tensor  # the property: index views check their bounds there
        return rest(v)

    conv.floats_as_is = rest in (_as_float, _as_number, _same)  # (`_native.CallPlan` skips the call)
    conv.plain_as_is = rest is _same  # (a str, number, bool, None, list or tuple: skipped too)
    return conv


def _as_float(v: Any) -> Any:
    if type(v) is float:
        return v
    if v is not None and not hasattr(v, "tensor"):
        try:
            return float(v)
        except (TypeError, ValueError):
            return v
    return v


def _as_number(v: Any) -> Any:
    """An immediate that fills integer tiles exactly: Python / numpy integers stay integers (the
    core takes them as 32-bit words), anything else as `_as_float`."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    return _as_float(v)


#: (instruction, operand) immediates kept as integers: `memset(int32 tile, 2**31 - 1)` is exact
_INT_IMMEDIATES = frozenset({("memset", "value")})


def _as_ints(v: Any) -> Any:
    if v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v]
    return [int(v)]


def _as_pattern(v: Any) -> Any:
    return None if v is None else [list(map(int, p)) for p in v]


def _same(v: Any) -> Any:
    return v


def _perf_mode(v: Any) -> Any:
    if isinstance(v, str) and v.startswith("double_row_gen"):
        return "double_row"  # NKI's per-generation spelling of the double-row mode
    return v


#: id of an op token an operand converter saw -> (the token, its name): `op_name` less one call
_OP_OPERANDS: dict[int, tuple[Any, Any]] = {}


def _op_operand(v: Any) -> Any:
    """`_tensor_or(op_name)` with the tokens seen before looked up first (never an NKI tensor).
    `_native.CallPlan` keeps its `str` answers per token too (`by_identity`)."""
    hit = _OP_OPERANDS.get(id(v))
    if hit is not None and hit[0] is v:
        return hit[1]
    if isinstance(v, NkiTensor):
        return v.tensor  # the property: index views check their bounds there
    name = op_name(v)
    if len(_OP_OPERANDS) > 1024:
        _OP_OPERANDS.clear()
    _OP_OPERANDS[id(v)] = (v, name)  # (the token held: its id is not reused)
    return name


_op_operand.by_identity = True  # type: ignore[attr-defined]


def _converter(kind: str, enum_id: Any):
    """The operand conversion for an ISA operand kind (NKI tensors -> views, op tokens -> names,
    numbers -> float / int lists), picked once per operand when the wrapper is built."""
    if enum_id in _ENUM_KINDS:
        return _op_operand
    if enum_id == "matmul_perf_mode":
        return _tensor_or(_perf_mode)
    if kind in ("f32", "tensor_or_f32"):
        return _tensor_or(_as_float)
    if kind == "ints":
        return _tensor_or(_as_ints)
    if kind == "pattern":
        return _tensor_or(_as_pattern)
    return _tensor_or(_same)


#: callables run before an instruction is issued while the trace has pending results (`pending.py`:
#: they issue them first, in program order), and outside a trace (where they say so)
_before_issue: list = []
#: callables `(ctx, args, kwargs)` run before an instruction is issued while the trace holds
#: deferred fills (`zero_fill.py`: a tile's fill is issued before its first other use)
_before_operands: list = []
#: the tile subclass of results issued later (`pending.Pending`): once issued, an operand the
#: native call plan takes by its `_ap` as it takes a plain tile's
_issued_kind: list = []

#: NKI-only keywords of an instruction beyond its ISA operands (legacy `tensor_copy(dtype=)`: the cast
#: is dst's dtype, so the value is accepted and dropped). Every instruction also takes `mask=`.
_NKI_KEYWORDS: dict[str, tuple[str, ...]] = {"tensor_copy": ("dtype",)}

_KW = inspect.Parameter.KEYWORD_ONLY


def signature(opname: str) -> inspect.Signature:
    """The signature of `nki.isa.<opname>`: the assembler method's operands (names, order and
    defaults from the ISA tables), then `engine`, `name`, keyword-only `wait`, `signal`, `mask`
    and the instruction's NKI-only keywords."""
    params = list(inspect.signature(getattr(AssemblerMixin, opname)).parameters.values())[1:]
    out = [p.replace(annotation=inspect.Parameter.empty) for p in params]
    out += [inspect.Parameter(k, _KW, default=None) for k in ("mask", *_NKI_KEYWORDS.get(opname, ()))]
    return inspect.Signature(out, return_annotation=Instruction)


def _converters(opname: str, allowed: frozenset, spec: dict) -> dict:
    """Per-keyword value converter of nki.isa.`opname` (keywords without one are passed as is)."""
    convs = {}
    for k in allowed:
        if (opname, k) in _INT_IMMEDIATES:
            convs[k] = _tensor_or(_as_number)
        elif k in spec:
            convs[k] = _converter(*spec[k])
        elif k == "engine":
            convs[k] = _engine_name
    return convs


def _bad_form(opname: str, sig: inspect.Signature, allowed: frozenset):
    """The error for a call of nki.isa.`opname` whose arguments do not bind (only built then)."""

    def bad_form(args, kwargs):
        for k in kwargs:
            if k not in allowed:
                e = _kernel.unknown_parameter(f"nki.isa.{opname}", k, allowed)
                if e is not None:
                    return e
        try:
            sig.bind(None, *args, **kwargs)
            msg = "unexpected arguments"
        except TypeError as e:
            msg = str(e)
        return not_supported(
            f"nki.isa.{opname} call form ({msg})",
            "NKI 0.6 passes a preallocated dst first; legacy value-returning calls are not supported",
            rule="nki_call_form",
        )

    return bad_form


class _OpTables:
    """What an `nki.isa` function (`_make`) needs of its opcode, worked out once: the assembler
    method's parameters and their converters, the operands it writes, where each keyword goes, and
    the call plans (`plan_for`, per set of keywords). The general path (`general_call`) binds any
    other call form, with the errors, away from the hot function."""

    def __init__(self, opname: str) -> None:
        self.opname = opname
        self.method = method = getattr(AssemblerMixin, opname)
        sig = inspect.signature(method)
        params = list(sig.parameters.values())[1:]
        self.names = names = [p.name for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        self.npos = npos = len(names)
        self.allowed = allowed = frozenset(p.name for p in params)
        self.required = frozenset(p.name for p in params if p.default is inspect.Parameter.empty)
        self.spec = spec = {p[0]: (p[1], p[2]) for p in INSTRUCTIONS[opname][2]}
        # Per-operand converters, chosen once: the hot path replaces inspect.Signature.bind
        # (the binding is checked with plain dict/tuple operations; bind only builds the message).
        self.convs = _converters(opname, allowed, spec)
        self.bad_form = _bad_form(opname, sig, allowed)
        self.dst_first = names[0] == "dst"
        #: operands the instruction writes (`load_reuse.watch`)
        self.writes = writes = frozenset(
            p[0] for p in INSTRUCTIONS[opname][2] if p[0].startswith("dst") or p[0] == "reduce_res"
        )
        self.write_pos = tuple(i for i, n in enumerate(names) if n in writes)  # (their positions, when passed so)
        self.dropped = _NKI_KEYWORDS.get(opname, ())
        # The assembler method only passes its operands on in ISA order: called directly through
        # `_emit` with these defaults (unless a program overrides the method).
        self.argdefs = argdefs = tuple((p[0], sig.parameters[p[0]].default) for p in INSTRUCTIONS[opname][2])
        # Keyword-only calls (the usual NKI style): per set of keywords, once, where each value goes
        # in `[ISA operands..., engine, name, wait, signal]` and how it is converted.
        self.n_isa = n_isa = len(argdefs)
        self.base = base = [d for _, d in argdefs] + [None, None, (), ()]
        self.slots = slots = {k: i for i, (k, _) in enumerate(argdefs)}
        slots.update(engine=n_isa, name=n_isa + 1, wait=n_isa + 2, signal=n_isa + 3)
        # The ISA operands' defaults as `Program._emit` passes them on (for `_emit.emit_call`).
        # (required operands have no default: `plan_for` takes only calls that give them)
        self.base_ops = [None if d is inspect.Parameter.empty else _enum_name(d) for d in base[:n_isa]]
        # the names of the first k positional arguments, per k
        self.prefixes = [tuple(names[:k]) for k in range(npos + 1)]

    def plan_for(self, keys: tuple) -> Any:
        given = [k for k in keys if k not in self.dropped]
        if not self.allowed.issuperset(given) or not self.required.issubset(given) or len(set(keys)) != len(keys):
            return False  # the general path says what is wrong
        spec, convs, n_isa = self.spec, self.convs, self.n_isa
        entries = tuple((self.slots.get(k), k in spec, convs.get(k)) for k in keys)
        # ISA operands (and dropped keywords) only: `_emit.emit_call` takes it in one pass
        fused = all(i is None or i < n_isa for i, _, _ in entries)
        # (the plan read once natively: `_native.CallPlan.operands` builds a call's operands)
        if not fused:
            return entries, fused, None
        opname = self.opname
        return (
            entries,
            fused,
            _native.CallPlan(
                opname,
                entries,
                self.base_ops,
                _emit.hbm_dsts(opname),
                NkiTensor,
                _emit._slow_operand,
                _issued_kind[0] if _issued_kind else None,
            ),
        )

    def general_call(self, args: tuple, kwargs: dict) -> Any:
        """Any call form the hot path does not take: bound by name, converted, checked, emitted."""
        opname, dst_first, dropped, npos, bad_form = self.opname, self.dst_first, self.dropped, self.npos, self.bad_form
        names, allowed, required, spec, convs = self.names, self.allowed, self.required, self.spec, self.convs
        method, argdefs = self.method, self.argdefs
        if dst_first and args and "dst" not in kwargs and not isinstance(args[0], NkiTensor):
            raise not_supported(
                f"nki.isa.{opname} without dst",
                "legacy value-returning form; pass a preallocated dst first",
                rule="nki_call_form",
            )
        if dropped and kwargs:
            for k in dropped:
                kwargs.pop(k, None)
        if len(args) > npos:
            raise bad_form(args, kwargs)
        call = dict(zip(names, args))
        n = len(call) + len(kwargs)
        call.update(kwargs)
        if len(call) != n or not allowed.issuperset(call) or not required.issubset(call):
            raise bad_form(args, kwargs)  # an argument given twice, unknown or missing
        for k, v in call.items():
            if type(v) is NkiTensor and k in spec:  # inline `_tensor_or` (index views: `.tensor` checks bounds)
                call[k] = v._t
            else:
                c = convs.get(k)
                if c is not None:
                    call[k] = c(v)
        ctx = current()
        if ctx.vregs:  # virtual registers read on this instruction's engine
            _registers.prepare(ctx, opname, call)
        prog = ctx.program
        bound = getattr(prog, opname)
        if getattr(bound, "__func__", None) is not method:
            return Instruction(ctx, bound(**call), opname)
        get = call.get
        args = tuple([get(k, d) for k, d in argdefs])
        index = prog._emit(opname, get("engine"), get("name"), get("wait", ()), get("signal", ()), args)
        return Instruction(ctx, index, opname)


def _make(opname: str):
    t = _OpTables(opname)
    method, names, npos, writes, write_pos = t.method, t.names, t.npos, t.writes, t.write_pos
    dst_first, base, base_ops, n_isa, prefixes = t.dst_first, t.base, t.base_ops, t.n_isa, t.prefixes
    plan_for, general_call = t.plan_for, t.general_call
    plans: dict[tuple, Any] = {}

    def fn(*args, **kwargs):
        ctx = tracing()  # (this thread's trace)
        if _before_issue and (ctx is None or ctx.pending):  # results still pending: issued first
            for hook in _before_issue:
                hook()
        if ctx is not None and ctx.fills:  # deferred fills of the tiles it names: issued first
            for hook in _before_operands:
                hook(ctx, args, kwargs)
        if ctx is not None:
            if ctx.ir is not None:  # the IR recorder / allocation pass: the call's uses (record.py)
                args, kwargs = ctx.ir.call(ctx, args, kwargs, opname, names, writes)
            d = kwargs.get("dst") if kwargs else None
            if d is None and dst_first and args:
                d = args[0]
            if isinstance(d, NkiTensor) and getattr(d, "_block", None) is not None:
                d._block.written = True  # (pass reduce_init: a fresh buffer; views of it too)
        if ctx is not None and ctx._load_cache is not None and ctx._load_cache.handles:  # (pass load_reuse:
            _load_reuse.watch(ctx, writes, write_pos, args, kwargs)  # writes make cached loads stale)
        if "mask" in kwargs or (ctx is not None and ctx.masks):  # legacy masks: the sub-grid
            masked = _indexing.mask_call(opname, args, kwargs)
            if masked is None:
                return None  # the mask selects nothing: no instruction
            args, kwargs = masked
        # Keyword calls, and calls passing a tile first (nl ops' lowerings): by where each value goes.
        if not args or (len(args) <= npos and (not dst_first or type(args[0]) is NkiTensor)):
            if args:
                keys = prefixes[len(args)] + tuple(kwargs)
                values: Any = (*args, *kwargs.values())
            else:
                keys = tuple(kwargs)
                values = kwargs.values()
            plan = plans.get(keys)
            if plan is None:
                plan = plans[keys] = plan_for(keys)
            if plan:
                entries, fused, native = plan
                if ctx is None:
                    ctx = current()  # (raises: not tracing)
                prog = ctx.program
                direct = ctx.direct_ops.get(opname)
                if direct is None:
                    direct = ctx.direct_ops[opname] = getattr(getattr(prog, opname), "__func__", None) is method
                if fused and direct and not ctx.vregs:
                    if native is not None:  # `_emit.emit_call`'s one native call, inlined
                        if ctx.site is not None:  # (a pending result: the line of its call)
                            loc, label = ctx.site, _emit._label(ctx.site, None)
                        else:
                            f = _getframe(1)  # the call's source line (`_emit.kernel_site`)
                            hit = ctx.site_hits.get(f.f_lasti) if f.f_code is ctx.site_code else None
                            loc, label = hit if hit is not None else _emit.kernel_site(ctx, f)
                        i = native.append(
                            prog._native,
                            values,
                            prog.core,
                            prog._hbm_uses,
                            label,
                            loc,
                            prog.opcodes,
                            ctx.launch.trace_progress,
                        )
                        if i is not None:
                            ins = _new(Instruction)  # `Instruction(ctx, i, opname)`, inlined
                            ins.ctx, ins.index, ins.opcode = ctx, i, opname
                            return ins
                    index = _emit.emit_call(ctx, opname, entries, base_ops, values, 1)
                    if index is not None:
                        return Instruction(ctx, index, opname)
                vals = base.copy()
                for (i, operand, c), v in zip(entries, values):
                    if i is None:
                        continue  # an NKI-only keyword, dropped
                    if operand and type(v) is NkiTensor:
                        v = v._t  # inline `_tensor_or` (index views: `.tensor` checks bounds)
                    elif c is not None:
                        v = c(v)
                    vals[i] = v
                if direct and not ctx.vregs:
                    engine, wait, signal = vals[n_isa], vals[n_isa + 2], vals[n_isa + 3]
                    index = None
                    if not wait and not signal and (engine is None or type(engine) is str):
                        index = _emit.emit(ctx, opname, engine, vals[n_isa + 1], vals[:n_isa], 1)
                    if index is None:
                        index = prog._emit(opname, engine, vals[n_isa + 1], wait, signal, tuple(vals[:n_isa]))
                    return Instruction(ctx, index, opname)
        return general_call(args, kwargs)

    fn.__name__ = opname
    fn.__qualname__ = opname
    fn.__doc__ = method.__doc__
    fn.__signature__ = signature(opname)
    return fn


#: emulator-level instructions with no nki.isa API: their NKI-style wrappers live in the trn3emu
#: extension namespace (name -> where)
EXTENSIONS = {"nc_matmul_sparse": "trn3emu.nki.sparse"}

for _name in INSTRUCTIONS:
    if _name not in ("dma_compute",) and _name not in EXTENSIONS:
        globals()[_name] = _make(_name)


def _free_elems(shape, axes) -> int:
    n = 1
    for d, k in enumerate(shape):
        if d and d not in axes:
            n *= k
    return n


def _reduce_operands(dst, data, axis, keepdims):
    """`(dst, data, axis)` as the instruction takes them: the reduced axes trailing.

    Axes follow the documented "last contiguous free dims" numbering. The older minor-first one
    (1 = the last free dim, 2 = the one before, ...), which kernels still use, applies where the
    documented reading is not trailing and the minor-first reading fits `dst` (or `dst`'s size
    does not tell them apart): (1,) on a 3-D tile reduces dim 2. Other non-trailing axes, e.g.
    (1, 3) or (2,) of a 4-D tile, are reduced through a permuted view that puts them last (an
    access pattern: still one instruction); a keepdims `dst` is permuted alike."""
    if not isinstance(data, NkiTensor) or axis is None:
        return dst, data, axis
    nd = data.ndim
    if nd <= 2:
        return dst, data, axis  # (one free dim: any axis is trailing, 0, or refused by the instruction)
    try:
        axes = sorted({int(a) % nd for a in (axis if isinstance(axis, (list, tuple)) else (axis,))})
    except (TypeError, ValueError):
        return dst, data, axis
    if not axes or 0 in axes or axes == list(range(nd - len(axes), nd)):
        return dst, data, axis  # trailing (or invalid: the instruction's check says why)
    if axes == list(range(1, len(axes) + 1)):
        minor = sorted(nd - a for a in axes)
        per_dst = dst.size // dst.shape[0] if isinstance(dst, NkiTensor) and dst.shape[0] else None
        fits_documented = per_dst == _free_elems(data.shape, axes)
        if not fits_documented or per_dst == _free_elems(data.shape, minor):
            return dst, data, tuple(minor)
    kept = [d for d in range(nd) if d not in axes]
    perm = kept + axes
    data = data.permute(perm)
    if keepdims and isinstance(dst, NkiTensor) and dst.ndim == nd:
        dst = dst.permute(perm)
    return dst, data, tuple(range(len(kept), nd))


_tensor_reduce = tensor_reduce  # noqa: F821 (generated above)


def tensor_reduce(dst, op, data, axis, *args, **kwargs):  # noqa: F811
    keepdims = kwargs.get("keepdims", args[1] if len(args) > 1 else False)
    dst, data, axis = _reduce_operands(dst, data, axis, keepdims)
    return _tensor_reduce(dst, op, data, axis, *args, **kwargs)


tensor_reduce.__doc__ = _tensor_reduce.__doc__
tensor_reduce.__signature__ = _tensor_reduce.__signature__

_dma_compute = _make("dma_compute")

from . import registers as _registers  # noqa: E402
from . import scalars as _scalars  # noqa: E402
from .registers import VirtualRegister, register_alloc, register_load, register_move, register_store  # noqa: E402,F401
from .scalars import NkiScalar  # noqa: E402

_isa_scalar_load = _make("scalar_load")

# NKI 0.8.0 moved these to `nki.lnc` (`lnc.py`); the `nki.isa` names stay as compatibility wrappers
# that warn at the kernel's line ("The corresponding nki.isa entry points are deprecated", the
# `nki.lnc` API page). `pipe_id` is ignored by NKI since 0.8.0; the instruction keeps the operand.
_sendrecv, _core_barrier = sendrecv, core_barrier  # noqa: F821 (made by `_make` above)


def _deprecated_lnc(name: str) -> None:
    import sys
    import warnings

    from ._frames import _internal

    frame, level = sys._getframe(2), 3
    while frame.f_back is not None and _internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"nki.isa.{name} is deprecated since NKI 0.8.0 and will be removed in a future release; "
        f"use nki.lnc.{name}" + (" without pipe_id" if name == "sendrecv" else ""),
        DeprecationWarning,
        stacklevel=level,
    )


def sendrecv(*args, **kwargs):  # noqa: F811
    """Deprecated since NKI 0.8.0: `nki.lnc.sendrecv` (the ISA form, `pipe_id` included)."""
    _deprecated_lnc("sendrecv")
    return _sendrecv(*args, **kwargs)


def core_barrier(*args, **kwargs):  # noqa: F811
    """Deprecated since NKI 0.8.0: `nki.lnc.core_barrier`."""
    _deprecated_lnc("core_barrier")
    return _core_barrier(*args, **kwargs)


sendrecv.__signature__ = _sendrecv.__signature__
core_barrier.__signature__ = _core_barrier.__signature__


def scalar_load(src=None, engine=None, name=None, dst=None):  # noqa: F811
    """NKI: `scalar_load(src, engine=None) -> NkiScalar`, the value of a 1x1 int32 / uint32 SBUF or
    HBM tile (not a kernel argument, not PSUM); with `engine` the scalar is bound to that sequencer.
    The ISA form `scalar_load(dst=register, src=...)` (a register from `register_alloc`) still
    emits the instruction into that register."""
    if dst is None and isinstance(src, VirtualRegister):  # scalar_load(register, tile)
        dst, src, engine = src, engine, None
    if dst is not None:
        if isinstance(dst, VirtualRegister):
            return _scalars.isa_scalar_load(dst, src, engine=engine, name=name)
        return _isa_scalar_load(dst=dst, src=src, engine=engine, name=name)
    return _scalars.scalar_load(src, engine=engine, name=name)


def scalar_store(dst, value, engine=None, name=None):  # noqa: F811
    """NKI: `scalar_store(dst, value, engine=None)`: the NkiScalar `value` into the 1x1 tile `dst`
    (SBUF or HBM, of value's dtype, not a kernel argument); `engine` names the sequencer that
    writes it. A plain register from `register_alloc` takes the ISA form (`register_store` does too)."""
    if isinstance(value, VirtualRegister) and not isinstance(value, NkiScalar):
        return _scalars.isa_scalar_store(dst, value, engine=engine, name=name)
    return _scalars.scalar_store(dst, value, engine=engine, name=name)


def scalar_alu(data1, data2, op, name=None):
    """NKI: `op(data1, data2)` on NkiScalars / Python ints: + - * nl.divide (toward zero) nl.fmod
    (sign of data1) nl.maximum nl.minimum, or a comparison (nl.less ... nl.not_equal: an int32 0 / 1
    scalar). Two Python ints are evaluated while tracing. Operands of one dtype (int32 or uint32)."""
    return _scalars.scalar_alu(data1, data2, op_name(op), name=name)


def dma_compute(dst, srcs, scales=None, reduce_op=None, **kwargs):
    """`dma_compute(dst, srcs, scales, reduce_op)`: srcs list -> src0..src15 of the ISA record."""
    srcs = list(srcs)
    if len(srcs) > 16:
        raise not_supported("dma_compute with more than 16 sources", rule="nki_dma_compute_sources")
    if scales is not None and any(float(s) != 1.0 for s in scales):
        raise not_supported(
            "dma_compute with scales other than 1.0", "the v4 DMA has no scale mode", rule="nki_dma_compute_scales"
        )
    extra = {f"src{i}": s for i, s in enumerate(srcs)}
    if reduce_op is not None:
        extra["reduce_op"] = reduce_op
    return _dma_compute(dst, **extra, **kwargs)


def _dma_compute_signature() -> inspect.Signature:
    """dst, srcs, scales, reduce_op, then keyword-only the ISA record's other non-tensor operands."""
    kinds = {p[0]: p[1] for p in INSTRUCTIONS["dma_compute"][2]}
    P = inspect.Parameter
    head = [P("dst", P.POSITIONAL_OR_KEYWORD), P("srcs", P.POSITIONAL_OR_KEYWORD)]
    head += [P("scales", P.POSITIONAL_OR_KEYWORD, default=None), P("reduce_op", P.POSITIONAL_OR_KEYWORD, default=None)]
    rest = [
        p.replace(kind=_KW)
        for p in _dma_compute.__signature__.parameters.values()
        if p.name not in ("dst", "reduce_op") and kinds.get(p.name) != "tensor"
    ]
    return inspect.Signature(head + rest, return_annotation=Instruction)


dma_compute.__doc__ = f"{dma_compute.__doc__}\n\n{_dma_compute.__doc__}"
dma_compute.__signature__ = _dma_compute_signature()


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    if name in EXTENSIONS:
        raise not_supported(
            f"nki.isa.{name}",
            f"no nki.isa API exists; use the emulator extension {EXTENSIONS[name]}.{name}",
            rule="nki_extension_only",
        )
    raise _kernel.missing_attribute(f"nki.isa.{name}", list(globals()))


__all__ = [n for n in INSTRUCTIONS if n not in EXTENSIONS] + [
    "engine",
    "reduce_cmd",
    "dge_mode",
    "oob_mode",
    "matmul_perf_mode",
    "dma_engine",
    "nc_version",
    "get_nc_version",
    "NotSupportedError",
    "VirtualRegister",
    "register_alloc",
    "NkiScalar",
    "scalar_alu",
]
