"""NKI SPMD launches across chips (`trn3emu.nki.spmd`): the ring all-gather + matmul and the MoE
all_to_all examples against numpy, rank ids, LNC=2 placement, and the launch's rules."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import trn3emu.nki
from trn3emu.errors import OperandError

trn3emu.nki.install()

import nki  # noqa: E402
import nki.collectives as ncc  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "python" / "trn3emu" / "examples"


def example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("world,lnc", [(2, 1), (4, 1), (16, 1), (4, 2), (8, 2)])
def test_ring_allgather_matmul_example(world, lnc):
    assert example("nki_ring_allgather_matmul").main(world, lnc, ms=32, n=128) == 0


@pytest.mark.parametrize("world", [2, 4, 16])
def test_moe_all_to_all_example(world):
    assert example("nki_moe_all_to_all").main(world, tokens=8, d=32) == 0


@nki.jit
def tag_and_reduce(x):
    """dst = all_reduce over the world of (x + rank)."""
    r = ncc.rank_id()
    p, f = x.shape
    t = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(r))
    out = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    world = ncc.ReplicaGroup([list(range(16))])
    ncc.all_reduce([t], [s], world, nl.add)
    nisa.dma_copy(dst=out, src=s)
    return out


def test_rank_ids_and_placement_across_chips():
    xs = [np.full((4, 8), i, np.float32) for i in range(16)]
    launch = trn3emu.nki.spmd(tag_and_reduce, world_size=16)
    outs = launch([(x,) for x in xs])
    want = sum(np.float32(2 * i) for i in range(16))
    for o in outs:
        np.testing.assert_array_equal(o, np.full((4, 8), want, np.float32))
    r = launch.last_result
    assert len(r.chips) == 2 and all(c.executed for c in r.chips)
    assert len(r.messages["bytes"]) > 0  # the group spans both chips


def test_spmd_rules():
    with pytest.raises(OperandError) as e:
        trn3emu.nki.spmd(tag_and_reduce, world_size=4)([(np.zeros((4, 8), np.float32),)] * 3)
    assert e.value.rule == "nki_spmd_world"
    with pytest.raises(OperandError):
        trn3emu.nki.spmd(tag_and_reduce, world_size=4, lnc=3)
    with pytest.raises(OperandError):
        trn3emu.nki.spmd(tag_and_reduce, world_size=1000, lnc=2)


@nki.jit
def a2av_kernel(x, meta):
    n = x.shape[0]
    out = nl.ndarray((n,), dtype=x.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray((1, n), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0)
    nisa.dma_copy(dst=out.reshape((1, n)), src=zero)
    ncc.all_to_all_v([x], [out], ncc.ReplicaGroup([list(range(16))]), meta)
    return out


def test_nki_all_to_all_v_across_chips():
    """16 ranks on two chips: rank i sends i % 3 + 1 elements to every rank, packed."""
    world = 16
    xs = [np.arange(64, dtype=np.int32) + 100 * i for i in range(world)]
    c = [i % 3 + 1 for i in range(world)]
    counts = np.array([[c[i]] * world for i in range(world)], np.uint32)
    displs = np.array([[j * c[i] for j in range(world)] for i in range(world)], np.uint32)
    launch = trn3emu.nki.spmd(a2av_kernel, world_size=world)
    outs = launch([(xs[i], np.stack([counts[i], displs[i]])) for i in range(world)])
    for r, o in enumerate(outs):
        want = np.zeros(64, np.int32)
        got = np.concatenate([xs[i][r * c[i] : (r + 1) * c[i]] for i in range(world)])
        want[: len(got)] = got
        np.testing.assert_array_equal(o, want)
