"""The `trn3emu` command: demo, run, trace, asm, disasm, isa."""

from __future__ import annotations

import argparse
import difflib
import errno
import math
import os
import sys
from pathlib import Path

import numpy as np

from . import _asm
from .device import Device
from .dtypes import numpy_dtype
from .errors import EmuError, RaceError, ResourceError, SemaphoreError, ShapeError
from .program import Program

MAGIC = b"T3EP"
#: Most elements of any one matrix of `trn3emu demo` (inputs are made on the host in float64).
DEMO_MAX_ELEMENTS = 1 << 26
_SYNC_HELP = (
    "auto (default, like the Python API): add the semaphores the data dependencies need; manual: only the program's own"
)
_INPUT_HELP = (
    "load an array into HBM at ADDR; DTYPE names the dtype of .npy files numpy saved as raw words "
    "(bfloat16, float8_*: void |V2 / |V1) or converts other arrays"
)


def _load(path: str, sync: str) -> Program:
    data = Path(path).read_bytes()
    if data[:4] == MAGIC:
        return Program.decode(data, sync=sync)
    return Program.from_text(data.decode("utf-8-sig"), sync=sync)  # (a leading BOM is not text)


def _cmd_demo(args) -> int:
    if args.nki:
        return _nki_example(args.nki)
    from .demo import main

    for flag, v, tile in (("--m", args.m, 128), ("--k", args.k, 128), ("--n", args.n, 512)):
        if v <= 0 or v % tile:
            # The demo tiles M and K by 128 and N by 512; any other size would drop the remainder.
            raise ShapeError(
                f"demo {flag} {v}: must be a positive multiple of {tile} (the demo's tile size)",
                operand=flag,
                rule="demo_size_not_tile_multiple",
            )
    sizes = {"A (m x k)": args.m * args.k, "B (k x n)": args.k * args.n, "out (m x n)": args.m * args.n}
    for what, elems in sizes.items():
        if elems > DEMO_MAX_ELEMENTS:
            # The demo builds its inputs on the host and one instruction per tile: refuse sizes
            # that would exhaust host memory instead of failing inside numpy.
            raise ResourceError(
                f"demo --m {args.m} --k {args.k} --n {args.n}: matrix {what} has {elems:,} elements, over the "
                f"demo's limit of {DEMO_MAX_ELEMENTS:,} (2^26, e.g. 8192 x 8192)",
                rule="demo_size_too_large",
            )
    return main(args.m, args.k, args.n, args.seed)


def _example_dir() -> Path:
    """The packaged examples (trn3emu/examples; the checkout's examples/ links to them)."""
    from . import examples

    return Path(examples.__file__).resolve().parent


def _nki_example(name: str) -> int:
    """Run the packaged example nki_<name>.py (or a path) with `nki` provided by trn3emu."""
    import runpy

    from .nki import install

    path = Path(name)
    if not path.exists():
        root = _example_dir()
        path = root / f"nki_{name}.py"
        if not path.exists():
            found = sorted(p.stem[4:] for p in root.glob("nki_*.py"))
            near = difflib.get_close_matches(name, found, n=1)
            raise EmuError(
                f"no NKI example {name!r}"
                + (f"; did you mean {near[0]!r}?" if near else "")
                + f" (examples: {', '.join(found)})",
                rule="demo_example_unknown",
            )
    install()
    mod = runpy.run_path(str(path), run_name="trn3emu_demo")
    return int(mod["main"]())


def _cmd_asm(args) -> int:
    p = _load(args.input, "manual")
    Path(args.output).write_bytes(p.encode())
    print(f"{args.input}: {len(p)} instructions -> {args.output}")
    return 0


def _cmd_disasm(args) -> int:
    p = _load(args.input, "manual")
    text = p.to_text()
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _npy_header(path: str) -> tuple[dict, int]:
    """The header of an .npy file (its dict as written) and the bytes of data after it. Not an
    .npy file (an .npz archive, a pickle, text) raises ValueError saying so."""
    import ast

    with open(path, "rb") as f:
        magic = f.read(6)
        if magic != b"\x93NUMPY":
            kind = "an .npz archive (several arrays)" if magic[:2] == b"PK" else "not an .npy file"
            raise ValueError(f"{path} is {kind}: --input takes one array saved by numpy.save (.npy)")
        major = f.read(2)[0]
        (n,) = np.frombuffer(f.read(2 if major == 1 else 4), "<u2" if major == 1 else "<u4")
        try:
            header = ast.literal_eval(f.read(int(n)).decode("latin1"))
            shape = tuple(int(d) for d in header["shape"])
            descr = str(header["descr"])
        except (ValueError, SyntaxError, KeyError, TypeError, UnicodeDecodeError):
            raise ValueError(f"{path}: the .npy header is not readable") from None
        header["shape"], header["descr"] = shape, descr
        data_bytes = os.fstat(f.fileno()).st_size - f.tell()
    return header, data_bytes


