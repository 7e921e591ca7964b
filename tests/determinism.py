"""A determinism stress run: many small jobs at once on a worker that caches no workflow (so
every workflow task is a full replay of the history so far), with the platform's events on,
queries as ``watch`` sends them, pause/resume/cancel signals and preemptions at random
moments. Every job must end as it should — completed with the weights of a clean run, or
cancelled with nothing left behind — and every history must replay against the same code.

Shared by the suite (tests/workflows/test_determinism.py, a short run) and the benchmark
(bench/determinism.py, a long one).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from localplane.admin import PlaneAdmin
from shepherd.models import JobInput, JobStatus
from shepherd.phases import Phase
from shepherd.platform import NotFound, PlatformClient, PlatformError
from shepherd.spec import validate_spec
from shepherd.states import JobState
from tests.replay import replay
from workers.config import BackendRegistry
from workers.events import EventBridge
from workers.main import WorkerSizing, workers_for
from workflows.job import TrainingJobWorkflow


@dataclass
class StressConfig:
    jobs: int = 10
    seed: int = 0
    steps: int = 12
    every: int = 4
    #: Long enough that a driver's queries (slow: the worker replays every task) see the
    #: step it waits for before the job has trained past it.
    step_ms: int = 150
    #: Chance that a job is paused (signal) at a random moment, then resumed (signal).
    pause: float = 0.35
    #: Chance that a job's trainer is preempted at a random moment while it trains.
    preempt: float = 0.35
    #: Chance that a job is cancelled at a random moment.
    cancel: float = 0.3
    #: When an action comes: at a random step of the job's training, whatever the machine's
    #: speed (a moment in seconds missed every job on a fast run), or, one time in
    #: ``early_in``, within ``early_s`` of its start (provisioning, the waits, warm-up).
    early_in: int = 4
    early_s: float = 1.5
    #: The jobs are queried in turn, a round this often (``watch`` asks twice a second; this
    #: is harder).
    query_every_s: float = 0.1
    timeout_s: float = 240.0


@dataclass
class StressReport:
    jobs: int = 0
    completed: int = 0
    cancelled: int = 0
    paused: int = 0
    preempted: int = 0
    queries: int = 0
    #: Answered while the job had not ended: the queries that race its workflow tasks.
    queries_while_running: int = 0
    #: Queries the client gave up on (its RPC deadline ran out while a worker that replays
    #: every task from scratch was busy): asked again, counted, not a fault of the job.
    queries_timed_out: int = 0
    histories_replayed: int = 0
    problems: list[str] = field(default_factory=list)
    #: Actions a driver did not play, and why (the job had ended, most often).
    unplayed: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


def stress_spec(name: str, cfg: StressConfig) -> Any:
    return validate_spec(
        {
            "name": name,
            "trainer": {
                "base_model": "accounts/fireworks/models/qwen3-8b",
                "learning_rate": 3e-3,
                "extra_args": [f"--compute-delay-ms={cfg.step_ms}"],
            },
            "training": {"total_steps": cfg.steps},
            "checkpoint": {"every_steps": cfg.every, "keep_last": 2},
            "output": {"model_id": f"{name}-model"},
            "policies": {"poll_interval": "1s", "heartbeat_timeout": "5s"},
        }
    )


async def _digest(platform: PlatformClient, model_id: str) -> str | None:
    try:
        model = await platform.get_model(model_id)
    except NotFound:
        return None
    return str((model.model_extra or {}).get("weightsDigest"))


async def _cancel_requested(handle: WorkflowHandle[Any, Any]) -> bool:
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED:
            return True
    return False


async def _ended_or_sent(request: Awaitable[None]) -> bool:
    """Send a signal or a cancel; False when the job ended between the status query and the
    request (the server then answers NOT_FOUND "workflow execution already completed") — a race
    the user has too, and no fault of the job."""
    try:
        await request
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def run_stress(
    client: Client,
    admin: PlaneAdmin,
    platform: PlatformClient,
    registry: BackendRegistry,
    cfg: StressConfig,
) -> StressReport:
    report = StressReport(jobs=cfg.jobs)
    started = time.monotonic()
    task_queue = f"stress-{uuid.uuid4().hex[:8]}"
    run_id = uuid.uuid4().hex[:6]
    handles: dict[str, WorkflowHandle[Any, JobStatus]] = {}
    stop = asyncio.Event()

    async def start(name: str) -> WorkflowHandle[Any, JobStatus]:
        handle = await client.start_workflow(
            TrainingJobWorkflow.run,
            JobInput(spec=stress_spec(name, cfg)),
            id=f"stress-{name}",
            task_queue=task_queue,
        )
        handles[name] = handle
        return handle

    async def status(handle: WorkflowHandle[Any, Any]) -> JobStatus:
        return await handle.query("status", result_type=JobStatus)

    async def patient_status(handle: WorkflowHandle[Any, Any]) -> JobStatus:
        """The driver's query: asked again when the client's deadline runs out (``CANCELLED``
        "Timeout expired", or ``DEADLINE_EXCEEDED``). A driver that gave up there would
        leave a job paused for good, or its preemption unplayed."""
        while True:
            try:
                return await status(handle)
            except RPCError as err:
                if err.status not in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED):
                    raise
                report.queries_timed_out += 1

    async def until(
        handle: WorkflowHandle[Any, Any], check: Callable[[JobStatus], bool]
    ) -> JobStatus:
        """The job's status once ``check`` holds, or once it has ended."""
        while True:
            current = await patient_status(handle)
            if check(current) or current.phase.is_terminal():
                return current
            await asyncio.sleep(0.05)

    async def drive(name: str, rng: random.Random) -> None:
        """One job's random life: pause/resume, a preemption, a cancel, each maybe."""
        handle = handles[name]
        plans = []  # (action, at this step or -1: early, then after this many seconds)
        for action, chance in (
            ("pause", cfg.pause),
            ("preempt", cfg.preempt),
            ("cancel", cfg.cancel),
        ):
            if rng.random() >= chance:
                continue
            if action != "preempt" and rng.randrange(cfg.early_in) == 0:
                plans.append((action, -1, rng.uniform(0, cfg.early_s)))
            else:
                # A step with a chunk still to train after it (a preemption needs one).
                plans.append((action, rng.randrange(cfg.steps - cfg.every), rng.uniform(0, 0.05)))
        t0 = time.monotonic()
        for action, at_step, delay in sorted(plans, key=lambda p: (p[1], p[2])):
            try:
                if at_step < 0:
                    await asyncio.sleep(max(0.0, delay - (time.monotonic() - t0)))
                else:
                    await until(handle, lambda s: s.step >= at_step)  # noqa: B023 - used at once
                    await asyncio.sleep(delay)
                current = await patient_status(handle)
            except Exception as exc:  # noqa: BLE001 - ended, or a query refused: the job decides
                report.unplayed.append(f"{name} {action}@{at_step}: {exc!r}"[:300])
                return
            if current.phase.is_terminal():
                report.unplayed.append(f"{name} {action}@{at_step}: ended {current.phase}")
                return
            if action == "pause":
                if not await _ended_or_sent(handle.signal("pause")):
                    return
                # Paused, or the pause refused (a notice): resume after a while.
                async with asyncio.timeout(60):
                    current = await until(
                        handle,
                        lambda s: (
                            s.phase is Phase.PAUSED or any("pause ignored" in n for n in s.notices)
                        ),
                    )
                if current.phase is Phase.PAUSED:
                    report.paused += 1
                    await asyncio.sleep(rng.uniform(0.2, 1.5))
                    if not await _ended_or_sent(handle.signal("resume")):
                        return
            elif action == "preempt":
                # At the next moment it trains (a preemption hits a trainer that works).
                current = await until(
                    handle, lambda s: s.phase is Phase.TRAINING and bool(s.trainer_job_id)
                )
                if not current.phase.is_terminal():
                    with contextlib.suppress(PlatformError):
                        await admin.preempt(current.trainer_job_id or "")
                        report.preempted += 1
            elif not await _ended_or_sent(handle.cancel()):
                return

    async def watch() -> None:
        """Every job queried in turn, one query at a time, as ``shepherd watch`` would (more
        watchers at once starve the drivers' own queries on a worker that replays every
        task)."""
        while not stop.is_set():
            for handle in list(handles.values()):
                with contextlib.suppress(Exception):
                    current = await status(handle)
                    report.queries += 1
                    if not current.phase.is_terminal():
                        report.queries_while_running += 1
            await asyncio.sleep(cfg.query_every_s)

    sizing = WorkerSizing(max_cached_workflows=0)  # every workflow task a full replay
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers_for(client, task_queue, registry, sizing):
            await stack.enter_async_context(worker)
        bridge = asyncio.create_task(EventBridge(client, registry).run())
        watcher = asyncio.create_task(watch())
        try:
            reference = await start(f"reference-{run_id}")
            await reference.result()
            expected = await _digest(platform, f"reference-{run_id}-model")
            names = [f"job{i}-{run_id}" for i in range(cfg.jobs)]
            for name in names:
                await start(name)
            rng = random.Random(cfg.seed)
            drivers = [
                asyncio.create_task(drive(name, random.Random(rng.random()))) for name in names
            ]
            async with asyncio.timeout(cfg.timeout_s):
                await asyncio.gather(*drivers)
                for name in names:
                    with contextlib.suppress(Exception):
                        await handles[name].result()
            for name in names:
                await _check(name, handles[name], expected, platform, report)
        finally:
            stop.set()
            await watcher
            for handle in handles.values():
                with contextlib.suppress(Exception):
                    if (await handle.describe()).status is WorkflowExecutionStatus.RUNNING:
                        await handle.terminate(reason="stress run ended")
            bridge.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await bridge
    # No trainer of the run is left on the platform, and none was created twice.
    for job in (await platform.list_jobs()).rlor_trainer_jobs:
        if job.state is not JobState.DELETED and job.job_id.startswith("stress-"):
            report.problems.append(f"trainer {job.job_id} left {job.state.value}")
    stats = (await admin.stats())["jobs"]
    for job_name, job in stats.items():
        if "/stress-" in job_name and job.get("creates", 0) > 1:
            report.problems.append(f"{job_name} created {job['creates']} times")
    histories = [await h.fetch_history() for h in handles.values()]
    report.histories_replayed = await replay(histories, "determinism stress")
    report.elapsed_s = round(time.monotonic() - started, 1)
    return report


async def _check(
    name: str,
    handle: WorkflowHandle[Any, JobStatus],
    expected: str | None,
    platform: PlatformClient,
    report: StressReport,
) -> None:
    desc = await handle.describe()
    final = await handle.query("status", result_type=JobStatus)
    digest = await _digest(platform, f"{name}-model")
    if await _cancel_requested(handle):
        report.cancelled += 1
        if (
            desc.status is not WorkflowExecutionStatus.CANCELED
            or final.phase is not Phase.CANCELLED
        ):
            report.problems.append(f"{name}: cancelled, but ended {desc.status} / {final.phase}")
        if digest is not None:
            report.problems.append(f"{name}: cancelled, but its model was promoted")
        return
    report.completed += 1
    if desc.status is not WorkflowExecutionStatus.COMPLETED or final.phase is not Phase.COMPLETED:
        report.problems.append(
            f"{name}: ended {desc.status} / {final.phase}: {final.error.message if final.error else ''}"
        )
    elif digest != expected:
        report.problems.append(f"{name}: weights {digest} differ from a clean run's {expected}")
