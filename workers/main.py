"""The worker process: registers the lifecycle workflow and every activity on the task
queue, bridges platform events to signals, and stops gracefully on SIGINT/SIGTERM.

    python -m workers.main  (or: shepherd worker)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import json
import logging
import os
import signal
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import PollerBehaviorSimpleMaximum, Worker

from activities.checkpoints import CheckpointActivities
from activities.claims import ClaimActivities
from activities.preflight import PreflightActivities
from activities.programs import ProgramActivities
from activities.promotion import PromotionActivities
from activities.provisioning import ProvisioningActivities
from activities.readiness import ReadinessActivities
from activities.reaper import ReaperActivities
from activities.recovery import RecoveryActivities
from activities.scheduling import SchedulingActivities
from activities.sweeps import SweepActivities
from activities.training import TrainingActivities
from shepherd import loops, preflight, programs
from shepherd.logging import configure_logging
from shepherd.preflight import worker_identity
from shepherd.temporal import (
    SERVER_CALL_RETRY,
    TemporalSettings,
    connect,
    ensure_search_attributes,
)
from workers import metrics
from workers.config import BackendProfile, BackendRegistry, profiles_from_env
from workers.events import EventBridge
from workflows import policies
from workflows.job import TrainingJobWorkflow
from workflows.reaper import ReaperWorkflow
from workflows.scheduler import SchedulerWorkflow
from workflows.sweep import SweepWorkflow

log = structlog.stdlib.get_logger("shepherd.worker")

WORKFLOWS: list[type] = [TrainingJobWorkflow, SweepWorkflow, ReaperWorkflow, SchedulerWorkflow]


def activities_for(
    registry: BackendRegistry, control_queue: str | None = None
) -> list[Callable[..., Any]]:
    """Every activity, as bound methods of objects sharing one set of platform clients.
    ``control_queue``: the task queue only this worker polls (its programs are steered
    there; activities/programs.py)."""
    scheduling = SchedulingActivities(registry)  # signals the scheduler through the client
    groups = [
        PreflightActivities(registry, ask=scheduling.ask),  # (a job's first ask, with it)
        ProvisioningActivities(registry),
        ReadinessActivities(registry),
        TrainingActivities(registry),
        CheckpointActivities(registry),
        RecoveryActivities(registry),
        PromotionActivities(registry),
        SweepActivities(),
        ClaimActivities(),  # uses the worker's Temporal client
        ReaperActivities(registry),  # and this one too, for visibility
        ProgramActivities(registry, control_queue or f"programs-{uuid.uuid4().hex}"),
        scheduling,
    ]
    found = []
    for group in groups:
        for name in dir(type(group)):
            fn = getattr(group, name)
            if callable(fn) and hasattr(fn, "__temporal_activity_definition"):
                found.append(fn)
    return found


@dataclass(frozen=True)
class WorkerSizing:
    """How much one worker process takes on. The defaults are sized for a few thousand open
    jobs per worker on a small machine (docs/production.md, "Sizing workers"); each knob can be set from
    the environment (``SHEPHERD_WORKER_<FIELD>``)."""

    #: Workflows kept in memory between their tasks (~0.2 MiB each). A job's workflow that
    #: falls out of the cache is replayed from its history at its next task: CPU, not
    #: correctness. Sized above the open jobs a worker serves, so waiting jobs stay cached.
    max_cached_workflows: int = 2500
    #: Workflow-task pollers, and the share of them on the shared queue (where new
    #: workflows' first tasks and tasks of uncached workflows arrive) rather than on this
    #: worker's sticky queue. The SDK's default (5, one of them shared) left new jobs'
    #: first tasks waiting minutes behind a thousand open ones.
    workflow_task_pollers: int = 10
    nonsticky_to_sticky_poll_ratio: float = 0.5
    #: A workflow task waiting this long on a busy (or dead) worker's sticky queue moves to
    #: the shared queue: long enough not to bounce tasks (and their cached state) off a busy
    #: worker, short enough that a crashed worker's jobs move on within seconds.
    sticky_timeout_s: float = 3.0
    #: Activities that hold a trainer (train, checkpoint, delete ...) running at once.
    activity_slots: int = 200
    #: Polls running at once, on the waits queue; each is one short GET.
    wait_slots: int = 50

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerSizing:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"SHEPHERD_WORKER_{f.name.upper()}")
            if raw is not None:
                kind = float if f.type in ("float", float) else int
                try:
                    values[f.name] = kind(raw)
                except ValueError:
                    raise SystemExit(
                        f"SHEPHERD_WORKER_{f.name.upper()}: {raw!r} is not a number"
                    ) from None
                if values[f.name] <= 0:
                    raise SystemExit(f"SHEPHERD_WORKER_{f.name.upper()}: must be > 0")
        return cls(**values)


class _AliasProbes(logging.Filter):
    """transformers 5 warns ("Accessing `X` from `...`. Returning ... instead") whenever an
    attribute of one of its deprecated ``*_fast`` alias modules is read. temporalio's Worker
    reads ``__cached__`` of every loaded module to hash its default build id, so each worker
    start logged ~190 of them. A dunder is a tool looking at the module, not code using the
    alias: those are dropped; the warning still shows for a real use of an alias."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (
            isinstance(record.msg, str)
            and record.msg.startswith("Accessing `")
            and args
            and isinstance(args[0], str)
            and args[0].startswith("__")
            and args[0].endswith("__")
        )


