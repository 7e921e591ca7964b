"""Benchmark: how long a SIGKILLed worker stalls the job whose training chunk it ran.

Issue 9 ("A worker crash stalls its jobs ~30 s") asks for a stall of at most 5 s. On a fresh
stack (the Temporal dev server on a SQLite file in a temp dir, localplane) two Shepherd
workers run as separate processes started the way production starts them (``shepherd
worker``, configured by env; bench/scale.py starts them). ``--runs`` jobs run one after
another, each ``--steps`` (60) slow steps (``--step-ms`` 50 ms of emulated GPU time per
forward_backward), a checkpoint every 20, promote none, default policies (so the default
``policies.heartbeat_timeout`` applies). Per run:

1. the job's model is followed on its trainer process (``get_info``'s ``optim_steps``, asked
   of the trainer directly every ``--probe-ms``, as bench/recovery.py does);
2. once it reaches ``--kill-step`` (25, mid-chunk 21-40) the worker running the chunk (its
   pid from the pending activity's ``last_worker_identity``, "<pid>@host backends=...") is
   SIGKILLed, and a replacement worker is started at once, as a process supervisor would;
3. the workflow is described every ``--describe-ms`` until the chunk's retry runs, which
   splits the stall into its parts (heartbeat timeout detection, retry backoff, dispatch,
   the new attempt's resume);
4. the job runs to its end: completed, trainers created (admin stats), steps applied twice.

``--baseline-runs`` (1) jobs run first without a kill: their duration and checkpoint-boundary
gaps are what the killed runs are compared with. ``method`` in the JSON defines every figure.

Prints one JSON document on stdout (progress goes to stderr) and writes a PNG plot to
``--out`` (each run's stall, split into its parts) when matplotlib is importable.

Run: ``.venv/bin/python bench/crash.py [--runs 5] [--kill-step 25] [--out bench/out/crash.png]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import WorkflowHandle

from shepherd.jobs import start_job
from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.platform import PlatformError
from shepherd.spec import JobSpec, validate_spec
from workflows import policies
from workflows.policies import Policies

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from common import (
    Stack,
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
    summary,
    supervised_settings,
    supervised_spec,
)
from recovery import model_of
from scale import (
    WorkerProcess,
    cancel,
    keep_logs,
    start_workers,
    stop_workers,
    tail,
    worker_command,
    worker_sizing,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "crash.png"
#: Issue 9's target: the jobs whose chunk ran on a killed worker stall at most this long.
TARGET_STALL_S = 5.0
WORKERS = 2
EVERY = 20
BATCH_SIZE = 4
PLANE_CONFIG: dict[str, Any] = {"capacity": 2, "bootDelaySeconds": 0.0}
#: The activity whose worker is killed.
CHUNK_ACTIVITY = "train_chunk"
#: One job, start to finish, is bounded by this (a hang fails the run, not the machine).
RUN_TIMEOUT_S = 240.0
#: After the kill, the retry of the chunk must have started within this.
RETRY_TIMEOUT_S = 120.0
#: Without a known retry start: steps applied this long after the kill are the dead
#: worker's own (operations it had submitted before it died), not the retry's.
ORPHAN_SETTLE_S = 1.0


def secs(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def now() -> datetime:
    return datetime.now(UTC)


def ts(msg: Any, name: str) -> datetime | None:
    """A protobuf Timestamp field as an aware datetime, or None when unset."""
    if not msg.HasField(name):
        return None
    t = getattr(msg, name)
    if t.seconds == 0 and t.nanos == 0:
        return None
    return t.ToDatetime(tzinfo=UTC)


def pid_of(identity: str) -> int | None:
    """The pid in a worker identity ("<pid>@<host> backends=...", preflight.worker_identity)."""
    head = identity.partition("@")[0]
    return int(head) if head.isdigit() else None


# ------------------------------------------------------------------------ the steps


@dataclass
class Probe:
    sent: datetime
    got: datetime
    step: int


@dataclass
class StepTracker:
    """The model's optimizer steps (``get_info``'s ``optim_steps``), asked of the trainer
    process directly (no gateway, no Temporal) every ``probe_s`` until it stops answering."""

    probes: list[Probe] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def follow(self, st: Stack, job_id: str, model_id: str, probe_s: float) -> None:
        async with direct_trainer(st.admin, job_id, st.api_key, account=st.account_id) as trainer:
            while True:
                sent = now()
                try:
                    info = await trainer.get_info(model_id)
                except (PlatformError, httpx.HTTPError):
                    return  # the trainer is gone (the job deleted it)
                self.probes.append(Probe(sent, now(), int(info.optim_steps or 0)))
                self.changed.set()
                await asyncio.sleep(probe_s)

    @property
    def step(self) -> int:
        return self.probes[-1].step if self.probes else 0

    @property
    def max_step(self) -> int:
        return max((p.step for p in self.probes), default=0)

    async def wait_step(self, step: int) -> None:
        while self.step < step:
            self.changed.clear()
            await self.changed.wait()

    def first_seen(self) -> dict[int, datetime]:
        """Each step value, and the reply time of the first probe that showed it."""
        seen: dict[int, datetime] = {}
        for p in self.probes:
            seen.setdefault(p.step, p.got)
        return seen

    def boundary_gaps(self, every: int, total: int) -> dict[int, float]:
        """For each checkpoint step k < total: first seen k -> first seen k+1 (the chunk's
        end, the checkpoint and its evaluation, the next chunk's start)."""
        seen = self.first_seen()
        return {
            k: r3(secs(seen[k + 1], seen[k]))
            for k in range(every, total, every)
            if k in seen and k + 1 in seen
        }

    def step_gap_p50(self) -> float | None:
        """The median time between consecutive new steps (the steps' own pace)."""
        seen = sorted(self.first_seen().items())
        gaps = [secs(b[1], a[1]) for a, b in zip(seen, seen[1:], strict=False) if b[0] == a[0] + 1]
        return summary(gaps, raw=False)["p50"]


# --------------------------------------------------------------------- the activity


@dataclass
class Snapshot:
    """The pending chunk activity, as one DescribeWorkflowExecution saw it."""

    at: datetime
    activity_id: str
    attempt: int
    state: str
    identity: str
    last_started: datetime | None
    last_heartbeat: datetime | None
    last_attempt_complete: datetime | None
    next_attempt_schedule: datetime | None
    failure: str | None

    @classmethod
    def of(cls, at: datetime, pa: PendingActivityInfo) -> Snapshot:
        # Not read: current_retry_interval (on this server it holds what looks like an epoch
        # timestamp in seconds, not an interval).
        return cls(
            at=at,
            activity_id=pa.activity_id,
            attempt=pa.attempt,
            state=PendingActivityState.Name(pa.state).removeprefix("PENDING_ACTIVITY_STATE_"),
            identity=pa.last_worker_identity,
            last_started=ts(pa, "last_started_time"),
            last_heartbeat=ts(pa, "last_heartbeat_time"),
            last_attempt_complete=ts(pa, "last_attempt_complete_time"),
            next_attempt_schedule=ts(pa, "next_attempt_schedule_time"),
            failure=pa.last_failure.message[:200] if pa.HasField("last_failure") else None,
        )


async def chunk_activity(handle: WorkflowHandle[Any, Any]) -> Snapshot | None:
    desc = await handle.describe()
    at = now()
    for pa in desc.raw_description.pending_activities:
        if pa.activity_type.name == CHUNK_ACTIVITY:
            return Snapshot.of(at, pa)
    return None


async def watch_retry(
    handle: WorkflowHandle[Any, Any], activity_id: str, every_s: float, out: list[Snapshot]
) -> None:
    """Describe the workflow until the chunk ``activity_id`` is STARTED again on a later
    attempt (or is gone: it completed between two looks)."""
    while True:
        snap = await chunk_activity(handle)
        if snap is None or snap.activity_id != activity_id:
            return
        out.append(snap)
        if snap.attempt > 1 and snap.state == "STARTED":
            return
        await asyncio.sleep(every_s)


@dataclass
class ChunkHistory:
    """What the history says, after the run, about the killed chunk and the workflow tasks."""

    attempts: int | None = None
    retried_identity: str | None = None
    retried_after: str | None = None
    workflow_identity_at_kill: str | None = None
    #: WorkflowTaskScheduled -> Started of the first workflow task after the retried chunk
    #: completed (it waits on the sticky queue of the worker that last ran the workflow).
    task_wait_after_chunk_s: float | None = None
    task_identity_after_chunk: str | None = None


async def read_history(
    handle: WorkflowHandle[Any, Any], activity_id: str, kill_at: datetime
) -> ChunkHistory:
    h = ChunkHistory()
    scheduled_id: int | None = None
    chunk_done = False
    # The first workflow task after the chunk completed: on a dead worker's sticky queue it
    # times out (ScheduleToStart) and is scheduled again; the wait counts from the first.
    task_scheduled: datetime | None = None
    async for e in handle.fetch_history_events():
        t = e.event_time.ToDatetime(tzinfo=UTC)
        kind = e.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            identity = e.workflow_task_started_event_attributes.identity
            if t <= kill_at:
                h.workflow_identity_at_kill = identity
            elif task_scheduled is not None and h.task_wait_after_chunk_s is None:
                h.task_wait_after_chunk_s = r3(secs(t, task_scheduled))
                h.task_identity_after_chunk = identity
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            if chunk_done and task_scheduled is None:
                task_scheduled = t
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if e.activity_task_scheduled_event_attributes.activity_id == activity_id:
                scheduled_id = e.event_id
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = e.activity_task_started_event_attributes
            if attrs.scheduled_event_id == scheduled_id:
                h.attempts, h.retried_identity = attrs.attempt, attrs.identity
                if attrs.HasField("last_failure"):
                    h.retried_after = attrs.last_failure.message[:200]
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = e.activity_task_completed_event_attributes
            chunk_done = chunk_done or done.scheduled_event_id == scheduled_id
    return h


# --------------------------------------------------------------------------- workers


@dataclass
class Workers:
    """Every worker process of the run (replacements too): all are stopped at the end."""

    st: Stack
    task_queue: str
    run_dir: Path
    args: argparse.Namespace
    lists: list[list[WorkerProcess]] = field(default_factory=list)
    #: Pids of the workers that have run a loop activity (LOOP_ACTIVITIES).
    warm: set[int] = field(default_factory=set)
    #: WorkerProcess.killed_at_s counts from here.
    t0: float = field(default_factory=time.monotonic)

    @property
    def all(self) -> list[WorkerProcess]:
        return [w for ws in self.lists for w in ws]

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.all if w.alive()]

    def by_pid(self, pid: int | None) -> WorkerProcess | None:
        return next((w for w in self.all if w.pid == pid), None)

    def stop(self) -> None:
        stop_workers(self.all)

    async def start(self, count: int) -> list[WorkerProcess]:
        """``count`` more workers (scale.start_workers, in a directory of their own so their
        indices, logs and ready files do not clash with earlier ones)."""
        ws: list[WorkerProcess] = []
        self.lists.append(ws)  # before the start: a failed start is stopped too
        run_dir = self.run_dir / f"workers-{len(self.lists)}"
        run_dir.mkdir()
        await start_workers(ws, self.st, count, self.task_queue, run_dir, self.args)
        return ws

    def check(self) -> None:
        for w in self.all:
            if not w.alive() and w.killed_at_s is None:
                raise RuntimeError(f"a worker (pid {w.pid}) exited:\n{tail(w.log_path)}")


