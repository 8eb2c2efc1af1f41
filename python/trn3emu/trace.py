"""Run results and traces: where the estimated time goes.

A `Trace` holds one record per executed instruction (on an engine stream) and per DMA transfer
(on a DMA queue), and one event per semaphore signal and wait, all with times from the cost
model (docs/cost-model.md). Views are numpy structured arrays under schema `SCHEMA_VERSION`:

`trace.instructions` (one row per instruction on an engine stream; a DMA instruction's row is its
trigger): core, engine, index (in its core's program), opcode, start_ns, end_ns, bytes (read plus
written), flops, name (the instruction's `name=` label: the kernel source line), operands (text).

`trace.dma` (one row per transfer): core, queue (the issuing engine's queue), index, opcode,
priority, start_ns (engines granted), end_ns (last byte landed), bytes (payload), hbm_bytes
(read plus written in HBM), dma_engines (engines the transfer was split over), name, operands.

`trace.dma_engines` (one row per DMA engine's share of a transfer): core, engine (0..15), queue,
index, start_ns, end_ns, bytes.

`trace.semaphores` (one row per signal or wait): core, sem, kind ('signal' | 'wait'), value
(delta or threshold), time_ns (increment visible / waiter starts), unit, index (the instruction),
by_unit, by_index (waits: the instruction whose signal satisfied it; '' / -1 when none needed).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from . import _native
from ._asm import INSTRUCTION_FLAGS, INSTRUCTIONS

SCHEMA_VERSION = 1
#: The instruction streams of a core, in trace unit order (from the Rust core).
ENGINES: tuple[str, ...] = tuple(_native.STREAMS)
#: Trace units: the streams, then one DMA queue per stream (unit `_NS + k` is stream k's queue).
UNITS = ENGINES + tuple(f"dma.{e}" for e in ENGINES)
_NS = len(ENGINES)
_OPNAME = {code: name for name, (code, _e, _p) in INSTRUCTIONS.items()}
#: Opcodes counted as sparse matmuls in the summary (their flops are dense-equivalent).
_SPARSE_OPS = frozenset(
    code for name, (code, _e, _p) in INSTRUCTIONS.items() if INSTRUCTION_FLAGS[name][0] == "pe_matmul_sparse"
)
COST = _native.cost_params()
"""The default (trn3) cost model's numbers (clocks, peaks, DMA machinery), from the Rust core;
`Trace.cost` holds those of the generation that timed a trace."""
_COSTS: dict[str, dict] = {"trn3": COST}


def cost_params(timing: str) -> dict:
    """The cost model's numbers of generation `timing` (cached)."""
    if timing not in _COSTS:
        _COSTS[timing] = _native.cost_params(timing)
    return _COSTS[timing]


_INSTR_DTYPE = [
    ("core", "u1"),
    ("engine", "U6"),
    ("index", "u4"),
    ("opcode", "U32"),
    ("start_ns", "f8"),
    ("end_ns", "f8"),
    ("bytes", "u8"),
    ("flops", "u8"),
    ("name", "O"),
    ("operands", "O"),
]
_DMA_DTYPE = [
    ("core", "u1"),
    ("queue", "U6"),
    ("index", "u4"),
    ("opcode", "U32"),
    ("priority", "u1"),
    ("start_ns", "f8"),
    ("end_ns", "f8"),
    ("bytes", "u8"),
    ("hbm_bytes", "u8"),
    ("dma_engines", "u1"),
    ("name", "O"),
    ("operands", "O"),
]
_SEM_DTYPE = [
    ("core", "u1"),
    ("sem", "u2"),
    ("kind", "U6"),
    ("value", "u4"),
    ("time_ns", "f8"),
    ("unit", "U10"),
    ("index", "u4"),
    ("by_unit", "U10"),
    ("by_index", "i8"),
]
_SPAN_DTYPE = [
    ("core", "u1"),
    ("engine", "u1"),
    ("queue", "U6"),
    ("index", "u4"),
    ("start_ns", "f8"),
    ("end_ns", "f8"),
    ("bytes", "u8"),
]
SCHEMA = {
    "version": SCHEMA_VERSION,
    "instructions": _INSTR_DTYPE,
    "dma": _DMA_DTYPE,
    "dma_engines": _SPAN_DTYPE,
    "semaphores": _SEM_DTYPE,
}

# SBUF/PSUM occupancy counters track written bytes in 64-byte granules.
_GRANULE = 64
_MEM_BYTES = {0: _native.SBUF_PARTITION_BYTES, 1: _native.PSUM_PARTITION_BYTES}
_MEM_NAME = {0: "SBUF", 1: "PSUM"}


