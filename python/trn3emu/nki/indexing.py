"""Legacy NKI index expressions (`nl.arange`, `nl.mgrid`) and masks (`mask=`).

An index expression is an affine combination of iteration variables, each of which runs over one
axis of an iteration grid (`nl.arange(128)[:, None]` is axis 0 of a 2-D grid, `nl.mgrid[0:4, 0:8]`
gives one variable per axis). Indexing a tensor with one expression per dimension gives a view whose
shape is the grid: every element address is affine in the variables, so the view is an ordinary
strided access pattern (no gather). On chip, the variable of grid axis 0 must be the partition
index (coefficient 1): partitions cannot be strided.

A mask is a conjunction of comparisons of such expressions (`(i_p < n) & (i_f < m)`). Masks whose
comparisons each involve one variable restrict that variable to a range; an instruction issued
under the mask touches only that sub-grid of every operand (an operand dimension is restricted when
its size equals the variable's grid size). A mask comparing two variables (e.g. a causal
`i_q >= i_k`) cannot restrict a rectangle; `nisa.affine_select(pred=...)` takes those instead.
An indexed view that runs out of its tensor is kept unresolved until a mask brings it in bounds
(as legacy kernels load ragged edges with `mask=`).
"""

from __future__ import annotations

import contextlib
import dis
import math
import sys
import weakref
from typing import Any

from .._asm import INSTRUCTION_FLAGS
from ..errors import ShapeError
from . import _kernel
from ._kernel import DSlice, NkiTensor, current, not_supported, source_line


def masks() -> list[dict]:
    """The active mask ranges of the program being traced, innermost last: {var: (lo, hi)}
    (`TraceContext.masks`; none outside a trace)."""
    ctx = _kernel.tracing()
    return ctx.masks if ctx is not None else []


class IndexVar:
    """One iteration variable: grid axis `axis` of an `ndim`-D grid, running over 0..size-1.
    `grid`: the sizes of every axis when the variable comes from `nl.mgrid` (numpy's mgrid
    arrays are dense: an expression of some of them still spans the whole grid, which
    `iota` materialises); None for `nl.arange` (open, like numpy's ogrid)."""

    __slots__ = ("axis", "ndim", "size", "grid")

    def __init__(self, axis: int, ndim: int, size: int, grid: tuple | None = None) -> None:
        self.axis, self.ndim, self.size, self.grid = int(axis), int(ndim), int(size), grid

    def __repr__(self) -> str:
        return f"i{self.axis}<{self.size}>"


class IndexExpr:
    """const + sum(coef * var): an affine index expression (integer coefficients)."""

    __slots__ = ("terms", "const")

    def __init__(self, terms: dict, const: int = 0) -> None:
        self.terms = {v: c for v, c in terms.items() if c}
        self.const = int(const)

    @staticmethod
    def of(v: Any) -> IndexExpr:
        if isinstance(v, IndexExpr):
            return v
        if isinstance(v, bool) or not isinstance(v, (int,)) and not hasattr(v, "__index__"):
            raise not_supported(
                f"index expression term {v!r}",
                "only integers and nl.arange / nl.mgrid indices",
                rule="nki_index_expr_term",
            )
        return IndexExpr({}, int(v))

    # arithmetic (affine only)
    def __add__(self, o):
        if isinstance(o, (NkiTensor, DynIndex)):
            return DynIndex.of(o) + self
        o = IndexExpr.of(o)
        terms = dict(self.terms)
        for v, c in o.terms.items():
            terms[v] = terms.get(v, 0) + c
        return IndexExpr(terms, self.const + o.const)

    __radd__ = __add__

    def __neg__(self):
        return IndexExpr({v: -c for v, c in self.terms.items()}, -self.const)

    def __sub__(self, o):
        return self + (-IndexExpr.of(o))

    def __rsub__(self, o):
        return IndexExpr.of(o) + (-self)

    def __mul__(self, o):
        if isinstance(o, IndexExpr):
            if o.terms and self.terms:
                raise not_supported(
                    "product of two index expressions",
                    "index expressions must be affine",
                    rule="nki_index_expr_not_affine",
                )
            if not o.terms:
                o = o.const
            else:
                return o * self.const
        k = int(o)
        return IndexExpr({v: c * k for v, c in self.terms.items()}, self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, o):
        raise not_supported(
            "floor division of an index expression",
            "index expressions must be affine",
            rule="nki_index_expr_not_affine",
        )

    __mod__ = __truediv__ = __floordiv__

    # comparisons -> predicates (integer: a < b  <=>  b - a - 1 >= 0)
    def __lt__(self, o):
        return _compared([IndexExpr.of(o) - self - 1])

    def __le__(self, o):
        return _compared([IndexExpr.of(o) - self])

    def __gt__(self, o):
        return _compared([self - o - 1])

    def __ge__(self, o):
        return _compared([self - o])

    def __eq__(self, o):  # type: ignore[override]
        return _compared([self - o, IndexExpr.of(o) - self])

    def __ne__(self, o):  # type: ignore[override]
        raise not_supported(
            "index expression !=", "a mask is a conjunction of <, <=, >, >=, ==", rule="nki_mask_comparison"
        )

    __hash__ = object.__hash__

    def __bool__(self):
        raise not_supported(
            "truth value of an index expression", "use it in a mask= or an index", rule="nki_index_expr_truth_value"
        )

    def __getitem__(self, key):
        """`nl.arange(n)[:, None]` / `[None, :]`: place a 1-variable expression on a grid axis."""
        if len(self.terms) != 1:
            raise not_supported("indexing a compound index expression", rule="nki_index_expr_indexed")
        ((var, coef),) = self.terms.items()
        key = key if isinstance(key, tuple) else (key,)
        axes = [i for i, k in enumerate(key) if isinstance(k, slice)]
        if len(axes) != 1 or any(k is not None for i, k in enumerate(key) if i != axes[0]):
            raise not_supported(
                f"arange index {key!r}", "use [:, None] or [None, :] style keys", rule="nki_arange_index"
            )
        new = IndexVar(axes[0], len(key), var.size)
        return IndexExpr({new: coef}, self.const)

    def bounds(self) -> tuple[int, int]:
        lo = hi = self.const
        for v, c in self.terms.items():
            lo += builtins_min(0, c * (v.size - 1))
            hi += builtins_max(0, c * (v.size - 1))
        return lo, hi

    def __repr__(self) -> str:
        parts = [f"{c}*{v}" for v, c in self.terms.items()]
        return " + ".join(parts + [str(self.const)])


