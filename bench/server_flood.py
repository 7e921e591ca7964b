"""Benchmark: what a burst of workflow starts does to a workflow that is already running, on
the Temporal dev server alone (no Shepherd code: the question is the server's).

``bench/admission.py --n 5000`` showed Shepherd's running jobs all but stopping while a burst
of thousands of submissions was taken in (docs/scale.md). This reduces it to Temporal: one
``Runner`` workflow does short activities back to back (each a workflow task and an activity:
the shape of a training job's chunks); it runs alone for ``--alone`` seconds, then ``--n``
``Burst`` workflows (three activities each, the shape of a new job's intake) are started
``--concurrency`` at a time, and the Runner's steps are counted in windows of ``--window``
seconds while they come in. With ``--raise`` the Runner's priority is raised to key 1 before
the burst (``UpdateWorkflowExecutionOptions``: its workflow and activity tasks then go ahead
of the burst's key-3 ones in every task queue). The dev server's and this process's CPU are
read from /proc.

Prints one JSON document: the Runner's steps/s alone and per window during the burst, the
burst's starts/s, the CPU seconds of the server and of this process (worker and client), and
one slow step's history timings (activity and workflow task: scheduled -> started ->
completed), which show where the time goes.

Run: ``.venv/bin/python bench/server_flood.py [--n 3000] [--raise] [--memory]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.common import Priority
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from activities.scheduling import set_task_priority  # noqa: E402
from shepherd import binaries  # noqa: E402

#: Priority keys: the burst's (a new job's default) and the Runner's when raised.
BURST_KEY, RAISED_KEY = 3, 1
STEP_TIMEOUT = timedelta(minutes=10)

progress: list[float] = []


@activity.defn
async def step(i: int) -> int:
    await asyncio.sleep(0.005)
    return i


@workflow.defn
class Runner:
    @workflow.run
    async def run(self, n: int) -> None:
        for i in range(n):
            await workflow.execute_activity(step, i, start_to_close_timeout=STEP_TIMEOUT)
            if not workflow.unsafe.is_replaying():
                with workflow.unsafe.sandbox_unrestricted():
                    progress.append(time.monotonic())


@workflow.defn
class Burst:
    @workflow.run
    async def run(self, n: int) -> None:
        for i in range(n):
            await workflow.execute_activity(step, i, start_to_close_timeout=STEP_TIMEOUT)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pid(port: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "start-dev" in cmd and f"--port {port}" in cmd:
                return int(entry.name)
    return None


async def slow_step(handle: Any) -> dict[str, float]:
    """The slowest Runner step in its history: its activity's and the next workflow task's
    scheduled -> started -> completed, in seconds."""
    events = [
        (e.event_type, e.event_time.ToDatetime().timestamp())
        async for e in handle.fetch_history_events()
    ]
    worst: dict[str, float] = {}
    for k, (kind, t) in enumerate(events):
        if kind != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED or k + 6 >= len(events):
            continue
        times = {EventType.Name(e).removeprefix("EVENT_TYPE_"): u for e, u in events[k : k + 7]}
        span = times.get("WORKFLOW_TASK_COMPLETED", t) - t
        if span > worst.get("total_s", 0.0):
            worst = {
                "total_s": round(span, 3),
                "activity_run_s": round(
                    times.get("ACTIVITY_TASK_COMPLETED", t) - times.get("ACTIVITY_TASK_STARTED", t),
                    3,
                ),
                "workflow_task_wait_s": round(
                    times.get("WORKFLOW_TASK_STARTED", t) - times.get("WORKFLOW_TASK_SCHEDULED", t),
                    3,
                ),
                "workflow_task_run_s": round(
                    times.get("WORKFLOW_TASK_COMPLETED", t) - times.get("WORKFLOW_TASK_STARTED", t),
                    3,
                ),
            }
    return worst


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flood-") as tmp:  # (the SQLite file goes with it)
        return await flood(args, None if args.memory else str(Path(tmp) / "temporal.db"))


async def flood(args: argparse.Namespace, db: str | None) -> dict[str, Any]:
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=binaries.temporal(),
        dev_server_database_filename=db,
        dev_server_log_level="error",
        ui=False,
    ) as env:
        client = env.client
        port = int(client.service_client.config.target_host.rsplit(":", 1)[1])
        server = server_pid(port)
        queue = f"flood-{uuid.uuid4().hex[:6]}"
        async with Worker(
            client,
            task_queue=queue,
            workflows=[Runner, Burst],
            activities=[step],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            handle = await client.start_workflow(
                Runner.run,
                10**6,
                id=f"runner-{queue}",
                task_queue=queue,
                priority=Priority(priority_key=BURST_KEY),
            )
            await asyncio.sleep(args.alone)
            alone = len(progress) / args.alone
            if args.raise_priority:
                await set_task_priority(client, handle.id, Priority(priority_key=RAISED_KEY))
            cpu0 = (cpu_s(server) if server else 0.0, cpu_s(os.getpid()))
            gate = asyncio.Semaphore(args.concurrency)

            async def start(i: int) -> None:
                async with gate:
                    await client.start_workflow(
                        Burst.run,
                        3,
                        id=f"burst-{queue}-{i}",
                        task_queue=queue,
                        priority=Priority(priority_key=BURST_KEY),
                    )

            t0 = time.monotonic()
            burst = asyncio.ensure_future(asyncio.gather(*(start(i) for i in range(args.n))))
            windows = []
            while not burst.done() or len(windows) < 2:
                before = len(progress)
                await asyncio.sleep(args.window)
                windows.append(round((len(progress) - before) / args.window, 2))
            await burst
            starts_s = round(args.n / (time.monotonic() - t0), 1)
            cpu1 = (cpu_s(server) if server else 0.0, cpu_s(os.getpid()))
            await handle.terminate()
            return {
                "n": args.n,
                "concurrency": args.concurrency,
                "raised_priority": args.raise_priority,
                "database": "memory" if args.memory else "sqlite file",
                "runner_steps_per_s_alone": round(alone, 1),
                "runner_steps_per_s_during_burst": windows,
                "burst_starts_per_s": starts_s,
                "cpu_s_during_burst": {
                    "server": round(cpu1[0] - cpu0[0], 1),
                    "worker_and_client": round(cpu1[1] - cpu0[1], 1),
                    "wall": round(time.monotonic() - t0, 1),
                },
                "slowest_runner_step": await slow_step(handle),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="workflows in the burst")
    parser.add_argument("--concurrency", type=int, default=32, help="start calls in flight")
    parser.add_argument("--alone", type=float, default=3.0, help="seconds the Runner runs alone")
    parser.add_argument("--window", type=float, default=5.0, help="seconds per counted window")
    parser.add_argument(
        "--raise",
        dest="raise_priority",
        action="store_true",
        help="raise the Runner's priority (key 1) before the burst",
    )
    parser.add_argument("--memory", action="store_true", help="the server's state in memory")
    args = parser.parse_args()
    # The dev server writes its banner on the stdout it inherits: ours carries the JSON only.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    print(json.dumps(asyncio.run(run(args)), indent=2), file=out, flush=True)


if __name__ == "__main__":
    main()
