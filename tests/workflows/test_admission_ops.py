"""Admission as operators run it: the worker process (``shepherd worker``) whose backend
profile declares its slots in the environment, SIGKILLed while its scheduler admits a burst
of jobs, and serving its Prometheus endpoints (Shepherd's admission figures and the SDK's
metrics with what the job workflows measure)."""

from __future__ import annotations

import asyncio
import re
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import WorkflowHandle

from shepherd.jobs import start_job
from shepherd.phases import Phase
from shepherd.scheduling import SchedulerState, scheduler_id
from tests.workflows.conftest import Stack
from tests.workflows.test_scheduling import job
from tests.workflows.test_worker_crash import worker_process
from workers.devstack import free_port


def env_for(backend: str, stack: Stack, slots: int, **more: str) -> dict[str, str]:
    """A worker's environment declaring ``backend`` (the test's plane) with ``slots``."""
    prefix = f"SHEPHERD_BACKEND_{backend.upper()}_"
    return {
        "SHEPHERD_BACKENDS": f"local,{backend}",
        prefix + "URL": stack.plane.url,
        prefix + "API_KEY_ENV": "SHEPHERD_PLANE_API_KEY",
        prefix + "EVENTS": "true",
        prefix + "SLOTS": str(slots),
        prefix + "HOLDER_CHECK": "2",
        **more,
    }


def spec(stack: Stack, name: str, backend: str, steps: int) -> Any:
    # A killed worker's activities are retried elsewhere within seconds.
    return job(stack, name, backend, steps, policies={"heartbeat_timeout": "3s"})


async def state_of(stack: Stack, backend: str) -> SchedulerState | None:
    try:
        handle = stack.client.get_workflow_handle(scheduler_id(backend))
        return await handle.query("state", result_type=SchedulerState)
    except Exception:  # noqa: BLE001 - not started yet, or its worker is down
        return None


async def test_a_sigkilled_scheduler_worker_grants_no_slot_twice_and_loses_none(
    stack: Stack, tmp_path: Path
) -> None:
    backend, queue = f"k{uuid.uuid4().hex[:8]}", f"schedcrash-{uuid.uuid4().hex[:8]}"
    env = env_for(backend, stack, slots=2)
    handles: list[WorkflowHandle[Any, Any]] = []
    most, stop = 0, asyncio.Event()

    async def watch() -> None:
        # Over the whole run: never more holders than slots (a slot granted twice would be).
        nonlocal most
        while not stop.is_set():
            if (state := await state_of(stack, backend)) is not None:
                assert len(state.holders) <= 2, state.holders
                most = max(most, len(state.holders))
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    with worker_process(stack, queue, tmp_path, "first", **env) as first:
        # A burst: five asks reach the scheduler while it grants the first two.
        for i in range(5):
            handle = await start_job(
                stack.client, spec(stack, f"burst{i}", backend, 10), task_queue=queue
            )
            stack.handles.append(handle)
            handles.append(handle)
        async with asyncio.timeout(60):
            while (state := await state_of(stack, backend)) is None or not state.holders:
                await asyncio.sleep(0.02)
        first.send_signal(signal.SIGKILL)  # mid-admission: asks landing, grants going out
        first.wait(10)
    with worker_process(stack, queue, tmp_path, "second", **env):
        done = [await h.result() for h in handles]
        stop.set()
        await watcher
        # (Read while a worker runs: it answers the scheduler's query.)
        state = await state_of(stack, backend)
    assert all(s.phase is Phase.COMPLETED and s.step == 10 for s in done)
    assert state is not None
    # Each job admitted once, every slot back, nobody left waiting.
    assert state.admitted_total == 5 and most == 2, (state, most)
    assert state.holders == {} and state.waiting == [] and state.reserved == {}
    for s in done:  # and one trainer each: no job ran on a slot it was granted twice
        job = (await stack.admin.stats())["jobs"][stack.job_name(s.trainer_job_id or "")]
        assert job["creates"] == 1 and job["liveTrainer"] is False


def sample(text: str, name: str, **labels: str) -> float:
    """The value of ``name`` whose labels include ``labels`` in a Prometheus text page."""
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(4))
    raise KeyError(f"{name}{labels} not in the page")


async def test_a_worker_serves_admission_and_job_metrics(stack: Stack, tmp_path: Path) -> None:
    backend, queue = f"m{uuid.uuid4().hex[:8]}", f"metrics-{uuid.uuid4().hex[:8]}"
    ours, temporal = free_port(), free_port()
    env = env_for(
        backend,
        stack,
        slots=1,
        SHEPHERD_METRICS=f"127.0.0.1:{ours}",
        SHEPHERD_TEMPORAL_METRICS=f"127.0.0.1:{temporal}",
        SHEPHERD_METRICS_REFRESH="0.5",
    )
    with worker_process(stack, queue, tmp_path, "metrics", **env):
        # Long enough that the state below outlasts the figures' staleness: a refresh waits
        # for every running scheduler's answer, up to a query timeout (5 s) for one whose
        # worker is gone — the shared test server keeps other tests' schedulers.
        first = await start_job(stack.client, spec(stack, "mfirst", backend, 60), task_queue=queue)
        stack.handles.append(first)
        await stack.until(first, lambda s: s.trainer_job_id is not None, 60)  # it holds the slot
        second = await start_job(stack.client, spec(stack, "msecond", backend, 5), task_queue=queue)
        stack.handles.append(second)
        running = await stack.until(first, lambda s: s.step >= 6 and s.phase is Phase.TRAINING, 90)
        # Its trainer preempted: it recovers on the slot it holds; the other waits on.
        await stack.admin.preempt(running.trainer_job_id or "", account=stack.account.id)
        async with httpx.AsyncClient(timeout=10) as http:

            async def page(port: int) -> str:
                return (await http.get(f"http://127.0.0.1:{port}/metrics")).text

            # While one holds the only slot and the other waits.
            async with asyncio.timeout(30):
                while True:
                    text = await page(ours)
                    try:
                        if sample(text, "shepherd_jobs_waiting", backend=backend) == 1:
                            break
                    except KeyError:
                        pass
                    await asyncio.sleep(0.2)
            assert sample(text, "shepherd_capacity_slots", backend=backend) == 1
            assert (
                sample(text, "shepherd_queue_slots_in_use", backend=backend, queue="default") == 1
            )
            assert (await first.result()).phase is Phase.COMPLETED
            assert (await second.result()).phase is Phase.COMPLETED
            async with asyncio.timeout(30):
                while sample(
                    text := await page(ours), "shepherd_queue_slots_in_use", backend=backend
                ):
                    await asyncio.sleep(0.2)
            assert sample(text, "shepherd_jobs_admitted_total", backend=backend) == 2
            assert sample(text, "shepherd_jobs_waiting", backend=backend) == 0
            assert sample(text, "shepherd_trainer_seconds_total", backend=backend) > 0
            assert sample(text, "shepherd_queue_wait_seconds_total", backend=backend) > 0
            # What the workflows measured, with the SDK's own figures.
            sdk = await page(temporal)
            assert (
                sample(sdk, "shepherd_recoveries_total", backend=backend, reason="preemption") == 1
            )
            assert sample(sdk, "shepherd_admission_wait_seconds_count", backend=backend) == 2
            # Both came up, and the preempted one once more.
            assert sample(sdk, "shepherd_readiness_lag_seconds_count", backend=backend) == 3
            assert "temporal_workflow_completed" in sdk
