"""What really happened to a job: Temporal's outcome of its run, reconciled with the status
the workflow published.

The workflow publishes its phase (the ``ShepherdPhase`` search attribute, its current
details, the ``status`` query) as it goes, and records how it ended in ``_finish``. That is
the whole story only when the workflow ran its own end: a run that is terminated (or times
out, or fails where no handler of the workflow saw it) keeps the last phase it published
— QUEUED, TRAINING — for ever. So every surface (``status``, ``watch``, ``list``,
``cancel``) asks Temporal how the run ended and lets that win: a closed run is never shown
in a live phase.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import TerminatedError, TimeoutError

from shepherd.models import ErrorInfo, JobStatus
from shepherd.phases import Phase

#: The phases a closed run may show, by how Temporal says it ended; the first is the one
#: shown when the published phase is not among them.
_CLOSED: dict[WorkflowExecutionStatus, tuple[Phase, ...]] = {
    WorkflowExecutionStatus.COMPLETED: (Phase.COMPLETED,),
    WorkflowExecutionStatus.FAILED: (Phase.FAILED, Phase.PREEMPTED),
    WorkflowExecutionStatus.CANCELED: (Phase.CANCELLED,),
    WorkflowExecutionStatus.TERMINATED: (Phase.TERMINATED,),
    WorkflowExecutionStatus.TIMED_OUT: (Phase.FAILED,),
}

#: Visibility's names of execution statuses (for queries).
_QUERY_NAME = {
    WorkflowExecutionStatus.RUNNING: "Running",
    WorkflowExecutionStatus.COMPLETED: "Completed",
    WorkflowExecutionStatus.FAILED: "Failed",
    WorkflowExecutionStatus.CANCELED: "Canceled",
    WorkflowExecutionStatus.TERMINATED: "Terminated",
    WorkflowExecutionStatus.TIMED_OUT: "TimedOut",
}


def shown_phase(published: str | None, execution: WorkflowExecutionStatus | None) -> str | None:
    """The phase to show for a run whose workflow last published ``published`` and that
    Temporal reports as ``execution`` (None: unknown, e.g. an old visibility record)."""
    allowed = _CLOSED.get(execution) if execution is not None else None
    if allowed is None:  # running (or continued as new: that run's last word stands)
        return published
    if published is not None and published in {p.value for p in allowed}:
        return published
    return allowed[0].value


def phase_query(phase: Phase) -> str:
    """A visibility clause matching the jobs :func:`shown_phase` shows in ``phase``: a
    live phase only for running workflows; an end by the run's real outcome."""

    def status_is(*statuses: WorkflowExecutionStatus) -> str:
        names = ", ".join(f'"{_QUERY_NAME[s]}"' for s in statuses)
        return (
            f"ExecutionStatus IN ({names})" if len(statuses) > 1 else f"ExecutionStatus = {names}"
        )

    failed = (WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TIMED_OUT)
    if phase is Phase.FAILED:
        return f'{status_is(*failed)} AND ShepherdPhase != "{Phase.PREEMPTED.value}"'
    if phase is Phase.PREEMPTED:
        return (
            f'ShepherdPhase = "{Phase.PREEMPTED.value}" AND '
            f"{status_is(WorkflowExecutionStatus.FAILED)}"
        )
    ends = {
        Phase.COMPLETED: WorkflowExecutionStatus.COMPLETED,
        Phase.CANCELLED: WorkflowExecutionStatus.CANCELED,
        Phase.TERMINATED: WorkflowExecutionStatus.TERMINATED,
    }
    if phase in ends:
        return status_is(ends[phase])
    return f'ShepherdPhase = "{phase.value}" AND {status_is(WorkflowExecutionStatus.RUNNING)}'


def failure_info(exc: BaseException) -> ErrorInfo:
    """The reason at the end of a run's failure chain (an activity's own error, not
    "Activity task failed"), as the status shows errors."""
    cause: BaseException = exc
    while (inner := getattr(cause, "cause", None) or cause.__cause__) is not None:
        cause = inner
    if isinstance(cause, TerminatedError):
        return ErrorInfo(
            type="Terminated",
            message=(cause.message or "terminated") + " (from outside Shepherd: no cleanup ran)",
        )
    if isinstance(cause, TimeoutError):
        return ErrorInfo(type="WorkflowTimedOut", message=cause.message or "the run timed out")
    kind = getattr(cause, "type", None) or type(cause).__name__
    return ErrorInfo(type=str(kind), message=getattr(cause, "message", None) or str(cause))


async def closing_failure(handle: WorkflowHandle[Any, Any]) -> ErrorInfo | None:
    """Why a closed run did not complete (None if it completed)."""
    try:
        await handle.result()
    except WorkflowFailureError as exc:
        return failure_info(exc)
    return None


def reconcile(
    status: JobStatus, execution: WorkflowExecutionStatus | None, failure: ErrorInfo | None
) -> JobStatus:
    """``status`` as published by the workflow, corrected by Temporal's outcome of the
    run (``execution``, and ``failure``: why it did not complete)."""
    phase = shown_phase(status.phase.value, execution)
    if phase is None or phase == status.phase.value:
        if failure is not None and status.error is None and status.phase.is_terminal():
            status.error = failure
        return status
    was = status.phase
    status.phase, status.stage = Phase(phase), None
    status.error = failure or status.error
    if status.phase is Phase.TERMINATED and status.cleanup != "done":
        live = was.holds_trainer() or status.cleanup == "deleting"
        status.cleanup = (
            f"not run (terminated in {was.value}): trainer {status.trainer_job_id} may still be "
            "live; delete it on the platform"
            if live and status.trainer_job_id
            else "not run (terminated)"
        )
    elif status.cleanup == "pending":
        status.cleanup = "unknown (the run ended without recording it)"
    return status


def ended_label(published: str | None, execution: WorkflowExecutionStatus | None) -> str:
    """How a closed run ended, in one word (for "had already ended (...)")."""
    return shown_phase(published, execution) or (execution.name if execution else "ENDED")
