"""The lifecycle's internal control flow, shared by its steps (workflows/job.py and the
modules it runs): the trainer states they wait for, and the exceptions that move the job
(none ever leaves the workflow).

Deterministic code only.
"""

from __future__ import annotations

from typing import TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from shepherd.models import PlatformJob
    from shepherd.phases import Phase
    from shepherd.states import JobState

RUNNING = {JobState.RUNNING.value}
PLACED = {JobState.CREATING.value, JobState.RUNNING.value}
RESUMABLE_OR_RUNNING = {s.value for s in JobState if s.is_resumable()} | RUNNING
DEAD = {s.value for s in JobState if s.is_resumable() or s.is_gone()}


class Lost(Exception):
    """The trainer stopped serving (internal control flow, never leaves the workflow)."""

    def __init__(
        self, kind: str, job: PlatformJob | None, detail: str, applied_step: int | None = None
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.job = job
        self.detail = detail
        #: The last step the trainer was seen to apply before it stopped, when known.
        self.applied_step = applied_step


class Terminal(Exception):
    """The job ends in ``phase`` with an error (internal control flow)."""

    def __init__(self, phase: Phase, type_: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase
        self.type = type_
        self.message = message


class PauseNow(Exception):
    pass


T = TypeVar("T")


def required(value: T | None, what: str) -> T:
    """``value``, which the lifecycle's own logic guarantees; if a bug breaks that, the job
    fails with an error that says so (an ``assert`` would fail the workflow *task*, which
    retries for ever: the job hangs in its phase and cancel waits on it)."""
    if value is None:
        raise Terminal(Phase.FAILED, "InternalError", f"Shepherd bug: {what} is missing")
    return value


class BadSignal(Exception):
    """A signal's input could not be read (already noted in the status)."""
