"""M:N structured sparsity for `nc_matmul_sparse` (docs/sparsity.md).

A dense stationary matrix ``w[K, M]`` has an ``s:g`` pattern when every group of ``g`` contiguous
rows of a column (rows ``j*g .. j*g+g-1``) holds at most ``s`` non-zeros. Its compressed form is

* ``values[Kc, M]`` (``Kc = K*s/g``, w's dtype): compressed row ``c`` belongs to group ``j = c // s``;
* ``metadata[Kc, M]`` (uint8 by default): the position ``0..g-1`` of each value within its group,
  so ``values[c, m] == w[(c // s) * g + metadata[c, m], m]``.

`compress` keeps the non-zeros of each group in increasing position and fills a group with fewer
than ``s`` non-zeros with its first zero positions (values 0), so every group lists ``s`` distinct
positions in increasing order. The moving operand stays dense: ``[K, N]`` laid out
``[Kc, g/s, N]`` (`moving_layout`), dense row ``k = (g/s)*p + r``.

Patterns are written ``"4:16"`` (or the ISA enum name ``"m4_n16"``): 4:16, 4:12, 4:8, 2:8, 2:4,
1:4, 1:2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import OperandError, ShapeError

#: ``"s:g"`` -> (s, g), in the order of the ISA enum ``sparsity_pattern``.
PATTERNS: dict[str, tuple[int, int]] = {
    "4:16": (4, 16),
    "4:12": (4, 12),
    "4:8": (4, 8),
    "2:8": (2, 8),
    "2:4": (2, 4),
    "1:4": (1, 4),
    "1:2": (1, 2),
}


def parse_pattern(pattern: Any) -> tuple[int, int]:
    """(s, g) of a pattern given as ``"4:16"``, ``"m4_n16"`` or an enum member with such a name."""
    name = getattr(pattern, "name", pattern)
    if isinstance(name, str):
        key = name
        if name.startswith("m") and "_n" in name:
            key = name[1:].replace("_n", ":", 1)
        if key in PATTERNS:
            return PATTERNS[key]
    raise OperandError(
        f"sparsity pattern {pattern!r} is not one of {', '.join(PATTERNS)}",
        operand="pattern",
        rule="sparsity_pattern_unknown",
    )


def pattern_name(pattern: Any) -> str:
    """The ISA enum name (``m4_n16``) of a pattern."""
    s, g = parse_pattern(pattern)
    return f"m{s}_n{g}"


def _matrix(a: Any, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 2:
        raise ShapeError(
            f"{name} must be a 2-D [rows, columns] array, got shape {arr.shape}", operand=name, rule="sparsity_shape"
        )
    return arr


def compress(w: Any, pattern: Any, *, index_dtype: Any = np.uint8) -> tuple[np.ndarray, np.ndarray]:
    """``w[K, M]`` with an ``s:g`` pattern along K -> (values ``[K*s/g, M]``, metadata ``[K*s/g, M]``).

    Raises `OperandError` (rule ``sparsity_pattern_violated``) naming the first group (in order of
    group, then column) with more than ``s`` non-zeros, `ShapeError` (``sparsity_shape``) when K is
    not a multiple of ``g``."""
    s, g = parse_pattern(pattern)
    w = _matrix(w, "w")
    k, m = w.shape
    if k % g or k == 0:
        raise ShapeError(
            f"w has {k} rows, not a positive multiple of the group size {g} of {s}:{g}",
            operand="w",
            rule="sparsity_shape",
        )
    groups = w.reshape(k // g, g, m)
    nonzero = groups != 0
    counts = nonzero.sum(axis=1)
    bad = np.argwhere(counts > s)
    if len(bad):
        j, col = (int(x) for x in bad[0])
        rows = [j * g + int(i) for i in np.flatnonzero(nonzero[j, :, col])]
        raise OperandError(
            f"w violates {s}:{g}: group {j} of column {col} (rows {j * g}..{j * g + g - 1}) has "
            f"{int(counts[j, col])} non-zeros (rows {rows}), at most {s} allowed",
            operand="w",
            rule="sparsity_pattern_violated",
        )
    # Non-zeros first (then zeros), each by position; keep s; list them in increasing position.
    key = np.where(nonzero, 0, g) + np.arange(g)[None, :, None]
    sel = np.sort(np.argsort(key, axis=1, kind="stable")[:, :s, :], axis=1)
    values = np.take_along_axis(groups, sel, axis=1).reshape(k * s // g, m)
    return values, sel.reshape(k * s // g, m).astype(index_dtype)


def decompress(values: Any, metadata: Any, pattern: Any) -> np.ndarray:
    """The dense ``[Kc*g/s, M]`` matrix of a compressed pair (zeros where nothing is kept).

    Raises `ShapeError` (``sparsity_shape``) for mismatched shapes or a partial group, and
    `OperandError` naming the first group (group, then column) with an index outside ``0..g-1``
    (``sparse_index_out_of_range``) or a repeated index (``sparse_index_repeated``)."""
    s, g = parse_pattern(pattern)
    values = _matrix(values, "values")
    meta = _matrix(metadata, "metadata")
    if meta.shape != values.shape:
        raise ShapeError(
            f"metadata shape {meta.shape} must equal values shape {values.shape}",
            operand="metadata",
            rule="sparsity_shape",
        )
    kc, m = values.shape
    if kc % s or kc == 0:
        raise ShapeError(
            f"values has {kc} rows, not a positive multiple of {s} (whole {s}:{g} groups)",
            operand="values",
            rule="sparsity_shape",
        )
    if not np.issubdtype(meta.dtype, np.integer):
        raise ShapeError(f"metadata must be integers, got {meta.dtype}", operand="metadata", rule="sparsity_shape")
    idx = meta.astype(np.int64).reshape(kc // s, s, m)
    _check_indices(idx, s, g)
    dense = np.zeros((kc // s, g, m), values.dtype)
    np.put_along_axis(dense, idx, values.reshape(kc // s, s, m), axis=1)
    return dense.reshape(kc * g // s, m)


def _check_indices(idx: np.ndarray, s: int, g: int) -> None:
    """Every group (axis 1 of ``idx[groups, s, M]``) in range and without repeats; the first bad
    group (group, then column) is named."""
    out = ((idx < 0) | (idx >= g)).any(axis=1)
    srt = np.sort(idx, axis=1)
    rep = (srt[:, 1:, :] == srt[:, :-1, :]).any(axis=1) if s > 1 else np.zeros_like(out)
    bad = np.argwhere(out | rep)
    if not len(bad):
        return
    j, col = (int(x) for x in bad[0])
    found = [int(x) for x in idx[j, :, col]]
    where = f"group {j} of column {col} (rows {j * s}..{j * s + s - 1}) has indices {found}"
    if out[j, col]:
        raise OperandError(f"{where}: outside 0..{g - 1}", operand="metadata", rule="sparse_index_out_of_range")
    raise OperandError(f"{where}: an index repeats", operand="metadata", rule="sparse_index_repeated")


def moving_layout(b: Any, pattern: Any) -> np.ndarray:
    """The dense moving operand ``b[K, N]`` as ``nc_matmul_sparse`` reads it: ``[K*s/g, g/s, N]``
    (a row-major reshape: dense row ``k = (g/s)*p + r``)."""
    s, g = parse_pattern(pattern)
    b = _matrix(b, "moving")
    k, n = b.shape
    r = g // s
    if k % g:
        raise ShapeError(
            f"moving has {k} rows, not a multiple of {g} ({s}:{g})", operand="moving", rule="sparsity_shape"
        )
    return b.reshape(k // r, r, n)


__all__ = ["PATTERNS", "compress", "decompress", "moving_layout", "parse_pattern", "pattern_name"]