def _load_npy(path: str) -> np.ndarray:
    """np.load, and for the ml_dtypes numpy cannot describe in a header (float8_e5m2 is saved as
    `<f1`, which np.load refuses) the raw words as a void array of the header's item size. The
    header's size is checked against the file first (a header claiming terabytes the file does
    not hold is refused before anything is allocated)."""
    header, data_bytes = _npy_header(path)
    shape, descr = header["shape"], header["descr"]
    try:
        itemsize = np.dtype(descr).itemsize
    except TypeError:
        itemsize = int(descr[2:]) if descr[2:].isdigit() else 1
    need = math.prod(shape) * itemsize
    if any(d < 0 for d in shape) or need > data_bytes:
        raise ValueError(
            f"{path}: the .npy header says shape {shape} {descr} ({need:,} bytes) but the file holds "
            f"{data_bytes:,} bytes of data (a truncated or corrupt file)"
        )
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        if "descr" not in str(e):
            raise
    size = int(descr[2:])
    with open(path, "rb") as f:
        f.seek(os.fstat(f.fileno()).st_size - data_bytes)
        data = np.frombuffer(f.read(), np.dtype(f"V{size}"), count=math.prod(shape))
    return data.reshape(shape, order="F" if header["fortran_order"] else "C")


def _load_input(spec: str) -> tuple[int, np.ndarray, str | None]:
    """`ADDR=FILE.npy` or `ADDR:DTYPE=FILE.npy` -> (address, array, dtype). numpy saves bf16 and
    fp8 arrays as raw void words (`|V2`, `|V1`): those are reinterpreted as DTYPE (required then);
    an ordinary array of another dtype is converted to DTYPE (round to nearest even)."""
    where, sep, path = spec.partition("=")
    if not sep or not path:
        raise ValueError(f"--input {spec!r}: expected ADDR=FILE.npy or ADDR:DTYPE=FILE.npy")
    addr, _, dtype = where.partition(":")
    arr = _load_npy(path)
    if arr.dtype.kind == "V":
        if not dtype:
            raise ValueError(
                f"--input {spec!r}: {path} holds raw {arr.dtype.itemsize}-byte words ({arr.dtype.str}, as numpy "
                f"saves bfloat16 / float8); name their dtype: --input {addr}:bfloat16={path}"
            )
        want = numpy_dtype(dtype)
        if want.itemsize != arr.dtype.itemsize:
            raise ValueError(
                f"--input {spec!r}: {path} holds {arr.dtype.itemsize}-byte words, {dtype} has {want.itemsize}"
            )
        arr = arr.view(want)
    elif dtype and arr.dtype != numpy_dtype(dtype):
        arr = arr.astype(numpy_dtype(dtype))
    return int(addr, 0), arr, dtype or None


def _put_inputs(dev: Device, specs: list[str]) -> None:
    for spec in specs:
        addr, arr, dtype = _load_input(spec)
        dev.hbm.put(arr, dtype=dtype, address=addr, alias=True)


def _run(dev: Device, progs, args):
    return dev.run(progs, check_races=not args.no_race_check)


def _cmd_run(args) -> int:
    p = _load(args.program, args.sync)
    dev = Device()
    _put_inputs(dev, args.input)
    result = _run(dev, p, args)
    for spec in args.output:
        where, sep, path = spec.partition("=")
        parts = where.split(":")
        if not sep or not path or len(parts) != 3:
            raise ValueError(
                f"--output {spec!r}: expected ADDR:SHAPE:DTYPE=FILE.npy (e.g. 0x0:128x512:float32=out.npy)"
            )
        addr, shape, dtype = parts
        dims = tuple(int(s) for s in shape.split("x"))
        t = dev.hbm.alloc(dims, dtype, address=int(addr, 0), alias=True)
        arr = dev.hbm.get(t)
        np.save(path, arr)
        print(f"wrote {path}: {dims} {numpy_dtype(dtype)}")
    print(result.trace.summary())
    return 0


