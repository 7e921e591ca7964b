"""A program that exited 0 is never started again (issue 26, class 2): when its worker dies
after the exit, the next attempt of ``run_program`` finds the exit record in the job's log
directory and reports the final checkpoint it names — or, if the worker died before that
checkpoint was saved, fails the job saying so (an older checkpoint would be the wrong
model). The record is not copied into a retried job's directory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.programs import ProgramActivities
from shepherd import programs
from shepherd.models import CheckpointRecord, ProgramProgress, ProgramSettings, RunProgramInput
from workflows import policies

WORKFLOW_ID = "job-exited-0123abcd"


class _Handle:
    def __init__(self, signals: list[tuple[str, Any]]) -> None:
        self.signals = signals

    async def signal(self, name: str, arg: Any) -> None:
        self.signals.append((name, arg))


class _Client:
    """Stands in for the Temporal client the activity signals its workflow with."""

    def __init__(self) -> None:
        self.signals: list[tuple[str, Any]] = []

    def get_workflow_handle(self, workflow_id: str) -> _Handle:
        assert workflow_id == WORKFLOW_ID
        return _Handle(self.signals)


class _Backends:
    profiles: dict[str, Any] = {}

    def client(self, name: str) -> Any:
        raise AssertionError("a program that exited 0 needs no platform")


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A program whose start would leave a file behind."""
    marker = tmp_path / "started"
    script = tmp_path / "prog.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('started')\n")
    monkeypatch.setenv(programs.ENV_VAR, json.dumps({"prog": {"script": str(script)}}))
    monkeypatch.setenv(programs.DIR_ENV_VAR, str(tmp_path / "programs"))
    return marker


async def _run(client: _Client) -> Any:
    env = ActivityEnvironment(client=client)  # type: ignore[arg-type]
    env.info = dataclasses.replace(env.info, workflow_id=WORKFLOW_ID, attempt=2)
    activities = ProgramActivities(_Backends(), "control-q")  # type: ignore[arg-type]
    inp = RunProgramInput(
        backend="local",
        program="prog",
        settings=ProgramSettings(
            base_model="accounts/fireworks/models/qwen3-8b",
            lora_rank=4,
            checkpoint_every=4,
            call_timeout_s=30,
            route_race_retries=4,
            route_race_window_s=30,
        ),
    )
    return await env.run(activities.run_program, inp)


def _exited(record: CheckpointRecord | None) -> None:
    directory = programs.log_dir(WORKFLOW_ID)
    directory.mkdir(parents=True)
    data = {"code": 0, "step": 10, "checkpoint": record.model_dump(mode="json") if record else None}
    (directory / programs.EXIT_FILE).write_text(json.dumps(data))


async def test_an_attempt_after_exit_0_reports_the_final_checkpoint_and_starts_nothing(
    started: Path,
) -> None:
    record = CheckpointRecord(
        name="accounts/a/rlorTrainerJobs/j/checkpoints/step-00000010",
        step=10,
        trainer_job_id="j",
        sampler="x-sampler",
    )
    _exited(record)
    client = _Client()
    result = await _run(client)
    assert result.exit_code == 0 and result.step == 10
    assert not started.exists()
    [(name, progress)] = client.signals
    assert name == "program_progress" and isinstance(progress, ProgramProgress)
    assert progress.checkpoints == [record]


async def test_an_exit_0_without_its_final_checkpoint_fails_rather_than_run_again(
    started: Path,
) -> None:
    _exited(None)
    with pytest.raises(ApplicationError) as failed:
        await _run(_Client())
    assert failed.value.type == policies.PROGRAM_FAILED and failed.value.non_retryable
    assert "exited 0" in failed.value.message
    assert not started.exists()


def test_a_retry_does_not_inherit_the_exit_record(tmp_path: Path) -> None:
    source = tmp_path / "failed-job"
    source.mkdir()
    (source / programs.EXIT_FILE).write_text('{"code": 0}')
    (source / "checkpoints.jsonl").write_text("{}\n")
    target = tmp_path / "retry"
    assert programs.seed_log_dir(target, source)
    assert (target / "checkpoints.jsonl").exists()
    assert not (target / programs.EXIT_FILE).exists()
