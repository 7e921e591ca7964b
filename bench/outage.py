"""Benchmark: what an outage under Shepherd costs jobs that train through it (issue 32) —
the Temporal server's (``--fault server``), the link between the worker and the trainer
platform (``--fault platform``: a partition while the server sees both), or the link between
the worker and the server (``--fault server-link``: the server stays up).

A stack started here: the Temporal dev server as ``shepherd dev`` runs it (its own process, a
SQLite file), localplane, and one in-process worker connected as production's is (the
worker's retry policy, ``SERVER_CALL_RETRY``; the event bridge on). ``--jobs`` loop jobs train
(``--step-ms`` of emulated GPU time per step, a checkpoint every 10); once each is past step 5
the fault strikes for ``--down`` seconds. With ``--kind program`` the jobs are program jobs
instead: examples/programs/tinker_sft.py, unmodified, behind Shepherd's data-plane proxy (a
checkpoint every 10 steps; JSON-only trainers, as hosted ones are):

* ``server``: the server is SIGKILLed and started again on its database — the workers are
  left alone. In the ``recovering`` case the first job's trainer is preempted just before the
  kill, so that job recovers across the outage.
* ``platform``: localplane and its trainers run on a host of their own (a network namespace,
  localplane/hosts.py) and the worker's link to it is cut — packets dropped, nothing refused
  (the far end of its veth pair taken down) — then healed. (``recovering`` preempts the
  trainer just before the cut.)
* ``server-link``: the Temporal server runs on such a host and the worker's link to it is cut
  while the server stays up, then healed (the issue names no target for it; the table holds
  it to the partition's 5 s).

Measured from the platform's side (the plane's per-job count of optimizer steps, read every
``--sample-ms``, for ``platform`` over a second link that is never cut): for each job,
**stall after return** = the first optimizer step the trainer took after the server answered
again (the link came back) minus that moment (targets: <= 10 s after a server outage, <= 5 s
after a partition heals), and **idle** = the longest time the trainer took no step around the
fault. Also, from each job's history: activity attempts that timed out and activities
retried, and the recoveries the job recorded (a partition must start none).

Prints one JSON document on stdout (progress on stderr). Run:
``.venv/bin/python bench/outage.py [--fault server|platform|server-link] [--down 15,180]
[--cases training,recovering] [--runs 1] [--jobs 3] [--kind loop|program]``; a smoke run:
``--down 5 --cases training``; the partitions of the issue: ``--fault platform --down 30,180
--cases training`` (and ``--kind program``) and ``--fault server-link --down 30,180``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from localplane import hosts
from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.platform import PlatformClient
from shepherd.spec import validate_spec
from shepherd.temporal import SERVER_CALL_RETRY, TemporalSettings, connect
from workers.devstack import TemporalServer, free_port, tcp_open

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from common import (
    BASE_MODEL,
    Runner,
    Stack,
    log,
    machine,
    no_plot,
    positive,
    program_env,
    r3,
    run_main,
    shepherd_worker,
    tinker_sft_spec,
)

#: Progress after the fault ends, at most (issue 32).
TARGETS_S = {"server": 10.0, "platform": 5.0, "server-link": 5.0}
CASES = ("training", "recovering")
FAULTS = tuple(TARGETS_S)
KINDS = ("loop", "program")
#: Steps a job is asked for: more than any run takes (each is cancelled after its fault).
MANY_STEPS = 100_000
CHECKPOINT = {"every_steps": 10, "keep_last": 2}


@dataclass
class Rig:
    server: TemporalServer
    #: The plane as the benchmark sees it (``stack.admin``: for ``platform``, over the link
    #: never cut) and the worker's task queue.
    stack: Stack
    runner: Runner
    #: The host whose link is cut: the plane's (``platform``) or the server's
    #: (``server-link``); None: the server is killed instead.
    host: hosts.Host | None = None


@contextlib.asynccontextmanager
async def rig(directory: Path, fault: str, kind: str) -> AsyncIterator[Rig]:
    async with contextlib.AsyncExitStack() as stack:
        if kind == "program":
            # The in-process worker reads the registration; the program inherits the rest.
            os.environ.update(program_env(directory))
        host = stack.enter_context(hosts.host(watch=True)) if fault != "server" else None
        far_server = host if fault == "server-link" else None
        far_plane = host if fault == "platform" else None
        state, port = directory / "temporal", free_port()
        server = (
            TemporalServer.on_host(far_server, state, port=port, headless=True)
            if far_server
            else TemporalServer(state, port=port, headless=True)
        )
        plane = PlaneProcess(
            directory / "plane",
            config={"capacity": 16, "trainerProtobuf": kind != "program"},
            env={"SHEPHERD_PLANE_HOST": "0.0.0.0"} if far_plane else None,  # noqa: S104 - its own host
            prefix=far_plane.prefix() if far_plane else None,
        )
        log("starting the Temporal dev server (SQLite file) and localplane")
        stack.callback(plane.cleanup)  # (before the host goes: registered after it)
        stack.callback(lambda: server.stop())
        await asyncio.to_thread(server.start)
        await asyncio.to_thread(plane.start)
        url = f"http://{far_plane.far_ip}:{plane.port}" if far_plane else plane.url
        watch_url = f"http://{far_plane.watch_ip}:{plane.port}" if far_plane else plane.url
        admin = await stack.enter_async_context(PlaneAdmin(watch_url, plane.admin_key, timeout=2.0))
        account, key = await admin.create_account()
        platform = await stack.enter_async_context(PlatformClient(url, key, account_id=account))
        client = await connect(TemporalSettings(address=server.address), retry=SERVER_CALL_RETRY)
        st = Stack(client, plane, admin, account, key, platform)
        runner = await stack.enter_async_context(
            shepherd_worker(st, "outage", events=True, plane_url=url)
        )
        yield Rig(server, st, runner, host)


async def start_job(r: Rig, name: str, step_ms: float, kind: str) -> WorkflowHandle[Any, JobStatus]:
    if kind == "program":
        return await r.runner.start(
            tinker_sft_spec(name, steps=MANY_STEPS, step_ms=step_ms, checkpoint=CHECKPOINT)
        )
    return await r.runner.start(
        validate_spec(
            {
                "name": name,
                "trainer": {
                    "base_model": BASE_MODEL,
                    "extra_args": [f"--compute-delay-ms={step_ms:g}"],
                },
                "training": {"total_steps": MANY_STEPS},
                "checkpoint": CHECKPOINT,
                "output": {"promote": "none"},
            }
        )
    )


async def until_training(handle: WorkflowHandle[Any, JobStatus], step: int) -> JobStatus:
    async with asyncio.timeout(120):
        while True:
            status = await handle.query("status", result_type=JobStatus)
            if status.phase is Phase.TRAINING and status.step >= step:
                return status
            await asyncio.sleep(0.2)


async def sample_steps(
    r: Rig, names: dict[str, str], every_s: float, into: dict[str, list[tuple[float, int]]]
) -> None:
    """Each job's optimizer steps served by the plane, (monotonic time, count) at each change."""
    while True:
        with contextlib.suppress(Exception):
            jobs = (await r.stack.admin.stats())["jobs"]
            now = time.monotonic()
            for job, name in names.items():
                count = int(jobs.get(name, {}).get("dataPlane", {}).get("json:optim_step", 0))
                seen = into.setdefault(job, [])
                if not seen or seen[-1][1] != count:
                    seen.append((now, count))
        await asyncio.sleep(every_s)