def _result_from_python(path: str, dev: Device, kernel: str | None):
    """A Python file: with `build(dev)` returning a Program or a list of them (one per core), run
    those; otherwise an NKI kernel file (`nki` provided by trn3emu), run as a script (its
    `if __name__ == "__main__":` block runs; `sys.exit(0)` there is fine), calling its `main()`
    when running it launched no kernel, and take the run of its NKI kernel (`kernel` names one
    when several ran; default the longest)."""
    from .nki import Kernel, install

    install()
    mod = _run_script(path)
    build = mod.get("build")
    if build is not None:
        progs = build(dev)
        if isinstance(progs, Program):
            return [progs]
        if not isinstance(progs, (list, tuple)) or not all(isinstance(p, Program) for p in progs):
            raise ValueError(
                f"{path}: build(dev) must return a Program or a list of Programs, got {progs!r} ({type(progs).__name__})"
            )
        return list(progs)

    def kernels_ran() -> dict:
        return {n: k for n, k in mod.items() if isinstance(k, Kernel) and k.last_result is not None}

    if not kernels_ran() and callable(mod.get("main")):
        mod["main"]()
    ran = kernels_ran()
    if not ran:
        raise ValueError(f"{path}: defines no build(dev) and no NKI kernel ran (a main() that calls one)")
    if kernel is not None:
        if kernel not in ran:
            raise ValueError(f"{path}: no NKI kernel {kernel!r} ran (kernels: {', '.join(sorted(ran))})")
        name = kernel
    else:

        def time_of(k):
            r = k.last_result
            return max(x.time_ns for x in r) if isinstance(r, list) else r.time_ns

        name = max(sorted(ran), key=lambda n: time_of(ran[n]))
        if len(ran) > 1:
            print(f"tracing NKI kernel {name} (also ran: {', '.join(n for n in sorted(ran) if n != name)}; --kernel)")
    res = ran[name].last_result
    return max(res, key=lambda r: r.time_ns) if isinstance(res, list) else res


def _run_script(path: str) -> dict:
    """Run a Python file as `python path` would (`__name__ == "__main__"`, its directory first on
    sys.path, sys.argv = [path]) and return its globals; a `sys.exit(0)` / `sys.exit()` ends it
    normally, another exit status raises SystemExit. A file defining `build(dev)` is only
    imported-like: its main block sees `__name__ == "trn3emu_trace"`."""
    import types

    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec")
    name = "trn3emu_trace" if b"def build(" in source else "__main__"
    mod = types.ModuleType(name)
    mod.__file__ = path
    g = mod.__dict__
    saved = sys.argv[:], sys.path[:], sys.modules.get(name)
    sys.argv[:] = [path]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    sys.modules[name] = mod  # (dataclasses, pickling and `import __main__` look the module up)
    try:
        exec(code, g)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    finally:
        sys.argv[:], sys.path[:] = saved[0], saved[1]
        if saved[2] is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved[2]
    return g


def _cmd_trace(args) -> int:
    if args.timing:  # NKI kernels the file runs make their own devices: they read the variable
        os.environ["TRN3EMU_TIMING"] = args.timing
    dev = Device(timing=args.timing)
    if args.program.endswith(".py"):
        got = _result_from_python(args.program, dev, args.kernel)
        result = got if not isinstance(got, list) else _run(dev, got, args)
    else:
        progs = [_load(args.program, args.sync)]
        _put_inputs(dev, args.input)
        result = _run(dev, progs, args)
    print(result.trace.summary())
    result.trace.to_perfetto(args.out)
    print(f"wrote {args.out} (Chrome Trace Event JSON; open in https://ui.perfetto.dev)")
    if args.png:
        result.trace.plot(args.png)
        print(f"wrote {args.png}")
    return 0


def _isa_page(name: str) -> str:
    from ._isa_pages import DTYPE_CLASSES, PAGES

    page = PAGES[name]
    used = []
    for line in page.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 7 and cells[6] in DTYPE_CLASSES and cells[6] not in used:
            used.append(cells[6])
    lines = [name, "=" * len(name), "", page]
    if used:
        lines += ["", "dtype classes:"] + [f"  {k}: {', '.join(DTYPE_CLASSES[k])}" for k in used]
    return "\n".join(lines) + "\n"


