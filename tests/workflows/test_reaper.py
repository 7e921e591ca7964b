"""The reaper: a job terminated from outside (no cleanup ran) has its trainer deleted
within one period of the reaper's Schedule; a live job's trainer, and trainers Shepherd did
not create (one whose id merely looks like Shepherd's among them), are never touched; a
dry run only reports; ``shepherd reaper status`` shows what was deleted."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from shepherd import reaper
from shepherd.client import Shepherd
from shepherd.models import JobInput
from shepherd.phases import Phase
from shepherd.reaper import ReaperInput, ReaperReport
from shepherd.states import JobState
from tests.helpers import job_request, run_cli, wait_state
from tests.workflows.conftest import Stack
from workflows.job import TrainingJobWorkflow

SLOW = {"extra_args": ["--compute-delay-ms=100"]}


async def test_a_terminated_jobs_trainer_is_reaped_and_nothing_else(stack: Stack) -> None:
    terminated = await stack.start(stack.spec("gone", trainer=SLOW, training={"total_steps": 400}))
    live = await stack.start(stack.spec("alive", trainer=SLOW, training={"total_steps": 400}))
    orphan = (await stack.until(terminated, lambda s: s.phase is Phase.TRAINING)).trainer_job_id
    kept = (await stack.until(live, lambda s: s.phase is Phase.TRAINING)).trainer_job_id
    assert orphan and kept
    # Trainers Shepherd did not create: a plain id, and one shaped like Shepherd's whose
    # "workflow" exists but never made it.
    await stack.account.client.create_job("manual-trainer-1", job_request())
    lookalike = f"{live.id}--beef-g0"
    await stack.account.client.create_job(lookalike, job_request())

    await terminated.terminate(reason="an operator's terminate")  # no cleanup runs
    assert (await terminated.describe()).status is WorkflowExecutionStatus.TERMINATED
    await wait_state(stack.account.client, orphan, JobState.RUNNING)  # it still holds GPUs

    # A dry run names it and deletes nothing.
    dry: ReaperReport = await stack.client.execute_workflow(
        reaper.WORKFLOW_TYPE,
        ReaperInput(grace=timedelta(0), dry_run=True),
        id=f"reaper-dry-{terminated.id}",
        task_queue=stack.task_queue,
        result_type=ReaperReport,
    )
    assert [t.trainer_job_id for t in dry.would_delete] == [orphan] and dry.deleted == []
    assert dry.would_delete[0].workflow_id == terminated.id
    assert "TERMINATED" in dry.would_delete[0].reason
    assert dry.kept_live == 1 and dry.kept_foreign == 2
    assert (await stack.account.client.get_job(orphan)).state is JobState.RUNNING

    # The Schedule: its next pass deletes it.
    period = timedelta(seconds=2)
    await reaper.install(stack.client, stack.task_queue, every=period, grace=timedelta(0))
    try:
        await wait_state(
            stack.account.client, orphan, JobState.DELETED, timeout=period.total_seconds() + 15
        )
        # No further passes: at one every 2 s, a busy machine's two CLI calls would otherwise
        # see the deleting pass pushed out of the recent ones shown.
        await stack.client.get_schedule_handle(reaper.SCHEDULE_ID).pause(note="checked")
        shown = await run_cli("reaper", "status", "--json", stack=stack)
        assert shown.returncode == 0, shown.stderr
        passes = [report for _, report in json.loads(shown.stdout)["recent"] if report]
        deleted = [t["trainer_job_id"] for report in passes for t in report["deleted"]]
        assert deleted == [orphan]
        text = await run_cli("reaper", "status", stack=stack)
        assert orphan in text.stdout and "TERMINATED" in text.stdout
    finally:
        await stack.client.get_schedule_handle(reaper.SCHEDULE_ID).delete()
    await asyncio.sleep(0.5)
    for survivor in (kept, "manual-trainer-1", lookalike):
        job = await stack.account.client.get_job(survivor)
        assert job.state is JobState.RUNNING, (survivor, job.state)
    assert (await stack.admin.job_stats(stack.job_name(orphan)))["creates"] == 1


async def _reap_now(stack: Stack, tag: str, *, dry_run: bool = False) -> ReaperReport:
    """One pass now, counting every closed job as over (grace 0)."""
    report: ReaperReport = await stack.client.execute_workflow(
        reaper.WORKFLOW_TYPE,
        ReaperInput(grace=timedelta(0), dry_run=dry_run),
        id=f"reaper-{tag}-{uuid.uuid4().hex[:6]}",
        task_queue=stack.task_queue,
        result_type=ReaperReport,
    )
    return report


async def test_only_ids_shepherd_gave_its_trainers_are_reaped(stack: Stack) -> None:
    """A trainer made by hand whose id starts like a terminated job's trainers (its
    workflow id, its prefix, even its run's digest with a generation the job never
    reached) is not Shepherd's and survives a pass; the job's own trainer does not."""
    slow = {"trainer": SLOW, "training": {"total_steps": 400}}
    owned = await stack.start(stack.spec("owned", **slow))
    # A workflow id that does not fit the platform's id rule (upper case, as a schedule's
    # run has): its trainers are ``<name>-<6 hex>-g<n>``, found through visibility.
    unowned: WorkflowHandle[Any, Any] = await stack.client.start_workflow(
        TrainingJobWorkflow.run,
        JobInput(spec=stack.spec("unowned", **slow)),
        id=f"job-Unowned-{uuid.uuid4().hex[:8]}",
        task_queue=stack.task_queue,
    )
    stack.handles.append(unowned)
    orphans = [
        (await stack.until(h, lambda s: s.phase is Phase.TRAINING)).trainer_job_id or ""
        for h in (owned, unowned)
    ]
    assert orphans[0].startswith(f"{owned.id}--") and orphans[0].endswith("-g0")
    assert orphans[1].startswith("unowned-") and orphans[1].endswith("-g0")
    hand_made = [
        f"{owned.id}-mine",
        f"{owned.id}--handmade",
        orphans[0].removesuffix("-g0") + "-g5",  # its run's digest, a generation never made
        orphans[1].removesuffix("-g0") + "-g1",  # its recorded prefix, the next generation
    ]
    for trainer in hand_made:
        await stack.account.client.create_job(trainer, job_request())
    for handle in (owned, unowned):
        await handle.terminate(reason="an operator's terminate")  # no cleanup runs

    dry = await _reap_now(stack, "dry", dry_run=True)
    assert sorted(t.trainer_job_id for t in dry.would_delete) == sorted(orphans)
    assert dry.kept_foreign == len(hand_made)

    done = await _reap_now(stack, "pass")
    assert sorted(t.trainer_job_id for t in done.deleted) == sorted(orphans), done
    assert {t.workflow_id for t in done.deleted} == {owned.id, unowned.id}
    for trainer in hand_made:
        job = await stack.account.client.get_job(trainer)
        assert job.state not in (JobState.DELETED, JobState.DELETING), (trainer, job.state)


async def test_the_grace_is_shown_and_a_manual_pass_uses_the_installed_one(stack: Stack) -> None:
    """``reaper status`` shows the installed reaper's grace; ``reaper run`` without
    ``--grace`` uses that grace (not another default) and says which it used."""
    await reaper.install(
        stack.client, stack.task_queue, every=timedelta(hours=1), grace=timedelta(minutes=7)
    )
    try:
        shown = await run_cli("reaper", "status", stack=stack)
        assert shown.returncode == 0, shown.stderr
        assert "every 1h" in shown.stdout and "grace 7m" in shown.stdout
        data = json.loads((await run_cli("reaper", "status", "--json", stack=stack)).stdout)
        assert data["grace_s"] == 420
        manual = await run_cli("reaper", "run", "--dry-run", stack=stack)
        assert manual.returncode == 0, manual.stderr
        assert "grace 7m (the installed reaper's)" in manual.stdout
        report = json.loads(
            (await run_cli("reaper", "run", "--dry-run", "--json", stack=stack)).stdout
        )
        assert report["grace_s"] == 420
        given = await run_cli("reaper", "run", "--dry-run", "--grace", "30s", stack=stack)
        assert "grace 30s (--grace)" in given.stdout
    finally:
        await stack.client.get_schedule_handle(reaper.SCHEDULE_ID).delete()
    alone = await run_cli("reaper", "run", "--dry-run", stack=stack)
    default = reaper.duration_text(reaper.REAPER_GRACE.total_seconds())
    assert f"grace {default} (the default: no reaper is installed)" in alone.stdout


async def test_status_says_the_reaper_deleted_a_terminated_jobs_trainer(stack: Stack) -> None:
    """Once a pass deleted it, a terminated job's status no longer says its trainer is up
    (the last platform state the job saw) nor that it may still be live: it says the
    reaper deleted it, when, and which pass."""
    handle = await stack.start(stack.spec("reaped", trainer=SLOW, training={"total_steps": 400}))
    trainer = (
        await stack.until(
            handle,
            lambda s: s.phase is Phase.TRAINING and s.platform_state == JobState.RUNNING.value,
        )
    ).trainer_job_id
    assert trainer
    await handle.terminate(reason="an operator's terminate")
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    before = await sh.get(handle.id).status()
    assert before.phase is Phase.TERMINATED and "may still be live" in before.cleanup
    # What the job last saw of its trainer is said to be that, not the trainer's state now.
    assert "last seen before the job ended" in before.platform_message

    done = await _reap_now(stack, "status")
    assert [t.trainer_job_id for t in done.deleted] == [trainer]
    await wait_state(stack.account.client, trainer, JobState.DELETED)
    async with asyncio.timeout(10):  # until visibility lists the pass as closed
        while "reaper" not in (after := await sh.get(handle.id).status()).cleanup:
            await asyncio.sleep(0.2)
    assert after.phase is Phase.TERMINATED
    assert after.platform_state == JobState.DELETED.value
    assert "deleted by the reaper" in after.platform_message
    assert after.cleanup.startswith(f"done by the reaper: trainer {trainer} deleted at")
    assert "workflow TERMINATED" in after.cleanup and "reaper-status-" in after.cleanup

    shown = await run_cli("status", handle.id, stack=stack)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "JOB_STATE_DELETED deleted by the reaper" in text
    assert "trainer is up" not in text and "may still be live" not in text
    assert "done by the reaper" in text
    data = json.loads((await run_cli("status", handle.id, "--json", stack=stack)).stdout)
    assert data["platform_state"] == JobState.DELETED.value
    assert data["cleanup"].startswith("done by the reaper")
