"""`jax_call(kernel, *args)`: an NKI kernel inside `jax.jit` (docs/nki.md, "JAX").

Under `jax.jit` the arguments are tracers with shapes but no values, and the emulator needs
values, so the kernel runs as a host callback (`jax.pure_callback`): the jitted function passes
the arrays out to numpy when it executes, trn3emu runs the kernel and the results come back as
JAX arrays. A callback must declare its results' shapes before it runs: they are found by
running the kernel once on zeros of the argument shapes (once per kernel, grid and signature; the
trace cache then makes the real call cheap). The kernel must be a pure function of its inputs
(inputs it writes are not written back through a callback).
"""

from __future__ import annotations

import numpy as np

#: (kernel, grid, argument shapes and dtypes, static arguments) -> the results' shape tree
_SHAPES: dict = {}


def jax_call(kernel, *args, grid=None, **static):
    """`kernel(*args, **static)` (`kernel[grid]` with a grid) as a `jax.pure_callback`: usable
    inside `jax.jit`, `jax.lax` control flow and on plain JAX arrays; returns JAX arrays in the
    kernel's result structure. `static`: non-array keyword arguments of the kernel."""
    import jax

    run = kernel if grid is None else kernel[grid]
    sig = tuple((tuple(np.shape(a)), np.dtype(a.dtype).str) for a in args)
    key = (id(kernel), grid, sig, tuple(sorted(static.items())))
    result = _SHAPES.get(key)
    if result is None or result[0] is not kernel:
        zeros = [np.zeros(np.shape(a), np.dtype(a.dtype)) for a in args]
        out = run(*zeros, **static)
        shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), out)
        result = _SHAPES[key] = (kernel, shapes)

    def host(*xs):
        out = run(*[np.asarray(x) for x in xs], **static)
        return jax.tree_util.tree_map(np.asarray, out)

    return jax.pure_callback(host, result[1], *args)


__all__ = ["jax_call"]
