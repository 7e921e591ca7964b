"""bench/history.py's reading of a job's histories: events by kind, the steady span between
cadence markers, and the hours to the first run boundary."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.common.v1 import ActivityType
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import (
    ActivityTaskCompletedEventAttributes,
    ActivityTaskScheduledEventAttributes,
    ActivityTaskStartedEventAttributes,
    HistoryEvent,
    WorkflowExecutionSignaledEventAttributes,
)

from shepherd.models import JobStatus

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
history: Any = pytest.importorskip("history")

T0 = datetime(2026, 1, 1, tzinfo=UTC)
E = EventType


class Events:
    """A run's history, built event by event (ids in order, times given)."""

    def __init__(self) -> None:
        self.events: list[HistoryEvent] = []

    def add(self, kind: int, at: float, **attrs: Any) -> int:
        stamp = Timestamp()
        stamp.FromDatetime(T0 + timedelta(seconds=at))
        e = HistoryEvent(event_id=len(self.events) + 1, event_type=kind, event_time=stamp, **attrs)  # type: ignore[arg-type]
        self.events.append(e)
        return e.event_id

    def task(self, at: float) -> None:
        for kind in (
            E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
            E.EVENT_TYPE_WORKFLOW_TASK_STARTED,
            E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        ):
            self.add(kind, at)

    def signal(self, at: float, name: str = "program_progress") -> None:
        attrs = WorkflowExecutionSignaledEventAttributes(signal_name=name)
        self.add(
            E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
            at,
            workflow_execution_signaled_event_attributes=attrs,
        )
        self.task(at)

    def activity(self, name: str, at: float, started_at: float | None = None) -> None:
        """Scheduled, then Started and Completed written together when it completes (as the
        server writes them), Started carrying its earlier time."""
        attrs = ActivityTaskScheduledEventAttributes(activity_type=ActivityType(name=name))
        sid = self.add(
            E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, at, activity_task_scheduled_event_attributes=attrs
        )
        self.add(
            E.EVENT_TYPE_ACTIVITY_TASK_STARTED,
            at if started_at is None else started_at,
            activity_task_started_event_attributes=ActivityTaskStartedEventAttributes(
                scheduled_event_id=sid
            ),
        )
        self.add(
            E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
            at + 1,
            activity_task_completed_event_attributes=ActivityTaskCompletedEventAttributes(
                scheduled_event_id=sid
            ),
        )


def program_job(runs: list[Any], step: int, window_s: float) -> dict[str, Any]:
    args = history.parse_args(["--minutes", str(window_s / 60), "--step-ms", "1000"])
    job = history.Job("program", history.program_spec(args))
    job.workflow_id = "wf"
    job.submitted = T0
    job.training_from = T0 + timedelta(seconds=10)
    job.cancelled_at = job.training_from + timedelta(seconds=window_s)
    job.at_cancel = JobStatus(step=step)
    return history.figures(job, runs, {"events": 100, "from": "test"})


def test_the_steady_span_counts_whole_cycles_between_cadence_markers() -> None:
    h = Events()
    for i in range(4):  # before training: 12 events
        h.task(i)
    h.signal(10.5, "program_started")  # a one-off in the window, before the first marker
    for at in (12, 22, 32):  # a progress report every 10 s: 4 events each
        h.signal(at)
    h.activity("prune_checkpoints", 33)  # a checkpoint's pruning, and the task after it
    h.task(34)
    for at in (42, 52):
        h.signal(at)
    h.task(75)  # after the cancel (at 70 s)
    run = history.Run("r1", T0, "CANCELED", h.events)
    out = program_job([run], step=60, window_s=60)

    assert out["events"] == {
        "before_training": 12,
        "training_window": 4 + 20 + 3 + 3,
        "after_cancel": 3,
        "total": 12 + 4 + 20 + 3 + 3 + 3,
    }
    steady = out["steady"]
    # From the first report (12 s) to the last (52 s): 4 reports and the checkpoint's prune.
    assert steady["markers"] == 5 and steady["span_s"] == 40.0
    # After the first marker: its task, three reports, the prune and its task, the last signal.
    assert steady["events"] == 3 + 4 + 4 + 3 + 3 + 4 + 1
    assert steady["signals"] == {"program_progress": {"events": 4, "events_per_hour": 360.0}}
    assert steady["activities"]["prune_checkpoints"]["scheduled"] == 1
    assert out["events_per_hour"] == steady["events"] * 90.0
    # The first run held 12 + 4 (the start's report) + 1 (the first marker) events by then.
    first = out["first_boundary"]
    assert first["events_before_rate_applies"] == 17
    assert first["hours_to_event_boundary"] == round((100 - 17) / out["events_per_hour"], 3)
    assert first["bound_by"] == "events"
    assert out["series"][0] == [0.0, 0] and out["series"][-1] == [60.0, 30]


def test_an_activity_is_named_by_its_scheduled_event_and_started_events_written_late_count_by_time() -> (
    None
):
    h = Events()
    h.activity("run_program", 5, started_at=5)
    h.activity("program_attach", 11, started_at=9)  # Started written at 12 s, dated 9 s
    t = history.tally([h.events], lambda e: history.event_time(e) >= T0 + timedelta(seconds=10))
    assert dict(t.activity_events) == {"program_attach": 2}
    assert t.activities["program_attach"] == 1


def test_the_boundary_is_the_sooner_of_the_servers_suggestion_and_max_history_events() -> None:
    def probe(at: int | None) -> Any:
        return history.Probe(
            coarse=history.ProbeResult(at, 0, 0, 0, 0),
            result=history.ProbeResult(at, 0, 0, 0, 0),
            seconds=1.0,
            reasons=[],
            size_bytes_at_suggestion=None,
        )

    assert history.boundary_of(probe(4097), 10_000)["events"] == 4097
    assert history.boundary_of(probe(12_000), 10_000)["events"] == 10_000
    assert history.boundary_of(probe(None), 10_000)["events"] == 10_000
    assert history.boundary_of(None, 10_000)["events"] == 10_000
