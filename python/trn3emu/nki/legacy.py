"""The legacy `neuronxcc.nki` dialect (Neuron SDK <= 2.26) on the same front end.

Differences from NKI 0.6 handled here: `nisa.*` calls return a new tile instead of taking a `dst`
(shape, dtype and buffer of the result follow the operation; `dtype=` casts it), every call takes
`mask=` (`indexing.masked`), `iota` / `affine_select` take index expressions, `memset` makes a tile,
and the harness entry points `nki.simulate_kernel`, `nki.baremetal`, `nki.benchmark`, `nki.profile`
and `@nki.jit(mode=...)` run the kernel on trn3emu. `nki.language` is shared (its ops already return
tiles and accept `mask=`, `nl.arange`, `nl.mgrid`, `nl.par_dim`).
"""

from __future__ import annotations

import inspect
import math
import types
from typing import Any

from .._asm import INSTRUCTIONS, AssemblerMixin
from . import indexing, toolchain
from . import isa as nisa
from . import language as nl
from ._kernel import Kernel, NkiTensor, _Launcher, current, jit, missing_attribute, not_supported
from .pending import Pending, result
from .profiling import benchmark, profile

_DST = object()  # placeholder bound to the dst parameter while reading a legacy call

# The operand whose shape (and dtype) a legacy result takes, in order of preference.
_SHAPE_FROM = ("data", "src", "data1", "data0", "on_true_tile", "on_true", "src_buffer")


def _tensors(args: dict) -> list:
    return [v for v in args.values() if isinstance(v, NkiTensor)]


def _out_spec(opname: str, a: dict, dtype: Any) -> tuple:
    """(shape, dtype, buffer) of the tile a legacy `nisa.<opname>(...)` returns."""
    if opname == "nc_matmul":
        st, mv = a["stationary"], a["moving"]
        if str(getattr(a.get("perf_mode"), "name", a.get("perf_mode"))).startswith("double_row"):
            return (st.shape[-1], mv.shape[-1]), dtype or nl.float32, nl.psum  # [K, 2, M] x [K, 2, N]
        m, n = math.prod(st.shape[1:]), math.prod(mv.shape[1:])
        if a.get("is_transpose"):  # a PE transpose writes its input's dtype (NeuronCore-v3 on)
            return (m, n), dtype or st.dtype, nl.psum
        return (m, n), dtype or nl.float32, nl.psum
    if opname == "nc_transpose":
        d = a["data"]
        on_vector = str(getattr(a.get("engine"), "name", a.get("engine"))) == "vector"
        return (d.shape[1], d.shape[0]), dtype or d.dtype, nl.sbuf if on_vector else nl.psum
    if opname == "dma_transpose":
        d = a["src"]
        perm = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}.get(d.ndim)
        if perm is None:
            raise not_supported(f"legacy dma_transpose of a {d.ndim}-D tile", rule="nki_legacy_transpose_rank")
        return tuple(d.shape[i] for i in perm), dtype or d.dtype, nl.sbuf
    if opname == "tensor_reduce":
        d = a["data"]
        axes = nl._axes(d, a.get("axis"))
        keep = bool(a.get("keepdims", False))
        shape = (
            [1 if i in axes else n for i, n in enumerate(d.shape)]
            if keep
            else [n for i, n in enumerate(d.shape) if i not in axes]
        )
        if len(shape) < 2:
            shape = list(shape) + [1]
        return tuple(shape), dtype or d.dtype, nl.sbuf
    if opname == "tensor_partition_reduce":
        d = a["data"]
        return (1,) + tuple(d.shape[1:]), dtype or d.dtype, nl.sbuf
    if opname == "bn_stats":
        d = a["data"]
        return (d.shape[0], 6), dtype or nl.float32, nl.sbuf
    if opname == "bn_aggr":
        d = a["data"]
        return (d.shape[0], 2), dtype or nl.float32, nl.sbuf
    if opname in ("max8",):
        d = a["src"]
        return (d.shape[0], 8), dtype or d.dtype, nl.sbuf
    if opname == "local_gather":  # (P, valid indices per GpSimd core, elements per index)
        d, idx = a["src_buffer"], a["index"]
        valid = a.get("num_valid_indices") or 16 * math.prod(idx.shape[1:])
        return (d.shape[0], int(valid), int(a.get("num_elem_per_idx") or 1)), dtype or d.dtype, nl.sbuf
    if opname == "sequence_bounds":  # (P, 2, n): the start and end rows of each id's segment
        d = a["segment_ids"]
        return (d.shape[0], 2) + tuple(d.shape[1:]), dtype or d.dtype, nl.sbuf
    if opname == "nc_find_index8":
        d = a["data"]
        return (d.shape[0], 8), dtype or nl.uint32, nl.sbuf
    src = next((a[k] for k in _SHAPE_FROM if isinstance(a.get(k), NkiTensor)), None)
    if src is None:
        ts = _tensors(a)
        if not ts:
            raise not_supported(f"legacy nki.isa.{opname} without a tensor operand", "pass dst", rule="nki_call_form")
        src = ts[0]
    odt = dtype
    if odt is None:
        ts = [a[k] for k in ("data1", "data2") if isinstance(a.get(k), NkiTensor)]
        odt = nl.promote(ts[0].dtype, ts[1].dtype) if len(ts) == 2 else src.dtype
    return tuple(src.shape), odt, nl.sbuf


