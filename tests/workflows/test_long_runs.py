"""Jobs that outlive Temporal's history limit, time-compressed (issue 30).

A Temporal dev server of this module's own has its history limits scaled down: a warning at
150 events, the workflow *terminated* at 250 (the defaults are 10,240 and 51,200), and the jobs
continue-as-new at 100 (``policies.max_history_events``). A program job and a loop job train
several times longer than that limit allows, with a preemption, a pause and resume and a
worker killed each right at a run boundary: each completes with every step applied once (the
weights of an undisturbed run) and promotes the program's final weights, and no run's history
reaches the warning. Jobs that wait (for a slot, for a resume) continue-as-new too when
something fills their history meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd import binaries, reaper
from shepherd import search_attributes as sa
from shepherd.models import JobStatus, PauseRequest, PauseResult, ResumeRequest
from shepherd.phases import Phase
from shepherd.reaper import ReaperInput, ReaperReport
from shepherd.states import JobState
from tests.helpers import Account, run_cli, wait_state
from tests.replay import replay_since
from tests.workflows.conftest import Stack, open_stack
from tests.workflows.test_programs import (
    alive,
    per_step,
    printed,
    program_pid,
    promoted_digest,
    running_program_worker,
    sft_spec,
)
from tests.workflows.test_worker_crash import worker_process
from workers.main import WORKFLOWS
from workflows import policies

#: The scaled-down limits: warn, terminate, and where the jobs continue-as-new.
WARN, ERROR, CONTINUE_AT = 150, 250, 100
LIMITS = {
    "limit.historyCount.warn": WARN,
    "limit.historyCount.error": ERROR,
}


@pytest.fixture(scope="module")
async def limited() -> AsyncIterator[WorkflowEnvironment]:
    args = [a for key, v in LIMITS.items() for a in ("--dynamic-config-value", f"{key}={v}")]
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=binaries.temporal(),
        data_converter=pydantic_data_converter,
        search_attributes=list(sa.ALL),
        dev_server_log_level="error",
        dev_server_extra_args=args,
    )
    async with env:
        yield env


@pytest.fixture
async def long_stack(
    limited: WorkflowEnvironment,
    plane: PlaneProcess,
    admin: PlaneAdmin,
    account: Account,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Stack]:
    """A stack on the limited server; every workflow it ran is replayed when the test ends."""
    since = datetime.now(UTC)
    async with open_stack(limited.client, plane, admin, account) as st:
        yield st
    await replay_since(limited.client, since, request.node.nodeid, WORKFLOWS)


async def runs_of(client: Client, workflow_id: str) -> list[tuple[WorkflowExecutionStatus, int]]:
    """Each run of a workflow: its status and its history's length, oldest first."""
    runs = []
    async for execution in client.list_workflows(f'WorkflowId = "{workflow_id}"'):
        handle = client.get_workflow_handle(workflow_id, run_id=execution.run_id)
        history = await handle.fetch_history()
        runs.append((execution.start_time, execution.status, len(history.events)))
    return [(status, length) for _, status, length in sorted(runs, key=lambda r: r[0])]


async def assert_bounded(client: Client, workflow_id: str, at_least: int) -> int:
    """Every run of the job stayed under the server's warning; the job as a whole wrote more
    than the server would have let one history hold. Returns its number of runs."""
    runs = await runs_of(client, workflow_id)
    assert len(runs) >= at_least, runs
    assert all(length < WARN for _, length in runs), runs
    assert [s for s, _ in runs[:-1]] == [WorkflowExecutionStatus.CONTINUED_AS_NEW] * (
        len(runs) - 1
    ), runs
    assert sum(length for _, length in runs) > ERROR, runs
    return len(runs)


