"""The traced kernel's one-step append: what `KernelProgram._emit` and `Program._emit` do for an
`nki.isa` call, fused into one function for the common case (operands that are tiles, HBM
tensors the program already names, numbers, names and enum members; no wait / signal lists, no
registers). Anything else returns None before any effect and the caller takes the general path,
which gives the same results and errors.

The kernel's source line of a call site is looked up once per (code object, instruction offset):
the frame walk stops at the first frame outside the package, and the label, the error note's
"file:line" and the HBM-write positions of the opcode come from small per-site / per-opcode caches.
"""

from __future__ import annotations

import os
import sys
import types

from .._asm import INSTRUCTION_FLAGS, INSTRUCTIONS
from ..errors import EmuError
from ..program import _ap_of, _enum_name
from ..tensor import Reg, Tensor
from ._kernel import _INTERNAL, _LABEL, _LABELS, NkiTensor, _hbm_span, user_frame

#: (id of the code object, instruction offset, name) -> (the code object, "file:line", label)
_SITES: dict[tuple, tuple[types.CodeType | None, str, str]] = {}
#: name None: id of the code object -> (the code object, {instruction offset: ("file:line", label)})
_CODE_SITES: dict[int, tuple[types.CodeType, dict[int, tuple[str, str]]]] = {}


#: "file:line" -> the label of an unnamed instruction there (`_label(loc, None)`: per instruction)
_LOC_LABELS: dict[str, str] = {}


def _label(loc: str, name) -> str:
    if name is None:
        label = _LOC_LABELS.get(loc)
        if label is None:
            label = _LOC_LABELS[loc] = _named_label(loc, None)
        return label
    return _named_label(loc, name)


def _named_label(loc: str, name) -> str:
    key = (loc, None if name is None else str(name))
    label = _LABELS.get(key)
    if label is None:
        label = _LABELS[key] = _LABEL.sub("_", loc if name is None else f"{name}/{loc}")[-255:]
    return label


def site(depth: int, name, hint=None) -> tuple[str, str]:
    """("file:line", instruction label) of the innermost caller outside the package, starting
    `depth` frames above the caller (`source_line`, keyed by call site and cached with its label).
    `hint`: that caller when known (`TraceContext.user_f`), so the frames between are not walked."""
    f = sys._getframe(depth + 1)
    if _INTERNAL.get(f.f_code.co_filename) is not False:  # (not a kernel's own frame)
        f = hint if hint is not None else user_frame(f)
    return site_at(f, name)


#: opcode -> positions of the operands an instruction may write in HBM (none for compute ones)
_HBM_DSTS: dict[str, tuple[int, ...]] = {}


def hbm_dsts(opcode: str) -> tuple[int, ...]:
    pos = _HBM_DSTS.get(opcode)
    if pos is None:
        pos = tuple(i for i, p in enumerate(INSTRUCTIONS[opcode][2]) if p[0].startswith("dst"))
        if INSTRUCTION_FLAGS[opcode][1] == "compute":  # engines write SBUF/PSUM only
            pos = ()
        _HBM_DSTS[opcode] = pos
    return pos


def _tensor_ap(t: Tensor, core: int, uses) -> object | None:
    """The access pattern of operand `t` in a program for `core` whose HBM uses are `uses`, or
    None when it needs the general path (another core's tensor, a freed block, the first use of
    an HBM tensor)."""
    if t.core is not None and t.core != core:
        return None
    blk = t.block
    if blk is not None:
        if not blk.live:
            return None
        try:
            if blk._owner not in uses:
                return None  # the first use of its HBM: recorded by the general path
        except TypeError:
            return None
    return _ap_of(t)


