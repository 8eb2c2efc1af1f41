"""Fuzz of the Python binding API (docs/fuzzing.md).

`one_input(data)` turns bytes into a sequence of API calls — HBM allocation, put/get/write/free,
on-chip tiles, views (`ap`, slicing, reshape, broadcast), any instruction of the ISA tables with
operands drawn from a pool of good and bad values (wrong types, huge and negative integers,
NaN, strings), text and binary programs, runs and reads — and fails when a call raises anything
but an `EmuError` (the documented hierarchy; each class is also the matching built-in). After
every input the device must still run a small program correctly. Inputs share one device,
reset between them (`Pool`).

Coverage-guided with atheris (`pip install '.[fuzz]'`):

    python fuzz/python/fuzz_api.py -atheris_runs=100000

CI drives the same function with seeded random bytes (tests/test_fuzz_api_smoke.py).
"""

from __future__ import annotations

import inspect
import math
import sys

import numpy as np

if __name__ == "__main__":  # atheris measures coverage of the package only (not numpy, not the stdlib)
    import atheris

    with atheris.instrument_imports(include=["trn3emu"]):
        import trn3emu as t3
else:
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


#: Instructions that draw from the RNG (a device that ran one is not reused: its RNG moved on).
RNG_INSTRUCTIONS = frozenset(n for n, flags in t3._asm.INSTRUCTION_FLAGS.items() if flags[2])
#: Run steps a fuzzed run may take (branch loops end in RunawayError quickly).
MAX_EXECUTED = 4096
#: Reads of larger tensors are skipped (`alloc((2**31,), "uint8")` then `get` is a valid 2 GiB
#: read; huge reads under a memory cap are tested in tests/test_hardening_core.py).
MAX_READ_BYTES = 256 << 20
#: HBM page of the native backing (zeroing is per byte range; residency is counted in pages).
HBM_PAGE = 1 << 20


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


def _params(name: str) -> tuple[tuple[str, bool], ...]:
    """(name, required) of the keyword parameters of `Program.<name>` (inspect is slow: cached)."""
    if name not in _PARAMS:
        sig = inspect.signature(getattr(t3.Program, name))
        _PARAMS[name] = tuple(
            (pname, param.default is param.empty)
            for pname, param in sig.parameters.items()
            if pname != "self" and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)
        )
    return _PARAMS[name]


_PARAMS: dict[str, tuple[tuple[str, bool], ...]] = {}


