"""How a run's real outcome (Temporal's) corrects the phase the workflow last published,
and the list queries that find jobs by the phase they are shown in."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowExecutionStatus as X

from shepherd.client import Shepherd, list_query
from shepherd.models import ErrorInfo, JobStatus
from shepherd.outcome import phase_query, reconcile, shown_phase
from shepherd.phases import Phase
from shepherd.spec import SpecError


@pytest.mark.parametrize(
    ("published", "execution", "shown"),
    [
        ("TRAINING", X.RUNNING, "TRAINING"),
        ("QUEUED", X.FAILED, "FAILED"),  # the refused create
        ("PREEMPTED", X.FAILED, "PREEMPTED"),
        ("TRAINING", X.TERMINATED, "TERMINATED"),
        ("TRAINING", X.TIMED_OUT, "FAILED"),
        ("TRAINING", X.CANCELED, "CANCELLED"),
        ("COMPLETED", X.COMPLETED, "COMPLETED"),
        (None, X.FAILED, "FAILED"),
        ("TRAINING", X.CONTINUED_AS_NEW, "TRAINING"),
        ("TRAINING", None, "TRAINING"),
    ],
)
def test_a_closed_run_never_shows_a_live_phase(
    published: str | None, execution: X | None, shown: str
) -> None:
    assert shown_phase(published, execution) == shown


def test_a_terminated_status_names_the_trainer_left_behind() -> None:
    status = JobStatus(phase=Phase.TRAINING, trainer_job_id="job-x--1-g0", step=7)
    why = ErrorInfo(type="Terminated", message="by hand")
    fixed = reconcile(status, X.TERMINATED, why)
    assert fixed.phase is Phase.TERMINATED and fixed.error == why
    assert "job-x--1-g0 may still be live" in fixed.cleanup
    # Terminated before any trainer existed: nothing left behind.
    early = reconcile(JobStatus(phase=Phase.PENDING), X.TERMINATED, why)
    assert early.cleanup == "not run (terminated)"


def test_a_status_the_workflow_finished_is_kept() -> None:
    error = ErrorInfo(type="ModelExists", message="taken")
    status = JobStatus(phase=Phase.FAILED, error=error, cleanup="done")
    assert reconcile(status, X.FAILED, ErrorInfo(type="Other", message="x")).error == error


def test_list_by_phase_asks_for_the_runs_real_outcome() -> None:
    assert phase_query(Phase.QUEUED) == 'ShepherdPhase = "QUEUED" AND ExecutionStatus = "Running"'
    assert phase_query(Phase.TERMINATED) == 'ExecutionStatus = "Terminated"'
    assert phase_query(Phase.FAILED) == (
        'ExecutionStatus IN ("Failed", "TimedOut") AND ShepherdPhase != "PREEMPTED"'
    )
    assert "ExecutionStatus" in list_query(phase="completed")


@pytest.mark.parametrize(
    "labels",
    [{"a": 'x" OR ExecutionStatus = "Running'}, {"Bad Key": "v"}, {"a": "x\ny"}],
)
def test_a_label_that_cannot_be_searched_is_refused(labels: dict[str, str]) -> None:
    with pytest.raises(SpecError) as refused:
        list_query(labels=labels)
    assert refused.value.problems[0].field == "labels"


def test_list_filters_are_checked() -> None:
    with pytest.raises(SpecError):
        list_query(name='x" OR "1')
    with pytest.raises(SpecError):
        list_query(phase="NOPE")


@pytest.mark.parametrize("workflow_id", ["", "  ", "two\nlines"])
def test_a_blank_workflow_id_is_refused_before_asking_the_server(workflow_id: str) -> None:
    sh = Shepherd(None, task_queue="q")  # type: ignore[arg-type]  # never reached
    for get in (sh.get, sh.get_sweep):
        with pytest.raises(SpecError) as refused:
            get(workflow_id)
        assert refused.value.problems[0].field == "workflow_id"


def test_retrying_names_each_failing_activity_its_attempt_cause_and_next_try() -> None:
    """What ``shepherd status`` shows under a job that keeps failing a step (a full disk on
    the platform, a control plane answering 5xx): from Temporal's pending activities."""
    from datetime import UTC, datetime, timedelta

    from temporalio.api.failure.v1 import Failure
    from temporalio.api.workflow.v1 import PendingActivityInfo

    from shepherd.client import retrying

    def pending(name: str, attempt: int, failure: str | None) -> PendingActivityInfo:
        info = PendingActivityInfo(attempt=attempt)
        info.activity_type.name = name
        if failure is not None:
            info.last_failure.CopyFrom(Failure(message=failure))
            info.next_attempt_schedule_time.FromDatetime(datetime.now(UTC) + timedelta(seconds=30))
        return info

    shown = retrying(
        [
            pending("train_chunk", 1, None),  # running, never failed: not retrying
            pending("save_checkpoint", 6, "saving checkpoint step-30: no space left\nTraceback"),
        ]
    )
    assert len(shown) == 1
    assert shown[0].startswith("save_checkpoint (attempt 6; next in ")
    assert shown[0].endswith("): saving checkpoint step-30: no space left")
    assert retrying([]) == []
