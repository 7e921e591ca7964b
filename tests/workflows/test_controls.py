"""Pause and resume: from Python (updates with validators) and from the ``temporal`` CLI /
Web UI (signals). A paused job holds no trainer and resumes to the same weights."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError

from shepherd import binaries
from shepherd.models import JobStatus, PauseRequest, PauseResult, ResumeRequest
from shepherd.phases import Phase
from shepherd.states import JobState
from tests.helpers import optimizer_steps, wait_state
from tests.workflows.conftest import Stack
from tests.workflows.test_recovery import SLOW, model_digest


async def test_pause_holds_no_trainer_and_resumes_to_the_same_weights(stack: Stack) -> None:
    reference = await stack.start(stack.spec("ref", trainer=SLOW, training={"total_steps": 40}))
    handle = await stack.start(stack.spec("pausing", trainer=SLOW, training={"total_steps": 40}))
    await stack.until(handle, lambda s: s.step >= 10 and s.phase is Phase.TRAINING)

    paused = await handle.execute_update(
        "request_pause", PauseRequest(reason="test"), result_type=PauseResult
    )
    assert paused.checkpoint is not None and paused.checkpoint.rsplit("/", 1)[-1] == "pause-1"
    status = await stack.status(handle)
    assert status.phase is Phase.PAUSED and status.paused_checkpoint == paused.checkpoint
    first_trainer = status.trainer_job_id or ""
    # The delete is asynchronous on the platform: DELETING, then DELETED once stopped.
    await wait_state(stack.account.client, first_trainer, JobState.DELETED)
    stats = (await stack.admin.stats())["jobs"][stack.job_name(first_trainer)]
    assert stats["liveTrainer"] is False  # no GPU held while paused
    assert (await stack.status(handle)).phase is Phase.PAUSED
    assert paused.step == status.step

    # Validators: a second pause is refused without touching the history.
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("request_pause", PauseRequest(), result_type=PauseResult)
    assert "already paused" in str(refused.value.cause)

    resumed = await handle.execute_update("request_resume", ResumeRequest(), result_type=JobStatus)
    assert resumed.phase is not Phase.PAUSED
    result = await handle.result()
    await reference.result()
    assert result.phase is Phase.COMPLETED and result.step == 40
    assert result.generation == 1 and result.trainer_job_id != first_trainer
    assert await model_digest(stack, "pausing-model") == await model_digest(stack, "ref-model")
    # Each generation was created once and is gone.
    all_stats = await stack.admin.stats()
    for trainer in (first_trainer, result.trainer_job_id or ""):
        job = all_stats["jobs"][stack.job_name(trainer)]
        assert job["creates"] == 1 and job["liveTrainer"] is False


async def test_resume_is_refused_when_not_paused(stack: Stack) -> None:
    handle = await stack.start(stack.spec("busy", trainer=SLOW, training={"total_steps": 40}))
    await stack.until(handle, lambda s: s.phase is Phase.TRAINING)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("request_resume", ResumeRequest(), result_type=JobStatus)
    assert "not paused" in str(refused.value.cause)
    await handle.cancel()


async def chunk_cancelled_while_not_running(handle: WorkflowHandle[Any, Any]) -> bool:
    """A training chunk of this job was cancelled while none of its attempts ran."""
    scheduled: dict[int, str] = {}
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = (
                event.activity_task_scheduled_event_attributes.activity_type.name
            )
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            cancel = event.activity_task_canceled_event_attributes
            said = [p.data.decode(errors="replace") for p in cancel.details.payloads]
            if scheduled.get(cancel.scheduled_event_id) == "train_chunk" and any(
                "ACTIVITY_ID_NOT_STARTED" in s for s in said
            ):
                return True
    return False


async def test_pause_and_resume_by_signal_from_the_temporal_cli(stack: Stack) -> None:
    spec = stack.spec(
        "signalled", trainer=SLOW, training={"total_steps": 60}, checkpoint={"every_steps": 60}
    )
    handle = await stack.start(spec)
    training = await stack.until(handle, lambda s: s.phase is Phase.TRAINING)
    # The pause is sent once a chunk runs (its first of 50 steps taken, 3 s of them), so it
    # stops a running chunk at a step and takes its checkpoint there.
    trainer = training.trainer_job_id or ""
    for _ in range(300):
        if (await optimizer_steps(stack.admin)).get(stack.job_name(trainer), 0) >= 1:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"trainer {trainer} took no step in 15 s")
    address = stack.client.service_client.config.target_host

    def temporal_signal(name: str) -> None:
        subprocess.run(
            [
                binaries.temporal(),
                "workflow",
                "signal",
                "--address",
                address,
                "--workflow-id",
                handle.id,
                "--name",
                name,
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )

    await asyncio.to_thread(temporal_signal, "pause")
    paused = await stack.until(handle, lambda s: s.phase is Phase.PAUSED)
    if paused.paused_checkpoint is None:
        # Unless the chunk was between two attempts then (a step's call failed and its retry
        # was due, as under load): Temporal cancels an activity not running at
        # once, saying only ACTIVITY_ID_NOT_STARTED, so the job cannot know how far the
        # last attempt got, keeps no pause checkpoint and resumes from its last checkpoint
        # (loop_training.position_unknown). Nothing else excuses a pause without one.
        assert await chunk_cancelled_while_not_running(handle), paused
    await asyncio.to_thread(temporal_signal, "resume")
    result = await handle.result()
    assert result.phase is Phase.COMPLETED and result.generation == 1


async def test_resume_from_a_named_earlier_checkpoint(stack: Stack) -> None:
    spec = stack.spec(
        "rewind", trainer=SLOW, training={"total_steps": 40}, checkpoint={"keep_last": 5}
    )
    handle = await stack.start(spec)
    at_20 = await stack.until(handle, lambda s: s.step >= 20 and s.phase is Phase.TRAINING)
    first = next(c for c in at_20.checkpoints if c.step == 10)
    await handle.execute_update("request_pause", PauseRequest(), result_type=PauseResult)
    await handle.execute_update(
        "request_resume", ResumeRequest(checkpoint=first.name), result_type=JobStatus
    )
    result = await handle.result()
    assert result.phase is Phase.COMPLETED and result.step == 40
    steps = [c.step for c in result.checkpoints]
    assert steps == sorted(steps) and steps[-1] == 40


async def test_bad_signals_from_the_temporal_cli_are_reported_not_dropped(stack: Stack) -> None:
    handle = await stack.start(stack.spec("noisy", trainer=SLOW, training={"total_steps": 30}))
    await stack.until(handle, lambda s: s.phase is Phase.TRAINING)
    address = stack.client.service_client.config.target_host

    def temporal_signal(name: str, payload: str) -> None:
        subprocess.run(
            [binaries.temporal(), "workflow", "signal", "--address", address]
            + ["--workflow-id", handle.id, "--name", name, "--input", payload],
            check=True,
            capture_output=True,
            timeout=30,
        )

    await asyncio.to_thread(temporal_signal, "pause", '"right now please"')
    await asyncio.to_thread(temporal_signal, "resume", '{"checkpoint": 5}')
    status = await stack.until(handle, lambda s: len(s.notices) >= 2)
    assert status.notices[0].startswith("signal pause ignored: unreadable input")
    assert "signal resume ignored" in status.notices[1]
    assert status.phase is Phase.TRAINING  # neither did anything
    await handle.signal("resume")  # well-formed, but the job is not paused
    status = await stack.until(handle, lambda s: len(s.notices) >= 3)
    assert status.notices[2].startswith("signal resume ignored: the job is not paused")
    assert (await handle.result()).phase is Phase.COMPLETED


async def test_a_bad_resume_checkpoint_is_refused_before_provisioning(stack: Stack) -> None:
    # A finished rank-4 job gives a real checkpoint the paused job cannot load.
    other = await stack.start(
        stack.spec("rank4", trainer={**SLOW, "lora_rank": 4}, training={"total_steps": 10})
    )
    foreign = (await other.result()).checkpoints[-1].name
    handle = await stack.start(stack.spec("picky", trainer=SLOW, training={"total_steps": 30}))
    await stack.until(handle, lambda s: s.step >= 10 and s.phase is Phase.TRAINING)
    await handle.execute_update("request_pause", PauseRequest(), result_type=PauseResult)
    creates = (await stack.admin.stats())["creates"]

    bad = {
        foreign.replace(f"accounts/{stack.account.id}/", "accounts/someone-else/"): "belongs to",
        foreign: "LoRA rank 4",
        foreign.rsplit("/", 1)[0] + "/no-such-step": "does not exist",
    }
    for checkpoint, why in bad.items():
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(
                "request_resume", ResumeRequest(checkpoint=checkpoint), result_type=JobStatus
            )
        assert why in str(refused.value.cause), checkpoint
    # The same by signal (no answer): noticed in the status, still paused.
    await handle.signal("resume", ResumeRequest(checkpoint=foreign))
    status = await stack.until(handle, lambda s: any("resume refused" in n for n in s.notices))
    assert status.phase is Phase.PAUSED and "LoRA rank 4" in status.notices[-1]
    assert (await stack.admin.stats())["creates"] == creates  # nothing was provisioned

    await handle.execute_update("request_resume", ResumeRequest(), result_type=JobStatus)
    assert (await handle.result()).phase is Phase.COMPLETED


async def test_a_bad_resume_from_fails_before_any_trainer(stack: Stack) -> None:
    missing = f"accounts/{stack.account.id}/rlorTrainerJobs/gone/checkpoints/step-1"
    handle = await stack.start(stack.spec("orphan", training={"resume_from": missing}))
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert failed.value.cause.type == "InvalidCheckpoint"  # type: ignore[attr-defined]
    assert "training.resume_from" in str(failed.value.cause)
    status = await stack.status(handle)
    assert status.trainer_job_id is None and status.phase is Phase.FAILED
