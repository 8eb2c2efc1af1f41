"""The native append's access-pattern operands: the fast reading of the usual tuple form and
the generic extraction agree (same instruction, same errors), checked against the text form."""

import numpy as np
import pytest
from trn3emu import _native
from trn3emu.errors import EmuError
from trn3emu.nki import _emit

TEXT = "tensor_tensor.vector dst=sbuf:float32[0:128]+0[[1,512]] data1=sbuf:float32[0:128]+2048[[1,512]] data2=sbuf:float32[0:128]+4096[[1,512]] op=add"


def _ap(offset, dims=((1, 512),), **kw):
    parts = kw.get("parts", 128)
    return (kw.get("mem", "sbuf"), kw.get("dtype", "float32"), kw.get("start", 0), parts, 0, offset, dims)


class _Str(str):
    pass


@pytest.mark.parametrize(
    "form",
    [
        lambda o: _ap(o),  # the usual tuple
        lambda o: _ap(o, [(1, 512)]),  # dims as a list
        lambda o: _ap(np.int64(o), ((np.int32(1), np.int64(512)),)),  # numpy integers
        lambda o: (_Str("sbuf"), _Str("float32"), 0, 128, 0, o, ((1, 512),)),  # str subclasses
    ],
)
def test_pattern_forms_give_the_text_forms_instruction(form):
    p = _native.Program()
    p.append("tensor_tensor", None, (form(0), form(2048), form(4096), "add"), [], [], None)
    assert p.to_text() == _native.Program.from_text(TEXT).to_text()


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        (_ap(0, mem="dram"), "unknown_memory"),
        (_ap(0, dtype="float33"), "unknown_dtype"),
        (_ap(0, start=300), "ap_start_out_of_range"),
        (_ap(0, parts=0), "ap_parts_out_of_range"),
        (_ap(-4), "ap_negative_offset"),
        (_ap(0, ((1, 0),)), "ap_dim_size_out_of_range"),
        (_ap(0, [(1, 0)]), "ap_dim_size_out_of_range"),
        (_ap(0, ((1, 512, 3),)), "operand_not_tensor"),
        (_ap(0.0), "operand_not_tensor"),
        (_ap(0, [[1, 512]]), "operand_not_tensor"),  # pairs are tuples
        (_ap(0, "ab"), "operand_not_tensor"),
        (("sbuf", "float32", 0, 128, 0, 0), "operand_not_tensor"),
    ],
)
def test_malformed_patterns_raise_their_rule_naming_the_operand(bad, rule):
    p = _native.Program()
    with pytest.raises(EmuError) as e:
        p.append("tensor_tensor", None, (_ap(0), bad, _ap(4096), "add"), [], [], None)
    assert e.value.rule == rule
    assert e.value.operand == "data1"
    assert len(p) == 0


def test_access_pattern_handle_appends_as_its_tuple_and_moves_with_at():
    handles = [_native.access_pattern(_ap(o)) for o in (0, 2048)]
    assert all(type(h) is _native.AccessPattern for h in handles)
    moved = _native.access_pattern(_ap(1024)).at(4096)  # the pattern of a tile at another offset
    p = _native.Program()
    p.append("tensor_tensor", None, (*handles, moved, "add"), [], [], None)
    assert p.to_text() == _native.Program.from_text(TEXT).to_text()
    assert "sbuf:float32[0:128]+4096[[1,512]]" in repr(moved)
    # a tensor-or-number operand takes it too (tensor_scalar's operand0)
    col = _native.access_pattern(("sbuf", "float32", 0, 128, 0, 8192, ((1, 1),)))
    q = _native.Program()
    q.append("tensor_scalar", None, (handles[0], handles[1], "multiply", col, None, None, None, None), [], [], None)
    want = "tensor_scalar.vector dst=sbuf:float32[0:128]+0[[1,512]] data=sbuf:float32[0:128]+2048[[1,512]] op0=multiply operand0=sbuf:float32[0:128]+8192[[1,1]]"
    assert q.to_text() == _native.Program.from_text(want).to_text()


def test_access_pattern_of_a_malformed_tuple_is_the_tuple_and_append_says_why():
    bad = _ap(0, mem="dram")
    assert _native.access_pattern(bad) is bad
    with pytest.raises(EmuError) as e:
        _native.Program().append("tensor_tensor", None, (_ap(0), bad, _ap(4096), "add"), [], [], None)
    assert (e.value.rule, e.value.operand) == ("unknown_memory", "data1")


class _L(list):
    pass


class _Tile:
    """Stands in for NkiTensor: a view with its pattern (`_ap`) and its tensor (`_t.core`)."""

    def __init__(self, ap, core=0):
        self._ap, self._t = ap, type("T", (), {"core": core})()


