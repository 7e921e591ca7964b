"""The work gets ready while the trainer boots (workflows/trainer.py, ``come_up``): the model
opens (a loop) or the route warms up (a program) from the placement on, beside the wait for
RUNNING, so the RUNNING event's delivery and a workflow task are off the way to the first
step. The boot's 404s are not route races; a trainer that dies while it boots is recovered
as before. (A pause or a cancel while it boots: test_await_points, "wait for RUNNING".)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from localplane.admin import PlaneAdmin
from shepherd.phases import Phase
from shepherd.states import JobState
from tests.workflows.conftest import Stack
from tests.workflows.test_programs import sft_spec

BOOT_S = 2.0


async def scheduled(handle: WorkflowHandle, activity: str) -> bool:
    async for e in handle.fetch_history_events():
        if e.activity_task_scheduled_event_attributes.activity_type.name == activity:
            return True
    return False


async def ready_before_running(handle: WorkflowHandle, activity: str) -> list[bool]:
    """For each trainer the job had: whether ``activity`` was scheduled before the first
    RUNNING event of that trainer reached the workflow."""
    order: list[bool] = []
    scheduled = False
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            if name == "create_trainer" or name == "resume_trainer":
                scheduled = False
            elif name == activity:
                scheduled = True
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            signal = e.workflow_execution_signaled_event_attributes
            if signal.signal_name != "platform_event":
                continue
            if json.loads(signal.input.payloads[0].data)["state"] == JobState.RUNNING.value:
                order.append(scheduled)
                scheduled = True  # (later RUNNING events of the same trainer: no new start)
    return order


@pytest.mark.parametrize("kind", ["loop", "program"])
async def test_the_work_gets_ready_while_the_trainer_boots(
    stack: Stack, faults: PlaneAdmin, programs_env: Path, kind: str
) -> None:
    await faults.set_faults(bootDelaySeconds=BOOT_S, routeLagSeconds={"min": 0.0, "max": 0.0})
    loop = kind == "loop"
    spec = stack.spec("boots") if loop else sft_spec(stack, "boots-program")
    handle = await stack.start(spec)
    final = await handle.result()
    assert final.phase is Phase.COMPLETED
    assert await ready_before_running(handle, "open_model" if loop else "warm_up") == [True]
    # The boot's 404s happened (the work was trying while it booted), and are no race.
    stats = (await stack.admin.stats())["jobs"][stack.job_name(final.trainer_job_id or "")]
    assert stats["route404s"] > 0 and final.route_races == 0, (stats["route404s"], final)
    assert final.timings.get(Phase.SCHEDULING.value, 0.0) >= BOOT_S * 0.9  # (it booted)


async def test_a_trainer_that_dies_while_its_model_opens_is_recovered(
    stack: Stack, faults: PlaneAdmin
) -> None:
    await faults.set_faults(bootDelaySeconds=30.0)
    handle = await stack.start(stack.spec("dies-booting", training={"total_steps": 12}))
    booting = await stack.until(handle, lambda s: s.phase is Phase.SCHEDULING)
    trainer = booting.trainer_job_id or ""
    await faults.set_faults(bootDelaySeconds=0.0)  # (the next boot)
    # Its model is already being opened when the node goes.
    async with asyncio.timeout(30):
        while not await scheduled(handle, "open_model"):
            await asyncio.sleep(0.1)
    await faults.stop(
        trainer, JobState.FAILED.value, "node lost while booting", account=stack.account.id
    )
    final = await handle.result()
    assert final.phase is Phase.COMPLETED and final.step == 12
    assert len(final.recoveries) == 1 and final.failures == 1
    stats = await stack.admin.stats()
    assert not any(j.get("liveTrainer") for j in stats["jobs"].values())
