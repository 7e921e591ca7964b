"""The job state machine (trainer-api.md §3) on a real plane: resume from every resumable
state, resume refused elsewhere, delete twice, inactivity timeout, preemption and the route
race after a resume."""

from __future__ import annotations

import pytest

from localplane.admin import PlaneAdmin
from shepherd.platform import FailedPrecondition
from shepherd.states import JobState
from tests.helpers import (
    BASE_MODEL,
    Account,
    job_request,
    running_trainer,
    train_steps,
    wait_state,
    warm,
)
from tests.tinker_http import TrainerHTTPError


async def _stop_into(admin: PlaneAdmin, account: Account, job: str, state: JobState) -> str:
    """Put a running job into ``state`` the way the platform would; returns the message."""
    if state is JobState.FAILED:
        await admin.preempt(job, account=account.id)
    elif state is JobState.IDLE:
        raise AssertionError("IDLE is reached by the inactivity timeout, see its own test")
    else:
        await admin.stop(
            job, state.value, f"stopped for the test ({state.short})", account=account.id
        )
    reached = await wait_state(account.client, job, state)
    return reached.status.message


@pytest.mark.parametrize(
    "state", [JobState.FAILED, JobState.CANCELLED, JobState.PAUSED, JobState.COMPLETED]
)
async def test_resume_from_each_resumable_state(
    account: Account, admin: PlaneAdmin, state: JobState
) -> None:
    job = f"resume-{state.short.lower()}"
    await running_trainer(account, job)
    before = await admin.job(job, account=account.id)
    message = await _stop_into(admin, account, job, state)
    assert message
    assert (await admin.job(job, account=account.id))["trainer"] is None

    resumed = await account.client.resume_job(job)
    # The state change is synchronous: the response already shows the new life.
    assert resumed.state in (JobState.PENDING, JobState.CREATING)
    assert (await account.client.get_job(job)).state in (
        JobState.PENDING,
        JobState.CREATING,
        JobState.RUNNING,
    )
    await wait_state(account.client, job, JobState.RUNNING)
    after = await admin.job(job, account=account.id)
    assert after["generation"] == before["generation"] + 1
    assert after["trainer"]["pid"] != before["trainer"]["pid"]
    stats = await admin.job_stats(f"accounts/{account.id}/rlorTrainerJobs/{job}")
    assert stats["resumes"] == 1 and stats["creates"] == 1 and stats["trainersStarted"] == 2
    await account.client.delete_job(job)


async def test_idle_after_inactivity_timeout_then_resume(account: Account) -> None:
    # Health probes do not count as activity; the trainer stops itself and the job turns IDLE.
    trainer = await running_trainer(account, "idle", inactivity_timeout="1s")
    await trainer.api.healthz()
    job = await wait_state(account.client, "idle", JobState.IDLE, JobState.FAILED, timeout=20)
    assert job.state is JobState.IDLE
    assert "inactivity" in job.status.message
    resumed = await account.client.resume_job("idle")
    assert resumed.state in (JobState.PENDING, JobState.CREATING)
    await account.client.delete_job("idle")


async def test_resume_refused_outside_resumable_states(
    account: Account, faults: PlaneAdmin
) -> None:
    await (await running_trainer(account, "busy")).api.aclose()
    with pytest.raises(FailedPrecondition) as running:
        await account.client.resume_job("busy")
    assert running.value.status_code == 400
    assert (
        "JOB_STATE_RUNNING" in running.value.message
        and "resume is only allowed" in running.value.message
    )

    # A job waiting for capacity is not resumable either.
    live = (await faults.stats())["liveTrainers"]
    await faults.set_faults(capacity=live)
    await account.client.create_job("queued", job_request())
    assert (await account.client.get_job("queued")).state is JobState.PENDING
    with pytest.raises(FailedPrecondition):
        await account.client.resume_job("queued")

    # Nor is a deleted one: a tombstone never comes back.
    await account.client.delete_job("busy")
    await wait_state(account.client, "busy", JobState.DELETED)
    with pytest.raises(FailedPrecondition) as deleted:
        await account.client.resume_job("busy")
    assert "JOB_STATE_DELETED" in deleted.value.message
    await account.client.delete_job("queued")


