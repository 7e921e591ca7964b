"""A job's words with its backend's scheduler (workflows/scheduler.py), and the scheduler's
one look at the world: which of its jobs are closed.

``ask_for_slot`` starts the scheduler the first time (signal-with-start: its seed is this
worker's backend profile — its declared slots, capabilities and queues), and only signals it
afterwards; ``release_slot`` and ``note_checkpointed`` signal it. Each is idempotent on the
scheduler's side (a request is keyed by the job and its number), so a retry is safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from shepherd.models import AskForSlotInput, SlotNoteInput
from shepherd.scheduling import (
    SCHEDULER_TYPE,
    Capacity,
    SchedulerInput,
    SchedulerState,
    scheduler_id,
)

#: Job ids asked about in one visibility query.
_BATCH = 100


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
        ),
        queues=dict(getattr(profile, "queues", {}) or {}),
        holder_check_s=float(getattr(profile, "holder_check_s", 30.0) or 30.0),
    )


class SchedulingActivities:
    def __init__(self, clients: Profiles) -> None:
        self.clients = clients

    @activity.defn(name="ask_for_slot")
    async def ask_for_slot(self, inp: AskForSlotInput) -> None:
        profile = self.clients.profiles.get(inp.backend)
        await activity.client().start_workflow(
            SCHEDULER_TYPE,  # (by name: the workflow's module imports these activities)
            SchedulerInput(state=seed(profile, inp.backend)),
            id=scheduler_id(inp.backend),
            task_queue=activity.info().task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal="ask",
            start_signal_args=[inp.ask],
        )

    @activity.defn(name="release_slot")
    async def release_slot(self, inp: SlotNoteInput) -> None:
        await self._signal(inp, "release")

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
