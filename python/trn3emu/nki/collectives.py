"""`nki.collectives`: all_reduce, all_gather, reduce_scatter, all_to_all and collective_permute
across the ranks of a kernel launch, lowered to the emulator's collective instructions
(docs/multicore.md, docs/ultraserver.md). In a plain launch a rank is the kernel's program id
(program k runs on core k); in an SPMD launch across chips (`trn3emu.nki.spmd`) a rank is a
logical core of the world, placed on physical cores `rank * lnc + program_id` (chip = core // 8),
and each program id of a rank takes part in its own collective with the same program id of the
other ranks. Each rank-list of the ReplicaGroup runs its own collective. The implicit ring
permutes are a collective_permute around the rank-list; all_to_all_v reads its metadata at run
time; all_gather_v lowers to all_to_all_v (equal slots or run-time receive displacements).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import numpy as np

from ..errors import OperandError, ShapeError
from . import isa as _isa
from . import language as nl
from ._kernel import current, missing_attribute


class rg_partition_op(enum.Enum):  # noqa: N801 - NKI's spelling
    """How `ReplicaGroup.from_partition_op` maps a rank to its rank-list id."""

    bitwise_and = "bitwise_and"
    div = "div"
    mod = "mod"


class ReplicaGroup:
    """The set of ranks a collective runs on, as a list of disjoint rank-lists."""

    def __init__(self, groups: Sequence[Sequence[int]]) -> None:
        self.groups = [[int(r) for r in g] for g in groups]
        seen = [r for g in self.groups for r in g]
        if len(seen) != len(set(seen)):
            raise OperandError(
                f"ReplicaGroup {self.groups}: a rank appears in more than one rank-list",
                rule="nki_replica_group_overlap",
            )

    @staticmethod
    def from_partition_op(world_size: int, op: rg_partition_op, operand: int) -> ReplicaGroup:
        """Ranks 0..world_size sharing `op(rank, operand)` form one rank-list."""
        key = {
            rg_partition_op.bitwise_and: lambda r: r & operand,
            rg_partition_op.div: lambda r: r // operand,
            rg_partition_op.mod: lambda r: r % operand,
        }[rg_partition_op(op)]
        lists: dict[int, list[int]] = {}
        for r in range(int(world_size)):
            lists.setdefault(key(r), []).append(r)
        return ReplicaGroup(list(lists.values()))

    def __repr__(self) -> str:
        return f"ReplicaGroup({self.groups})"


def rank_id() -> int:
    """The rank of the program being traced: its program id, or its rank in an SPMD launch."""
    ctx = current()
    rank = getattr(ctx.launch, "rank", None)
    return ctx.pid if rank is None else int(rank)


def _world() -> int:
    """Ranks of the launch."""
    launch = current().launch
    world = getattr(launch, "world", None)
    if world is not None:
        return int(world)
    n = 1
    for g in launch.grid:
        n *= int(g)
    return n


def _phys(ranks: list[int]) -> list[int]:
    """The cores (global ids chip * 8 + core) of `ranks` for this program's collective."""
    ctx = current()
    place = getattr(ctx.launch, "rank_core", None)
    return ranks if place is None else [int(place(r, ctx.pid)) for r in ranks]


def _ranks(replica_group) -> list[int]:
    """This rank's rank-list of the replica group."""
    groups = replica_group.groups if isinstance(replica_group, ReplicaGroup) else [list(g) for g in replica_group]
    me = rank_id()
    for g in groups:
        if me in g:
            return [int(r) for r in g]
    raise OperandError(
        f"rank {me} is in no rank-list of {groups}", operand="replica_group", rule="nki_replica_group_missing_rank"
    )


def _cores(replica_group) -> list[int]:
    return _phys(_ranks(replica_group))


def _pairs(srcs, dsts) -> list:
    srcs = list(srcs) if isinstance(srcs, (list, tuple)) else [srcs]
    dsts = list(dsts) if isinstance(dsts, (list, tuple)) else [dsts]
    if len(srcs) != len(dsts):
        raise ShapeError(f"{len(srcs)} srcs but {len(dsts)} dsts", operand="dsts", rule="nki_collective_pairs")
    return list(zip(srcs, dsts, strict=True))


def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None):
    """Every rank of its rank-list gets op-reduced srcs (fixed rank-order fold, fp32)."""
    cores = _cores(replica_group)
    return [_isa.all_reduce(dst=d, src=s, cores=cores, reduce_op=op) for s, d in _pairs(srcs, dsts)]


def _dim(collective_dim, t) -> int:
    """`collective_dim` as an axis of `t` (negative counts from the end)."""
    d = int(collective_dim)
    if not -len(t.shape) <= d < len(t.shape):
        raise OperandError(
            f"collective_dim {collective_dim} is not an axis of a {len(t.shape)}-D tensor {tuple(t.shape)}",
            operand="collective_dim",
            rule="nki_collective_dim",
        )
    return d % len(t.shape)