#: Pass `inplace_assign` (`toolchain.py`): SBUF results of these ops are pending, so `t[...] =
#: nisa.op(...)` writes t (the op writes its whole dst and never reads it).
INPLACE_OPS = frozenset(
    "tensor_tensor tensor_scalar activation tensor_copy scalar_tensor_tensor tensor_reduce tensor_partition_reduce "
    "tensor_tensor_scan bn_stats bn_aggr exponential reciprocal max8 nc_find_index8 select tensor_scalar_reduce "
    "iota nc_transpose transpose".split()
)
#: ... of which these read element i of each operand of the result's shape for element i
ELEMENTWISE_OPS = frozenset(
    "tensor_tensor tensor_scalar activation tensor_copy scalar_tensor_tensor exponential reciprocal select".split()
)
#: ... and these compute in fp32 and round once when writing dst (reference §3.3)
FP32_ALU_OPS = frozenset(
    "tensor_tensor tensor_scalar activation scalar_tensor_tensor tensor_reduce tensor_partition_reduce "
    "exponential reciprocal".split()
)

#: legacy PSUM results not issued yet, in call order (see `_Pending`)
_Pending = Pending  # value-returning PSUM results are pending results (`pending.py`)


def _legacy(opname: str):
    new = getattr(nisa, opname)
    sig = inspect.signature(getattr(AssemblerMixin, opname))
    # Per call form (number of positional operands, keyword names) that bound once: the operand
    # names in `sig.bind`'s order (a signature without *args / **kwargs binds every call of a
    # form alike, so the form is bound once, not per call).
    fixed = all(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values())
    forms: dict[tuple, tuple] = {}
    origin = f"nki.isa.{opname}"

    def operands(args: tuple, kwargs: dict) -> dict:
        """`sig.bind(None, dst, *args, **kwargs)`'s arguments after self and dst."""
        key = (len(args), *kwargs)
        names = forms.get(key)
        if names is None:
            try:
                bound = sig.bind(None, _DST, *args, **kwargs)
            except TypeError as e:
                raise not_supported(f"legacy nki.isa.{opname} call form ({e})", rule="nki_call_form") from None
            a = dict(list(bound.arguments.items())[2:])
            if fixed:
                forms[key] = tuple(a)
            return a
        a = dict(zip(names, args))
        for k in names[len(args) :]:
            a[k] = kwargs[k]
        return a

    def fn(*args, dtype=None, mask=None, **kwargs):
        extra = {} if mask is None else {"mask": mask}
        if "dst" in kwargs:  # legacy ops that took dst (dma_copy, ...): operands follow dst
            dst = kwargs.pop("dst")
            return new(dst, *args, **kwargs, **extra)
        if opname == "tensor_copy_predicated" and len(args) >= 2:  # legacy order (src, dst, predicate)
            return new(args[1], args[0], *args[2:], **kwargs, **extra)
        a = operands(args, kwargs)
        if opname == "nc_matmul":  # TensorE reads SBUF: PSUM operands go through SBUF (as the compiler did)
            for k in ("stationary", "moving"):
                if isinstance(a.get(k), NkiTensor) and a[k].buffer == nl.psum:
                    a[k] = nl._sbuf_operand(a[k])
        shape, odt, buf = _out_spec(opname, a, dtype)
        if buf == nl.psum and (mask is None or opname == "nc_matmul") and not indexing.active():
            # (a masked nc_matmul writes, or accumulates into, the kept [M, N] block of its target:
            # `indexing._masked_matmul`; the legacy partial last tile)
            accumulate = (lambda dst: new(dst, **a, accumulate=True, **extra)) if opname == "nc_matmul" else None
            return Pending(
                (shape, odt, buf),
                lambda dst: new(dst, **a, **extra),
                accumulate,
                origin=origin,
                partial=mask is not None,
            )
        if (
            buf == nl.sbuf
            and mask is None
            and opname in INPLACE_OPS
            and not indexing.active()
            and toolchain.enabled("inplace_assign")
        ):
            # (`InPlace`'s arguments: built if the result is assigned, as `nl` results do)
            ip = (tuple(a.values()), opname in ELEMENTWISE_OPS, opname in FP32_ALU_OPS)
            return result(current(), (shape, odt, buf), lambda dst: new(dst, **a), origin, ip)
        out = nl.ndarray(shape, odt, buffer=buf)
        new(out, **a, **extra)
        if opname in indexing._TRANSPOSES:  # the mask's rows are the result's columns:
            return out  # the whole tile is the value (only the masked part was written)
        return indexing.tag(out, mask)

    fn.__name__ = fn.__qualname__ = opname
    fn.__doc__ = f"Legacy value-returning `nki.isa.{opname}` (returns a new tile; `dtype=` casts, `mask=` restricts)."
    fn.__signature__ = _legacy_signature(new)
    return fn


