"""The per-call-site caches of tracing (issue 30, NKI tracing speed): an instruction's label is
its kernel line, looked up per code object by instruction offset (`_emit.kernel_site`,
`_emit.site_at`), a line's tile kind is found again by offset (`TraceContext.tile`), and op tokens'
names are kept per token by the native call plan (`by_identity`). Each cache must not hand one
site's, kind's or token's answer to another: lines are checked against the kernel's source text,
values against numpy."""

import inspect

import ml_dtypes
import numpy as np
import trn3emu.nki as tn

tn.install()
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


def _line_of(fn, text: str) -> int:
    """The source line number of the line of `fn` containing `text` (exactly one)."""
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def _scale(dst, src):
    nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=0.5)  # helper-line


def test_labels_follow_call_sites_across_code_objects():
    """A kernel line and a helper's line issued alternately (the cache switches code objects
    every call) each keep their own label; a line whose op token alternates gets each token's op."""
    ops = (nl.add, nl.subtract)

    @nki.jit
    def k(x, y):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        a = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=y)
        for i in range(4):
            nisa.tensor_tensor(dst=a, data1=a, data2=b, op=ops[i % 2])  # kernel-line
            _scale(a, a)
        nisa.dma_copy(dst=out, src=a)
        return out

    rng = np.random.default_rng(3)
    x = rng.integers(-8, 8, (128, 64)).astype(np.float32)
    y = rng.integers(-8, 8, (128, 64)).astype(np.float32)
    got = k(x, y)
    want = x.copy()
    for i in range(4):
        want = (want + y if i % 2 == 0 else want - y) * np.float32(0.5)
    np.testing.assert_array_equal(got, want)  # (exact: small integers and halvings)

    prog = k.last_programs[0]
    texts = [prog.instruction(i) for i in range(len(prog))]
    file = __file__.rsplit("/", 1)[-1]
    kernel_line = f"name={file}:{_line_of(k.fn, '# kernel-line')}"
    helper_line = f"name={file}:{_line_of(_scale, '# helper-line')}"
    tt = [t for t in texts if t.startswith("tensor_tensor")]
    ts = [t for t in texts if t.startswith("tensor_scalar")]
    assert len(tt) == 4 and len(ts) == 4
    assert all(t.endswith(kernel_line) for t in tt), tt
    assert all(t.endswith(helper_line) for t in ts), ts
    assert [" op=add " in t for t in tt] == [True, False, True, False]
    assert [" op=subtract " in t for t in tt] == [False, True, False, True]


def test_tile_kind_per_line_follows_shape_and_dtype():
    """One `nl.ndarray` line allocating alternately two shapes and dtypes gets the tile kind asked
    for each time (the line's cached kind is only reused when shape, dtype, buffer and name match)."""
    kinds = (((128, 32), nl.float32), ((64, 16), nl.bfloat16))

    @nki.jit
    def k(x):
        out = nl.ndarray((128, 4 * 32), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in range(4):
            shape, dt = kinds[i % 2]
            t = nl.ndarray(shape, dtype=dt, buffer=nl.sbuf)
            p, f = shape
            nisa.dma_copy(dst=t, src=x[0:p, 0:f])
            w = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=w, src=t)
            nisa.dma_copy(dst=out[0:p, i * 32 : i * 32 + f], src=w)
        return out

    x = (np.arange(128 * 32, dtype=np.float32).reshape(128, 32) % 251) + 0.25
    got = k(x)
    bf = x.astype(ml_dtypes.bfloat16).astype(np.float32)  # (round to nearest even, as the DMA's cast)
    for i in range(4):
        (p, f), _ = kinds[i % 2]
        want = x[0:p, 0:f] if i % 2 == 0 else bf[0:p, 0:f]
        np.testing.assert_array_equal(got[0:p, i * 32 : i * 32 + f], want)
    prog = k.last_programs[0]
    texts = [prog.instruction(i) for i in range(len(prog))]
    copies = [t for t in texts if t.startswith("tensor_copy")]
    assert [("bfloat16[0:64]" in t) for t in copies] == [False, True, False, True], copies