def answering_again(server: TemporalServer) -> float:
    """When the server's port accepts connections again (polled every 20 ms)."""
    while not tcp_open(server.ip, server.port):
        time.sleep(0.02)
    return time.monotonic()


async def outage(server: TemporalServer, down_s: float) -> tuple[float, float]:
    """SIGKILL the server, wait, start it again; (killed at, answering again at)."""
    assert server.proc is not None
    server.proc.kill()
    await asyncio.to_thread(server.proc.wait)
    killed = time.monotonic()
    await asyncio.sleep(down_s)
    starting = asyncio.ensure_future(asyncio.to_thread(server.start))
    back = await asyncio.to_thread(answering_again, server)
    await starting
    return killed, back


async def partition(host: hosts.Host, down_s: float) -> tuple[float, float]:
    """Cut the worker's link to the platform, wait, heal it; (cut at, healed at)."""
    await asyncio.to_thread(host.cut)
    cut = time.monotonic()
    await asyncio.sleep(down_s)
    await asyncio.to_thread(host.heal)
    return cut, time.monotonic()


async def history_counts(handle: WorkflowHandle[Any, Any]) -> dict[str, int]:
    timed_out = retried = 0
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            timed_out += 1
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            retried += e.activity_task_started_event_attributes.attempt > 1
    return {"activity_timeouts": timed_out, "activity_retries": retried}


