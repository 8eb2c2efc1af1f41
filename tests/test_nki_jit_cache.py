"""nki.jit caches traced launches per call signature: repeated calls with new values give new
results without retracing; shapes, dtypes, scalar arguments and grids retrace; the device each
cached call runs on looks fresh (on-chip fill, zero HBM, RNG from power-on). References are numpy."""

import numpy as np
import pytest
import trn3emu.nki as tn

tn.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

TRACES: list = []


@nki.jit
def axpb(x, alpha):
    """out = x * alpha + 1, tile by tile (128 rows); counts its traces."""
    TRACES.append((x.shape, str(x.dtype), alpha))
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128 : (i + 1) * 128, :])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=1.0)
        nisa.dma_copy(dst=out[i * 128 : (i + 1) * 128, :], src=t)
    return out


@pytest.fixture(autouse=True)
def _fresh():
    TRACES.clear()
    axpb.cache_clear()


def test_second_call_new_values_no_retrace():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((256, 64)).astype(np.float32)
    b = rng.standard_normal((256, 64)).astype(np.float32)
    ra = axpb(a, 2.0)
    first_programs = axpb.last_programs
    rb = axpb(b, 2.0)
    assert len(TRACES) == 1
    assert axpb.last_programs is first_programs
    np.testing.assert_array_equal(ra, (a * np.float32(2.0) + np.float32(1.0)).astype(np.float32))
    np.testing.assert_array_equal(rb, (b * np.float32(2.0) + np.float32(1.0)).astype(np.float32))
    assert axpb.last_result.time_ns > 0


def test_shapes_dtypes_scalars_retrace():
    x = np.arange(128 * 32, dtype=np.float32).reshape(128, 32) / 64
    axpb(x, 2.0)
    axpb(x * 3, 2.0)  # same signature: cached
    y = np.ones((256, 32), np.float32)
    np.testing.assert_array_equal(axpb(y, 2.0), np.full((256, 32), 3.0, np.float32))  # new shape
    np.testing.assert_array_equal(axpb(x, 0.5), x * np.float32(0.5) + np.float32(1))  # new scalar value
    axpb(x.astype(np.float16), 2.0)  # new dtype
    assert [t[0] for t in TRACES] == [(128, 32), (256, 32), (128, 32), (128, 32)]
    assert [t[2] for t in TRACES] == [2.0, 2.0, 0.5, 2.0]
    axpb(x, 0.5)  # every signature above is still cached
    axpb(y, 2.0)
    assert len(TRACES) == 4


def test_int_and_float_scalars_key_apart():
    x = np.ones((128, 8), np.float32)
    axpb(x, 2)
    axpb(x, 2.0)
    assert len(TRACES) == 2  # 2 == 2.0 in Python, but tracing could differ


def test_cache_off_by_option_and_env(monkeypatch):
    x = np.ones((128, 8), np.float32)
    k = nki.jit(axpb.fn, cache=False)
    k(x, 2.0)
    k(x, 2.0)
    assert len(TRACES) == 2
    monkeypatch.setenv("TRN3EMU_NKI_CACHE", "0")
    axpb(x, 2.0)
    axpb(x, 2.0)
    assert len(TRACES) == 4


def test_uncacheable_argument_traces_every_call():
    x = np.ones((128, 8), np.float32)

    @nki.jit
    def k(x, cfg):
        TRACES.append(cfg["alpha"])
        return axpb.fn(x, cfg["alpha"])

    np.testing.assert_array_equal(k(x, {"alpha": 3.0}), np.full((128, 8), 4.0, np.float32))
    np.testing.assert_array_equal(k(x, {"alpha": 5.0}), np.full((128, 8), 6.0, np.float32))
    assert TRACES.count(3.0) == 1 and TRACES.count(5.0) == 1


@nki.jit
def scale_in_place(x, y):
    """Writes 2*x into the input y (in place) and returns x + 1."""
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    u = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=y, src=u)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_inputs_written_by_the_kernel_update_in_place_on_cached_calls():
    for k in range(3):
        x = np.full((128, 16), float(k), np.float32)
        y = np.zeros((128, 16), np.float32)
        out = scale_in_place(x, y)
        np.testing.assert_array_equal(y, np.full((128, 16), 2.0 * k, np.float32))
        np.testing.assert_array_equal(out, np.full((128, 16), k + 1.0, np.float32))
    assert len(scale_in_place._cache) == 1


