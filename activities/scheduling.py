"""A job's words with its backend's scheduler (workflows/scheduler.py), and the scheduler's
one look at the world: which of its jobs are closed.

``ask_for_slot`` starts the scheduler the first time (signal-with-start: its seed is this
worker's backend profile — its declared slots, capabilities and queues), and only signals it
afterwards; ``release_slot`` and ``note_checkpointed`` signal it. Each is idempotent on the
scheduler's side (a request is keyed by the job and its number), so a retry is safe.

A worker's asks go to a scheduler one signal at a time (:class:`AskBatcher`): the asks that
arrive while one is in flight go together in the next. One workflow takes its signals one
update at a time; a burst of thousands of jobs each signalling it kept the scheduler's own
workflow task from ever starting ("Workflow is busy": measured with 5,000 jobs asking).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from google.protobuf.field_mask_pb2 import FieldMask
from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflow.v1 import WorkflowExecutionOptions
from temporalio.api.workflowservice.v1 import UpdateWorkflowExecutionOptionsRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import Priority, WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from shepherd.models import AskForSlotInput, SlotNoteInput
from shepherd.scheduling import (
    HOLDING_PRIORITY,
    PLACES_FIRST,
    SCHEDULER_TYPE,
    Ask,
    Capacity,
    JobNotice,
    SchedulerInput,
    SchedulerState,
    scheduler_id,
)

#: Job ids asked about in one visibility query.
_BATCH = 100
#: Asks in one signal at most (~200 bytes each: far below the 2 MB payload limit).
MAX_ASKS_PER_SIGNAL = 500


async def set_task_priority(client: Client, workflow_id: str, priority: Priority) -> None:
    """The priority of ``workflow_id``'s tasks from now on (the server's
    UpdateWorkflowExecutionOptions; a server that cannot change it leaves it as it was).

    Why: a job's workflow tasks dispatch at its submission's priority key, in line with
    every other job's of that key. Behind a burst of thousands of new jobs (their first
    tasks), an admitted job's next task waited minutes between two training chunks
    (bench/admission.py at 10,000: every slot held, none trained); once admitted, its tasks
    go ahead of every job's intake (``HOLDING_PRIORITY``), as its activities already did."""
    try:
        await client.workflow_service.update_workflow_execution_options(
            UpdateWorkflowExecutionOptionsRequest(
                namespace=client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=workflow_id),
                workflow_execution_options=WorkflowExecutionOptions(priority=priority._to_proto()),
                update_mask=FieldMask(paths=["priority"]),
            )
        )
    except RPCError as exc:
        if exc.status not in (RPCStatusCode.UNIMPLEMENTED, RPCStatusCode.INVALID_ARGUMENT):
            raise


class Profiles(Protocol):
    @property
    def profiles(self) -> Mapping[str, Any]: ...


def seed(profile: Any, backend: str) -> SchedulerState:
    """A new scheduler's state, from the worker's backend profile."""
    return SchedulerState(
        backend=backend,
        capacity=Capacity(
            slots=int(getattr(profile, "slots", 0) or 0),
            capabilities=list(getattr(profile, "capabilities", []) or []),
            pools=dict(getattr(profile, "pools", {}) or {}),
        ),
        queues=dict(getattr(profile, "queues", {}) or {}),
        holder_check_s=float(getattr(profile, "holder_check_s", 30.0) or 30.0),
        places_every_s=float(getattr(profile, "places_every_s", 30.0) or 30.0),
        places_first=int(getattr(profile, "places_first", PLACES_FIRST)),
    )


class AskBatcher:
    """Sends asks with ``send``, one call at a time: the asks that come while a call is in
    flight go together in the next (at most ``MAX_ASKS_PER_SIGNAL``). An ask returns once the
    call that carried it did, or raises what it raised (its activity's retry sends it again:
    the scheduler keeps one of each). A lone ask costs one call, as before; a burst costs
    about one call per round trip."""

    def __init__(self, send: Callable[[list[Ask]], Awaitable[None]]) -> None:
        self._send = send
        self._pending: list[tuple[Ask, asyncio.Future[None]]] = []
        self._sending: asyncio.Task[None] | None = None
        #: Calls made (the tests read it).
        self.calls = 0

    async def ask(self, ask: Ask) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # (An ask whose activity was cancelled may still be sent: it is retrieved here.)
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._pending.append((ask, done))
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        while self._pending:
            batch = self._pending[:MAX_ASKS_PER_SIGNAL]
            del self._pending[:MAX_ASKS_PER_SIGNAL]
            self.calls += 1
            try:
                await self._send([ask for ask, _ in batch])
            except BaseException as exc:  # each ask's activity fails with it, and retries
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)