# --------------------------------------------------------------------------- one run


def job_spec(name: str, args: argparse.Namespace) -> JobSpec:
    settings = supervised_settings(steps=args.steps, batch_size=BATCH_SIZE)
    spec = supervised_spec(name, settings, args.step_ms, {"every_steps": EVERY})
    if args.heartbeat_timeout is None:
        return spec  # the default policies, as a user's job has them
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["policies"] = {"heartbeat_timeout": f"{args.heartbeat_timeout:g}s"}
    return validate_spec(data)


#: Activities that run the training loop: the first one on a worker process loads the
#: loop's per-process caches (the tokenizer: transformers' import; the tokenized dataset).
LOOP_ACTIVITIES = {CHUNK_ACTIVITY, "evaluate"}


async def loop_workers(handle: WorkflowHandle[Any, Any], until: datetime | None = None) -> set[int]:
    """The pids of the workers that ran (the recorded attempt of) a loop activity of this
    workflow, started before ``until`` when given."""
    names: dict[int, str] = {}
    pids: set[int] = set()
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = e.activity_task_started_event_attributes
            at = e.event_time.ToDatetime(tzinfo=UTC)
            if names.get(attrs.scheduled_event_id) in LOOP_ACTIVITIES and (
                until is None or at < until
            ):
                pid = pid_of(attrs.identity)
                if pid is not None:
                    pids.add(pid)
    return pids


