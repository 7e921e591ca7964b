"""Benchmark: how fast Shepherd notices, warms up and recovers, and what a job costs the
control plane.

On a real stack started here (Temporal dev server, localplane in a temp dir, an in-process
worker per configuration, one fresh plane account), small jobs run one at a time:

(a) **Readiness lag**: from the platform turning the trainer RUNNING to the first training
    call accepted (the trainer answered the first ``forward_backward`` submission; target
    ≤ 0.3 s with events and the default 0-0.3 s route lag), with the event bridge running
    and with polling only (``poll_interval`` 5 s, the default, and 1 s).
    ``bootDelaySeconds`` (``--boot-delay``) keeps the job in CREATING so RUNNING happens
    while the workflow already waits for it.
(b) **Warm-up cost**: the PREPARING phase (``JobStatus.timings``) with the gateway's route
    lag 0, 0-0.3 s (the plane's default) and 1-3 s per replica.
(c) **Preemption recovery**: a trainer is preempted mid-chunk; ``RecoveryRecord.duration_s``
    minus the configured boot delay is Shepherd's part (target ≤ 1 s). The platform's own
    restart time (from its events) and the time to notice the death are reported too.
(d) **Steps redone per preemption**: ``RecoveryRecord.steps_redone`` (must be ≤ the checkpoint
    interval), next to the steps the dead trainer had really applied past the checkpoint
    (its model's ``optim_steps``, from ``get_info`` straight to the trainer process).
(e) **Control-plane requests per job**: the plane's per-job ``controlPlaneRequests`` counter
    for a plain job (20 steps, checkpoint every 10, promoted), with and without events.

Every figure is given as p50 and max over ``--runs`` runs, with the raw values. A timestamp
taken by the benchmark, the plane and the Temporal server all read the same machine clock.

Prints one JSON document on stdout (progress goes to stderr) and writes a PNG plot to
``--out`` when matplotlib is importable.

Run: ``.venv/bin/python bench/recovery.py [--runs 5] [--boot-delay 2] [--sections abce]
[--probe-ms 10] [--out bench/out/recovery.png]``; a smoke run: ``--runs 1 --boot-delay 0.5``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.platform import PlatformError
from shepherd.platform.models import JobEvent
from shepherd.spec import JobSpec, validate_spec
from shepherd.states import JobState
from shepherd.trainer_ids import owner_of

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from common import (
    BASE_MODEL,
    MAX_CONTEXT_LENGTH,
    EventLog,
    Runner,
    direct_trainer,
    log,
    machine,
    no_plot,
    positive,
    pyplot,
    r3,
    run_main,
    save_plot,
    shepherd_stack,
    shepherd_worker,
    summary,
)
from common import Stack as SharedStack

PLANE_CONFIG: dict[str, Any] = {"capacity": 4}
#: One job, start to finish, is bounded by this (a hang fails the section, not the machine).
RUN_TIMEOUT_S = 180.0
RECOVERY_TARGET_S = 1.0
#: (a): RUNNING → first training call accepted, with events and the default route lag.
READINESS_TARGET_S = 0.3
READINESS_TARGET_CONFIG = "events (bridge, poll 5s)"
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "recovery.png"

#: (b): per-replica route lag ranges, seconds.
ROUTE_LAGS: dict[str, dict[str, float]] = {
    "lag 0": {"min": 0.0, "max": 0.0},
    "lag 0-0.3 s": {"min": 0.0, "max": 0.3},
    "lag 1-3 s": {"min": 1.0, "max": 3.0},
}
#: (c): the preempted job: slow enough steps to preempt mid-chunk at a chosen point.
PREEMPT_STEP_MS = 100.0
PREEMPT_EVERY = 10
PREEMPT_TOTAL = 40
#: Preempt once the workflow has reached this step (a checkpoint) and trains the next chunk.
PREEMPT_AFTER_STEP = 20


def seconds_between(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


# ----------------------------------------------------------------------------- stack


@dataclass
class Stack(SharedStack):
    """The shared stack, plus the bench account's event log."""

    events: EventLog


