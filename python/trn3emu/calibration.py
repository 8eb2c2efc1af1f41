"""The cost model checked against the published Trainium measurements (the anchors of
docs/cost-model.md, "Validation"): each anchor rebuilt as a program or kernel, run on a device
with the anchor's generation constants (`Device(timing=...)`), its modelled value next to the
published one.

    python -m trn3emu.calibration                 # print the table
    python -m trn3emu.calibration --write-docs    # ... and rewrite it in docs/cost-model.md
    python -m trn3emu.calibration --no-tutorial   # instruction-level anchors only (seconds)

The four matmul-tutorial kernels run at the published shape ([4096, 8192] @ [8192, 8192] bf16,
one trn1 NeuronCore); they take about a minute together.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from . import Device, Program
from .trace import DMA_CURVE  # (defined where the trace analysis uses it)

BF16 = ml_dtypes.bfloat16
F32 = np.float32


@dataclass
class Row:
    """One line of the validation table."""

    anchor: str
    gen: str
    what: str
    published: float
    modelled: float
    unit: str
    #: "ratio" (modelled / published within `tol`), "points" (absolute difference in % points) or
    #: "at_least" (modelled >= `tol`, a one-sided target such as the tutorial's >= 6x speed-up).
    kind: str
    tol: float

    @property
    def ratio(self) -> float:
        return self.modelled / self.published if self.published else float("nan")

    @property
    def ok(self) -> bool:
        if self.kind == "points":
            return abs(self.modelled - self.published) <= self.tol
        if self.kind == "at_least":
            return self.modelled >= self.tol
        return abs(self.ratio - 1.0) <= self.tol


# ------------------------------------------------------------------------ instruction level
_DEVICES: dict[str, Device] = {}


def _device(timing: str) -> Device:
    """One device per timing, reused (a Device holds 8 cores of SBUF; anchors free their HBM)."""
    if timing not in _DEVICES:
        _DEVICES[timing] = Device(timing=timing)
    return _DEVICES[timing]


def _starts(res, engine: str) -> np.ndarray:
    ins = res.trace.instructions
    return np.sort(ins["start_ns"][ins["engine"] == engine])


def dma_one_engine_ns(timing: str = "trn2") -> float:
    """I1: one dma_copy of A[4, 4096] bf16 HBM -> SBUF; time its one DMA engine is busy."""
    dev = _device(timing)
    a = dev.hbm.put(np.ones((4, 4096), BF16))
    p = Program()
    t = p.sbuf((4, 4096), BF16)
    p.dma_copy(dst=t, src=a)
    spans = dev.run(p).trace.dma_engines
    dev.hbm.free(a)
    assert len(spans) == 1, spans
    return float(spans["end_ns"][0] - spans["start_ns"][0])


def dma_efficiency(bytes_per_partition: int, timing: str = "trn2", count: int = 8, large: int = 16384) -> float:
    """I2: DMA throughput of a stream of [128, B] HBM -> SBUF transfers on one queue, relative
    to the throughput of large (16 KiB per partition) transfers, in %."""

    def per_transfer_ns(b: int) -> float:
        dev = _device(timing)
        n = b // 2
        src = dev.hbm.alloc((128, n * count), BF16)
        p = Program()
        tiles = [p.sbuf((128, n), BF16) for _ in range(2)]
        for i in range(count):
            p.dma_copy(dst=tiles[i % 2], src=src[:, i * n : (i + 1) * n])
        d = dev.run(p, check_races=False).trace.dma
        dev.hbm.free(src)
        ends = np.sort(d["end_ns"])
        return float((ends[-1] - ends[0]) / (count - 1))

    return 100.0 * (bytes_per_partition / per_transfer_ns(bytes_per_partition)) / (large / per_transfer_ns(large))


def dependent_scalar_chain_ns(timing: str = "trn1", n: int = 32) -> float:
    """I3: a chain of dependent 1-element ScalarE instructions; median interval between starts."""
    dev = _device(timing)
    p = Program()
    a, b = p.sbuf((128, 1), F32), p.sbuf((128, 1), F32)
    p.memset(dst=a, value=1.0, engine="vector")
    for i in range(n):
        src, dst = (a, b) if i % 2 == 0 else (b, a)
        p.activation(dst=dst, op="copy", data=src, scale=1.0, bias=0.0, engine="scalar")
    return float(np.median(np.diff(_starts(dev.run(p), "scalar"))))


def matmul_intervals_cycles(timing: str = "trn1", n: int = 16) -> tuple[float, float]:
    """I4: back-to-back matmul interval (TensorE cycles) with a short moving tensor (stationary
    [128, 128], moving [128, 1]) and with a short stationary one ([128, 1] x [128, 128])."""
    out = []
    for st_f, mv_f in ((128, 1), (1, 128)):
        dev = _device(timing)
        p = Program()
        st, mv = p.sbuf((128, st_f), BF16), p.sbuf((128, mv_f), BF16)
        p.memset(dst=st, value=1.0, engine="vector")
        p.memset(dst=mv, value=1.0, engine="vector")
        acc = p.psum((st_f, mv_f), F32)
        for i in range(n):  # the first writes the fresh PSUM tile, the rest accumulate
            p.nc_matmul(dst=acc, stationary=st, moving=mv, accumulate=i > 0)
        ghz = dev_ghz(timing, "tensor_ghz")
        out.append(float(np.median(np.diff(_starts(dev.run(p), "tensor")))) * ghz)
    return out[0], out[1]


def dev_ghz(timing: str, key: str) -> float:
    from ._native import cost_params

    return float(cost_params(timing)[key])


def _vector_chain_cycles(timing: str, dependent: bool, n: int = 16, f: int = 512) -> float:
    dev = _device(timing)
    p = Program()
    tiles = [p.sbuf((128, f), F32) for _ in range(2 if dependent else n + 1)]
    p.memset(dst=tiles[0], value=1.0, engine="vector")
    for i in range(n):
        if dependent:
            src, dst = tiles[i % 2], tiles[(i + 1) % 2]
        else:
            src, dst = tiles[0], tiles[i + 1]
        p.tensor_scalar(dst=dst, data=src, op0="add", operand0=1.0, engine="vector")
    starts = _starts(dev.run(p, check_races=False), "vector")[1:]
    return float(np.median(np.diff(starts))) * dev_ghz(timing, "vector_ghz")


def dependent_overhead_cycles(timing: str = "trn1") -> float:
    """I5: extra VectorE cycles of a dependent back-to-back fp32 tensor_scalar (N = 512) over
    an independent one."""
    return _vector_chain_cycles(timing, True) - _vector_chain_cycles(timing, False)


def hwdge_issue_ns(timing: str = "trn2") -> float:
    """I6: time the trigger engine spends issuing a hardware-DGE dma_copy."""
    dev = _device(timing)
    a = dev.hbm.put(np.ones((128, 512), BF16))
    p = Program()
    t = p.sbuf((128, 512), BF16)
    p.dma_copy(dst=t, src=a, dge_mode="hwdge", engine="sync")
    ins = dev.run(p).trace.instructions
    dev.hbm.free(a)
    return float(ins["end_ns"][0] - ins["start_ns"][0])


def dynamic_copy_ii_cycles(timing: str = "trn2", n: int = 8) -> float:
    """I7: initiation interval of back-to-back VectorE copies with a runtime (indirect) address."""
    dev = _device(timing)
    p = Program()
    base = p.sbuf((128, 64), F32)
    idx = p.sbuf((128, 8), np.int32)
    p.memset(dst=base, value=1.0, engine="vector")
    p.memset(dst=idx, value=0, engine="vector")
    outs = [p.sbuf((128, 16), F32) for _ in range(n)]
    for o in outs:
        p.tensor_copy(dst=o, src=base.indirect(idx, 16), engine="vector")
    starts = _starts(dev.run(p, check_races=False), "vector")[2:]
    return float(np.median(np.diff(starts))) * dev_ghz(timing, "vector_ghz")


def stride_penalty(timing: str = "trn1", f: int = 2048) -> float:
    """I8: time of an fp32 VectorE copy reading with a 32-byte innermost stride over the same
    copy reading contiguously (published: half bandwidth, i.e. 2x)."""
    times = []
    for step in (1, 8):
        dev = _device(timing)
        p = Program()
        src, dst = p.sbuf((128, f * 8), F32), p.sbuf((128, f), F32)
        p.memset(dst=src, value=1.0, engine="vector")
        p.memset(dst=p.sbuf((128, 1), F32), value=0.0, engine="vector")  # the copy is not dependent
        p.tensor_copy(dst=dst, src=src[:, ::step][:, :f], engine="vector")
        ins = dev.run(p).trace.instructions
        times.append(float(ins["end_ns"][-1] - ins["start_ns"][-1]))
    return times[1] / times[0]


def instruction_rows() -> list[Row]:
    rows = [
        Row(
            "I1",
            "trn2",
            "dma_copy A[4, 4096] bf16 HBM->SBUF, one DMA engine busy",
            1416.0,
            dma_one_engine_ns(),
            "ns",
            "ratio",
            0.10,
        ),
    ]
    for b, pub in DMA_CURVE:
        rows.append(
            Row(
                "I2",
                "trn2",
                f"DMA efficiency, [128, {b} B] per transfer vs large",
                pub,
                dma_efficiency(b),
                "%",
                "points",
                10.0,
            )
        )
    rows.append(
        Row(
            "I3",
            "trn1",
            "dependent 1-element ScalarE chain, interval",
            189.0,
            dependent_scalar_chain_ns(),
            "ns",
            "ratio",
            0.15,
        )
    )
    short_mv, short_st = matmul_intervals_cycles()
    rows.append(
        Row("I4", "trn1", "back-to-back matmul interval, short moving", 64.0, short_mv, "cycles", "ratio", 0.10)
    )
    rows.append(
        Row("I4", "trn1", "back-to-back matmul interval, short stationary", 128.0, short_st, "cycles", "ratio", 0.10)
    )
    rows.append(
        Row(
            "I5",
            "trn1",
            "static overhead of a dependent VectorE instruction",
            100.0,
            dependent_overhead_cycles(),
            "cycles",
            "ratio",
            0.10,
        )
    )
    rows.append(Row("I6", "trn2", "hardware-DGE dma_copy issue", 600.0, hwdge_issue_ns(), "ns", "ratio", 0.10))
    rows.append(
        Row(
            "I7",
            "trn2",
            "dynamic-address VectorE copy, initiation interval",
            600.0,
            dynamic_copy_ii_cycles(),
            "cycles",
            "ratio",
            0.10,
        )
    )
    rows.append(
        Row(
            "I8",
            "trn1",
            "VectorE read with a 32 B innermost stride, time vs contiguous",
            2.0,
            stride_penalty(),
            "x",
            "ratio",
            0.10,
        )
    )
    return rows


# ------------------------------------------------------------------------------- tutorial
#: Published latencies (ms) of the NKI matmul tutorial on trn1, [4096, 8192] @ [8192, 8192] bf16.
TUTORIAL = {"tiled": 51.80, "hoisted": 42.96, "blocked": 22.07, "optimized": 6.97}
TUTORIAL_SHAPE = (8192, 4096, 8192)  # K, M, N


def tutorial_ms(name: str, shape: tuple[int, int, int] = TUTORIAL_SHAPE, timing: str = "trn1") -> float:
    """Modelled latency (ms) of tutorial kernel `name` at `shape` (K, M, N) under `timing`."""
    import os

    from .examples import nki_matmul_tutorial as tut

    k, m, n = shape
    rng = np.random.default_rng(0)
    lhs_t = rng.standard_normal((k, m), dtype=np.float32).astype(BF16)
    rhs = rng.standard_normal((k, n), dtype=np.float32).astype(BF16)
    saved = {v: os.environ.get(v) for v in ("TRN3EMU_TIMING", "TRN3EMU_NKI_CACHE")}
    os.environ["TRN3EMU_TIMING"] = timing
    os.environ["TRN3EMU_NKI_CACHE"] = "0"  # a traced tutorial kernel is large: do not keep it
    kern = tut.KERNELS[name]
    try:
        kern(lhs_t, rhs)
        return kern.last_result.time_ns / 1e6
    finally:
        kern.last_result = kern.last_programs = None  # nor its trace and programs
        for v, val in saved.items():
            if val is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = val


def tutorial_rows(shape: tuple[int, int, int] = TUTORIAL_SHAPE) -> list[Row]:
    rows = []
    for name, pub in TUTORIAL.items():
        rows.append(
            Row(
                "T",
                "trn1",
                f"matmul tutorial `{name}`, [4096, 8192] @ [8192, 8192] bf16",
                pub,
                tutorial_ms(name, shape),
                "ms",
                "ratio",
                0.25,
            )
        )
    t = {r.what.split("`")[1]: r.modelled for r in rows}
    pub = TUTORIAL["tiled"] / TUTORIAL["optimized"]
    rows.append(
        Row(
            "T",
            "trn1",
            "tiled -> optimised speed-up (target >= 6x)",
            pub,
            t["tiled"] / t["optimized"],
            "x",
            "at_least",
            6.0,
        )
    )
    return rows


# ---------------------------------------------------------------------------------- output
def markdown(rows: list[Row]) -> str:
    lines = [
        "| anchor | gen | what | published | modelled | ratio | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        target = f"±{r.tol:g} points" if r.kind == "points" else f"±{r.tol:.0%}"
        if r.kind == "at_least":
            target = f"≥ {r.tol:g}{r.unit}"
        lines.append(
            f"| {r.anchor} | {r.gen} | {r.what} | {r.published:g} {r.unit} | {r.modelled:.4g} {r.unit} | "
            f"{r.ratio:.3f} | {target} | {'yes' if r.ok else 'NO'} |"
        )
    return "\n".join(lines)


BEGIN, END = "<!-- validation-table:begin -->", "<!-- validation-table:end -->"


def write_docs(table: str, path: Path) -> None:
    text = path.read_text()
    block = f"{BEGIN}\n{table}\n{END}"
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _m: block, text, flags=re.S)
    else:
        text += "\n" + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trn3emu.calibration", description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-tutorial", action="store_true", help="instruction-level anchors only")
    ap.add_argument(
        "--write-docs",
        metavar="PATH",
        nargs="?",
        const="docs/cost-model.md",
        help="rewrite the table between the validation-table markers of PATH",
    )
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = instruction_rows()
    if not a.no_tutorial:
        rows += tutorial_rows()
    table = markdown(rows)
    print(table)
    print(f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    if a.write_docs:
        write_docs(table, Path(a.write_docs))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