def _cmd_isa(args) -> int:
    if args.name:
        if args.name not in _asm.INSTRUCTIONS:
            near = difflib.get_close_matches(args.name, list(_asm.INSTRUCTIONS), n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else "; `trn3emu isa` lists them"
            print(f"trn3emu: no instruction {args.name!r}{hint}", file=sys.stderr)
            return 2
        sys.stdout.write(_isa_page(args.name))
        return 0
    for name, (code, engines, params) in _asm.INSTRUCTIONS.items():
        print(f"{code:#06x} {name:<28} {'/'.join(engines):<36} {', '.join(p[0] for p in params)}")
    return 0


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("trn3emu")
    except Exception:  # pragma: no cover - not installed as a distribution
        from . import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trn3emu", description="Trainium3 (NeuronCore-v4) emulator")
    ap.add_argument("--version", action="version", version=f"trn3emu {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run the demo kernel (tiled bf16 matmul + GELU) and print the trace summary")
    d.add_argument("--m", type=int, default=256)
    d.add_argument("--k", type=int, default=512)
    d.add_argument("--n", type=int, default=1024)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument(
        "--nki",
        metavar="NAME",
        help="run the packaged NKI example nki_NAME.py instead (e.g. tensor_add, matmul_bf16, flash_attention)",
    )
    d.set_defaults(fn=_cmd_demo)
    r = sub.add_parser("run", help="run a program (text or binary) on a fresh device")
    r.add_argument("program")
    r.add_argument("--input", action="append", default=[], metavar="ADDR[:DTYPE]=FILE.npy", help=_INPUT_HELP)
    r.add_argument(
        "--output", action="append", default=[], metavar="ADDR:SHAPE:DTYPE=FILE.npy", help="save HBM to .npy"
    )
    r.add_argument("--sync", choices=["manual", "auto"], default="auto", help=_SYNC_HELP)
    r.add_argument("--no-race-check", action="store_true")
    r.set_defaults(fn=_cmd_run)
    a = sub.add_parser("asm", help="assemble text into the binary encoding")
    a.add_argument("input")
    a.add_argument("-o", "--output", required=True)
    a.set_defaults(fn=_cmd_asm)
    s = sub.add_parser("disasm", help="print a binary program as text")
    s.add_argument("input")
    s.add_argument("-o", "--output")
    s.set_defaults(fn=_cmd_disasm)
    t = sub.add_parser("trace", help="run a program or kernel, print the timing summary, write a Perfetto trace")
    t.add_argument(
        "program",
        help="program text/binary, an NKI kernel file (its main() runs the kernel), or a .py file defining build(dev)",
    )
    t.add_argument("--kernel", help="the NKI kernel to trace when the file runs several (default: the longest run)")
    t.add_argument(
        "--out",
        default="trace.json",
        help="Chrome Trace Event JSON output, gzip if it ends in .gz (default trace.json)",
    )
    t.add_argument("--png", help="also render a timeline PNG (needs matplotlib: trn3emu[plot])")
    t.add_argument(
        "--timing",
        choices=["trn1", "trn2", "trn3"],
        help="time with this generation's published constants (default: TRN3EMU_TIMING, else trn3)",
    )
    t.add_argument("--input", action="append", default=[], metavar="ADDR[:DTYPE]=FILE.npy", help=_INPUT_HELP)
    t.add_argument("--sync", choices=["manual", "auto"], default="auto", help=_SYNC_HELP)
    t.add_argument("--no-race-check", action="store_true")
    t.set_defaults(fn=_cmd_trace)
    i = sub.add_parser("isa", help="list the instruction set, or print one instruction's page")
    i.add_argument("name", nargs="?", help="an instruction: print its operands, dtypes, defaults and rules")
    i.set_defaults(fn=_cmd_isa)
    args = ap.parse_args(argv)
    if sys.stdout is None:  # started with stdout closed (`>&-`): writing to it is an error, said once
        sys.stdout = _ClosedStdout()
    try:
        code = args.fn(args)
        sys.stdout.flush()  # a closed pipe surfaces here, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader went away (`trn3emu isa | head -1`): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except EmuError as e:
        print(f"trn3emu: {type(e).__name__}: {e}", file=sys.stderr)
        if isinstance(e, RaceError) and getattr(args, "sync", None) == "manual":
            print(
                "trn3emu: hint: --sync auto (the default) adds the semaphores the data dependencies need",
                file=sys.stderr,
            )
        if (
            isinstance(e, SemaphoreError)
            and e.rule == "autosync_reserved_semaphore"
            and getattr(args, "sync", None) == "auto"
        ):
            print(
                "trn3emu: hint: the program already carries its semaphores (text saved by to_text(synced=True)?): "
                "run it with --sync manual",
                file=sys.stderr,
            )
        return 2
    except MemoryError as e:
        print(f"trn3emu: out of host memory: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"trn3emu: {e}", file=sys.stderr)
        return 2


class _ClosedStdout:
    """sys.stdout when the process started without one: a write fails with EBADF (reported as
    an error, exit 2); commands that print nothing still work."""

    def write(self, s: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")

    def flush(self) -> None:
        pass


if __name__ == "__main__":
    sys.exit(main())