builtins_min, builtins_max = min, max


class DynIndex:
    """An index expression plus a value read at run time from a 1x1 integer tile (legacy
    `t[ix, offsets[0, i] + iy]`): lowered to a view with a dynamic `scalar_offset` (DMA operands)."""

    __slots__ = ("expr", "tile")

    def __init__(self, expr: IndexExpr, tile: NkiTensor) -> None:
        self.expr, self.tile = expr, tile

    @staticmethod
    def of(v) -> DynIndex:
        return v if isinstance(v, DynIndex) else DynIndex(IndexExpr({}, 0), v)

    def __add__(self, o):
        if isinstance(o, (NkiTensor, DynIndex)):
            raise not_supported("an index with two run-time terms", rule="nki_runtime_index_terms")
        return DynIndex(self.expr + o, self.tile)

    __radd__ = __add__


def _and_operand_end(frame) -> int | None:
    """Where the `and` expression ends (a bytecode offset of `frame`) when `frame` is truth-testing
    the left operand of a short-circuit `and`; None for any other truth test. 3.10/3.11:
    JUMP_IF_FALSE_OR_POP; 3.12+: COPY 1, [TO_BOOL,] POP_JUMP_IF_FALSE, POP_TOP (an `if` has no COPY)."""
    ins = _INSTRUCTIONS.get(frame.f_code)
    if ins is None:
        ins = _INSTRUCTIONS[frame.f_code] = list(dis.get_instructions(frame.f_code))
    at = {x.offset: i for i, x in enumerate(ins)}.get(frame.f_lasti)
    if at is None:
        return None
    x = ins[at]
    if x.opname == "JUMP_IF_FALSE_OR_POP":
        return x.argval
    start = at
    if x.opname == "TO_BOOL" and at + 1 < len(ins):
        at += 1
        x = ins[at]
    if (
        x.opname in ("POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_FALSE")
        and start > 0
        and ins[start - 1].opname == "COPY"
        and ins[start - 1].arg == 1
        and at + 1 < len(ins)
        and ins[at + 1].opname == "POP_TOP"
    ):
        return x.argval
    return None


#: code object -> its instructions (`_and_operand_end`; a kernel's code is read once)
_INSTRUCTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _compared(cons: list) -> Predicate:
    """A comparison's predicate, joined with the left operands of the `and`s it is the right
    operand of (`Predicate.__bool__`)."""
    ctx = _kernel.tracing()
    if ctx is not None:
        pend = ctx.and_pending
        if pend:
            f = sys._getframe(2)  # the kernel's frame (past the comparison method)
            mine = [e for e in pend if e[0] == id(f) and e[1] is f.f_code]
            for e in mine:  # (a left operand whose `and` ended without a comparison is dropped)
                pend.remove(e)
                if f.f_lasti < e[2]:
                    cons = e[3] + cons
    return Predicate(cons)


