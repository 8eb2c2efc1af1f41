"""Fuzz of the Python binding API (docs/fuzzing.md).

`one_input(data)` turns bytes into a sequence of API calls — HBM allocation, put/get/write/free,
on-chip tiles, views (`ap`, slicing, reshape, broadcast), any instruction of the ISA tables with
operands drawn from a pool of good and bad values (wrong types, huge and negative integers,
NaN, strings), text and binary programs, runs and reads — and fails when a call raises anything
but an `EmuError` (the documented hierarchy; each class is also the matching built-in). After
every failed call the device must still run a small program correctly.

Coverage-guided with atheris (`pip install '.[fuzz]'`):

    python fuzz/python/fuzz_api.py -atheris_runs=100000

CI drives the same function with seeded random bytes (tests/test_fuzz_api_smoke.py).
"""

from __future__ import annotations

import inspect
import math
import sys

import numpy as np
import trn3emu as t3

DTYPE_NAMES = ("float32", "bfloat16", "int32", "uint8", "float8_e4m3", "float16", "int8")
INSTRUCTION_NAMES = tuple(sorted(t3.INSTRUCTIONS))
ENUM_VALUES = tuple(v for values in t3.ENUMS.values() for v in values)
WEIRD = (
    None,
    0,
    1,
    -1,
    3,
    2**31,
    -(2**63),
    2**70,
    1.5,
    math.nan,
    math.inf,
    True,
    "",
    "x\ud800",
    "add",
    (),
    (1, 2),
    [[1, 4]],
    b"\0",
)