class Trace:
    """Columnar trace of one run. `trace.columns` holds the raw per-record arrays (instructions
    and transfers together): core, unit (index into `UNITS`), index, opcode, start_ns, end_ns,
    bytes, flops, hbm_bytes, priority, dma_engines."""

    def __init__(self, cols: dict, programs: list) -> None:
        self.schema_version = int(cols.get("schema_version", SCHEMA_VERSION))
        #: The generation whose published constants timed the run ("trn1", "trn2", "trn3").
        self.timing = str(cols.get("timing", "trn3"))
        #: That generation's cost-model numbers (`_native.cost_params`).
        self.cost = cost_params(self.timing) if self.timing in ("trn1", "trn2", "trn3") else COST
        self.columns = {
            "core": cols["core"],
            "unit": cols["unit"],
            "index": cols["index"],
            "opcode": cols["opcode"],
            "start_ns": cols["start_ps"] / 1000.0,
            "end_ns": cols["end_ps"] / 1000.0,
            "bytes": cols["bytes"],
            "flops": cols["flops"],
            "hbm_bytes": cols.get("hbm_bytes", np.zeros_like(cols["bytes"])),
            "priority": cols.get("priority", np.zeros_like(cols["core"])),
            "dma_engines": cols.get("dma_engines", np.zeros_like(cols["core"])),
        }
        self._write = {k: cols[k] for k in ("w_mem", "w_p0", "w_p1", "w_lo", "w_hi") if k in cols}
        s = cols.get("sems") or {}
        self._sems = {
            "core": s.get("core", np.zeros(0, np.uint8)),
            "sem": s.get("sem", np.zeros(0, np.uint16)),
            "wait": s.get("wait", np.zeros(0, bool)),
            "value": s.get("value", np.zeros(0, np.uint32)),
            "time_ns": s.get("time_ps", np.zeros(0, np.uint64)) / 1000.0,
            "record": s.get("record", np.zeros(0, np.uint32)),
            "by": s.get("by", np.zeros(0, np.int64)),
        }
        sp = cols.get("dma_spans") or {}
        self._spans = {
            "core": sp.get("core", np.zeros(0, np.uint8)),
            "engine": sp.get("engine", np.zeros(0, np.uint8)),
            "start_ns": sp.get("start_ps", np.zeros(0, np.uint64)) / 1000.0,
            "end_ns": sp.get("end_ps", np.zeros(0, np.uint64)) / 1000.0,
            "bytes": sp.get("bytes", np.zeros(0, np.uint64)),
            "record": sp.get("record", np.zeros(0, np.uint32)),
        }
        self._programs = {p.core: p for p in programs}
        self._names: dict[int, list] = {}
        self._cache: dict[str, np.ndarray] = {}

    @classmethod
    def _combined(cls, parts: list) -> Trace:
        """One trace of several chips' traces `[(chip, Trace)]`, for plotting them together:
        core k of chip c becomes core 8c + k, labelled "chip c core k" (semaphore events and
        write regions are left out)."""
        first = parts[0][1]
        t = cls.__new__(cls)
        t.schema_version, t.timing, t.cost = first.schema_version, first.timing, first.cost
        per_chip = 8

        def cat(get, key):
            arrays = [
                get(tr)[key].astype(np.int64) + per_chip * c if key == "core" else get(tr)[key] for c, tr in parts
            ]
            return np.concatenate(arrays) if arrays else np.zeros(0)

        t.columns = {k: cat(lambda tr: tr.columns, k) for k in first.columns}
        t._write = {}
        t._sems = {k: v[:0] for k, v in first._sems.items()}
        t._spans = {k: cat(lambda tr: tr._spans, k) for k in first._spans}
        t._programs = {per_chip * c + k: prog for c, tr in parts for k, prog in tr._programs.items()}
        t._names, t._cache = {}, {}
        t._core_names = {per_chip * c + k: f"chip {c} core {k}" for c, tr in parts for k in range(per_chip)}
        return t

    def _core_label(self, core: int) -> str:
        names = getattr(self, "_core_names", None)
        return names.get(core, f"core {core}") if names else f"core {core}"

    # ------------------------------------------------------------------------------ records
    def __len__(self) -> int:
        return len(self.columns["core"])

    def _text(self, core: int, idx: int) -> str:
        prog = self._programs.get(core)
        return (prog.instruction_text(idx) or "") if prog is not None else ""

    def _name(self, core: int, idx: int):
        if core not in self._names:
            prog = self._programs.get(core)
            self._names[core] = prog.instruction_names() if prog is not None else []
        names = self._names[core]
        return names[idx] if idx < len(names) else None

    def __getitem__(self, i: int) -> dict:
        """Record `i` as a dict, with the unit and opcode names and the instruction text."""
        c = self.columns
        core, idx = int(c["core"][i]), int(c["index"][i])
        return {
            "core": core,
            "unit": UNITS[int(c["unit"][i])],
            "index": idx,
            "opcode": _OPNAME.get(int(c["opcode"][i]), "?"),
            "start_ns": float(c["start_ns"][i]),
            "end_ns": float(c["end_ns"][i]),
            "bytes": int(c["bytes"][i]),
            "flops": int(c["flops"][i]),
            "name": self._name(core, idx),
            "text": self._text(core, idx),
        }

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def total_ns(self) -> float:
        """Estimated kernel time: the end of the last instruction or transfer."""
        return float(self.columns["end_ns"].max()) if len(self) else 0.0

    def _operands(self, core: int, idx: int) -> str:
        text = self._text(core, idx)
        return text.split(None, 1)[1] if " " in text else ""

    def _view(self, dma: bool) -> np.ndarray:
        key = "dma" if dma else "instructions"
        if key in self._cache:
            return self._cache[key]
        c = self.columns
        m = c["unit"] >= _NS if dma else c["unit"] < _NS
        rows = np.flatnonzero(m)
        out = np.zeros(len(rows), dtype=_DMA_DTYPE if dma else _INSTR_DTYPE)
        out["core"] = c["core"][rows]
        out["queue" if dma else "engine"] = [ENGINES[int(u) % _NS] for u in c["unit"][rows]]
        out["index"] = c["index"][rows]
        out["opcode"] = [_OPNAME.get(int(o), "?") for o in c["opcode"][rows]]
        out["start_ns"] = c["start_ns"][rows]
        out["end_ns"] = c["end_ns"][rows]
        out["bytes"] = c["bytes"][rows]
        if dma:
            out["priority"] = c["priority"][rows]
            out["hbm_bytes"] = c["hbm_bytes"][rows]
            out["dma_engines"] = c["dma_engines"][rows]
        else:
            out["flops"] = c["flops"][rows]
        out["name"] = [self._name(int(k), int(i)) for k, i in zip(c["core"][rows], c["index"][rows])]
        out["operands"] = [self._operands(int(k), int(i)) for k, i in zip(c["core"][rows], c["index"][rows])]
        self._cache[key] = out
        return out

    @property
    def instructions(self) -> np.ndarray:
        """One row per instruction on an engine stream (structured array; see the module doc)."""
        return self._view(False)

    @property
    def dma(self) -> np.ndarray:
        """One row per DMA transfer (structured array; see the module doc)."""
        return self._view(True)

    @property
    def dma_engines(self) -> np.ndarray:
        """One row per DMA engine's share of a transfer (structured array; see the module doc)."""
        sp, c = self._spans, self.columns
        out = np.zeros(len(sp["core"]), dtype=_SPAN_DTYPE)
        rec = sp["record"].astype(np.int64)
        out["core"] = sp["core"]
        out["engine"] = sp["engine"]
        out["queue"] = [ENGINES[int(u) % _NS] for u in c["unit"][rec]] if len(rec) else []
        out["index"] = c["index"][rec] if len(rec) else []
        out["start_ns"] = sp["start_ns"]
        out["end_ns"] = sp["end_ns"]
        out["bytes"] = sp["bytes"]
        return out

    @property
    def semaphores(self) -> np.ndarray:
        """One row per semaphore signal or wait (structured array; see the module doc)."""
        if "semaphores" in self._cache:
            return self._cache["semaphores"]
        s, c = self._sems, self.columns
        out = np.zeros(len(s["core"]), dtype=_SEM_DTYPE)
        out["core"] = s["core"]
        out["sem"] = s["sem"]
        out["kind"] = np.where(s["wait"], "wait", "signal")
        out["value"] = s["value"]
        out["time_ns"] = s["time_ns"]
        rec = s["record"].astype(np.int64)
        out["unit"] = [UNITS[int(u)] for u in c["unit"][rec]] if len(rec) else []
        out["index"] = c["index"][rec] if len(rec) else []
        by = s["by"]
        out["by_unit"] = [UNITS[int(c["unit"][b])] if b >= 0 else "" for b in by]
        out["by_index"] = [int(c["index"][b]) if b >= 0 else -1 for b in by]
        self._cache["semaphores"] = out
        return out

    # ------------------------------------------------------------------------------ analysis
    def critical_path(self) -> list[int]:
        """Record indices (into `columns`) of the chain that ends last, first to last: each step
        goes to what released the record — the signal that satisfied its wait, the previous
        record of its engine, or for a transfer its trigger or the transfer that freed the
        DMA engines — whichever released it latest."""
        n = len(self)
        if n == 0:
            return []
        c = self.columns
        start, end = c["start_ns"].tolist(), c["end_ns"].tolist()
        cores, units, index = c["core"].tolist(), c["unit"].tolist(), c["index"].tolist()
        eps = 1e-6
        # Engine streams run one record at a time: the predecessor is the previous record.
        prev = [-1] * n
        last: dict[tuple[int, int], int] = {}
        for r in np.lexsort((c["end_ns"], c["start_ns"])).tolist():
            if units[r] < _NS:
                key = (cores[r], units[r])
                prev[r] = last.get(key, -1)
                last[key] = r
        trigger = {(cores[r], units[r], index[r]): r for r in range(n) if units[r] < _NS}
        dma_rows: dict[int, np.ndarray] = {}
        for core in np.unique(c["core"]):
            rows = np.flatnonzero((c["core"] == core) & (c["unit"] >= _NS))
            dma_rows[int(core)] = rows[np.argsort(c["end_ns"][rows], kind="stable")]
        s = self._sems
        visible: dict[int, float] = {}
        for w, rec, t in zip(s["wait"].tolist(), s["record"].tolist(), s["time_ns"].tolist()):
            if not w:
                visible[rec] = max(visible.get(rec, 0.0), t)
        waits: dict[int, list[tuple[float, int]]] = {}
        for w, rec, by in zip(s["wait"].tolist(), s["record"].tolist(), s["by"].tolist()):
            if w and by >= 0:
                waits.setdefault(rec, []).append((visible.get(by, end[by]), by))
        fixed = float(self.cost["dma_fixed_ns"])

        path = [int(np.argmax(c["end_ns"]))]
        seen = {path[0]}
        while True:
            r = path[-1]
            t = start[r]
            cands = [x for x in waits.get(r, []) if x[0] <= t + eps]
            if units[r] < _NS:
                if prev[r] >= 0:
                    cands.append((end[prev[r]], prev[r]))
            else:
                k = trigger.get((cores[r], units[r] - _NS, index[r]))
                if k is not None and end[k] <= t + eps:
                    cands.append((end[k], k))
                rows = dma_rows[cores[r]]
                pos = int(np.searchsorted(c["end_ns"][rows], t + fixed + eps, side="right"))
                while pos > 0 and int(rows[pos - 1]) == r:
                    pos -= 1
                if pos > 0 and end[int(rows[pos - 1])] > t:
                    cands.append((t, int(rows[pos - 1])))
            cands = [x for x in cands if x[1] not in seen]
            if not cands:
                break
            nxt = max(cands)[1]
            seen.add(nxt)
            path.append(nxt)
        return path[::-1]

    def stats(self) -> dict:
        """The numbers `summary()` prints, as a dict."""
        c = self.columns
        total = self.total_ns
        units = []
        for core in np.unique(c["core"]):
            for u in range(len(UNITS)):
                m = (c["core"] == core) & (c["unit"] == u)
                if not m.any():
                    continue
                st, en = c["start_ns"][m], c["end_ns"][m]
                if u >= _NS:  # transfers overlap on a queue: count the union of their intervals
                    order = np.argsort(st)
                    busy, cur_s, cur_e = 0.0, None, None
                    for a, b in zip(st[order], en[order]):
                        if cur_e is None or a > cur_e:
                            if cur_e is not None:
                                busy += cur_e - cur_s
                            cur_s, cur_e = a, b
                        else:
                            cur_e = max(cur_e, b)
                    busy += (cur_e - cur_s) if cur_e is not None else 0.0
                else:
                    busy = float((en - st).sum())
                flops = int(c["flops"][m].sum())
                nbytes = int(c["bytes"][m].sum())
                sparse = m & np.isin(c["opcode"], list(_SPARSE_OPS)) if u < _NS else np.zeros_like(m)
                units.append(
                    {
                        "core": int(core),
                        "unit": UNITS[u],
                        "count": int(m.sum()),
                        "busy_ns": busy,
                        "utilisation": busy / total if total else 0.0,
                        "flops": flops,
                        "tflops": flops / total / 1e3 if total else 0.0,
                        "bytes": nbytes,
                        "gbps": nbytes / total if total and u >= _NS else 0.0,
                        "sparse_count": int(sparse.sum()),
                        "sparse_flops": int(c["flops"][sparse].sum()),
                    }
                )
        dmam = c["unit"] >= _NS
        per_core_dma = {
            int(k): int(c["bytes"][dmam & (c["core"] == k)].sum()) / total if total else 0.0
            for k in np.unique(c["core"][dmam])
        }
        sp = self._spans
        dma_engines = {}
        for k in np.unique(sp["core"]):
            m = sp["core"] == k
            busy = float((sp["end_ns"][m] - sp["start_ns"][m]).sum())
            n_eng = int(self.cost["dma_engines"])
            dma_engines[int(k)] = {
                "engines_used": int(len(np.unique(sp["engine"][m]))),
                "mean_utilisation": busy / (n_eng * total) if total else 0.0,
            }
        path = self.critical_path()
        # Each step owns the time from its predecessor's end to its own end (they sum to the total).
        along: dict[str, float] = {}
        prev = 0.0
        for r in path:
            name = UNITS[int(c["unit"][r])]
            e = float(c["end_ns"][r])
            along[name] = along.get(name, 0.0) + max(e - prev, 0.0)
            prev = max(prev, e)
        return {
            "schema_version": self.schema_version,
            "timing": self.timing,
            "total_ns": total,
            "units": units,
            "dma_gbps_per_core": per_core_dma,
            "dma_engines": dma_engines,
            "hbm_gbps": int(c["hbm_bytes"].sum()) / total if total else 0.0,
            "critical_path": path,
            "critical_path_ns_by_unit": along,
            "source_lines": [{"core": k, "unit": u, "lines": v} for (k, u), v in self.source_lines().items()],
            "peaks": {
                "tensor_tflops_bf16": self.cost["peak_tflops_bf16"],
                "tensor_tflops_mx": self.cost["peak_tflops_mx"],
                "tensor_tflops_fp32": self.cost["peak_tflops_fp32"],
                "tensor_tflops_sparse": self.cost["peak_tflops_sparse"],
                "dma_gbps_per_core": self.cost["dma_engines"] * self.cost["dma_engine_bytes_per_ns"],
                "hbm_gbps": self.cost["hbm_bytes_per_ns"],
            },
        }

    def source_lines(self) -> dict[tuple[int, str], list[dict]]:
        """(core, engine or DMA queue) -> one row per kernel source line (`labels()`) that ran
        there: {line, count, busy_ns}, most busy first (ties by line). An engine's rows sum to its
        busy time in `stats()["units"]`. A DMA queue's rows also give the line's transfers: bytes,
        mean bytes per transfer, GB/s while the line's transfers were in flight, and
        `curve_efficiency`: the published DMA efficiency (Trn2 DMA figure, `DMA_CURVE`)
        at the transfers' size as [128, B] (B = bytes / 128): the share of the large-transfer rate
        a transfer that size gets. Transfers overlap on a queue: a line's busy time is the union of
        its transfers' intervals, and the rows of a queue can sum to more than the queue's."""
        c = self.columns
        if not len(self):
            return {}
        labels = np.array(self.labels(), dtype=object)
        _, inv = np.unique(labels.astype(str), return_inverse=True)
        dur = c["end_ns"] - c["start_ns"]
        out: dict[tuple[int, str], list[dict]] = {}
        key = c["core"].astype(np.int64) * 64 + c["unit"]
        for k in np.unique(key).tolist():
            m = key == k
            queue = k % 64 >= _NS
            busy = np.bincount(inv[m], weights=dur[m], minlength=inv.max() + 1)
            count = np.bincount(inv[m], minlength=inv.max() + 1)
            nbytes = np.bincount(inv[m], weights=c["bytes"][m].astype(np.float64), minlength=inv.max() + 1)
            first = {}
            for j, lab in zip(inv[m].tolist(), labels[m].tolist()):
                first.setdefault(j, lab)
            rows = []
            for j in first:
                r = {"line": first[j], "count": int(count[j]), "busy_ns": float(busy[j])}
                if queue:
                    mm = m & (inv == j)
                    st, en = _union(c["start_ns"][mm], c["end_ns"][mm])
                    r["busy_ns"] = float((en - st).sum())
                    per = nbytes[j] / max(count[j], 1)
                    r.update(
                        bytes=int(nbytes[j]),
                        transfer_bytes=float(per),
                        gbps=float(nbytes[j] / r["busy_ns"]) if r["busy_ns"] else 0.0,
                        curve_efficiency=_curve_efficiency(per / 128.0),
                    )
                rows.append(r)
            rows.sort(key=lambda r: (-r["busy_ns"], r["line"]))
            out[(k // 64, UNITS[k % 64])] = rows
        return out

    def summary(self, top: int = 5) -> str:
        """Per core and engine/queue: count, busy time, utilisation, achieved TFLOPS or GB/s against
        the published peaks; the critical path; the total estimated kernel time; per engine the
        `top` kernel source lines by busy time (`source_lines()`)."""
        st = self.stats()
        pk = st["peaks"]
        lines = [
            f"estimated time {st['total_ns']:,.1f} ns ({len(self)} records, trace schema v{self.schema_version})",
            f"timed with the published constants of {self.timing} ({self.cost.get('neuron_core', '?')}); "
            "functional behaviour is NeuronCore-v4",
            f"{'core':>4} {'unit':<11} {'n':>6} {'busy ns':>12} {'util':>6} {'achieved':>18}  peak",
        ]
        for u in st["units"]:
            if u["unit"] == "tensor":
                ach = f"{u['tflops']:.2f} TFLOPS"
                peak = f"{pk['tensor_tflops_bf16']:g} bf16 / {pk['tensor_tflops_mx']:g} MX / {pk['tensor_tflops_fp32']:g} fp32"
            elif u["unit"].startswith("dma."):
                ach = f"{u['gbps']:.1f} GB/s"
                peak = f"{pk['dma_gbps_per_core']:g} GB/s per core (all queues)"
            elif u["flops"]:
                ach = f"{u['tflops'] * 1e3:.1f} GFLOPS"
                vp = self.cost.get("peak_tflops_vector", 0.0)
                peak = f"{vp:g} TFLOPS fp32" if vp and u["unit"] in ("vector", "scalar") else ""
            else:
                ach, peak = "", ""
            lines.append(
                f"{u['core']:>4} {u['unit']:<11} {u['count']:>6} {u['busy_ns']:>12,.1f} {u['utilisation']:>6.1%} {ach:>18}  {peak}"
            )
            if u["sparse_count"]:
                lines.append(
                    f"{'':>4} {'':<11} {u['sparse_count']:>6} of them sparse matmuls (nc_matmul_sparse): "
                    f"{u['sparse_flops'] / st['total_ns'] / 1e3:.2f} TFLOPS dense-equivalent; "
                    f"sparse peak {pk['tensor_tflops_sparse']:g} (4:16, 2:8, 1:4), 3/4 for 4:12, 1/2 for 4:8, 2:4, 1:2"
                )
        for core, g in st["dma_gbps_per_core"].items():
            e = st["dma_engines"].get(core, {"engines_used": 0, "mean_utilisation": 0.0})
            lines.append(
                f"core {core} DMA: {g:,.1f} GB/s of {pk['dma_gbps_per_core']:g} GB/s; "
                f"{e['engines_used']} of {int(self.cost['dma_engines'])} engines used, mean busy {e['mean_utilisation']:.1%}"
            )
        lines.append(f"device HBM traffic: {st['hbm_gbps']:,.1f} GB/s of {pk['hbm_gbps']:g} GB/s")
        sp = self.spills()
        if sp["spills"] or sp["reloads"]:
            lines.append(
                f"spilled {sp['spilled_bytes']:,} bytes to HBM in {sp['spills']} DMAs, "
                f"reloaded {sp['reloaded_bytes']:,} bytes in {sp['reloads']} DMAs (the NKI spill pass)"
            )
        along = ", ".join(f"{k} {v:,.1f} ns" for k, v in sorted(st["critical_path_ns_by_unit"].items()))
        lines.append(f"critical path: {len(st['critical_path'])} records; time along it by unit: {along}")
        if st["source_lines"]:
            lines.append(
                f"top source lines by busy time (of each engine's / queue's busy time; up to {top} per unit; "
                "DMA: bytes per transfer, GB/s in flight, the published efficiency at that size):"
            )
        for e in st["source_lines"]:
            core, unit, rows = e["core"], e["unit"], e["lines"]
            busy = sum(r["busy_ns"] for r in rows) or 1.0
            for r in rows[:top]:
                dma = (
                    f"  {_size(r['transfer_bytes'])}/transfer, {r['gbps']:,.1f} GB/s, curve {r['curve_efficiency']:.0%}"
                    if "bytes" in r
                    else ""
                )
                lines.append(
                    f"{core:>4} {unit:<11} {r['count']:>6} {r['busy_ns']:>12,.1f} {r['busy_ns'] / busy:>6.1%}  "
                    f"{r['line']}{dma}"
                )
            if len(rows) > top:
                rest = rows[top:]
                lines.append(
                    f"{'':>4} {'':<11} {sum(r['count'] for r in rest):>6} {sum(r['busy_ns'] for r in rest):>12,.1f} "
                    f"{sum(r['busy_ns'] for r in rest) / busy:>6.1%}  ({len(rest)} other lines)"
                )
        return "\n".join(lines)

    # ------------------------------------------------------------------------------ export
    def occupancy(self) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
        """(core, 'SBUF' | 'PSUM') -> (time_ns, bytes): on-chip bytes written so far (64-byte
        granules; a footprint, since tile frees are not part of a program)."""
        w = self._write
        if not w:
            return {}
        c = self.columns
        out: dict[tuple[int, str], tuple[list, list]] = {}
        grids: dict[tuple[int, int], np.ndarray] = {}
        order = np.argsort(c["end_ns"], kind="stable")
        order = order[np.isin(w["w_mem"][order], list(_MEM_BYTES))]
        mems, cores, ends = w["w_mem"][order].tolist(), c["core"][order].tolist(), c["end_ns"][order].tolist()
        p0s, p1s = w["w_p0"][order].tolist(), w["w_p1"][order].tolist()
        los, his = w["w_lo"][order].tolist(), w["w_hi"][order].tolist()
        seen: set[tuple] = set()  # regions already counted (loops rewrite the same tiles)
        for mem, core, end, p0, p1, lo, hi in zip(mems, cores, ends, p0s, p1s, los, his):
            key = (mem, core, p0, p1, lo, hi)
            if key in seen:
                continue
            seen.add(key)
            g = grids.get((core, mem))
            if g is None:
                g = grids[(core, mem)] = np.zeros((_native.PARTITIONS, _MEM_BYTES[mem] // _GRANULE), bool)
            lo, hi = lo // _GRANULE, -(-hi // _GRANULE)
            cell = g[p0:p1, lo:hi]
            added = cell.size - int(cell.sum())
            if not added:
                continue
            cell[...] = True
            ts, vs = out.setdefault((core, _MEM_NAME[mem]), ([0.0], [0]))
            ts.append(end)
            vs.append(vs[-1] + added * _GRANULE)
        return {k: (np.array(t), np.array(v)) for k, (t, v) in out.items()}

    def _tracks(self) -> tuple[np.ndarray, dict[tuple[int, int], str]]:
        """A Perfetto thread id per record: engines keep their stream; overlapping transfers of
        one DMA queue go to extra lanes so every track nests."""
        c = self.columns
        tid = np.zeros(len(self), np.int64)
        names: dict[tuple[int, int], str] = {}
        for core in np.unique(c["core"]):
            for u in range(len(UNITS)):
                rows = np.flatnonzero((c["core"] == core) & (c["unit"] == u))
                if not len(rows):
                    continue
                if u < _NS:
                    tid[rows] = u
                    names[(int(core), u)] = f"{ENGINES[u]} engine"
                    continue
                rows = rows[np.lexsort((c["end_ns"][rows], c["start_ns"][rows]))]
                lanes: list[float] = []
                got = []
                for s, e in zip(c["start_ns"][rows].tolist(), c["end_ns"][rows].tolist()):
                    lane = next((i for i, x in enumerate(lanes) if x <= s), None)
                    if lane is None:
                        lanes.append(0.0)
                        lane = len(lanes) - 1
                    lanes[lane] = e
                    got.append(lane)
                q = u - _NS
                tid[rows] = 100 + 16 * q + np.array(got, np.int64)
                for lane in range(len(lanes)):
                    t = 100 + 16 * q + lane
                    names[(int(core), t)] = f"dma queue {q} ({ENGINES[q]})" + (f" lane {lane}" if lane else "")
        return tid, names

    def spills(self) -> dict:
        """What the NKI front end's spill pass added (docs/nki.md, "Passes"): the DMAs named
        `spill` / `reload` and their bytes (one count per instruction)."""
        out = {"spills": 0, "spilled_bytes": 0, "reloads": 0, "reloaded_bytes": 0}
        c = self.columns
        seen: dict[tuple[int, int], tuple[str, int]] = {}
        for i, lab in enumerate(self.labels()):
            kind = "spill" if lab.startswith("spill/") else "reload" if lab.startswith("reload/") else None
            if kind is not None:
                key = (int(c["core"][i]), int(c["index"][i]))
                n = int(c["bytes"][i])
                if key not in seen or seen[key][1] < n:
                    seen[key] = (kind, n)
        for kind, n in seen.values():
            out[kind + "s"] += 1
            out[("spilled" if kind == "spill" else "reloaded") + "_bytes"] += n
        return out

    def labels(self) -> list[str]:
        """Per record (into `columns`): its kernel source line (the instruction's `name=` label,
        which the NKI front end sets to `file.py:LINE`), or `(opcode)` when it has none."""
        if "labels" in self._cache:
            return self._cache["labels"]  # type: ignore[return-value]
        c = self.columns
        names = np.full(len(self), None, dtype=object)
        for k in np.unique(c["core"]).tolist():
            self._name(k, 0)  # loads the core's names
            table = np.array(self._names[k] + [None], dtype=object)
            m = c["core"] == k
            names[m] = table[np.minimum(c["index"][m], len(table) - 1)]
        out = [n if n else f"({_OPNAME.get(o, '?')})" for n, o in zip(names.tolist(), c["opcode"].tolist())]
        self._cache["labels"] = out  # type: ignore[assignment]
        return out

    def to_perfetto(self, path, operands: bool = False) -> Path:
        """Write Chrome Trace Event JSON (open in ui.perfetto.dev; gzip-compressed when `path` ends
        in `.gz`): one process per core, one track per engine, per DMA queue and per DMA engine.
        Each slice is named by its kernel source line (`labels()`), with the opcode (`op`), the
        instruction index (`i`), bytes (`b`) and for engine instructions flops (`f`) in its args
        (`operands=True` adds the operand text, `ops`). Flow arrows go from each semaphore signal to
        the wait it satisfied and from each DMA trigger to its transfer; counters show SBUF/PSUM
        bytes written. Returns the path written."""
        c = self.columns
        tid, names = self._tracks()
        out: list[str] = []
        meta = '{"ph":"M","name":"%s","pid":%d,"tid":%d,"args":{"%s":%s}}'
        for core in np.unique(c["core"]).tolist():
            out.append(meta % ("process_name", core, 0, "name", json.dumps(f"core {core}")))
            out.append(meta % ("process_sort_index", core, 0, "sort_index", core))
        sp = self._spans
        for ke in np.unique(sp["core"].astype(np.int64) * 256 + sp["engine"]).tolist():
            names[(ke // 256, 300 + ke % 256)] = f"dma engine {ke % 256}"
        for (core, t), name in sorted(names.items()):
            out.append(meta % ("thread_name", core, t, "name", json.dumps(name)))
            out.append(meta % ("thread_sort_index", core, t, "sort_index", t))
        start = np.rint(c["start_ns"] * 1000.0).astype(np.int64)
        dur = np.rint(c["end_ns"] * 1000.0).astype(np.int64) - start
        raw = self.labels()
        quoted = {x: json.dumps(x) for x in set(raw)}
        labels = [quoted[x] for x in raw]
        ops = [_OPNAME.get(o, "?") for o in c["opcode"].tolist()]
        cores, idx = c["core"].tolist(), c["index"].tolist()
        tids, units = tid.tolist(), c["unit"].tolist()
        s_us, s_ps = (v.tolist() for v in np.divmod(start, 1_000_000))
        d_us, d_ps = (v.tolist() for v in np.divmod(dur, 1_000_000))
        cat = ["dma" if u >= _NS else "instr" for u in units]
        extra = [f',"f":{f}' if f else "" for f in c["flops"].tolist()]
        if operands:
            extra = [e + ',"ops":' + json.dumps(self._operands(k, i)) for e, k, i in zip(extra, cores, idx)]
        x = '{"ph":"X","name":%s,"cat":"%s","pid":%d,"tid":%d,"ts":%d.%06d,"dur":%d.%06d,"args":{"op":"%s","i":%d,"b":%d%s}}'
        out.extend(
            x % row
            for row in zip(labels, cat, cores, tids, s_us, s_ps, d_us, d_ps, ops, idx, c["bytes"].tolist(), extra)
        )
        # Each DMA engine's share of a transfer, named like the transfer.
        rec = sp["record"].astype(np.int64).tolist()
        a = np.rint(sp["start_ns"] * 1000.0).astype(np.int64)
        d = np.rint(sp["end_ns"] * 1000.0).astype(np.int64) - a
        a_us, a_ps = (v.tolist() for v in np.divmod(a, 1_000_000))
        e_us, e_ps = (v.tolist() for v in np.divmod(d, 1_000_000))
        y = '{"ph":"X","name":%s,"pid":%d,"tid":%d,"ts":%d.%06d,"dur":%d.%06d,"args":{"b":%d}}'
        out.extend(
            y % row
            for row in zip(
                [labels[r] for r in rec],
                sp["core"].tolist(),
                (sp["engine"].astype(np.int64) + 300).tolist(),
                a_us,
                a_ps,
                e_us,
                e_ps,
                sp["bytes"].tolist(),
            )
        )
        # Flows: semaphore signal -> the wait it satisfied; DMA trigger -> its transfer.
        sm = self._sems
        ok = sm["wait"] & (sm["by"] >= 0)
        src = [sm["by"][ok].astype(np.int64)]
        dst = [sm["record"][ok].astype(np.int64)]
        tag = {m: f'"name":"semaphore {m}","cat":"semaphore"' for m in np.unique(sm["sem"][ok]).tolist()}
        label = [tag[m] for m in sm["sem"][ok].tolist()]
        # A transfer's trigger: the engine record with the same core, stream and index.
        key = (
            (c["core"].astype(np.int64) << 40)
            | ((c["unit"].astype(np.int64) % _NS) << 32)
            | c["index"].astype(np.int64)
        )
        eng = np.flatnonzero(c["unit"] < _NS)
        eng = eng[np.argsort(key[eng], kind="stable")]
        xfer = np.flatnonzero(c["unit"] >= _NS)
        pos = np.minimum(np.searchsorted(key[eng], key[xfer]), max(len(eng) - 1, 0))
        if len(eng):
            hit = key[eng][pos] == key[xfer]
            src.append(eng[pos][hit])
            dst.append(xfer[hit])
            label += ['"name":"dma trigger","cat":"dma"'] * int(hit.sum())
        b_rows, r_rows = np.concatenate(src).tolist(), np.concatenate(dst).tolist()
        mid_us, mid_ps = (v.tolist() for v in np.divmod(start + dur // 2, 1_000_000))
        # one string per flow: its start and its end event
        flow = '{"ph":"s",%s,"id":%d,"pid":%d,"tid":%d,"ts":%d.%06d},\n{"ph":"f","bp":"e",%s,"id":%d,"pid":%d,"tid":%d,"ts":%d.%06d}'
        out.extend(
            flow % (t, n, cores[b], tids[b], mid_us[b], mid_ps[b], t, n, cores[r], tids[r], s_us[r], s_ps[r])
            for n, (b, r, t) in enumerate(zip(b_rows, r_rows, label), 1)
        )
        cs = '{"ph":"C","name":"%s bytes written","pid":%d,"ts":%r,"args":{"bytes":%d}}'
        for (core, mem), (ts, vs) in sorted(self.occupancy().items()):
            out.extend(cs % (mem, core, t / 1000.0, v) for t, v in zip(ts.tolist(), vs.tolist()))
        other = json.dumps({"generator": "trn3emu", "schema_version": self.schema_version, "total_ns": self.total_ns})
        text = '{"traceEvents":[\n' + ",\n".join(out) + '\n],"displayTimeUnit":"ns","otherData":' + other + "}\n"
        path = Path(path)
        if path.suffix == ".gz":
            with gzip.open(path, "wt", compresslevel=6) as f:
                f.write(text)
        else:
            path.write_bytes(text.encode())
        return path

    def busy_fraction(self, start_ns: float | None = None, end_ns: float | None = None) -> dict[tuple[int, str], float]:
        """(core, unit) -> the fraction of the window [start_ns, end_ns] (default the whole run)
        during which the engine stream or DMA queue was busy (a queue's overlapping transfers
        count once). What `plot` draws, averaged over the window."""
        t0, t1 = self._window(start_ns, end_ns)
        out = {}
        for (core, u), fr in self._occupancy_bins(t0, t1, 1).items():
            out[(core, UNITS[u])] = float(fr.sum())
        return out

    def _window(self, start_ns, end_ns) -> tuple[float, float]:
        t0 = 0.0 if start_ns is None else float(start_ns)
        t1 = (self.total_ns or 1.0) if end_ns is None else float(end_ns)
        if not t1 > t0:
            raise ValueError(f"empty time window: start_ns {t0} >= end_ns {t1}")
        return t0, t1

    def _occupancy_bins(self, t0: float, t1: float, bins: int, cats=None) -> dict[tuple[int, int], np.ndarray]:
        """(core, unit) -> [categories, bins]: the busy fraction of each of `bins` equal time
        columns of [t0, t1] per category: `cats` = (names, per-record index), default the
        instruction classes (rows in `_plot_classes()` order)."""
        c = self.columns
        if cats is None:
            classes = self._plot_classes()
            cls = np.array([classes.index(_op_class(o)) for o in c["opcode"].tolist()], dtype=np.int64)
        else:
            classes, cls = cats
        edges = np.linspace(t0, t1, bins + 1)
        width = (t1 - t0) / bins
        out = {}
        for core, u in sorted({(int(k), int(u)) for k, u in zip(c["core"].tolist(), c["unit"].tolist())}):
            m = (c["core"] == core) & (c["unit"] == u)
            frac = np.zeros((len(classes), bins))
            for k in np.unique(cls[m]).tolist():
                mm = m & (cls == k)
                st, en = _union(c["start_ns"][mm], c["end_ns"][mm])
                frac[k] = np.diff(_covered(st, en, edges)) / width
            tot = frac.sum(axis=0)
            over = tot > 1.0  # classes of one DMA queue may overlap each other
            frac[:, over] /= tot[over]
            out[(core, u)] = frac
        return out

    def _line_categories(self, top: int) -> tuple[list[str], np.ndarray, list[str]]:
        """For `plot(by="line")`: the `top` source lines by busy time (engine time plus each
        queue's union) then "other lines"; each record's category; legend texts with shares."""
        busy: dict[str, float] = {}
        for rows in self.source_lines().values():
            for r in rows:
                busy[r["line"]] = busy.get(r["line"], 0.0) + r["busy_ns"]
        total = sum(busy.values()) or 1.0
        best = sorted(busy, key=lambda k: (-busy[k], k))[: max(int(top), 0)]
        where = {name: i for i, name in enumerate(best)}
        idx = np.array([where.get(lab, len(best)) for lab in self.labels()], dtype=np.int64)
        legend = [f"{name} ({busy[name] / total:.0%}) {_source_text(name)}".rstrip() for name in best]
        rest = sum(v for k, v in busy.items() if k not in where)
        if len(busy) > len(best):
            legend.append(f"{len(busy) - len(best)} other line(s) ({rest / total:.0%})")
        return best + ["other lines"], idx, legend

    def _plot_classes(self) -> list[str]:
        return sorted({_op_class(o) for o in np.unique(self.columns["opcode"]).tolist()})

    def plot(
        self,
        path,
        width: float = 14.0,
        start_ns: float | None = None,
        end_ns: float | None = None,
        dpi: int = 100,
        by: str = "class",
        top: int = 8,
    ) -> list[str]:
        """Render a timeline PNG (needs matplotlib: `pip install 'trn3emu[plot]'`): one row per core
        and engine stream / DMA queue over the window [start_ns, end_ns] (default the whole run).
        Each pixel column of a row shows the fraction of its time slice the unit was busy, as a
        bar stacked by instruction class (the cost class of docs/isa.md; see the legend), so no
        instruction disappears however short (a column with any busy time gets at least one
        pixel). A class has the same colour in every plot (`ALL_CLASSES`). `by="line"` colours
        by kernel source line instead: the `top` lines with the most busy time (engines and
        queues together) in their own colours, named in the legend with their share, every
        other line grey. Time is labelled in ns, µs or ms. Returns the row labels, top to bottom."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            from matplotlib.patches import Patch
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("Trace.plot needs matplotlib: pip install 'trn3emu[plot]'") from e
        if by not in ("class", "line"):
            raise ValueError(f"by must be 'class' or 'line', got {by!r}")
        t0, t1 = self._window(start_ns, end_ns)
        cats, legend = None, None
        if by == "class":
            classes = self._plot_classes()
            colours = _class_colours(classes)
        else:
            classes, idx, legend = self._line_categories(top)
            cats = (classes, idx)
            colours = np.vstack([_palette(max(len(classes) - 1, 1))[: len(classes) - 1], [_OTHER_RGB]])
        per_row = 6 if by == "class" else 2
        left, right, top_px, bottom = 190, 20, 40, 60 + 22 * ((len(classes) + per_row - 1) // per_row)
        cols = max(int(width * dpi) - left - right, 50)
        occ = self._occupancy_bins(t0, t1, cols, cats)
        tracks = list(occ)
        row, gap = _PLOT_ROW_PX, _PLOT_GAP_PX
        raster = np.ones((len(tracks) * (row + gap) + gap, cols, 3))
        for n, key in enumerate(tracks):
            frac = occ[key]
            y1 = gap + n * (row + gap) + row  # bottom edge (exclusive) of the band
            band = raster[y1 - row : y1]
            band[...] = _PLOT_BG
            total = frac.sum(axis=0)
            height = _dither(total * row, row)
            cum = np.cumsum(frac, axis=0) / np.where(total > 0, total, 1.0)
            cum = np.minimum(np.rint(cum * height).astype(np.int64), height)
            lo = np.zeros(cols, np.int64)
            y = np.arange(row)[:, None]
            for k in range(len(classes)):  # class k fills pixel rows [lo, hi) counted from the bottom
                hi = cum[k]
                band[(y >= row - hi[None, :]) & (y < row - lo[None, :])] = colours[k]
                lo = hi
        h_px = raster.shape[0] + top_px + bottom
        fig = plt.figure(figsize=((cols + left + right) / dpi, h_px / dpi), dpi=dpi)
        fig.figimage(raster, xo=left, yo=bottom, origin="upper")
        ax = fig.add_axes(
            (left / (cols + left + right), bottom / h_px, cols / (cols + left + right), raster.shape[0] / h_px)
        )
        ax.patch.set_alpha(0.0)
        for sp in ax.spines.values():
            sp.set_visible(False)
        scale, unit = (1e6, "ms") if t1 - t0 >= 1e6 else (1e3, "µs") if t1 - t0 >= 1e3 else (1.0, "ns")
        ax.set_xlim(t0 / scale, t1 / scale)
        ax.set_ylim(raster.shape[0], 0)
        labels = [f"{self._core_label(k)} {UNITS[u]}" for k, u in tracks]
        ax.set_yticks([gap + n * (row + gap) + row / 2 for n in range(len(tracks))])
        ax.set_yticklabels(labels)
        ax.tick_params(axis="y", length=0)
        ax.set_xlabel(f"estimated time ({unit})")
        ax.set_title(
            f"trn3emu timeline {t0 / scale:,.3g}-{t1 / scale:,.4g} {unit} of {self.total_ns / scale:,.4g} {unit} "
            f"(bar height: busy fraction per pixel column)",
            fontsize=10,
        )
        names = legend if legend is not None else classes
        handles = [Patch(facecolor=colours[k], label=name) for k, name in enumerate(names)]
        if handles:
            fig.legend(handles=handles, loc="lower center", ncol=min(len(names), per_row), fontsize=8, frameon=False)
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
        return labels


def _source_text(label: str, width: int = 48) -> str:
    """The source text of a `file.py:LINE` label, for the per-line legend: labels carry the
    file's base name only, so the file is found among loaded modules and linecache's files."""
    import linecache
    import os
    import sys

    file, _, line = label.rpartition(":")
    if not file or not line.isdigit():
        return ""
    paths = [getattr(m, "__file__", None) for m in list(sys.modules.values())] + list(linecache.cache)
    for path in paths:
        if path and os.path.basename(path) == file:
            text = linecache.getline(path, int(line)).strip()
            if text:
                return "`" + (text if len(text) <= width else text[: width - 1] + "\u2026") + "`"
    return ""


_PLOT_ROW_PX = 40
_PLOT_GAP_PX = 8
#: The background of a unit's row in `Trace.plot` (idle time); busy time is drawn in class colours.
PLOT_IDLE_RGB = (0.92, 0.94, 1.0)
_PLOT_BG = np.array(PLOT_IDLE_RGB)
#: The colour of the lines outside the top N in `Trace.plot(by="line")`.
_OTHER_RGB = np.array((0.62, 0.62, 0.62))


def _size(n: float) -> str:
    return f"{n / 1024:,.1f} KiB" if n >= 1024 else f"{n:,.0f} B"


#: (bytes per partition, published efficiency %) read off the DMA overview figure (Trn2); also the
#: anchors `calibration` checks the timing model against.
DMA_CURVE = ((256, 10.0), (512, 21.0), (1024, 42.0), (2048, 82.0), (4096, 96.0))


def _curve_efficiency(bytes_per_partition: float) -> float:
    """The published DMA efficiency (vs large transfers) of a [128, B] transfer: the Trn2 DMA
    figure's points (`DMA_CURVE`) interpolated in log2(B), proportional to B below the first
    point, 100 % from 16 KiB."""
    pts = [(float(b), e / 100.0) for b, e in DMA_CURVE] + [(16384.0, 1.0)]
    b = float(bytes_per_partition)
    if b <= pts[0][0]:
        return pts[0][1] * max(b, 0.0) / pts[0][0]
    for (b0, e0), (b1, e1) in zip(pts, pts[1:]):
        if b <= b1:
            f = (np.log2(b) - np.log2(b0)) / (np.log2(b1) - np.log2(b0))
            return float(e0 + f * (e1 - e0))
    return 1.0


def _op_class(opcode: int) -> str:
    """An opcode's instruction class for the timeline: its cost class (docs/isa.md)."""
    return INSTRUCTION_FLAGS.get(_OPNAME.get(opcode, "?"), ("other",))[0]


#: Every instruction class of the ISA, in a fixed order: a class's colour is its place here, so it
#: is the same in every plot whatever else the trace holds.
ALL_CLASSES: tuple[str, ...] = tuple(sorted({f[0] for f in INSTRUCTION_FLAGS.values()} | {"other"}))


def _palette(n: int) -> np.ndarray:
    import matplotlib

    cmaps = [matplotlib.colormaps[m] for m in ("tab20", "tab20b", "tab20c")]
    return np.array([cmaps[(i // 20) % 3](i % 20)[:3] for i in range(n)])


def _class_colours(classes: list[str]) -> np.ndarray:
    """A fixed colour per instruction class (`ALL_CLASSES` order), the same across plots."""
    pal = _palette(len(ALL_CLASSES))
    return np.array([pal[ALL_CLASSES.index(c) if c in ALL_CLASSES else -1] for c in classes])


def _dither(h: np.ndarray, row: int) -> np.ndarray:
    """Pixel heights for exact heights `h` (0..row): rounding error carried to the next column
    so a row's pixel total matches its busy time, and at least one pixel for any busy column."""
    out = np.zeros(len(h), np.int64)
    carry = 0.0
    for i, x in enumerate(h.tolist()):
        v = min(max(int(round(x + carry)), 1 if x > 0 else 0), row)
        carry += x - v
        out[i] = v
    return out


def _union(st: np.ndarray, en: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals into disjoint ones."""
    if not len(st):
        return st, en
    o = np.argsort(st, kind="stable")
    st, en = st[o], en[o]
    reach = np.maximum.accumulate(en)
    new = np.ones(len(st), bool)
    new[1:] = st[1:] > reach[:-1]
    return st[new], np.maximum.reduceat(en, np.flatnonzero(new))


def _covered(st: np.ndarray, en: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Total length of the disjoint intervals [st, en) before each time in t."""
    so, eo = np.sort(st), np.sort(en)
    cs = np.concatenate(([0.0], np.cumsum(so)))
    ce = np.concatenate(([0.0], np.cumsum(eo)))
    ns = np.searchsorted(so, t, side="right")
    ne = np.searchsorted(eo, t, side="right")
    return (ns * t - cs[ns]) - (ne * t - ce[ne])


class RunResult:
    """What `Device.run` returns: the trace, the estimated device time and the count executed."""

    def __init__(self, raw: dict, programs: list) -> None:
        self.time_ns = raw["end_ps"] / 1000.0
        self.executed = int(raw["executed"])
        #: Items run after the trace reached its record limit (`Device.run(trace_limit=...)`),
        #: left out of the trace; 0 when the trace is complete.
        self.trace_dropped = int(raw.get("trace_dropped", 0))
        #: `Device.run(identical_writes=True)`: one message per unordered cross-core write of
        #: identical bytes (warned as `IdenticalWritesWarning`).
        self.identical_writes: list[str] = list(raw.get("identical_writes", ()))
        # Built on first access: a run's fixed cost should not include ~30 numpy arrays.
        self._raw_trace, self._programs = raw["trace"], programs
        self._trace: Trace | None = None

    @property
    def trace(self) -> Trace:
        """The run's trace, built on first access (runs in a tight loop rarely look at it)."""
        if self._trace is None:
            self._trace = Trace(self._raw_trace.columns(), self._programs)
        return self._trace

    def __repr__(self) -> str:
        return f"<RunResult {self.executed} executed, {self.time_ns:,.1f} ns estimated>"
