"""Waiting at scale (issue 8): polls on their own queue and backed off while events flow,
an event bridge that finds workflows from trainer ids, drops what no one waits for, and
keeps one signal per event however many workers run a bridge. Real Temporal, real plane."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from localplane.admin import PlaneAdmin
from shepherd.models import JobInput
from shepherd.phases import Phase
from shepherd.states import JobState
from shepherd.trainer_ids import owner_of
from tests.workflows.conftest import Stack
from workers.events import EventBridge
from workflows import policies
from workflows.job import TrainingJobWorkflow


async def _platform_events(handle: WorkflowHandle[Any, Any]) -> list[dict[str, Any]]:
    out = []
    async for e in handle.fetch_history_events():
        if e.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            continue
        attrs = e.workflow_execution_signaled_event_attributes
        if attrs.signal_name == "platform_event":
            payload = pydantic_data_converter.payload_converter.from_payloads(
                attrs.input.payloads, [dict]
            )[0]
            out.append(payload)
    return out


async def _scheduled_queues(handle: WorkflowHandle[Any, Any]) -> dict[str, set[str]]:
    queues: dict[str, set[str]] = {}
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            queues.setdefault(attrs.activity_type.name, set()).add(attrs.task_queue.name)
    return queues


async def test_the_bridge_finds_the_workflow_from_the_trainer_id(stack: Stack) -> None:
    assert stack.bridge is not None
    handle = await stack.start(stack.spec("owned"))
    status = await handle.result()
    assert status.phase is Phase.COMPLETED
    # The trainer id names its workflow, so no visibility query was needed.
    assert owner_of(status.trainer_job_id or "") == handle.id
    assert stack.bridge.lookups == 0
    events = await _platform_events(handle)
    states = [e["state"] for e in events]
    assert JobState.RUNNING.value in states
    # PENDING (every job's first state) and DELETING reach no workflow.
    assert not {JobState.PENDING.value, JobState.DELETING.value} & set(states)
    assert stack.bridge.dropped >= 1


async def test_a_workflow_id_that_does_not_fit_is_found_through_visibility(stack: Stack) -> None:
    assert stack.bridge is not None
    spec = stack.spec("unfit")
    handle = await stack.client.start_workflow(
        TrainingJobWorkflow.run,
        JobInput(spec=spec),
        id=f"Scheduled-Unfit-{uuid.uuid4().hex[:8]}:2026-11-23T10:00:00Z",
        task_queue=stack.task_queue,
    )
    stack.handles.append(handle)
    status = await handle.result()
    assert status.phase is Phase.COMPLETED
    assert owner_of(status.trainer_job_id or "") is None
    assert stack.bridge.lookups >= 1
    assert JobState.RUNNING.value in {e["state"] for e in await _platform_events(handle)}


async def test_every_bridge_delivers_each_event_once(stack: Stack) -> None:
    # A second worker's bridge follows the same stream: the server keeps one signal per
    # event (the signal's request id is the event's), so the workflow sees no duplicates.
    second = EventBridge(stack.client, stack.registry)
    task = asyncio.create_task(second.run())
    try:
        handle = await stack.start(stack.spec("twice"))
        assert (await handle.result()).phase is Phase.COMPLETED
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    ids = [e["event_id"] for e in await _platform_events(handle)]
    assert ids and len(ids) == len(set(ids))
    assert second.delivered >= len(ids)  # it did send each of them


async def test_polls_run_on_the_waits_queue(stack: Stack) -> None:
    handle = await stack.start(stack.spec("queues"))
    assert (await handle.result()).phase is Phase.COMPLETED
    queues = await _scheduled_queues(handle)
    waits = policies.waits_queue(stack.task_queue)
    polls = {name: q for name, q in queues.items() if name.startswith("wait_for")}
    assert polls and all(q == {waits} for q in polls.values()), queues
    # Work that holds a trainer stays on the job's own queue.
    assert queues["train_chunk"] == {stack.task_queue}
    assert queues["delete_trainer"] == {stack.task_queue}


async def test_with_events_the_placement_poll_backs_off(stack: Stack, faults: PlaneAdmin) -> None:
    await faults.set_faults(capacity=0)  # nobody gets a slot: the job waits in PENDING
    handle = await stack.start(stack.spec("patient", policies={"poll_interval": "1s"}))
    await stack.until(handle, lambda s: s.phase is Phase.QUEUED)
    await asyncio.sleep(6)
    desc = await handle.describe()
    pending = [a for a in desc.raw_description.pending_activities]
    assert [a.activity_type.name for a in pending] == ["wait_for_placement"]
    # Every 1 s that would be ~6 attempts; doubling from 1 s (jitter >= 0.75) is at most 4.
    assert 2 <= pending[0].attempt <= 4
    await faults.set_faults(capacity=4)
    assert (await handle.result()).phase is Phase.COMPLETED