class Pool:
    """The device the inputs share (a new Device per input cost most of an input's time).

    Between inputs `reset` brings it back to the state of a new device where an input can
    change it: HBM placement forgotten and the bytes of every HBM tensor the input placed
    zeroed, `max_executed` restored. A device is replaced instead when that would not do: an
    input wrote HBM pages outside its tensors, or ran a program with an RNG instruction (the
    RNG state cannot be set back). On-chip bytes are not reset (filling 32 MiB per touched
    core costs more than a new device); no input reads on-chip memory it did not write first
    in a way that can change what it raises, and `one_input` re-checks a finding on a fresh
    device before reporting it (`Finding` says whether it reproduces there).
    """

    def __init__(self) -> None:
        self.dev = self._new()
        self.replaced = 0

    @staticmethod
    def _new() -> t3.Device:
        dev = t3.Device()
        dev.max_executed = MAX_EXECUTED
        return dev

    def reset(self, hbm_hi: int, rng_used: bool) -> None:
        """After an input whose HBM tensors all ended below `hbm_hi`."""
        # views may reach a few bytes past a tensor
        span = -(-(hbm_hi + 4096) // HBM_PAGE) * HBM_PAGE
        native = self.dev.hbm._native
        if rng_used or span > MAX_RESET_SPAN:
            self._replace()
            return
        native.hbm_zero(0, span)
        # Every page below `span` backed: then the device holds no page elsewhere (one an input
        # wrote outside its tensors) exactly when its resident bytes are `span`.
        for page in range(0, span, HBM_PAGE):
            native.hbm_write(page, _ZERO_BYTE)
        if native.hbm_resident_bytes() != span:
            self._replace()
            return
        self.dev.hbm._reset()
        self.dev.max_executed = MAX_EXECUTED

    def _replace(self) -> None:
        self.dev = self._new()
        self.replaced += 1


_ZERO_BYTE = np.zeros(1, np.uint8)
#: HBM bytes a reset zeroes at most (beyond, a new device is cheaper).
MAX_RESET_SPAN = 64 << 20


POOL: Pool | None = None


class Session:
    def __init__(self, u: Bytes, dev: t3.Device | None = None):
        self.u = u
        if dev is None:
            dev = t3.Device()
            dev.max_executed = MAX_EXECUTED
        self.dev = dev
        self.prog = t3.Program()
        self.tensors: list[t3.Tensor] = []
        self.rng_used = False
        self.hbm_hi = 0  # end of the highest HBM tensor placed

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
        for pname, required in _params(name):
            # Required keywords always get a value (leaving one out is Python's own TypeError).
            if required or self.u.chance(100):
                kwargs[pname] = self.value()
        kwargs.pop("engine", None)
        if self.u.chance(40):
            kwargs["engine"] = self.u.pick(("sync", "vector", "scalar", "gpsimd", "tensor", "bogus", 3))
        method(**kwargs)
        self.rng_used |= name in RNG_INSTRUCTIONS  # (appended: a run may draw from the RNG)

    def run(self):
        self.dev.run(self.prog, trace=self.u.chance(128))

    def read(self):
        if self.tensors:
            t = self.u.pick(self.tensors)
            if t.size * t.itemsize > MAX_READ_BYTES:
                return  # a valid read that only costs time and memory (libFuzzer's 2 GiB RSS limit)
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
        """The device runs a small program correctly after whatever the input did."""
        p = t3.Program()
        x = np.arange(8, dtype=np.float32)
        src = self.dev.hbm.put(x)
        self.hbm_hi = max(self.hbm_hi, src.block.hi)
        s = p.sbuf((1, 8), np.float32)
        p.dma_copy(dst=s, src=src.reshape(1, 8))
        p.tensor_scalar(dst=s, data=s, op0="add", operand0=1.0)
        self.dev.run(p)
        got = self.dev.read(s)
        self.dev.hbm.free(src)
        if not np.array_equal(got, (x + 1).reshape(1, 8)):
            raise Finding(f"device unusable after the input's calls: read {got}")


def _session(data: bytes, dev: t3.Device | None) -> Session:
    """Play the input's calls; after them the device must still run a program correctly."""
    u = Bytes(data)
    s = Session(u, dev)
    for _ in range(1 + u.below(24)):
        if u.done():
            break
        action = u.pick(Session.ACTIONS)
        try:
            getattr(s, action)()
        except t3.EmuError:
            pass
        except Finding:
            raise
        except Exception as e:  # noqa: BLE001 - the finding: an exception outside the hierarchy
            raise Finding(f"{action} raised {type(e).__name__}: {e}") from e
        finally:
            s.hbm_hi = max([s.hbm_hi] + [t.block.hi for t in s.tensors if t.block is not None])
    s.still_usable()
    return s


def one_input(data: bytes, fresh: bool = False) -> None:
    """One input on the shared device (`POOL`), or with `fresh` on a new one. Raises `Finding`."""
    global POOL
    if fresh:
        _session(data, None)
        return
    if POOL is None:
        POOL = Pool()
    try:
        s = _session(data, POOL.dev)
    except Finding as e:
        POOL = None  # whatever state the device is in, the next input gets a new one
        try:
            _session(data, None)
            again = "not on a fresh device (the shared device's state from earlier inputs matters)"
        except Finding:
            again = "on a fresh device too"
        raise Finding(f"{e} [reproduces {again}]") from e
    POOL.reset(s.hbm_hi, s.rng_used)


def main() -> None:
    import resource

    # An address-space cap, so that a host allocation sized by input fails (ResourceError)
    # instead of succeeding lazily and drawing the OOM killer.
    cap = 6 << 30
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
