"""Benchmark: admission in Shepherd — an urgent job behind N waiting ones, and how the stack
bears N jobs waiting.

For each ``--n`` a fresh stack (the Temporal dev server on a SQLite file, as ``shepherd dev``
runs it; localplane with ``--slots`` trainer slots; ``--workers`` ``shepherd worker``
processes (default one) whose ``local`` profile declares the same number of slots, so jobs
wait in Shepherd): N
priority-0 jobs (the ``supervised`` loop of bench/scale.py, ``--steps`` steps) are submitted
as fast as ``--submit-concurrency`` start calls allow, and the run waits until the backend's
scheduler holds every slot and has every other job waiting. Then one priority-10 job is
submitted, and the run measures:

* ``submit_s`` (p50 / p95 / max): one ``start_job`` call, for the N (what a submission costs
  while thousands wait); ``waiting_s``: from t0 until the urgent job goes in (the slots all
  held and ``--urgent-behind`` jobs waiting, default all N); ``all_asked_s``: from t0 until
  every job of the burst has asked (its workflow started and reached the scheduler);
* ``urgent``: from its submission to its admission (``admitted_s``) and to its first training
  step (``first_step_s``, the job's status), next to ``slot_freed_s``: from its submission to
  the first slot a running job gave back (the target: the urgent job starts within the time
  for one slot to free, plus its own trainer's start);
* ``admitted_next``: whether the urgent job was the first admitted after its submission;
* ``admitted_when_urgent`` / ``admitted_by_all_asked``: jobs admitted while the burst was
  taken in (do the slots keep training while thousands of jobs start and ask?).

The stack is then stopped (the jobs still waiting go with the dev server's temp dir).
Prints one JSON document on stdout (progress on stderr).

Run: ``.venv/bin/python bench/admission.py [--n 1000,10000] [--slots 4] [--steps 40]``; a
smoke run: ``--n 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from shepherd.jobs import start_job
from shepherd.models import JobStatus
from shepherd.scheduling import SchedulerState, scheduler_id
from shepherd.spec import JobSpec

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from common import log, machine, positive, r3, run_main, shepherd_stack, summary
from scale import (
    BOOT_DELAY_S,
    ROUTE_LAG_S,
    WorkerProcess,
    add_worker_env,
    job_spec,
    parse_worker_env,
    start_workers,
    stop_workers,
)

DEFAULT_NS = (1000, 10000)
#: How often the scheduler's state is read while the urgent job waits.
POLL_S = 0.05


async def scheduler_state(client: Any, backend: str = "local") -> SchedulerState | None:
    try:
        handle = client.get_workflow_handle(scheduler_id(backend))
        # (The summary: with thousands waiting, the whole line is megabytes a query.)
        return await handle.query("summary", 0, result_type=SchedulerState)
    except Exception:  # noqa: BLE001 - not started yet
        return None


def spec_of(name: str, args: argparse.Namespace, priority: int) -> JobSpec:
    spec = job_spec(name, args)
    data = spec.model_dump(mode="json")
    data["training"]["total_steps"] = args.steps
    data["scheduling"]["priority"] = priority
    return JobSpec.model_validate(data)


async def submit(
    client: Any, specs: list[JobSpec], task_queue: str, concurrency: int
) -> tuple[list[str], list[float], list[str]]:
    """Start every job; the ids, each start call's seconds, and the errors."""
    gate = asyncio.Semaphore(concurrency)
    took: list[float] = []

    async def one(spec: JobSpec) -> str:
        async with gate:
            t = time.monotonic()
            handle = await start_job(client, spec, task_queue=task_queue)
            took.append(time.monotonic() - t)
            return handle.id

    results = await asyncio.gather(*(one(s) for s in specs), return_exceptions=True)
    ids = [r for r in results if isinstance(r, str)]
    errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return ids, took, errors