def emit(ctx, opcode: str, engine, name, args, depth: int) -> int | None:
    """Append `opcode(*args)` to `ctx.program` (a `KernelProgram`) as its `_emit` would, or None
    (nothing done) when an operand needs the general path. `depth`: frames above the caller
    known to be inside the package (where the source-line walk starts)."""
    prog = ctx.program
    core = prog.core
    uses = prog._hbm_uses
    conv = []
    append = conv.append
    for a in args:
        ta = type(a)
        if ta is Tensor:
            ap = _tensor_ap(a, core, uses)
            if ap is None:
                return None
            append(ap)
        elif a is None or ta is str or ta is int or ta is float or ta is bool:  # (defaults first)
            append(a)
        elif isinstance(a, (Tensor, Reg)):
            return None
        else:
            append(_enum_name(a))
    prog.opcodes.add(opcode)
    dsts = _HBM_DSTS.get(opcode)
    for i in hbm_dsts(opcode) if dsts is None else dsts:
        t = args[i] if i < len(args) else None
        if type(t) is Tensor and t.mem == "hbm":
            ctx.hbm_writes.append(_hbm_span(t))
    bar = ctx.launch.trace_progress
    if bar is not None:
        bar.tick()
    if ctx.site is None:  # (`site(depth + 1, name, ctx.user_f)`, inlined)
        f = sys._getframe(depth + 1)
        if _INTERNAL.get(f.f_code.co_filename) is not False:  # (not a kernel's own frame)
            f = ctx.user_f if ctx.user_f is not None else user_frame(f)
        loc, label = site_at(f, name)
    else:
        loc, label = ctx.site, _label(ctx.site, name)
    try:
        return prog._native.append(opcode, engine, tuple(conv), [], [], label)
    except EmuError as e:
        if hasattr(e, "add_note"):
            e.add_note(f"  in kernel at {loc} ({opcode})")
        raise


def emit_call(ctx, opcode: str, plan: tuple, base: list, values, depth: int) -> int | None:
    """`emit` straight from a call's argument values (positional ones, then keyword ones):
    `plan` gives per value its operand position, whether it is an ISA operand and its converter
    (`nki.isa`), `base` the operands' defaults. One pass over the given values; None (nothing
    done) as for `emit`. `nki.isa` tries the call form's `_native.CallPlan.append` first (the
    same steps in one native call)."""
    prog = ctx.program
    core = prog.core
    bar = ctx.launch.trace_progress
    # (HBM destinations, new HBM tensors and values `_slow_operand` refuses: this loop)
    ops = _operands(prog, core, opcode, plan, base, values, ctx)
    if ops is None:
        return None
    prog.opcodes.add(opcode)
    if bar is not None:
        bar.tick()
    loc, label = _call_site(depth + 1) if ctx.site is None else (ctx.site, _label(ctx.site, None))
    try:
        return prog._native.append(opcode, None, ops, [], [], label)
    except EmuError as e:
        if hasattr(e, "add_note"):
            e.add_note(f"  in kernel at {loc} ({opcode})")
        raise


def kernel_site(ctx, f: types.FrameType) -> tuple[str, str]:
    """("file:line", label) of an `nki.isa` call made from frame `f` (`site(.., None)` from
    there). A kernel's own frame's answer is kept in `ctx.call_sites` under its code object and
    instruction offset, where the next call from that code finds it in one lookup by offset
    (`nki/isa.py`: `ctx.site_code` / `ctx.site_hits`, the code object called from last)."""
    code = f.f_code
    if _INTERNAL.get(code.co_filename) is not False:  # (not a kernel's own frame: not kept here)
        f = ctx.user_f if ctx.user_f is not None else user_frame(f)
        return site_at(f, None)
    loc_label = site_at(f, None)
    hits = ctx.call_sites.get(id(code))
    if hits is None or hits[0] is not code:
        hits = ctx.call_sites[id(code)] = (code, {})  # (the code object held: its id is not reused)
    hits[1][f.f_lasti] = loc_label
    ctx.site_code, ctx.site_hits = code, hits[1]
    return loc_label