@nki.jit
def write_rows_of_second(x, y, z):
    """Writes x + 1 into rows 64..128 of y through a view and returns y's first rows + x;
    z is only read. Only inputs some instruction writes are checked for write-back."""
    t = nl.ndarray((64, 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[0:64, :])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=y[64:128, :], src=t)
    u = nl.ndarray((64, 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=u, src=z[0:64, :])
    out = nl.ndarray((64, 16), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=u)
    return out


def test_an_input_written_through_a_view_is_copied_back_and_the_others_kept():
    for k in range(3):
        x = np.full((128, 16), float(k), np.float32)
        y = np.full((128, 16), -1.0, np.float32)
        z = np.arange(128 * 16, dtype=np.float32).reshape(128, 16)
        out = write_rows_of_second(x, y, z)
        want = np.full((128, 16), -1.0, np.float32)
        want[64:] = k + 1.0
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(z, np.arange(128 * 16, dtype=np.float32).reshape(128, 16))
        np.testing.assert_array_equal(out, z[:64])
    assert len(write_rows_of_second._cache) == 1
    (traced,) = write_rows_of_second._cache.values()
    assert traced.written_inputs == [1]  # x and z are never written: not compared after the run


@nki.jit
def reads_uninitialised(a):
    """Reads a tile before anything writes it, then fills the same bytes from the input."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    u = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf, address=(0, 0))
    nisa.dma_copy(dst=out, src=u)
    x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf, address=(0, 0))
    nisa.dma_copy(dst=x, src=a)
    return out


def test_cached_calls_start_from_fresh_onchip_memory():
    a = np.full((128, 16), 7.0, np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(reads_uninitialised(a), np.zeros_like(a))
    from trn3emu import testing

    with testing.fill_uninitialized(0xFF):
        for _ in range(2):
            out = reads_uninitialised(a)
            assert (out.view(np.uint32) == 0xFFFFFFFF).all()
    np.testing.assert_array_equal(reads_uninitialised(a), np.zeros_like(a))


@nki.jit
def first_row(a):
    """Copies row 0 of `a` into a fresh HBM output; the other rows are never written."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[0:1, :])
    nisa.dma_copy(dst=out[0:1, :], src=t)
    return out


def test_cached_calls_see_zero_hbm_where_an_earlier_launch_wrote():
    small = np.full((4, 16), 3.0, np.float32)
    big = np.full((64, 16), 9.0, np.float32)  # its HBM input covers small's output range
    expect = np.zeros_like(small)
    expect[0] = 3.0
    np.testing.assert_array_equal(first_row(small), expect)
    first_row(big)
    np.testing.assert_array_equal(first_row(small), expect)  # cached, on big's device
    np.testing.assert_array_equal(first_row(small), expect)


@nki.jit
def uniform(shape_rows):
    out = nl.ndarray((shape_rows, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((shape_rows, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.rand2(dst=t, min=0.0, max=1.0)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_rng_kernels_repeat_like_uncached_calls():
    """The RNG state outlives a run on hardware and here; a cached launch must still give what
    an uncached call (a power-on device) gives."""
    first = uniform(32)
    again = uniform(32)
    uncached = nki.jit(uniform.fn, cache=False)(32)
    assert len(uniform._cache) == 1
    assert ((first >= 0) & (first < 1)).all() and len(np.unique(first)) > 100
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(uncached, first)


@nki.jit
def per_program(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    pid = nl.program_id(0)
    rows = x.shape[0] // nl.num_programs(0)
    t = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[pid * rows : (pid + 1) * rows, :])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(pid))
    nisa.dma_copy(dst=out[pid * rows : (pid + 1) * rows, :], src=t)
    return out


def test_grids_are_part_of_the_key():
    x = np.arange(256 * 8, dtype=np.float32).reshape(256, 8)
    for _ in range(2):
        r2 = per_program[2](x)
        np.testing.assert_array_equal(r2, x + np.repeat([0.0, 1.0], 128)[:, None].astype(np.float32))
        r1 = per_program[1](x[:128])
        np.testing.assert_array_equal(r1, x[:128])
    assert len(per_program._cache) == 2


@nki.jit
def alias_of_input(a):
    """An HBM output placed at address 0, where a new device puts the first input (aliasing)."""
    return nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm, address=0)


def test_hbm_placement_is_the_same_on_a_reused_device():
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    np.testing.assert_array_equal(alias_of_input(a), a)
    first_row(np.ones((64, 16), np.float32))  # leaves its device as the spare
    alias_of_input.cache_clear()
    np.testing.assert_array_equal(alias_of_input(a), a)  # traced on the reused device
    np.testing.assert_array_equal(alias_of_input(a + 1), a + 1)  # cached


def test_simulate_of_a_plain_function_reuses_its_trace():
    def plain(x):
        TRACES.append("plain")
        return axpb.fn(x, 1.0)

    x = np.ones((128, 4), np.float32)
    for k in range(3):
        np.testing.assert_array_equal(nki.simulate(plain)(x * k), np.full((128, 4), k + 1.0, np.float32))
    assert TRACES.count("plain") == 1


@nki.jit
def count_up(a, n):
    """a + n, with n read on the device (a device loop): the trace depends on device data."""
    t = nl.load(a)
    cnt = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cnt, src=n)
    r = nisa.register_alloc()
    nisa.register_load(r, cnt)
    for _ in nl.dynamic_range(r):
        t[...] += 1.0
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=t)
    return out


def test_device_dependent_traces_are_never_replayed():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for n in (2, 0, 3, 2):
        np.testing.assert_array_equal(count_up(a, np.array([[n]], np.int32)), a + n)
    assert count_up.device_dependent and not count_up._cache


def test_device_reset_primitives_restore_what_runs_and_the_host_wrote():
    """The spare-device reset: `fill_onchip` must refill every core a run wrote (it skips memories
    it knows are untouched) and `hbm_zero` must zero exactly its range, across 1 MiB pages."""
    import trn3emu as t3

    dev = t3.Device()
    dev.fill_onchip(0x5A)
    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    for core in (0, 3):
        p = t3.Program(core=core)
        t = p.sbuf((128, 8), np.float32)
        p.dma_copy(dst=t, src=dev.hbm.put(x))
        dev.run(p)
        assert (dev._native.onchip_read(core, "sbuf", 0, 128, t.offset, 32) != 0x5A).any()
    dev.fill_onchip(0x5A)
    for core in range(8):
        for mem, nbytes in (("sbuf", 256 * 1024), ("psum", 16 * 1024)):
            got = dev._native.onchip_read(core, mem, 0, 128, 0, nbytes)
            assert (got == 0x5A).all(), (core, mem)

    base = 3 << 20
    data = np.arange(3 << 20, dtype=np.uint32).astype(np.uint8)
    dev._native.hbm_write(base, data)
    lo, n = 5, (2 << 20) + 11  # straddles two page boundaries
    dev._native.hbm_zero(base + lo, n)
    want = data.copy()
    want[lo : lo + n] = 0
    np.testing.assert_array_equal(dev._native.hbm_read(base, data.size), want)
    with pytest.raises(t3.ValidationError, match="HBM"):
        dev._native.hbm_zero(145 << 30, 16)


def test_device_reset_refills_only_what_runs_may_write_but_all_of_it():
    """`fill_onchip` after a run rewrites only the bytes its programs' written operands span
    (machine/write_window.rs): writes far up SBUF, PSUM matmul results, a write at a dynamic
    offset (whole memory then) and runs with different footprints all come back to the fill."""
    import trn3emu as t3

    dev = t3.Device()
    dev.fill_onchip(0xA5)
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    hx = dev.hbm.put(x)

    def all_filled(byte):
        for core in range(8):
            for mem, nbytes in (("sbuf", 256 * 1024), ("psum", 16 * 1024)):
                got = dev._native.onchip_read(core, mem, 0, 128, 0, nbytes)
                if not (got == byte).all():
                    return False
        return True

    p = t3.Program()
    t = p.sbuf((128, 64), np.float32, address=200 * 1024)  # far from the first partition bytes
    p.dma_copy(dst=t, src=hx)
    ps = p.psum((128, 64), np.float32)
    p.nc_matmul(dst=ps, stationary=p.sbuf((128, 128), np.float32), moving=t)
    dev.run(p)
    assert not all_filled(0xA5)
    dev.fill_onchip(0xA5)
    assert all_filled(0xA5)

    # two runs with different footprints, one refill
    for addr in (1024, 100 * 1024):
        p = t3.Program()
        p.dma_copy(dst=p.sbuf((128, 64), np.float32, address=addr), src=hx)
        dev.run(p)
    dev.fill_onchip(0xA5)
    assert all_filled(0xA5)

    # a destination whose offset is only known at run time: anywhere in SBUF
    p = t3.Program(core=2)
    t = p.sbuf((16, 4, 8), np.float32, address=0)
    r = p.register_alloc(3, engine="sync")
    p.dma_copy(dst=t.ap([[32, 16], [1, 8]], scalar_offset=r, indirect_dim=1), src=hx[:16, :8], engine="sync")
    dev.run(p)
    assert not all_filled(0xA5)
    dev.fill_onchip(0xA5)
    assert all_filled(0xA5)
    dev.fill_onchip(0)  # a different byte rewrites everything
    assert all_filled(0)
