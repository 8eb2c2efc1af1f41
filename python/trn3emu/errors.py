"""The trn3emu exception hierarchy. Every error the emulator raises derives from `EmuError`.

Attributes on every instance: `instruction_index` and `instruction` (the failing instruction's
index and text, when there is one), `operand` (the operand's name) and `rule`: the stable
snake_case id of the broken rule (listed in docs/errors.md; match on it, not on the message,
which says the rule in prose).
"""

from __future__ import annotations

import re

_RULE_ID = re.compile(r"[a-z][a-z0-9_]*")


class EmuError(Exception):
    """Base class of every trn3emu error."""

    def __init__(
        self,
        message: str,
        instruction_index: int | None = None,
        instruction: str | None = None,
        operand: str | None = None,
        rule: str | None = None,
    ) -> None:
        super().__init__(message)
        self.instruction_index = instruction_index
        self.instruction = instruction
        self.operand = operand
        if rule is None or not _RULE_ID.fullmatch(rule):
            raise TypeError(f"{type(self).__name__} needs a snake_case rule id, got {rule!r}")
        self.rule = rule


class ValidationError(EmuError, ValueError):
    """An instruction or operand breaks a rule of the ISA (caught at assembly or decode)."""


class ShapeError(ValidationError):
    """Operand shapes disagree or exceed an instruction's limits."""


class DtypeError(ValidationError, TypeError):
    """A dtype the instruction or operand does not allow."""


class MemorySpaceError(ValidationError):
    """A memory space the instruction, operand or engine cannot use."""


class AddressError(ValidationError, IndexError):
    """An address, partition or byte range outside its memory."""


class PartitionError(ValidationError):
    """The start-partition (quadrant) rule."""


class PsumBankError(ValidationError):
    """A PSUM access crossing a 2 KiB bank where it must not."""


class CapacityError(ValidationError):
    """SBUF, PSUM or HBM capacity exhausted by an allocation."""


class OperandError(ValidationError):
    """An invalid operand value: enum, immediate, flag combination, engine choice."""


class ArgumentTypeError(OperandError, TypeError):
    """An argument of the wrong Python type (a float where an integer is needed, a non-string name,
    something other than a Program to run)."""


class SemaphoreError(ValidationError):
    """Semaphore misuse (id out of range, reserved semaphore)."""


class EncodingError(EmuError, ValueError):
    """Malformed program text or binary."""


class DecodeError(EncodingError):
    """Malformed binary encoding."""


class AsmSyntaxError(EncodingError):
    """Malformed text assembly."""


class NotSupportedError(EmuError, NotImplementedError):
    """An NKI API (or a form of one) that the trn3emu.nki front end does not support yet."""


class ExecutionError(EmuError, RuntimeError):
    """A program failed while running."""


class RaceError(ExecutionError):
    """Two unsynchronised streams touched the same bytes, at least one writing."""


class DeadlockError(ExecutionError):
    """Every remaining stream waits on a semaphore that nothing will signal."""


class RunawayError(ExecutionError):
    """A run executed more instructions and transfers than the device allows (a runaway loop)."""


class ResourceError(ExecutionError, MemoryError):
    """The host cannot allocate the memory an operation needs (a huge HBM read, a DMA naming
    billions of elements): raised instead of aborting the process. The device stays usable."""


class InternalError(EmuError, RuntimeError):
    """A bug in the emulator (a caught panic). Please report it."""


class AccumulateWarning(UserWarning):
    """An `nc_matmul` with accumulate=None whose PSUM dst is partly matmul-written (e.g. overlapping
    conv-pattern tiles). The emulator decides per element (add on the overlap, overwrite elsewhere);
    hardware has one accumulate flag per instruction, so such a kernel can fail there. Pass
    accumulate=True/False, or split the matmul, to be portable."""


class IdenticalWritesWarning(UserWarning):
    """Two cores wrote the same HBM bytes with nothing ordering the writes, and the bytes written
    were identical (SPMD programs that ignore `program_id`, e.g. `kernel[2]` both storing one
    output): benign on hardware, where every order leaves the same result. Reported instead of a
    race by `Device.run(identical_writes=True)` (NKI launches: the default; docs/nki.md)."""


class ReadOnlyInputWarning(UserWarning):
    """An NKI kernel wrote one of its inputs, but the caller's array cannot take the result back
    (a JAX array, a read-only numpy array): the write is not copied back. Make it an error with
    `warnings.simplefilter("error", ReadOnlyInputWarning)` (docs/nki.md)."""


__all__ = [name for name, obj in list(globals().items()) if isinstance(obj, type) and issubclass(obj, EmuError)]
