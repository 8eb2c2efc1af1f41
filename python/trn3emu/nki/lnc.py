"""`nki.lnc` (NKI 0.8.0, SDK 2.34.0): communication between the two physical NeuronCores that
share an HBM stack (a Logical NeuronCore pair): `core_barrier`, `sendrecv`, `sendrecv_compute`.

The `nki.isa` entry points of the first two are deprecated compatibility wrappers since NKI 0.8.0
(they warn at the kernel's line, `isa.py`); these are the calls new kernels use. `sendrecv` has no
`pipe_id` here (the `nki.isa` one ignores it since 0.8.0). `priority` (0 highest .. 3) is checked
and accepted; the emulated `sendrecv` instruction has no QoS operand, so it does not change the
timeline (docs/nki.md, "nki.lnc"). `sendrecv_compute` is lowered to the exchange into a scratch
tile of `dst`'s shape, then the reduction `dst = reduce_op(src, peer)`: for `add` a DMA-side one
(`dma_compute`: "using the DMA engine's reduction capability"); the emulated DMA reduces by add only,
so `maximum` / `minimum` run as a VectorE `tensor_tensor` (SBUF tiles; timing differs from a fused
transfer, values do not).
"""

from __future__ import annotations

from ..errors import ArgumentTypeError, MemorySpaceError, NotSupportedError, OperandError
from . import isa as nisa
from . import language as nl
from ._kernel import NkiTensor, current

#: the reductions `sendrecv_compute` documents
REDUCE_OPS = ("add", "maximum", "minimum")


def _priority(priority, dma_engine=None) -> None:
    if priority is None:
        return
    if type(priority) is not int or not 0 <= priority <= 3:
        raise OperandError(
            f"nki.lnc: priority is an int from 0 (highest) to 3 (lowest) or None, got {priority!r}",
            operand="priority",
            rule="nki_lnc_priority",
        )
    if nisa._engine_name(dma_engine) == "gpsimd_dma":
        raise OperandError(
            "nki.lnc.sendrecv: dma_engine=gpsimd_dma takes no priority (priority=None)",
            operand="priority",
            rule="nki_lnc_priority",
        )


def core_barrier(data, cores, engine=nisa.engine.gpsimd, name=None):
    """Barrier of the paired cores on the shared-HBM tensor `data` (`cores=(0, 1)`)."""
    return nisa._core_barrier(data=data, cores=cores, engine=engine, name=name)


def sendrecv(src, dst, send_to_rank, recv_from_rank, dma_engine=nisa.dma_engine.dma, name=None, priority=None):
    """Send `src` to the peer's `dst` while receiving the peer's `src` into `dst` (SBUF tiles)."""
    _priority(priority, dma_engine)
    return nisa._sendrecv(
        src=src,
        dst=dst,
        send_to_rank=send_to_rank,
        recv_from_rank=recv_from_rank,
        pipe_id=0,
        dma_engine=dma_engine,
        name=name,
    )


def sendrecv_compute(src, dst, send_to_rank, recv_from_rank, reduce_op, name=None, priority=None):
    """`dst = reduce_op(src, the peer's src)` (add, maximum or minimum), src and dst in one memory."""
    _priority(priority)
    op = nisa.op_name(reduce_op)
    if op not in REDUCE_OPS:
        raise OperandError(
            f"nki.lnc.sendrecv_compute: reduce_op is nl.add, nl.maximum or nl.minimum, got {reduce_op!r}",
            operand="reduce_op",
            rule="nki_lnc_reduce_op",
        )
    if not isinstance(src, NkiTensor) or not isinstance(dst, NkiTensor):
        raise ArgumentTypeError(
            "nki.lnc.sendrecv_compute: src and dst are tensors", operand="src", rule="nki_lnc_operands"
        )
    if src.buffer != dst.buffer:
        raise MemorySpaceError(
            f"nki.lnc.sendrecv_compute: src and dst are in one memory (both SBUF or both private HBM), "
            f"got {src.buffer} and {dst.buffer}",
            operand="dst",
            rule="nki_lnc_operands",
        )
    current()  # (raises outside a trace)
    peer = nl.ndarray(tuple(dst.shape), dtype=dst.dtype, buffer=dst.buffer)
    nisa._sendrecv(src=src, dst=peer, send_to_rank=send_to_rank, recv_from_rank=recv_from_rank, pipe_id=0, name=name)
    if op == "add":
        return nisa.dma_compute(dst=dst, srcs=[src, peer], reduce_op=op, name=name)
    # (the emulated DMA reduces by add only: maximum / minimum on VectorE, SBUF operands)
    if dst.buffer != "sbuf":
        raise NotSupportedError(
            f"nki.lnc.sendrecv_compute with reduce_op={op} on {dst.buffer} tiles (the emulated DMA "
            "reduction adds only; maximum / minimum are computed on VectorE, SBUF tiles only)",
            rule="nki_lnc_reduce_op",
        )
    return nisa.tensor_tensor(dst=dst, data1=src, data2=peer, op=op, engine=nisa.engine.vector, name=name)
