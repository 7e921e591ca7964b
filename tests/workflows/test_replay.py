"""Determinism guard: every recorded history in tests/histories must replay against the
current workflow code. A change that running workflows could not survive fails here; make
it with ``workflow.patched()`` instead (then re-record with SHEPHERD_RECORD_HISTORIES=1)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, Worker

from tests.replay import replay
from tests.workflows.drifting import DriftingV1, DriftingV2
from workers.main import WORKFLOWS

HISTORIES = sorted((Path(__file__).parent.parent / "histories").glob("*.json"))


def test_histories_were_recorded() -> None:
    assert len(HISTORIES) >= 5, (
        "record histories: SHEPHERD_RECORD_HISTORIES=1 pytest tests/workflows"
    )


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_against_current_code(path: Path) -> None:
    text = path.read_text()
    # The workflow id matters: trainer job ids are derived from it.
    started = json.loads(text)["events"][0]["workflowExecutionStartedEventAttributes"]
    history = WorkflowHistory.from_json(started["workflowId"], text)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)


@pytest.mark.replay_workflows.with_args(DriftingV1)
async def test_teardown_replay_names_the_test_and_the_first_diverging_event(
    client: Client,
) -> None:
    queue = f"drift-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[DriftingV1]):
        handle = await client.start_workflow(
            DriftingV1.run, id=f"drift-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        assert await handle.result() == "v1"
    history = await handle.fetch_history()
    assert await replay([history], "same code", workflows=[DriftingV1]) == 1
    with pytest.raises(AssertionError) as failed:
        await replay([history], "tests/x.py::test_y", workflows=[DriftingV2])
    text = str(failed.value)
    assert "tests/x.py::test_y" in text and handle.id in text
    # The second timer's scheduling (after the first fired) is where V2 differs.
    second_timer = [
        e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ][1]
    assert "first diverging event" in text
    diverging = int(text.split("first diverging event ")[1].split(" ")[0])
    assert diverging <= second_timer
