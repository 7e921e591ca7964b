"""Recurring experiments as Temporal Schedules on the real dev server.

The time-skipping test server does not implement Schedules (CreateSchedule is
"unimplemented" there), so long waits are avoided the way Temporal offers: ``backfill``
runs the actions a daily cron would have taken over past days, right now."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from temporalio.client import WorkflowExecutionStatus

from shepherd import search_attributes as sa
from shepherd.client import Shepherd
from shepherd.phases import Phase
from shepherd.spec import SpecError
from tests.helpers import run_cli
from tests.workflows.conftest import Stack


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def runs_of(stack: Stack, name: str) -> list[str]:
    return [w.id async for w in stack.client.list_workflows(f'{sa.SCHEDULE.name} = "{name}"')]


async def test_interval_schedule_runs_ordinary_labelled_jobs(stack: Stack) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    name = _name("every")
    spec = stack.spec(
        "every",
        training={"total_steps": 10},
        checkpoint={"every_steps": 5},
        output={"model_id": "every-{scheduled_time:%H%M%S}"},
    )
    info = await sh.schedules.create(name, spec, every=timedelta(seconds=3), overlap="allow_all")
    try:
        assert info.next_runs and not info.paused
        async with asyncio.timeout(60):
            while True:
                described = await sh.schedules.describe(name)
                done = [r for r in described.recent_runs if r.outcome == Phase.COMPLETED.value]
                if len(done) >= 2:
                    break
                await asyncio.sleep(0.5)
    finally:
        await sh.schedules.delete(name)
    for run in done[:2]:
        job = sh.get(run.workflow_id)
        status = await job.status()
        assert status.phase is Phase.COMPLETED
        assert status.labels["schedule"] == name
        desc = await job.describe()
        assert desc.workflow_type == "TrainingJob"
        assert desc.typed_search_attributes.get(sa.SCHEDULE) == name
        # The template was filled with this run's own scheduled time.
        assert status.model is not None
        assert status.model.name.endswith("every-" + run.scheduled_at.strftime("%H%M%S"))  # type: ignore[union-attr]


async def test_pause_trigger_backfill_and_describe(stack: Stack) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    name = _name("nightly")
    spec = stack.spec(
        "nightly",
        training={"total_steps": 10},
        checkpoint={"every_steps": 5},
        output={"model_id": "nightly-{scheduled_time:%Y%m%d}"},
    )
    info = await sh.schedules.create(
        name, spec, cron=["0 3 * * *"], paused=True, note="created by the test"
    )
    try:
        assert info.paused and info.note == "created by the test"
        assert info.next_runs and all(t.hour == 3 and t.minute == 0 for t in info.next_runs)

        # Three nights that already passed, run now (a backfill runs even while paused).
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        await sh.schedules.backfill(name, today - timedelta(days=3), today)
        async with asyncio.timeout(90):
            while len(await runs_of(stack, name)) < 3:
                await asyncio.sleep(0.5)
        ids = await runs_of(stack, name)
        results = [await sh.get(wid).wait() for wid in ids]
        models = sorted(r.model.name.rsplit("/", 1)[-1] for r in results if r.model)
        expected = sorted(
            f"nightly-{(today - timedelta(days=d)).strftime('%Y%m%d')}" for d in (1, 2, 3)
        )
        assert models == expected

        await sh.schedules.unpause(name, note="back on")
        assert not (await sh.schedules.describe(name)).paused
        await sh.schedules.pause(name, note="off again")
        described = await sh.schedules.describe(name)
        assert described.paused and described.note == "off again"

        # A manual trigger adds one more run; its template takes the trigger time.
        await sh.schedules.trigger(name, overlap="allow_all")
        async with asyncio.timeout(60):
            while len(await runs_of(stack, name)) < 4:
                await asyncio.sleep(0.5)
        listed = [s.name for s in await sh.schedules.list()]
        assert name in listed
    finally:
        await sh.schedules.delete(name)
    with pytest.raises(KeyError):
        await sh.schedules.describe(name)
    for wid in await runs_of(stack, name):
        handle = stack.client.get_workflow_handle(wid)
        stack.handles.append(handle)
        d = await handle.describe()
        assert d.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.RUNNING)


async def test_a_broken_template_never_becomes_a_schedule(stack: Stack) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    name = _name("broken")
    spec = stack.spec("broken", output={"model_id": "Broken-{scheduled_time:%Y}"})
    with pytest.raises(SpecError) as refused:
        await sh.schedules.create(name, spec, every=timedelta(minutes=5))
    assert [p.field for p in refused.value.problems] == ["output.model_id"]
    with pytest.raises(KeyError):
        await sh.schedules.describe(name)


async def test_what_a_schedule_refuses_and_what_a_trigger_did(stack: Stack, tmp_path: Path) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    name = _name("said")
    fixed = stack.spec("fixed", output={"model_id": "always-the-same"})
    with pytest.raises(SpecError) as same:
        await sh.schedules.create(name, fixed, every=timedelta(hours=1))
    assert same.value.problems[0].field == "output.model_id"
    assert "{scheduled_time" in same.value.problems[0].rule
    slow = stack.spec(
        "said",
        trainer={"extra_args": ["--compute-delay-ms=300"]},
        training={"total_steps": 40},
        output={"promote": "none"},
    )
    with pytest.raises(SpecError, match="not both"):
        await sh.schedules.create(name, slow, cron=["0 3 * * *"], every=timedelta(hours=1))
    # A spec file and a single cron string, as from the Python API (an AttributeError once).
    path = tmp_path / "said.yaml"
    path.write_text(yaml.safe_dump(slow.model_dump(mode="json", exclude_defaults=True)))
    info = await sh.schedules.create(name, str(path), cron="0 3 * * *", paused=True)
    try:
        assert info.paused
        first = await sh.schedules.trigger(name)
        assert first.outcome == "started" and first.workflow_id
        stack.handles.append(stack.client.get_workflow_handle(first.workflow_id))
        # The schedule's own policy (skip) drops a trigger while that run is live.
        second = await sh.schedules.trigger(name)
        assert second.outcome == "skipped" and first.workflow_id in second.detail, second
        done = await run_cli("schedule", "trigger", name, stack=stack)
        assert done.returncode == 1 and "skipped" in done.stdout, done.stdout + done.stderr
    finally:
        await sh.schedules.delete(name)
