"""The NKI front end (trn3emu.nki): module aliasing, kernels, views, nl ops, allocator, launch
grids, targets, source lines, unsupported APIs. References are numpy / hand-computed."""

import sys
import warnings

import ml_dtypes
import numpy as np
import pytest
import trn3emu.nki as tn
from trn3emu.errors import AddressError, CapacityError, EmuError, NotSupportedError

BF16 = ml_dtypes.bfloat16
tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


def test_install_registers_modules_and_uninstall_restores():
    assert sys.modules["nki"] is tn and sys.modules["nki.isa"] is nisa and sys.modules["nki.language"] is nl
    import nki.compiler
    import nki.isa.constants as c
    import nki.typing

    assert nki.typing.tensor is tn.NkiTensor and c.reduce_cmd is nisa.reduce_cmd
    assert nki.compiler.no_reorder
    tn.uninstall()
    assert "nki" not in sys.modules
    tn.install()
    assert sys.modules["nki"] is tn


@nki.jit
def _annotated_add(a: nki.typing.mutable, b: nki.typing.immutable):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


def test_typing_mutable_immutable_markers():
    """`from neuronxcc.nki.typing import mutable, immutable` (nkipy re-exports both): annotations only."""
    from neuronxcc.nki.typing import immutable, mutable

    assert mutable is tn.NkiTensor and immutable is tn.NkiTensor
    a, b = np.arange(512, dtype=np.float32).reshape(4, 128), np.full((4, 128), 0.5, np.float32)
    np.testing.assert_array_equal(_annotated_add(a, b), a + b)


def test_legacy_namespace_alias():
    import neuronxcc.nki as lnki
    import neuronxcc.nki.isa as lisa
    import neuronxcc.nki.language as lnl

    assert lnl is nl and lnki.isa is lisa and lisa is not nisa and lisa.engine is nisa.engine
    tn.uninstall()
    tn.install(legacy=False)
    try:
        assert "neuronxcc" not in sys.modules and "neuronxcc.nki" not in sys.modules
    finally:
        tn.uninstall()
        tn.install()


@nki.jit
def _copy_kernel(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_jit_numpy_in_numpy_out_and_simulate():
    a = np.arange(128 * 64, dtype=np.int32).reshape(128, 64)
    out = _copy_kernel(a)
    assert isinstance(out, np.ndarray) and out.dtype == np.int32
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(nki.simulate(_copy_kernel)(a), a)


def test_instructions_carry_kernel_source_lines():
    import inspect

    _copy_kernel(np.zeros((4, 4), np.float32))
    src, first = inspect.getsourcelines(_copy_kernel.fn)
    lines = [first + i for i, t in enumerate(src) if "nisa.dma_copy" in t]
    text = _copy_kernel.last_programs[0].to_text()
    for ln in lines:
        assert f"name=test_nki_frontend.py:{ln}" in text


def test_assembly_error_names_kernel_line():
    @nki.jit
    def bad(a):
        t = nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=t[0:64], data2=t, op=nl.add)  # shape mismatch
        return a

    with pytest.raises(EmuError) as ei:
        bad(np.zeros((1, 1), np.float32))
    notes = "\n".join(getattr(ei.value, "__notes__", []))
    assert "test_nki_frontend.py:" in notes and "tensor_tensor" in notes


def test_tuple_outputs_and_inplace_input_written_back():
    @nki.jit
    def k(a, b):
        t = nl.load(a)
        nl.store(b, t)  # writes an input in place
        o1 = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(o1, t)
        nl.store(o2, nl.multiply(t, 2.0))
        return o1, o2

    a = np.arange(32, dtype=np.float32).reshape(8, 4)
    b = np.zeros_like(a)
    o1, o2 = k(a, b)
    np.testing.assert_array_equal(o1, a)
    np.testing.assert_array_equal(o2, a * 2)
    np.testing.assert_array_equal(b, a)


