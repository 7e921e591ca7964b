"""What a job measures as it goes, for Prometheus: through the SDK's workflow metric meter,
which the worker exports with Temporal's own metrics where ``SHEPHERD_TEMPORAL_METRICS`` is
set (workers/metrics.py), and which records nothing while a history replays (a figure is
counted once, by the run that lived it).

* ``shepherd_recoveries_total{reason}`` — the trainer lost and recovered, by reason
  (preemption, failure, deleted, …) and the scheduler's ``priority`` preemptions;
* ``shepherd_readiness_lag_seconds`` — from the trainer's RUNNING to the work being ready on
  it (the model open, the route warm);
* ``shepherd_admission_wait_seconds{queue}`` — from asking for a slot to being admitted.

Deterministic code only (the meter is the SDK's, replay-safe).
"""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow


def recovery(backend: str, reason: str) -> None:
    workflow.metric_meter().create_counter(
        "shepherd_recoveries_total", "Trainers lost and recovered, by reason."
    ).add(1, {"backend": backend, "reason": reason})


def readiness_lag(backend: str, running_at: datetime) -> None:
    workflow.metric_meter().create_histogram_float(
        "shepherd_readiness_lag_seconds",
        "From a trainer's RUNNING to the work being ready on it.",
        "s",
    ).record((workflow.now() - running_at).total_seconds(), {"backend": backend})


def admission_wait(backend: str, queue: str, asked_at: datetime) -> None:
    workflow.metric_meter().create_histogram_float(
        "shepherd_admission_wait_seconds",
        "From asking for a slot to being admitted.",
        "s",
    ).record((workflow.now() - asked_at).total_seconds(), {"backend": backend, "queue": queue})