def _legacy_signature(new) -> inspect.Signature:
    """The NKI 0.6 signature without its leading dst, plus keyword-only `dtype` (the result's cast)
    and `dst` (legacy operations that took one)."""
    params = list(inspect.signature(new).parameters.values())[1:]
    have = {p.name for p in params}
    params += [
        inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in ("dtype", "dst") if k not in have
    ]
    return inspect.Signature(params, return_annotation=NkiTensor)


def _restrict(mask, shape, pattern, offset, cm):
    """For a pattern-generating op (iota, affine_select) under `mask`: the per-dim slices of the
    operands and the pattern / offset of the restricted sub-grid (the value at an element is the
    same as in the whole tile). None when the mask selects nothing."""
    with indexing.masked(mask):
        ranges = indexing._current_ranges()
    if ranges is None:
        return None
    key = []
    for d, n in enumerate(shape):
        lo, hi = 0, n
        for var, (a, b) in ranges.items():
            if var is not None and var.axis == d and var.size == n:
                lo, hi = max(lo, a), min(hi, b)
        key.append(slice(lo, hi))
    offset += cm * key[0].start + sum(p[0] * k.start for p, k in zip(pattern, key[1:]))
    pattern = [[p[0], k.stop - k.start] for p, k in zip(pattern, key[1:])] or pattern
    return tuple(key), pattern, offset


def iota(expr, dtype, mask=None, **kwargs):
    """Legacy `iota(expr, dtype)`: a tile holding the value of an index expression at every
    grid point (grid axis 0 = partitions; an `nl.mgrid` variable's whole grid, as numpy's dense
    mgrid arrays broadcast) -> `nisa.iota(pattern, offset, channel_multiplier)`."""
    shape = indexing.grid_size(expr, dense=True)
    if len(shape) < 2:
        shape = [1] + shape
    pattern, offset, cm = indexing.iota_pattern(expr, dense=True)
    out = nl.ndarray(tuple(shape), dtype, buffer=nl.sbuf)
    r = _restrict(mask, out.shape, pattern, offset, cm)
    if r is not None:
        key, pattern, offset = r
        nisa.iota(out[key], pattern=pattern, offset=offset, channel_multiplier=cm, **kwargs)
    return indexing.tag(out, mask)