class Predicate:
    """A conjunction of `expr >= 0` constraints (from comparisons of index expressions)."""

    __slots__ = ("cons",)

    def __init__(self, cons: list) -> None:
        self.cons = list(cons)

    def __and__(self, o):
        if isinstance(o, bool):
            return self if o else Predicate([IndexExpr({}, -1)])
        return Predicate(self.cons + o.cons)

    __rand__ = __and__

    def __or__(self, o):
        raise not_supported("mask with |", "a mask is a conjunction (&) of comparisons", rule="nki_mask_disjunction")

    __ror__ = __or__

    def __bool__(self):
        # `mask=(ix < n and iy < m)`: Python asks the left operand's truth value; the vendor's
        # legacy front end accepts it. Recognised from the kernel's bytecode as the left operand of
        # a short-circuit `and`, it is True and joins the next comparison the same `and` makes,
        # so the mask is the conjunction the author wrote. Any other truth test (`if`, `or`,
        # `not`) stays refused: it has no mask meaning.
        f = sys._getframe(1)
        end = _and_operand_end(f)
        ctx = _kernel.tracing()
        if end is None or ctx is None:
            raise not_supported(
                "truth value of a mask", "combine comparisons with &, not `and`", rule="nki_mask_truth_value"
            )
        ctx.and_pending.append((id(f), f.f_code, end, self.cons))
        return True

    def ranges(self) -> dict:
        """{var: (lo, hi)} for constraints on one variable each. A constraint on several variables
        must hold everywhere (or nowhere) on the grid those ranges leave: a mask restricts each
        index to a range, it cannot cut a triangle (that raises; use affine_select)."""
        out: dict = {}
        multi = []
        for e in self.cons:
            if not e.terms:
                if e.const < 0:  # constant false: empty range on a dummy
                    out[None] = (0, 0)
                continue
            if len(e.terms) != 1:
                multi.append(e)
                continue
            ((v, c),) = e.terms.items()
            lo, hi = out.get(v, (0, v.size))
            if c > 0:  # c*v + k >= 0  <=>  v >= ceil(-k / c)
                lo = builtins_max(lo, -(e.const // c))
            else:  # v <= floor(k / -c)
                hi = builtins_min(hi, e.const // (-c) + 1)
            out[v] = (lo, hi)
        for e in multi:  # bounds of e over the box the single-variable constraints leave
            lo_e = hi_e = e.const
            for v, c in e.terms.items():
                a, b = out.get(v, (0, v.size))
                if a >= b:
                    return out  # already empty
                lo_e += builtins_min(c * a, c * (b - 1))
                hi_e += builtins_max(c * a, c * (b - 1))
            if hi_e < 0:
                out[None] = (0, 0)  # false everywhere
            elif lo_e < 0:
                raise not_supported(
                    f"mask {e!r} >= 0 on two indices",
                    "a mask= restricts each index to a range (here it would cut the grid unevenly); use affine_select",
                    rule="nki_mask_two_indices",
                )
        return out


def arange(*args) -> IndexExpr:
    """`nl.arange(stop)` / `(start, stop[, step])`: a 1-D index (place it with [:, None] etc.)."""
    r = range(*(int(a) for a in args))
    if len(r) == 0:
        raise ShapeError(f"nl.arange{args} is empty", rule="nki_arange_empty")
    return IndexExpr({IndexVar(0, 1, len(r)): r.step}, r.start)


class _Grid(tuple):
    """`nl.mgrid[...]` result: a tuple of index expressions, also `.p` / `.x` / `.y` / `.z`."""

    @property
    def p(self):
        return self[0]

    @property
    def x(self):
        return self[1]

    @property
    def y(self):
        return self[2]

    @property
    def z(self):
        return self[3]


class _MGrid:
    def __getitem__(self, key) -> _Grid:
        key = key if isinstance(key, tuple) else (key,)
        ranges = []
        for k in key:
            if not isinstance(k, slice):
                raise not_supported(f"nl.mgrid[{key!r}]", "mgrid takes slices", rule="nki_mgrid_key")
            r = range(k.start or 0, k.stop, k.step or 1) if k.stop is not None else None
            if not r:
                raise ShapeError(f"nl.mgrid slice {k} is empty", rule="nki_mgrid_empty")
            ranges.append(r)
        grid = tuple(len(r) for r in ranges)
        return _Grid(
            IndexExpr({IndexVar(axis, len(key), len(r), grid): r.step}, r.start) for axis, r in enumerate(ranges)
        )


mgrid = _MGrid()


class ParDim(int):
    """`nl.par_dim(n)`: marks the partition dimension of a tile shape."""


def par_dim(n) -> ParDim:
    return ParDim(int(n))


# --------------------------------------------------------------------------------- indexed views
def has_expr(key) -> bool:
    key = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (IndexExpr, DynIndex)) for k in key)


def has_tile(key) -> bool:
    """A key with a tile of indices (`cache[0, idx_tile, :]`: a run-time gather/scatter view)."""
    key = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, NkiTensor) for k in key)


