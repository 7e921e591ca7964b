"""Determinism guard: every recorded history in tests/histories must replay against the
current workflow code. A change that running workflows could not survive fails here; make
it with ``workflow.patched()`` instead (then re-record with SHEPHERD_RECORD_HISTORIES=1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

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
