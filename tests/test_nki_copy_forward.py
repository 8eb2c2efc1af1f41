"""The pass `copy_forward` (docs/nki.md, "Passes"; `CompileConfig(tensor_copy_elim=True)`, and
the copy half of `dead_code_elim`): a same-dtype `tensor_copy` whose readers can read its source
directly is dropped, its reads moved to the source. Results are compared with numpy, and the
instruction counts with counts worked out by hand from the kernel's source."""

from collections import Counter

import numpy as np
import trn3emu.nki as tn

tn.install()

import nki  # noqa: E402
import nki.compiler as ncc  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
from nki_util import normal_input, run_counted  # noqa: E402

ON, OFF = {"copy_forward": "on"}, {"copy_forward": "off"}


def run(fn, *arrays, **options):
    """(result, opcode counts, kernel)."""
    return run_counted(nki.jit, fn, *arrays, **options)


_input = normal_input


def _chain(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    u = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=u, src=x)
    v = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=v, src=u, engine=nisa.gpsimd_engine)
    y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=v, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out[:, 0:32], src=v[:, 0:32])  # a DMA reads the copy too
    nisa.dma_copy(dst=out[:, 32:64], src=y[:, 32:64])
    return out


def test_a_chain_of_copies_is_read_from_the_first_source():
    a = _input()
    want = np.concatenate([a[:, :32], a[:, 32:] + np.float32(1)], axis=1)
    (r, ops, k), (r_off, ops_off, _) = (run(_chain, a, passes=p) for p in (ON, OFF))
    np.testing.assert_array_equal(r, want)
    np.testing.assert_array_equal(r_off, want)
    assert ops_off == Counter({"dma_copy": 3, "tensor_copy": 2, "tensor_scalar": 1})
    assert ops == Counter({"dma_copy": 3, "tensor_scalar": 1})
    assert k.last_programs[0].copy_forward == 2


def test_a_copy_stays_when_its_source_changes_or_it_converts_or_a_read_reaches_past_it():
    def source_changes(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        u = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u, src=x)
        nisa.memset(dst=x, value=0.0)  # the source changes before the copy is read
        nisa.dma_copy(dst=out, src=u)
        return out

    def converts(a):
        out = nl.ndarray(a.shape, nl.float16, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        u = nl.ndarray(a.shape, nl.float16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u, src=x)  # fp32 -> fp16: not the identity
        nisa.dma_copy(dst=out, src=u)
        return out

    def read_past(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        u = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=u, value=1.0)
        nisa.tensor_copy(dst=u[:, 0:32], src=x[:, 0:32])
        nisa.dma_copy(dst=out, src=u)  # reads the copy and the memset's half
        return out

    a = _input(seed=1)
    for fn, want in [
        (source_changes, a),
        (converts, a.astype(np.float16)),
        (read_past, np.concatenate([a[:, :32], np.ones((128, 32), np.float32)], axis=1)),
    ]:
        r, ops, k = run(fn, a, passes=ON)
        np.testing.assert_array_equal(r, want)
        assert ops["tensor_copy"] == 1 and k.last_programs[0].copy_forward == 0, fn.__name__


def test_a_psum_copy_is_forwarded_to_vector_readers_only():
    def k(a, b, scale):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        s = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        nisa.dma_copy(dst=m, src=b)
        ps = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=s, moving=m)
        r = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=ps, engine=nisa.vector_engine)
        if scale:
            y = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=y, data=r, op0=nl.multiply, operand0=2.0, engine=nisa.vector_engine)
            r = y
        nisa.dma_copy(dst=out, src=r)  # (a DMA does not read PSUM here)
        return out

    rng = np.random.default_rng(3)
    a = rng.integers(-4, 4, (128, 128)).astype(np.float32)  # small integers: exact sums
    b = rng.integers(-4, 4, (128, 64)).astype(np.float32)
    for scale, copies in [(True, 0), (False, 1)]:
        r, ops, kk = run(lambda a, b, s=scale: k(a, b, s), a, b, passes=ON)
        np.testing.assert_array_equal(r, (2 if scale else 1) * (a.T @ b))
        assert ops["tensor_copy"] == copies and kk.last_programs[0].copy_forward == 1 - copies


def test_off_by_default_and_set_by_compile_config():
    a = _input(seed=2)
    want = np.concatenate([a[:, :32], a[:, 32:] + np.float32(1)], axis=1)

    def copies(**options):
        r, ops, k = run(_chain, a, **options)
        np.testing.assert_array_equal(r, want)
        return ops["tensor_copy"]

    assert copies() == copies(passes=OFF) == copies(passes="literal") == 2
    assert copies(compile_config=ncc.CompileConfig(tensor_copy_elim=True)) == 0
    assert copies(compile_config=ncc.CompileConfig(dead_code_elim=True)) == 0
    assert copies(compile_config=ncc.CompileConfig(dead_code_elim=True, tensor_copy_elim=False)) == 2
    assert copies(compile_config=ncc.CompileConfig(remove_unused_instructions=True)) == 2


def test_the_kernel_ir_says_what_was_dropped():
    a = _input(seed=4)
    k = nki.jit(_chain, passes=ON, ir=True)
    k(a)
    ir = k.last_ir
    assert ir.passes["copy_forward"] == "2 copies dropped, from 2 kernel lines; 3 reads moved to the source"
    assert [c.notes.get("copy_forward") is not None for c in ir.calls] == [False, True, True, False, False, False]