def ds_past_end(nt: NkiTensor, key) -> bool:
    """`t[nl.ds(start, size), ...]` with a window running past the tensor's end: a legacy view
    whose rows beyond the end a mask= must exclude (a plain slice would silently shrink it)."""
    key = key if isinstance(key, tuple) else (key,)
    shape = nt.shape
    return any(isinstance(k, DSlice) and d < len(shape) and k.start + k.size > shape[d] for d, k in enumerate(key))


def _slices_as_exprs(key: tuple, shape) -> tuple:
    """Slices and nl.ds windows of a key as index expressions over grid axis = key position."""
    key = tuple(key) + (slice(None),) * (len(shape) - len(key))
    out = []
    for d, k in enumerate(key):
        if isinstance(k, DSlice):
            out.append(IndexExpr({IndexVar(d, len(key), k.size): 1}, k.start))
        elif isinstance(k, slice):
            r = range(*k.indices(shape[d]))
            if (k.step or 1) > 0 and k.stop is not None and k.stop > shape[d] and 0 <= r.start:
                r = range(r.start, k.stop, k.step or 1)  # past the end (legacy, masked): not clipped
            out.append(IndexExpr({IndexVar(d, len(key), len(r)): r.step}, r.start) if len(r) else k)
        else:
            out.append(k)
    return tuple(out)


def _grid(exprs) -> list:
    """The grid shape spanned by the variables of `exprs` (unreferenced axes have size 1)."""
    vars_ = {v for e in exprs for v in e.terms}
    ndim = builtins_max([v.ndim for v in vars_] + [v.axis + 1 for v in vars_] + [1])
    shape = [1] * ndim
    for v in vars_:
        if shape[v.axis] not in (1, v.size):
            raise ShapeError(
                f"index variables on grid axis {v.axis} have sizes {shape[v.axis]} and {v.size}",
                rule="nki_index_grid_mismatch",
            )
        shape[v.axis] = builtins_max(shape[v.axis], v.size)
    return shape


class IndexedTensor(NkiTensor):
    """A tensor indexed by index expressions; `_oob` when part of it lies outside the tensor (a
    mask must bring it in bounds before an instruction uses it)."""

    __slots__ = ("_base", "_exprs", "_oob", "_where")

    @property
    def tensor(self):
        """The view an instruction uses; an out-of-bounds index needs a mask= first."""
        if self._oob:
            raise ShapeError(
                f"index expressions {self._exprs!r} run outside the {self._base.shape} tensor "
                f"(give the instruction a mask= that keeps them in bounds); indexed at {self._where}",
                rule="nki_index_out_of_bounds",
            )
        return self._t


