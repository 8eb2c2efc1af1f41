"""The kernel IR: what one trace of an NKI kernel calls, in which loops, on which tiles
(docs/nki.md, "Passes").

Tracing fills it (`record.py`), the passes read it (`liveness.py`: each tile's uses;
`engine_choice.py`: which call issued each instruction) and write their decisions into it
(`Call.notes`, `KernelIR.passes`, the calls they add), and lowering emits the `Program` with them. It is plain data: this module imports nothing of the tracer, so any
stage can read it and `to_dict()` / `from_dict()` round-trip it through JSON.

- `calls`: every `nki.isa` call in program order (`nl.*` ops appear as the `nisa` calls they
  lower to): ordinal, op, pinned engine, the kernel's source line, the loop nest around it and the
  tiles it reads and writes. A call masked to nothing still has its ordinal (it emits nothing).
- `tiles`: every on-chip allocation (an automatic tile, each block of a block tile, an explicitly
  placed tile) in allocation order; its ordinal is the one the liveness pass numbers it by.
- `tensors`: HBM tensors: those the kernel allocates (`nl.ndarray` in HBM), numbered when
  allocated, and the kernel inputs (by parameter name), numbered when a call first names them.
- `loops`: the `affine_range` / `sequential_range` / `static_range` loops (one per `for` statement)
  and the device loops (`dynamic_range`, `fori_loop`, `while_loop`); a call's nest gives (loop,
  iteration, trip count) per enclosing loop, outermost first.
- `passes`: what each pass that ran over the IR did (pass name -> one line); the calls carry
  their decisions in `Call.notes` (pass name -> decision), and the calls a pass added (spill and
  reload copies) name it in `Call.added_by`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

#: the on-chip buffers whose bytes per partition `live_bytes` counts
ONCHIP = ("sbuf", "psum")


@dataclass(slots=True)
class Loop:
    """One `for v in nl.affine_range(n)` statement (every iteration, every entry)."""

    id: int
    kind: str  # affine_range / sequential_range / static_range / dynamic_range / fori_loop / while_loop
    var: str  # the loop variable ("" when the for statement does not bind a plain name)
    line: str  # file:line of the for statement (of the fori_loop / while_loop call)
    #: a device loop: its trip count was read on the device (register bounds or condition), each
    #: iteration's value is a register (docs/nki.md, "Language")
    device: bool = False


@dataclass(slots=True)
class Tile:
    """One on-chip allocation."""

    ordinal: int
    buffer: str  # sbuf / psum
    shape: tuple
    dtype: str
    row_bytes: int  # bytes per partition
    placed: bool  # placed by the kernel (address=, ncc.sbuf.alloc): held to the end, never moved
    label: str  # name, shape, dtype and the source line of the allocation
    born: int  # ordinal of the first call issued after the allocation
    uses: list = field(default_factory=list)  # ordinals of the calls naming it, ascending
    #: named through a run-time offset (an index tile, or the tile a `scalar_offset` /
    #: `vector_offset` view reads): its views cannot move, so the spill pass never moves it
    pinned: bool = False
    #: the `spill` pass's spells out of memory (lowered IR): ((first call out, first call back),
    #: ...) in call ordinals; the tile holds no range during calls first..back - 1
    out: list = field(default_factory=list)
    #: where the allocation pass placed it (lowered IR): ((first call, byte offset in each
    #: partition), ...), a new entry each time a reload lands it elsewhere; empty when not decided
    #: by the pass (an explicitly placed tile, a literal trace)
    at: list = field(default_factory=list)

    @property
    def first_use(self) -> int | None:
        return self.uses[0] if self.uses else None

    @property
    def last_use(self) -> int | None:
        return self.uses[-1] if self.uses else None


@dataclass(slots=True)
class HbmTensor:
    """One HBM tensor a call names."""

    ordinal: int
    name: str
    shape: tuple
    dtype: str
    nbytes: int
    uses: list = field(default_factory=list)


@dataclass(slots=True)
class Call:
    """One `nki.isa` call."""

    ordinal: int
    op: str
    engine: str | None  # the engine the kernel pinned (None: left to the ISA / engine_choice)
    line: str  # file:line in the kernel
    nest: tuple = ()  # ((loop id, iteration, trip count), ...), outermost first
    reads: tuple = ()  # tile ordinals of its source operands
    writes: tuple = ()  # tile ordinals of its destination operands (dst..., reduce_res)
    hbm_reads: tuple = ()  # HBM tensor ordinals
    hbm_writes: tuple = ()
    #: index of its first instruction in its program (-1: not known); its instructions run up to
    #: the next call's of the same segment
    instr: int = -1
    segment: int = 0  # the program it is in: a device loop's bound read starts a new one
    #: "" for a call of the kernel; else the pass that added it ("spill": spill / reload copies)
    added_by: str = ""
    #: decisions of the passes that ran over the IR: pass name -> decision (`engine_choice`:
    #: ((instruction index, engine), ...) for the instructions it decided)
    notes: dict = field(default_factory=dict)
    #: the `nl` op whose lowering issued it when a pass cares ("nl.load": `value_reuse` may
    #: reuse its data like `load_reuse`), else ""
    origin: str = ""


class KernelIR:
    """The calls, tiles, HBM tensors and loops of one program's trace (`kernel.last_ir`)."""

    def __init__(self, kernel: str = "", program: int = 0) -> None:
        self.kernel, self.program = kernel, program
        self.calls: list[Call] = []
        self.tiles: list[Tile] = []
        self.tensors: list[HbmTensor] = []
        self.loops: list[Loop] = []
        #: pass name -> what it did (one line), for the passes that ran over this IR (and the
        #: counts of what the passes acting while tracing did: `count`)
        self.passes: dict[str, str] = {}
        self._counts: dict[str, dict[str, int]] = {}

    def __len__(self) -> int:
        return len(self.calls)

    def count(self, name: str, what: str) -> None:
        """Pass `name` did `what` once more: its `passes` line counts each kind of decision."""
        c = self._counts.setdefault(name, {})
        c[what] = c.get(what, 0) + 1
        self.passes[name] = "; ".join(f"{k}: {v}" for k, v in c.items())

    # ------------------------------------------------------------------ liveness
    def live_range(self, tile: int) -> tuple[int, int] | None:
        """(first, last) call ordinal during which tile `tile` holds its range: from the call
        after its allocation to its last use (an explicitly placed tile: to the end); None for
        an automatic tile no call names (the liveness pass frees it at once)."""
        t = self.tiles[tile]
        if t.placed:
            return t.born, max(len(self.calls) - 1, t.born)
        if not t.uses:
            return None
        return min(t.born, t.uses[0]), t.uses[-1]

    def live_at(self, call: int) -> list[int]:
        """The ordinals of the tiles live during call `call` (a spilled tile is not while out)."""
        out = []
        for t in self.tiles:
            r = self.live_range(t.ordinal)
            if r is not None and r[0] <= call <= r[1] and not any(a <= call < b for a, b in t.out):
                out.append(t.ordinal)
        return out

    def live_bytes(self, buffer: str = "sbuf") -> list[int]:
        """Bytes per partition of `buffer` held by live tiles, per call (a sweep over the live
        ranges less the spells spilled tiles spend out: O(tiles + calls))."""
        n = len(self.calls)
        delta = [0] * (n + 1)
        for t in self.tiles:
            if t.buffer != buffer:
                continue
            r = self.live_range(t.ordinal)
            if r is None or r[0] >= n:
                continue
            delta[r[0]] += t.row_bytes
            delta[r[1] + 1] -= t.row_bytes
            for a, b in t.out:
                a, b = max(a, r[0]), min(b, r[1] + 1)
                if a < b:
                    delta[a] -= t.row_bytes
                    delta[b] += t.row_bytes
        out, acc = [], 0
        for k in range(n):
            acc += delta[k]
            out.append(acc)
        return out

    def peak(self, buffer: str = "sbuf") -> tuple[int, int | None]:
        """(peak live bytes per partition of `buffer`, the first call at which it is reached;
        None when there are no calls)."""
        best, at = 0, None
        for k, b in enumerate(self.live_bytes(buffer)):
            if at is None or b > best:
                best, at = b, k
        return best, at

    # ------------------------------------------------------------------ dump
    def _loop_text(self, nest) -> str:
        return " ".join(f"{self.loops[i].var or '_'}={it}/{n}" for i, it, n in nest)

    def summary(self, limit: int = 40) -> str:
        """A compiler-style dump: a header with counts and peaks, the loops, then one line per
        call (`limit` lines at most: the first and last halves, the rest counted)."""
        sb, at = self.peak("sbuf")
        pb, pat = self.peak("psum")
        lines = [
            f"kernel {self.kernel or '?'} program {self.program}: {len(self.calls)} calls, "
            f"{len(self.tiles)} tiles, {len(self.tensors)} HBM tensors, {len(self.loops)} loops; "
            f"peak live SBUF {sb} B/partition at call {at}, PSUM {pb} B/partition at call {pat}"
        ]
        for name, what in self.passes.items():
            lines.append(f"  pass {name}: {what}")
        for lp in self.loops:
            dev = " (device loop)" if lp.device else ""
            lines.append(f"  loop L{lp.id}: for {lp.var or '_'} in {lp.kind}{dev}  @ {lp.line}")
        last = {t.last_use: [] for t in self.tiles if not t.placed and t.uses}
        for t in self.tiles:
            if not t.placed and t.uses:
                last[t.last_use].append(t.ordinal)
        width = len(str(max(len(self.calls) - 1, 0)))

        def row(c: Call) -> str:
            w = [f"t{i}" for i in c.writes] + [f"h{i}" for i in c.hbm_writes]
            r = [f"t{i}" for i in c.reads] + [f"h{i}" for i in c.hbm_reads]
            s = f"  {c.ordinal:>{width}}  {c.op}"
            if c.engine:
                s += f"[{c.engine}]"
            if c.added_by:
                s += f" ({c.added_by})"
            s += f"  {', '.join(w) or '-'} <- {', '.join(r) or '-'}"
            if c.nest:
                s += f"  | {self._loop_text(c.nest)}"
            dead = last.get(c.ordinal)
            if dead:
                s += f"  | last use: {', '.join(f't{i}' for i in dead)}"
            if c.notes:
                s += "  | " + ", ".join(f"{k}: {_note_text(v)}" for k, v in c.notes.items())
            return s + f"  @ {c.line}"

        calls = self.calls
        if limit is not None and len(calls) > limit:
            head = limit // 2
            tail = limit - head
            lines += [row(c) for c in calls[:head]]
            lines.append(f"  ... {len(calls) - limit} calls not shown ...")
            lines += [row(c) for c in calls[len(calls) - tail :]]
        else:
            lines += [row(c) for c in calls]
        shown = self.tiles if limit is None or len(self.tiles) <= limit else self.tiles[:limit]
        for t in shown:
            u = f"uses {t.first_use}..{t.last_use} ({len(t.uses)})" if t.uses else "never used"
            at = ""
            if t.at:
                at = ", at " + "; ".join(f"+{o}" if not k else f"+{o} from call {c}" for k, (c, o) in enumerate(t.at))
            out = "".join(f", out {a}..{b - 1}" for a, b in t.out)
            lines.append(
                f"  t{t.ordinal}: {t.buffer} {list(t.shape)} {t.dtype} {t.row_bytes} B/partition"
                f"{' placed' if t.placed else ''}{at}{out}, {u}  ({t.label})"
            )
        if len(shown) < len(self.tiles):
            lines.append(f"  ... {len(self.tiles) - len(shown)} tiles not shown ...")
        for h in self.tensors[: limit if limit is not None else None]:
            lines.append(f"  h{h.ordinal}: hbm {h.name or '?'} {list(h.shape)} {h.dtype}, {len(h.uses)} uses")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return f"<KernelIR {self.kernel} program {self.program}: {len(self.calls)} calls, {len(self.tiles)} tiles>"

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        """Plain lists and dicts (json.dumps takes it); `from_dict` reads it back."""

        def rows(items, names):
            return [[_plain(getattr(x, n)) for n in names] for x in items]

        return {
            "kernel": self.kernel,
            "program": self.program,
            "passes": dict(self.passes),
            "loops": {"fields": list(_LOOP), "rows": rows(self.loops, _LOOP)},
            "tiles": {"fields": list(_TILE), "rows": rows(self.tiles, _TILE)},
            "tensors": {"fields": list(_HBM), "rows": rows(self.tensors, _HBM)},
            "calls": {"fields": list(_CALL), "rows": rows(self.calls, _CALL)},
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict) -> KernelIR:
        ir = cls(d.get("kernel", ""), d.get("program", 0))
        ir.passes = dict(d.get("passes", {}))
        for attr, kind in (("loops", Loop), ("tiles", Tile), ("tensors", HbmTensor), ("calls", Call)):
            part = d[attr]
            names = part["fields"]
            tuples = _TUPLES.get(kind, ())
            for r in part["rows"]:
                kw = dict(zip(names, r))
                for n in tuples:
                    if n in kw:
                        kw[n] = _tuple(kw[n])
                if kind is Tile:
                    for n in ("out", "at"):
                        if n in kw:
                            kw[n] = [tuple(x) for x in kw[n]]
                if kind is Call and "notes" in kw:
                    kw["notes"] = {k: _tuple(v) for k, v in kw["notes"].items()}
                getattr(ir, attr).append(kind(**kw))
        return ir

    def __eq__(self, other) -> bool:
        return isinstance(other, KernelIR) and self.to_dict() == other.to_dict()


_LOOP = ("id", "kind", "var", "line", "device")
_TILE = ("ordinal", "buffer", "shape", "dtype", "row_bytes", "placed", "label", "born", "uses", "pinned", "out", "at")
_HBM = ("ordinal", "name", "shape", "dtype", "nbytes", "uses")
_CALL = (
    "ordinal",
    "op",
    "engine",
    "line",
    "nest",
    "reads",
    "writes",
    "hbm_reads",
    "hbm_writes",
    "instr",
    "segment",
    "added_by",
    "notes",
)
#: fields held as tuples (JSON gives lists back)
_TUPLES = {
    Tile: ("shape",),
    HbmTensor: ("shape",),
    Call: ("nest", "reads", "writes", "hbm_reads", "hbm_writes"),
}


def _plain(v):
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, list):
        return list(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _note_text(v) -> str:
    """A pass's decision as the dump shows it: `engine_choice`'s ((index, engine), ...) as the
    engines; anything else as it is."""
    if isinstance(v, tuple) and v and all(isinstance(x, tuple) and len(x) == 2 for x in v):
        return "/".join(str(e) for _, e in v)
    return str(v)


def _tuple(v):
    return tuple(_tuple(x) for x in v) if isinstance(v, list) else v