def _split(t, dim: int, n: int, what: str) -> list:
    """The n equal chunks of `t` along `dim` (views)."""
    size = t.shape[dim]
    if size % n:
        raise ShapeError(
            f"{what}: dim {dim} of {tuple(t.shape)} does not split into {n} chunks (one per rank)",
            operand="collective_dim",
            rule="nki_collective_split",
        )
    c = size // n
    return [
        t[tuple(slice(r * c, (r + 1) * c) if i == dim else slice(None) for i in range(len(t.shape)))] for r in range(n)
    ]


def _stacked(shape, dtype, n: int):
    """A private HBM tensor of n chunks of `shape` stacked along dim 0 (the collective
    instructions concatenate and split along dim 0), and its n chunk views."""
    buf = nl.ndarray((n * shape[0],) + tuple(shape[1:]), dtype, buffer=nl.private_hbm)
    return buf, [buf[r * shape[0] : (r + 1) * shape[0]] for r in range(n)]


def all_gather(srcs, dsts, replica_group, collective_dim=0, priority=None, name=None):
    """Every rank gets the concatenation along `collective_dim` of all ranks' srcs, in rank order
    (along a dim other than 0: gathered along dim 0 into private HBM, then one DMA per rank's
    chunk into its place)."""
    cores = _cores(replica_group)
    out = []
    for s, d in _pairs(srcs, dsts):
        dim = _dim(collective_dim, d)
        if dim == 0:
            out.append(_isa.all_gather(dst=d, src=s, cores=cores))
            continue
        buf, parts = _stacked(s.shape, s.dtype, len(cores))
        out.append(_isa.all_gather(dst=buf, src=s, cores=cores))
        for part, place in zip(parts, _split(d, dim, len(cores), "all_gather"), strict=True):
            _isa.dma_copy(dst=place, src=part)
    return out


def reduce_scatter(srcs, dsts, replica_group, collective_dim=0, op=None, priority=None, name=None):
    """Rank i gets chunk i along `collective_dim` of the op-reduced srcs (along a dim other than
    0: the chunks are first stacked along dim 0 in private HBM). `reduce_scatter(s, d, g, op)`
    (the op fourth, as before NKI 0.6) still works."""
    if op is None and not isinstance(collective_dim, (int, np.integer)):
        collective_dim, op = 0, collective_dim
    cores = _cores(replica_group)
    out = []
    for s, d in _pairs(srcs, dsts):
        dim = _dim(collective_dim, s)
        if dim == 0:
            out.append(_isa.reduce_scatter(dst=d, src=s, cores=cores, reduce_op=op))
            continue
        chunks = _split(s, dim, len(cores), "reduce_scatter")
        buf, parts = _stacked(chunks[0].shape, s.dtype, len(cores))
        for part, chunk in zip(parts, chunks, strict=True):
            _isa.dma_copy(dst=part, src=chunk)
        out.append(_isa.reduce_scatter(dst=d, src=buf, cores=cores, reduce_op=op))
    return out


def all_to_all(srcs, dsts, replica_group, collective_dim=0, priority=None, name=None):
    """Rank i's dst = concat along `collective_dim` over ranks j of chunk i (along the same dim)
    of rank j's src (along a dim other than 0: chunks stacked along dim 0 in private HBM on both
    sides)."""
    cores = _cores(replica_group)
    n = len(cores)
    out = []
    for s, d in _pairs(srcs, dsts):
        dim = _dim(collective_dim, s)
        if s.shape[dim] % n or tuple(d.shape) != tuple(s.shape):
            raise ShapeError(
                f"all_to_all: src {tuple(s.shape)} must split into {n} chunks along dim {dim} and match dst "
                f"{tuple(d.shape)}",
                rule="nki_all_to_all_shape",
            )
        if dim == 0:
            out.append(_isa.all_to_all(dst=d, src=s, cores=cores))
            continue
        chunks = _split(s, dim, n, "all_to_all")
        sbuf_, sparts = _stacked(chunks[0].shape, s.dtype, n)
        dbuf, dparts = _stacked(chunks[0].shape, s.dtype, n)
        for part, chunk in zip(sparts, chunks, strict=True):
            _isa.dma_copy(dst=part, src=chunk)
        out.append(_isa.all_to_all(dst=dbuf, src=sbuf_, cores=cores))
        for part, place in zip(dparts, _split(d, dim, n, "all_to_all"), strict=True):
            _isa.dma_copy(dst=place, src=part)
    return out


def all_to_all_v(
    srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False, priority=None, name=None
):
    """Flat-buffer all_to_all with counts and displacements read at run time from
    `metadata_tensor` ((2..4, N) uint32: send counts, send displacements, receive counts,
    receive displacements, in elements); received blocks are packed in rank order unless
    `has_rdispls`."""
    cores = _cores(replica_group)
    return [
        _isa.all_to_all_v(
            dst=d,
            src=s,
            metadata=metadata_tensor,
            cores=cores,
            recv_counts_known=bool(recv_counts_known),
            has_rdispls=bool(has_rdispls),
        )
        for s, d in _pairs(srcs, dsts)
    ]


