"""`nki.isa` functions carry real signatures built from the ISA tables: `inspect.signature`,
`help()` and interactive tools show operand names, order and defaults (not `*args, **kwargs`)."""

from __future__ import annotations

import importlib
import inspect
import pydoc

from trn3emu._asm import INSTRUCTIONS
from trn3emu.nki import isa as nisa
from trn3emu.nki import legacy

P = inspect.Parameter


def _shape(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_nc_matmul_signature():
    e = P.empty
    assert _shape(nisa.nc_matmul) == [
        ("dst", P.POSITIONAL_OR_KEYWORD, e),
        ("stationary", P.POSITIONAL_OR_KEYWORD, e),
        ("moving", P.POSITIONAL_OR_KEYWORD, e),
        ("is_stationary_onezero", P.POSITIONAL_OR_KEYWORD, False),
        ("is_moving_onezero", P.POSITIONAL_OR_KEYWORD, False),
        ("is_transpose", P.POSITIONAL_OR_KEYWORD, False),
        ("accumulate", P.POSITIONAL_OR_KEYWORD, None),
        ("tile_position", P.POSITIONAL_OR_KEYWORD, ()),
        ("tile_size", P.POSITIONAL_OR_KEYWORD, ()),
        ("perf_mode", P.POSITIONAL_OR_KEYWORD, "none"),
        ("engine", P.POSITIONAL_OR_KEYWORD, None),
        ("name", P.POSITIONAL_OR_KEYWORD, None),
        ("wait", P.KEYWORD_ONLY, ()),
        ("signal", P.KEYWORD_ONLY, ()),
        ("mask", P.KEYWORD_ONLY, None),
    ]
    assert inspect.signature(nisa.nc_matmul).return_annotation is nisa.Instruction


def test_defaults_of_several_instructions():
    def defaults(fn):
        return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not P.empty}

    assert list(inspect.signature(nisa.activation).parameters)[:8] == [
        "dst",
        "op",
        "data",
        "bias",
        "scale",
        "reduce_op",
        "reduce_res",
        "reduce_cmd",
    ]
    d = defaults(nisa.activation)
    assert (d["bias"], d["scale"], d["reduce_cmd"]) == (None, 1.0, "idle") and "op" not in d
    assert defaults(nisa.range_select)["on_false_value"] == -3.4028235e38
    assert defaults(nisa.iota)["offset"] == 0 and "pattern" not in defaults(nisa.iota)
    assert defaults(nisa.dma_copy)["oob_mode"] == "error"
    assert list(inspect.signature(nisa.tensor_tensor).parameters)[:4] == ["dst", "data1", "data2", "op"]
    # NKI-only keywords: every instruction takes mask=; tensor_copy also the legacy dtype= (dropped)
    assert inspect.signature(nisa.tensor_copy).parameters["dtype"].kind is P.KEYWORD_ONLY
    # wrappers over the generated functions keep the signature
    assert list(inspect.signature(nisa.tensor_reduce).parameters)[:6] == [
        "dst",
        "op",
        "data",
        "axis",
        "negate",
        "keepdims",
    ]
    assert list(inspect.signature(nisa.dma_compute).parameters)[:4] == ["dst", "srcs", "scales", "reduce_op"]


def test_every_instruction_function_has_its_operands_in_order():
    for name, (_op, _engines, params) in INSTRUCTIONS.items():
        # emulator-level instructions without an nki.isa API have their wrapper in trn3emu.nki.<ext>
        fn = (
            getattr(importlib.import_module(nisa.EXTENSIONS[name]), name)
            if name in nisa.EXTENSIONS
            else getattr(nisa, name)
        )
        sig = inspect.signature(fn)
        kinds = {p.kind for p in sig.parameters.values()}
        assert P.VAR_POSITIONAL not in kinds and P.VAR_KEYWORD not in kinds, (name, sig)
        if name in ("dma_compute", "scalar_load", "scalar_store") or fn.__module__ not in (
            nisa.__name__,
            nisa.EXTENSIONS.get(name),
        ):
            # srcs list form; NKI's scalar_load(src, engine) / scalar_store(dst, value, engine)
            # (docs/nki.md, "NKI scalars"); register_* are the virtual-register front ends
            continue
        assert list(sig.parameters)[: len(params)] == [p[0] for p in params], name
        assert "mask" in sig.parameters, name


def test_help_shows_names_and_defaults():
    text = pydoc.render_doc(nisa.nc_matmul, renderer=pydoc.plaintext)
    assert "nc_matmul(dst, stationary, moving, is_stationary_onezero=False" in text
    assert "perf_mode='none'" in text


def test_legacy_signatures_drop_dst():
    sig = inspect.signature(legacy.isa.nc_matmul)
    assert list(sig.parameters)[:3] == ["stationary", "moving", "is_stationary_onezero"]
    assert sig.parameters["dtype"].kind is P.KEYWORD_ONLY and sig.parameters["mask"].default is None
    sig = inspect.signature(legacy.isa.tensor_scalar)
    assert list(sig.parameters)[:3] == ["data", "op0", "operand0"]
    assert P.VAR_KEYWORD not in {p.kind for p in sig.parameters.values()}