async def run_one(n: int, args: argparse.Namespace) -> dict[str, Any]:
    plane_config = {
        "capacity": args.slots,
        "bootDelaySeconds": BOOT_DELAY_S,
        "routeLagSeconds": ROUTE_LAG_S,
    }
    args.worker_env = {**args.worker_env, "SHEPHERD_BACKEND_LOCAL_SLOTS": str(args.slots)}
    log(f"=== N={n}: {args.slots} slots, {args.workers} worker(s), admission in Shepherd")
    with tempfile.TemporaryDirectory(prefix=f"shepherd-admission-{n}-") as tmp:
        run_dir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            st = await stack.enter_async_context(
                shepherd_stack(plane_config, db_filename=run_dir / "temporal.db")
            )
            task_queue = f"admission-{uuid.uuid4().hex[:8]}"
            workers: list[WorkerProcess] = []
            stack.callback(stop_workers, workers)
            await start_workers(workers, st, args.workers, task_queue, run_dir, args)
            specs = [spec_of(f"wait-{i:05d}", args, 0) for i in range(n)]
            t0 = time.monotonic()
            ids, took, errors = await submit(st.client, specs, task_queue, args.submit_concurrency)
            submitted_s = time.monotonic() - t0
            log(f"N={n}: {len(ids)} started in {submitted_s:.1f} s")
            # Every job asks for a slot as its workflow starts; the urgent job goes in once
            # the slots are all held and at least ``--urgent-behind`` jobs wait (the whole
            # burst, where it has asked within the timeout).
            behind = min(args.urgent_behind or n, n)
            deadline = t0 + args.timeout
            state: SchedulerState | None = None
            while time.monotonic() < deadline:
                state = await scheduler_state(st.client)
                if (
                    state is not None
                    and len(state.holders) == args.slots
                    # (Each that asked waits, or was admitted: jobs end meanwhile.)
                    and sum(state.waiting_in().values()) + state.admitted_total >= behind
                ):
                    break
                await asyncio.sleep(1.0)
            else:
                raise RuntimeError(f"N={n}: {behind} jobs had not asked within {args.timeout:g} s")
            waiting_s = time.monotonic() - t0
            log(f"N={n}: {sum(state.waiting_in().values())} waiting after {waiting_s:.1f} s")
            assert state is not None
            before = set(state.holders)
            admitted_before = state.admitted_total
            t_urgent = time.monotonic()
            urgent = await start_job(st.client, spec_of("urgent", args, 10), task_queue=task_queue)
            urgent_submit_s = time.monotonic() - t_urgent
            slot_freed_s = admitted_s = None
            admitted_next = None
            while time.monotonic() - t_urgent < args.timeout:
                s = await scheduler_state(st.client)
                if s is not None:
                    now = time.monotonic() - t_urgent
                    if slot_freed_s is None and (before - set(s.holders)):
                        slot_freed_s = now
                    if urgent.id in s.holders:
                        admitted_s = now
                        admitted_next = s.admitted_total == admitted_before + 1
                        break
                await asyncio.sleep(POLL_S)
            first_step_s = None
            while admitted_s is not None and time.monotonic() - t_urgent < args.timeout:
                status = await urgent.query("status", result_type=JobStatus)
                if status.step >= 1:
                    first_step_s = time.monotonic() - t_urgent
                    break
                await asyncio.sleep(POLL_S)
            # How long until every job of the burst has asked (the ask rate at this N).
            all_asked_s = admitted_by_all_asked = None
            while time.monotonic() < deadline:
                final = await scheduler_state(st.client)
                # Each job that asked waits, or was admitted once (the urgent job too).
                if (
                    final is not None
                    and sum(final.waiting_in().values()) + final.admitted_total >= len(ids) + 1
                ):
                    all_asked_s = time.monotonic() - t0
                    admitted_by_all_asked = final.admitted_total
                    break
                await asyncio.sleep(2.0)
            final = await scheduler_state(st.client)
            report = {
                "n": n,
                "slots": args.slots,
                "steps": args.steps,
                "workers": args.workers,
                "worker_env": args.worker_env,
                "submitted_s": r3(submitted_s),
                "submit_s": summary(took, (50, 95), raw=False),
                "submit_errors": errors[:5],
                "waiting_s": r3(waiting_s),
                "waiting_when_urgent": sum(state.waiting_in().values()),
                # Jobs admitted while the burst was taken in: before the urgent job, and by
                # the time every job had asked (the slots kept busy meanwhile, or not).
                "admitted_when_urgent": admitted_before,
                "admitted_by_all_asked": admitted_by_all_asked,
                "urgent": {
                    "submit_s": r3(urgent_submit_s),
                    "slot_freed_s": None if slot_freed_s is None else r3(slot_freed_s),
                    "admitted_s": None if admitted_s is None else r3(admitted_s),
                    "first_step_s": None if first_step_s is None else r3(first_step_s),
                    "admitted_next": admitted_next,
                },
                "scheduler": None
                if final is None
                else {
                    "holders": len(final.holders),
                    "waiting": sum(final.waiting_in().values()),
                    "admitted_total": final.admitted_total,
                },
                "all_asked_s": None if all_asked_s is None else r3(all_asked_s),
                "load_average": [round(x, 2) for x in os.getloadavg()],
            }
            log(f"N={n}: {json.dumps(report)}")
            return report


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    runs = [await run_one(n, args) for n in args.n]
    return {
        "bench": "admission",
        "machine": machine(),
        "method": __doc__,
        "runs": runs,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default=",".join(map(str, DEFAULT_NS)), help="job counts")
    parser.add_argument("--slots", type=positive(int), default=4, help="trainer slots")
    parser.add_argument("--workers", type=positive(int), default=1, help="worker processes")
    parser.add_argument("--steps", type=positive(int), default=40, help="steps of each waiting job")
    parser.add_argument(
        "--submit-concurrency", type=positive(int), default=32, help="start calls in flight"
    )
    parser.add_argument("--timeout", type=positive(float), default=3600.0, help="seconds per wait")
    parser.add_argument(
        "--urgent-behind",
        type=positive(int),
        default=None,
        help="submit the urgent job once this many jobs wait (default: all N)",
    )
    parser.add_argument("--batch-size", type=positive(int), default=4, help="records per step")
    parser.add_argument("--step-ms", type=float, default=0.0, help="emulated GPU time per step")
    parser.add_argument("--log-level", default="WARNING", help="the worker's SHEPHERD_LOG_LEVEL")
    add_worker_env(parser)
    args = parser.parse_args(argv)
    args.n = [int(x) for x in args.n.split(",") if x.strip()]
    args.worker_env = parse_worker_env(parser, args.worker_env)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run_main(lambda: bench(args), lambda report: {"written": False, "note": "no plot"})


if __name__ == "__main__":
    main()
