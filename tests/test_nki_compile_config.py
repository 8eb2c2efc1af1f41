"""`nki.compiler.CompileConfig` (the NKI API reference's per-kernel compile configuration): the
documented options and enumerations exist, bad values raise, and the options that name something
a pass models set that pass (docs/nki.md, "CompileConfig"); `passes=` still wins."""

import dataclasses

import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import OperandError

tn.install()

import nki  # noqa: E402
import nki.compiler as ncc  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

#: the options the API reference lists for CompileConfig (nki.compiler.CompileConfig page)
DOCUMENTED = {
    "address_rotation",
    "allocation",
    "barrier_check",
    "dead_code_elim",
    "dma_copy_elim",
    "element_widening",
    "engine_balancing",
    "experimental_allocation_mode",
    "experimental_hbm_allocation_mode",
    "experimental_psum_allocation_mode",
    "experimental_sbuf_allocation_mode",
    "experimental_scheduling_heuristic",
    "nki_alloc_fallback",
    "non_ssa_legalization",
    "opt_level",
    "prefetch_auto",
    "register_load_reuse",
    "remove_overwritten_writes",
    "remove_unused_instructions",
    "sbuf_allocation_fallback",
    "scheduling",
    "split_reused_buffers",
    "tensor_copy_elim",
}


def test_the_documented_options_and_enumerations():
    assert {f.name for f in dataclasses.fields(ncc.CompileConfig)} == DOCUMENTED
    assert {m.name for m in ncc.Allocation} == {"COLORING", "LINEAR"}
    assert {m.name for m in ncc.AddressRotation} == {"AUTO", "ENABLE", "DISABLE"}
    assert {m.name for m in ncc.AllocationMode} == {"RING", "FAST", "MAX_REUSE"}
    assert {m.name for m in ncc.SchedulingHeuristic} == {"ASAP", "CRITICAL_PATH", "DMA_PREFETCH", "TRIVIAL"}
    assert {m.name for m in ncc.OptLevel} == {"O0", "O1", "O2"}
    with pytest.raises(TypeError):
        ncc.CompileConfig(ncc.Allocation.LINEAR)  # keyword-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        ncc.CompileConfig().allocation = ncc.Allocation.LINEAR


def _copy_kernel(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    u = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=u, src=t)  # (no engine=: the engine choice may move it)
    v = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=v, src=u)
    nisa.dma_copy(dst=out, src=v)
    return out


def _engines(kernel) -> list[str]:
    text = kernel.last_programs[0].to_text().splitlines()
    return [ln.split()[0].split(".")[1] for ln in text if ln.startswith("tensor_copy")]


def test_linear_allocation_runs_the_liveness_pass_and_o0_keeps_default_engines():
    a = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    plain = nki.jit(_copy_kernel)
    np.testing.assert_array_equal(plain(a), a)
    assert plain.last_ir is None  # (it fits: the literal trace, no IR recorded)
    linear = nki.jit(_copy_kernel, compile_config=ncc.CompileConfig(allocation=ncc.Allocation.LINEAR))
    np.testing.assert_array_equal(linear(a), a)
    assert "liveness" in linear.last_ir.passes
    o0 = nki.jit(_copy_kernel, compile_config=ncc.CompileConfig(opt_level=ncc.OptLevel.O0))
    np.testing.assert_array_equal(o0(a), a)
    off = nki.jit(_copy_kernel, passes={"engine_choice": "off"})
    off(a)
    assert _engines(o0) == _engines(off) == ["vector", "vector"]
    assert _engines(plain) != _engines(off)  # (the default spreads the copies)
    # passes= wins over the config
    both = nki.jit(
        _copy_kernel, compile_config=ncc.CompileConfig(opt_level=ncc.OptLevel.O0), passes={"engine_choice": "on"}
    )
    both(a)
    assert _engines(both) == _engines(plain)
    # options the emulator does not model are accepted and change nothing
    other = nki.jit(
        _copy_kernel,
        compile_config=ncc.CompileConfig(address_rotation=ncc.AddressRotation.DISABLE, prefetch_auto=True),
        specialization_config=ncc.SpecializationConfig(),
    )
    np.testing.assert_array_equal(other(a), a)
    assert other.last_programs[0].encode() == plain.last_programs[0].encode()


@pytest.mark.parametrize(
    "config, says",
    [
        ({"allocation": "linear"}, "takes an nki.compiler.CompileConfig"),
        (ncc.CompileConfig(allocation="linear"), "CompileConfig.allocation takes an nki.compiler.Allocation"),
        (ncc.CompileConfig(prefetch_auto=1), "CompileConfig.prefetch_auto takes a bool"),
    ],
)
def test_a_bad_compile_config_names_the_option(config, says):
    with pytest.raises(OperandError, match=says) as e:
        nki.jit(_copy_kernel, compile_config=config)
    assert e.value.rule == "nki_compile_config"


def _row_loop(x, w):
    """An NKI 0.6 row loop that loads the same weight with `nisa.dma_copy` into a fresh tile in
    every iteration."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        wt = nl.ndarray(w.shape, w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=wt, src=w)
        xt = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * 128 : (i + 1) * 128, :])
        yt = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=yt, data1=xt, data2=wt, op=nl.multiply)
        nisa.dma_copy(dst=out[i * 128 : (i + 1) * 128, :], src=yt)
    return out


def test_dma_copy_elim_reads_a_reloaded_weight_from_sbuf():
    """`dma_copy_elim`: "Remove a nisa.dma_copy that loads data that an earlier nisa.dma_copy
    already loaded into SBUF" (pass `load_reuse="dma_copy"`, found on the IR before allocation);
    without it the kernel's own reloads stay (the current flow keeps the developer's DMAs)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1024, 256)).astype(np.float32)
    w = rng.standard_normal((128, 256)).astype(np.float32)
    want = x * np.tile(w, (8, 1))
    plain = nki.jit(_row_loop)
    elim = nki.jit(_row_loop, compile_config=ncc.CompileConfig(dma_copy_elim=True))
    by_pass = nki.jit(_row_loop, passes={"load_reuse": "dma_copy"})  # (the same, asked by name)
    for k in (plain, elim, by_pass):
        np.testing.assert_array_equal(k(x, w), want)

    def dmas(k):
        return sum(1 for ln in k.last_programs[0].to_text().splitlines() if ln.startswith("dma_copy"))

    assert (dmas(plain), dmas(elim), dmas(by_pass)) == (8 * 3, 8 * 2 + 1, 8 * 2 + 1)
    # O2 turns it on in the new flow only ("the current flow is the same at every level")
    o2 = ncc.OptLevel.O2
    for config, n in [
        (ncc.CompileConfig(opt_level=o2, allocation=ncc.Allocation.LINEAR), 8 * 2 + 1),
        (ncc.CompileConfig(opt_level=o2), 8 * 3),
        (ncc.CompileConfig(opt_level=o2, allocation=ncc.Allocation.LINEAR, dma_copy_elim=False), 8 * 3),
    ]:
        k = nki.jit(_row_loop, compile_config=config)
        np.testing.assert_array_equal(k(x, w), want)
        assert dmas(k) == n, config
    assert elim.last_ir.passes["load_reuse"].startswith("7 loads read from SBUF")
    hbm = [int(k.last_result.trace.dma["hbm_bytes"].sum()) for k in (plain, elim)]
    assert hbm[0] - hbm[1] == 7 * 128 * 256 * 4