def index_view(nt: NkiTensor, key, ranges: dict | None = None, axis0: bool = True) -> NkiTensor:
    """The view of `nt` at index expressions `key` (one per dim; ints allowed): its dims are the
    grid axes. `ranges` restricts variables to sub-ranges (a mask). `axis0=False`: grid axis 0
    comes from elsewhere (a gather's index tile), so an HBM view gets no size-1 dim for it."""
    key = key if isinstance(key, tuple) else (key,)
    dyn = [(d, k) for d, k in enumerate(key) if isinstance(k, (DynIndex, NkiTensor))]
    if dyn:
        return _dynamic_view(nt, key, dyn)
    t = nt.tensor
    if not has_expr(key) and Ellipsis not in key:  # nl.ds windows / slices past the end
        key = _slices_as_exprs(key, t.shape)
        axis0 = False  # (their grid axes are key positions; an integer index drops its dim)
    if any(k is Ellipsis or isinstance(k, slice) for k in key) or len(key) != t.ndim:
        raise not_supported(
            f"index {key!r} on a {t.ndim}-D tensor",
            "legacy index expressions need one integer or index per dim",
            rule="nki_legacy_index_form",
        )
    exprs = [IndexExpr.of(k) for k in key]
    if ranges:  # substitute v -> v' + lo with v' over hi - lo
        sub = {}
        for e in exprs:
            for v in e.terms:
                if v in ranges and v not in sub:
                    lo, hi = ranges[v]
                    sub[v] = (IndexVar(v.axis, v.ndim, hi - lo), lo)
        exprs = [
            IndexExpr(
                {sub.get(v, (v, 0))[0]: c for v, c in e.terms.items()},
                e.const + sum(c * sub[v][1] for v, c in e.terms.items() if v in sub),
            )
            for e in exprs
        ]
    onchip = t.mem != "hbm"
    # The view's dims are the index variables in grid-axis order, as numpy broadcasts index
    # arrays (grids of fewer dims align to the right): t[i0, 2*i1 + i3, 2*i2 + i4] is
    # [I0, I1, I2, I3, I4], and an HBM out[q0 + i_f, i_p] is the [P, F] transposed view (the SD
    # attention tutorial stores its result so). On chip the first key position stays first (the
    # partition dim). When two variables share an axis they follow first appearance along the
    # key instead (t[i, 3*j + k] is [I, J, K]; one position in grid-axis order). An HBM view with
    # no variable on grid axis 0 has a size-1 first dim there (numpy: w[arange(F)[None, :]] is
    # [1, F]).
    order: list = []
    for e in exprs:
        for v in sorted(e.terms, key=lambda v: v.axis):
            if v not in order:
                order.append(v)
    head = len(exprs[0].terms) if exprs and onchip else 0
    rest = order[head:]
    if rest:
        nd = max(v.ndim for v in rest)
        eff = {v: v.axis + nd - v.ndim for v in rest}
        if len(set(eff.values())) == len(rest):
            order = order[:head] + sorted(rest, key=lambda v: eff[v])
            if not onchip and axis0 and min(eff.values()) > 0:  # nothing on grid axis 0: size-1 dim
                order.insert(0, None)
    oob = False
    for d, e in enumerate(exprs):
        lo, hi = e.bounds()
        if lo < 0 or hi >= t.shape[d]:
            oob = True
    if onchip:
        p = exprs[0]
        if len(p.terms) > 1 or any(c != 1 for c in p.terms.values()):
            raise not_supported(
                f"on-chip partition index {p!r}",
                "the partition index must be one index with coefficient 1",
                rule="nki_partition_index_form",
            )
        if p.terms:
            (pv,) = p.terms
            if pv.size > 1 and any(pv in e.terms for e in exprs[1:]):
                raise not_supported(
                    "the partition index used in a free-dim index expression", rule="nki_partition_index_form"
                )
        else:  # a constant partition: one partition, then the free dims
            order.insert(0, None)
    shape = [1 if v is None else v.size for v in order]
    pos = {v: i for i, v in enumerate(order)}
    first = 1 if onchip else 0
    strides = [0] * len(shape)
    off = 0
    for d in range(first, len(exprs)):
        st = t.strides[d]
        off += st * exprs[d].const
        for v, c in exprs[d].terms.items():
            strides[pos[v]] += st * c
    if onchip:
        strides[0] = 0
    start = t.start + (exprs[0].const if onchip else 0)
    if not shape:
        shape, strides = [1], [1]
    if onchip and len(shape) < 2:
        shape, strides = shape + [1], strides + [1]
    view = t._view(shape, strides, t.offset + off * t.itemsize, start)
    out = IndexedTensor(view, nt.buffer, nt._block, nt.name)
    out._base, out._exprs, out._oob = nt, tuple(key), oob
    out._where = source_line() if oob else ""
    return out


