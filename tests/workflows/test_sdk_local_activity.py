"""Documents an SDK bug (temporalio 1.35.0, its Core): a query answered while a workflow task
waits for a local activity makes the worker complete that task with the activity's marker
and hand the result to the workflow only in a forced next task; replay hands it over in the
task that holds the marker. What the workflow does right after the result (here, the first
``workflow.patched()`` of a patch) then happens in another task live than on replay, and the
history does not replay: TMPRL1100. The upstream-ready report is docs/determinism.md.

If the queried run below starts to replay, the SDK has changed: reconsider
workflows/versions.py (current runs avoid local activities because of this)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from tests.workflows.sdk_local_activity import LocalActivityThenPatch, held, quick

ROUNDS = 5


async def run_once(client: Client, *, queried: bool) -> WorkflowHistory:
    queue = f"sdk-la-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[LocalActivityThenPatch],
        activities=[quick, held],
        # The workflow's query and its local activity share an event (see the module).
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await client.start_workflow(
            LocalActivityThenPatch.run,
            args=[ROUNDS, queried],
            # A query reaches a workflow whose task waits for a local activity only when Core
            # heartbeats that task, at 80% of its timeout: keep the wait short.
            task_timeout=timedelta(seconds=1),
            id=f"sdk-la-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        stop = asyncio.Event()

        async def query() -> None:
            while queried and not stop.is_set():
                with contextlib.suppress(Exception):
                    # Bounded: a query buffered behind a workflow task that timed out (a busy
                    # machine misses the 0.8 s heartbeat) can wait far longer than the run,
                    # and the gated local activity waits for the next query to get through.
                    await handle.query(
                        LocalActivityThenPatch.where, rpc_timeout=timedelta(seconds=2)
                    )
                await asyncio.sleep(0.005)

        querying = asyncio.ensure_future(query())
        try:
            assert await handle.result() == "ok"
        finally:
            stop.set()
            await querying
        return await handle.fetch_history()


def splits(history: WorkflowHistory) -> int:
    """Local-activity markers that end their workflow task: the commands that followed the
    result are in the next task (with nothing else to do, the marker is followed by the
    patch marker and its search-attribute upsert in the same task)."""
    events = history.events
    count = 0
    for i, event in enumerate(events[:-1]):
        attrs = event.marker_recorded_event_attributes
        if (
            event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and attrs.marker_name == "core_local_activity"
            and events[i + 1].event_type != EventType.EVENT_TYPE_MARKER_RECORDED
        ):
            count += 1
    return count


@pytest.mark.replays_itself("documents an SDK bug: its queried history must fail replay")
async def test_sdk_hands_a_local_activity_result_over_a_task_late_after_a_query(
    client: Client,
) -> None:
    replayer = Replayer(
        workflows=[LocalActivityThenPatch], workflow_runner=UnsandboxedWorkflowRunner()
    )
    quiet = await run_once(client, queried=False)
    assert splits(quiet) == 0
    assert (
        await replayer.replay_workflow(quiet, raise_on_replay_failure=False)
    ).replay_failure is None

    queried = await run_once(client, queried=True)
    # Each round's local activity ends while a query is being answered: each round splits.
    assert splits(queried) == ROUNDS
    failure = (
        await replayer.replay_workflow(queried, raise_on_replay_failure=False)
    ).replay_failure
    assert failure is not None and "TMPRL1100" in str(failure)
    assert "Non-deprecated patch marker encountered for change after-local-activity-" in str(
        failure
    )
