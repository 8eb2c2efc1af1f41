"""NKI 0.8.0 (Neuron SDK 2.34.0) entry points and device control flow: nl.if_else on a condition
computed on the device, nki.execute and nki.multi_rank_simulate. Expected values by hand / numpy."""

from __future__ import annotations

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu import errors as E

tn.install()
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

# ---------------------------------------------------------------------------------- nl.if_else


@nki.jit
def _branch(flag, data):
    """data + 10 when flag[0, 0] > 0, else data * 2 (the condition is a comparison of a scalar)."""
    f = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=f, src=flag)
    cond = nisa.scalar_load(f) > 0
    t = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=data)

    def then_fn():
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=10.0)

    def else_fn():
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)

    nl.if_else(cond, then_fn, else_fn)
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("flag, taken", [(7, True), (1, True), (0, False), (-4, False)])
def test_if_else_takes_the_branch_the_device_computes(flag, taken):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.asarray(_branch(np.array([[flag]], np.int32), data))
    np.testing.assert_array_equal(out, data + 10.0 if taken else data * 2.0)
    assert _branch.device_dependent  # (the trace read a device value: never replayed from the cache)


@nki.jit
def _raw(flag, data):
    """The scalar itself as the condition (no comparison), no else branch."""
    f = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=f, src=flag)
    t = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=data)
    nl.if_else(nisa.scalar_load(f), lambda: nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0))
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("flag, want", [(3, 1.0), (-3, 1.0), (0, 0.0)])  # any nonzero value is true
def test_if_else_nonzero_scalar_and_missing_else(flag, want):
    data = np.full((2, 2), 5.0, np.float32)
    np.testing.assert_array_equal(np.asarray(_raw(np.array([[flag]], np.int32), data)), data + want)


@nki.jit
def _per_column(signs, data):
    """Column j: +100 when signs[0, j] > 0, else -100; one if_else per iteration of a loop."""
    s = nl.ndarray(signs.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=signs)
    t = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=data)

    def body(j):
        col = t[0 : data.shape[0], j : j + 1]
        nl.if_else(
            nisa.scalar_load(s[0:1, j : j + 1]) > 0,
            lambda: nisa.tensor_scalar(dst=col, data=col, op0=nl.add, operand0=100.0),
            lambda: nisa.tensor_scalar(dst=col, data=col, op0=nl.add, operand0=-100.0),
        )

    nl.fori_loop(0, data.shape[1], body)
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_if_else_in_a_loop():
    rng = np.random.default_rng(8)
    data = rng.standard_normal((4, 5)).astype(np.float32)
    signs = np.array([[1, -2, 0, 5, -1]], np.int32)
    want = data + np.where(signs > 0, 100.0, -100.0).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(_per_column(signs, data)), want)


@nki.jit
def _countdown(n, data):
    """while c: (t += 1 when c is odd); c -= 1 -- an if_else inside a device while_loop."""
    c = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=n)
    t = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=data)

    def body(cur):
        nl.if_else(
            nisa.scalar_alu(cur, 2, op=nl.fmod), lambda: nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        )
        nxt = cur - 1
        return nxt

    nl.while_loop(nisa.scalar_load(c), body)
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("n", [0, 1, 4, 5])
def test_if_else_inside_a_device_while_loop(n):
    data = np.zeros((2, 3), np.float32)
    odd = sum(1 for c in range(1, n + 1) if c % 2)
    np.testing.assert_array_equal(np.asarray(_countdown(np.array([[n]], np.int32), data)), data + odd)


@pytest.mark.parametrize("cond", [True, 1, 0, False, np.int32(2)])
def test_if_else_python_condition_is_decided_while_tracing(cond):
    called = []

    @nki.jit
    def k(data):
        t = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=data)
        nl.if_else(
            cond,
            lambda: called.append("then") or nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0),
            lambda: called.append("else"),
        )
        out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    data = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(np.asarray(k(data)), data + (1.0 if cond else 0.0))
    assert called == ["then" if cond else "else"]
    assert not k.device_dependent  # (nothing was read on the device)


def _flag_kernel(make_cond, then_fn=None, else_fn=None):
    @nki.jit
    def k(flag):
        f = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=f, src=flag)
        nl.if_else(make_cond(f), then_fn or (lambda: None), else_fn)
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=f)
        return out

    return k