def _dynamic_view(nt: NkiTensor, key, dyn) -> NkiTensor:
    """`nt[...]` with one run-time index term: the static view's access pattern over the base
    tensor plus `scalar_offset` = that tile along its dimension."""
    if len(dyn) != 1:
        raise not_supported(
            "more than one run-time index", "one dimension may take a tile value", rule="nki_runtime_index_count"
        )
    d, k = dyn[0]
    if isinstance(k, NkiTensor) and k.shape[0] > 1:  # one row per index partition (gather/scatter)
        if nt.tensor.mem != "hbm":
            raise not_supported(
                "a tile of indices into an on-chip tile", "index the rows of an HBM tensor", rule="nki_index_tile_dim"
            )
        if d != 0:
            # `cache[0, idx, i_f]`: constant indices before the index tile's dim select a
            # sub-tensor whose rows (dim 0) the tile indexes.
            lead = key[:d]
            if not all(hasattr(c, "__index__") and not isinstance(c, (bool, NkiTensor)) for c in lead):
                raise not_supported(
                    f"a tile of indices in dim {d} after non-constant indices {lead!r}",
                    "the dims before the index tile's dim take constant integers",
                    rule="nki_index_tile_dim",
                )
            return _dynamic_view(nt[tuple(int(c) for c in lead)], tuple(key[d:]), [(0, k)])
        rest = index_view(nt, (0,) + tuple(key[1:]), axis0=False)
        view, base = rest._t, nt.tensor
        pattern = [[base.strides[0], k.shape[0]]] + [[st, n] for st, n in zip(view.strides, view.shape)]
        return nt.ap(pattern, (view.offset - base.offset) // base.itemsize, vector_offset=k, indirect_dim=0)
    k = DynIndex.of(k)
    static = index_view(nt, tuple(k.expr if i == d else v for i, v in enumerate(key)))
    if static._oob:
        raise ShapeError(
            f"index {key!r} runs outside the {nt.shape} tensor before its run-time offset",
            rule="nki_index_out_of_bounds",
        )
    base, view = nt.tensor, static._t
    es = base.itemsize
    if base.mem == "hbm":
        pattern = [[st, n] for st, n in zip(view.strides, view.shape)]
        off = (view.offset - base.offset) // es
    else:
        row = nt._block.row_bytes // es if nt._block is not None else base.size // base.shape[0]
        pattern = [[row, view.shape[0]]] + [[st, n] for st, n in zip(view.strides[1:], view.shape[1:])]
        off = (view.start - base.start) * row + (view.offset - base.offset) // es
    return nt.ap(pattern, off, scalar_offset=k.tile, indirect_dim=d)


# ------------------------------------------------------------------------------------------ masks
class MaskedResult(NkiTensor):
    """A tile produced under `mask=`: assigning it (`t[...] = op(..., mask=m)`) copies only the
    masked part, as NKI writes such a result straight into the assignment target."""

    __slots__ = ("_pred",)


def tag(result, mask):
    """`result` of a call made with `mask`, remembered for a following assignment."""
    if mask is None or mask is True or not isinstance(result, NkiTensor):
        return result
    out = MaskedResult(result._t, result.buffer, result._block, result.name)
    out._pred = mask
    return out


@contextlib.contextmanager
def masked(mask):
    """Instructions issued inside touch only the sub-grid `mask` selects."""
    if mask is None or mask is True:
        yield
        return
    if mask is False:
        r = {None: (0, 0)}
    elif isinstance(mask, Predicate):
        r = mask.ranges()
    else:
        raise not_supported(
            f"mask={mask!r}", "a mask is a comparison of nl.arange / nl.mgrid indices", rule="nki_mask_form"
        )
    active_masks = current().masks
    active_masks.append(r)
    try:
        yield
    finally:
        active_masks.pop()


def active() -> bool:
    return bool(masks())


def _current_ranges() -> dict | None:
    """The intersection of the active masks, or None when one is empty."""
    out: dict = {}
    for r in masks():
        for v, (lo, hi) in r.items():
            a, b = out.get(v, (0, v.size if v is not None else 0))
            out[v] = (builtins_max(a, lo), builtins_min(b, hi))
    if any(hi <= lo for lo, hi in out.values()):
        return None
    return out


def apply(v: Any, ranges: dict) -> Any:
    """`v` restricted to the mask's sub-grid (tensors only; other values pass through)."""
    if not isinstance(v, NkiTensor):
        if isinstance(v, IndexExpr):
            raise not_supported(
                "an index expression as an operand", "index a tensor with it", rule="nki_index_expr_operand"
            )
        return v
    if isinstance(v, IndexedTensor):
        mine = {var: r for var, r in ranges.items() if any(var in IndexExpr.of(k).terms for k in v._exprs)}
        for k in v._exprs:  # view variables restricted like tile dims: same grid axis and size
            for u in IndexExpr.of(k).terms if isinstance(k, IndexExpr) else ():
                for var, r in ranges.items():
                    if (
                        u not in mine
                        and var is not None
                        and var not in mine
                        and (var.axis, var.size) == (u.axis, u.size)
                    ):
                        if r != (0, u.size):
                            mine[u] = r
        if mine or v._oob:
            w = index_view(v._base, v._exprs, mine)
            if w._oob:
                raise ShapeError(
                    f"index expressions {v._exprs!r} run outside the {v._base.shape} tensor under the mask",
                    rule="nki_index_out_of_bounds",
                )
            v = w
        ranges = {var: r for var, r in ranges.items() if var not in mine}
    key = []
    for d, n in enumerate(v.shape):
        sl = slice(None)
        for var, (lo, hi) in ranges.items():
            if var is not None and var.axis == d and n == var.size and (lo, hi) != (0, n):
                sl = slice(lo, hi)
        key.append(sl)
    return v[tuple(key)] if any(k != slice(None) for k in key) else v


#: instructions a mask cannot restrict (PE array and DMA-transpose shapes): `maskable = false` in isa.toml
_UNMASKABLE = frozenset(name for name, (_cost, _path, _rng, maskable) in INSTRUCTION_FLAGS.items() if not maskable)
#: transposes (their cost class): a mask on the source's index variables restricts the destination swapped
_TRANSPOSES = frozenset(
    name for name, (cost, *_flags) in INSTRUCTION_FLAGS.items() if cost in ("pe_transpose", "dma_transpose")
)


def _masked_transpose(args: tuple, kwargs: dict, ranges: dict):
    """A 2-D transpose under a mask on its source's index variables: the source keeps the masked
    rows and columns, the (plain) destination the same ranges swapped. None when the operands do
    not have that form."""
    names = ("dst", "data") if "data" in kwargs or len(args) < 2 or "src" not in kwargs else ("dst", "src")
    vals = list(args) + [None] * 2
    dst = kwargs.get("dst", vals[0])
    src = kwargs.get(names[1], kwargs.get("src", vals[1]))
    if not isinstance(src, IndexedTensor) or isinstance(dst, IndexedTensor) or not isinstance(dst, NkiTensor):
        return None
    if len(src.shape) != 2 or tuple(dst.shape) != (src.shape[1], src.shape[0]):
        return None
    ends = []
    for k in src._exprs[:2]:
        e = IndexExpr.of(k)
        if len(e.terms) != 1:
            return None
        (v,) = e.terms
        ends.append(ranges.get(v, (0, v.size)))
    (r0, r1) = ends
    src = apply(src, ranges)
    dst = dst[r1[0] : r1[1], r0[0] : r0[1]]
    args = tuple(dst if a is vals[0] and i == 0 else src if i == 1 else a for i, a in enumerate(args))
    kwargs = {k: (dst if k == "dst" else src if k in ("data", "src") else v) for k, v in kwargs.items()}
    return args, kwargs


#: matmuls a mask restricts by its operands' own variables (`_masked_matmul`)
_MATMULS = frozenset({"nc_matmul"})


def _dim_vars(v: NkiTensor, ranges: dict) -> list | None:
    """Per dim of a 2-D matmul operand, the variable a mask restricts it by (None: unrestricted),
    or None when that is ambiguous: an index view's own variables (one per index expression); a
    plain tile's dim d the mask variable of grid axis d and the dim's size, if only one such
    variable restricts."""
    if v.ndim != 2:
        return None
    if isinstance(v, IndexedTensor):
        out = []
        for k in v._exprs:
            terms = list(IndexExpr.of(k).terms) if isinstance(k, IndexExpr) else []
            if len(terms) > 1:
                return None
            out.append(terms[0] if terms else None)
        return out if len(out) == 2 else None
    out = []
    for d, n in enumerate(v.shape):
        cands = {r: var for var, r in ranges.items() if var is not None and var.axis == d and var.size == n}
        cands = {r: var for r, var in cands.items() if r != (0, n)}
        if len(cands) > 1:
            return None
        out.append(next(iter(cands.values()), None))
    return out


def _masked_matmul(args: tuple, kwargs: dict, ranges: dict):
    """`nc_matmul(dst, stationary, moving, mask=...)` (legacy: a partial last tile): the mask keeps
    a range of each operand dimension, the stationary's [K, M] and the moving's [K, N]: the
    product of the kept rows (K) and columns, written (or accumulated) into the kept [M, N] block
    of dst; the rest of dst is untouched. None when the operands are not of that form."""
    names = ("dst", "stationary", "moving")
    vals = dict(zip(names, args))
    vals.update({k: kwargs[k] for k in names if k in kwargs})
    dst, st, mv = (vals.get(k) for k in names)
    if not all(isinstance(t, NkiTensor) for t in (dst, st, mv)) or dst.ndim != 2:
        return None
    kept = []
    for v in (st, mv):
        dims = _dim_vars(v, ranges)
        if dims is None:
            return None
        rs = [ranges.get(var, (0, n)) if var is not None else (0, n) for var, n in zip(dims, v.shape)]
        if isinstance(v, IndexedTensor):
            w = apply(v, {var: ranges[var] for var in dims if var is not None and var in ranges})
        else:
            w = v[rs[0][0] : rs[0][1], rs[1][0] : rs[1][1]]
        kept.append((w, rs))
    k_full = (0, st.shape[0]), (0, mv.shape[0])
    (st, (k_st, m)), (mv, (k_mv, n)) = kept
    if k_mv == k_full[1] and k_st != k_full[0]:  # the contraction is shared: a mask on one
        k_mv, mv = k_st, mv[k_st[0] : k_st[1]]  # operand's rows keeps the other's too
    elif k_st == k_full[0] and k_mv != k_full[1]:
        k_st, st = k_mv, st[k_mv[0] : k_mv[1]]
    if k_st[1] - k_st[0] != k_mv[1] - k_mv[0]:
        raise ShapeError(
            f"nc_matmul mask keeps {k_st[1] - k_st[0]} contraction rows of stationary but "
            f"{k_mv[1] - k_mv[0]} of moving",
            rule="nki_matmul_mask_contraction",
        )
    if isinstance(dst, IndexedTensor):
        dims = _dim_vars(dst, ranges)
        if dims is None:
            return None
        own = {var: ranges[var] for var in dims if var is not None and var in ranges}
        dst = apply(dst, own) if own else dst
        if not own:
            dst = dst[m[0] : m[1], n[0] : n[1]]
    else:
        dst = dst[m[0] : m[1], n[0] : n[1]]
    new = {"dst": dst, "stationary": st, "moving": mv}
    args = tuple(new[names[i]] if i < 3 else a for i, a in enumerate(args))
    kwargs = {k: new.get(k, v) for k, v in kwargs.items()}
    return args, kwargs


def mask_call(opname: str, args: tuple, kwargs: dict):
    """Arguments of a `nisa.<opname>` call restricted by its `mask=` and the active masks;
    None when the mask selects nothing (the instruction is skipped)."""
    mask = kwargs.pop("mask", None)
    with masked(mask):
        if not masks():
            return _resolve_unmasked(args), kwargs
        ranges = _current_ranges()
        if ranges is None:
            return None
        restricting = [v for v, r in ranges.items() if v is None or r != (0, v.size)]
        if opname in _TRANSPOSES and restricting:
            swapped = _masked_transpose(args, kwargs, ranges)
            if swapped is not None:
                return swapped
        if opname in _MATMULS and restricting:
            kept = _masked_matmul(args, kwargs, ranges)
            if kept is not None:
                return kept
        if opname in _UNMASKABLE and restricting:  # a mask true on the whole grid restricts nothing
            raise not_supported(f"mask= on nki.isa.{opname}", "slice its operands instead", rule="nki_mask_unsupported")
        args = tuple(apply(a, ranges) for a in args)
        kwargs = {k: apply(v, ranges) for k, v in kwargs.items()}
        return args, kwargs


def _resolve_unmasked(args):
    for a in args:
        if isinstance(a, IndexedTensor) and a._oob:
            raise ShapeError(
                f"index expressions {a._exprs!r} run outside the {a._base.shape} tensor (no mask)",
                rule="nki_index_out_of_bounds",
            )
    return args


def needs_mask_handling(kwargs: dict) -> bool:
    return "mask" in kwargs or bool(masks())


def iota_pattern(expr, dense: bool = False) -> tuple[list, int, int]:
    """(pattern, offset, channel_multiplier) of `nisa.iota` / `affine_select` for an expression
    over a grid whose axis 0 is the partition: value = offset + p*cm + sum(step * idx)."""
    e = IndexExpr.of(expr)
    shape = grid_size(e, dense)
    cm = 0
    steps = [0] * len(shape)
    for v, c in e.terms.items():
        if v.axis == 0:
            cm += c
        else:
            steps[v.axis] += c
    pattern = [[steps[a], shape[a]] for a in range(1, len(shape))] or [[0, 1]]
    return pattern, e.const, cm


def grid_size(expr, dense: bool = False) -> list:
    """The grid an expression spans; `dense`: an `nl.mgrid` variable's whole grid (iota)."""
    e = IndexExpr.of(expr)
    shape = _grid([e])
    if dense:
        for v in e.terms:
            if v.grid is not None and len(v.grid) == len(shape):
                shape = [max(a, b) for a, b in zip(shape, v.grid)]
    return shape


def prod(xs) -> int:
    return math.prod(xs)


# What _kernel calls back (`_kernel.upcalls`): legacy index expressions and index tiles in NkiTensor
# keys (`t[i_p, i_f]`), and a tile plus an index (`tile + i` is a run-time index).
_kernel.upcalls.has_expr, _kernel.upcalls.has_tile, _kernel.upcalls.ds_past_end = has_expr, has_tile, ds_past_end
_kernel.upcalls.index_view = index_view
_kernel.upcalls.index_types, _kernel.upcalls.dyn_index = (IndexExpr, DynIndex), DynIndex.of
