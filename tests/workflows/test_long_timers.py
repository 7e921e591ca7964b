"""Long timers on the time-skipping test server: a job's ``scheduling.max_runtime`` of six
hours, hit while it waits for a capacity slot, ends the job and deletes its trainer — in
seconds of wall time. The platform is the real localplane (with no free slot)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd import binaries
from shepherd.models import JobInput, JobStatus
from shepherd.phases import Phase
from shepherd.spec import validate_spec
from shepherd.states import JobState
from tests.helpers import Account, wait_state
from tests.replay import replay
from tests.workflows.conftest import make_registry, worker_for
from workflows.job import TrainingJobWorkflow


@pytest.fixture
async def skipping() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=binaries.temporal_test_server(),
        data_converter=pydantic_data_converter,
    )
    async with env:
        yield env


async def test_max_runtime_ends_a_job_stuck_in_the_queue(
    skipping: WorkflowEnvironment, plane: PlaneProcess, faults: PlaneAdmin, account: Account
) -> None:
    await faults.set_faults(capacity=0)
    spec = validate_spec(
        {
            "name": "stuck",
            "trainer": {"base_model": "accounts/fireworks/models/qwen3-8b"},
            "training": {"total_steps": 10},
            "checkpoint": {"every_steps": 5},
            "output": {"promote": "none"},
            "scheduling": {"max_runtime": "6h"},
        }
    )
    queue = f"skip-{uuid.uuid4().hex[:8]}"
    registry = make_registry(plane, account.api_key)
    async with worker_for(skipping.client, queue, registry):
        handle = await skipping.client.start_workflow(
            # The test server can neither register nor query search attributes.
            TrainingJobWorkflow.run,
            JobInput(spec=spec, search_attributes=False),
            id=f"job-stuck-{uuid.uuid4().hex[:6]}",
            task_queue=queue,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        status = await handle.query("status", result_type=JobStatus)
        # No visibility on this server: its one workflow is replayed by its handle.
        assert await replay([await handle.fetch_history()], "time-skipping") == 1
    await registry.aclose()
    assert failed.value.cause.type == "MaxRuntimeExceeded"  # type: ignore[attr-defined]
    assert status.phase is Phase.FAILED and status.cleanup == "done"
    assert status.timings.get("QUEUED", 0) >= 6 * 3600 - 60  # six hours, skipped
    job = await wait_state(account.client, status.trainer_job_id or "", JobState.DELETED)
    assert job.state is JobState.DELETED