@contextlib.asynccontextmanager
async def recovery_stack() -> AsyncIterator[Stack]:
    """The shared stack, with its account's events followed from the first one on."""
    async with shepherd_stack(PLANE_CONFIG) as shared:
        events = EventLog()
        follower = asyncio.create_task(events.follow(shared.platform))
        try:
            # The same stack, field by field, plus the log.
            yield Stack(**vars(shared), events=events)
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower


async def until(handle: WorkflowHandle[Any, Any], check: Callable[[JobStatus], bool]) -> JobStatus:
    """Query the workflow's status until ``check(status)`` holds; callers bound it."""
    while True:
        status = await handle.query("status", result_type=JobStatus)
        if check(status):
            return status
        if status.phase.is_terminal():
            raise RuntimeError(f"{handle.id} ended {status.phase.value}: {status.error}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def plane_faults(st: Stack, patch: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The plane's config with ``patch`` for a section, then back to what it was."""
    before = await st.admin.faults()
    effective = await st.admin.set_faults(patch)
    try:
        yield effective
    finally:
        before.pop("outage", None)
        await st.admin.set_faults(before)


def job_spec(
    name: str,
    *,
    steps: int,
    every: int,
    step_ms: float = 0.0,
    poll: str = "5s",
    model_id: str | None = None,
) -> JobSpec:
    return validate_spec(
        {
            "name": name,
            "trainer": {
                "base_model": BASE_MODEL,
                "learning_rate": 3e-3,
                "max_context_length": MAX_CONTEXT_LENGTH,
                "extra_args": [f"--compute-delay-ms={step_ms:g}"] if step_ms else [],
            },
            "training": {"total_steps": steps},
            "checkpoint": {"every_steps": every},
            "output": {"promote": "last", "model_id": model_id}
            if model_id
            else {"promote": "none"},
            "policies": {"poll_interval": poll},
        }
    )


_OUTCOMES = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: (
        "completed",
        "activity_task_completed_event_attributes",
    ),
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ("failed", "activity_task_failed_event_attributes"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: (
        "timed_out",
        "activity_task_timed_out_event_attributes",
    ),
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED: (
        "cancel_requested",
        "activity_task_cancel_requested_event_attributes",
    ),
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: (
        "canceled",
        "activity_task_canceled_event_attributes",
    ),
}


async def activities_of(handle: WorkflowHandle[Any, Any]) -> tuple[int, list[dict[str, Any]]]:
    """The history's length and each activity scheduled: name, attempts, outcome."""
    count = 0
    acts: dict[int, dict[str, Any]] = {}
    async for e in handle.fetch_history_events():
        count += 1
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            acts[e.event_id] = {"name": name, "attempts": 0, "outcome": None}
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = e.activity_task_started_event_attributes
            act = acts.get(started.scheduled_event_id)
            if act is not None:
                act["attempts"] = max(act["attempts"], started.attempt)
                if started.attempt > 1 and started.HasField("last_failure"):
                    # What the attempt before this one failed with (the retry's reason).
                    failure = started.last_failure
                    kind = failure.application_failure_info.type
                    act["retried_after"] = f"{kind}: {failure.message}"[:300]
        elif e.event_type in _OUTCOMES:
            label, attr = _OUTCOMES[e.event_type]
            act = acts.get(getattr(e, attr).scheduled_event_id)
            if act is not None and act["outcome"] != "completed":
                act["outcome"] = label
        elif (local := local_activity(e)) is not None:
            data, result = local
            acts[e.event_id] = {
                "name": data["activity_type"],
                "attempts": int(data.get("attempt", 1)),
                "outcome": "completed" if result is not None else "failed",
                "local": True,
            }
    return count, list(acts.values())


def local_activity(e: Any) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """A local activity's marker (warm-up and model opening run as local activities):
    its data (type, attempt) and its result, or None for any other event."""
    if e.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
        return None
    attrs = e.marker_recorded_event_attributes
    if attrs.marker_name != "core_local_activity" or "data" not in attrs.details:
        return None
    data = json.loads(attrs.details["data"].payloads[0].data)
    result = attrs.details["result"].payloads if "result" in attrs.details else []
    return data, (json.loads(result[0].data) if result else None)


def attempts_by_name(acts: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for act in acts:
        out[act["name"]] = out.get(act["name"], 0) + act["attempts"]
    return out


def _training_calls(data_plane: dict[str, int]) -> int:
    return sum(n for scope, n in data_plane.items() if scope.endswith(":forward_backward"))


async def first_call_accepted(st: Stack, job_id: str, probe_s: float) -> tuple[datetime, int, bool]:
    """Read the plane's per-job data-plane counters (admin stats; the gateway counts a
    request once the trainer has answered it) until a ``forward_backward`` shows. Returns
    the send time of the first read that saw one, the number of reads, and whether the very
    first read already did (then the figure is an upper bound)."""
    job_name = st.job_name(job_id)
    probes = 0
    while True:
        sent = datetime.now(UTC)
        seen = _training_calls(await st.admin.data_plane(job_name))
        probes += 1
        if seen >= 1:
            return sent, probes, probes == 1
        await asyncio.sleep(probe_s)


async def model_of(handle: WorkflowHandle[Any, Any]) -> str:
    """The model the workflow trains: the result of its last completed ``open_model``."""
    opened: dict[int, bool] = {}
    model_id = None
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            opened[e.event_id] = name == "open_model"
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = e.activity_task_completed_event_attributes
            if opened.get(done.scheduled_event_id) and done.result.payloads:
                model_id = json.loads(done.result.payloads[0].data)["session"]["model_id"]
        elif (local := local_activity(e)) is not None:
            data, result = local
            if data["activity_type"] == "open_model" and result:
                model_id = result["session"]["model_id"]
    if model_id is None:
        raise RuntimeError(f"{handle.id}: no open_model has completed yet")
    return str(model_id)


async def track_steps(
    st: Stack, job_id: str, model_id: str, probe_s: float, seen: list[int]
) -> None:
    """Record the model's optimizer steps (``get_info``'s ``optim_steps``, asked of the
    trainer process directly) until it stops answering: the last value is the step its
    death lost, within one probe."""
    async with direct_trainer(st.admin, job_id, st.api_key, account=st.account_id) as trainer:
        while True:
            try:
                info = await trainer.get_info(model_id)
            except PlatformError:
                return
            seen.append(int(info.optim_steps or 0))
            await asyncio.sleep(probe_s)


def trainer_id_of(st: Stack, name: str) -> Callable[[JobEvent], bool]:
    """The job's trainers: their ids name the workflow (``bench-<name>-<hex>``), or, for a
    workflow id that does not fit in one, start with the job's name."""
    owner, prefix = f"bench-{name}-", f"{name[:40]}-"
    return lambda e: (owner_of(e.job_id) or "").startswith(owner) or e.job_id.startswith(prefix)


# --------------------------------------------------------------------- (a) readiness


async def readiness_run(
    st: Stack, runner: Runner, name: str, poll: str, args: argparse.Namespace
) -> dict[str, Any]:
    mine = trainer_id_of(st, name)
    handle = await runner.start(job_spec(name, steps=5, every=5, poll=poll))
    async with asyncio.timeout(RUN_TIMEOUT_S):
        running = await st.events.wait(lambda e: mine(e) and e.state is JobState.RUNNING)
        first_step_at, probes, upper_bound = await first_call_accepted(
            st, running.job_id, args.probe_ms / 1000
        )
        status: JobStatus = await handle.result()
    _, acts = await activities_of(handle)
    t = status.timings
    assert status.started_at is not None
    waiting_from = status.started_at.timestamp() + t.get("PENDING", 0) + t.get("QUEUED", 0)
    noticed = waiting_from + t.get("SCHEDULING", 0)
    running_at = running.event_time.timestamp()
    waits = [a for a in acts if a["name"] == "wait_for_running"]
    # The poll activity completing means polling saw RUNNING; cancelled means an event did.
    if not waits:
        by = "create"  # already RUNNING when created: nothing to wait for
    elif any(a["outcome"] == "completed" for a in waits):
        by = "poll"
    else:
        by = "event"
    lag = first_step_at.timestamp() - running_at
    preparing = t.get("PREPARING", 0)
    return {
        "trainer_job_id": running.job_id,
        "running_at": running.event_time.isoformat(),
        "readiness_lag_s": r3(lag),
        "notice_lag_s": r3(noticed - running_at),
        "preparing_s": r3(preparing),
        # The rest: the first train_chunk scheduled and started, the loop's first step
        # preparing its batch (tokenizing the dataset), the submission answered.
        "after_preparing_s": r3(lag - (noticed - running_at) - preparing),
        "running_after_wait_started": running_at > waiting_from,
        "noticed_by": by,
        "wait_for_running_attempts": max((a["attempts"] for a in waits), default=0),
        "probes": probes,
        "first_probe_already_past_step_0": upper_bound,
    }


async def section_readiness(st: Stack, args: argparse.Namespace) -> dict[str, Any]:
    configs = [
        ("events (bridge, poll 5s)", True, "5s"),
        ("polling 5s", False, "5s"),
        ("polling 1s", False, "1s"),
    ]
    out: dict[str, Any] = {}
    async with plane_faults(st, {"bootDelaySeconds": args.boot_delay}) as faults:
        for label, events, poll in configs:
            runs = []
            async with shepherd_worker(st, "recovery", events=events) as runner:
                for i in range(args.runs):
                    name = f"ready-{'ev' if events else 'poll'}-{poll}-{i}"
                    runs.append(await readiness_run(st, runner, name, poll, args))
                    log(
                        f"(a) {label} run {i + 1}: lag {runs[-1]['readiness_lag_s']:.3f} s "
                        f"(noticed after {runs[-1]['notice_lag_s']:.3f} s by {runs[-1]['noticed_by']})"
                    )
            out[label] = {
                "event_bridge": events,
                "poll_interval": poll,
                "readiness_lag_s": summary([r["readiness_lag_s"] for r in runs]),
                "notice_lag_s": summary([r["notice_lag_s"] for r in runs]),
                "preparing_s": summary([r["preparing_s"] for r in runs]),
                "after_preparing_s": summary([r["after_preparing_s"] for r in runs]),
                "noticed_by": {
                    k: sum(r["noticed_by"] == k for r in runs) for k in ("event", "poll", "create")
                },
                "runs": runs,
            }
        plane = {k: faults[k] for k in ("bootDelaySeconds", "routeLagSeconds", "gatewayReplicas")}
    return {
        "plane": plane,
        "job": "5 steps, checkpoint every 5 (evaluated), promote none, no compute delay",
        "target_s": READINESS_TARGET_S,
        "method": (
            "RUNNING time = eventTime of the job's RUNNING event on the platform's SSE stream "
            "(= the job's updateTime at that transition). First call accepted = send time of "
            f"the first of the benchmark's reads of the plane's per-job data-plane counters "
            f"(admin stats, every {args.probe_ms:g} ms, started on the RUNNING event) that "
            "shows a forward_backward (the gateway counts it once the trainer has answered the "
            "submission with its future); resolution one read interval plus a local round trip. "
            "readiness_lag = first call accepted - RUNNING. "
            "Decomposition from the final JobStatus: notice_lag = (started_at + PENDING + QUEUED "
            "+ SCHEDULING timings) - RUNNING, i.e. when the workflow left SCHEDULING; preparing = "
            "PREPARING timing (route warm-up + opening the model); after_preparing = the "
            "rest (first train_chunk scheduled, the loop's first batch, the call). "
            "noticed_by: 'poll' when the wait_for_running activity completed, 'event' when it "
            "was cancelled because a platform_event signal came first (from the workflow history)."
        ),
        "configs": out,
    }


# ----------------------------------------------------------------------- (b) warm-up


async def section_warmup(st: Stack, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with shepherd_worker(st, "recovery", events=True) as runner:
        for label, lag in ROUTE_LAGS.items():
            runs = []
            async with plane_faults(st, {"routeLagSeconds": lag, "bootDelaySeconds": 0}):
                for i in range(args.runs):
                    name = f"warm-{lag['min']:g}-{lag['max']:g}-{i}".replace(".", "p")
                    handle = await runner.start(job_spec(name, steps=5, every=5))
                    async with asyncio.timeout(RUN_TIMEOUT_S):
                        status: JobStatus = await handle.result()
                    _, acts = await activities_of(handle)
                    warm = [a for a in acts if a["name"] == "warm_up"]
                    stats = await st.admin.job_stats(st.job_name(status.trainer_job_id or ""))
                    runs.append(
                        {
                            "trainer_job_id": status.trainer_job_id,
                            "preparing_s": r3(status.timings.get("PREPARING", 0)),
                            "warm_up_attempts": max((a["attempts"] for a in warm), default=0),
                            "route404s": stats.get("route404s", 0),
                        }
                    )
                    log(f"(b) {label} run {i + 1}: PREPARING {runs[-1]['preparing_s']:.3f} s")
            out[label] = {
                "routeLagSeconds": lag,
                "preparing_s": summary([r["preparing_s"] for r in runs]),
                "warm_up_attempts": summary([r["warm_up_attempts"] for r in runs]),
                "runs": runs,
            }
    return {
        "job": "5 steps, checkpoint every 5, promote none; event bridge on; bootDelaySeconds 0",
        "method": "PREPARING from the final JobStatus.timings (RUNNING noticed → warm route, no "
        "checkpoint to load on a fresh job); warm_up attempts from the workflow history",
        "configs": out,
    }


# ------------------------------------------------------------ (c)+(d) preemption recovery


async def preemption_run(
    st: Stack, runner: Runner, name: str, offset_s: float, args: argparse.Namespace
) -> dict[str, Any]:
    spec = job_spec(name, steps=PREEMPT_TOTAL, every=PREEMPT_EVERY, step_ms=PREEMPT_STEP_MS)
    handle = await runner.start(spec)
    async with asyncio.timeout(RUN_TIMEOUT_S):
        mid = await until(
            handle, lambda s: s.step >= PREEMPT_AFTER_STEP and s.phase is Phase.TRAINING
        )
        job_id = mid.trainer_job_id or ""
        steps_seen: list[int] = []
        tracker = asyncio.create_task(
            track_steps(st, job_id, await model_of(handle), args.probe_ms / 1000, steps_seen)
        )
        await asyncio.sleep(offset_s)
        preempted_at = datetime.now(UTC)
        await st.admin.preempt(job_id, account=st.account_id)
        await tracker
        status: JobStatus = await handle.result()
    if len(status.recoveries) != 1:
        raise RuntimeError(f"{name}: expected one recovery, got {len(status.recoveries)}")
    rec = status.recoveries[0]
    events = st.events.of(job_id)
    failed = next(e for e in events if e.event_time >= preempted_at and e.state is JobState.FAILED)
    restarted = next(
        e for e in events if e.id > failed.id and e.state in (JobState.PENDING, JobState.CREATING)
    )
    back = next(e for e in events if e.id > restarted.id and e.state is JobState.RUNNING)
    _, acts = await activities_of(handle)
    chunk_attempts = [a["attempts"] for a in acts if a["name"] == "train_chunk"]
    warm_attempts = [a["attempts"] for a in acts if a["name"] == "warm_up"]
    duration = rec.duration_s or 0.0
    platform_restart = seconds_between(back.event_time, restarted.event_time)
    applied = max(steps_seen) if steps_seen else None
    resumed = rec.resumed_from_step if rec.resumed_from_step is not None else 0
    return {
        "trainer_job_id": job_id,
        "reason": rec.reason,
        "preempt_offset_s": r3(offset_s),
        "duration_s": r3(duration),
        "beyond_boot_delay_s": r3(duration - args.boot_delay),
        "platform_restart_s": r3(platform_restart),
        "beyond_platform_restart_s": r3(duration - platform_restart),
        "detect_s": r3(seconds_between(rec.started_at, failed.event_time)),
        "death_to_recovered_s": r3(duration + seconds_between(rec.started_at, failed.event_time)),
        "at_step": rec.at_step,
        "resumed_from_step": rec.resumed_from_step,
        "steps_redone": rec.steps_redone,
        "trainer_step_at_death": applied,
        "steps_really_redone": None if applied is None else applied - resumed,
        # A chunk attempt 2 means the death first surfaced as something retryable (a 502 for
        # the request the trainer died in, or a 404 while the plane still said RUNNING: a
        # "route race"); train_chunk_retried_after says which.
        "death_seen_as": "retried, then lost" if max(chunk_attempts) > 1 else "lost at once",
        # Per activity, in order (the warm-ups: the first start, then after the resume).
        "train_chunk_attempts": chunk_attempts,
        "train_chunk_retried_after": [
            a["retried_after"] for a in acts if a["name"] == "train_chunk" and "retried_after" in a
        ],
        "warm_up_attempts": warm_attempts,
        "final_phase": status.phase.value,
        "final_step": status.step,
    }


async def section_preemption(st: Stack, args: argparse.Namespace) -> dict[str, Any]:
    chunk_s = PREEMPT_EVERY * PREEMPT_STEP_MS / 1000
    runs = []
    async with (
        plane_faults(st, {"bootDelaySeconds": args.boot_delay}) as faults,
        shepherd_worker(st, "recovery", events=True) as runner,
    ):
        for i in range(args.runs):
            # Spread the preemption over the chunk: early, middle and late in it.
            offset = chunk_s * (0.1 + 0.7 * (i + 0.5) / args.runs)
            runs.append(await preemption_run(st, runner, f"preempt-{i}", offset, args))
            r = runs[-1]
            log(
                f"(c) run {i + 1}: duration {r['duration_s']:.3f} s (beyond boot delay "
                f"{r['beyond_boot_delay_s']:.3f} s), detect {r['detect_s']:.3f} s, "
                f"redone {r['steps_redone']} (really {r['steps_really_redone']})"
            )
        plane = {
            k: faults[k] for k in ("bootDelaySeconds", "routeLagSeconds", "deathSettleSeconds")
        }
    beyond = [r["beyond_boot_delay_s"] for r in runs]
    redone = [r["steps_redone"] for r in runs if r["steps_redone"] is not None]
    really = [r["steps_really_redone"] for r in runs if r["steps_really_redone"] is not None]
    return {
        "plane": plane,
        "job": (
            f"{PREEMPT_TOTAL} steps x {PREEMPT_STEP_MS:g} ms, checkpoint every {PREEMPT_EVERY} "
            f"(chunk {PREEMPT_EVERY}), promote none; event bridge on; preempted (admin :preempt, "
            f"SIGKILL of the trainer) once the workflow trains the chunk after step "
            f"{PREEMPT_AFTER_STEP}, at an offset spread over the chunk"
        ),
        "method": (
            "duration_s = RecoveryRecord.duration_s (workflow time from the start of recovery to "
            "a warm trainer with the checkpoint loaded); beyond_boot_delay = duration_s - "
            "bootDelaySeconds; platform_restart = RUNNING eventTime - the resume's PENDING/"
            "CREATING eventTime (process spawn + boot delay: the platform's whole share); "
            "detect = RecoveryRecord.started_at - the FAILED eventTime (not inside duration_s). "
            "steps_really_redone = the model's optimizer steps at death (the last optim_steps "
            f"its get_info reported, asked of the trainer process directly every "
            f"{args.probe_ms:g} ms) - resumed_from_step."
        ),
        "recovery": {
            "duration_s": summary([r["duration_s"] for r in runs]),
            "beyond_boot_delay_s": summary(beyond),
            "platform_restart_s": summary([r["platform_restart_s"] for r in runs]),
            "beyond_platform_restart_s": summary([r["beyond_platform_restart_s"] for r in runs]),
            "detect_s": summary([r["detect_s"] for r in runs]),
            "death_to_recovered_s": summary([r["death_to_recovered_s"] for r in runs]),
            "death_seen_as": {
                k: sum(r["death_seen_as"] == k for r in runs)
                for k in ("lost at once", "retried, then lost")
            },
            "target_s": RECOVERY_TARGET_S,
            "target_met": bool(beyond) and max(beyond) <= RECOVERY_TARGET_S,
            "target_note": "met when every run's beyond_boot_delay_s is <= the target",
        },
        "steps_redone": {
            "record": summary(redone),
            "really": summary(really),
            "checkpoint_interval": PREEMPT_EVERY,
            "target_met": bool(redone) and max(redone) <= PREEMPT_EVERY,
            "really_within_interval": bool(really) and max(really) <= PREEMPT_EVERY,
        },
        "runs": runs,
    }


# ------------------------------------------------------------- (e) control-plane requests


async def section_requests(st: Stack, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with plane_faults(st, {"bootDelaySeconds": 0}):
        for label, events in (("events", True), ("polling only", False)):
            runs = []
            async with shepherd_worker(st, "recovery", events=events) as runner:
                for i in range(args.runs):
                    name = f"plain-{'ev' if events else 'poll'}-{i}"
                    before = (await st.admin.stats())["controlPlaneRequests"]
                    start = time.perf_counter()
                    handle = await runner.start(
                        job_spec(
                            name, steps=20, every=10, model_id=f"{name}-{uuid.uuid4().hex[:6]}"
                        )
                    )
                    async with asyncio.timeout(RUN_TIMEOUT_S):
                        status: JobStatus = await handle.result()
                    wall = time.perf_counter() - start
                    stats = await st.admin.stats()
                    job = stats["jobs"].get(st.job_name(status.trainer_job_id or ""), {})
                    count, acts = await activities_of(handle)
                    runs.append(
                        {
                            "trainer_job_id": status.trainer_job_id,
                            "per_job_requests": job.get("controlPlaneRequests", 0),
                            # The admin stats reads are not /v1 requests: not counted.
                            "all_requests_during_job": stats["controlPlaneRequests"] - before,
                            "wall_s": r3(wall),
                            "history_events": count,
                            # Attempts the history records per activity type (one cancelled
                            # while waiting for its next retry records none).
                            "activity_attempts": attempts_by_name(acts),
                        }
                    )
                    log(f"(e) {label} run {i + 1}: {runs[-1]['per_job_requests']} per-job requests")
            out[label] = {
                "event_bridge": events,
                "per_job_requests": summary([r["per_job_requests"] for r in runs]),
                "all_requests_during_job": summary([r["all_requests_during_job"] for r in runs]),
                "wall_s": summary([r["wall_s"] for r in runs]),
                "runs": runs,
            }
    return {
        "job": "20 steps, checkpoint every 10 (evaluated, keep_last 3), promote last; "
        "policies default (poll_interval 5s); bootDelaySeconds 0",
        "method": (
            "per_job_requests = the plane's per-job controlPlaneRequests counter (requests on "
            "/v1/.../rlorTrainerJobs/{job}...: get, delete, resume, its checkpoints; not the "
            "create, which is an account-level request, nor the data plane). "
            "all_requests_during_job = the plane's total /v1 counter over the job's life, which "
            "adds create, promote, model/operation reads and the SSE stream connections."
        ),
        "configs": out,
    }


# ------------------------------------------------------------------------------ plot


def plot(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """One panel per figure: values per configuration as points over a box."""
    plt = pyplot()
    if plt is None:
        return no_plot()

    panels: list[tuple[str, str, dict[str, list[float]], float | None]] = []
    s = report["sections"]
    if "configs" in s.get("a_readiness", {}):
        data = {k: v["readiness_lag_s"]["values"] for k, v in s["a_readiness"]["configs"].items()}
        panels.append(
            ("(a) RUNNING → first call accepted", "seconds", data, s["a_readiness"]["target_s"])
        )
    if "configs" in s.get("b_warmup", {}):
        data = {k: v["preparing_s"]["values"] for k, v in s["b_warmup"]["configs"].items()}
        panels.append(("(b) PREPARING (route warm-up)", "seconds", data, None))
    if "recovery" in s.get("c_preemption", {}):
        rec = s["c_preemption"]["recovery"]
        data = {
            "beyond boot delay": rec["beyond_boot_delay_s"]["values"],
            "beyond platform restart": rec["beyond_platform_restart_s"]["values"],
            "detect": rec["detect_s"]["values"],
        }
        panels.append(("(c) preemption recovery", "seconds", data, rec["target_s"]))
    if "configs" in s.get("e_requests", {}):
        data = {k: v["per_job_requests"]["values"] for k, v in s["e_requests"]["configs"].items()}
        panels.append(("(e) control-plane requests per job", "requests", data, None))
    if not panels:
        return {"written": False, "path": None, "note": "no section produced figures"}

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
    for ax, (title, unit, data, target) in zip(axes[0], panels, strict=True):
        labels = list(data)
        ax.boxplot([data[k] or [np.nan] for k in labels], widths=0.5)
        for i, k in enumerate(labels, start=1):
            ax.scatter([i] * len(data[k]), data[k], s=14, alpha=0.7, zorder=3)
        if target is not None:
            ax.axhline(
                target, color="red", linestyle="--", linewidth=1, label=f"target {target:g} s"
            )
            ax.legend(fontsize=8)
        ax.set_xticks(
            range(1, len(labels) + 1), [k.replace(" (", "\n(") for k in labels], fontsize=8
        )
        ax.set(title=title, ylabel=unit)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return save_plot(plt, fig, out)


# ------------------------------------------------------------------------------- run

SECTIONS: dict[
    str, tuple[str, Callable[[Stack, argparse.Namespace], Awaitable[dict[str, Any]]]]
] = {
    "a": ("a_readiness", section_readiness),
    "b": ("b_warmup", section_warmup),
    "c": ("c_preemption", section_preemption),
    "e": ("e_requests", section_requests),
}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    sections: dict[str, Any] = {}
    async with recovery_stack() as st:
        async with shepherd_worker(st, "recovery", events=True) as runner:
            # Not measured: pays the first workflow's sandbox imports and the plane's first trainer.
            log("warm-up job (not measured)")
            handle = await runner.start(job_spec("warmup", steps=2, every=2))
            async with asyncio.timeout(RUN_TIMEOUT_S):
                await handle.result()
        baseline = await st.admin.faults()
        for key in args.sections:
            title, run = SECTIONS[key]
            log(f"--- section {title}")
            try:
                sections[title] = await run(st, args)
            except Exception as exc:  # noqa: BLE001 - report it, run the other sections
                log(traceback.format_exc())
                sections[title] = {"error": f"{type(exc).__name__}: {exc or '(no message)'}"}
    if "c_preemption" in sections and "steps_redone" in sections["c_preemption"]:
        c = sections["c_preemption"]
        sections["d_steps_redone"] = {"see": "c_preemption.steps_redone", **c["steps_redone"]}
    targets = {}
    if READINESS_TARGET_CONFIG in sections.get("a_readiness", {}).get("configs", {}):
        lag = sections["a_readiness"]["configs"][READINESS_TARGET_CONFIG]["readiness_lag_s"]
        targets[f"a_readiness_lag_with_events_le_{READINESS_TARGET_S:g}s"] = {
            "p50": lag["p50"],
            "max": lag["max"],
            "met": lag["p50"] is not None and lag["p50"] <= READINESS_TARGET_S,
            "note": "met when the p50 over runs is <= the target",
        }
    if "recovery" in sections.get("c_preemption", {}):
        rec = sections["c_preemption"]["recovery"]
        targets[f"c_recovery_beyond_boot_delay_le_{RECOVERY_TARGET_S:g}s"] = {
            "p50": rec["beyond_boot_delay_s"]["p50"],
            "max": rec["beyond_boot_delay_s"]["max"],
            "met": rec["target_met"],
        }
        redone = sections["c_preemption"]["steps_redone"]
        targets["d_steps_redone_le_interval"] = {
            "p50": redone["record"]["p50"],
            "max": redone["record"]["max"],
            "interval": redone["checkpoint_interval"],
            "met": redone["target_met"],
            "really_redone_max": redone["really"]["max"],
            "really_within_interval": redone["really_within_interval"],
        }
    return {
        "benchmark": "recovery",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "settings": {
            "runs": args.runs,
            "boot_delay_s": args.boot_delay,
            "probe_ms": args.probe_ms,
            "sections": args.sections,
            "worker": "in-process Worker (SDK defaults), one per configuration; EventBridge where events are on",
        },
        "plane": {"requested_config": PLANE_CONFIG, "baseline_config": baseline},
        "targets": targets,
        "sections": sections,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive(int), default=5, help="runs per configuration")
    parser.add_argument(
        "--boot-delay", type=float, default=2.0, help="bootDelaySeconds for (a) and (c)"
    )
    parser.add_argument(
        "--probe-ms", type=positive(float), default=10.0, help="direct trainer probe interval (ms)"
    )
    parser.add_argument(
        "--sections", default="abce", help="which of a, b, c(+d), e to run (default: all)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG plot path")
    args = parser.parse_args(argv)
    unknown = set(args.sections) - set(SECTIONS)
    if unknown or not args.sections:
        parser.error(f"--sections: letters among {''.join(SECTIONS)} (d comes with c)")
    if args.boot_delay < 0:
        parser.error("--boot-delay must be >= 0")
    args.sections = "".join(dict.fromkeys(args.sections))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = run_main(lambda: bench(args), lambda report: plot(args.out, report))
    if any("error" in v for v in report["sections"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