async def wait_model(handle: WorkflowHandle[Any, Any]) -> str:
    """The model id, once ``open_model`` has completed."""
    while True:
        with contextlib.suppress(RuntimeError):
            return await model_of(handle)
        await asyncio.sleep(0.1)


async def creates(st: Stack) -> int:
    return int((await st.admin.stats()).get("creates", 0))


async def outcome(
    st: Stack,
    handle: WorkflowHandle[Any, JobStatus],
    tracker: StepTracker,
    follow: asyncio.Task[None],
    creates_before: int,
) -> dict[str, Any]:
    """The job's end: phase, step, trainers created, steps applied twice, duration."""
    status: JobStatus = await handle.result()
    # The tracker ends when the job deletes its trainer; the last probe is the final step.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(follow), 30)
    await cancel(follow)
    desc = await handle.describe()
    job_name = st.job_name(status.trainer_job_id or "")
    return {
        "workflow_id": handle.id,
        "trainer_job_id": status.trainer_job_id,
        "phase": status.phase.value,
        "completed": status.phase is Phase.COMPLETED,
        "final_step": status.step,
        "trainer_max_optim_steps": tracker.max_step,
        "steps_applied_twice": max(0, tracker.max_step - status.step),
        "creates_for_its_trainer": (await st.admin.job_stats(job_name)).get("creates"),
        "creates_during_run": await creates(st) - creates_before,
        "recoveries": len(status.recoveries),
        "duration_s": r3(secs(desc.close_time, desc.start_time))
        if desc.close_time and desc.start_time
        else None,
        "step_gap_p50_s": tracker.step_gap_p50(),
        "boundary_gaps_s": tracker.boundary_gaps(EVERY, status.total_steps or 0),
        "job_error": status.error.model_dump(mode="json") if status.error else None,
    }


