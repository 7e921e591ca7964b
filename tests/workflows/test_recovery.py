"""Surviving the boring ways training jobs die, on the real stack — proven by counting
(the plane's stats) and by bit-identical final weights, not by hoping."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError

from localplane.admin import PlaneAdmin
from shepherd.phases import Phase
from shepherd.states import JobState
from tests.workflows.conftest import Stack

SLOW = {"extra_args": ["--compute-delay-ms=60"]}


async def model_digest(stack: Stack, model_id: str) -> str:
    model = await stack.account.client.get_model(model_id)
    return str((model.model_extra or {})["weightsDigest"])


async def test_preemption_mid_training_ends_with_identical_weights(stack: Stack) -> None:
    reference = await stack.start(stack.spec("ref", trainer=SLOW, training={"total_steps": 30}))
    victim = await stack.start(stack.spec("spot", trainer=SLOW, training={"total_steps": 30}))

    mid = await stack.until(victim, lambda s: s.step >= 12 and s.phase is Phase.TRAINING)
    await stack.admin.preempt(mid.trainer_job_id or "", account=stack.account.id)
    # Optimizer steps the dead trainer accepted (the last may not have been applied).
    accepted = (await stack.admin.data_plane(stack.job_name(mid.trainer_job_id or "")))[
        "json:optim_step"
    ]

    result = await victim.result()
    ref = await reference.result()
    assert result.phase is Phase.COMPLETED and result.step == 30
    assert result.preemptions == 1 and result.failures == 0
    (recovery,) = result.recoveries
    assert recovery.reason == "preemption" and "preempt" in recovery.message
    # The record says where the trainer really was, not where the last chunk ended.
    assert accepted - 1 <= recovery.at_step <= accepted
    # Resumed from the last checkpoint before the death: at most one interval redone.
    assert recovery.resumed_from_step == (recovery.at_step // 10) * 10
    assert recovery.steps_redone is not None and recovery.steps_redone <= 10
    assert await model_digest(stack, "spot-model") == await model_digest(stack, "ref-model")
    assert ref.preemptions == 0

    # One trainer job, resumed once: nothing leaked, nothing created twice.
    stats = (await stack.admin.stats())["jobs"][stack.job_name(result.trainer_job_id or "")]
    assert stats["creates"] == 1 and stats["resumes"] == 1 and stats["trainersStarted"] == 2
    assert stats["liveTrainer"] is False and stats["state"] == JobState.DELETED.value


async def test_route_race_at_start_is_survived(stack: Stack, faults: PlaneAdmin) -> None:
    await faults.set_faults(routeLagSeconds={"min": 1.0, "max": 5.0})
    handle = await stack.start(stack.spec("race"))
    result = await handle.result()
    assert result.phase is Phase.COMPLETED
    stats = (await stack.admin.stats())["jobs"][stack.job_name(result.trainer_job_id or "")]
    assert stats["route404s"] > 0  # the race really happened
    assert stats["creates"] == 1 and result.failures == 0 and result.preemptions == 0


async def test_trainer_deleted_behind_our_back_fails_fast_without_retries(stack: Stack) -> None:
    handle = await stack.start(stack.spec("orphaned", trainer=SLOW, training={"total_steps": 200}))
    running = await stack.until(handle, lambda s: s.step >= 5 and s.phase is Phase.TRAINING)
    await stack.account.client.delete_job(running.trainer_job_id or "")

    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert failed.value.cause.type == "TrainerDeleted"  # type: ignore[attr-defined]
    status = await stack.status(handle)
    assert status.phase is Phase.FAILED and status.error is not None
    assert status.failures == 0 and status.preemptions == 0 and not status.recoveries

    # No retry budget burned: the chunk that met the deletion (the last) ran one attempt. An
    # earlier chunk may have been retried for reasons of its own before the deletion (the
    # full suite on a loaded machine had a first chunk at attempt 2).
    kinds: dict[int, str] = {}
    chunk_attempts = []
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            kinds[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = e.activity_task_started_event_attributes
            if kinds[started.scheduled_event_id] == "train_chunk":
                chunk_attempts.append(started.attempt)
    assert chunk_attempts and chunk_attempts[-1] == 1, chunk_attempts


async def test_control_plane_5xx_at_30_percent(stack: Stack, faults: PlaneAdmin) -> None:
    # "mixed": half the failures lose the answer of a request that took effect.
    await faults.set_faults(controlPlane5xxRate=0.3, controlPlane5xxMode="mixed", randomSeed=7)
    handle = await stack.start(stack.spec("flaky"))
    result = await handle.result()
    assert result.phase is Phase.COMPLETED and result.model is not None
    stats = await stack.admin.stats()
    job = stats["jobs"][stack.job_name(result.trainer_job_id or "")]
    assert stats["injected5xx"] > 0
    assert job["creates"] == 1 and job["trainersStarted"] == 1 and job["liveTrainer"] is False


async def test_preemption_budget_exhausted_ends_preempted(stack: Stack) -> None:
    spec = stack.spec(
        "budget", trainer=SLOW, training={"total_steps": 200}, policies={"max_preemptions": 1}
    )
    handle = await stack.start(spec)
    first = await stack.until(handle, lambda s: s.step >= 3 and s.phase is Phase.TRAINING)
    await stack.admin.preempt(first.trainer_job_id or "", account=stack.account.id)
    await stack.until(handle, lambda s: s.preemptions == 1 and s.phase is Phase.TRAINING)
    await stack.admin.preempt(first.trainer_job_id or "", account=stack.account.id)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert failed.value.cause.type == "PreemptionBudgetExhausted"  # type: ignore[attr-defined]
    status = await stack.status(handle)
    assert status.phase is Phase.PREEMPTED and status.preemptions == 2
    job = (await stack.admin.stats())["jobs"][stack.job_name(status.trainer_job_id or "")]
    assert job["liveTrainer"] is False and job["state"] == JobState.DELETED.value


async def test_fallback_to_on_demand_after_preemptions(stack: Stack) -> None:
    spec = stack.spec(
        "fallback",
        trainer={**SLOW, "preemptible": True},
        training={"total_steps": 40},
        policies={"fallback_to_on_demand_after": 1},
    )
    handle = await stack.start(spec)
    first = await stack.until(handle, lambda s: s.step >= 12 and s.phase is Phase.TRAINING)
    await stack.admin.preempt(first.trainer_job_id or "", account=stack.account.id)
    result = await handle.result()
    assert result.phase is Phase.COMPLETED
    (recovery,) = result.recoveries
    assert recovery.action == "new-trainer"
    assert result.generation == 1 and result.trainer_job_id != first.trainer_job_id
    new_job = await stack.account.client.get_job(result.trainer_job_id or "")
    assert new_job.preemptible is False
    stats = await stack.admin.stats()
    for trainer in (first.trainer_job_id, result.trainer_job_id):
        assert stats["jobs"][stack.job_name(trainer or "")]["liveTrainer"] is False


async def test_a_bad_dataset_fails_once_with_its_own_words(stack: Stack, tmp_path: Path) -> None:
    # Bad data is deterministic: the job's preflight reads it before any trainer exists,
    # and the job's error says what is wrong.
    data = tmp_path / "broken.jsonl"
    data.write_text('{"text": "fine"}\nthis is not json\n{"text": "also fine"}\n')
    creates = (await stack.admin.stats())["creates"]
    handle = await stack.start(stack.spec("baddata", training={"dataset": str(data)}))
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    status = await stack.status(handle)
    assert status.phase is Phase.FAILED and status.error is not None
    assert status.error.type == "InvalidDataset"
    assert "training.dataset" in status.error.message
    assert "line 2: not JSON" in status.error.message
    assert status.failures == 0 and not status.recoveries
    assert status.trainer_job_id is None
    assert (await stack.admin.stats())["creates"] == creates


async def test_a_platform_restart_is_not_counted_as_a_preemption(stack: Stack) -> None:
    from localplane.jobs import MSG_RESTARTED

    handle = await stack.start(stack.spec("restarted", trainer=SLOW, training={"total_steps": 20}))
    mid = await stack.until(handle, lambda s: s.step >= 5 and s.phase is Phase.TRAINING)
    # What a restarted platform leaves of a trainer that was running (localplane's words).
    await stack.admin.stop(
        mid.trainer_job_id or "", JobState.FAILED.value, MSG_RESTARTED, account=stack.account.id
    )
    result = await handle.result()
    assert result.phase is Phase.COMPLETED
    (recovery,) = result.recoveries
    assert recovery.reason == "platform_restart"
    assert result.preemptions == 0 and result.platform_restarts == 1 and result.failures == 0
