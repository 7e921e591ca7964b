"""Cancelling a job in every phase where it can be caught, including mid-recovery: the
trainer is deleted, the checkpoints are kept and the job ends CANCELLED — proven by the
plane's stats and its checkpoint listing, not by the workflow's word alone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError

from localplane.admin import PlaneAdmin
from shepherd.models import JobStatus, PauseRequest, PauseResult
from shepherd.phases import Phase
from shepherd.states import JobState
from tests.helpers import wait_state
from tests.workflows.conftest import Stack

#: 150 ms per step: a 10-step chunk lasts ~1.5 s, ample time to cancel inside it.
SLOW = {"extra_args": ["--compute-delay-ms=150"]}
#: Long enough that the job is still in the phase when the cancel lands.
STUCK_S = 20.0


async def live_trainers(stack: Stack) -> int:
    return int((await stack.admin.stats())["liveTrainers"])


async def cancel_and_expect_cancelled(stack: Stack, handle: WorkflowHandle[Any, Any]) -> JobStatus:
    """Cancel the job and check it ends CANCELLED, with its cleanup done."""
    await handle.cancel()
    # Every wait in the workflow must give way to the cancel at once, not at its next poll.
    async with asyncio.timeout(30):
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert isinstance(failed.value.cause, CancelledError)
    assert (await handle.describe()).status is WorkflowExecutionStatus.CANCELED
    status = await stack.status(handle)
    assert status.phase is Phase.CANCELLED
    assert status.cleanup == "done" and status.error is None
    return status


async def assert_trainers_released(stack: Stack, live_before: int) -> dict[str, dict[str, Any]]:
    """Every trainer job of the (fresh) account is DELETED, was created once and holds no
    trainer; returns the plane's per-job stats, by trainer job id."""
    trainer_ids = [job.job_id for job in (await stack.account.client.list_jobs()).rlor_trainer_jobs]
    assert trainer_ids, "the job never created a trainer"
    for trainer_id in trainer_ids:
        # A trainer that was running passes through DELETING while its process exits.
        await wait_state(stack.account.client, trainer_id, JobState.DELETED)
    stats = await stack.admin.stats()
    jobs = {trainer_id: stats["jobs"][stack.job_name(trainer_id)] for trainer_id in trainer_ids}
    for job in jobs.values():
        assert job["liveTrainer"] is False and job["creates"] == 1
    # Trainers of earlier tests may still be exiting (never starting): this test adds none.
    assert stats["liveTrainers"] <= live_before
    return jobs


async def assert_checkpoints_kept(stack: Stack, status: JobStatus) -> None:
    assert status.checkpoints, "the job had saved no checkpoint before the cancel"
    for record in status.checkpoints:
        listed = await stack.account.client.list_checkpoints(record.trainer_job_id)
        assert record.name in {c.name for c in listed.checkpoints}


