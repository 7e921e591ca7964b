"""How ``shepherd logs`` words a job's history and a trainer's lines (no server: a recorded
history of a preempted and recovered job, and trainer lines as localplane writes them)."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from shepherd.cli.logs import Lifecycle, trainer_text

PREEMPTED = (
    Path(__file__).parent.parent
    / "histories"
    / "test-preemption-mid-training-ends-with-identical-weights-1.json"
)


def test_a_recovery_reads_as_what_happened_in_order() -> None:
    history = WorkflowHistory.from_json("spot", PREEMPTED.read_text())
    lifecycle = Lifecycle(pydantic_data_converter.payload_converter)
    lines = [line.text for event in history.events for line in lifecycle.lines(event)]

    def at(prefix: str, after: int = -1) -> int:
        return next(i for i, text in enumerate(lines) if i > after and text.startswith(prefix))

    lost = at("train steps 21-30: failed after ")
    assert "TrainerLost: " in lines[lost] and "preempted" in lines[lost]
    recovering = at("phase RECOVERING", lost)
    resumed = at("resume the trainer: done", recovering)
    # The model's reload and the route's warm-up are one activity (the baseline lifecycle).
    loaded = at("load step-00000020, warm up the route (3 probes): done", resumed)
    assert at("train steps 21-30: done after ", loaded) > loaded
    assert lines[-1].startswith("job completed: model accounts/")
    (trainer,) = lifecycle.trainers
    assert trainer.endswith("-g0") and lifecycle.deleted == {trainer}
    assert (lifecycle.backend, lifecycle.outcome) == ("local", "COMPLETED")
    # Bookkeeping (patch markers, task events, step counters) says nothing.
    assert not any("core_patch" in text or "ShepherdStep" in text for text in lines)


def test_trainer_lines_read_as_event_and_fields() -> None:
    line = {
        "event": "checkpoint.saved",
        "name": "step-10",
        "step": 10,
        "trainer_job_id": "t-g0",
        "account": "a",
        "generation": 1,
        "level": "info",
        "logger": "localplane.trainer",
        "timestamp": "2026-11-23T10:22:13Z",
    }
    assert trainer_text(json.dumps(line))[0] == "checkpoint.saved name=step-10 step=10"
    failed = {"event": "trainer.error", "op": "optim_step", "level": "error", "exception": "Tb\n"}
    assert trainer_text(json.dumps(failed))[0] == "ERROR trainer.error op=optim_step\nTb"
    assert trainer_text("Traceback (most recent call last):") == (
        "Traceback (most recent call last):",
        {},
    )


def _lines(name: str) -> list[str]:
    path = PREEMPTED.parent / name
    history = WorkflowHistory.from_json("h", path.read_text())
    lifecycle = Lifecycle(pydantic_data_converter.payload_converter)
    return [line.text for event in history.events for line in lifecycle.lines(event)]


def test_a_wait_the_platforms_event_answered_is_not_called_cancelled() -> None:
    lines = _lines("test-happy-path-to-a-promoted-model-0.json")
    waits = [text for text in lines if text.startswith("wait for RUNNING: ")]
    assert waits and all("answered by the platform's event (RUNNING)" in w for w in waits)
    # A wait a cancel stopped is still a cancel.
    cancelled = _lines("test-cancel-while-scheduling-0.json")
    assert any(text.startswith("wait for RUNNING: cancelled after") for text in cancelled)