async def baseline_run(
    st: Stack, ws: Workers, name: str, args: argparse.Namespace
) -> dict[str, Any]:
    before = await creates(st)
    handle = await start_job(st.client, job_spec(name, args), task_queue=ws.task_queue)
    async with asyncio.timeout(RUN_TIMEOUT_S):
        model_id = await wait_model(handle)
        job_id = (await handle.query("status", result_type=JobStatus)).trainer_job_id or ""
        tracker = StepTracker()
        follow = asyncio.create_task(tracker.follow(st, job_id, model_id, args.probe_ms / 1000))
        try:
            result = await outcome(st, handle, tracker, follow, before)
        finally:
            await cancel(follow)
    ws.warm |= await loop_workers(handle)
    return result


async def crash_run(st: Stack, ws: Workers, name: str, args: argparse.Namespace) -> dict[str, Any]:
    before = await creates(st)
    handle = await start_job(st.client, job_spec(name, args), task_queue=ws.task_queue)
    replacement: asyncio.Task[list[WorkerProcess]] | None = None
    follow: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            model_id = await wait_model(handle)
            job_id = (await handle.query("status", result_type=JobStatus)).trainer_job_id or ""
            tracker = StepTracker()
            follow = asyncio.create_task(tracker.follow(st, job_id, model_id, args.probe_ms / 1000))
            await tracker.wait_step(args.kill_step)
            chunk = await chunk_activity(handle)
            if chunk is None or chunk.state != "STARTED":
                raise RuntimeError(f"{name}: no running {CHUNK_ACTIVITY} at step {tracker.step}")
            victim = ws.by_pid(pid_of(chunk.identity))
            if victim is None or not victim.alive():
                raise RuntimeError(f"{name}: the chunk runs on {chunk.identity!r}, not one of ours")
            step_at_kill = tracker.step
            kill_at = now()
            os.kill(victim.pid, signal.SIGKILL)
            victim.killed_at_s = time.monotonic() - ws.t0
            log(f"{name}: SIGKILLed worker pid {victim.pid} at trainer step {step_at_kill}")
            # A supervisor restarts the worker at once; it competes for the CPU meanwhile.
            replacement = asyncio.create_task(ws.start(1))
            snaps: list[Snapshot] = []
            async with asyncio.timeout(RETRY_TIMEOUT_S):
                await watch_retry(handle, chunk.activity_id, args.describe_ms / 1000, snaps)
            result = await outcome(st, handle, tracker, follow, before)
            new = await replacement
    except BaseException:
        with contextlib.suppress(Exception):
            await handle.terminate(reason="benchmark run failed")
        if follow is not None:
            await cancel(follow)
        if replacement is not None:
            await cancel(replacement)
        raise
    hist = await read_history(handle, chunk.activity_id, kill_at)
    warm = ws.warm | await loop_workers(handle, kill_at)
    ws.warm |= await loop_workers(handle)
    retried_pid = pid_of(hist.retried_identity or "")
    result.update(
        analyse(chunk, snaps, tracker, kill_at, step_at_kill, ChunkPolicy.of(job_spec(name, args))),
        kill_at=kill_at.isoformat(),
        victim_pid=victim.pid,
        replacement_pid=new[0].pid if new else None,
        workflow_ran_on_victim=pid_of(hist.workflow_identity_at_kill or "") == victim.pid,
        retried_on=(
            None
            if hist.retried_identity is None
            else "replacement"
            if new and pid_of(hist.retried_identity) == new[0].pid
            else "survivor"
        ),
        # Whether the worker that ran the retry had run the loop before (its caches loaded).
        retry_worker_warm=None if retried_pid is None else retried_pid in warm,
        chunk_attempts=hist.attempts,
        chunk_retried_after=hist.retried_after,
        task_wait_after_chunk_s=hist.task_wait_after_chunk_s,
    )
    return result


@dataclass(frozen=True)
class ChunkPolicy:
    """What the workflow declares for the chunk (workflows.policies) under the job's spec."""

    heartbeat_timeout_s: float
    #: The retry policy's delay before attempt 2 (its initial interval).
    first_retry_s: float

    @classmethod
    def of(cls, spec: JobSpec) -> ChunkPolicy:
        pol = Policies.for_spec(spec.policies, chunk_steps=spec.steps_per_chunk).train_chunk
        assert pol.heartbeat is not None
        return cls(pol.heartbeat.total_seconds(), pol.retry.initial_interval.total_seconds())