def test_grid_program_ids():
    @nki.jit
    def k(a):
        out = nl.ndarray((2, 3, 128, 4), nl.int32, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(axis=1)
        assert nl.num_programs() == 6 and nl.num_programs(1) == 3 and nl.program_ndim() == 2
        t = nl.ndarray((128, 4), nl.int32, buffer=nl.sbuf)
        nisa.memset(t, value=10 * i + j)
        nisa.dma_copy(dst=out[i, j], src=t)
        return out

    out = k[2, 3](np.zeros(1, np.int32))
    for i in range(2):
        for j in range(3):
            assert (out[i, j] == 10 * i + j).all()


def test_lnc_grid_larger_than_device_runs_in_groups():
    @nki.jit
    def k(a):
        out = nl.ndarray((10, 128, 2), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 2), nl.float32, buffer=nl.sbuf)
        nisa.memset(t, value=float(nl.program_id(0)))
        nisa.dma_copy(dst=out[nl.program_id(0)], src=t)
        return out

    out = k[10](np.zeros(1, np.float32))
    np.testing.assert_array_equal(out[:, 0, 0], np.arange(10, dtype=np.float32))


# ---------------------------------------------------------------------------------- views
def _roundtrip(fn, *arrays):
    @nki.jit
    def k(*args):
        return fn(*args)

    return k(*arrays)


def test_views_slices_ds_int_index_reshape_permute():
    a = np.arange(4 * 128 * 6, dtype=np.float32).reshape(4, 128, 6)

    def body(x):
        out = nl.ndarray((128, 4, 6), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 4, 6), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x.permute((1, 0, 2)))
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(_roundtrip(body, a), a.transpose(1, 0, 2))

    def body2(x):
        out = nl.ndarray((64, 3), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((64, 3), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[2, nl.ds(32, 64), 0:6:2])
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(_roundtrip(body2, a), a[2, 32:96, 0:6:2])


def test_ap_on_hbm_transposes_and_view_reinterprets_bits():
    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64) / 7

    def body(x):
        out = nl.ndarray((64, 128), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((64, 128), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x.ap(pattern=[[1, 64], [64, 128]], offset=0))
        nisa.dma_copy(dst=out, src=t)
        bits = nl.ndarray((64, 128), nl.uint32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=bits, src=t.view(nl.uint32))
        return out, bits

    out, bits = _roundtrip(body, a)
    np.testing.assert_array_equal(out, a.T)
    np.testing.assert_array_equal(bits, a.T.copy().view(np.uint32))


def test_ap_on_sbuf_strided_read_and_rearrange():
    a = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)

    def body(x):
        t = nl.load(x)
        out = nl.ndarray((32, 4, 4), nl.float32, buffer=nl.shared_hbm)
        u = nl.ndarray((32, 4, 4), nl.float32, buffer=nl.sbuf)
        # element (p, i, j) = t[p, 4*j + i]: a 3-level pattern with the partition step first
        nisa.tensor_copy(dst=u, src=t.ap(pattern=[[16, 32], [1, 4], [4, 4]]))
        nisa.dma_copy(dst=out, src=u)
        out2 = nl.ndarray((32, 4, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out2, src=t.rearrange("p (a b) -> p b a", a=4))
        return out, out2

    out, out2 = _roundtrip(body, a)
    ref = a.reshape(32, 4, 4).transpose(0, 2, 1)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(out2, ref)


def test_setitem_copies_and_memsets():
    a = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)

    def body(x):
        t = nl.load(x)
        u = nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf)
        u[...] = 5.0
        u[:, 0:4] = t[:, 4:8]
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        out[...] = u
        return out

    ref = np.full((128, 8), 5.0, np.float32)
    ref[:, 0:4] = a[:, 4:8]
    np.testing.assert_array_equal(_roundtrip(body, a), ref)


# --------------------------------------------------------------------------------- nl ops
def test_nl_elementwise_scalar_column_and_partition_broadcast():
    rng = np.random.default_rng(20)
    x = rng.standard_normal((128, 64)).astype(np.float32)
    col = rng.standard_normal((128, 1)).astype(np.float32)
    row = rng.standard_normal((1, 64)).astype(np.float32)

    def body(x, col, row):
        t, c, r = nl.load(x), nl.load(col), nl.load(row)
        outs = []
        for v in (nl.subtract(1.0, t), nl.multiply(t, c), nl.add(t, r), nl.maximum(t, 0.0), nl.relu(t), -t, t * 3.0):
            o = nl.ndarray(v.shape, v.dtype, buffer=nl.shared_hbm)
            nl.store(o, v)
            outs.append(o)
        return tuple(outs)

    o = _roundtrip(body, x, col, row)
    refs = [np.float32(1) - x, x * col, x + row, np.maximum(x, 0), np.maximum(x, 0), -x, x * np.float32(3)]
    for got, ref in zip(o, refs):
        np.testing.assert_array_equal(got, ref.astype(np.float32))