async def test_delete_twice_and_delete_while_pending(account: Account, faults: PlaneAdmin) -> None:
    await running_trainer(account, "twice")
    first = await account.client.delete_job("twice")
    assert first is not None and first.state in (JobState.DELETING, JobState.DELETED)
    second = await account.client.delete_job("twice")
    assert second is not None and second.state in (JobState.DELETING, JobState.DELETED)
    await wait_state(account.client, "twice", JobState.DELETED)
    third = await account.client.delete_job("twice")
    assert third is not None and third.state is JobState.DELETED
    stats = await faults.job_stats(f"accounts/{account.id}/rlorTrainerJobs/twice")
    assert stats["deletes"] == 1 and stats["deleteCalls"] == 3 and stats["liveTrainer"] is False

    live = (await faults.stats())["liveTrainers"]
    await faults.set_faults(capacity=live)
    await account.client.create_job("never-ran", job_request())
    gone = await account.client.delete_job("never-ran")
    assert gone is not None and gone.state is JobState.DELETED
    stats = await faults.job_stats(f"accounts/{account.id}/rlorTrainerJobs/never-ran")
    assert stats.get("trainersStarted", 0) == 0


async def test_preempt_resume_new_route_with_observable_race(
    account: Account, faults: PlaneAdmin
) -> None:
    name = f"accounts/{account.id}/rlorTrainerJobs/spot"
    trainer = await running_trainer(account, "spot")
    await train_steps(trainer, 1, 2)
    old_route = (await faults.job("spot", account=account.id))["route"]

    await faults.preempt("spot", account=account.id)
    # A reclaimed trainer is dead from the moment the preemption is acknowledged: its route
    # is gone at once and answers 404 (trainer-api.md §5), never a reset connection (502).
    assert (await faults.job("spot", account=account.id))["route"] is None
    with pytest.raises(TrainerHTTPError) as dead:
        await trainer.info()
    assert dead.value.status == 404
    failed = await wait_state(account.client, "spot", JobState.FAILED)
    assert "preempt" in failed.status.message
    # The dead trainer's route answers 404 — as does any unknown route.
    with pytest.raises(TrainerHTTPError) as dead:
        await trainer.info()
    assert dead.value.status == 404

    # Every replica learns the new route late: the race must be observable after the resume.
    await faults.set_faults(routeLagSeconds={"min": 0.5, "max": 1.5})
    before_404s = (await faults.job_stats(name)).get("route404s", 0)
    await account.client.resume_job("spot")
    await wait_state(account.client, "spot", JobState.RUNNING)
    with pytest.raises(TrainerHTTPError) as racing:
        await trainer.info()
    assert racing.value.status == 404
    seen = await warm(trainer.api)
    assert seen >= 1
    new_route = (await faults.job("spot", account=account.id))["route"]
    assert new_route["url"] != old_route["url"]
    assert new_route["generation"] == old_route["generation"] + 1
    assert (await faults.job_stats(name))["route404s"] > before_404s

    # The new trainer starts from scratch: the old model is gone (not a 404: the route
    # is there), a new session and model train from the base weights.
    with pytest.raises(TrainerHTTPError) as lost:
        await trainer.info()
    assert lost.value.status == 400 and "not on this trainer" in lost.value.message
    session = await trainer.api.session()
    model = await trainer.api.create_model(session, 0, BASE_MODEL)
    assert (await model.info())["optim_steps"] == 0
    await model.train(1, 1)
    await trainer.api.aclose()
    await account.client.delete_job("spot")


async def test_delete_while_the_trainer_is_spawning_ends_deleted(
    account: Account, admin: PlaneAdmin
) -> None:
    # Regression: the spawn path once wrote back a stale record over DELETING.
    for i in range(3):
        job = f"hasty-{i}"
        await account.client.create_job(job, job_request())
        await account.client.delete_job(job)
        done = await wait_state(account.client, job, JobState.DELETED, JobState.FAILED)
        assert done.state is JobState.DELETED, done.status.message
        stats = await admin.job_stats(f"accounts/{account.id}/rlorTrainerJobs/{job}")
        assert stats["liveTrainer"] is False and stats["deletes"] == 1