async def at_boundary(
    stack: Stack, handle: WorkflowHandle[Any, Any], runs: int, also: Callable[[JobStatus], bool]
) -> JobStatus:
    """Once ``also`` holds (the job got somewhere), as soon as its ``runs``-th
    continue-as-new happened and it trains again. What the job does fills its history;
    signals it refuses (a resume of a job that is not paused: a history event and a workflow
    task each, as a chatty client's) fill it faster, so that the boundary comes when the
    test wants it, not after minutes of steps."""
    await stack.until(handle, also, timeout=180)
    while (await stack.status(handle)).continued_as_new < runs:
        for _ in range(10):
            await handle.signal("resume")
        await asyncio.sleep(0.2)
    return await stack.until(
        handle,
        lambda s: s.continued_as_new >= runs and s.phase is Phase.TRAINING,
        timeout=180,
    )


def reached(step: int) -> Callable[[JobStatus], bool]:
    """The job trains, past ``step`` (and so past a checkpoint: every test job takes one
    within four steps)."""
    return lambda s: s.phase is Phase.TRAINING and s.step >= step


async def program_starts(client: Client, workflow_id: str) -> int:
    """Times the program was started, over every run (adoptions are no start)."""
    count = 0
    async for execution in client.list_workflows(f'WorkflowId = "{workflow_id}"'):
        handle = client.get_workflow_handle(workflow_id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                continue
            attrs = event.workflow_execution_signaled_event_attributes
            if attrs.signal_name == "program_started":
                data = pydantic_data_converter.payload_converter.from_payload(
                    attrs.input.payloads[0]
                )
                count += not data.get("adopted")
    return count


async def pause_and_resume(stack: Stack, handle: WorkflowHandle[Any, Any]) -> None:
    paused = await handle.execute_update(
        "request_pause", PauseRequest(reason="test"), result_type=PauseResult
    )
    status = await stack.status(handle)
    assert status.phase is Phase.PAUSED and paused.checkpoint is not None, (
        paused,
        status.step,
        status.paused_checkpoint,
        status.continued_as_new,
        [c.name for c in status.checkpoints],
    )
    await wait_state(stack.account.client, status.trainer_job_id or "", JobState.DELETED)
    await handle.execute_update("request_resume", ResumeRequest(), result_type=JobStatus)


@pytest.mark.slow
async def test_a_program_job_outlives_the_history_limit_through_faults_at_its_boundaries(
    long_stack: Stack, programs_env: Path, tmp_path: Path
) -> None:
    stack = long_stack
    steps = 40

    def spec(name: str) -> Any:
        return sft_spec(
            stack,
            name,
            steps=steps,
            checkpoint={"every_steps": 2, "keep_last": 2},
            policies={"max_history_events": CONTINUE_AT, "heartbeat_timeout": "3s"},
        )

    clean = await stack.start(spec("even"))
    queue = f"long-{uuid.uuid4().hex[:8]}"
    with (
        worker_process(stack, queue, tmp_path, "w1") as w1,
        worker_process(stack, queue, tmp_path, "w2") as w2,
    ):
        handle = await stack.start(spec("odyssey"), task_queue=queue)
        # A preemption in the first seconds of a run: the program was just adopted.
        first = await at_boundary(stack, handle, 1, reached(6))
        await stack.admin.preempt(first.trainer_job_id or "", account=stack.account.id)
        # A pause and a resume at the next boundary; the program waits, alive.
        await at_boundary(stack, handle, 2, reached(14))
        pid = await program_pid(handle)
        await pause_and_resume(stack, handle)
        assert alive(pid)
        # The program's worker killed at the next: it starts again on the other worker and
        # resumes from its own checkpoint.
        await at_boundary(stack, handle, 3, reached(24))
        running = await running_program_worker(handle)
        victim = w1 if running == w1.pid else w2
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        final: JobStatus = await handle.result()
    ref: JobStatus = await clean.result()

    assert final.phase is Phase.COMPLETED and final.step == steps == ref.step
    assert final.preemptions == 1 and final.generation == 1  # the pause's new trainer
    # Every optimizer step applied once: the program's weights are those of the clean run,
    # and the promoted model is the program's final weights.
    out, ref_out = printed(programs_env, handle), printed(programs_env, clean)
    assert out[-1]["digest"] == ref_out[-1]["digest"]
    assert await promoted_digest(stack, "odyssey") == out[-1]["digest"]
    assert await promoted_digest(stack, "even") == ref_out[-1]["digest"]
    # Started twice (the kill), never for a run boundary; and the history stayed bounded.
    assert await program_starts(stack.client, handle.id) == 2
    assert await program_starts(stack.client, clean.id) == 1
    # Each step's loss and weights as in the clean run (the steps the program redid after
    # the kill, from its own checkpoint, printed again the same).
    assert {s: (loss, d) for s, loss, d in per_step(out)} == {
        s: (loss, d) for s, loss, d in per_step(ref_out)
    }
    assert len(per_step(ref_out)) == steps
    await assert_bounded(stack.client, handle.id, at_least=4)
    await assert_bounded(stack.client, clean.id, at_least=2)  # by its own progress alone
    assert final.continued_as_new >= 3 and final.cleanup == "done"


@pytest.mark.slow
async def test_a_loop_job_outlives_the_history_limit_through_faults_at_its_boundaries(
    long_stack: Stack, tmp_path: Path
) -> None:
    stack = long_stack
    steps = 40

    def spec(name: str) -> Any:
        return stack.spec(
            name,
            trainer={"extra_args": ["--compute-delay-ms=20"]},
            training={"total_steps": steps, "steps_per_chunk": 2},
            checkpoint={"every_steps": 4, "keep_last": 2},
            policies={"max_history_events": CONTINUE_AT, "heartbeat_timeout": "3s"},
        )

    clean = await stack.start(spec("level"))
    queue = f"long-{uuid.uuid4().hex[:8]}"
    with (
        worker_process(stack, queue, tmp_path, "w1") as w1,
        worker_process(stack, queue, tmp_path, "w2"),
    ):
        handle = await stack.start(spec("voyage"), task_queue=queue)
        first = await at_boundary(stack, handle, 1, reached(8))
        await stack.admin.preempt(first.trainer_job_id or "", account=stack.account.id)
        await at_boundary(stack, handle, 2, reached(20))
        await pause_and_resume(stack, handle)
        await at_boundary(stack, handle, 3, reached(32))
        w1.send_signal(signal.SIGKILL)  # whichever runs the chunk: one of two
        w1.wait(10)
        final: JobStatus = await handle.result()
    ref: JobStatus = await clean.result()
    assert final.phase is Phase.COMPLETED and final.step == steps == ref.step
    assert final.preemptions == 1 and final.generation == 1, (final.recoveries, final.notices)
    assert await promoted_digest(stack, "voyage") == await promoted_digest(stack, "level")
    await assert_bounded(stack.client, handle.id, at_least=4)
    assert [p.step for p in final.loss_curve][-1] == steps


async def test_a_job_waiting_for_a_slot_or_a_resume_continues_as_new_when_its_history_fills(
    long_stack: Stack, faults: PlaneAdmin
) -> None:
    stack = long_stack
    await faults.set_faults(capacity=0)  # no slot: the job waits in QUEUED
    handle = await stack.start(
        stack.spec(
            "patient",
            trainer={"extra_args": ["--compute-delay-ms=50"]},
            training={"total_steps": 60},
            policies={"max_history_events": CONTINUE_AT},
        )
    )
    await stack.until(handle, lambda s: s.phase is Phase.QUEUED)
    waited = await chatter_until_continued(stack, handle, "resume")  # refused: not paused
    assert waited.phase is Phase.QUEUED and waited.generation == 0
    await faults.set_faults(capacity=16)
    await stack.until(handle, lambda s: s.phase is Phase.TRAINING and s.step >= 2)
    # Paused, and as chatty: the pause continues-as-new, and a resume still resumes it.
    await handle.execute_update("request_pause", PauseRequest(), result_type=PauseResult)
    paused = await chatter_until_continued(stack, handle, "pause")  # refused: already paused
    assert paused.phase is Phase.PAUSED
    await handle.execute_update("request_resume", ResumeRequest(), result_type=JobStatus)
    final: JobStatus = await handle.result()
    assert final.phase is Phase.COMPLETED and final.step == 60 and final.generation == 1
    await assert_bounded(stack.client, handle.id, at_least=3)
    assert any("ignored" in n for n in final.notices)


async def chatter_until_continued(
    stack: Stack, handle: WorkflowHandle[Any, Any], name: str
) -> JobStatus:
    """Refused signals (each one an event) until the job continues as new. How many that takes
    depends on how many workflow tasks they arrive in (a busy worker takes several at once)."""
    before = (await stack.status(handle)).continued_as_new
    async with asyncio.timeout(90):
        while True:
            for _ in range(10):
                await handle.signal(name)
            await asyncio.sleep(0.2)
            status = await stack.status(handle)
            if status.continued_as_new > before:
                return status


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` ended within ``seconds`` (a deadline, polled)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return not alive(pid)


@pytest.mark.parametrize("how", ["terminate", "history-limit"])
async def test_a_program_job_terminated_from_outside_leaves_nothing_running(
    long_stack: Stack, programs_env: Path, how: str
) -> None:
    """Terminated after a run boundary (``temporal workflow terminate``, as the Web UI does),
    or by the server's own history limit (a job that never continues-as-new: its
    ``max_history_events`` above the server's limit): no code of the workflow runs after
    it. Its program is stopped within the heartbeat timeout and the stop grace; the reaper
    deletes its trainer; ``status`` and ``list`` say what happened."""
    stack = long_stack
    cap = CONTINUE_AT if how == "terminate" else 50_000
    handle = await stack.start(
        sft_spec(
            stack,
            f"cut-{how}",
            steps=2000,
            checkpoint={"every_steps": 2, "keep_last": 2},
            policies={"max_history_events": cap, "heartbeat_timeout": "3s"},
        )
    )
    pid = await program_pid(handle)
    if how == "terminate":
        await at_boundary(stack, handle, 2, lambda s: s.phase is Phase.TRAINING)
        pid = await program_pid(handle)  # the same program, adopted
        done = await asyncio.to_thread(
            subprocess.run,
            [
                binaries.temporal(),
                "workflow",
                "terminate",
                "--address",
                stack.client.service_client.config.target_host,
                "--workflow-id",
                handle.id,
                "--reason",
                "an operator's terminate",
            ],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
    async with asyncio.timeout(300):
        while (await handle.describe()).status is WorkflowExecutionStatus.RUNNING:
            await asyncio.sleep(0.2)
    assert (await handle.describe()).status is WorkflowExecutionStatus.TERMINATED
    # The bound: the holder hears of it at its next heartbeat (0.8 of the timeout), then
    # SIGTERM, SIGKILL after the grace; a second for the margin of this poll.
    bound = 3 + policies.PROGRAM_STOP_GRACE.total_seconds() + 2
    assert await asyncio.to_thread(gone_within, pid, bound), f"program {pid} still runs"

    status = await stack.status(handle)
    trainer = status.trainer_job_id or ""
    assert (await stack.account.client.get_job(trainer)).state is JobState.RUNNING
    report: ReaperReport = await stack.client.execute_workflow(
        reaper.WORKFLOW_TYPE,
        ReaperInput(grace=timedelta(0)),
        id=f"reaper-{handle.id}",
        task_queue=stack.task_queue,
        result_type=ReaperReport,
    )
    assert [t.trainer_job_id for t in report.deleted] == [trainer], report
    await wait_state(stack.account.client, trainer, JobState.DELETED)

    shown = await run_cli("status", handle.id, "--json", stack=stack)
    assert shown.returncode != 0 or shown.stdout, shown.stderr
    said = json.loads(shown.stdout)
    assert said["phase"] == "TERMINATED", said
    assert "reaper" in said["cleanup"] and trainer in said["cleanup"], said
    listed = await run_cli("list", "--json", stack=stack)
    rows = [row for row in json.loads(listed.stdout) if row["workflow_id"] == handle.id]
    assert [row["phase"] for row in rows] == ["TERMINATED"], rows  # once, as it ended
