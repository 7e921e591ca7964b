"""Every workflow a test ran is replayed against the same code when the test ends.

A workflow that replays differently from how it ran is one a worker restart, a cache
eviction or a query on the closed job would break. Replaying every run of every test (job,
sweep, schedule and reaper workflows alike, each continue-as-new run on its own) turns any
nondeterministic path a test reaches into a failure of that test, naming the workflow and
the first event that replays differently.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer


def _workflows() -> list[type]:
    from workers.main import WORKFLOWS

    return WORKFLOWS


def _type(history: WorkflowHistory) -> str:
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name


def ran_code(history: WorkflowHistory) -> bool:
    """Whether any workflow code ran (a claim lock, on a queue no worker polls, never does)."""
    return any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in history.events)


async def first_divergence(replayer: Replayer, history: WorkflowHistory) -> int:
    """The first event whose replay fails: the shortest failing prefix of the history."""
    events = list(history.events)
    low, high = 1, len(events)  # the whole history fails
    while low < high:
        mid = (low + high) // 2
        prefix = WorkflowHistory(history.workflow_id, events[:mid])
        result = await replayer.replay_workflow(prefix, raise_on_replay_failure=False)
        if result.replay_failure is None:
            low = mid + 1
        else:
            high = mid
    return events[low - 1].event_id


async def replay(
    histories: Iterable[WorkflowHistory], context: str, workflows: list[type] | None = None
) -> int:
    """Replay ``histories``; raise naming ``context``, the workflow and the first diverging
    event of the first one that does not replay. Returns how many were replayed."""
    workflows = workflows or _workflows()
    replayer = Replayer(workflows=workflows, data_converter=pydantic_data_converter)
    # Workflows of a test's own making (the SDK reproduction's, say) are that test's to
    # replay; every Shepherd workflow is registered (tests/unit/test_replay_harness.py).
    known = {w.__temporal_workflow_definition.name for w in workflows}  # type: ignore[attr-defined]
    count = 0
    for history in histories:
        if not ran_code(history) or _type(history) not in known:
            continue
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        count += 1
        if result.replay_failure is not None:
            event_id = await first_divergence(replayer, history)
            event = next(e for e in history.events if e.event_id == event_id)
            raise AssertionError(
                f"{context}: workflow {history.workflow_id} does not replay against the "
                f"current code; first diverging event {event_id} "
                f"({EventType.Name(event.event_type)}): {result.replay_failure}"
            )
    return count


async def histories_since(client: Client, since: datetime) -> list[WorkflowHistory]:
    """Every run started at or after ``since`` in the client's namespace (running ones too:
    their history so far)."""
    # The server runs on this machine: one clock (no allowance that would take in the end
    # of the test before).
    query = f"StartTime >= '{since.isoformat()}'"
    found = []
    async for execution in client.list_workflows(query):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        found.append(await handle.fetch_history())
    return found


async def replay_since(
    client: Client, since: datetime, context: str, workflows: list[type] | None = None
) -> int:
    return await replay(await histories_since(client, since), context, workflows)