class Bytes:
    """Draws from the input; zeros once it is exhausted."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def u8(self) -> int:
        b = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return b

    def below(self, n: int) -> int:
        return (self.u8() | self.u8() << 8) % n if n > 256 else self.u8() % n

    def pick(self, xs):
        return xs[self.below(len(xs))]

    def chance(self, p: int) -> bool:
        return self.u8() < p

    def done(self) -> bool:
        return self.pos >= len(self.data)


class Finding(AssertionError):
    """A call raised outside the `EmuError` hierarchy, or left the device unusable."""


class Session:
    def __init__(self, u: Bytes):
        self.u = u
        self.dev = t3.Device()
        self.dev.max_executed = 4096
        self.prog = t3.Program()
        self.tensors: list[t3.Tensor] = []

    # ---------------------------------------------------------------- values
    def shape(self):
        u = self.u
        if u.chance(12):
            return u.pick(WEIRD)
        return tuple(u.pick((1, 2, 4, 16, 128)) for _ in range(1 + u.below(3)))

    def value(self):
        u = self.u
        r = u.below(10)
        if r < 4 and self.tensors:
            return u.pick(self.tensors)
        if r < 6:
            return u.pick(ENUM_VALUES)
        if r < 7:
            return u.pick(DTYPE_NAMES)
        if r < 8:
            return u.pick((0.0, 1.0, -2.5, 0.5))
        return u.pick(WEIRD)

    # ---------------------------------------------------------------- actions
    def hbm_alloc(self):
        t = self.dev.hbm.alloc(self.shape(), self.u.pick(DTYPE_NAMES))
        self.tensors.append(t)

    def hbm_put(self):
        n = self.u.pick((1, 4, 16, 128))
        self.tensors.append(self.dev.hbm.put(np.arange(n, dtype=np.float32).reshape(-1, 1) * np.ones(4, np.float32)))

    def onchip(self):
        kind = self.u.pick(("sbuf", "psum"))
        t = getattr(self.prog, kind)(self.shape(), self.u.pick(DTYPE_NAMES))
        self.tensors.append(t)

    def view(self):
        if not self.tensors:
            return
        t = self.u.pick(self.tensors)
        u = self.u
        r = u.below(6)
        if r == 0:
            v = t[u.below(4) : u.below(8)]
        elif r == 1:
            shape = self.shape()
            v = t.reshape(*shape) if isinstance(shape, tuple) and u.chance(128) else t.reshape(shape)
        elif r == 2:
            v = t.ap(
                [[u.pick((0, 1, 4, -1)), u.pick((1, 2, 4, 2**31))] for _ in range(1 + u.below(2))],
                offset=u.pick((0, 4, -4, 2**40)),
            )
        elif r == 3:
            v = t.broadcast(u.below(3), u.pick((1, 2, 8, 2**33)))
        elif r == 4:
            v = t.view_as(u.pick(DTYPE_NAMES))
        else:
            v = t.permute(tuple(u.below(3) for _ in range(t.ndim)))
        self.tensors.append(v)

    def instruction(self):
        name = self.u.pick(INSTRUCTION_NAMES)
        method = getattr(self.prog, name)
        kwargs = {}
        for pname, param in inspect.signature(method).parameters.items():
            # Required keywords always get a value (leaving one out is Python's own TypeError).
            if param.kind is param.KEYWORD_ONLY or param.kind is param.POSITIONAL_OR_KEYWORD:
                if param.default is param.empty or self.u.chance(100):
                    kwargs[pname] = self.value()
        kwargs.pop("engine", None)
        if self.u.chance(40):
            kwargs["engine"] = self.u.pick(("sync", "vector", "scalar", "gpsimd", "tensor", "bogus", 3))
        method(**kwargs)

    def run(self):
        self.dev.run(self.prog, trace=self.u.chance(128))

    def read(self):
        if self.tensors:
            t = self.u.pick(self.tensors)
            if t.mem == "hbm":
                self.dev.hbm.get(t)
            else:
                self.dev.read(t)

    def write(self):
        if self.tensors:
            t = self.u.pick(self.tensors)
            self.dev.hbm.write(t, np.zeros(self.u.pick((1, 4, 16, 64)), self.u.pick((np.float32, np.uint8))))

    def free(self):
        if self.tensors:
            t = self.u.pick(self.tensors)
            (self.dev.hbm if self.u.chance(200) else self.prog).free(t)

    def text(self):
        src = self.prog.to_text() if self.u.chance(128) else ""
        cut = bytes(self.u.u8() for _ in range(self.u.below(16))).decode("latin-1")
        at = self.u.below(len(src) + 1)
        t3.Program.from_text(src[:at] + cut + src[at:])

    def binary(self):
        data = bytearray(self.prog.encode())
        for _ in range(self.u.below(4)):
            if data:
                data[self.u.below(len(data))] = self.u.u8()
        t3.Program.decode(bytes(data))

    def new_program(self):
        self.prog = t3.Program(core=self.u.pick((0, 1, 7, 8, -1)), sync=self.u.pick(("auto", "manual", "bogus")))
        self.tensors = [t for t in self.tensors if t.mem == "hbm"]

    ACTIONS = ("hbm_alloc", "hbm_put", "onchip", "onchip", "view", "instruction", "instruction", "instruction",
               "run", "read", "write", "free", "text", "binary", "new_program")  # fmt: skip

    # ---------------------------------------------------------------- checks
    def still_usable(self):
        """The device runs a small program correctly after whatever failed."""
        p = t3.Program()
        x = np.arange(8, dtype=np.float32)
        src = self.dev.hbm.put(x)
        s = p.sbuf((1, 8), np.float32)
        p.dma_copy(dst=s, src=src.reshape(1, 8))
        p.tensor_scalar(dst=s, data=s, op0="add", operand0=1.0)
        self.dev.run(p)
        got = self.dev.read(s)
        self.dev.hbm.free(src)
        if not np.array_equal(got, (x + 1).reshape(1, 8)):
            raise Finding(f"device unusable after a failed call: read {got}")


def one_input(data: bytes) -> None:
    u = Bytes(data)
    s = Session(u)
    failed = False
    for _ in range(1 + u.below(24)):
        if u.done():
            break
        action = u.pick(Session.ACTIONS)
        try:
            getattr(s, action)()
        except t3.EmuError:
            failed = True
        except Finding:
            raise
        except Exception as e:  # noqa: BLE001 - the finding: an exception outside the hierarchy
            raise Finding(f"{action} raised {type(e).__name__}: {e}") from e
    if failed:
        s.still_usable()


def main() -> None:
    import resource

    import atheris

    # An address-space cap, so that a host allocation sized by input fails (ResourceError)
    # instead of succeeding lazily and drawing the OOM killer.
    cap = 6 << 30
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    atheris.instrument_all()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