def analyse(
    chunk: Snapshot,
    snaps: list[Snapshot],
    tracker: StepTracker,
    kill_at: datetime,
    step_at_kill: int,
    policy: ChunkPolicy,
) -> dict[str, Any]:
    """The stall and its parts (see METHOD)."""
    retried = [s for s in snaps if s.attempt > chunk.attempt]
    if any(s.attempt > chunk.attempt + 1 for s in retried):
        raise RuntimeError(f"the chunk failed more than once after the kill: {retried[-1]}")
    started = next((s for s in retried if s.state == "STARTED"), None)
    t_start = started.last_started if started else None
    t_next = next((s.next_attempt_schedule for s in retried if s.next_attempt_schedule), None)
    # The server leaves last_attempt_complete_time unset for a timed-out attempt: its
    # failure is the retry's due time minus the policy's (jitter-free) first retry delay.
    t_fail = next((s.last_attempt_complete for s in retried if s.last_attempt_complete), None)
    inferred = t_fail is None and t_next is not None
    if inferred:
        t_fail = t_next - timedelta(seconds=policy.first_retry_s)
    before = [s.at for s in snaps if s.attempt == chunk.attempt]
    after = [s.at for s in retried]
    # Steps the dead worker's own submitted operations still applied after the kill end
    # before the retry starts (or, if its start is unknown, within ORPHAN_SETTLE_S).
    boundary = t_start or kill_at + timedelta(seconds=ORPHAN_SETTLE_S)
    settled = max((p.step for p in tracker.probes if p.got <= boundary), default=step_at_kill)
    resumed = next((p for p in tracker.probes if p.got > boundary and p.step > settled), None)
    stall = secs(resumed.got, kill_at) if resumed else None
    hb = chunk.last_heartbeat or chunk.last_started
    parts = {
        "detect_s": r3(secs(t_fail, kill_at)) if t_fail else None,
        "backoff_s": r3(secs(t_next, t_fail)) if t_next and t_fail else None,
        "dispatch_s": r3(secs(t_start, t_next)) if t_start and t_next else None,
        "resume_s": r3(secs(resumed.got, t_start)) if resumed and t_start else None,
    }
    due = secs(hb, kill_at) + policy.heartbeat_timeout_s if hb else None
    return {
        "step_at_kill": step_at_kill,
        "orphan_steps": settled - step_at_kill,
        "stall_s": r3(stall) if stall is not None else None,
        "first_step_after": resumed.step if resumed else None,
        "parts": parts,
        "detect_inferred_from_retry_due": inferred,
        # The describes that bracket the failure: last one still on the killed attempt,
        # first one on the retry (seconds from the kill).
        "detect_seen_between_s": [
            r3(secs(max(before), kill_at)) if before else None,
            r3(secs(min(after), kill_at)) if after else None,
        ],
        "heartbeat_age_at_kill_s": r3(secs(kill_at, hb)) if hb else None,
        "timeout_due_s": r3(due) if due is not None else None,
        "timeout_lateness_s": r3(secs(t_fail, kill_at) - due)
        if t_fail and due is not None
        else None,
        "retry_failure": next((s.failure for s in retried if s.failure), None),
        "describes": len(snaps),
        # Each change of the pending chunk as the describes saw it (seconds from the kill).
        "pending_chunk": transitions(snaps, kill_at),
    }


def transitions(snaps: list[Snapshot], kill_at: datetime) -> list[dict[str, Any]]:
    def rel(t: datetime | None) -> float | None:
        return None if t is None else r3(secs(t, kill_at))

    out: list[dict[str, Any]] = []
    for s in snaps:
        row = {
            "seen": rel(s.at),
            "attempt": s.attempt,
            "state": s.state,
            "worker_pid": pid_of(s.identity),
            "last_started": rel(s.last_started),
            "last_heartbeat": rel(s.last_heartbeat),
            "last_attempt_complete": rel(s.last_attempt_complete),
            "next_attempt_schedule": rel(s.next_attempt_schedule),
        }
        if not out or {k: v for k, v in out[-1].items() if k != "seen"} != {
            k: v for k, v in row.items() if k != "seen"
        }:
            out.append(row)
    return out


# ---------------------------------------------------------------------------- report