FLAG = np.array([[1]], np.int32)


def test_if_else_refuses_a_condition_bound_to_one_sequencer():
    k = _flag_kernel(lambda f: nisa.scalar_load(f, engine=nisa.engine.sync))
    with pytest.raises(E.OperandError, match="bound to the sync sequencer") as e:
        k(FLAG)
    assert e.value.rule == "nki_if_else_bound_condition"


def test_if_else_refuses_a_tile_condition():
    with pytest.raises(E.NotSupportedError, match="scalar_load") as e:
        _flag_kernel(lambda f: f)(FLAG)
    assert e.value.rule == "nki_if_else_condition"


def test_if_else_refuses_a_float_condition():
    with pytest.raises(E.ArgumentTypeError, match="got float") as e:
        _flag_kernel(lambda f: 1.5)(FLAG)
    assert e.value.rule == "nki_if_else_condition"


def test_if_else_refuses_a_branch_that_is_not_callable():
    with pytest.raises(E.ArgumentTypeError, match="else_fn must be a function") as e:
        _flag_kernel(lambda f: 1, else_fn=3)(FLAG)
    assert e.value.rule == "nki_if_else_branch"


def test_python_if_on_a_scalar_still_raises():
    @nki.jit
    def k(flag):
        f = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=f, src=flag)
        if nisa.scalar_load(f) > 0:  # Python control flow on a device value
            pass
        return flag

    with pytest.raises(E.NotSupportedError) as e:
        k(FLAG)
    assert e.value.rule == "nki_register_value"


def test_if_else_on_a_device_value_needs_a_single_program_launch():
    k = _flag_kernel(lambda f: nisa.scalar_load(f) > 0)
    with pytest.raises(E.NotSupportedError) as e:
        k[2](FLAG)
    assert e.value.rule == "nki_register_read_multiprogram"


# ---------------------------------------------------------------------------------- nki.execute


def _matmul(x, y):
    """x @ y through SBUF and PSUM (a plain function: nki.execute takes it as it takes a jit kernel)."""
    xs = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    ys = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    nisa.dma_copy(dst=ys, src=y)
    xt = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=xt, src=xs)
    p = nl.ndarray((x.shape[0], y.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=xt, moving=ys)
    zs = nl.ndarray(p.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=zs, src=p)
    z = nl.ndarray(p.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=z, src=zs)
    return z


def test_execute_gives_what_simulate_gives():
    rng = np.random.default_rng(34)
    x = rng.integers(-4, 5, (8, 16)).astype(np.float32)  # small integers: the products are exact
    y = rng.integers(-4, 5, (16, 4)).astype(np.float32)
    got = np.asarray(nki.execute(_matmul, x, y))
    np.testing.assert_array_equal(got, x @ y)
    np.testing.assert_array_equal(got, np.asarray(nki.simulate(_matmul)(x, y)))
    jk = nki.jit(_matmul)
    np.testing.assert_array_equal(np.asarray(nki.execute(jk, x, y=y)), x @ y)  # keywords reach the kernel


def test_execute_with_a_grid_and_a_device_condition():
    @nki.jit
    def k(a):
        pid = nl.program_id(0)
        t = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[pid : pid + 1, :])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[pid : pid + 1, :], src=t)
        return out

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(nki.execute(k[2], a)), a + 1.0)
    data = np.arange(4, dtype=np.float32).reshape(2, 2)
    np.testing.assert_array_equal(np.asarray(nki.execute(_branch, np.array([[0]], np.int32), data)), data * 2)


def test_execute_refuses_a_kernel_that_is_not_callable():
    with pytest.raises(E.ArgumentTypeError, match="nki.jit kernel or a plain Python function") as e:
        nki.execute(np.zeros(2), np.zeros(2))
    assert e.value.rule == "nki_standalone_kernel"


# ------------------------------------------------------------------------ nki.multi_rank_simulate

import nki.collectives as nccl  # noqa: E402