def quiet_library_noise() -> None:
    """Filter what libraries log at a worker's start that says nothing (idempotent)."""
    logger = logging.getLogger("transformers")
    if not any(isinstance(f, _AliasProbes) for f in logger.filters):
        logger.addFilter(_AliasProbes())


def _registered_programs() -> list[str] | None:
    """The programs this worker can run (None: its SHEPHERD_PROGRAMS cannot be read)."""
    try:
        return sorted(programs.registered())
    except programs.ProgramError as exc:
        log.warning("worker.programs_unreadable", error=str(exc))
        return None


def _registered_loops() -> list[str] | None:
    """The loops this worker can run (None: its SHEPHERD_LOOPS cannot be read, so it lists
    none; each job then fails its preflight with the reason)."""
    try:
        return sorted(loops.registered())
    except loops.LoopLoadError as exc:
        log.warning("worker.loops_unreadable", error=str(exc))
        return None


def workers_for(
    client: Client,
    task_queue: str,
    registry: BackendRegistry,
    sizing: WorkerSizing | None = None,
) -> list[Worker]:
    """The workers serving one task queue: workflows and trainer-holding activities on
    ``task_queue``, polls on its waits queue (each with its own slots and pollers)."""
    sizing = sizing or WorkerSizing()
    quiet_library_noise()  # before Worker(), whose build id reads every module
    # This worker's own queue: the programs it runs are steered there (attach, detach ...).
    control_queue = f"{task_queue}-programs-{uuid.uuid4().hex[:12]}"
    activities = activities_for(registry, control_queue)
    # Advertises the backends it serves and the loops registered with it: a submission
    # refuses a backend or loop no worker has.
    identity = worker_identity(
        registry.profiles,
        loops=_registered_loops(),
        programs=_registered_programs(),
        capabilities=[
            f"{name}/{tag}" for name, p in registry.profiles.items() for tag in p.capabilities
        ],
        pools=[f"{name}/{pool}" for name, p in registry.profiles.items() for pool in p.pools],
    )
    return [
        Worker(
            client,
            task_queue=task_queue,
            workflows=WORKFLOWS,
            activities=activities,
            max_cached_workflows=sizing.max_cached_workflows,
            workflow_task_poller_behavior=PollerBehaviorSimpleMaximum(sizing.workflow_task_pollers),
            nonsticky_to_sticky_poll_ratio=sizing.nonsticky_to_sticky_poll_ratio,
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=sizing.sticky_timeout_s),
            max_concurrent_activities=sizing.activity_slots,
            graceful_shutdown_timeout=timedelta(seconds=5),
            identity=identity,
        ),
        Worker(
            client,
            task_queue=policies.waits_queue(task_queue),
            activities=activities,
            max_concurrent_activities=sizing.wait_slots,
            graceful_shutdown_timeout=timedelta(seconds=5),
            identity=identity,
        ),
        Worker(
            client,
            task_queue=control_queue,
            activities=activities,
            max_concurrent_activities=20,
            graceful_shutdown_timeout=timedelta(seconds=5),
            identity=identity,
        ),
        # The programs this worker runs, taken over by a later run of their workflow (after
        # continue-as-new): one slot each for as long as the program runs.
        Worker(
            client,
            task_queue=policies.hold_queue(control_queue),
            activities=activities,
            max_concurrent_activities=sizing.activity_slots,
            graceful_shutdown_timeout=timedelta(seconds=5),
            identity=identity,
        ),
    ]


