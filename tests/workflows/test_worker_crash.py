"""A worker killed with SIGKILL mid-training: another worker finishes the job with exactly
one trainer created and the same final weights."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from localplane.admin import PlaneAdmin
from shepherd.jobs import start_job
from shepherd.phases import Phase
from shepherd.states import JobState
from tests.helpers import wait_state
from tests.workflows.conftest import Stack
from tests.workflows.test_recovery import SLOW, model_digest
from workers.devstack import wait_until


@contextmanager
def worker_process(
    stack: Stack, task_queue: str, tmp: Path, name: str, **extra_env: str
) -> Iterator[subprocess.Popen[bytes]]:
    ready = tmp / f"{name}.ready"
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
        "SHEPHERD_TASK_QUEUE": task_queue,
        "SHEPHERD_BACKEND_LOCAL_URL": stack.plane.url,
        "SHEPHERD_PLANE_API_KEY": stack.account.api_key,
        "SHEPHERD_LOG_FORMAT": "json",
        **extra_env,
    }
    with open(tmp / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shepherd.cli.main", "worker", "--ready-file", str(ready)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(ready.exists, f"worker {name}", proc=proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)


async def test_sigkilled_worker_is_replaced_without_a_second_trainer(
    stack: Stack, tmp_path: Path
) -> None:
    queue = f"crash-{uuid.uuid4().hex[:8]}"
    spec = stack.spec(
        "crash", trainer=SLOW, training={"total_steps": 50}, policies={"heartbeat_timeout": "3s"}
    )
    reference = await stack.start(stack.spec("ref", trainer=SLOW, training={"total_steps": 50}))

    with worker_process(stack, queue, tmp_path, "first") as first:
        handle = await start_job(stack.client, spec, task_queue=queue)
        stack.handles.append(handle)
        before = await stack.until(handle, lambda s: s.step >= 10 and s.phase is Phase.TRAINING)
        first.send_signal(signal.SIGKILL)
        first.wait(10)

    with worker_process(stack, queue, tmp_path, "second"):
        result = await handle.result()

    await reference.result()
    assert result.phase is Phase.COMPLETED and result.step == 50
    assert result.trainer_job_id == before.trainer_job_id and result.generation == 0
    assert result.preemptions == 0 and not result.recoveries
    job = (await stack.admin.stats())["jobs"][stack.job_name(result.trainer_job_id or "")]
    assert (
        job["creates"] == 1 and job.get("createConflicts", 0) == 0 and job["trainersStarted"] == 1
    )
    assert job["liveTrainer"] is False
    assert await model_digest(stack, "crash-model") == await model_digest(stack, "ref-model")


async def test_sweep_survives_a_sigkilled_worker(stack: Stack, tmp_path: Path) -> None:
    from shepherd.client import Shepherd

    queue = f"sweepcrash-{uuid.uuid4().hex[:8]}"
    base = stack.spec(
        "sc-base", trainer=SLOW, training={"total_steps": 30}, policies={"heartbeat_timeout": "3s"}
    )
    data = {
        "name": "sweepcrash",
        "spec": base.model_dump(mode="json"),
        "parameters": {"trainer.lora_rank": {"type": "categorical", "values": [0, 4, 8]}},
        "method": "grid",
        "max_trials": 3,
        "parallelism": 2,
    }
    sh = Shepherd(stack.client, task_queue=queue)
    with worker_process(stack, queue, tmp_path, "first") as first:
        sweep = await sh.submit_sweep(data)
        stack.handles.append(stack.client.get_workflow_handle(sweep.id))
        async with asyncio.timeout(60):
            while [t.state for t in (await sweep.status()).trials][:1] != ["running"]:
                await asyncio.sleep(0.2)
        await stack.until(
            stack.client.get_workflow_handle(f"{sweep.id}-t0"), lambda s: s.step >= 10
        )
        first.send_signal(signal.SIGKILL)
        first.wait(10)

    with worker_process(stack, queue, tmp_path, "second"):
        status = await sweep.wait()

    assert status.phase == "COMPLETED"
    assert [t.state for t in status.trials] == ["completed"] * 3
    # Each trial kept its one trainer through the crash.
    jobs = (await stack.admin.stats())["jobs"]
    mine = [
        v for k, v in jobs.items() if f"/{stack.account.id}/rlorTrainerJobs/sweep-sweepcrash-" in k
    ]
    assert len(mine) == 3 and all(v["creates"] == 1 and v["trainersStarted"] == 1 for v in mine)


async def test_workers_share_queued_jobs_and_survive_losing_one(
    stack: Stack, tmp_path: Path, faults: PlaneAdmin
) -> None:
    # More jobs than slots, two worker processes (each with its event bridge); one is
    # SIGKILLed while jobs train and others wait for a slot. Every job completes on the
    # other, and every trainer was created once.
    await faults.set_faults(capacity=2)
    queue = f"shared-{uuid.uuid4().hex[:8]}"
    specs = [
        stack.spec(
            f"shared-{i}",
            training={"total_steps": 10},
            checkpoint={"every_steps": 5},
            output={"promote": "none"},
            policies={"heartbeat_timeout": "3s"},
        )
        for i in range(8)
    ]
    with (
        worker_process(stack, queue, tmp_path, "a") as a,
        worker_process(stack, queue, tmp_path, "b"),
    ):
        handles = [await start_job(stack.client, spec, task_queue=queue) for spec in specs]
        stack.handles.extend(handles)
        await stack.until(handles[0], lambda s: s.step >= 5)
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        results = await asyncio.gather(*(h.result() for h in handles))

    assert [r.phase for r in results] == [Phase.COMPLETED] * len(specs)
    for r in results:  # a deleted trainer's process exits after DELETING
        await wait_state(stack.account.client, r.trainer_job_id or "", JobState.DELETED)
    jobs = (await stack.admin.stats())["jobs"]
    for r in results:
        job = jobs[stack.job_name(r.trainer_job_id or "")]
        assert job["creates"] == 1 and job.get("createConflicts", 0) == 0, r.trainer_job_id
        assert job["liveTrainer"] is False
