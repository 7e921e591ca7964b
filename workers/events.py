"""The event bridge: the platform's pushed state changes (the SSE watch stream) become
``platform_event`` signals to the workflow that owns the trainer job, so a workflow moves
on within milliseconds of a change instead of at its next poll. Polling stays the fallback
(backed off while events flow: workflows/policies.py, "waiting at scale").

At scale (thousands of queued jobs) the bridge:
- finds the owner from the trainer id itself (``shepherd.trainer_ids``); only trainers
  whose workflow id does not fit in an id are looked up in visibility (cached);
- drops the states no workflow waits for (PENDING, DELETING: DELETED follows);
- delivers on ``LANES`` concurrent lanes, one trainer always on the same lane, so each
  trainer's events keep their order while a slow signal does not hold up other trainers;
- gives each signal an idempotency key (the event's id), so every worker can run a bridge
  (none is special, any may die) and the server keeps one signal per event;
- keeps an event it could not deliver (the Temporal server down or unreachable) and tries
  it again until it lands or its workflow is gone (``_REDELIVER_S``): a state change is
  never left to the workflow's slow fallback poll because the server was away. The event's
  lane waits meanwhile (its trainers' events keep their order), the others go on.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import OrderedDict

import structlog
from temporalio.api.common.v1 import Payloads, WorkflowExecution
from temporalio.api.workflowservice.v1 import SignalWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from shepherd import search_attributes as sa
from shepherd.models import PlatformEvent
from shepherd.platform.models import JobEvent
from shepherd.states import JobState
from shepherd.trainer_ids import owner_of
from workers.config import BackendRegistry

log = structlog.stdlib.get_logger("shepherd.events")

#: States no workflow waits for: every job starts PENDING (its workflow waits for a slot,
#: i.e. CREATING or RUNNING), and DELETING is followed by DELETED.
DROPPED_STATES = frozenset({JobState.PENDING, JobState.UNSPECIFIED, JobState.DELETING})
#: Concurrent deliveries; a trainer's events always go through the same lane.
LANES = 32
#: Events read ahead of delivery per lane before the stream is paused (back-pressure).
LANE_DEPTH = 256
#: Visibility lookups (trainers whose id does not name the workflow): remember owners;
#: a workflow's search attributes become visible up to ~1 s after it set them, so a miss is
#: looked up again after these delays before the event is given up to the poll fallback.
_CACHE_SIZE = 4096
_LOOKUP_RETRIES_S = (0.25, 0.5, 1.0, 2.0)
_RECONNECT_S = (0.5, 1, 2, 5, 10)
#: Delays between tries of an event the server did not take (beyond the client's own
#: retries): the server is tried at least every 5 s, so an event lands within 5 s of its
#: return (issue 32: an outage costs its length plus at most 10 s).
_REDELIVER_S = (0.5, 1, 2, 5)
#: What a server that is down, restarting or unreachable answers (anything else is final).
_SERVER_AWAY = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.UNKNOWN,
        RPCStatusCode.INTERNAL,
        RPCStatusCode.ABORTED,
        RPCStatusCode.CANCELLED,
    }
)


class EventBridge:
    def __init__(self, client: Client, registry: BackendRegistry, *, lanes: int = LANES) -> None:
        self.client = client
        self.registry = registry
        self.lanes = lanes
        self._owners: OrderedDict[str, str] = OrderedDict()
        #: Counters (tests and benchmarks read them).
        self.delivered = 0
        self.dropped = 0
        self.lookups = 0

    async def run(self) -> None:
        backends = [p.name for p in self.registry.profiles.values() if p.events]
        if not backends:
            return
        await asyncio.gather(*(self._follow(name) for name in backends))

    async def _follow(self, backend: str) -> None:
        """Follow one backend's stream forever, resuming after the last event seen."""
        queues: list[asyncio.Queue[JobEvent]] = [
            asyncio.Queue(LANE_DEPTH) for _ in range(self.lanes)
        ]
        lanes = [asyncio.create_task(self._lane(backend, q)) for q in queues]
        last: int | None = None
        failures = 0
        try:
            while True:
                try:
                    platform = self.registry.client(backend)
                    async for event in platform.watch_jobs(last_event_id=last):
                        failures = 0
                        last = event.id
                        if event.state in DROPPED_STATES:
                            self.dropped += 1
                            continue
                        lane = zlib.crc32(event.job_id.encode()) % self.lanes
                        await queues[lane].put(event)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the bridge outlives any one failure; polling covers the gap
                    delay = _RECONNECT_S[min(failures, len(_RECONNECT_S) - 1)]
                    failures += 1
                    log.warning(
                        "events.reconnect", backend=backend, error=type(exc).__name__, delay_s=delay
                    )
                    await asyncio.sleep(delay)
        finally:
            for task in lanes:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)

    async def _lane(self, backend: str, queue: asyncio.Queue[JobEvent]) -> None:
        while True:
            event = await queue.get()
            try:
                await self._deliver(backend, event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one bad delivery must not stop the lane
                log.warning("events.deliver_failed", job=event.job_id, error=repr(exc)[:300])

    async def _lookup(self, trainer_job_id: str) -> str | None:
        """The running workflow whose search attributes name this trainer (visibility)."""
        self.lookups += 1
        query = f'{sa.TRAINER_JOB_ID.name} = "{trainer_job_id}" AND ExecutionStatus = "Running"'
        async for execution in self.client.list_workflows(query, limit=1):
            return execution.id
        return None

    async def _owner(self, trainer_job_id: str) -> str | None:
        owner = owner_of(trainer_job_id) or self._owners.get(trainer_job_id)
        if owner is not None:
            return owner
        for delay in (0.0, *_LOOKUP_RETRIES_S):
            await asyncio.sleep(delay)
            owner = await self._lookup(trainer_job_id)
            if owner is not None:
                self._owners[trainer_job_id] = owner
                while len(self._owners) > _CACHE_SIZE:
                    self._owners.popitem(last=False)
                return owner
        return None  # not a Shepherd job, or already finished

    async def _deliver(self, backend: str, event: JobEvent) -> None:
        """Deliver ``event``, trying again while the server does not answer."""
        tries = 0
        while True:
            try:
                await self._deliver_once(backend, event)
                return
            except RPCError as exc:
                if exc.status not in _SERVER_AWAY:
                    raise
                delay = _REDELIVER_S[min(tries, len(_REDELIVER_S) - 1)]
                tries += 1
                log.warning(
                    "events.redeliver",
                    trainer_job_id=event.job_id,
                    event_id=event.id,
                    tries=tries,
                    delay_s=delay,
                    error=exc.message[:200],
                )
                await asyncio.sleep(delay)

    async def _deliver_once(self, backend: str, event: JobEvent) -> None:
        started = time.monotonic()
        owner = await self._owner(event.job_id)
        if owner is None:
            return
        signal = PlatformEvent(
            trainer_job_id=event.job_id,
            state=event.state.value,
            message=event.job.status.message,
            event_id=event.id,
            event_time=event.event_time,
        )
        request = SignalWorkflowExecutionRequest(
            namespace=self.client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=owner),
            signal_name="platform_event",
            input=Payloads(payloads=await self.client.data_converter.encode([signal])),
            identity=self.client.identity,
            # The same event from another worker's bridge (or after a reconnect) is kept
            # once by the server.
            request_id=f"platform-event/{backend}/{event.job_id}/{event.id}",
        )
        try:
            await self.client.workflow_service.signal_workflow_execution(request, retry=True)
            self.delivered += 1
        except RPCError as exc:
            if exc.status is not RPCStatusCode.NOT_FOUND:
                raise  # the server is away: tried again (``_deliver``)
            # The workflow closed meanwhile (or never was ours).
            self._owners.pop(event.job_id, None)
            log.debug("events.signal_failed", workflow_id=owner, error=exc.message)
            return
        log.debug(
            "events.delivered",
            workflow_id=owner,
            trainer_job_id=event.job_id,
            state=event.state.value,
            took_s=round(time.monotonic() - started, 3),
        )