METHOD = {
    "setup": (
        "A fresh stack: the Temporal dev server (shepherd.binaries.temporal()) with its state "
        "in a SQLite file in a temp dir (as `shepherd dev` runs it), localplane (capacity 2, "
        f"no boot delay), {WORKERS} workers as separate processes started as production starts "
        "them (`shepherd worker`, configured by env, event bridge on; bench/scale.py). Jobs are "
        "started with shepherd.jobs.start_job, one after another. The benchmark, the plane and "
        "the Temporal server read this machine's clock."
    ),
    "kill": (
        "once the job's model has applied --kill-step optimizer steps (get_info's optim_steps, "
        "asked of the trainer process directly every --probe-ms), the workflow is described; "
        f"the pending '{CHUNK_ACTIVITY}' activity's last_worker_identity ('<pid>@host "
        "backends=...') names the worker running the chunk, which gets SIGKILL (kill time = "
        "just before os.kill). A replacement worker is started at once (a supervisor's "
        "restart); the trainer itself keeps running."
    ),
    "stall_s": (
        "kill -> the reply of the first get_info probe showing an optimizer step applied by "
        "the chunk's next attempt: a step above the highest one seen by the time that attempt "
        "started (the pending activity's last_started_time; steps the dead worker had "
        "already submitted finish on the trainer before it, as orphan_steps). An upper bound "
        "within one probe interval plus a get_info round trip."
    ),
    "parts": (
        "the stall split at the server's own times, from DescribeWorkflowExecution polled "
        "every --describe-ms after the kill: detect_s = kill -> the attempt failed (the "
        "heartbeat timeout fired: last_attempt_complete_time, which this server leaves unset "
        "for a timeout, so next_attempt_schedule_time - the policy's first retry delay; "
        "detect_seen_between_s brackets it with the describes); backoff_s = -> the retry was "
        "due (next_attempt_schedule_time); dispatch_s = -> a worker started it "
        "(last_started_time); resume_s = -> the first new step (the attempt's setup, the "
        "loop's per-process caches on a worker that never ran the loop (retry_worker_warm "
        "false), and the re-sent, deduplicated operations of the steps its last heartbeat "
        "did not cover)"
    ),
    "heartbeat_age_at_kill_s": (
        "kill - the last heartbeat the server had recorded for the killed attempt (or its "
        "start, before any): the timeout fires heartbeat_timeout after that heartbeat, so "
        "detect_s ~ heartbeat_timeout - this; the SDK sends a heartbeat at most every 80 % "
        "of the timeout, so this ranges over [0, 0.8 x timeout)"
    ),
    "timeout_due_s": "last recorded heartbeat + heartbeat_timeout, from the kill",
    "timeout_lateness_s": "detect_s - timeout_due_s: how late the server's timer fired",
    "task_wait_after_chunk_s": (
        "WorkflowTaskScheduled -> WorkflowTaskStarted of the first workflow task after the "
        "retried chunk completed: when the workflow last ran on the killed worker the task "
        "waits on that worker's sticky queue until the sticky timeout moves it; not in the "
        "stall, but in the job's delay"
    ),
    "completed": "the workflow's result has phase COMPLETED",
    "creates_for_its_trainer": "the plane's per-job 'creates' counter (admin stats) for the "
    "job's trainer: 1 when it was created once; creates_during_run: the plane's total over "
    "the run (runs are sequential), 1 when no second trainer was made",
    "steps_applied_twice": (
        "the trainer model's highest optim_steps seen (probed until the job deleted the "
        "trainer) - the step the job reports at its end, when positive: an operation applied "
        "twice shows as optim_steps beyond the job's steps"
    ),
    "job_delay_s": "the run's workflow duration (start -> close) - the baselines' median",
    "boundary_gaps_s": "per checkpoint step k: first seen k -> first seen k+1 (chunk end, "
    "checkpoint, evaluation, next chunk start)",
}


def targets(runs: list[dict[str, Any]]) -> dict[str, Any]:
    stalls = [r.get("stall_s") for r in runs]
    ok = [r for r in runs if "error" not in r]
    return {
        f"stall_le_{TARGET_STALL_S:g}s": {
            "max_s": max((s for s in stalls if s is not None), default=None),
            "met": bool(stalls) and all(s is not None and s <= TARGET_STALL_S for s in stalls),
        },
        "every_job_completed": {
            "completed": sum(bool(r.get("completed")) for r in runs),
            "runs": len(runs),
            "met": bool(runs) and all(r.get("completed") for r in runs),
        },
        "each_trainer_created_once": {
            "creates": [r.get("creates_for_its_trainer") for r in runs],
            "met": bool(ok)
            and len(ok) == len(runs)
            and all(r["creates_for_its_trainer"] == 1 == r["creates_during_run"] for r in ok),
        },
        "no_step_applied_twice": {
            "max": max((r["steps_applied_twice"] for r in ok), default=None),
            "met": bool(ok)
            and len(ok) == len(runs)
            and all(r["steps_applied_twice"] == 0 for r in ok),
        },
    }


