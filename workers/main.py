"""The worker process: registers the lifecycle workflow and every activity on the task
queue, bridges platform events to signals, and stops gracefully on SIGINT/SIGTERM.

    python -m workers.main  (or: shepherd worker)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.checkpoints import CheckpointActivities
from activities.promotion import PromotionActivities
from activities.provisioning import ProvisioningActivities
from activities.readiness import ReadinessActivities
from activities.recovery import RecoveryActivities
from activities.sweeps import SweepActivities
from activities.training import TrainingActivities
from shepherd.logging import configure_logging
from shepherd.temporal import TemporalSettings, connect, ensure_search_attributes
from workers.config import BackendProfile, BackendRegistry, profiles_from_env
from workers.events import EventBridge
from workflows.job import TrainingJobWorkflow
from workflows.sweep import SweepWorkflow

log = structlog.stdlib.get_logger("shepherd.worker")

WORKFLOWS: list[type] = [TrainingJobWorkflow, SweepWorkflow]


def activities_for(registry: BackendRegistry) -> list[Callable[..., Any]]:
    """Every activity, as bound methods of objects sharing one set of platform clients."""
    groups = [
        ProvisioningActivities(registry),
        ReadinessActivities(registry),
        TrainingActivities(registry),
        CheckpointActivities(registry),
        RecoveryActivities(registry),
        PromotionActivities(registry),
        SweepActivities(),
    ]
    found = []
    for group in groups:
        for name in dir(type(group)):
            fn = getattr(group, name)
            if callable(fn) and hasattr(fn, "__temporal_activity_definition"):
                found.append(fn)
    return found


async def run_worker(
    *,
    temporal: TemporalSettings | None = None,
    profiles: dict[str, BackendProfile] | None = None,
    task_queues: Sequence[str] | None = None,
    ready_file: Path | None = None,
    stop: asyncio.Event | None = None,
    max_concurrent_activities: int = 200,
) -> None:
    temporal = temporal or TemporalSettings()
    registry = BackendRegistry(profiles if profiles is not None else profiles_from_env())
    client = await connect(temporal)
    await _require_search_attributes(client)
    stop = stop or asyncio.Event()
    queues = list(task_queues or [temporal.task_queue])
    workers = [
        Worker(
            client,
            task_queue=queue,
            workflows=WORKFLOWS,
            activities=activities_for(registry),
            max_concurrent_activities=max_concurrent_activities,
            # A crashed worker's workflows move to a live one in ~1 s instead of ~10 s.
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
            graceful_shutdown_timeout=timedelta(seconds=5),
        )
        for queue in queues
    ]
    bridge = EventBridge(client, registry)
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        bridge_task = asyncio.create_task(bridge.run())
        log.info(
            "worker.ready",
            task_queues=queues,
            temporal=temporal.address,
            namespace=temporal.namespace,
            backends=sorted(registry.profiles),
        )
        if ready_file:
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
            f"{client.namespace!r} ({exc.message}). Register them (README, 'Running in production') "
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
        await run_worker(task_queues=task_queues, ready_file=ready_file, stop=stop)

    asyncio.run(_run())


if __name__ == "__main__":
    main()