async def until_job_stats(
    stack: Stack, trainer_id: str, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Ask the plane's stats until ``check`` holds for the trainer job (a test-side wait)."""
    async with asyncio.timeout(30):
        while True:
            job = await stack.admin.job_stats(stack.job_name(trainer_id))
            if check(job):
                return job
            await asyncio.sleep(0.1)


async def training_past_first_checkpoint(
    stack: Stack, name: str
) -> tuple[WorkflowHandle[Any, Any], JobStatus]:
    spec = stack.spec(name, trainer=SLOW, training={"total_steps": 200})
    handle = await stack.start(spec)
    status = await stack.until(handle, lambda s: s.phase is Phase.TRAINING and bool(s.checkpoints))
    return handle, status


# ------------------------------------------------------------------ before training


async def test_cancel_while_queued_for_capacity(stack: Stack, faults: PlaneAdmin) -> None:
    live_before = await live_trainers(stack)
    await faults.set_faults(capacity=0)  # no slot for anyone: the job waits in PENDING
    handle = await stack.start(stack.spec("queued"))
    queued = await stack.until(
        handle, lambda s: s.phase is Phase.QUEUED and s.platform_state == JobState.PENDING.value
    )
    assert queued.phase is Phase.QUEUED

    status = await cancel_and_expect_cancelled(stack, handle)
    jobs = await assert_trainers_released(stack, live_before)
    assert jobs[status.trainer_job_id or ""].get("trainersStarted", 0) == 0  # it never got a slot
    assert status.checkpoints == []


@pytest.mark.no_events
async def test_cancel_is_not_held_up_by_a_long_poll_interval(
    stack: Stack, faults: PlaneAdmin
) -> None:
    # The placement poll retries every 10 minutes and no platform event wakes the
    # workflow: only the cancel itself can end the wait within the 30 s allowed.
    live_before = await live_trainers(stack)
    await faults.set_faults(capacity=0)
    handle = await stack.start(stack.spec("patient", policies={"poll_interval": "10m"}))
    await stack.until(
        handle, lambda s: s.phase is Phase.QUEUED and s.platform_state == JobState.PENDING.value
    )

    await cancel_and_expect_cancelled(stack, handle)
    await assert_trainers_released(stack, live_before)


async def test_cancel_while_scheduling(stack: Stack, faults: PlaneAdmin) -> None:
    live_before = await live_trainers(stack)
    # The slot is granted at once; the trainer then boots slowly.
    await faults.set_faults(bootDelaySeconds=STUCK_S)
    handle = await stack.start(stack.spec("scheduling"))
    scheduling = await stack.until(handle, lambda s: s.phase is Phase.SCHEDULING)
    assert scheduling.platform_state == JobState.CREATING.value

    status = await cancel_and_expect_cancelled(stack, handle)
    jobs = await assert_trainers_released(stack, live_before)
    assert jobs[status.trainer_job_id or ""]["deletes"] == 1


async def test_cancel_while_preparing(stack: Stack, faults: PlaneAdmin) -> None:
    live_before = await live_trainers(stack)
    # RUNNING, but no gateway replica knows the route yet: the warm-up keeps seeing 404s.
    await faults.set_faults(routeLagSeconds={"min": STUCK_S, "max": STUCK_S})
    handle = await stack.start(stack.spec("preparing"))
    preparing = await stack.until(handle, lambda s: s.phase is Phase.PREPARING)
    assert preparing.platform_state == JobState.RUNNING.value
    await until_job_stats(
        stack, preparing.trainer_job_id or "", lambda j: j.get("route404s", 0) > 0
    )

    status = await cancel_and_expect_cancelled(stack, handle)
    jobs = await assert_trainers_released(stack, live_before)
    assert jobs[status.trainer_job_id or ""]["deletes"] == 1


# ------------------------------------------------------------ training and recovery


async def test_cancel_while_training_keeps_checkpoints(stack: Stack) -> None:
    live_before = await live_trainers(stack)
    handle, training = await training_past_first_checkpoint(stack, "training")
    assert training.phase is Phase.TRAINING

    status = await cancel_and_expect_cancelled(stack, handle)
    assert status.step < status.total_steps
    await assert_checkpoints_kept(stack, status)
    jobs = await assert_trainers_released(stack, live_before)
    assert jobs[status.trainer_job_id or ""]["deletes"] == 1


async def test_cancel_mid_recovery_while_the_death_settles(
    stack: Stack, faults: PlaneAdmin
) -> None:
    live_before = await live_trainers(stack)
    # After the kill the platform shows CREATING for 30 s before FAILED: nothing to resume yet.
    await faults.set_faults(deathSettleSeconds=30.0)
    handle, training = await training_past_first_checkpoint(stack, "settling")
    await stack.admin.preempt(training.trainer_job_id or "", account=stack.account.id)
    recovering = await stack.until(handle, lambda s: s.phase is Phase.RECOVERING)
    assert recovering.phase is Phase.RECOVERING and len(recovering.recoveries) == 1
    assert recovering.platform_state == JobState.CREATING.value  # still settling

    status = await cancel_and_expect_cancelled(stack, handle)
    await assert_checkpoints_kept(stack, status)
    jobs = await assert_trainers_released(stack, live_before)
    job = jobs[status.trainer_job_id or ""]
    assert job["preemptions"] == 1 and job.get("resumes", 0) == 0  # cancelled before any resume


@pytest.mark.parametrize(
    ("fault", "stage", "platform_state"),
    [
        # The resumed job waits for a slot: the workflow is RECOVERING, QUEUED for it.
        ({"capacity": 0}, Phase.QUEUED, JobState.PENDING),
        # The resumed job got a slot and boots slowly: RECOVERING, SCHEDULING it.
        ({"bootDelaySeconds": STUCK_S}, Phase.SCHEDULING, JobState.CREATING),
    ],
    ids=["resumed-waiting-for-a-slot", "resumed-booting"],
)
async def test_cancel_after_the_resume(
    stack: Stack, faults: PlaneAdmin, fault: dict[str, Any], stage: Phase, platform_state: JobState
) -> None:
    live_before = await live_trainers(stack)
    handle, training = await training_past_first_checkpoint(stack, "resumed")
    # Set before the kill: the running trainer keeps its slot and its boot is long over.
    await faults.set_faults(fault)
    await stack.admin.preempt(training.trainer_job_id or "", account=stack.account.id)
    caught = await stack.until(
        handle,
        lambda s: (
            bool(s.recoveries) and s.stage is stage and s.platform_state == platform_state.value
        ),
    )
    # The whole way back is RECOVERING (issue 9), its step shown beside it.
    assert caught.phase is Phase.RECOVERING
    assert caught.phase_label == f"RECOVERING ({stage.value})"
    await until_job_stats(stack, caught.trainer_job_id or "", lambda j: j["resumes"] == 1)

    status = await cancel_and_expect_cancelled(stack, handle)
    await assert_checkpoints_kept(stack, status)
    jobs = await assert_trainers_released(stack, live_before)
    job = jobs[status.trainer_job_id or ""]
    assert job["preemptions"] == 1 and job["resumes"] == 1 and job["deletes"] == 1


async def test_cancel_while_paused(stack: Stack) -> None:
    live_before = await live_trainers(stack)
    handle, _ = await training_past_first_checkpoint(stack, "paused")
    paused = await handle.execute_update("request_pause", PauseRequest(), result_type=PauseResult)
    assert paused.checkpoint is not None
    status = await stack.until(handle, lambda s: s.phase is Phase.PAUSED)
    assert status.phase is Phase.PAUSED
    # No GPU is held while paused: the trainer was deleted at the pause.
    job = await stack.account.client.get_job(status.trainer_job_id or "")
    assert job.state in (JobState.DELETING, JobState.DELETED)

    status = await cancel_and_expect_cancelled(stack, handle)
    assert status.paused_checkpoint == paused.checkpoint
    assert paused.checkpoint in {c.name for c in status.checkpoints}
    await assert_checkpoints_kept(stack, status)
    jobs = await assert_trainers_released(stack, live_before)
    assert jobs[status.trainer_job_id or ""]["deletes"] == 1  # at the pause; nothing left to cancel