def summarise(runs: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]

    def col(key: str, rows: list[dict[str, Any]] = ok) -> list[float]:
        return [r[key] for r in rows if r.get(key) is not None]

    base = summary(col("duration_s", baseline), raw=False)["p50"]
    for r in ok:
        r["job_delay_s"] = (
            r3(r["duration_s"] - base) if base is not None and r["duration_s"] else None
        )
    parts = {
        k: summary([r["parts"][k] for r in ok if r["parts"][k] is not None])
        for k in ("detect_s", "backoff_s", "dispatch_s", "resume_s")
    }
    return {
        "stall_s": summary(col("stall_s")),
        "parts": parts,
        "resume_s_by_retry_worker": {
            label: summary(
                [
                    r["parts"]["resume_s"]
                    for r in ok
                    if r.get("retry_worker_warm") is warm and r["parts"]["resume_s"] is not None
                ]
            )
            for label, warm in (("warm", True), ("cold", False))
        },
        "heartbeat_age_at_kill_s": summary(col("heartbeat_age_at_kill_s")),
        "timeout_due_s": summary(col("timeout_due_s")),
        "timeout_lateness_s": summary(col("timeout_lateness_s")),
        "orphan_steps": summary(col("orphan_steps")),
        "task_wait_after_chunk_s": summary(col("task_wait_after_chunk_s")),
        "workflow_ran_on_victim": sum(bool(r.get("workflow_ran_on_victim")) for r in ok),
        "retried_on": {
            k: sum(r.get("retried_on") == k for r in ok) for k in ("survivor", "replacement")
        },
        "duration_s": summary(col("duration_s")),
        "baseline_duration_s": summary(col("duration_s", baseline)),
        "job_delay_s": summary(col("job_delay_s")),
        "baseline_boundary_gaps_s": [b["boundary_gaps_s"] for b in baseline],
        "errors": [r["error"] for r in runs if "error" in r],
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    policy = ChunkPolicy.of(job_spec("settings", args))
    runs: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="shepherd-crash-") as tmp:
        run_dir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            server_args = [a for kv in args.dynamic_config for a in ("--dynamic-config-value", kv)]
            st = await stack.enter_async_context(
                shepherd_stack(
                    PLANE_CONFIG, db_filename=run_dir / "temporal.db", server_args=server_args
                )
            )
            task_queue = f"crash-{uuid.uuid4().hex[:8]}"
            ws = Workers(st, task_queue, run_dir, args)
            if args.logs:
                stack.callback(keep_all_logs, ws, st, args.logs)
            stack.callback(ws.stop)  # before the logs are copied, after the last run
            await ws.start(WORKERS)
            tag = uuid.uuid4().hex[:6]
            for i in range(args.baseline_runs):
                name = f"crash-base-{i}-{tag}"
                log(f"baseline {i + 1}/{args.baseline_runs}: {name}")
                baseline.append(await baseline_run(st, ws, name, args))
                b = baseline[-1]
                log(
                    f"baseline {i + 1}: {b['phase']} in {b['duration_s']} s, "
                    f"boundary gaps {b['boundary_gaps_s']}"
                )
            for i in range(args.runs):
                ws.check()
                missing = WORKERS - len(ws.alive())
                if missing > 0:
                    await ws.start(missing)
                name = f"crash-{i}-{tag}"
                log(f"run {i + 1}/{args.runs}: {name}")
                try:
                    r = await crash_run(st, ws, name, args)
                except Exception as exc:  # noqa: BLE001 - one bad run is reported, not fatal
                    log(f"run {i + 1} failed: {type(exc).__name__}: {exc}")
                    r = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                runs.append(r)
                if "error" not in r:
                    log(
                        f"run {i + 1}: stall {r['stall_s']} s {r['parts']}; heartbeat age at "
                        f"kill {r['heartbeat_age_at_kill_s']} s; {r['phase']}, step "
                        f"{r['final_step']}, creates {r['creates_for_its_trainer']}, twice "
                        f"{r['steps_applied_twice']}; workflow on victim "
                        f"{r['workflow_ran_on_victim']}, task wait after chunk "
                        f"{r['task_wait_after_chunk_s']} s"
                    )
            plane_faults = await st.admin.faults()
            sizing = worker_sizing(args.worker_env)
    return {
        "benchmark": "crash",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "command": "bench/crash.py " + " ".join(sys.argv[1:]),
        "settings": {
            "runs": args.runs,
            "baseline_runs": args.baseline_runs,
            "workers": WORKERS,
            "job": (
                f"supervised loop on synthetic:text, {args.steps} steps, batch {BATCH_SIZE}, "
                f"{args.step_ms:g} ms emulated GPU time per forward_backward, checkpoint every "
                f"{EVERY} (chunks of {EVERY}, evaluation on), promote none, default policies"
            ),
            "kill_step": args.kill_step,
            "probe_ms": args.probe_ms,
            "describe_ms": args.describe_ms,
            "heartbeat_timeout_s": policy.heartbeat_timeout_s,
            "heartbeat_timeout_from": "the default policies"
            if args.heartbeat_timeout is None
            else "--heartbeat-timeout",
            "chunk_first_retry_s": policy.first_retry_s,
            "activity_keepalive_s": policies.KEEPALIVE.total_seconds(),
            "heartbeat_quiet_start_s": policies.HEARTBEAT_QUIET_START.total_seconds(),
            "worker": {
                "command": " ".join(["python", *worker_command(Path("READY"))[1:]]),
                "log_level": args.log_level,
                "extra_env": args.worker_env,
                "sizing": sizing,
            },
            "plane": {
                k: plane_faults.get(k) for k in ("capacity", "bootDelaySeconds", "routeLagSeconds")
            },
            "temporal": "dev server, SQLite file (--db-filename) in a temp dir",
            "temporal_dynamic_config": args.dynamic_config,
        },
        "method": METHOD,
        "summary": summarise(runs, baseline),
        "targets": targets(runs),
        "baseline": baseline,
        "runs": runs,
    }