def affine_select(pred, on_true_tile, on_false_value, dtype=None, mask=None, **kwargs):
    """Legacy `affine_select(pred, on_true_tile, on_false_value)`: `pred` is one affine comparison
    of index expressions over the tile's grid (axis 0 = partitions), e.g. causal `i_q >= i_k`."""
    if not isinstance(pred, indexing.Predicate):
        raise not_supported(
            f"affine_select(pred={pred!r})", "pred is a comparison of index expressions", rule="nki_affine_select_pred"
        )
    cons = pred.cons
    if len(cons) == 1:
        e, cmp = cons[0], "greater_equal"
    elif len(cons) == 2 and all(not (a + b).terms and (a + b).const == 0 for a, b in [cons]):
        e, cmp = cons[0], "equal"
    else:
        raise not_supported(
            "affine_select with a conjunction", "one comparison per affine_select", rule="nki_affine_select_pred"
        )
    pattern, offset, cm = indexing.iota_pattern(e)
    t = on_true_tile
    if t.buffer == "psum":  # GpSimd reads SBUF only: the operand goes through SBUF (as the compiler did)
        t = nl._sbuf_operand(t)
    free = list(t.shape[1:])
    steps = [p[0] for p in pattern] + [0] * max(0, len(free) - len(pattern))
    pattern = [[steps[i], n] for i, n in enumerate(free)] or [[0, 1]]
    out = nl.ndarray(t.shape, dtype or t.dtype, buffer=nl.sbuf)
    r = _restrict(mask, out.shape, pattern, offset, cm)
    if r is not None:
        key, pattern, offset = r
        nisa.affine_select(
            out[key],
            pattern=pattern,
            channel_multiplier=cm,
            on_true_tile=t[key],
            on_false_value=on_false_value,
            cmp_op=cmp,
            offset=offset,
            **kwargs,
        )
    return indexing.tag(out, mask)


def memset(shape, value, dtype, mask=None, **kwargs):
    """Legacy `memset(shape, value, dtype)`: a new SBUF tile filled with value."""
    out = nl.ndarray(shape, dtype, buffer=kwargs.pop("buffer", nl.sbuf))
    extra = {} if mask is None else {"mask": mask}
    nisa.memset(out, value=value, **kwargs, **extra)
    return indexing.tag(out, mask)


def activation_reduce(op, data, reduce_op, reduce_res, bias=None, scale=1.0, dtype=None, mask=None, **kwargs):
    """Legacy `activation_reduce`: activation with a free-dim reduction into reduce_res."""
    out = nl.ndarray(data.shape, dtype or data.dtype, buffer=nl.sbuf)
    extra = {} if mask is None else {"mask": mask}
    nisa.activation_reduce(
        out, op=op, data=data, reduce_op=reduce_op, reduce_res=reduce_res, bias=bias, scale=scale, **kwargs, **extra
    )
    return indexing.tag(out, mask)


def tensor_copy_dynamic_src(src, dtype=None, mask=None, **kwargs):
    """Legacy copy from a view with a run-time index (`t[ix, offsets[0, i] + iy]`) into a new
    SBUF tile: a DMA (`dma_copy`; dynamic offsets are DMA operands)."""
    out = nl.ndarray(src.shape, dtype or src.dtype, buffer=nl.sbuf)
    extra = {} if mask is None else {"mask": mask}
    nisa.dma_copy(dst=out, src=src, **extra)
    return indexing.tag(out, mask)


def tensor_copy_dynamic_dst(dst, src, mask=None, dtype=None, **kwargs):
    """Legacy copy into a view with a run-time index (`dma_copy`)."""
    extra = {} if mask is None else {"mask": mask}
    return nisa.dma_copy(dst=dst, src=src, **extra)