def test_nl_matmul_transpose_copy_cast():
    rng = np.random.default_rng(21)
    xt = rng.integers(-8, 8, (128, 64)).astype(np.float32)
    y = rng.integers(-8, 8, (128, 256)).astype(np.float32)
    z = rng.standard_normal((64, 128)).astype(np.float32)

    def body(xt, y, z):
        p = nl.matmul(nl.load(xt), nl.load(y), transpose_x=True)
        tr = nl.transpose(nl.load(z))
        c = nl.copy(nl.load(z), dtype=nl.bfloat16)
        outs = []
        for v in (p, tr, c):
            o = nl.ndarray(v.shape, v.dtype, buffer=nl.shared_hbm)
            nl.store(o, v)
            outs.append(o)
        return tuple(outs)

    p, tr, c = _roundtrip(body, xt, y, z)
    np.testing.assert_array_equal(p, xt.T @ y)  # small integers: exact in fp32
    np.testing.assert_array_equal(tr, z.T)
    np.testing.assert_array_equal(c.view(np.uint16), z.astype(BF16).view(np.uint16))


def test_nl_creation_constants_identity():
    def body(x):
        f = nl.full((128, 4), 2.5, nl.float32)
        z = nl.zeros((128, 4), nl.int32)
        eye = nl.shared_identity_matrix(128, dtype=nl.float32)
        k = nl.load(nl.shared_constant(np.arange(8, dtype=np.float32).reshape(2, 4)))
        hz = nl.zeros((3, 5), nl.float32, buffer=nl.shared_hbm)
        outs = [hz]
        for v in (f, z, eye, k):
            o = nl.ndarray(v.shape, v.dtype, buffer=nl.shared_hbm)
            nl.store(o, v)
            outs.append(o)
        return tuple(outs)

    hz, f, z, eye, k = _roundtrip(body, np.zeros(1, np.float32))
    assert (hz == 0).all() and (f == 2.5).all() and (z == 0).all() and z.dtype == np.int32
    np.testing.assert_array_equal(eye, np.eye(128, dtype=np.float32))
    np.testing.assert_array_equal(k, np.arange(8, dtype=np.float32).reshape(2, 4))


def test_type_promotion_rules():
    p = nl.promote
    assert p(nl.float16, nl.bfloat16) == "float32"
    assert p(nl.float8_e4m3, nl.float8_e5m2) == "bfloat16"
    assert p(nl.int32, nl.float16) == "float16"
    assert p(nl.int8, nl.uint8) == "int16"
    assert p(nl.int32, nl.uint32) == "float32"
    assert p(nl.bfloat16, np.float32) == nl.float32
    assert nl.float32 == np.float32 and nl.bfloat16 == BF16 and nl.bool_ == np.bool_
    assert np.zeros(2, nl.bfloat16).dtype == BF16 and nl.float8_e4m3fn_x4.dtype == np.uint32


def test_loops_unroll_and_fori_loop():
    def body(x):
        out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 4), nl.float32)

        def step(i):
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=float(i))

        nl.fori_loop(0, 5, step)
        for _i in nl.static_range(2):
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.multiply, operand0=2.0)
        with nl.no_reorder():
            for _i in nl.sequential_range(1):
                nl.store(out, acc)
        return out

    assert (_roundtrip(body, np.zeros(1, np.float32)) == 40.0).all()


def test_device_print_shows_value_at_that_point(capsys):
    def body(x):
        t = nl.full((2, 3), 7.0, nl.float32)
        nl.device_print("t=", t)
        nisa.memset(t, value=1.0)
        return None

    _roundtrip(body, np.zeros(1, np.float32))
    out = capsys.readouterr().out
    assert "t=" in out and "7." in out and "1." not in out.split("t=")[1]


