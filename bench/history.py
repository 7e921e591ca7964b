"""Benchmark: how fast a job's workflow history grows, and how long a job trains before its
first run boundary (issue 30).

Temporal warns when one run's history passes 10,240 events and terminates the workflow at
51,200. A Shepherd job continues-as-new (a new run, its state carried) once the server
suggests it, or its history holds ``policies.max_history_events`` (10,000 by default) events
or ``policies.HISTORY_BYTES_CAP`` bytes (workflows/context.py, ``history_long``). This
measures, at the default cadence, how many events an hour of training writes and so how many
hours a job trains before its first run boundary:

1. **The server's suggestion.** A probe workflow (bench/history_probe.py) lengthens its own
   history a short timer at a time until the server says ``is_continue_as_new_suggested()``:
   the length at which it first did. The boundary is the smaller of that and the default
   ``max_history_events`` (or the bytes cap, if an hour writes so many bytes that it comes
   first).
2. **Two jobs**, concurrently by default (``--sequential``: one after the other), each trained
   for ``--minutes`` of TRAINING at ``--step-ms`` of emulated GPU time per step, with the
   spec's default checkpoint interval and policies, then cancelled:

   * a **program** job: examples/programs/tinker_sft.py, unmodified, registered with the
     worker through ``SHEPHERD_PROGRAMS`` (offline, JSON-only trainers, as
     tests/workflows/test_programs.py runs it), its ``steps`` larger than the window needs;
   * a **loop** job: the built-in ``supervised`` loop (batch 4, synthetic text), its
     ``total_steps`` larger than the window needs, chunks of the default
     ``steps_per_chunk``.

   Every run of each job's workflow is read back (its events, each one's type, time and
   size): the events written per hour of training, by kind (workflow tasks, signals by name,
   activities by type, timers, the rest), over whole cycles of the cadence (from the
   window's first loop chunk or program report to its last); the events written before
   (provisioning, warm-up, the program's start), which count against the first run too;
   the hours of training from there to the boundary.

Prints one JSON document on stdout (progress goes to stderr); ``method`` defines every figure.
Writes a PNG plot to ``--out`` when matplotlib is importable (each job's events over its
training time, and the hours to the boundary).

Run: ``.venv/bin/python bench/history.py [--minutes 10] [--step-ms 1000] [--sequential]
[--out bench/out/history.png]``; a quick check: ``--minutes 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, SuggestContinueAsNewReason
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.worker import Worker

from shepherd import binaries
from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.spec import JobSpec, PoliciesSpec
from workers.devstack import TIMER_FLAGS
from workflows import policies

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from common import (
    Runner,
    Stack,
    log,
    machine,
    no_plot,
    positive,
    program_env,
    pyplot,
    r3,
    run_main,
    save_plot,
    shepherd_stack,
    shepherd_worker,
    supervised_settings,
    supervised_spec,
    tinker_sft_spec,
)
from history_probe import HistoryProbe, ProbeInput, ProbeResult

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "out" / "history.png"
#: The loop's batch (bench/crash.py's).
LOOP_BATCH = 4
PLANE_CONFIG: dict[str, Any] = {"capacity": 2, "bootDelaySeconds": 0.0}
KINDS = ("program", "loop")
#: Temporal's default history limits (dynamic config ``limit.historyCount.warn`` and
#: ``limit.historyCount.error``): not measured here, for reference.
SERVER_WARN_EVENTS = 10_240
SERVER_ERROR_EVENTS = 51_200
#: The probe stops here if the server has not suggested continue-as-new by then (past the
#: default max_history_events, its suggestion would not be the boundary anyway).
PROBE_LIMIT = 12_000
#: Trainer up, model open: a job should be TRAINING within this.
SETUP_TIMEOUT_S = 600.0
#: A cancelled job should end (program stopped, trainer deleted) within this.
END_TIMEOUT_S = 180.0
#: The job's status is asked this often until it trains (the training start's resolution).
POLL_S = 0.5
#: The series in the report: cumulative events every this many seconds of training.
SERIES_EVERY_S = 10.0


def now() -> datetime:
    return datetime.now(UTC)


def secs(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def per_hour(count: float, seconds: float) -> float | None:
    return r3(count * 3600.0 / seconds) if seconds > 0 else None


# ------------------------------------------------------------------- the probe


@dataclass
class Probe:
    #: The coarse pass (``batch`` timers a round) and the fine one (one timer a round from
    #: just below the coarse pass's last unsuggested length): the fine one's figures count.
    coarse: ProbeResult
    result: ProbeResult
    seconds: float
    reasons: list[str]
    size_bytes_at_suggestion: int | None


async def probe_server(st: Stack, limit: int) -> Probe:
    """Run :class:`HistoryProbe` on a worker of its own, coarse then fine; read from the fine
    run's history which reasons the server gave with its first suggestion."""
    task_queue = f"bench-history-probe-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    async with Worker(st.client, task_queue=task_queue, workflows=[HistoryProbe]):

        async def one(probe: ProbeInput) -> tuple[ProbeResult, WorkflowHandle[Any, Any]]:
            handle = await st.client.start_workflow(
                HistoryProbe.run,
                probe,
                id=f"bench-history-probe-{uuid.uuid4().hex[:8]}",
                task_queue=task_queue,
            )
            return await handle.result(), handle

        coarse, _ = await one(ProbeInput(limit=limit, fine_from=limit))
        log(
            f"coarse: suggested at {coarse.suggested_at} (not at {coarse.last_not_suggested}), "
            f"{time.monotonic() - started:.1f} s"
        )
        if coarse.suggested_at is None:
            result, handle = coarse, None
        else:
            fine_from = coarse.last_not_suggested
            result, handle = await one(ProbeInput(limit=limit, fine_from=fine_from))
    seconds = time.monotonic() - started
    reasons: list[str] = []
    size: int | None = None
    if handle is not None:
        async for e in handle.fetch_history_events():
            if e.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                continue
            attrs = e.workflow_task_started_event_attributes
            if attrs.suggest_continue_as_new:
                reasons = [
                    SuggestContinueAsNewReason.Name(r).removeprefix(
                        "SUGGEST_CONTINUE_AS_NEW_REASON_"
                    )
                    for r in attrs.suggest_continue_as_new_reasons
                ]
                size = attrs.history_size_bytes
                break
    return Probe(coarse, result, seconds, reasons, size)


