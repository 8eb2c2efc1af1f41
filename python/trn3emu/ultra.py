"""A Trainium3 UltraServer: up to 144 chips, each a full `Device`, joined all-to-all by the
NeuronSwitch-v1 fabric (docs/ultraserver.md).

    import trn3emu as t3
    us = t3.UltraServer(chips=4)
    x = [us.chip(c).hbm.put(a[c]) for c in range(4)]
    out = [us.chip(c).hbm.alloc(a[c].shape, a[c].dtype) for c in range(4)]
    progs = [t3.Program(chip=c, core=0) for c in range(4)]
    group = [p.global_core for p in progs]          # chip * 8 + core, in rank order
    for p in progs:
        p.all_reduce(dst=out[p.chip], src=x[p.chip], cores=group)
    result = us.run(progs)
"""

from __future__ import annotations

import gzip
import inspect
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import _native
from .device import Device, _nonnegative, _program_list, _seconds
from .errors import ArgumentTypeError, OperandError
from .program import Program
from .tensor import _index
from .trace import RunResult

#: Chips of the largest UltraServer (core::hw).
MAX_CHIPS: int = _native.MAX_CHIPS
#: The fabric model's default numbers (docs/ultraserver.md: sources and guesses).
FABRIC_PARAMS: dict[str, Any] = dict(_native.fabric_params())


