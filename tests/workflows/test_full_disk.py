"""A full disk (issue 32): under a program job (its log directory on a small tmpfs), and under
the trainer platform (its data directory).

What must fail fails saying which path and why; what is done stays done — a program that
exited 0 is never started again, and its job completes from the checkpoints Shepherd holds
(they live on the platform, not on the full volume); the trainer is deleted either way, and
the worker goes on serving other jobs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError

from localplane.process import PlaneProcess
from shepherd.client import Shepherd
from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.states import JobState
from tests.conftest import BASELINE
from tests.helpers import fill, wait_state
from tests.workflows.conftest import Stack, stack_on
from tests.workflows.test_programs import program_starts, promoted_digest, sft_spec
from tests.workflows.test_recovery import model_digest
from tests.workflows.test_server_outage import STEPS
from tests.workflows.test_server_outage import spec as outage_spec

#: Big enough for a short run's logs, small enough to fill in a blink.
SIZE = "256k"


@pytest.fixture
def small_volume(
    tmp_path: Path, programs_env: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Program log directories on a tmpfs of ``SIZE`` (mounted for the test, unmounted after),
    and the disk-filling program registered beside the others."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (these machines run the suite as root)")
    volume = tmp_path / "small"
    volume.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(volume)],
        check=True,
        capture_output=True,
    )
    try:
        registered = json.loads(os.environ["SHEPHERD_PROGRAMS"])
        registered["filling"] = {
            "module": "tests.workflows.disk_filling_program",
            "total_steps_arg": "steps",
            "log_dir_arg": "log_dir",
        }
        monkeypatch.setenv("SHEPHERD_PROGRAMS", json.dumps(registered))
        monkeypatch.setenv("SHEPHERD_PROGRAM_DIR", str(volume))
        yield volume
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=False, capture_output=True)


async def activity_failures(handle: Any) -> list[str]:
    """What each failed activity attempt of the job said (for an assertion's message)."""
    said = []
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            said.append(e.activity_task_failed_event_attributes.failure.message[:500])
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            said.append(f"timed out: {e.activity_task_timed_out_event_attributes.failure}"[:500])
    return said


def reported(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


@pytest.mark.parametrize("steps", [8, 10], ids=["multiple", "not-multiple"])
async def test_a_program_that_filled_its_disk_and_exited_0_completes_once(
    stack: Stack, small_volume: Path, tmp_path: Path, steps: int
) -> None:
    """The program trains, fills its volume and exits 0: Shepherd's exit record cannot be
    written. The job completes all the same — the program started once, its final weights
    promoted (by digest), the status naming the path that could not be written and why —
    and a loop job on the same worker meanwhile completes too."""
    report = tmp_path / "report.jsonl"
    name = f"full-{steps}"
    spec = sft_spec(
        stack, name, steps=steps, program="filling", args={"fill": "after", "report": str(report)}
    )
    handle = await stack.start(spec)
    other = await stack.start(stack.spec(f"beside-{steps}", training={"total_steps": 12}))
    async with asyncio.timeout(240):
        final: JobStatus = await handle.result()
        beside: JobStatus = await other.result()
    assert final.phase is Phase.COMPLETED, final.error
    assert final.step == steps and final.checkpoints[-1].step == steps
    assert await program_starts(handle) == 1, await activity_failures(handle)
    said = " | ".join(final.notices)
    exit_file = small_volume / handle.id / "shepherd-exit.json"
    assert f"could not be recorded in {exit_file}" in said, said
    assert "No space left on device (ENOSPC)" in said, said
    ended = [line for line in reported(report) if "final" in line]
    assert len(ended) == 1
    assert await promoted_digest(stack, name) == ended[0]["digest"]
    await wait_state(stack.account.client, final.trainer_job_id or "", JobState.DELETED)
    assert beside.phase is Phase.COMPLETED and beside.step == 12


async def test_a_program_whose_own_write_fails_on_a_full_disk_says_why(
    stack: Stack, small_volume: Path, tmp_path: Path
) -> None:
    """The volume is full before the program starts: its first checkpoint list write fails
    and it exits 1. The job fails once (never started again) with the program's own last
    words — the OSError and its path, which Shepherd kept although the program's log file
    could not be written — and says that log file could not be; the trainer is deleted."""
    report = tmp_path / "report.jsonl"
    spec = sft_spec(
        stack,
        "full-first",
        steps=8,
        program="filling",
        args={"fill": "before", "report": str(report)},
    )
    handle = await stack.start(spec)
    with pytest.raises(WorkflowFailureError):
        async with asyncio.timeout(240):
            await handle.result()
    status = await stack.status(handle)
    assert status.phase is Phase.FAILED and status.error is not None
    message = status.error.message
    assert status.error.type == "ProgramFailed", status.error
    assert "exited with status 1" in message, message
    assert "No space left on device" in message and "checkpoints.jsonl" in message, message
    output = small_volume / handle.id / "program.log"
    assert f"could not be written to {output}" in message, message
    assert await program_starts(handle) == 1
    await wait_state(stack.account.client, status.trainer_job_id or "", JobState.DELETED)


@pytest.mark.slow
async def test_a_job_whose_platform_disk_fills_says_why_and_completes_once_space_is_freed(
    client: Client, stack: Stack, small_disk: Path
) -> None:
    """The trainer platform's data directory fills while a loop job trains: the checkpoint it
    next saves fails, and ``shepherd status`` says so — the save retrying, the platform's words:
    no space left, under which directory. Freed, the same save succeeds (the trainer does a
    failed save again when it is retried), and the job completes with a clean run's weights on
    the trainer it started on, which it deletes."""
    plane = PlaneProcess(small_disk / "plane", config=BASELINE)
    async with stack_on(client, plane) as near:
        reference = await stack.start(outage_spec(stack, "ref"))
        handle = await near.start(outage_spec(near, "full"))
        job = Shepherd(near.client, task_queue=near.task_queue).get(handle.id)
        await near.until(handle, lambda s: s.step >= 3 and s.phase is Phase.TRAINING)
        filler = fill(small_disk)
        said = await until_retrying(job, "no space left")
        assert str(plane.data_dir) in said.retrying[0], said.retrying
        assert said.retrying[0].startswith("save_checkpoint"), said.retrying
        filler.unlink()
        async with asyncio.timeout(120):
            final: JobStatus = await handle.result()
            await reference.result()
        assert final.phase is Phase.COMPLETED and final.step == STEPS, final.error
        assert not final.recoveries and final.failures == 0, final.recoveries
        assert [c.step for c in final.checkpoints][-1] == STEPS
        assert await model_digest(near, "full-model") == await model_digest(stack, "ref-model")
        trainer = (await near.admin.stats())["jobs"][near.job_name(final.trainer_job_id or "")]
        assert trainer["creates"] == 1 and trainer["trainersStarted"] == 1, trainer
        assert trainer["state"] == JobState.DELETED.value


async def until_retrying(job: Any, cause: str) -> JobStatus:
    """Until ``shepherd status`` shows the job retrying something for ``cause``."""
    async with asyncio.timeout(60):
        while True:
            status: JobStatus = await job.status()
            if any(cause in r.lower() for r in status.retrying):
                return status
            await asyncio.sleep(0.2)
