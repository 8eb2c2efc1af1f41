"""The `trn3emu` command: demo, run, trace, asm, disasm, isa."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from . import _asm
from .device import Device
from .dtypes import numpy_dtype
from .errors import EmuError
from .program import Program

MAGIC = b"T3EP"


def _load(path: str, sync: str) -> Program:
    data = Path(path).read_bytes()
    if data[:4] == MAGIC:
        return Program.decode(data, sync=sync)
    return Program.from_text(data.decode(), sync=sync)


def _cmd_demo(args) -> int:
    if args.nki:
        return _nki_example(args.nki)
    from .demo import main

    return main(args.m, args.k, args.n, args.seed)


def _nki_example(name: str) -> int:
    """Run examples/nki_<name>.py (or a path) with `nki` provided by trn3emu."""
    import runpy

    from .nki import install

    path = Path(name)
    if not path.exists():
        # The source checkout's examples/: beside the package (editable install) or in the
        # current directory (an installed wheel run from the checkout).
        roots = [Path(__file__).resolve().parents[2] / "examples", Path.cwd() / "examples"]
        root = next((r for r in roots if (r / f"nki_{name}.py").exists()), roots[-1])
        path = root / f"nki_{name}.py"
        if not path.exists():
            found = sorted(p.stem[4:] for p in root.glob("nki_*.py")) if root.exists() else []
            raise EmuError(
                f"no NKI example {name!r}"
                + (f" (examples: {', '.join(found)})" if found else " (examples/ ships with the source checkout)"),
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


def _cmd_run(args) -> int:
    p = _load(args.program, args.sync)
    dev = Device()
    for spec in args.input:
        addr, _, path = spec.partition("=")
        arr = np.load(path)
        dev.hbm.put(arr, address=int(addr, 0))
    result = dev.run(p, check_races=not args.no_race_check)
    for spec in args.output:
        where, _, path = spec.partition("=")
        addr, shape, dtype = where.split(":")
        dims = tuple(int(s) for s in shape.split("x"))
        t = dev.hbm.alloc(dims, dtype, address=int(addr, 0))
        arr = dev.hbm.get(t)
        np.save(path, arr)
        print(f"wrote {path}: {dims} {numpy_dtype(dtype)}")
    print(result.trace.summary())
    return 0


def _programs_from_python(path: str, dev: Device) -> list[Program]:
    """A Python file with `build(dev)` returning a Program or a list of them (one per core)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: cannot load as a Python module")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    build = getattr(mod, "build", None)
    if build is None:
        raise ValueError(f"{path}: defines no build(dev) returning the program(s) to trace")
    progs = build(dev)
    return [progs] if isinstance(progs, Program) else list(progs)


def _cmd_trace(args) -> int:
    dev = Device()
    if args.program.endswith(".py"):
        progs = _programs_from_python(args.program, dev)
    else:
        progs = [_load(args.program, args.sync)]
        for spec in args.input:
            addr, _, path = spec.partition("=")
            dev.hbm.put(np.load(path), address=int(addr, 0))
    result = dev.run(progs, check_races=not args.no_race_check)
    print(result.trace.summary())
    result.trace.to_perfetto(args.out)
    print(f"wrote {args.out} (Chrome Trace Event JSON; open in https://ui.perfetto.dev)")
    if args.png:
        result.trace.plot(args.png)
        print(f"wrote {args.png}")
    return 0


def _cmd_isa(args) -> int:
    for name, (code, engines, params) in _asm.INSTRUCTIONS.items():
        if args.name and name != args.name:
            continue
        print(f"{code:#06x} {name:<28} {'/'.join(engines):<36} {', '.join(p[0] for p in params)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trn3emu", description="Trainium3 (NeuronCore-v4) emulator")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run the demo kernel (tiled bf16 matmul + GELU) and print the trace summary")
    d.add_argument("--m", type=int, default=256)
    d.add_argument("--k", type=int, default=512)
    d.add_argument("--n", type=int, default=1024)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument(
        "--nki",
        metavar="NAME",
        help="run the NKI example kernel examples/nki_NAME.py instead (e.g. tensor_add, matmul_bf16, lnc2)",
    )
    d.set_defaults(fn=_cmd_demo)
    r = sub.add_parser("run", help="run a program (text or binary) on a fresh device")
    r.add_argument("program")
    r.add_argument("--input", action="append", default=[], metavar="ADDR=FILE.npy", help="load an array into HBM")
    r.add_argument(
        "--output", action="append", default=[], metavar="ADDR:SHAPE:DTYPE=FILE.npy", help="save HBM to .npy"
    )
    r.add_argument("--sync", choices=["manual", "auto"], default="manual", help="add semaphores automatically")
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
    t.add_argument("program", help="program text/binary, or a .py file defining build(dev) -> Program(s)")
    t.add_argument("--out", default="trace.json", help="Chrome Trace Event JSON output (default trace.json)")
    t.add_argument("--png", help="also render a timeline PNG (needs matplotlib: trn3emu[plot])")
    t.add_argument("--input", action="append", default=[], metavar="ADDR=FILE.npy", help="load an array into HBM")
    t.add_argument("--sync", choices=["manual", "auto"], default="manual", help="add semaphores automatically")
    t.add_argument("--no-race-check", action="store_true")
    t.set_defaults(fn=_cmd_trace)
    i = sub.add_parser("isa", help="list the instruction set")
    i.add_argument("name", nargs="?")
    i.set_defaults(fn=_cmd_isa)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except EmuError as e:
        print(f"trn3emu: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"trn3emu: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
