"""The pass `psum_forward` (docs/nki.md, "Passes"): a partition broadcast's copy from PSUM to SBUF
is dropped when every reader of its result can read the PSUM result instead. Each kernel runs
with the pass on and off; results are compared with numpy (bit for bit: a broadcast and one
multiply are exact) and the programs' instructions counted by hand."""

from collections import Counter

import ml_dtypes
import numpy as np
import pytest
import trn3emu.nki as tn

tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


def opcodes(kernel) -> Counter:
    text = kernel.last_programs[0].to_text().splitlines()
    return Counter(line.split(".")[0].split()[0] for line in text if line and not line.startswith("."))


def _inputs(f=512, dtype=np.float32):
    rng = np.random.default_rng(0)
    return rng.standard_normal((128, f)).astype(dtype), rng.standard_normal((1, f)).astype(dtype)


def _bcast_then(reader):
    """x * broadcast(b) with the broadcast's reader chosen by `reader`."""

    def k(x, b):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        xt = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x)
        bt = nl.ndarray(b.shape, b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=bt, src=b)
        bb = nl.broadcast_to(bt, x.shape)
        y = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        if reader == "vector":
            nisa.tensor_tensor(dst=y, data1=xt, data2=bb, op=nl.multiply)
        elif reader == "scalar":  # ScalarE: x * b as activation(copy, scale=...) needs a column: b * 1
            nisa.activation(dst=y, op=nl.copy, data=bb, scale=1.0)
            nisa.tensor_tensor(dst=y, data1=xt, data2=y, op=nl.multiply)
        elif reader == "gpsimd":
            nisa.tensor_tensor(dst=y, data1=xt, data2=bb, op=nl.multiply, engine=nisa.gpsimd_engine)
        elif reader == "store":
            nisa.tensor_tensor(dst=y, data1=xt, data2=bb, op=nl.multiply)
            nisa.dma_copy(dst=out, src=bb)  # (the broadcast itself stored first)
        elif reader == "two_psum":
            p = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
            nisa.tensor_copy(dst=p, src=xt)
            nisa.tensor_tensor(dst=y, data1=p, data2=bb, op=nl.multiply)
        nisa.dma_copy(dst=out, src=y)
        return out

    return k


def _both(reader, x, b):
    got = []
    for setting in ("on", "off"):
        k = nki.jit(_bcast_then(reader), passes={"psum_forward": setting}, ir=True)
        got.append((k(x, b), opcodes(k), k))
    return got


@pytest.mark.parametrize("reader", ["vector", "scalar"])
def test_a_broadcast_read_by_vector_or_scalar_engine_reads_psum(reader):
    x, b = _inputs()
    (r, ops, k), (r_off, ops_off, k_off) = _both(reader, x, b)
    np.testing.assert_array_equal(r, x * b)
    np.testing.assert_array_equal(r_off, r)
    # the broadcast: a ones-row memset, one matmul, (off) one copy to SBUF
    assert ops_off["tensor_copy"] - ops["tensor_copy"] == 1 == k.last_programs[0].psum_forward
    assert ops["nc_matmul"] == ops_off["nc_matmul"] == 1
    assert k.last_ir.passes["psum_forward"] == (
        "1 broadcast copies to SBUF dropped, from 1 kernel lines; 1 reads moved to PSUM"
    )
    assert "psum_forward" not in k_off.last_ir.passes
    op = "tensor_tensor" if reader == "vector" else "activation"
    reads = [ln for ln in k.last_programs[0].to_text().splitlines() if ln.startswith(op)]
    assert "psum:float32[0:128]" in reads[0].split(" dst=")[1]


@pytest.mark.parametrize("reader", ["gpsimd", "store", "two_psum"])
def test_a_broadcast_a_reader_cannot_take_from_psum_keeps_its_copy(reader):
    # GpSimd never touches PSUM, a DMA does not read it, and a VectorE op reads at most one
    # PSUM input
    x, b = _inputs()
    (r, ops, k), (r_off, ops_off, _) = _both(reader, x, b)
    np.testing.assert_array_equal(r, x * b)
    assert ops == ops_off and k.last_programs[0].psum_forward == 0


def test_a_broadcast_over_several_psum_banks_or_to_bf16_keeps_its_copies():
    # [1, 1024] fp32 is two matmuls (512 columns each) and two copies, read together by one
    # instruction: no single PSUM result holds the read. A bf16 broadcast converts in its copy.
    x, b = _inputs(1024)
    (r, ops, k), (_, ops_off, _) = _both("vector", x, b)
    np.testing.assert_array_equal(r, x * b)
    assert ops == ops_off and ops["tensor_copy"] == 2
    bf = ml_dtypes.bfloat16
    x, b = _inputs(512, bf)
    (r, ops, k), (_, ops_off, _) = _both("vector", x, b)
    np.testing.assert_array_equal(
        r.astype(np.float32), (x.astype(np.float32) * b.astype(np.float32)).astype(bf).astype(np.float32)
    )
    assert ops == ops_off


def test_the_legacy_dialect_forwards_too():
    import neuronxcc.nki as lnki
    import neuronxcc.nki.language as lnl

    def k(x, b):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        xt = lnl.load(x)
        bb = lnl.broadcast_to(lnl.load(b), x.shape)
        lnl.store(out, value=lnl.multiply(xt, bb))
        return out

    x, b = _inputs()
    on, off = lnki.jit(k), lnki.jit(k, passes={"psum_forward": "off"})
    np.testing.assert_array_equal(on(x, b), x * b)
    np.testing.assert_array_equal(off(x, b), x * b)
    assert opcodes(off)["tensor_copy"] - opcodes(on)["tensor_copy"] == 1
