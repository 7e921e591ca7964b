"""The trainer platform's job states (``JOB_STATE_*``), shared by the client, the
workflows, the CLI and ``localplane``.

These are the *platform's* states. Shepherd's own public phases live elsewhere and are
never confused with them.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """State of an RLOR trainer job as the platform reports it (trainer-api.md §3)."""

    #: A state this client does not know (a newer platform); treated as transitional.
    UNSPECIFIED = "JOB_STATE_UNSPECIFIED"
    #: Accepted, waiting for a capacity slot (first come, first served).
    PENDING = "JOB_STATE_PENDING"
    #: Slot granted; the trainer process/pod is starting.
    CREATING = "JOB_STATE_CREATING"
    #: The trainer is up. Its gateway route may still be propagating (the route race).
    RUNNING = "JOB_STATE_RUNNING"
    #: Stopped by the platform after the inactivity timeout. Resumable.
    IDLE = "JOB_STATE_IDLE"
    #: The trainer died (preemption, crash, platform restart); ``status.message`` says which. Resumable.
    FAILED = "JOB_STATE_FAILED"
    #: Cancelled on the platform side. Resumable.
    CANCELLED = "JOB_STATE_CANCELLED"
    #: Paused on the platform side. Resumable.
    PAUSED = "JOB_STATE_PAUSED"
    #: Finished on the platform side. Resumable.
    COMPLETED = "JOB_STATE_COMPLETED"
    #: DELETE accepted; the trainer is being stopped.
    DELETING = "JOB_STATE_DELETING"
    #: Tombstone: no trainer, id never reused, checkpoints still listable and promotable.
    DELETED = "JOB_STATE_DELETED"

    @classmethod
    def _missing_(cls, value: object) -> JobState:
        # A hosted platform may grow states; never crash on one we do not know.
        return cls.UNSPECIFIED

    @property
    def short(self) -> str:
        """``RUNNING`` for ``JOB_STATE_RUNNING`` — for humans."""
        return self.value.removeprefix("JOB_STATE_")

    def is_resumable(self) -> bool:
        """``:resume`` is accepted only from these states."""
        return self in RESUMABLE_STATES

    def is_transitional(self) -> bool:
        """The platform is still moving the job; wait and look again."""
        return self in TRANSITIONAL_STATES

    def is_gone(self) -> bool:
        """Deleted or being deleted: no trainer will ever serve this id again."""
        return self in (JobState.DELETING, JobState.DELETED)

    def holds_trainer(self) -> bool:
        """A trainer process is (being) started for the job and holds a capacity slot."""
        return self in (JobState.CREATING, JobState.RUNNING)


RESUMABLE_STATES = frozenset(
    {JobState.FAILED, JobState.CANCELLED, JobState.PAUSED, JobState.COMPLETED, JobState.IDLE}
)
TRANSITIONAL_STATES = frozenset(
    {JobState.UNSPECIFIED, JobState.PENDING, JobState.CREATING, JobState.DELETING}
)