def dma_copy(*args, dst_rmw_op=None, **kwargs):
    """Legacy `dma_copy(dst=, src=, dst_rmw_op=np.add)`: the DMA read-modify-write dst = dst + src
    (`dma_compute`, as `nl.atomic_rmw`; an index-tile dst is a scatter-add, indices unique); without
    `dst_rmw_op` the NKI 0.6 `dma_copy`."""
    if dst_rmw_op is None:
        return nisa.dma_copy(*args, **kwargs)
    if nisa.op_name(dst_rmw_op) != "add":
        raise not_supported(
            f"nki.isa.dma_copy(dst_rmw_op={nisa.op_name(dst_rmw_op)})",
            "the DMA read-modify-write adds",
            rule="nki_atomic_rmw_op",
        )
    try:
        b = inspect.signature(nisa.dma_copy).bind(*args, **kwargs).arguments
    except TypeError as e:
        raise not_supported(f"legacy nki.isa.dma_copy call form ({e})", rule="nki_call_form") from None
    extra = {k: b[k] for k in ("oob_mode", "engine", "name", "mask") if b.get(k) is not None}
    dst, src = b["dst"], nl._sbuf_operand(b["src"])
    return nisa.dma_compute(dst, [dst, src], reduce_op="add", **extra)


def _make_isa_module() -> types.ModuleType:
    mod = types.ModuleType("neuronxcc.nki.isa", "Legacy value-returning nki.isa (see trn3emu.nki.legacy).")
    for k, v in vars(nisa).items():
        if not k.startswith("__"):
            setattr(mod, k, v)
    for name, (_, _, params) in INSTRUCTIONS.items():
        if (
            params
            and params[0][0] == "dst"
            and name not in ("dma_copy", "dma_compute", "scalar_load")
            and name not in nisa.EXTENSIONS
        ):
            setattr(mod, name, _legacy(name))
    mod.iota, mod.affine_select, mod.memset, mod.activation_reduce = iota, affine_select, memset, activation_reduce
    mod.tensor_copy_dynamic_src, mod.tensor_copy_dynamic_dst = tensor_copy_dynamic_src, tensor_copy_dynamic_dst
    mod.dma_copy = dma_copy

    def _missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise missing_attribute(f"neuronxcc.nki.isa.{name}")

    mod.__getattr__ = _missing
    return mod


isa = _make_isa_module()


# ------------------------------------------------------------------------------- harness entries
def _kernel(k) -> Kernel | _Launcher:
    return k if isinstance(k, (Kernel, _Launcher)) else Kernel(k, dialect="legacy")


def simulate_kernel(kernel, *args, **kwargs):
    """`nki.simulate_kernel(kernel, *arrays)`: run on trn3emu (numpy results; torch / JAX for torch / JAX inputs)."""
    return _kernel(kernel)(*args, **kwargs)


def baremetal(kernel=None, **options):
    """`nki.baremetal(...)(kernel)`: runs the kernel on trn3emu (no device or NEFF); options are accepted."""

    def wrap(k):
        return _kernel(k)

    return wrap if kernel is None else wrap(kernel)


def legacy_jit(fn=None, mode=None, **options):
    """`@nki.jit`, `@nki.jit(mode="simulation" | "baremetal" | ...)`: every mode runs on trn3emu
    (a legacy-dialect kernel: the legacy toolchain's passes apply, `toolchain.py`)."""
    options.setdefault("dialect", "legacy")
    return jit(fn, **options)


def make_package(pkg: types.ModuleType) -> types.ModuleType:
    """The `neuronxcc.nki` module: the new package's namespace with the legacy isa and entries."""
    mod = types.ModuleType("neuronxcc.nki", __doc__)
    for k, v in vars(pkg).items():
        if not k.startswith("__"):
            setattr(mod, k, v)
    mod.isa = isa
    mod.jit = legacy_jit
    mod.trace = legacy_jit
    mod.simulate_kernel = simulate_kernel
    mod.baremetal, mod.profile, mod.benchmark = baremetal, profile, benchmark

    def _missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise missing_attribute(f"neuronxcc.nki.{name}")

    mod.__getattr__ = _missing
    return mod


__all__ = ["isa", "simulate_kernel", "baremetal", "profile", "benchmark", "legacy_jit", "make_package"]