def test_call_plan_takes_tiles_and_plain_values_and_hands_the_rest_to_slow():
    ap = _native.access_pattern(_ap(0))
    plan = ((0, True, None), (None, False, None), (2, True, str.upper), (1, True, None))
    seen = []

    def slow(v, is_dst, core, uses):
        seen.append((v, is_dst, core, uses))
        return None if v == {"bail"} else f"slow:{v}"

    ops = _native.CallPlan("tensor_tensor", plan, [None, 7, 8], (), _Tile, slow).operands(
        (_Tile(ap), "dropped", "x", 2.5), 0, "u"
    )
    assert ops == (ap, 2.5, "X") and seen == []  # the tile's pattern, a converted and a plain value
    # another core's tile, a non-plain value: to `slow` (with whether its position is an HBM dst)
    ops = _native.CallPlan("tensor_tensor", plan, [None, 7, 8], (1,), _Tile, slow).operands(
        (_Tile(ap, core=1), "-", "x", {1}), 0, "u"
    )
    assert ops[1:] == ("slow:{1}", "X") and seen[1] == ({1}, True, 0, "u")
    assert type(seen[0][0]) is _Tile and seen[0][1:] == (False, 0, "u")
    plan2 = ((0, True, None), (1, True, None))
    assert (
        _native.CallPlan("tensor_tensor", plan2, [None, None], (), _Tile, slow).operands(({"bail"}, 1), 0, "u") is None
    )
    # exact lists and tuples are taken as they are, as the front end's `slow` gives them back
    seen.clear()
    lst, tup = [1, 2], (3,)
    ops = _native.CallPlan("tensor_tensor", plan2, [None, None], (), _Tile, slow).operands((lst, tup), 0, "u")
    assert ops[0] is lst and ops[1] is tup and seen == []
    assert _emit._slow_operand(lst, False, 0, {}) is lst and _emit._slow_operand(tup, True, 0, {}) is tup
    ops = _native.CallPlan("tensor_tensor", plan2, [None, None], (), _Tile, slow).operands((_L([1]), 1), 0, "u")
    assert ops[0] == "slow:[1]"  # (a subclass: to `slow`)
    with pytest.raises(ValueError):
        _native.CallPlan("tensor_tensor", ((2, True, None),), [None, None], (), _Tile, slow)  # past the operands


class _Bar:
    def __init__(self):
        self.n = 0

    def tick(self):
        self.n += 1


def test_call_plan_append_is_operands_then_append():
    """`CallPlan.append` appends what `operands` gives as `Program.append` does (the text form),
    adds the opcode, ticks the bar; None leaves all three untouched; an append error is the
    one `Program.append` raises, with the kernel-line note."""
    aps = [_native.access_pattern(_ap(o)) for o in (0, 2048, 4096)]
    plan = ((0, True, None), (None, False, None), (1, True, None), (2, True, None), (3, False, str.lower))
    cp = _native.CallPlan("tensor_tensor", plan, [None, None, None, "add"], (), _Tile, lambda *a: None)
    prog, opcodes, bar = _native.Program(), set(), _Bar()
    values = (_Tile(aps[0]), "dropped", _Tile(aps[1]), _Tile(aps[2]), "ADD")
    assert cp.append(prog, values, 0, "u", "k.py:3", "k.py:3", opcodes, bar) == 0
    assert cp.append(prog, values, 0, "u", "k.py:4", "k.py:4", opcodes, None) == 1
    ref = _native.Program()
    ref.append("tensor_tensor", None, (_ap(0), _ap(2048), _ap(4096), "add"), [], [], "k.py:3")
    ref.append("tensor_tensor", None, (_ap(0), _ap(2048), _ap(4096), "add"), [], [], "k.py:4")
    assert prog.to_text() == ref.to_text() and opcodes == {"tensor_tensor"} and bar.n == 1
    assert cp.append(prog, ({"no"}, "-", *values[2:]), 0, "u", "x", "x", opcodes, bar) is None  # `slow` refused
    assert len(prog) == 2 and bar.n == 1
    bad = _native.access_pattern(_ap(0, parts=64))  # a shape mismatch: the core's check
    with pytest.raises(EmuError) as want:
        ref.append("tensor_tensor", None, (_ap(0), _ap(0, parts=64), _ap(4096), "add"), [], [], "k.py:9")
    with pytest.raises(EmuError) as got:
        cp.append(prog, (values[0], "-", _Tile(bad), values[3], "add"), 0, "u", "k_py:9", "k.py:9", set(), None)
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)
    assert (got.value.rule, got.value.operand, got.value.instruction) == (
        want.value.rule,
        want.value.operand,
        want.value.instruction,
    )
    assert got.value.__notes__ == ["  in kernel at k.py:9 (tensor_tensor)"] and len(prog) == 2


@pytest.mark.parametrize(("mem", "shape"), [("sbuf", (128, 512)), ("hbm", (4096, 128)), ("sbuf", (64, 4, 32))])
def test_plain_views_match_the_general_tensor_indexing(mem, shape):
    """`Tensor._plain` (the native geometry, which `Tensor[key]` takes first) against the Python
    arithmetic of `Tensor._indexed` (the general path) on random plain keys."""
    from trn3emu.tensor import Tensor

    t = Tensor(mem, "bfloat16", shape, name="x", core=0 if mem != "hbm" else None)
    rng = np.random.default_rng(3)
    for _ in range(300):
        key = []
        for n in shape[: rng.integers(1, len(shape) + 1)]:
            if rng.random() < 0.3:
                key.append(int(rng.integers(-n, n)))
            else:
                a, b = sorted(rng.integers(0, n + 1, 2))
                key.append(slice(None if a == 0 and rng.random() < 0.5 else int(a), int(b) if b > a else int(a) + 1))
        key = tuple(key)
        got = t._plain(key)
        if any(type(k) is slice and k.stop > n for k, n in zip(key, shape)):
            assert got is None  # past the dim: the general path clips or refuses it
            continue
        want = t._indexed(key)
        geometry = (want.shape, want.strides, want.offset, want.start)
        assert (got.shape, got.strides, got.offset, got.start) == geometry, key
        v = t[key] if len(key) > 1 else t[key[0]]
        assert (v.shape, v.strides, v.offset, v.start) == geometry, key
        assert (got.mem, got.dtype, got.name, got.core, got.dyn, got.block) == (t.mem, t.dtype, "x", t.core, None, None)
    assert t._plain((slice(0, 2, 1),)) is None  # a step: the general path's
    assert t._plain((True,)) is None  # not an int
