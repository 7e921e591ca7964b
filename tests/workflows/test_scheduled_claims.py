"""A schedule's run claims its filled-in output model id when it starts (real Temporal and
localplane): a run whose template fills to an id another live job holds fails at once,
naming it, with no trainer created; of two runs starting together with the same id, one
wins; and a submission of a live run's id is refused like any claimed id.

Runs are started by backfills of a paused schedule (two per day from ``0 3,4 * * *``), so
they start at once, overlapping as ``allow_all`` lets them."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowExecutionStatus

from shepherd import search_attributes as sa
from shepherd.client import Shepherd, SubmissionRefused
from shepherd.models import JobStatus
from shepherd.phases import Phase
from tests.workflows.conftest import Stack

#: A trainer slow enough that a job is surely live while the test looks at it.
SLOW = {"extra_args": ["--compute-delay-ms=200"]}
NOV_20 = datetime(2026, 11, 20, tzinfo=UTC)


async def _creates(stack: Stack) -> int:
    """Trainers the plane has created for this test's account."""
    prefix = f"accounts/{stack.account.id}/"
    jobs = (await stack.admin.stats())["jobs"]
    return sum(job["creates"] for name, job in jobs.items() if name.startswith(prefix))


async def _runs(stack: Stack, schedule: str, count: int) -> list[str]:
    async with asyncio.timeout(30):
        while True:
            query = f'{sa.SCHEDULE.name} = "{schedule}"'
            ids = [w.id async for w in stack.client.list_workflows(query)]
            if len(ids) >= count:
                for wid in ids:
                    stack.handles.append(stack.client.get_workflow_handle(wid))
                return ids
            await asyncio.sleep(0.2)


async def _refused(stack: Stack, workflow_id: str) -> JobStatus:
    """The final status of a run that must have failed on its model claim."""
    handle = stack.client.get_workflow_handle(workflow_id)
    async with asyncio.timeout(30):
        while (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
            await asyncio.sleep(0.2)
    status = await stack.status(handle)
    assert status.phase is Phase.FAILED and status.error is not None, status
    assert status.error.type == "ModelClaimed", status.error
    assert status.trainer_job_id is None  # refused before anything was provisioned
    return status


async def _cancel(sh: Shepherd, workflow_id: str) -> None:
    job = sh.get(workflow_id)
    await job.cancel()
    assert (await job.wait(raise_on_failure=False)).phase is Phase.CANCELLED


async def test_scheduled_runs_claim_their_filled_in_model_id(stack: Stack) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    tag = uuid.uuid4().hex[:6]
    model = f"sc{tag}-202611"  # what the template fills to for any day of November 2026
    long = {"trainer": SLOW, "training": {"total_steps": 300}}

    # A manual job holds the id.
    holder = await sh.submit(stack.spec("holder", **long, output={"model_id": model}))
    stack.handles.append(stack.client.get_workflow_handle(holder.id))
    await stack.until(stack.handles[-1], lambda s: s.phase is Phase.TRAINING)
    assert await _creates(stack) == 1

    name = f"claims-{tag}"
    spec = stack.spec("sclaim", **long, output={"model_id": f"sc{tag}-{{scheduled_time:%Y%m}}"})
    await sh.schedules.create(name, spec, cron=["0 3,4 * * *"], paused=True)
    try:
        # Two runs whose id the holder claims: both fail at once, naming the field, the id
        # and the holder, and no trainer is created for them.
        await sh.schedules.backfill(name, NOV_20, NOV_20 + timedelta(days=1))
        for wid in await _runs(stack, name, 2):
            error = (await _refused(stack, wid)).error
            assert error is not None
            assert "output.model_id" in error.message and model in error.message
            assert holder.id in error.message
        assert await _creates(stack) == 1

        # The holder ends: of the next two runs, started together, exactly one claims it.
        await _cancel(sh, holder.id)
        await sh.schedules.backfill(name, NOV_20 + timedelta(days=1), NOV_20 + timedelta(days=2))
        second = [w for w in await _runs(stack, name, 4) if "2026-11-21" in w]
        assert len(second) == 2, second
        async with asyncio.timeout(30):
            while True:
                statuses = [await stack.status(stack.client.get_workflow_handle(w)) for w in second]
                if any(s.phase.is_terminal() for s in statuses):
                    break
                await asyncio.sleep(0.2)
        (loser,) = [w for w, s in zip(second, statuses, strict=True) if s.phase.is_terminal()]
        (winner,) = [w for w in second if w != loser]
        error = (await _refused(stack, loser)).error
        assert error is not None and winner in error.message and model in error.message
        await stack.until(
            stack.client.get_workflow_handle(winner), lambda s: s.phase is Phase.TRAINING
        )
        assert await _creates(stack) == 2

        # The live run's claim refuses a submission of its id, as any claim does.
        with pytest.raises(SubmissionRefused) as refused:
            await sh.submit(stack.spec("late", output={"model_id": model}))
        assert refused.value.field == "output.model_id" and winner in str(refused.value)
        await _cancel(sh, winner)
    finally:
        await sh.schedules.delete(name)
