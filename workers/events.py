"""The event bridge: the platform's pushed state changes (the SSE watch stream) become
``platform_event`` signals to the workflow that owns the trainer job, so a workflow moves
on within milliseconds of a change instead of at its next poll. Polling stays the fallback:
a lost event only costs a poll interval.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

import structlog
from temporalio.client import Client
from temporalio.service import RPCError

from shepherd import search_attributes as sa
from shepherd.models import PlatformEvent
from shepherd.platform.models import JobEvent
from workers.config import BackendRegistry

log = structlog.stdlib.get_logger("shepherd.events")

#: Remember trainer -> workflow lookups; forget "not ours" answers quickly.
_CACHE_SIZE = 4096
_NEGATIVE_TTL_S = 5.0
_RECONNECT_S = (0.5, 1, 2, 5, 10)


class EventBridge:
    def __init__(self, client: Client, registry: BackendRegistry) -> None:
        self.client = client
        self.registry = registry
        self._owners: OrderedDict[str, str | None] = OrderedDict()
        self._negative_at: dict[str, float] = {}
        self.delivered = 0

    async def run(self) -> None:
        backends = [p.name for p in self.registry.profiles.values() if p.events]
        if not backends:
            return
        await asyncio.gather(*(self._follow(name) for name in backends))

    async def _follow(self, backend: str) -> None:
        """Follow one backend's stream forever, resuming after the last event seen."""
        last: int | None = None
        failures = 0
        while True:
            try:
                platform = self.registry.client(backend)
                async for event in platform.watch_jobs(last_event_id=last):
                    failures = 0
                    last = event.id
                    await self._deliver(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the bridge outlives any one failure; polling covers the gap
                delay = _RECONNECT_S[min(failures, len(_RECONNECT_S) - 1)]
                failures += 1
                log.warning(
                    "events.reconnect", backend=backend, error=type(exc).__name__, delay_s=delay
                )
                await asyncio.sleep(delay)

    async def _owner(self, trainer_job_id: str) -> str | None:
        if trainer_job_id in self._owners:
            owner = self._owners[trainer_job_id]
            if (
                owner is not None
                or time.monotonic() - self._negative_at.get(trainer_job_id, 0) < _NEGATIVE_TTL_S
            ):
                return owner
        query = f'{sa.TRAINER_JOB_ID.name} = "{trainer_job_id}" AND ExecutionStatus = "Running"'
        owner = None
        async for execution in self.client.list_workflows(query, limit=1):
            owner = execution.id
        self._owners[trainer_job_id] = owner
        self._owners.move_to_end(trainer_job_id)
        if owner is None:
            self._negative_at[trainer_job_id] = time.monotonic()
        while len(self._owners) > _CACHE_SIZE:
            stale, _ = self._owners.popitem(last=False)
            self._negative_at.pop(stale, None)
        return owner

    async def _deliver(self, event: JobEvent) -> None:
        owner = await self._owner(event.job_id)
        if owner is None:
            return  # not a Shepherd job (or already finished)
        signal = PlatformEvent(
            trainer_job_id=event.job_id,
            state=event.state.value,
            message=event.job.status.message,
            event_id=event.id,
            event_time=event.event_time,
        )
        try:
            await self.client.get_workflow_handle(owner).signal("platform_event", signal)
            self.delivered += 1
        except RPCError as exc:
            # The workflow closed meanwhile: forget it; polling covers anything else.
            self._owners.pop(event.job_id, None)
            log.debug("events.signal_failed", workflow_id=owner, error=str(exc))