# ------------------------------------------------------------------------------ allocator
def test_sbuf_overflow_raises_at_the_allocation_with_sizes():
    @nki.jit(passes="literal")  # the literal allocator's message: tiles held by Python, unused ones too
    def k(a):
        keep = [nl.ndarray((128, 16384), nl.float32, buffer=nl.sbuf, name=f"big{i}") for i in range(4)]  # 256 KiB
        nl.ndarray((128, 1024), nl.float32, buffer=nl.sbuf, name="tipping")
        del keep

    with pytest.raises(CapacityError) as ei:
        k(np.zeros(1, np.float32))
    msg = str(ei.value)
    assert "SBUF" in msg and "tipping" in msg and "4096 bytes per partition" in msg and "262144" in msg
    assert "test_nki_frontend.py:" in msg


def test_psum_overflow_ninth_bank():
    @nki.jit(passes="literal")  # the literal allocator's message: tiles held by Python, unused ones too
    def k(a):
        banks = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        nl.ndarray((128, 1), nl.float32, buffer=nl.psum, name="ninth")
        del banks

    with pytest.raises(CapacityError, match=r"PSUM overflow: ninth"):
        k(np.zeros(1, np.float32))


def test_tiles_are_freed_when_dropped_so_loops_reuse_memory():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 16384), nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(16):  # 16 x 64 KiB would not fit at once
            t = nl.ndarray((128, 16384), nl.float32, buffer=nl.sbuf)
            nisa.memset(t, value=float(i))
        nisa.dma_copy(dst=out, src=t)
        return out

    assert (k(np.zeros(1, np.float32)) == 15.0).all()


def test_explicit_addresses_alias():
    @nki.jit
    def k(a):
        x = nl.ndarray((128, 4), nl.float32, buffer=nl.sbuf, address=(0, 4096))
        y = nl.ndarray((128, 4), nl.int32, buffer=nl.sbuf, address=(0, 4096))  # same bytes
        nisa.dma_copy(dst=x, src=a)
        out = nl.ndarray((128, 4), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=y)
        return out

    a = np.random.default_rng(22).standard_normal((128, 4)).astype(np.float32)
    np.testing.assert_array_equal(k(a), a.view(np.int32))


def test_psum_address_must_be_bank_aligned_and_in_range():
    @nki.jit
    def k(a):
        nl.ndarray((128, 4), nl.float32, buffer=nl.psum, address=(0, 100))

    with pytest.raises(AddressError):
        k(np.zeros(1, np.float32))

    @nki.jit
    def k2(a):
        nl.ndarray((128, 1024), nl.float32, buffer=nl.sbuf, address=(0, 256 * 1024 - 64))

    with pytest.raises(CapacityError):
        k2(np.zeros(1, np.float32))


def test_fill_uninitialized_exposes_unwritten_reads(monkeypatch):
    from trn3emu.testing import fill_uninitialized

    @nki.jit
    def k(a):
        t = nl.ndarray((128, 4), nl.float32, buffer=nl.sbuf)
        out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    with fill_uninitialized(0xFF):
        assert np.isnan(k(np.zeros(1, np.float32))).all()
    assert (k(np.zeros(1, np.float32)) == 0).all()
    assert np.isnan(nki.jit(k.fn, fill=0xFF)(np.zeros(1, np.float32))).all()
    monkeypatch.setenv("TRN3EMU_NKI_FILL", "0xff")
    assert np.isnan(k(np.zeros(1, np.float32))).all()


# ------------------------------------------------------------------------ targets, support
def test_targets(monkeypatch):
    tn._kernel._warned.clear()
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        np.testing.assert_array_equal(nki.jit(_copy_kernel.fn)(np.ones((2, 2), np.float32)), np.ones((2, 2)))
        nki.jit(_copy_kernel.fn)
    assert sum("runs as trn3" in str(x.message) for x in w) == 1
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "tpu9")
    with pytest.raises(NotSupportedError, match="platform target"):
        nki.jit(_copy_kernel.fn)
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE")
    nki.jit(platform_target="trn3")(_copy_kernel.fn)
    assert nisa.get_nc_version() == nisa.nc_version.gen4