class UltraResult:
    """What `UltraServer.run` returns: the run's estimated time, one `RunResult` per chip (with
    that chip's trace) and the fabric's activity: `messages` (one row per chip-to-chip or
    on-chip message of a collective: from/to chip, bytes, send/arrive times in ps) and `cc`
    (one row per rank's part of a collective on a CC-core), both dicts of numpy columns."""

    def __init__(self, raw: dict, by_chip: list[list]) -> None:
        self.time_ns = raw["end_ps"] / 1000.0
        self.executed = int(raw["executed"])
        self.chips = [RunResult(r, progs) for r, progs in zip(raw["chips"], by_chip, strict=True)]
        self.messages: dict[str, np.ndarray] = dict(raw["messages"])
        self.cc: dict[str, np.ndarray] = dict(raw["cc"])
        self.params: dict[str, Any] = dict(raw["params"])

    def __repr__(self) -> str:
        return f"<UltraResult {len(self.chips)} chips, {self.executed} executed, {self.time_ns:,.1f} ns estimated>"

    def summary(self, top: int = 3) -> str:
        """The whole run at a glance: time, the fabric's traffic (messages, bytes between chips,
        the busiest link), one line per chip that ran (its time, busiest unit, DMA rate, tensor
        TFLOPS), then the full `Trace.summary(top)` of the slowest chip."""
        ran = [(c, r) for c, r in enumerate(self.chips) if r.executed]
        lines = [
            f"UltraServer run: {len(self.chips)} chips ({len(ran)} ran programs), {self.executed:,} executed, "
            f"estimated time {self.time_ns:,.1f} ns"
        ]
        m = self.messages
        if len(m.get("bytes", ())):
            off = m["from_chip"] != m["to_chip"]
            between = int(m["bytes"][off].sum())
            text = f"fabric: {len(m['bytes'])} messages, {between:,} bytes between chips, {int(m['bytes'][~off].sum()):,} on chip"
            if off.any():
                pairs: dict = {}
                for a, b, n in zip(m["from_chip"][off].tolist(), m["to_chip"][off].tolist(), m["bytes"][off].tolist()):
                    pairs[(a, b)] = pairs.get((a, b), 0) + int(n)
                (a, b), n = max(pairs.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))
                text += f"; busiest link chip {a} -> chip {b}: {n:,} bytes"
            lines.append(text)
        lines.append(f"{'chip':>4} {'time ns':>14} {'busiest unit':<26} {'DMA GB/s':>9} {'TFLOPS':>7}")
        for c, r in ran:
            st = r.trace.stats()
            busiest = max(st["units"], key=lambda u: u["utilisation"], default=None)
            b = f"core {busiest['core']} {busiest['unit']} {busiest['utilisation']:.0%}" if busiest else "-"
            dma = sum(st["dma_gbps_per_core"].values())
            tfl = sum(u["tflops"] for u in st["units"] if u["unit"] == "tensor")
            lines.append(f"{c:>4} {r.time_ns:>14,.1f} {b:<26} {dma:>9.1f} {tfl:>7.2f}")
        if ran:
            c, r = max(ran, key=lambda cr: (cr[1].time_ns, -cr[0]))
            lines.append(f"slowest chip {c}:")
            lines.extend("  " + x for x in r.trace.summary(top).splitlines())
        return "\n".join(lines)

    def plot(self, path, chips=None, **kwargs) -> list[str]:
        """A timeline PNG of the chips that ran (or those in `chips`), one row per chip, core and
        unit ("chip c core k tensor"), on one time axis; keywords as `Trace.plot` (`by="line"`,
        `top`, `start_ns`, `end_ns`, `width`). Returns the row labels."""
        from .trace import Trace

        want = set(range(len(self.chips))) if chips is None else {int(c) for c in chips}
        parts = [(c, r.trace) for c, r in enumerate(self.chips) if r.executed and c in want]
        if not parts:
            raise ValueError("no chip of this run executed instructions to plot")
        return Trace._combined(parts).plot(path, **kwargs)

    def to_perfetto(self, path) -> Path:
        """Chrome Trace Event JSON for ui.perfetto.dev (`.gz` compresses): one process per
        (chip, core) with its engine and DMA tracks, and one "chip c fabric" process per chip with
        a track per CC-core and its link ports (egress, ingress). Returns the path written."""
        events: list[dict] = []
        with tempfile.TemporaryDirectory() as tmp:
            for c, r in enumerate(self.chips):
                if not r.executed:
                    continue
                f = Path(tmp) / f"chip{c}.json"
                r.trace.to_perfetto(f)
                for e in json.loads(f.read_text())["traceEvents"]:
                    if "pid" in e:
                        e["pid"] = c * 16 + e["pid"]
                    if e.get("ph") == "M" and e.get("name") == "process_name":
                        e["args"]["name"] = f"chip {c} {e['args']['name']}"
                    if e.get("ph") == "M" and e.get("name") == "process_sort_index":
                        e["args"]["sort_index"] = e["pid"]
                    events.append(e)
        events.extend(self._fabric_events())
        text = json.dumps({"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"generator": "trn3emu"}})
        path = Path(path)
        if path.suffix == ".gz":
            with gzip.open(path, "wt", compresslevel=6) as fh:
                fh.write(text)
        else:
            path.write_text(text)
        return path

    def _fabric_events(self) -> list[dict]:
        out: list[dict] = []
        named: set[tuple[int, int]] = set()
        opname = dict(_native.isa_opcodes())

        def track(chip: int, tid: int, name: str) -> int:
            pid = chip * 16 + 8
            if (chip, -1) not in named:
                named.add((chip, -1))
                out.append(
                    {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"chip {chip} fabric"}}
                )
                out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
            if (chip, tid) not in named:
                named.add((chip, tid))
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
                out.append(
                    {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
                )
            return pid

        cc = self.cc
        for chip, k, core, op, s, e, g in zip(
            *(cc[n].tolist() for n in ("chip", "cc", "core", "opcode", "start_ps", "end_ps", "group"))
        ):
            pid = track(chip, k, f"cc-core {k}")
            name = opname.get(op, str(op))
            out.append(
                {
                    "ph": "X",
                    "name": str(name),
                    "cat": "collective",
                    "pid": pid,
                    "tid": k,
                    "ts": s / 1e6,
                    "dur": (e - s) / 1e6,
                    "args": {"core": core, "group": g},
                }
            )
        m = self.messages
        cols = ("from_chip", "to_chip", "bytes", "send_ps", "sent_ps", "recv_start_ps", "arrive_ps", "group")
        for a, b, n, s0, s1, r0, r1, g in zip(*(m[c].tolist() for c in cols)):
            if a == b:
                continue
            pid = track(a, 100, "link egress")
            out.append(
                {
                    "ph": "X",
                    "name": f"to chip {b}",
                    "cat": "link",
                    "pid": pid,
                    "tid": 100,
                    "ts": s0 / 1e6,
                    "dur": (s1 - s0) / 1e6,
                    "args": {"bytes": n, "group": g},
                }
            )
            pid = track(b, 101, "link ingress")
            out.append(
                {
                    "ph": "X",
                    "name": f"from chip {a}",
                    "cat": "link",
                    "pid": pid,
                    "tid": 101,
                    "ts": r0 / 1e6,
                    "dur": (r1 - r0) / 1e6,
                    "args": {"bytes": n, "group": g},
                }
            )
        return out


def _check_device_options(options: dict) -> None:
    """Keyword arguments an UltraServer passes to each chip's `Device` are its numerics options."""
    known = [n for n in inspect.signature(Device.__init__).parameters if n != "self"]
    for name in options:
        if name not in known:
            raise OperandError(
                f"UltraServer has no option {name!r} (fabric: latency_ns, link_bytes_per_ns, mesh_max_bytes; "
                f"each chip's Device: {', '.join(known)})",
                operand=name,
                rule="unknown_numerics_option",
            )


class UltraServer:
    """`chips` Trainium3 devices (1..144) on one NeuronSwitch-v1 fabric. `chip(c)` is chip c's
    `Device` (its `hbm` puts, allocates and gets that chip's tensors); programs are placed with
    `Program(chip=c, core=k)`; a collective's replica group lists global core ids
    `chip * 8 + core` (`Program.global_core`). Numerics options as `Device`; `latency_ns`,
    `link_bytes_per_ns` and `mesh_max_bytes` override the fabric model's numbers
    (`FABRIC_PARAMS`)."""

    def __init__(
        self,
        chips: int = 1,
        *,
        latency_ns: float | None = None,
        link_bytes_per_ns: float | None = None,
        mesh_max_bytes: int | None = None,
        **numerics: Any,
    ) -> None:
        if isinstance(chips, bool) or not isinstance(chips, (int, np.integer)):
            raise ArgumentTypeError(f"chips must be an int, got {chips!r}", operand="chips", rule="ultraserver_chips")
        if not 1 <= int(chips) <= MAX_CHIPS:
            raise OperandError(
                f"an UltraServer has 1..{MAX_CHIPS} chips, not {chips}", operand="chips", rule="ultraserver_chips"
            )
        for name, v in (("latency_ns", latency_ns), ("link_bytes_per_ns", link_bytes_per_ns)):
            if v is not None and not (isinstance(v, (int, float, np.number)) and math.isfinite(v) and v > 0):
                raise OperandError(
                    f"{name} must be a positive finite number, not {v!r}", operand=name, rule="fabric_param_invalid"
                )
        if mesh_max_bytes is not None:
            mesh_max_bytes = _nonnegative(mesh_max_bytes, "mesh_max_bytes")
        _check_device_options(numerics)
        self.chips = [Device(**numerics) for _ in range(int(chips))]
        self._fabric = {
            "latency_ns": latency_ns,
            "link_bytes_per_ns": link_bytes_per_ns,
            "mesh_max_bytes": mesh_max_bytes,
        }

    def __len__(self) -> int:
        return len(self.chips)

    def chip(self, c: int) -> Device:
        """Chip `c`'s `Device`."""
        c = _index(c, "chip")
        if not 0 <= c < len(self.chips):
            raise OperandError(
                f"chip {c} is not a chip of this UltraServer (0..{len(self.chips)})",
                operand="chip",
                rule="chip_out_of_range",
            )
        return self.chips[int(c)]

    def programs(self, chips=None, cores=None, sync: str = "auto") -> list[Program]:
        """One empty Program per (chip, core): every listed chip (default all) times every listed
        core (default all 8), in global-core order."""
        chips = range(len(self.chips)) if chips is None else chips
        cores = range(Device.NUM_CORES) if cores is None else cores
        return [Program(chip=int(c), core=int(k), sync=sync) for c in chips for k in cores]

    def run(
        self,
        programs: Program | list[Program],
        check_races: bool = True,
        trace: bool = True,
        trace_limit: int | None = None,
        max_seconds: float | None = None,
        max_memory: int | None = None,
    ) -> UltraResult:
        """Run the programs (each on its `chip` and `core`) concurrently; releases the GIL. Errors
        name the chip; a collective some rank never reaches raises `DeadlockError` naming the
        waiting and the missing ranks.

        Limits as `Device.run` (docs/limits.md): Ctrl-C stops the run within a few tens of ms
        (`KeyboardInterrupt`; the chips stay usable); `max_seconds` (default None: no limit) stops
        it with `RunawayError` (`run_time_limit`); `max_memory` bounds the host memory each chip's
        part of the run adds (`ResourceError`, `run_memory_limit`); each chip's `max_executed`
        bounds its steps."""
        progs = [programs] if isinstance(programs, Program) else _program_list(programs)
        by_chip: list[list] = [[] for _ in self.chips]
        pairs = []
        for p in progs:
            chip = int(getattr(p, "chip", 0))
            if not 0 <= chip < len(self.chips):
                raise OperandError(
                    f"program for chip {chip} (this UltraServer's chips are 0..{len(self.chips)})",
                    operand="chip",
                    rule="chip_out_of_range",
                )
            if isinstance(p, Program):
                p._check_chip(self.chips)
            n = p.native()
            by_chip[chip].append(n)
            pairs.append((chip, n))
        limit: dict[str, Any] = {} if trace_limit is None else {"trace_limit": trace_limit}
        if max_seconds is not None:
            limit["max_seconds"] = _seconds(max_seconds)
        if max_memory is not None:
            limit["max_memory"] = _nonnegative(max_memory, "max_memory")
        fabric = {k: v for k, v in self._fabric.items() if v is not None}
        raw = _native.ultra_run([d._native for d in self.chips], pairs, check_races, trace, **limit, **fabric)
        return UltraResult(raw, by_chip)
