"""Benchmark: what taking in a burst of new jobs costs, per job, while one job trains.

A fresh stack as bench/scale.py has it (the dev server on a SQLite file as ``shepherd dev``
runs it, localplane, one ``shepherd worker`` whose ``local`` profile declares ONE slot): one
long job is admitted and trains; the stack's CPU and the server's writes are measured for
``--baseline`` seconds (that job alone), then N jobs are submitted at once
(``--submit-concurrency`` start calls in flight) and the run waits until the scheduler has
every one of them waiting (none can be admitted: the slot stays held). Reported:

* ``cpu_ms_per_job``: each process's CPU milliseconds over the intake, less the baseline's
  rate over the same time, per job (the training job's own share taken out; the plane's
  figure is mostly that and may come out below zero);
* ``server_writes_per_job`` / ``server_reads_per_job``: the dev server's persistence
  operations (its Prometheus metrics), the baseline's rate taken out the same way;
* ``events_per_waiting_job``: the history length of a sample of the waiting jobs (every
  event is a server write's worth of work, or part of one);
* ``all_waiting_s``: from the first submission until every job waits in the scheduler.

What a job's intake is made of (a start, its first workflow tasks, its preflight, its ask)
moves these figures; the cost of the line itself (notices, checks) does not show in them.
Prints one JSON document on stdout (progress on stderr).

Run: ``.venv/bin/python bench/intake.py [--n 300]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shepherd.scheduling import SchedulerState

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from admission import scheduler_state, spec_of, submit
from common import log, machine, positive, r3, run_main, shepherd_stack
from scale import (
    BOOT_DELAY_S,
    ROUTE_LAG_S,
    CpuMeter,
    ServerWrites,
    WorkerProcess,
    free_port,
    read_histories,
    start_workers,
    stop_workers,
)

#: Waiting jobs whose histories are read for ``events_per_waiting_job``.
SAMPLE = 30
POLL_S = 0.5


async def until(
    client: Any, check: Callable[[SchedulerState], bool], timeout: float, what: str
) -> None:
    """Poll the scheduler's state until ``check`` holds (or fail after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = await scheduler_state(client)
        if state is not None and check(state):
            return
        await asyncio.sleep(POLL_S)
    raise RuntimeError(f"not {what} within {timeout:g} s")


def net_per_job(used: float, base_rate: float, seconds: float, n: int) -> float:
    """``used`` over the intake less the baseline's rate over as long, per job."""
    return (used - base_rate * seconds) / n


async def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.n
    plane_config = {"capacity": 1, "bootDelaySeconds": BOOT_DELAY_S, "routeLagSeconds": ROUTE_LAG_S}
    args.worker_env = {"SHEPHERD_BACKEND_LOCAL_SLOTS": "1"}
    with tempfile.TemporaryDirectory(prefix=f"shepherd-intake-{n}-") as tmp:
        run_dir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            metrics_port = free_port()
            st = await stack.enter_async_context(
                shepherd_stack(
                    plane_config,
                    db_filename=run_dir / "temporal.db",
                    server_args=["--metrics-port", str(metrics_port)],
                )
            )
            task_queue = f"intake-{uuid.uuid4().hex[:8]}"
            workers: list[WorkerProcess] = []
            stack.callback(stop_workers, workers)
            await start_workers(workers, st, 1, task_queue, run_dir, args)
            await submit(st.client, [spec_of("holder", args, 0)], task_queue, 1)
            await until(st.client, lambda s: bool(s.holders), args.timeout, "the holder admitted")
            url = f"http://127.0.0.1:{metrics_port}/metrics"

            async def measure(body: Any) -> tuple[float, dict[str, float], dict[str, Any]]:
                server, cpu = ServerWrites(url), CpuMeter(st, workers)
                await server.read()
                cpu.start()
                t = time.monotonic()
                await body()
                seconds = time.monotonic() - t
                used = cpu.stop()
                await server.read()
                return seconds, used, server.report(seconds)

            log(f"baseline: {args.baseline:g} s of the holder training alone")
            base_s, base_cpu, base_srv = await measure(lambda: asyncio.sleep(args.baseline))
            specs = [spec_of(f"wait-{i:05d}", args, 0) for i in range(n)]
            ids: list[str] = []

            async def intake() -> None:
                started, _, errors = await submit(
                    st.client, specs, task_queue, args.submit_concurrency
                )
                if errors:
                    raise RuntimeError(f"submissions failed: {errors[:3]}")
                ids.extend(started)
                await until(
                    st.client,
                    lambda s: sum(s.waiting_in().values()) >= n,
                    args.timeout,
                    f"{n} jobs waiting",
                )

            log(f"taking in {n} jobs")
            seconds, used, srv = await measure(intake)
            histories = await read_histories(st.client, ids[:SAMPLE])
            events = sorted(h.events for h in histories.values())
            return {
                "n": n,
                "all_waiting_s": r3(seconds),
                "cpu_ms_per_job": {
                    k: round(1000 * net_per_job(v, base_cpu[k] / base_s, seconds, n), 1)
                    for k, v in used.items()
                },
                "server_writes_per_job": round(
                    net_per_job(srv["writes"], base_srv["writes"] / base_s, seconds, n), 1
                ),
                "server_reads_per_job": round(
                    net_per_job(srv["reads"], base_srv["reads"] / base_s, seconds, n), 1
                ),
                "events_per_waiting_job": {
                    "sampled": len(events),
                    "min": events[0] if events else None,
                    "max": events[-1] if events else None,
                },
                "server_top_writes": srv["top_writes"],
                "baseline": {"seconds": r3(base_s), "cpu_s": base_cpu},
            }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    return {"bench": "intake", "machine": machine(), "method": __doc__, "run": await run(args)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=positive(int), default=300, help="jobs taken in")
    parser.add_argument(
        "--baseline", type=positive(float), default=15.0, help="seconds of the holder alone"
    )
    parser.add_argument(
        "--submit-concurrency", type=positive(int), default=32, help="start calls in flight"
    )
    parser.add_argument("--batch-size", type=positive(int), default=4, help="records per step")
    parser.add_argument("--step-ms", type=float, default=50.0, help="emulated GPU time per step")
    parser.add_argument("--steps", type=positive(int), default=100_000, help="steps of each job")
    parser.add_argument("--log-level", default="WARNING", help="the worker's SHEPHERD_LOG_LEVEL")
    parser.add_argument("--timeout", type=positive(float), default=600.0, help="seconds per wait")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run_main(lambda: bench(args), lambda report: {"written": False, "note": "no plot"})


if __name__ == "__main__":
    main()