class SchedulingActivities:
    def __init__(self, clients: Profiles) -> None:
        self.clients = clients
        self._batchers: dict[str, AskBatcher] = {}

    @activity.defn(name="ask_for_slot")
    async def ask_for_slot(self, inp: AskForSlotInput) -> None:
        await self.ask(inp.backend, inp.ask)

    async def ask(self, backend: str, ask: Ask) -> None:
        """Send ``ask`` to ``backend``'s scheduler (starting it the first time), with the
        asks this worker sends meanwhile. Inside an activity: ``ask_for_slot``, or a
        job's preflight that asks for it (activities/preflight.py)."""
        batcher = self._batchers.get(backend)
        if batcher is None:
            client, task_queue = activity.client(), activity.info().task_queue
            batcher = self._batchers[backend] = AskBatcher(
                lambda asks: self._send_asks(client, task_queue, backend, asks)
            )
        await batcher.ask(ask)

    async def _send_asks(self, client: Any, task_queue: str, backend: str, asks: list[Ask]) -> None:
        profile = self.clients.profiles.get(backend)
        await client.start_workflow(
            SCHEDULER_TYPE,  # (by name: the workflow's module imports these activities)
            SchedulerInput(state=seed(profile, backend)),
            id=scheduler_id(backend),
            task_queue=task_queue,
            # Its decisions go ahead of every job's intake: each admits a job to a GPU.
            priority=HOLDING_PRIORITY,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal="asks",
            start_signal_args=[asks],
        )

    @activity.defn(name="release_slot")
    async def release_slot(self, inp: SlotNoteInput) -> None:
        await self._signal(inp, "release")
        if inp.release is not None and inp.priority_key is not None:
            # It waits again (paused, or making way): its tasks go back to its own priority.
            priority = Priority(priority_key=inp.priority_key)
            await set_task_priority(activity.client(), inp.release.job, priority)

    @activity.defn(name="note_checkpointed")
    async def note_checkpointed(self, inp: SlotNoteInput) -> None:
        await self._signal(inp, "checkpointed")

    async def _signal(self, inp: SlotNoteInput, name: str) -> None:
        handle = activity.client().get_workflow_handle(scheduler_id(inp.backend))
        try:
            await handle.signal(name, inp.release if name == "release" else inp.checkpointed)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            # No scheduler runs: nothing is held by anyone there.

    @activity.defn(name="tell_jobs")
    async def tell_jobs(self, notices: list[JobNotice]) -> list[str]:
        """The scheduler's grants and make-way notices, each a signal to its job through the
        client: a direct RPC, where a workflow's own signal to another waits in the server's
        transfer queue (behind a burst's thousands of starts on the dev server: minutes, in
        bench/admission.py at 10,000). Returns the jobs that are gone (no running
        workflow), whose slots the scheduler takes back. A retry sends them all again: a job
        keeps one grant and one notice per request."""
        client = activity.client()

        async def tell(notice: JobNotice) -> str | None:
            handle = client.get_workflow_handle(notice.job)
            try:
                if notice.slot_granted is not None:
                    # Before the grant: the task that takes it is already ahead of the intake.
                    await set_task_priority(client, notice.job, HOLDING_PRIORITY)
                    await handle.signal("slot_granted", notice.slot_granted)
                if notice.make_way is not None:
                    await handle.signal("make_way", notice.make_way)
                if notice.place is not None:
                    await handle.signal("place", notice.place)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                return notice.job
            return None

        told = await asyncio.gather(*(tell(n) for n in notices))
        return [job for job in told if job is not None]

    @activity.defn(name="closed_jobs")
    async def closed_jobs(self, jobs: list[str]) -> list[str]:
        """Which of these job workflows are closed (their last run is not running)."""
        client = activity.client()
        alive: set[str] = set()
        for i in range(0, len(jobs), _BATCH):
            batch = jobs[i : i + _BATCH]
            ids = ", ".join('"' + j.replace('"', '\\"') + '"' for j in batch)
            query = f"WorkflowId IN ({ids}) AND ExecutionStatus = 'Running'"
            async for execution in client.list_workflows(query):
                if execution.status == WorkflowExecutionStatus.RUNNING:
                    alive.add(execution.id)
            activity.heartbeat(i)
        # Visibility may lag: each one it does not list as running is asked directly.
        closed = []
        for job in (j for j in jobs if j not in alive):
            try:
                status = (await client.get_workflow_handle(job).describe()).status
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                status = None
            if status != WorkflowExecutionStatus.RUNNING:
                closed.append(job)
        return closed