def test_unsupported_apis_raise_clearly():
    with pytest.raises(NotSupportedError, match="not supported: nki.isa.no_such_op"):
        nisa.no_such_op  # noqa: B018
    with pytest.raises(AttributeError):
        nl.no_such_thing  # noqa: B018
    assert not hasattr(nki, "baremetal")
    assert callable(nki.collectives.all_gather_v)  # (NKI 0.6.0; issue 28)
    with pytest.raises(NotSupportedError, match="did you mean `all_gather`"):
        nki.collectives.all_gathr  # noqa: B018

    @nki.jit
    def k(a):
        t = nl.load(a)
        nl.gather_flattened(t, t, axis=1)

    with pytest.raises(NotSupportedError, match=r"not supported: nl.gather_flattened\(axis=1\)"):
        k(np.zeros((2, 2), np.float32))

    @nki.jit
    def k2(a):
        t = nl.load(a)
        i_p, i_f = nl.arange(2)[:, None], nl.arange(2)[None, :]
        nisa.tensor_copy(dst=t, src=t, mask=(i_p >= i_f))  # a triangle is not a sub-grid

    with pytest.raises(NotSupportedError, match="mask"):
        k2(np.zeros((2, 2), np.float32))

    @nki.jit
    def k3(a):
        nisa.nc_transpose(nl.load(a))

    with pytest.raises(NotSupportedError, match="call form"):
        k3(np.zeros((2, 2), np.float32))

    @nki.jit
    def k5(a):
        nl.zeros((2, 2), nl.float32, bogus=1)

    with pytest.raises(NotSupportedError, match=r"not supported: nl.zeros call form"):
        k5(np.zeros((2, 2), np.float32))

    @nki.jit
    def k4(a):
        a.no_such_method()

    with pytest.raises(NotSupportedError, match="not supported: NkiTensor.no_such_method"):
        k4(np.zeros((2, 2), np.float32))

    @nki.jit
    def k6(a):
        t = nl.ndarray((2, 2), dtype=nl.float32, buffer=nl.sbuf)
        return t.shpae  # a misspelling: the launch names the attribute and its likely meaning

    with pytest.raises(NotSupportedError, match=r"NkiTensor.shpae; did you mean `shape`") as ei:
        k6(np.zeros((2, 2), np.float32))
    assert isinstance(ei.value, AttributeError)  # (feature probes still see an AttributeError)

    with pytest.raises(EmuError, match="inside a kernel"):
        nl.zeros((2, 2), nl.float32)


