"""SPMD launches of an NKI kernel across the chips of an UltraServer.

    outs = trn3emu.nki.spmd(kernel, world_size=W, lnc=2)(per_rank_args)

runs `kernel` once per rank r in 0..W with `per_rank_args[r]` (a tuple of arguments, or one array)
and returns the W results. Rank r is a logical NeuronCore of `lnc` physical cores: its programs
`nl.program_id(0)` = 0..lnc-1 run on global cores `r * lnc + program_id` (chip = core // 8), so
the world needs ceil(W * lnc / 8) chips. Inside the kernel `nki.collectives.rank_id()` is r and a
`ReplicaGroup` lists ranks; each program id of a rank meets the same program id of the other
ranks (docs/ultraserver.md). Everything runs as one `UltraServer.run`.
"""

from __future__ import annotations

from typing import Any

from .. import interop
from ..device import Device
from ..errors import ArgumentTypeError, OperandError
from ..ultra import MAX_CHIPS, UltraResult, UltraServer
from . import _traceback
from ._kernel import Kernel, _host_arrays, _PlacementConflict, _Run, _Synced


class _RankRun(_Run):
    """One rank's launch: grid (lnc,), traced on its chip's device from core `core_base`."""

    def __init__(self, kernel: Kernel, lnc: int, rank: int, world: int, device: Device) -> None:
        super().__init__(kernel, (lnc,))
        self.device = device
        self.rank, self.world, self.lnc = rank, world, lnc
        self.core_base = (rank * lnc) % Device.NUM_CORES

    def rank_core(self, rank: int, pid: int) -> int:
        return int(rank) * self.lnc + int(pid)


class _Placed:
    """A traced program placed on its chip (what `UltraServer.run` takes)."""

    def __init__(self, synced: _Synced, chip: int) -> None:
        self.synced, self.chip = synced, chip

    def native(self):
        return self.synced.native()


class Spmd:
    """`spmd(kernel, world_size, lnc)`: call with the per-rank arguments."""

    def __init__(self, kernel, world_size: int, lnc: int = 1, ultraserver: UltraServer | None = None) -> None:
        if not isinstance(kernel, Kernel):
            from ._kernel import jit

            kernel = jit(kernel)
        if int(lnc) not in (1, 2):
            raise OperandError(f"lnc must be 1 or 2, not {lnc}", operand="lnc", rule="nki_spmd_world")
        world, lnc = int(world_size), int(lnc)
        chips = -(-world * lnc // Device.NUM_CORES)
        if world < 1 or chips > MAX_CHIPS:
            raise OperandError(
                f"world_size {world_size} x lnc {lnc} needs {chips} chips (an UltraServer has 1..{MAX_CHIPS})",
                operand="world_size",
                rule="nki_spmd_world",
            )
        if ultraserver is not None and len(ultraserver) < chips:
            raise OperandError(
                f"world_size {world} x lnc {lnc} needs {chips} chips, the UltraServer has {len(ultraserver)}",
                operand="ultraserver",
                rule="nki_spmd_world",
            )
        self.kernel, self.world, self.lnc, self.chips = kernel, world, lnc, chips
        self.ultraserver = ultraserver
        #: The last call's `UltraResult` (traces of every chip, fabric activity).
        self.last_result: UltraResult | None = None

    def __call__(self, per_rank_args, **kwargs) -> list[Any]:
        __tracebackhide__ = True  # noqa: F841 (pytest: the launch frame is not the kernel's)
        try:
            return self._call(per_rank_args, **kwargs)
        except Exception as e:
            # the same error: kernel frames only, printed once (`_traceback.present`)
            raise _traceback.present(e, self.kernel)  # noqa: B904

    def run_pairs(self, per_rank: list) -> list[Any]:
        """Rank r runs `kernel(*args, **kwargs)` with `per_rank[r] = (args, kwargs)` (per-rank keyword
        arguments: `nki.multi_rank_simulate`); the ranks' results in rank order."""
        __tracebackhide__ = True  # noqa: F841
        try:
            return self._run(per_rank)
        except Exception as e:
            raise _traceback.present(e, self.kernel)  # noqa: B904

    def _call(self, per_rank_args, **kwargs) -> list[Any]:
        try:
            per_rank = list(per_rank_args)
        except TypeError:
            raise ArgumentTypeError(
                f"spmd: per_rank_args is a list of one argument tuple per rank, got {type(per_rank_args).__name__}",
                operand="per_rank_args",
                rule="nki_spmd_args",
            ) from None
        if len(per_rank) != self.world:
            raise OperandError(
                f"spmd: {len(per_rank)} argument sets for a world of {self.world} ranks",
                operand="per_rank_args",
                rule="nki_spmd_world",
            )
        return self._run([(a if isinstance(a, tuple) else (a,), kwargs) for a in per_rank])

    def _run(self, per_rank: list) -> list[Any]:
        """Run rank r with `per_rank[r]`, an (args tuple, kwargs dict) pair; the ranks' results."""
        from .. import testing

        us = self.ultraserver or UltraServer(chips=self.chips)
        fill = self.kernel.options.get("fill", testing.default_fill())
        if fill is not None:  # uninitialised on-chip bytes as in a plain launch (NaN by default)
            for c in range(self.chips):
                us.chip(c).fill_onchip(fill)
        runs, placed, frameworks = [], [], []
        for r, (args, kwargs) in enumerate(per_rank):
            chip = (r * self.lnc) // Device.NUM_CORES
            run = _RankRun(self.kernel, self.lnc, r, self.world, us.chip(chip))
            originals: list = []
            copies: list = []  # (tensor off the host, its host copy, snapshot): written back if changed
            host_args, host_kwargs = _host_arrays(self.kernel, args, kwargs, originals, copies)
            try:
                arrays, traced = run._trace(host_args, host_kwargs)
            except _PlacementConflict as c:  # (the chip's HBM is shared: no second trace here)
                raise c.error(why="an SPMD launch is traced once, so its tiles cannot move") from None
            for p in traced.programs:
                p.chip = chip
                placed.append(_Placed(_Synced(p), chip))
            runs.append((run, arrays, traced, copies))
            frameworks.append(interop.common(originals))
        trace = self.kernel.options.get("trace", True)
        self.last_result = us.run(placed, check_races=True, trace=trace)
        outs = []
        for (run, arrays, traced, copies), fw in zip(runs, frameworks, strict=True):
            dev = run.device
            for a, t in arrays:  # inputs the kernel wrote to: copied back, as on the device
                if a.flags.writeable and a.ndim and not dev.hbm.holds(t, a):
                    a[...] = dev.hbm.get(t)
            outs.append(interop.send_home(run._out(traced.result, fw), copies))
        return outs


def spmd(kernel, world_size: int, lnc: int = 1, ultraserver: UltraServer | None = None) -> Spmd:
    """Launch `kernel` over a world of `world_size` ranks of `lnc` cores each, across as many
    chips as they need (or on `ultraserver`): `spmd(kernel, world_size=W, lnc=2)(per_rank_args)`
    returns the W ranks' results (module docs)."""
    return Spmd(kernel, world_size, lnc, ultraserver)