def site_at(f: types.FrameType | None, name) -> tuple[str, str]:
    """`site` for the kernel frame `f` (None: "?")."""
    if f is None:
        return "?", _label("?", name)
    code = f.f_code
    if name is None:  # (the usual case: per code object, by instruction offset)
        hits = _CODE_SITES.get(id(code))
        if hits is not None and hits[0] is code:
            hit = hits[1].get(f.f_lasti)
            if hit is not None:
                return hit
        else:
            hits = _CODE_SITES[id(code)] = (code, {})  # (the code object held: its id is not reused)
        loc = f"{os.path.basename(code.co_filename)}:{f.f_lineno}"
        hit = hits[1][f.f_lasti] = (loc, _label(loc, None))
        return hit
    key = (id(code), f.f_lasti, name)
    hit = _SITES.get(key)
    if hit is not None and hit[0] is code:
        return hit[1], hit[2]
    loc = f"{os.path.basename(code.co_filename)}:{f.f_lineno}"
    label = _label(loc, name)
    if name is None or type(name) is str:
        _SITES[key] = (code, loc, label)  # (the code object held: its id is not reused)
    return loc, label


def _call_site(depth: int) -> tuple[str, str]:
    """`site(depth, None)`: the call's ("file:line", label)."""
    f = sys._getframe(depth + 1)
    if _INTERNAL.get(f.f_code.co_filename) is not False:  # (not a kernel's own frame)
        f = user_frame(f)
    return site_at(f, None)


def _slow_operand(v, is_dst: bool, core: int, uses):
    """The operand of value `v` that `_native.CallPlan` could not take itself, as the Python
    loop of `_operands` gives it: a tile view seen for the first time (its pattern kept), the
    view of a tile subclass after its converter (a pending result once issued), an HBM tensor the
    program names already (read, not written), an enum member; None for anything else
    (the loop takes the call)."""
    if type(v) is NkiTensor:
        t = v._t
        if type(t) is not Tensor or (is_dst and t.mem == "hbm"):
            return None
        ap = _tensor_ap(t, core, uses)
        if ap is not None and t.dyn is None and t.mem != "hbm" and t.core == core:
            v._ap = ap
        return ap
    if type(v) is Tensor:
        return None if is_dst and v.mem == "hbm" else _tensor_ap(v, core, uses)
    if isinstance(v, (Tensor, Reg)):
        return None
    return _enum_name(v)


def _operands(prog, core: int, opcode: str, plan: tuple, base: list, values, ctx) -> tuple | None:
    """`emit_call`'s operand tuple, value by value in Python (what `_native.CallPlan` did
    not take: HBM tensors, views seen for the first time, enum members), with the HBM writes
    recorded; None (nothing done) when an operand needs the general path."""
    uses = prog._hbm_uses
    dsts = _HBM_DSTS.get(opcode)
    if dsts is None:
        dsts = hbm_dsts(opcode)
    conv = base.copy()
    written = None  # HBM tensors the instruction writes
    for (i, operand, c), v in zip(plan, values):
        if i is None:
            continue  # an NKI-only keyword, dropped
        nk = None
        if operand and type(v) is NkiTensor:
            ap = v._ap
            if ap is not None and v._t.core == core:
                conv[i] = ap  # an on-chip view of this core seen before (no HBM, no dynamic offset)
                continue
            nk, v = v, v._t  # (index views: the converter's `.tensor` checks bounds)
        elif c is not None:
            v = c(v)
        tv = type(v)
        if tv is Tensor:
            ap = _tensor_ap(v, core, uses)
            if ap is None:
                return None
            if i in dsts:
                written = [*(written or ()), v]
            conv[i] = ap
            if nk is not None and v.dyn is None and v.mem != "hbm" and v.core == core:
                nk._ap = ap
        elif tv is str or tv is float or v is None or tv is bool or tv is int:
            conv[i] = v
        elif isinstance(v, (Tensor, Reg)):
            return None
        else:
            conv[i] = _enum_name(v)
    if written is not None:
        for t in written:
            if t.mem == "hbm":
                ctx.hbm_writes.append(_hbm_span(t))
    return tuple(conv)