def server_version() -> str | None:
    try:
        done = subprocess.run(
            [str(binaries.temporal()), "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


# --------------------------------------------------------------------- the jobs


def window_steps(args: argparse.Namespace) -> int:
    """Steps enough to outlast the window, whatever the per-step overhead."""
    return int(args.minutes * 60_000 / args.step_ms) * 3 + 200


def program_spec(args: argparse.Namespace) -> JobSpec:
    return tinker_sft_spec("history-program", steps=window_steps(args), step_ms=args.step_ms)


def loop_spec(args: argparse.Namespace) -> JobSpec:
    settings = supervised_settings(steps=window_steps(args), batch_size=LOOP_BATCH)
    # {}: the spec's default checkpoint section (every_steps, evaluate, keep_last).
    return supervised_spec("history-loop", settings, args.step_ms, {})


@dataclass
class Job:
    kind: str
    spec: JobSpec
    workflow_id: str = ""
    submitted: datetime | None = None
    training_from: datetime | None = None
    cancelled_at: datetime | None = None
    #: The status just before the cancel, and once the job had ended.
    at_cancel: JobStatus | None = None
    final: JobStatus | None = None
    outcome: str | None = None
    error: str | None = None


async def status(client: Client, workflow_id: str) -> JobStatus:
    handle = client.get_workflow_handle(workflow_id)  # the latest run
    return await handle.query("status", result_type=JobStatus)


TRAINING_PHASES = {Phase.TRAINING, Phase.CHECKPOINTING}


async def run_job(st: Stack, runner: Runner, job: Job, window_s: float) -> None:
    """Start the job, wait until it trains, let it train ``window_s``, cancel it and wait
    until it has ended. Errors are kept in ``job.error``."""
    try:
        job.submitted = now()
        handle = await runner.start(job.spec)
        job.workflow_id = handle.id
        log(f"{job.kind}: started {handle.id}")
        async with asyncio.timeout(SETUP_TIMEOUT_S):
            while True:
                s = await status(st.client, job.workflow_id)
                if s.phase in TRAINING_PHASES:
                    job.training_from = now()
                    break
                if s.phase.is_terminal():
                    raise RuntimeError(f"ended {s.phase.value} before training: {s.error}")
                await asyncio.sleep(POLL_S)
        log(f"{job.kind}: TRAINING after {secs(job.training_from, job.submitted):.1f} s")
        end = time.monotonic() + window_s
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(60.0, left))
            s = await status(st.client, job.workflow_id)
            log(
                f"{job.kind}: {s.phase.value}, step {s.step}, "
                f"{secs(now(), job.training_from) / 60:.1f} min of training, "
                f"runs continued {s.continued_as_new}"
            )
            if s.phase.is_terminal():
                raise RuntimeError(f"ended {s.phase.value} inside the window: {s.error}")
        job.at_cancel = await status(st.client, job.workflow_id)
        job.cancelled_at = now()
        await st.client.get_workflow_handle(job.workflow_id).cancel()
        log(f"{job.kind}: cancelled at step {job.at_cancel.step}")
        async with asyncio.timeout(END_TIMEOUT_S):
            try:
                await handle.result()
                job.outcome = "completed"
            except WorkflowFailureError as exc:
                job.outcome = type(exc.cause).__name__
        job.final = await status(st.client, job.workflow_id)
        log(f"{job.kind}: ended {job.final.phase.value} ({job.outcome})")
        if job.at_cancel.step <= 0:
            # TRAINING and yet no step reported: the events are not a training hour's.
            raise RuntimeError("no optimizer step reported in the whole window (status step 0)")
    except Exception as exc:  # reported: the other job's figures still count
        job.error = f"{type(exc).__name__}: {exc}"
        log(f"{job.kind}: {job.error}")


# ------------------------------------------------------------------ the histories


@dataclass
class Run:
    run_id: str
    started: datetime
    status: str
    events: list[HistoryEvent]


async def runs_of(client: Client, workflow_id: str, expected: int) -> list[Run]:
    """Every run of the workflow, oldest first, each with its whole history (visibility may
    lag a moment behind a continue-as-new: asked again until ``expected`` runs show)."""
    for _ in range(20):
        found: list[Run] = []
        async for ex in client.list_workflows(f'WorkflowId = "{workflow_id}"'):
            handle = client.get_workflow_handle(workflow_id, run_id=ex.run_id)
            history = await handle.fetch_history()
            status_name = ex.status.name if ex.status is not None else "UNKNOWN"
            found.append(Run(ex.run_id, ex.start_time, status_name, list(history.events)))
        if len(found) >= expected:
            return sorted(found, key=lambda r: r.started)
        await asyncio.sleep(0.5)
    return sorted(found, key=lambda r: r.started)


def event_time(e: HistoryEvent) -> datetime:
    return e.event_time.ToDatetime(tzinfo=UTC)


def type_name(e: HistoryEvent) -> str:
    return EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")


#: Event types by the kind they are tallied under.
WORKFLOW_TASK = "WORKFLOW_TASK_"
TIMER = "TIMER_"
ACTIVITY = "ACTIVITY_TASK_"
SIGNALED = "WORKFLOW_EXECUTION_SIGNALED"


@dataclass
class Tally:
    """Events by kind: workflow tasks, signals by name, activities by type, timers, the rest."""

    events: int = 0
    bytes: int = 0
    by_type: Counter[str] = field(default_factory=Counter)
    workflow_tasks: int = 0
    workflow_task_events: int = 0
    signals: Counter[str] = field(default_factory=Counter)
    activities: Counter[str] = field(default_factory=Counter)
    activity_events: Counter[str] = field(default_factory=Counter)
    timers: int = 0
    timer_events: int = 0
    other: Counter[str] = field(default_factory=Counter)

    def report(self, seconds: float | None) -> dict[str, Any]:
        """Counts, and per hour of ``seconds`` when given."""

        def rate(n: int) -> float | None:
            return per_hour(n, seconds) if seconds else None

        return {
            "events": self.events,
            "events_per_hour": rate(self.events),
            "bytes": self.bytes,
            "bytes_per_hour": rate(self.bytes),
            "workflow_tasks": {
                "tasks": self.workflow_tasks,
                "events": self.workflow_task_events,
                "events_per_hour": rate(self.workflow_task_events),
            },
            "signals": {
                name: {"events": n, "events_per_hour": rate(n)}
                for name, n in self.signals.most_common()
            },
            "activities": {
                name: {
                    "scheduled": self.activities[name],
                    "events": n,
                    "events_per_hour": rate(n),
                }
                for name, n in self.activity_events.most_common()
            },
            "timers": {
                "started": self.timers,
                "events": self.timer_events,
                "events_per_hour": rate(self.timer_events),
            },
            "other": {
                name: {"events": n, "events_per_hour": rate(n)}
                for name, n in self.other.most_common()
            },
            "by_event_type": dict(self.by_type.most_common()),
        }


def tally(runs: Iterable[Sequence[HistoryEvent]], keep: Any = None) -> Tally:
    """Tally the events of every run for which ``keep(event)`` holds (None: all). An
    activity's later events are named by its ActivityTaskScheduled, found in the same run."""
    t = Tally()
    for events in runs:
        scheduled: dict[int, str] = {}
        for e in events:
            kind = type_name(e)
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled[e.event_id] = (
                    e.activity_task_scheduled_event_attributes.activity_type.name
                )
            if keep is not None and not keep(e):
                continue
            t.events += 1
            t.bytes += e.ByteSize()
            t.by_type[kind] += 1
            if kind.startswith(WORKFLOW_TASK):
                t.workflow_task_events += 1
                t.workflow_tasks += e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
            elif kind == SIGNALED:
                t.signals[e.workflow_execution_signaled_event_attributes.signal_name] += 1
            elif kind.startswith(ACTIVITY):
                name = activity_name(e, scheduled)
                t.activity_events[name] += 1
                t.activities[name] += e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            elif kind.startswith(TIMER):
                t.timer_events += 1
                t.timers += e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
            else:
                t.other[kind] += 1
    return t


def activity_name(e: HistoryEvent, scheduled: dict[int, str]) -> str:
    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return scheduled[e.event_id]
    attrs_name = e.WhichOneof("attributes")
    attrs = getattr(e, attrs_name) if attrs_name else None
    ref = getattr(attrs, "scheduled_event_id", None)
    return scheduled.get(ref, "?") if ref is not None else "?"


def series(times: list[float], window_s: float) -> list[list[float]]:
    """Cumulative events at every ``SERIES_EVERY_S`` of training (``times``: each event's
    seconds since training began, sorted), and at the window's end."""
    marks = [i * SERIES_EVERY_S for i in range(int(window_s // SERIES_EVERY_S) + 1)]
    if not marks or marks[-1] < window_s:
        marks.append(window_s)
    out, i = [], 0
    for m in marks:
        while i < len(times) and times[i] <= m:
            i += 1
        out.append([r3(m), i])
    return out


# ----------------------------------------------------------------------- figures


def boundary_of(probe: Probe | None, default_max: int) -> dict[str, Any]:
    suggested = probe.result.suggested_at if probe is not None else None
    if suggested is not None and suggested < default_max:
        return {"events": suggested, "from": "the server's continue-as-new suggestion"}
    return {"events": default_max, "from": "policies.max_history_events (the default)"}


def hours_to(limit: float, start: float, rate: float | None) -> float | None:
    """Hours of training until a history that held ``start`` events (or bytes) when training
    began reaches ``limit``, at ``rate`` per hour."""
    if not rate:
        return None
    return r3(max(0.0, limit - start) / rate)


#: What recurs at each job kind's cadence: a loop's chunk (then its checkpoint and
#: evaluation every checkpoint interval), a program's progress signal.
def is_marker(kind: str, e: HistoryEvent) -> bool:
    if kind == "loop":
        return (
            e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == "train_chunk"
        )
    return (
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == "program_progress"
    )


def figures(job: Job, runs: list[Run], boundary: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "workflow_id": job.workflow_id,
        "spec": job.spec.model_dump(mode="json", exclude_defaults=True),
        "steps_per_chunk": job.spec.steps_per_chunk if job.kind == "loop" else None,
        "checkpoint_every_steps": job.spec.checkpoint.every_steps,
        "error": job.error,
        "outcome": job.outcome,
        "final_phase": job.final.phase.value if job.final else None,
    }
    if job.training_from is None or job.cancelled_at is None or job.submitted is None:
        return out
    t0, t1 = job.training_from, job.cancelled_at
    window_s = secs(t1, t0)
    ordered = [e for r in runs for e in r.events]  # every run, oldest first
    in_window = tally((r.events for r in runs), lambda e: t0 <= event_time(e) < t1)
    setup = tally((r.events for r in runs), lambda e: event_time(e) < t0)
    after = tally((r.events for r in runs), lambda e: event_time(e) >= t1)
    steps = job.at_cancel.step if job.at_cancel else 0

    # The steady span: after the window's first marker up to its last, whole cadence cycles.
    marks = [
        i for i, e in enumerate(ordered) if t0 <= event_time(e) < t1 and is_marker(job.kind, e)
    ]
    steady: dict[str, Any] | None = None
    rate: float | None
    bytes_rate: float | None
    if len(marks) >= 2 and secs(event_time(ordered[marks[-1]]), event_time(ordered[marks[0]])) > 0:
        first, last = marks[0], marks[-1]
        span_s = secs(event_time(ordered[last]), event_time(ordered[first]))
        kept = {id(e) for e in ordered[first + 1 : last + 1]}
        steady_tally = tally((r.events for r in runs), lambda e: id(e) in kept)
        rate = steady_tally.events * 3600.0 / span_s
        bytes_rate = steady_tally.bytes * 3600.0 / span_s
        # What the first run held when the steady span began (a later run's start: all).
        before = first + 1 if first < len(runs[0].events) else len(runs[0].events)
        before_bytes = sum(e.ByteSize() for e in runs[0].events[:before])
        steady = {
            "markers": len(marks),
            "span_s": r3(span_s),
            "from_training_start_s": r3(secs(event_time(ordered[first]), t0)),
            **steady_tally.report(span_s),
        }
        rate_from = "steady span"
    else:
        rate = in_window.events * 3600.0 / window_s if window_s > 0 else None
        bytes_rate = in_window.bytes * 3600.0 / window_s if window_s > 0 else None
        first_run = runs[0].events if runs else []
        before = sum(1 for e in first_run if event_time(e) < t0)
        before_bytes = sum(e.ByteSize() for e in first_run if event_time(e) < t0)
        rate_from = "training window (fewer than two cadence markers in it)"
    hours_events = hours_to(boundary["events"], before, rate)
    hours_bytes = hours_to(policies.HISTORY_BYTES_CAP, before_bytes, bytes_rate)
    sooner = min((h for h in (hours_events, hours_bytes) if h is not None), default=None)
    times = sorted(secs(event_time(e), t0) for e in ordered if t0 <= event_time(e) < t1)
    timings = job.final.timings if job.final else {}
    closed = event_time(ordered[-1]) if ordered else None
    out.update(
        {
            "runs": [
                {
                    "run_id": r.run_id,
                    "status": r.status,
                    "events": len(r.events),
                    "bytes": sum(e.ByteSize() for e in r.events),
                }
                for r in runs
            ],
            "continued_as_new": len(runs) - 1,
            "setup_s": r3(secs(t0, job.submitted)),
            "training_window_s": r3(window_s),
            "training_s_by_status": {
                p.value: timings.get(p.value) for p in (Phase.TRAINING, Phase.CHECKPOINTING)
            },
            "cancel_to_closed_s": r3(secs(closed, t1)) if closed else None,
            "timings": timings,
            "steps_at_cancel": steps,
            "steps_per_hour": per_hour(steps, window_s),
            "events": {
                "before_training": setup.events,
                "training_window": in_window.events,
                "after_cancel": after.events,
                "total": len(ordered),
            },
            "events_per_hour": r3(rate) if rate is not None else None,
            "bytes_per_hour": r3(bytes_rate) if bytes_rate is not None else None,
            "rate_from": rate_from,
            "window_events_per_hour": per_hour(in_window.events, window_s),
            "events_per_100_steps": r3(100 * rate / (steps * 3600 / window_s))
            if rate is not None and steps and window_s > 0
            else None,
            "steady": steady,
            "training_window": in_window.report(window_s),
            "before_training": setup.report(None),
            "after_cancel": after.report(None),
            "first_boundary": {
                "events_before_rate_applies": before,
                "bytes_before_rate_applies": before_bytes,
                "hours_to_event_boundary": hours_events,
                "hours_to_bytes_cap": hours_bytes,
                "hours": sooner,
                "bound_by": None
                if sooner is None
                else ("events" if sooner == hours_events else "bytes"),
                "steps": math.floor(sooner * steps * 3600 / window_s)
                if sooner is not None and window_s > 0
                else None,
                "hours_to_max_history_events": hours_to(
                    PoliciesSpec().max_history_events, before, rate
                ),
                "hours_to_server_warn_without_continue_as_new": hours_to(
                    SERVER_WARN_EVENTS, before, rate
                ),
                "hours_to_server_error_without_continue_as_new": hours_to(
                    SERVER_ERROR_EVENTS, before, rate
                ),
            },
            "series": series(times, window_s),
        }
    )
    return out


# ----------------------------------------------------------------------------- run


METHOD = {
    "setup": (
        "A fresh stack (bench/common.py shepherd_stack): the Temporal dev server in memory, "
        "started with workers/devstack.py TIMER_FLAGS as `shepherd dev` starts it; "
        "localplane (capacity 2, no boot delay, trainers speaking JSON only: "
        "trainerProtobuf false); one in-process Shepherd worker (common.shepherd_worker) with "
        "the event bridge on, as the 'local' backend profile has it (--no-events: off, as the "
        "hosted profile has it). The program is registered with that worker through "
        "SHEPHERD_PROGRAMS and runs offline (tests/plane/cookbook_support.py offline_env). "
        "The benchmark, the plane and the Temporal server read this machine's clock."
    ),
    "jobs": (
        "program: examples/programs/tinker_sft.py unchanged (steps=N; its defaults: a sample "
        "every 4 steps, a weights digest per step), LoRA rank 4; loop: the built-in "
        "supervised loop on synthetic:text, batch 4, total_steps N. N = 3 x the window's "
        "steps at --step-ms + 200, so neither ends inside the window. Both: the spec's "
        "default checkpoint section (every 50 steps, evaluate, keep_last 3; a loop's chunks "
        "then default to 50 steps), default policies (max_history_events 10,000, "
        "heartbeat_timeout 4 s ...), promote none, --compute-delay-ms=--step-ms on the "
        "trainer (each forward_backward sleeps that long). With --sequential the program job "
        "runs first, then the loop job; otherwise both at once, each in its own window."
    ),
    "training_window_s": (
        "from the first status query (asked every 0.5 s after the start) that showed the "
        "job TRAINING or CHECKPOINTING, to just before the cancel request, --minutes later "
        "(bench clock). training_s_by_status is the workflow's own account "
        "(JobStatus.timings, TRAINING and CHECKPOINTING, which run on until the cancel is "
        "handled). steps_per_hour = steps_at_cancel (the status's step just before the "
        "cancel: a loop's last finished chunk, a program's last progress signal) x 3600 / "
        "training_window_s."
    ),
    "events": (
        "every event of every run of the job's workflow (client.list_workflows on its "
        "WorkflowId, then each run's fetch_history), split by the event's server time: "
        "before_training (validation, provisioning, warm-up, opening the model), "
        "training_window, after_cancel (stopping the program, deleting the trainer: "
        "cancel_to_closed_s). Nothing after the cancel is in a rate."
    ),
    "events_per_hour": (
        "over the steady span: the events after the window's first cadence marker up to and "
        "including its last (whole cycles of the default cadence), x 3600 / the time between "
        "the two markers. Markers: a loop's train_chunk ActivityTaskScheduled (a cycle: the "
        "chunk, then its checkpoint, evaluation and pruning), a program's program_progress "
        "signal (a cycle: one report, at most every PROGRAM_PROGRESS_EVERY, and checkpoints "
        "as they come). What the window holds before its first marker (a program's start "
        "and attach, a loop's first chunk start) is a one-off, left out. With fewer than two "
        "markers (a short window), the whole window's rate (rate_from says which). "
        "window_events_per_hour: every window event x 3600 / training_window_s."
    ),
    "bytes_per_hour": (
        "the same for the events' serialized size (protobuf ByteSize), what the server's "
        "history size sums"
    ),
    "events_per_100_steps": "events_per_hour / steps_per_hour x 100",
    "steady": (
        "the steady span's events by kind: workflow_tasks (every WORKFLOW_TASK_* event; tasks "
        "= the scheduled ones), signals by signal name, activities by activity type (every "
        "ACTIVITY_TASK_* event, named by its ActivityTaskScheduled; scheduled = how many), "
        "timers (TIMER_*; started = how many), other (the rest, by event type: search "
        "attribute upserts ...), by_event_type; each also per hour of the span. "
        "training_window, before_training and after_cancel: the same tallies of those parts."
    ),
    "server": (
        "suggested_at: the history length (get_current_history_length) at the first "
        "workflow task of bench/history_probe.py's probe that was told "
        "is_continue_as_new_suggested(). A coarse pass (50 concurrent 1 ms timers a workflow "
        "task) finds the neighbourhood; a fine pass then goes there coarsely and on with one "
        "1 ms timer (five events) per workflow task, so the server's threshold lies in "
        "(last_not_suggested, suggested_at]; reasons are that task's "
        "suggest_continue_as_new_reasons. The probe stops at --probe-limit events "
        "(suggested_at null: not suggested by then). warn_events and error_events are "
        "Temporal's defaults (limit.historyCount.warn and .error), not measured."
    ),
    "boundary": (
        "where the first run ends: min(the server's suggested_at, the default "
        "policies.max_history_events), in events; the job also continues at "
        "policies.HISTORY_BYTES_CAP bytes"
    ),
    "first_boundary": (
        "hours_to_event_boundary = (boundary - events_before_rate_applies) / "
        "events_per_hour, events_before_rate_applies being the first run's events up to the "
        "steady span's start (or up to the window's); hours_to_bytes_cap the same in bytes "
        "with HISTORY_BYTES_CAP; hours = the sooner, bound_by which; steps = hours x "
        "steps_per_hour. The rate is extrapolated linearly in training time (the cadence is "
        "periodic: reports, chunks, checkpoints). hours_to_max_history_events: the same to the "
        "default policies.max_history_events (where the run would end if the server did not "
        "suggest sooner); hours_to_server_warn/error_without_continue_as_new: the same to "
        "Temporal's 10,240 and 51,200, for reference. A job "
        "continues where its wait next wakes (a loop after its chunk, a program at its next "
        "signal), a few events past the boundary; later runs start with fewer events than "
        "the first (no provisioning), so later boundaries come a little later."
    ),
}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    window_s = args.minutes * 60.0
    defaults = PoliciesSpec()
    with tempfile.TemporaryDirectory(prefix="shepherd-bench-history-") as tmp:
        # The in-process worker reads the registration, and its programs inherit the rest.
        os.environ.update(program_env(Path(tmp)))
        jobs = [Job("program", program_spec(args)), Job("loop", loop_spec(args))]
        probe: Probe | None = None
        probe_error: str | None = None
        async with shepherd_stack(PLANE_CONFIG) as st:
            await st.admin.set_faults(trainerProtobuf=False)
            log(f"probing the server's continue-as-new suggestion (up to {args.probe_limit})")
            try:
                probe = await probe_server(st, args.probe_limit)
                log(f"suggested at {probe.result.suggested_at} ({probe.seconds:.1f} s)")
            except Exception as exc:  # reported: the jobs' figures still count
                probe_error = f"{type(exc).__name__}: {exc}"
                log(f"probe failed: {probe_error}")
            async with shepherd_worker(st, "history", events=args.events) as runner:
                if args.sequential:
                    for job in jobs:
                        await run_job(st, runner, job, window_s)
                else:
                    await asyncio.gather(*(run_job(st, runner, j, window_s) for j in jobs))
                histories: dict[str, list[Run]] = {}
                for job in jobs:
                    expected = 1 + (job.final.continued_as_new if job.final else 0)
                    histories[job.kind] = (
                        await runs_of(st.client, job.workflow_id, expected)
                        if job.workflow_id
                        else []
                    )
    boundary = boundary_of(probe, defaults.max_history_events)
    per_job = {job.kind: figures(job, histories[job.kind], boundary) for job in jobs}
    server: dict[str, Any] = {
        "version": server_version(),
        "dynamic_config": TIMER_FLAGS[1::2],
        "warn_events": SERVER_WARN_EVENTS,
        "error_events": SERVER_ERROR_EVENTS,
        "probe_error": probe_error,
    }
    if probe is not None:
        server.update(
            {
                "suggested_at": probe.result.suggested_at,
                "last_not_suggested": probe.result.last_not_suggested,
                "reasons": probe.reasons,
                "size_bytes_at_suggestion": probe.size_bytes_at_suggestion,
                "coarse_pass": {
                    "suggested_at": probe.coarse.suggested_at,
                    "last_not_suggested": probe.coarse.last_not_suggested,
                    "rounds": probe.coarse.rounds,
                },
                "fine_pass_rounds": probe.result.rounds,
                "fine_pass_one_timer_rounds": probe.result.fine_rounds,
                "probe_s": r3(probe.seconds),
                "probe_limit": args.probe_limit,
            }
        )
    return {
        "benchmark": "history",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "command": "bench/history.py " + " ".join(sys.argv[1:]),
        "settings": {
            "minutes": args.minutes,
            "step_ms": args.step_ms,
            "jobs_ran": "one after the other" if args.sequential else "concurrently",
            "events": args.events,
            "checkpoint_every_steps": jobs[0].spec.checkpoint.every_steps,
            "loop_steps_per_chunk": jobs[1].spec.steps_per_chunk,
            "program_progress_every_s": policies.PROGRAM_PROGRESS_EVERY.total_seconds(),
            "max_history_events": defaults.max_history_events,
            "history_bytes_cap": policies.HISTORY_BYTES_CAP,
            "plane": PLANE_CONFIG | {"trainerProtobuf": False},
        },
        "method": METHOD,
        "server": server,
        "boundary": boundary,
        "summary": {
            kind: {
                "events_per_hour": f.get("events_per_hour"),
                "events_per_100_steps": f.get("events_per_100_steps"),
                "steps_per_hour": f.get("steps_per_hour"),
                "rate_from": f.get("rate_from"),
                "events_before_training": (f.get("events") or {}).get("before_training"),
                "hours_to_first_boundary": (f.get("first_boundary") or {}).get("hours"),
                "steps_to_first_boundary": (f.get("first_boundary") or {}).get("steps"),
                "error": f.get("error"),
            }
            for kind, f in per_job.items()
        },
        "jobs": per_job,
    }


# ------------------------------------------------------------------------------ plot


def plot(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Never loses the report: a plot that cannot be drawn is said so in it."""
    try:
        return draw(out, report)
    except Exception as exc:  # the JSON matters more
        log(f"plot not drawn: {type(exc).__name__}: {exc}")
        return {"written": False, "path": None, "note": f"{type(exc).__name__}: {exc}"}


def draw(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    plt = pyplot()
    if plt is None:
        return no_plot()
    fig, (measured, projected) = plt.subplots(1, 2, figsize=(11, 4.4))
    boundary = report["boundary"]["events"]
    for i, kind in enumerate(KINDS):
        job = report["jobs"].get(kind) or {}
        if not job.get("series"):
            continue
        start = job["events"]["before_training"]
        xs = [t / 60 for t, _ in job["series"]]
        ys = [start + n for _, n in job["series"]]
        rate = job["events_per_hour"]
        label = f"{kind}: {rate:.0f} events/h" if rate is not None else kind
        # The series is sampled every SERIES_EVERY_S: drawn as the steps it is.
        measured.plot(xs, ys, color=f"C{i}", label=label, drawstyle="steps-post")
        hours = job["first_boundary"]["hours_to_event_boundary"]
        if rate and hours is not None:
            first = job["first_boundary"]
            before = first["events_before_rate_applies"]
            projected.plot([0, hours], [before, boundary], color=f"C{i}", label=f"{kind}")
            to_max = first.get("hours_to_max_history_events")
            if to_max is not None and to_max > hours:
                # Where the run would end at the default max_history_events alone.
                default_max = report["settings"]["max_history_events"]
                projected.plot(
                    [hours, to_max], [boundary, default_max], color=f"C{i}", linestyle=":"
                )
            projected.annotate(
                f"{hours:.1f} h",
                (hours, boundary),
                textcoords="offset points",
                xytext=(0, -14 - 12 * i),
                ha="center",
                fontsize=8,
                color=f"C{i}",
            )
    measured.set(
        title="measured: the job's history over its training",
        xlabel="minutes of training",
        ylabel="history events since the job started",
    )
    measured.legend(fontsize=8, loc="upper left")
    measured.grid(True, alpha=0.3)
    projected.axhline(
        boundary,
        color="red",
        linestyle=":",
        label=f"boundary {boundary} ({report['boundary']['from']})",
    )
    default_max = report["settings"]["max_history_events"]
    if default_max != boundary:
        projected.axhline(
            default_max,
            color="purple",
            linestyle="-.",
            linewidth=1,
            label=f"max_history_events {default_max} (default)",
        )
    projected.axhline(
        SERVER_WARN_EVENTS, color="grey", linestyle="--", label=f"server warns {SERVER_WARN_EVENTS}"
    )
    projected.set(
        title="extrapolated: hours of training to the first run boundary",
        xlabel="hours of training",
        ylabel="history events",
        ylim=(0, SERVER_WARN_EVENTS * 1.1),
    )
    projected.legend(fontsize=7, loc="lower right")
    projected.grid(True, alpha=0.3)
    s = report["settings"]
    fig.suptitle(
        f"{s['minutes']:g} min of training per job at {s['step_ms']:g} ms/step, default "
        f"cadence ({s['jobs_ran']})",
        fontsize=10,
    )
    fig.tight_layout()
    return save_plot(plt, fig, out)


# ------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--minutes", type=positive(float), default=10.0, help="training per job (minutes)"
    )
    parser.add_argument(
        "--step-ms", type=positive(float), default=1000.0, help="emulated GPU time per step (ms)"
    )
    parser.add_argument(
        "--sequential", action="store_true", help="one job after the other (default: together)"
    )
    parser.add_argument(
        "--no-events",
        dest="events",
        action="store_false",
        help="the worker's event bridge off (the workflow polls, as with the hosted profile)",
    )
    parser.add_argument(
        "--probe-limit",
        type=positive(int),
        default=PROBE_LIMIT,
        help="the probe gives up past this many events",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG plot path")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = run_main(lambda: bench(args), lambda report: plot(args.out, report))
    if any(job.get("error") for job in report["jobs"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