def test_python_m_runs_a_script_with_nki_installed(tmp_path):
    import subprocess

    script = tmp_path / "k.py"
    script.write_text(
        "import numpy as np\n"
        "import nki, nki.language as nl\n"
        "@nki.jit\n"
        "def k(a):\n"
        "    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(out, nl.add(nl.load(a), 1.0))\n"
        "    return out\n"
        "print(k(np.zeros((2, 3), np.float32)).sum())\n"
    )
    r = subprocess.run([sys.executable, "-m", "trn3emu.nki", str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "6.0"


def test_ap_dtype_reinterprets_hbm_words_as_x4_and_view_helpers():
    words = np.random.default_rng(23).integers(0, 2**32, (32, 16), dtype=np.uint32)

    def body(w):
        x4 = w.ap(pattern=[[16, 32], [1, 16]], offset=0, dtype=nl.float8_e4m3fn_x4)
        assert x4.dtype == nl.float8_e4m3fn_x4 and x4.shape == (32, 16)
        t = nl.ndarray((32, 16), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x4)
        back = nl.ndarray((32, 16), nl.uint32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=back, src=t.view(nl.uint32))
        # HBM view helpers: one row broadcast to 4 rows (stride 0), a column selected, a dim squeezed
        row = w.slice(0, 3, 4).broadcast(0, 4)
        rows = nl.ndarray((4, 16), nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=row)
        rep = nl.ndarray((4, 16), nl.uint32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=rep, src=rows)
        col = nl.ndarray((32, 1), nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=col, src=w.select(1, 5).expand_dim(1))
        colo = nl.ndarray((32, 1), nl.uint32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=colo, src=col)
        return back, rep, colo

    back, rep, colo = _roundtrip(body, words)
    np.testing.assert_array_equal(back, words)
    np.testing.assert_array_equal(rep, np.repeat(words[3:4], 4, axis=0))
    np.testing.assert_array_equal(colo[:, 0], words[:, 5])


def test_nkiobject_helpers_and_nested_kernel_calls():
    class Cfg(nl.NKIObject):
        def __init__(self, scale):
            self.scale = scale

    @nki.jit
    def inner(t, cfg):
        return nl.multiply(t, cfg.scale)

    @nki.jit
    def outer(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, inner(nl.load(a), Cfg(4.0)))
        return out

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(outer(a), a * 4)


def test_pytest_plugin_env_activation_and_fixture(tmp_path):
    import os
    import subprocess

    (tmp_path / "test_k.py").write_text(
        "import numpy as np\n"
        "import nki\n"  # resolved by the plugin (NKI_SIMULATOR=1)
        "def test_env():\n"
        "    import nki.language as nl\n"
        "    assert nki.simulate and nl.tile_size.pmax == 128\n"
        "def test_fixture(nki):\n"
        "    assert nki.isa.get_nc_version().name == 'gen4'\n"
    )
    env = dict(os.environ, NKI_SIMULATOR="1")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "trn3emu.nki.pytest_plugin",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed" in r.stdout


def test_full_with_infinities_and_memset_values():
    def body(x):
        t = nl.full((128, 4), -np.inf, nl.float32)
        u = nl.full((128, 4), 3, nl.int32)
        o1 = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((128, 4), nl.int32, buffer=nl.shared_hbm)
        nl.store(o1, t)
        nl.store(o2, u)
        return o1, o2

    o1, o2 = _roundtrip(body, np.zeros(1, np.float32))
    assert (o1 == -np.inf).all() and (o2 == 3).all()


def _store_all(*tiles):
    outs = []
    for v in tiles:
        o = nl.ndarray(v.shape, v.dtype, buffer=nl.shared_hbm)
        nl.store(o, v)
        outs.append(o)
    return tuple(outs)


def test_nl_rms_norm_and_broadcast_to():
    from trn3emu.testing import assert_close

    rng = np.random.default_rng(24)
    x = rng.standard_normal((128, 256)).astype(np.float32)
    w = rng.standard_normal((1, 256)).astype(np.float32)

    def body(x, w):
        wt = nl.broadcast_to(nl.load(w), (128, 256))
        return _store_all(nl.rms_norm(nl.load(x), wt, axis=1, n=256, epsilon=1e-5), wt)

    y, wb = _roundtrip(body, x, w)
    np.testing.assert_array_equal(wb, np.repeat(w, 128, axis=0))
    x64 = x.astype(np.float64)
    assert_close(y, x64 / np.sqrt((x64**2).mean(1, keepdims=True) + 1e-5) * w, rtol=1e-4, atol=1e-5)


def test_nl_reductions_softmax_where():
    from trn3emu.testing import assert_close

    rng = np.random.default_rng(25)
    x = rng.standard_normal((128, 64)).astype(np.float32)

    def body(x):
        t = nl.load(x)
        s = nl.sum(t, axis=1, keepdims=True)
        m = nl.max(t, axis=1)
        mu = nl.mean(t, axis=1, keepdims=True)
        sm = nl.softmax(t, axis=1)
        wh = nl.where(nl.greater(t, 0.0), t, 0.0)
        return _store_all(s, m, mu, sm, wh)

    s, m, mu, sm, wh = _roundtrip(body, x)
    x64 = x.astype(np.float64)
    assert_close(s[:, 0], x64.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m[:, 0], x.max(1))
    assert_close(mu[:, 0], x64.mean(1), rtol=1e-5, atol=1e-6)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    assert_close(sm, e / e.sum(1, keepdims=True), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(wh, np.where(x > 0, x, 0).astype(np.float32))


def test_tuple_of_arrays_argument():
    @nki.jit
    def k(pair):
        a, b = pair
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.subtract(nl.load(a), nl.load(b)))
        return out

    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(k((a, a * 3)), a - a * 3)


def test_annotations_iota_and_legacy_tensor_copy_dtype():
    from typing import Tuple  # noqa: UP035 - kernels annotate like this

    @nki.jit
    def k(x: nl.NkiTensor, axis: int = -1) -> Tuple[nl.ndarray, nl.ndarray]:  # noqa: UP006
        y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((4, 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.iota(idx, [[1, 8]], offset=0, channel_multiplier=100)
        t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=idx, dtype=nl.float32)  # pre-0.3 cast keyword: the cast is dst's dtype
        nisa.dma_copy(dst=y, src=t)
        assert getattr(nl, str(x.dtype).split(".")[-1]) == nl.float32
        return y

    ref = (np.arange(8)[None, :] + 100 * np.arange(4)[:, None]).astype(np.float32)
    np.testing.assert_array_equal(k(np.zeros((4, 8), np.float32)), ref)


def test_nl_dropout_rand_load_transpose2d():

    x = np.arange(16 * 64, dtype=np.float32).reshape(16, 64).astype(BF16)

    def body(x):
        t = nl.load(x)
        keep = nl.dropout(t, 0.0)
        drop = nl.dropout(t, 1.0)
        r = nl.rand((128, 64), nl.float32)
        tt = nl.load_transpose2d(x)
        return _store_all(keep, drop, r, tt)

    keep, drop, r, tt = _roundtrip(body, x)
    np.testing.assert_array_equal(keep.view(np.uint16), x.view(np.uint16))
    assert (drop.astype(np.float32) == 0).all()
    assert ((r >= 0) & (r <= 1)).all() and len(np.unique(r)) > 1000
    np.testing.assert_array_equal(tt.view(np.uint16), x.T.view(np.uint16))


def test_nl_sum_over_partitions():

    x = np.random.default_rng(26).integers(-50, 50, (128, 32)).astype(np.float32)

    def body(x):
        t = nl.load(x)
        return _store_all(nl.sum(t, axis=0), nl.max(t, axis=0))

    s, m = _roundtrip(body, x)
    np.testing.assert_array_equal(s[0], x.sum(0))  # small integers: exact in any order
    np.testing.assert_array_equal(m[0], x.max(0))


def test_nl_rounding_mod_and_range_reduced_sin_cos():
    from trn3emu.testing import assert_close

    rng = np.random.default_rng(27)
    x = (rng.standard_normal((128, 64)) * 20).astype(np.float32)
    x[0, :8] = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -3.0, 3.0]  # ties and integers

    def body(x):
        t = nl.load(x)
        return _store_all(
            nl.floor(t), nl.ceil(t), nl.trunc(t), nl.mod(t, 3.0), nl.fmod(t, 3.0), nl.sin(t), nl.cos(t), nl.tan(t)
        )

    fl, ce, tr, md, fm, sn, cs, tn_ = _roundtrip(body, x)
    np.testing.assert_array_equal(fl, np.floor(x))
    np.testing.assert_array_equal(ce, np.ceil(x))
    np.testing.assert_array_equal(tr, np.trunc(x))
    # x - floor(x/3)*3 in fp32 steps: within a few fp32 ulps of |x| of the exact remainder
    assert_close(md, np.mod(x.astype(np.float64), 3.0), rtol=0, atol=1e-5 * 64)
    assert_close(fm, np.fmod(x.astype(np.float64), 3.0), rtol=0, atol=1e-5 * 64)
    # arguments up to ~|80|: reduction error ~1e-5, plus the activation's own sin
    assert_close(sn, np.sin(x.astype(np.float64)), rtol=0, atol=1e-4)
    assert_close(cs, np.cos(x.astype(np.float64)), rtol=0, atol=1e-4)
    t64 = np.tan(x.astype(np.float64))
    ok = np.abs(t64) < 50  # away from the poles, where tan's conditioning amplifies the argument error
    assert_close(tn_[ok], t64[ok], rtol=1e-3, atol=1e-4)


def test_nl_var_with_bn_stats():
    from trn3emu.testing import assert_close

    x = (np.random.default_rng(28).standard_normal((128, 1200)) * 3 + 2).astype(np.float32)

    def body(x):
        return _store_all(nl.var(nl.load(x), axis=1))

    (v,) = _roundtrip(body, x)
    assert_close(v[:, 0], x.astype(np.float64).var(1), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------ dynamic offsets and indirection


@nki.jit
def _gather_rows_two_ways(table, idx):
    """Rows `idx` of an HBM table via .ap(vector_offset=) and via .vector_select, summed."""
    n, f = idx.shape[0], table.shape[1]
    out = nl.ndarray((n, f), dtype=table.dtype, buffer=nl.shared_hbm)
    it = nl.ndarray((n, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=it, src=idx)
    a = nl.ndarray((n, f), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=table.ap([[f, n], [1, f]], vector_offset=it, indirect_dim=0))
    b = nl.ndarray((n, f), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=table.vector_select(0, it))
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=out, src=a)
    return out


def test_vector_offset_gather_and_vector_select():
    rng = np.random.default_rng(3)
    table = rng.standard_normal((1000, 64)).astype(np.float32)
    idx = rng.integers(0, 1000, (128, 1)).astype(np.int32)
    got = _gather_rows_two_ways(table, idx)
    np.testing.assert_array_equal(got, 2 * table[idx[:, 0]])


@nki.jit
def _columns_by_index(x, idx):
    """x[:, idx] through v4 tensor indirection on a VectorE copy."""
    k = idx.shape[0]
    out = nl.ndarray((x.shape[0], k), dtype=x.dtype, buffer=nl.shared_hbm)
    xt = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x)
    it = nl.ndarray((k, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=it, src=idx)
    r = nl.ndarray((x.shape[0], k), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=xt.indirect(it, k))
    nisa.dma_copy(dst=out, src=r)
    return out


def test_tensor_indirection_gathers_columns():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((128, 100)).astype(np.float32)
    idx = rng.integers(0, 100, (16, 1)).astype(np.int32)
    np.testing.assert_array_equal(_columns_by_index(x, idx), x[:, idx[:, 0]])


def test_vector_select_only_along_rows():
    with pytest.raises(NotSupportedError, match=r"vector_select\(dim=1\)"):

        @nki.jit
        def k(t, idx):
            it = nl.ndarray((16, 1), dtype=nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=it, src=idx)
            t.vector_select(1, it)
            return t

        k(np.zeros((16, 16), np.float32), np.zeros((16, 1), np.int32))


# --------------------------------------------------------------------------- nki.collectives


@nki.jit
def _collectives_kernel(x):
    """all_reduce (add) over ranks 0-7, all_gather over [[0..3], [4..7]], reduce_scatter (max)
    over [[0, 2, 4, 6], [1, 3, 5, 7]]; rank 0 stores all three results."""
    import nki.collectives as cc

    pid = nl.program_id(0)
    red = nl.ndarray((32, 16), dtype=x.dtype, buffer=nl.shared_hbm)
    gat = nl.ndarray((4 * 32, 16), dtype=x.dtype, buffer=nl.shared_hbm)
    sca = nl.ndarray((8, 16), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((32, 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[pid])
    r = nl.ndarray((32, 16), dtype=x.dtype, buffer=nl.sbuf)
    cc.all_reduce(srcs=[t], dsts=[r], replica_group=cc.ReplicaGroup([list(range(8))]), op=nl.add)
    g = nl.ndarray((4 * 32, 16), dtype=x.dtype, buffer=nl.sbuf)
    halves = cc.ReplicaGroup.from_partition_op(8, cc.rg_partition_op.div, 4)
    cc.all_gather(srcs=[t], dsts=[g], replica_group=halves)
    s = nl.ndarray((8, 16), dtype=x.dtype, buffer=nl.sbuf)
    strided = cc.ReplicaGroup.from_partition_op(8, cc.rg_partition_op.mod, 2)
    cc.reduce_scatter(srcs=[t], dsts=[s], replica_group=strided, op=nl.maximum)
    if pid == 0:
        nisa.dma_copy(dst=red, src=r)
        nisa.dma_copy(dst=gat, src=g)
        nisa.dma_copy(dst=sca, src=s)
    return red, gat, sca


def test_collectives_lower_to_the_device_collectives():
    import nki.collectives as cc

    assert cc.ReplicaGroup.from_partition_op(8, cc.rg_partition_op.mod, 4).groups == [[0, 4], [1, 5], [2, 6], [3, 7]]
    x = np.random.default_rng(5).integers(-60, 60, (8, 32, 16)).astype(np.float32)
    red, gat, sca = _collectives_kernel[8](x)
    np.testing.assert_array_equal(red, x.sum(axis=0))  # integer-valued: exact in any order
    np.testing.assert_array_equal(gat, np.concatenate([x[0], x[1], x[2], x[3]]))
    # rank 0 is rank 0 of [0, 2, 4, 6]: it keeps the first quarter (8 of 32 rows) of the max.
    np.testing.assert_array_equal(sca, np.maximum.reduce([x[0], x[2], x[4], x[6]])[:8])