async def run_worker(
    *,
    temporal: TemporalSettings | None = None,
    profiles: dict[str, BackendProfile] | None = None,
    task_queues: Sequence[str] | None = None,
    ready_file: Path | None = None,
    stop: asyncio.Event | None = None,
    sizing: WorkerSizing | None = None,
    freeze_startup_heap: bool = False,
) -> None:
    temporal = temporal or TemporalSettings()
    registry = BackendRegistry(profiles if profiles is not None else profiles_from_env())
    client = await connect(temporal, runtime=metrics.temporal_runtime(), retry=SERVER_CALL_RETRY)
    await _require_search_attributes(client)
    stop = stop or asyncio.Event()
    queues = list(task_queues or [temporal.task_queue])
    sizing = sizing or WorkerSizing.from_env()
    # The first training activity would otherwise import transformers (~1 s) on the event
    # loop, right when a crashed worker's chunk is retried here (bench/crash.py).
    await asyncio.to_thread(importlib.import_module, "transformers")
    workers = [w for queue in queues for w in workers_for(client, queue, registry, sizing)]
    if freeze_startup_heap:
        # What startup made (temporalio, pydantic, transformers, torch: millions of objects)
        # lives as long as the process: out of the collector's sight, a full collection no
        # longer walks it. One took 176 ms, longer than a program's step, in the middle of
        # the data-plane proxy's work (bench/proxy.py).
        gc.freeze()
    bridge = EventBridge(client, registry)
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        await stack.enter_async_context(metrics.serving(client, os.environ.get(metrics.ENV)))
        bridge_task = asyncio.create_task(bridge.run())
        log.info(
            "worker.ready",
            task_queues=queues,
            temporal=temporal.address,
            namespace=temporal.namespace,
            backends=sorted(registry.profiles),
        )
        if ready_file:
            for queue in queues:  # (ready: a submission to its queues is accepted)
                if not await preflight.until_polled(client, queue):
                    log.warning("worker.pollers_not_listed", task_queue=queue)
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"pid": os.getpid(), "task_queues": queues}))
            os.replace(tmp, ready_file)
        try:
            await stop.wait()
        finally:
            bridge_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await bridge_task
            log.info("worker.stopping")
    await registry.aclose()


async def _require_search_attributes(client: Client) -> None:
    """Refuse to start where jobs would hang: every workflow upserts Shepherd's search
    attributes, and an unregistered one fails each of its workflow tasks."""
    try:
        added = await ensure_search_attributes(client)
    except RPCError as exc:
        raise SystemExit(
            f"Shepherd's search attributes could not be checked or registered in namespace "
            f"{client.namespace!r} ({exc.message}). Register them (docs/production.md) "
            "or give this worker the permission to."
        ) from None
    if added:
        log.info("worker.search_attributes_registered", added=added)


def main(task_queues: Sequence[str] | None = None, ready_file: Path | None = None) -> None:
    configure_logging()

    async def _run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(
            task_queues=task_queues, ready_file=ready_file, stop=stop, freeze_startup_heap=True
        )

    asyncio.run(_run())


if __name__ == "__main__":
    main()
