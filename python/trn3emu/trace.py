"""Run results and traces: one record per executed instruction and DMA transfer, as columns."""

from __future__ import annotations

import numpy as np

from ._asm import INSTRUCTIONS

UNITS = (
    "tensor",
    "vector",
    "scalar",
    "gpsimd",
    "sync",
    "dma.tensor",
    "dma.vector",
    "dma.scalar",
    "dma.gpsimd",
    "dma.sync",
)
_OPNAME = {code: name for name, (code, _e, _p) in INSTRUCTIONS.items()}


class Trace:
    """Columnar trace. `trace.columns` maps names to numpy arrays of equal length:
    core, unit (index into `UNITS`), index (instruction index in its core's program), opcode,
    start_ns, end_ns, bytes, flops."""

    def __init__(self, cols: dict, programs: list) -> None:
        self.columns = {
            "core": cols["core"],
            "unit": cols["unit"],
            "index": cols["index"],
            "opcode": cols["opcode"],
            "start_ns": cols["start_ps"] / 1000.0,
            "end_ns": cols["end_ps"] / 1000.0,
            "bytes": cols["bytes"],
            "flops": cols["flops"],
        }
        self._programs = {p.core: p for p in programs}

    def __len__(self) -> int:
        return len(self.columns["core"])

    def __getitem__(self, i: int) -> dict:
        """Record `i` as a dict, with the unit and opcode names and the instruction text."""
        c = self.columns
        core, idx = int(c["core"][i]), int(c["index"][i])
        prog = self._programs.get(core)
        return {
            "core": core,
            "unit": UNITS[int(c["unit"][i])],
            "index": idx,
            "opcode": _OPNAME.get(int(c["opcode"][i]), "?"),
            "start_ns": float(c["start_ns"][i]),
            "end_ns": float(c["end_ns"][i]),
            "bytes": int(c["bytes"][i]),
            "flops": int(c["flops"][i]),
            "text": prog.instruction_text(idx) if prog is not None else "",
        }

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def total_ns(self) -> float:
        return float(self.columns["end_ns"].max()) if len(self) else 0.0

    def summary(self) -> str:
        """Per core and unit: records, busy time, utilisation of the run, bytes, GFLOP."""
        total = self.total_ns
        c = self.columns
        lines = [
            f"estimated time {total:,.1f} ns, {len(self)} records",
            f"{'core':>4} {'unit':<11} {'n':>6} {'busy ns':>12} {'util':>6} {'bytes':>12} {'GFLOP':>8}",
        ]
        for core in np.unique(c["core"]):
            for u in range(len(UNITS)):
                m = (c["core"] == core) & (c["unit"] == u)
                if not m.any():
                    continue
                busy = float((c["end_ns"][m] - c["start_ns"][m]).sum())
                util = busy / total if total else 0.0
                lines.append(
                    f"{int(core):>4} {UNITS[u]:<11} {int(m.sum()):>6} {busy:>12,.1f} {util:>6.1%} "
                    f"{int(c['bytes'][m].sum()):>12,} {c['flops'][m].sum() / 1e9:>8.3f}"
                )
        return "\n".join(lines)


class RunResult:
    """What `Device.run` returns: the trace, the estimated device time and the count executed."""

    def __init__(self, raw: dict, programs: list) -> None:
        self.time_ns = raw["end_ps"] / 1000.0
        self.executed = int(raw["executed"])
        self.trace = Trace(raw["trace"], programs)

    def __repr__(self) -> str:
        return f"<RunResult {self.executed} executed, {self.time_ns:,.1f} ns estimated>"