@nki.jit
def _all_reduce(x, replica_group, scale=1.0):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=scale)
    nisa.dma_copy(dst=src, src=t)
    nccl.all_reduce(srcs=[src], dsts=[out], replica_group=replica_group, op=nl.add)
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_multi_rank_simulate_all_reduce(world):
    rng = np.random.default_rng(world)
    xs = [rng.integers(-50, 50, (4, 8)).astype(np.float32) for _ in range(world)]
    group = nccl.ReplicaGroup([list(range(world))])
    outs = nki.multi_rank_simulate(
        _all_reduce, world_size=world, per_rank_inputs=[((x, group), {"scale": 2.0}) for x in xs]
    )
    assert isinstance(outs, list) and len(outs) == world
    for o in outs:
        np.testing.assert_array_equal(np.asarray(o), 2.0 * sum(xs))


def test_multi_rank_simulate_mapping_and_replica_groups():
    """A mapping rank -> (args, kwargs); two rank-lists reduce separately; a ReplicaGroup built
    once per rank counts as the same static argument."""
    xs = {r: np.full((2, 4), float(r + 1), np.float32) for r in range(4)}
    inputs = {r: ((xs[r],), {"replica_group": nccl.ReplicaGroup([[0, 1], [2, 3]])}) for r in (3, 1, 0, 2)}
    outs = nki.multi_rank_simulate(_all_reduce, world_size=4, per_rank_inputs=inputs)
    want = [xs[0] + xs[1]] * 2 + [xs[2] + xs[3]] * 2
    for o, w in zip(outs, want, strict=True):
        np.testing.assert_array_equal(np.asarray(o), w)


def test_multi_rank_execute_is_the_same_run():
    xs = [np.full((2, 2), 3.0, np.float32), np.full((2, 2), 4.0, np.float32)]
    g = nccl.ReplicaGroup([[0, 1]])
    outs = nki.multi_rank_execute(_all_reduce, world_size=2, per_rank_inputs=[((x, g), {}) for x in xs])
    np.testing.assert_array_equal(np.asarray(outs[1]), np.full((2, 2), 7.0, np.float32))


G2 = nccl.ReplicaGroup([[0, 1]])
A = np.zeros((2, 4), np.float32)


@pytest.mark.parametrize(
    "inputs, rule, match",
    [
        ([((A, G2), {})], "nki_multi_rank_inputs", "1 entries for world_size=2"),
        ({0: ((A, G2), {}), 2: ((A, G2), {})}, "nki_multi_rank_inputs", "one key for each rank"),
        ([((A, G2), {}), (A, G2)], "nki_multi_rank_inputs", "rank 1's input must be an"),
        (((A, G2), {}), "nki_multi_rank_inputs", "rank 0's input must be an"),
        ([((A, G2), {}), ((A,), {"replica_group": G2})], "nki_multi_rank_specialization", "same parameters"),
        ([((A, G2), {}), ((A[:, :2].copy(), G2), {})], "nki_multi_rank_specialization", "shape"),
        ([((A, G2), {}), ((A.astype(np.int32), G2), {})], "nki_multi_rank_specialization", "int32"),
        ([((A, G2), {"scale": 1.0}), ((A, G2), {"scale": 2.0})], "nki_multi_rank_specialization", "static"),
    ],
)
def test_multi_rank_simulate_refusals(inputs, rule, match):
    with pytest.raises(E.OperandError, match=match) as e:
        nki.multi_rank_simulate(_all_reduce, world_size=2, per_rank_inputs=inputs)
    assert e.value.rule == rule


def test_multi_rank_simulate_refuses_a_bad_world_size_and_grid():
    with pytest.raises(E.ArgumentTypeError) as e:
        nki.multi_rank_simulate(_all_reduce, world_size=0, per_rank_inputs=[])
    assert e.value.rule == "nki_spmd_world"
    with pytest.raises(E.OperandError, match="logical NeuronCore") as e:
        nki.multi_rank_simulate(_all_reduce[2, 2], world_size=1, per_rank_inputs=[((A, G2), {})])
    assert e.value.rule == "nki_spmd_world"
    with pytest.raises(E.ArgumentTypeError) as e:
        nki.multi_rank_simulate(_all_reduce, world_size=2, per_rank_inputs=7)
    assert e.value.rule == "nki_multi_rank_inputs"
