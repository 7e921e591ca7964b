"""Status is the truth: for every way a job can end, what each surface shows (``status``
and ``watch`` through the Python API and the CLI, ``list`` and its ``--phase`` filter,
``cancel``'s "had already ended", and the search attribute and current details the Web UI
shows) agrees with Temporal's own outcome of the run."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle

from shepherd import search_attributes as sa
from shepherd.client import JobEnded, Shepherd
from shepherd.jobs import job_search_attributes
from shepherd.models import JobInput, JobStatus
from shepherd.phases import Phase
from tests.helpers import run_cli
from tests.workflows.conftest import Stack
from workflows.job import TrainingJobWorkflow

#: A trainer slow enough that a job is surely mid-training when the test acts on it.
SLOW = {"extra_args": ["--compute-delay-ms=150"]}


async def _ended(handle: WorkflowHandle[Any, Any]) -> WorkflowExecutionStatus:
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    status = (await handle.describe()).status
    assert status is not None
    return status


async def _details(handle: WorkflowHandle[Any, Any]) -> str:
    """The current details the Web UI shows (the workflow's metadata query)."""
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return meta.current_details


async def _surfaces(sh: Shepherd, handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    """What every surface shows of one job."""
    job = sh.get(handle.id)
    status = await job.status()
    watched = [s async for s in job.watch()]
    listed = {row.workflow_id: row.phase for row in await sh.list(name=status.name)}
    by_phase = [row.workflow_id for row in await sh.list(phase=status.phase, name=status.name)]
    with pytest.raises(JobEnded) as ended:
        await job.cancel()
    return {
        "status": status,
        "watch": watched[-1].phase,
        "list": listed.get(handle.id),
        "listed under its phase": handle.id in by_phase,
        "cancel": ended.value.outcome,
    }


def _agree(shown: dict[str, Any], phase: Phase, error_type: str | None) -> JobStatus:
    status: JobStatus = shown["status"]
    assert status.phase is phase, status
    assert shown["watch"] is phase and shown["list"] == phase.value
    assert shown["listed under its phase"] and shown["cancel"] == phase.value
    if error_type is None:
        assert status.error is None
    else:
        assert status.error is not None and status.error.type == error_type, status.error
    return status


async def test_every_surface_shows_how_the_run_really_ended(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="temporalio.activity")
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    tag = uuid.uuid4().hex[:6]
    creates = (await stack.admin.stats())["creates"]

    completed = await stack.start(stack.spec(f"ok-{tag}"))
    # The platform refuses the trainer at creation (a value only the platform checks).
    refused_spec = stack.spec(f"refused-{tag}", output={"promote": "none"})
    refused_spec.trainer.extra_args = ["--compute-delay-ms=-5"]
    refused = await stack.start(refused_spec)
    slow = {"trainer": SLOW, "training": {"total_steps": 200}, "output": {"promote": "none"}}
    broken = await stack.start(stack.spec(f"broken-{tag}", **slow))
    cancelled = await stack.start(stack.spec(f"cancelled-{tag}", **slow))
    terminated = await stack.start(stack.spec(f"terminated-{tag}", **slow))
    timed_out = await stack.client.start_workflow(
        TrainingJobWorkflow.run,
        JobInput(spec=stack.spec(f"timedout-{tag}", **slow)),
        id=f"job-timedout-{tag}",
        task_queue=stack.task_queue,
        execution_timeout=timedelta(seconds=8),
    )
    stack.handles.append(timed_out)

    await completed.result()
    # Fails before any trainer: the output model exists (the completed job's).
    taken = await stack.start(stack.spec(f"taken-{tag}", output={"model_id": f"ok-{tag}-model"}))
    training = [
        stack.until(h, lambda s: s.phase is Phase.TRAINING and s.step >= 2)
        for h in (broken, cancelled, terminated)
    ]
    mid_broken, _, mid_terminated = await asyncio.gather(*training)
    await stack.account.client.delete_job(mid_broken.trainer_job_id or "")
    await cancelled.cancel()
    await terminated.terminate(reason="operator pulled the plug")
    ends = await asyncio.gather(
        *(_ended(h) for h in (refused, taken, broken, cancelled, terminated, timed_out))
    )
    assert ends == [
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.CANCELED,
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.TIMED_OUT,
    ]

    _agree(await _surfaces(sh, completed), Phase.COMPLETED, None)
    was_refused = _agree(await _surfaces(sh, refused), Phase.FAILED, "InvalidRequest")
    assert "--compute-delay-ms" in (was_refused.error.message if was_refused.error else "")
    assert was_refused.cleanup == "done"
    _agree(await _surfaces(sh, taken), Phase.FAILED, "ModelExists")
    _agree(await _surfaces(sh, broken), Phase.FAILED, "TrainerDeleted")
    assert (await _surfaces(sh, cancelled))["status"].phase is Phase.CANCELLED
    gone = _agree(await _surfaces(sh, terminated), Phase.TERMINATED, "Terminated")
    assert gone.error and "operator pulled the plug" in gone.error.message
    # No cleanup ran: the status says so, and names the trainer left behind.
    assert mid_terminated.trainer_job_id and mid_terminated.trainer_job_id in gone.cleanup
    late = _agree(await _surfaces(sh, timed_out), Phase.FAILED, "WorkflowTimedOut")
    assert late.cleanup.startswith("unknown")

    # The Web UI: the phase attribute and the current details of the runs that ended by
    # their own code (a terminated or timed-out run cannot publish; the UI shows
    # Temporal's own "Terminated" / "Timed out" for those).
    for handle, phase in (
        (completed, Phase.COMPLETED),
        (refused, Phase.FAILED),
        (taken, Phase.FAILED),
        (broken, Phase.FAILED),
        (cancelled, Phase.CANCELLED),
    ):
        attrs = (await handle.describe()).typed_search_attributes
        assert attrs.get(sa.PHASE) == phase.value, handle.id
        assert f"**{phase.value}**" in await _details(handle)

    # Expected outcomes (a taken model id, the trainer of a cancelled or broken job gone)
    # leave no warning with a traceback in the worker's log.
    noisy = [
        r.getMessage()
        for r in caplog.records
        if r.name == "temporalio.activity"
        and r.levelno >= logging.WARNING
        and r.exc_info
        and getattr(r.exc_info[1], "type", None) in ("ModelExists", "TrainerGone", "TrainerLost")
    ]
    assert noisy == []

    # Neither the refused create nor the model check created a trainer.
    created = (await stack.admin.stats())["creates"] - creates
    assert created == 5  # completed, broken, cancelled, terminated, timed out

    # The CLI, on the case: FAILED everywhere, with the cause.
    status = await run_cli("status", refused.id, "--json", stack=stack)
    assert json.loads(status.stdout)["phase"] == "FAILED", status.stderr
    watch = await run_cli("watch", refused.id, stack=stack)
    assert (
        watch.returncode == 1 and "FAILED" in watch.stdout and "--compute-delay-ms" in watch.stdout
    )
    cancel = await run_cli("cancel", refused.id, stack=stack)
    assert cancel.returncode == 1 and "had already ended (FAILED)" in cancel.stderr
    queued = await run_cli("list", "--phase", "QUEUED", "--json", stack=stack)
    assert refused.id not in queued.stdout
    human = await run_cli("status", terminated.id, stack=stack)
    assert "TERMINATED" in human.stdout and "operator pulled the plug" in human.stdout


async def test_a_job_no_worker_takes_still_has_a_status(stack: Stack) -> None:
    # Started beside the submission checks (which refuse such a queue): its status comes
    # from the search attributes, saying why, instead of a query that never returns.
    handle = await stack.client.start_workflow(
        TrainingJobWorkflow.run,
        JobInput(spec=stack.spec("orphan")),
        id=f"job-orphan-{uuid.uuid4().hex[:6]}",
        task_queue=f"nobody-polls-{uuid.uuid4().hex[:6]}",
        search_attributes=job_search_attributes(stack.spec("orphan")),
    )
    stack.handles.append(handle)
    status = await Shepherd(stack.client, task_queue=stack.task_queue).get(handle.id).status()
    assert status.phase is Phase.PENDING and status.name == "orphan"
    assert status.notices and "no worker answered" in status.notices[0]