async def one_run(r: Rig, case: str, down_s: float, args: argparse.Namespace) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:4]
    handles = [
        await start_job(r, f"{case}-{i}-{tag}", args.step_ms, args.kind) for i in range(args.jobs)
    ]
    statuses = [await until_training(h, 5) for h in handles]
    names = {
        h.id: r.stack.job_name(s.trainer_job_id or "")
        for h, s in zip(handles, statuses, strict=True)
    }
    steps: dict[str, list[tuple[float, int]]] = {}
    sampler = asyncio.create_task(sample_steps(r, names, args.sample_ms / 1000, steps))
    await asyncio.sleep(1.0)
    if case == "recovering":
        await r.stack.admin.preempt(statuses[0].trainer_job_id or "", account=r.stack.account_id)
    log(f"{case}, {down_s:g} s: the {args.fault} goes away")
    if r.host is not None:
        killed, back = await partition(r.host, down_s)
    else:
        killed, back = await outage(r.server, down_s)
    log(f"{case}, {down_s:g} s: back; waiting for each job's next step")
    stalls: dict[str, float | None] = {}
    deadline = back + args.wait
    while time.monotonic() < deadline and len(stalls) < len(handles):
        for h in handles:
            after = [t for t, _ in steps.get(h.id, []) if t > back]
            if after and h.id not in stalls:
                stalls[h.id] = after[0] - back
        await asyncio.sleep(0.1)
    await asyncio.sleep(2.0)
    sampler.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampler
    jobs = []
    for h in handles:
        times = [t for t, _ in steps.get(h.id, [])]
        stall = stalls.get(h.id)
        # The last step before the kill, the steps during the outage, the first after it.
        window = [t for t in times if t <= killed][-1:]
        window += [t for t in times if killed < t <= back + (stall if stall is not None else 0)]
        gaps = [b - a for a, b in zip(window, window[1:], strict=False)]
        jobs.append(
            {
                "job": h.id,
                "stall_after_return_s": r3(stall) if stall is not None else None,
                "idle_s": r3(max(gaps)) if gaps and stall is not None else None,
                "steps_during_outage": sum(1 for t in times if killed < t <= back),
                "recoveries": [
                    r.reason for r in (await h.query("status", result_type=JobStatus)).recoveries
                ],
                **(await history_counts(h)),
            }
        )
        with contextlib.suppress(Exception):
            await h.cancel()
    for h in handles:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(60):
                await h.result()
    worst = [j["stall_after_return_s"] for j in jobs]
    return {
        "case": case,
        "down_s": down_s,
        "measured_down_s": r3(back - killed),
        "jobs": jobs,
        "worst_stall_after_return_s": None if None in worst else max(worst),  # type: ignore[type-var]
        "all_progressed": None not in worst,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-outage-") as tmp:
        async with rig(Path(tmp), args.fault, args.kind) as r:
            for down_s in args.down:
                for case in args.cases:
                    for _ in range(args.runs):
                        runs.append(await one_run(r, case, down_s, args))
                        log(
                            f"{case}, {down_s:g} s: worst stall after return "
                            f"{runs[-1]['worst_stall_after_return_s']} s"
                        )
    stalls = [j["stall_after_return_s"] for run in runs for j in run["jobs"]]
    target = TARGETS_S[args.fault]
    met = all(s is not None and s <= target for s in stalls)
    return {
        "benchmark": "outage",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "settings": {
            "fault": args.fault,
            "kind": args.kind,
            "down_s": args.down,
            "cases": args.cases,
            "runs": args.runs,
            "jobs": args.jobs,
            "step_ms": args.step_ms,
            "sample_ms": args.sample_ms,
            "worker": "in-process, client retry SERVER_CALL_RETRY, event bridge on",
            "server": "temporal server start-dev on a SQLite file (SIGKILLed and restarted for "
            "--fault server; for --fault server-link on a host of its own, cut like the plane's)",
            "platform": "localplane, for --fault platform on a host of its own (a network "
            "namespace) whose link to the worker is cut by taking the far end of the veth down",
        },
        "method": {
            "stall_after_return_s": "per job: the first optimizer step the plane served after "
            "the server's port accepted connections again, minus that moment",
            "idle_s": "per job: the longest time between two optimizer steps around the outage",
            "activity_timeouts": "ActivityTaskTimedOut events in the job's history (whole run)",
        },
        "target": {"stall_after_return_le_s": target, "met": met},
        "runs": runs,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", choices=FAULTS, default="server", help="what goes away")
    parser.add_argument("--down", default="15,180", help="outage lengths, seconds")
    parser.add_argument("--cases", default=",".join(CASES), help="training and/or recovering")
    parser.add_argument("--kind", choices=KINDS, default="loop", help="loop or program jobs")
    parser.add_argument("--runs", type=positive(int), default=1, help="runs per case and length")
    parser.add_argument("--jobs", type=positive(int), default=3, help="jobs training")
    parser.add_argument("--step-ms", type=positive(float), default=200.0, help="GPU ms per step")
    parser.add_argument("--sample-ms", type=positive(float), default=50.0, help="plane reads")
    parser.add_argument("--wait", type=positive(float), default=120.0, help="give up after")
    args = parser.parse_args(argv)
    args.down = [float(x) for x in args.down.split(",") if x.strip()]
    args.cases = [c for c in args.cases.split(",") if c.strip()]
    if not args.down or any(d <= 0 for d in args.down):
        parser.error("--down: comma-separated seconds > 0")
    if not args.cases or set(args.cases) - set(CASES):
        parser.error(f"--cases: among {', '.join(CASES)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run_main(lambda: bench(args), lambda report: no_plot())


if __name__ == "__main__":
    main()
