"""What runs while the job holds a trainer: one interface, two kinds of work.

The lifecycle (workflows/job.py) provisions a trainer, recovers it, pauses and cancels the
job the same way whatever runs on it; what varies is behind :class:`TrainerWork`, chosen by
the spec (``training.loop`` or ``training.program``) and built once per run:

* :class:`~workflows.loop_training.LoopTraining` — a registered loop, trained in chunks of
  steps by activities; Shepherd's checkpoints every N steps; evaluation at the end;
* :class:`~workflows.program_training.ProgramTraining` — an unmodified Tinker program, run
  once behind its data-plane proxy, handed each trainer that comes up.

A third kind (an evaluation-only job, say) is one more module implementing this.

The contract, in the order the lifecycle calls it:

``prepare``  — the trainer just turned RUNNING (PREPARING): make it ready for the work (open
               the model, or warm the route up for the program's proxy); sets ``serving``.
               ``booting``: started at its placement instead, beside the wait for RUNNING
               (its activity takes the boot's 404s for what they are).
``train``    — TRAINING until the work is done. Raises :class:`~workflows.flow.Lost` when
               the trainer stops serving (the lifecycle recovers and calls ``train`` again),
               :class:`~workflows.flow.PauseNow` for a pause (it pauses, then the same).
``checkpoint_for_pause`` — a checkpoint of the work now, before the trainer is let go (None:
               none could be taken; the lifecycle resumes from the last one).
``finish``   — the work completed: what it still owes before the trainer goes (a final
               evaluation).
``stop``     — the job ends without completing: stop the work before its trainer is deleted.
``keep``     — checkpoints pruning must keep for the work's sake.
``carry``    — what the work carries across continue-as-new (None: nothing).
``reattach`` — the first thing a run continued from another does: take over what the work
               left running (a program on its worker), without waiting for it.

Deterministic code only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from shepherd.models import CheckpointRecord, ProgramCarry
    from workflows.context import JobContext


class TrainerWork(Protocol):
    async def prepare(self, ctx: JobContext, *, booting: bool = False) -> None: ...

    async def train(self, ctx: JobContext) -> None: ...

    async def checkpoint_for_pause(self, ctx: JobContext) -> CheckpointRecord | None: ...

    async def finish(self, ctx: JobContext) -> None: ...

    async def stop(self, ctx: JobContext) -> None: ...

    def keep(self) -> set[str]: ...

    def carry(self) -> ProgramCarry | None: ...

    def reattach(self, ctx: JobContext) -> None: ...
