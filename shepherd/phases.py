"""Shepherd's public phases of a training job (design.md, "Public phases").

A phase is Shepherd's view of the job; the platform's ``JOB_STATE_*`` is shown alongside it
and never confused with it (see :mod:`shepherd.states`).
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    #: Accepted by Shepherd; the spec is being validated and the shape resolved.
    PENDING = "PENDING"
    #: The trainer job exists on the platform and waits for capacity.
    QUEUED = "QUEUED"
    #: Capacity granted; the platform is starting the trainer.
    SCHEDULING = "SCHEDULING"
    #: The trainer runs; its route is being warmed up and a checkpoint loaded where needed.
    PREPARING = "PREPARING"
    #: Optimizer steps are being applied.
    TRAINING = "TRAINING"
    #: A checkpoint is being written (and evaluated, to track the best).
    CHECKPOINTING = "CHECKPOINTING"
    #: The final evaluation on the held-out split.
    EVALUATING = "EVALUATING"
    #: The chosen checkpoint is being promoted to a model.
    EXPORTING = "EXPORTING"
    #: Done: trained, evaluated, promoted (as asked) and the trainer deleted.
    COMPLETED = "COMPLETED"
    #: Paused by a user: checkpointed, no trainer held, waiting for resume.
    PAUSED = "PAUSED"
    #: The trainer died (preemption, crash); reconnecting and reloading the last checkpoint.
    RECOVERING = "RECOVERING"
    #: Ended by an error (its type and message are in the status).
    FAILED = "FAILED"
    #: Ended by a cancel request; the trainer was deleted, checkpoints kept.
    CANCELLED = "CANCELLED"
    #: Ended because the preemption budget ran out; retryable from the last checkpoint.
    PREEMPTED = "PREEMPTED"
    #: Stopped from outside (Temporal's terminate): the workflow never ran its cleanup, so
    #: its trainer may still be live. The workflow never sets it; the status, list and
    #: cancel read it from Temporal's outcome of the run.
    TERMINATED = "TERMINATED"

    def is_terminal(self) -> bool:
        return self in TERMINAL_PHASES

    def holds_trainer(self) -> bool:
        """A trainer is (being) provisioned in this phase."""
        return self in (
            Phase.QUEUED,
            Phase.SCHEDULING,
            Phase.PREPARING,
            Phase.TRAINING,
            Phase.CHECKPOINTING,
            Phase.EVALUATING,
            Phase.RECOVERING,
        )


TERMINAL_PHASES = frozenset(
    {Phase.COMPLETED, Phase.FAILED, Phase.CANCELLED, Phase.PREEMPTED, Phase.TERMINATED}
)