def all_gather_v(
    srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False, priority=None, name=None
):
    """Variable-length all_gather of flat element buffers (NKI 0.6.0): each rank broadcasts
    src[send_displ : send_displ + send_count] (metadata rows 0 / 1, first column only) to every
    rank of its rank-list; sender s's chunk lands at dst[s * slot :] (slot = dst elements / ranks)
    or at recv_displs[s] (row 3, `has_rdispls`). Unless `recv_counts_known`, row 2 receives the
    count from each rank. Lowered to `all_to_all_v` with a per-rank private metadata tensor (rows
    0 / 1 broadcast to every column, row 3 the displacements) and, for row 2, an all_gather of
    the send counts."""
    cores = _cores(replica_group)
    n = len(cores)
    pairs = _pairs(srcs, dsts)
    if len(pairs) != 1:
        raise ShapeError(
            f"all_gather_v takes exactly one src and one dst, got {len(pairs)}",
            operand="srcs",
            rule="nki_collective_pairs",
        )
    (s, d), meta = pairs[0], metadata_tensor
    rows = 4 if has_rdispls else 3
    if meta.ndim == 3:  # SBUF (1, rows, N): the whole buffer on one partition
        meta = meta.reshape((meta.shape[1], meta.shape[2]))
    if tuple(meta.shape) != (rows, n):
        raise ShapeError(
            f"all_gather_v: metadata_tensor {tuple(metadata_tensor.shape)} must be ({rows}, {n}) "
            f"(rows: send count, send displacement, receive counts{', receive displacements' if has_rdispls else ''}; "
            f"one column per rank of the rank-list)",
            operand="metadata_tensor",
            rule="nki_all_gather_v_metadata",
        )
    m = nl.ndarray((4, n), nl.uint32, buffer=nl.private_hbm)
    for c in range(n):  # rows 0 / 1: the single send count and displacement, for every destination
        _isa.dma_copy(dst=m[0:2, c : c + 1], src=meta[0:2, 0:1])
    if has_rdispls:
        _isa.dma_copy(dst=m[3:4, :], src=meta[3:4, :])
    else:  # equal slots, one per sender
        slot = int(np.prod(d.shape)) // n
        _isa.dma_copy(dst=m[3:4, :], src=nl.shared_constant(np.arange(n, dtype=np.uint32).reshape(1, n) * slot))
    out = [_isa.all_to_all_v(dst=d, src=s, metadata=m, cores=cores, recv_counts_known=False, has_rdispls=True)]
    if not recv_counts_known:  # row 2 <- each sender's count
        counts = nl.ndarray((n, 1), nl.uint32, buffer=nl.private_hbm)
        out.append(_isa.all_gather(dst=counts, src=meta[0:1, 0:1], cores=cores))
        _isa.dma_copy(dst=meta[2:3, :], src=counts.reshape((1, n)))
    return out


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None):
    """Each (source, target) pair of ranks sends source's src to target's dst; every rank of the
    launch takes part (ranks that receive nothing keep their dst)."""
    n = _world()
    pairs = [(int(a), int(b)) for a, b in source_target_pairs]
    if len({t for _, t in pairs}) != len(pairs):
        raise OperandError(
            f"collective_permute: a rank receives from two sources in {pairs}",
            operand="source_target_pairs",
            rule="nki_permute_two_sources",
        )
    cores = _phys(list(range(n)))
    flat = [v for a, b in pairs for v in (a, b)]
    return [_isa.collective_permute(dst=d, src=s, cores=cores, pairs=flat) for s, d in _pairs(srcs, dsts)]


def collective_permute_implicit(srcs_by_channel, dsts_by_channel, replica_group, channel_ids=(0,), name=None):
    """Ring permute: each rank of its rank-list receives its predecessor's src (channels are
    independent transfers)."""
    ranks = _ranks(replica_group)
    cores = _phys(ranks)
    n = len(ranks)
    ring = [v for i in range(n) for v in (i, (i + 1) % n)]
    out = []
    for srcs, dsts in zip(srcs_by_channel, dsts_by_channel, strict=True):
        for s, d in _pairs(srcs, dsts):
            out.append(_isa.collective_permute(dst=d, src=s, cores=cores, pairs=ring))
    return out


def collective_permute_implicit_reduce(
    srcs0_by_channel, srcs1_by_channel, dsts_by_channel, replica_group, op, channel_ids=(0,), name=None
):
    """op(srcs0, srcs1) on each rank (an SBUF tile), then the ring permute of the results."""
    fn = getattr(nl, _isa.op_name(op))
    reduced = [[fn(a, b) for a, b in zip(s0, s1, strict=True)] for s0, s1 in zip(srcs0_by_channel, srcs1_by_channel)]
    return collective_permute_implicit(reduced, dsts_by_channel, replica_group, channel_ids, name)


def collective_permute_implicit_current_processing_rank_id(iteration_id, replica_group, channel_id=0, name=None):
    """A register holding the rank whose data a ring step `iteration_id` processes: this rank at
    iteration 0, then its predecessors around the ring (known while tracing)."""
    ranks = _ranks(replica_group)
    i = ranks.index(rank_id())
    return _isa.register_alloc(ranks[(i - int(iteration_id)) % len(ranks)])


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing_attribute(f"nki.collectives.{name}", list(globals()))  # (a misspelt name: "did you mean")