def keep_all_logs(ws: Workers, st: Stack, dest: Path) -> None:
    for i, _ in enumerate(ws.lists, start=1):
        keep_logs(ws.run_dir / f"workers-{i}", st, dest / f"workers-{i}")


# ------------------------------------------------------------------------------ plot


def plot(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Never loses the report: a plot that cannot be drawn is said so in it."""
    try:
        return draw(out, report)
    except Exception as exc:  # noqa: BLE001 - the JSON matters more
        log(f"plot not drawn: {type(exc).__name__}: {exc}")
        return {"written": False, "path": None, "note": f"{type(exc).__name__}: {exc}"}


PART_LABELS = {
    "detect_s": "kill → heartbeat timeout fired",
    "backoff_s": "retry backoff",
    "dispatch_s": "retry due → started",
    "resume_s": "started → first new step",
}


def draw(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    plt = pyplot()
    if plt is None:
        return no_plot()
    runs = [r for r in report["runs"] if "error" not in r]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = list(range(1, len(runs) + 1))
    for i, r in zip(xs, runs, strict=True):
        parts = r["parts"]
        if all(parts[k] is not None for k in PART_LABELS):
            bottom = 0.0
            for j, (k, label) in enumerate(PART_LABELS.items()):
                ax.bar(i, parts[k], bottom=bottom, color=f"C{j}", label=label if i == 1 else None)
                bottom += parts[k]
        elif r["stall_s"] is not None:
            ax.bar(i, r["stall_s"], color="grey", label="stall (parts unknown)")
        if r["stall_s"] is not None:
            ax.text(i, r["stall_s"] + 0.05, f"{r['stall_s']:.2f}", ha="center", fontsize=8)
    ax.axhline(TARGET_STALL_S, color="red", linestyle=":", linewidth=1, label="target")
    s = report["settings"]
    ax.set(
        title=f"worker SIGKILL → next optimizer step (heartbeat timeout "
        f"{s['heartbeat_timeout_s']:g} s)",
        xlabel="run (retry on a warm / cold worker)",
        ylabel="seconds",
    )
    # Whether the retry ran on a worker that had run the loop before (its caches loaded).
    warmth = {True: "warm", False: "cold", None: "?"}
    ax.set_xticks(
        xs, [f"{i}\n{warmth[r.get('retry_worker_warm')]}" for i, r in zip(xs, runs, strict=True)]
    )
    top = max([TARGET_STALL_S, *(r["stall_s"] or 0 for r in runs)])
    ax.set_ylim(0, top * 1.45)
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return save_plot(plt, fig, out)


# ------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive(int), default=5, help="jobs with a kill")
    parser.add_argument(
        "--baseline-runs", type=int, default=1, help="jobs without a kill, run first (0: none)"
    )
    parser.add_argument("--steps", type=positive(int), default=60, help="steps per job")
    parser.add_argument(
        "--kill-step", type=positive(int), default=25, help="kill once the trainer applied it"
    )
    parser.add_argument(
        "--step-ms", type=positive(float), default=50.0, help="emulated GPU time per step (ms)"
    )
    parser.add_argument(
        "--probe-ms", type=positive(float), default=20.0, help="get_info spacing (ms)"
    )
    parser.add_argument(
        "--describe-ms",
        type=positive(float),
        default=50.0,
        help="DescribeWorkflowExecution spacing after a kill (ms)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=positive(float),
        default=None,
        help="the jobs' policies.heartbeat_timeout in seconds (default: the spec's default)",
    )
    parser.add_argument(
        "--log-level", default="INFO", help="the workers' SHEPHERD_LOG_LEVEL (production: INFO)"
    )
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an env setting for every worker (repeatable)",
    )
    parser.add_argument(
        "--dynamic-config",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a dynamic config value for the Temporal dev server (repeatable), e.g. "
        "'history.timerProcessorMaxTimeShift=\"10ms\"'",
    )
    parser.add_argument("--logs", type=Path, default=None, help="keep the run logs in this dir")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG plot path")
    args = parser.parse_args(argv)
    if args.baseline_runs < 0:
        parser.error("--baseline-runs must be >= 0")
    if not EVERY < args.kill_step < min(2 * EVERY, args.steps):
        parser.error(
            f"--kill-step: inside the second chunk, {EVERY} < step < {min(2 * EVERY, args.steps)}"
        )
    extra: dict[str, str] = {}
    for item in args.worker_env:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--worker-env: KEY=VALUE, got {item!r}")
        extra[key.strip()] = value
    args.worker_env = extra
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = run_main(lambda: bench(args), lambda report: plot(args.out, report))
    if not all(t["met"] for t in report["targets"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
