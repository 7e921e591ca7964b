"""Benchmark: many jobs queued against a few trainer slots — do the GPUs stay busy?

For each ``--n`` (default 20, 100, 300, 1000, 2000) a fresh stack is started: the Temporal dev
server (``shepherd.binaries.temporal()``) on a SQLite *file* in a temp dir, localplane with
``--slots`` trainer slots (4), and ``--workers`` Shepherd workers (1) as separate processes
started the way production starts them (``shepherd worker``, configured by env: Temporal
address, task queue, the ``local`` backend profile with the plane's URL and key, events on).
N jobs (the built-in ``supervised`` loop on ``synthetic:text``, 20 steps, a checkpoint every
10, promote none) are submitted at t0 as fast as possible (``shepherd.jobs.start_job``,
``--submit-concurrency`` at a time) and the run ends when every workflow has closed, or
after ``--timeout`` seconds. Then the histories and the platform's event stream are read
(after the run, so reading them does not load the run) and turned into the columns of
issue 8's table:

    jobs | drained | jobs/min | slot held per job (p50) | slot freed → next job training
    (p50 / p95) | new workflow's first task waits (p50) | worker RSS

plus jobs completed and failed, trainers created (the plane's ``creates``: N when no trainer
was created twice), live trainers at the end (0 when none leaked), the event bridge's
delivery lag and each activity type's queue wait (scheduled → started). ``method`` in the
JSON defines every figure. ``--kill-worker-after S`` SIGKILLs the first of several workers
S seconds into each run (the issue's "SIGKILL one during a 1,000-job run and every job
still completes, each trainer created once").

Prints one JSON document on stdout (progress goes to stderr) and writes a PNG plot to
``--out`` (slot freed → next training p50/p95, and jobs/min, against N) when matplotlib is
importable.

Run: ``.venv/bin/python bench/scale.py [--n 20,100,300,1000,2000] [--slots 4] [--workers 1]
[--timeout S | S1,S2,...] [--kill-worker-after S] [--out bench/out/scale.png]``; a smoke run:
``--n 8 --timeout 120``; the kill test: ``--n 1000 --workers 3 --kill-worker-after 120``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from shepherd import search_attributes as sa
from shepherd.jobs import WORKFLOW_TYPE, start_job
from shepherd.platform.models import JobEvent
from shepherd.spec import JobSpec
from shepherd.states import JobState

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from common import (
    KEY_ENV,
    EventLog,
    Stack,
    cpu_times,
    log,
    machine,
    no_plot,
    pace_ms,
    positive,
    pyplot,
    r3,
    run_main,
    save_plot,
    shepherd_stack,
    steal_pct,
    summary,
    supervised_settings,
    supervised_spec,
)

DEFAULT_NS = (20, 100, 300, 1000, 2000)
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "scale.png"
#: The plane's defaults, stated so the report records them: no boot delay beyond the
#: trainer process start, each gateway replica learns a route 0-0.3 s after RUNNING.
BOOT_DELAY_S = 0.0
ROUTE_LAG_S = {"min": 0.0, "max": 0.3}
#: The job of the issue: 20 steps, a checkpoint every 10, promote none.
STEPS = 20
EVERY = 10

#: The activity whose start is a job's first training call (it sends the first
#: forward_backward without another round trip through Temporal).
TRAINING_ACTIVITY = "train_chunk"
#: The activity that opens the model on a started trainer (and warms its route up): its run
#: is the trainer's own work, inside Shepherd's part of a handover.
OPEN_ACTIVITY = "open_model"
#: The signal the event bridge delivers platform events with.
EVENT_SIGNAL = "platform_event"
#: A trainer holds a slot from the plane's grant (CREATING) until it leaves these states.
HOLDING = {JobState.CREATING, JobState.RUNNING, JobState.DELETING}

HISTORY_CONCURRENCY = 8
RSS_SAMPLE_S = 0.5
PROGRESS_S = 10.0
DRAIN_POLL_S = 1.0
WORKER_READY_TIMEOUT_S = 90.0
WORKER_STOP_TIMEOUT_S = 15.0
#: After the last workflow closed, its trainer may still be exiting (DELETING → DELETED).
LIVE_SETTLE_S = 15.0

#: Issue 8's targets (this 2-core machine, dev server, 4 slots).
TARGET_N_ALL_COMPLETE = 2000
TARGET_FREED_P95_S = 2.0
#: Issue 8 asked for 0.8 of N = 20's jobs/min at N = 1,000; issue 31 (admission on) for 0.9.
TARGET_JPM_N, TARGET_JPM_BASE_N, TARGET_JPM_RATIO = 1000, 20, 0.9
TARGET_RSS_N, TARGET_RSS_MIB = 2000, 1024.0


T = TypeVar("T", int, float)


def secs(t: datetime, t0: datetime) -> float:
    return (t - t0).total_seconds()


def stats_of(samples: Sequence[float]) -> dict[str, Any]:
    return summary(samples, (50, 95), raw=False)


# ---------------------------------------------------------------------------- workers


def _die_with_parent() -> None:
    """In the child: SIGTERM when the benchmark dies without cleaning up (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class WorkerProcess:
    index: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    killed_at_s: float | None = None
    #: CPU seconds just before a SIGKILL (the process's counters go with it).
    cpu_at_kill: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


def worker_settings(
    st: Stack, task_queue: str, log_level: str, extra: dict[str, str]
) -> dict[str, str]:
    """The environment a production worker reads (workers/config.py, shepherd/temporal.py,
    workers/main.py), with ``extra`` (``--worker-env``) over it: the one place to change
    when the worker grows settings."""
    return {
        "TEMPORAL_ADDRESS": st.client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": st.client.namespace,
        "SHEPHERD_TASK_QUEUE": task_queue,
        "SHEPHERD_BACKENDS": "local",
        "SHEPHERD_BACKEND_LOCAL_URL": st.plane.url,
        "SHEPHERD_BACKEND_LOCAL_ACCOUNT": st.account_id,
        "SHEPHERD_BACKEND_LOCAL_API_KEY_ENV": KEY_ENV,
        "SHEPHERD_BACKEND_LOCAL_EVENTS": "true",
        "SHEPHERD_LOG_FORMAT": "json",
        "SHEPHERD_LOG_LEVEL": log_level,
        **extra,
    }


def worker_sizing(extra: dict[str, str]) -> dict[str, Any] | None:
    """The sizing the workers run with (``workers.main.WorkerSizing`` from their env), for
    the report; None where this version of the worker has no such settings."""
    try:
        from workers.main import WorkerSizing

        return dataclasses.asdict(WorkerSizing.from_env(extra))
    except (ImportError, AttributeError, TypeError, ValueError, SystemExit):
        return None


def worker_command(ready: Path) -> list[str]:
    """``shepherd worker``, as production runs it."""
    return [sys.executable, "-m", "shepherd.cli.main", "worker", "--ready-file", str(ready)]


def spawn_worker(index: int, env: dict[str, str], run_dir: Path) -> WorkerProcess:
    log_path = run_dir / f"worker-{index}.log"
    with open(log_path, "ab") as out:  # the child keeps its own copy of the fd
        proc = subprocess.Popen(
            worker_command(run_dir / f"worker-{index}.ready"),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            # Ctrl-C on the terminal is the benchmark's to handle: it stops the workers.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    return WorkerProcess(index, proc, log_path)


async def start_workers(
    workers: list[WorkerProcess],
    st: Stack,
    count: int,
    task_queue: str,
    run_dir: Path,
    args: argparse.Namespace,
) -> None:
    """Start ``count`` worker processes on ``task_queue`` into ``workers`` and wait until
    each polls. The caller stops them (:func:`stop_workers`), also when this fails."""
    settings = worker_settings(st, task_queue, args.log_level, args.worker_env)
    # The benchmark's own SHEPHERD_*/TEMPORAL_* settings must not leak into the workers.
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SHEPHERD_", "TEMPORAL_"))}
    env = {**base, **settings, KEY_ENV: st.api_key}
    for i in range(count):
        workers.append(spawn_worker(i, env, run_dir))
    deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
    for w in workers:
        ready = run_dir / f"worker-{w.index}.ready"
        while not ready.exists():
            if not w.alive():
                raise RuntimeError(
                    f"worker {w.index} exited with {w.proc.returncode}:\n{tail(w.log_path)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker {w.index} not polling after {WORKER_READY_TIMEOUT_S:g} s"
                )
            await asyncio.sleep(0.1)
    log(f"{count} worker(s) polling {task_queue!r}: pids {[w.pid for w in workers]}")


def stop_workers(workers: Iterable[WorkerProcess]) -> None:
    """SIGTERM all (a worker shuts down gracefully), then SIGKILL what is left."""
    workers = list(workers)
    for w in workers:
        if w.alive():
            w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
    for w in workers:
        try:
            w.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ------------------------------------------------------------------------- processes


def children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    return out


def process_tree(pid: int) -> list[int]:
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children(p)
    return tree


def rss_kib(pid: int) -> int:
    """VmRSS of one process (0 when it is gone or a zombie)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> tuple[float, float]:
    """(its own user+system CPU seconds, those of its children it has reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    # Fields 14-17 of proc(5): utime, stime, cutime, cstime (fields[0] is field 3).
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def temporal_pid() -> int | None:
    """The dev server: a child process of this one running the ``temporal`` binary."""
    for pid in process_tree(os.getpid())[1:]:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as f:
            if f.read().strip() == "temporal":
                return pid
    return None


# ------------------------------------------------------------------ split cores

#: With --split-cores: the platform (localplane and the trainers it starts) on one CPU,
#: Shepherd (the Temporal server, the workers, this benchmark) on the other.
PLATFORM_CPU, SHEPHERD_CPU = 1, 0


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (Linux affinity is per thread; threads and
    processes started later inherit their creator's)."""
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(tid), cpus)


class ResourceSampler:
    """The workers' resident memory (VmRSS, each worker with its child processes, if any),
    sampled every ``RSS_SAMPLE_S``; the maxima are the report's figures."""

    def __init__(self, workers: list[WorkerProcess]) -> None:
        self.workers = workers
        self.max_kib = [0] * len(workers)
        self.max_total_kib = 0
        self.samples = 0

    def sample(self) -> int:
        total = 0
        for w in self.workers:
            if w.alive():
                kib = sum(rss_kib(p) for p in process_tree(w.pid))
                self.max_kib[w.index] = max(self.max_kib[w.index], kib)
                total += kib
        self.max_total_kib = max(self.max_total_kib, total)
        self.samples += 1
        return total

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(RSS_SAMPLE_S)


class CpuMeter:
    """CPU seconds each part of the stack used between :meth:`start` and :meth:`stop`."""

    def __init__(self, st: Stack, workers: list[WorkerProcess]) -> None:
        assert st.plane.proc is not None
        self.parts: dict[str, int | None] = {"temporal": temporal_pid(), "plane": st.plane.proc.pid}
        self.workers = workers
        self._start: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        now: dict[str, float] = {}
        for name, pid in self.parts.items():
            own, reaped = cpu_s(pid) if pid else (0.0, 0.0)
            now[name] = own
            if name == "plane":
                now["trainers"] = reaped  # the plane waits for (reaps) its trainer processes
        now["workers"] = sum(
            w.cpu_at_kill if w.cpu_at_kill is not None else sum(cpu_s(w.pid)) for w in self.workers
        )
        t = os.times()
        now["benchmark"] = t.user + t.system
        return now

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, float]:
        end = self._read()
        return {k: r3(end[k] - self._start.get(k, 0.0)) for k in end}


# -------------------------------------------------------------- the server's writes

#: Persistence operations that write (the rest read): Temporal's operation names.
_WRITE_PREFIXES = (
    "Create",
    "Update",
    "Upsert",
    "Delete",
    "Append",
    "Complete",
    "RangeComplete",
    "RangeDelete",
    "ConflictResolve",
    "Record",
    "Set",
    "Put",
    "Save",
    "Fork",
    "Trim",
    "Add",
    "Insert",
)
_OP_METRIC = "persistence_latency_count{"


def persistence_ops(text: str) -> Counter[str]:
    """Persistence operations done so far, by operation, from the server's Prometheus text
    (one ``persistence_latency`` observation per operation)."""
    ops: Counter[str] = Counter()
    for line in text.splitlines():
        if not line.startswith(_OP_METRIC):
            continue
        labels, _, value = line.rpartition("} ")
        op = labels.partition('operation="')[2].partition('"')[0]
        with contextlib.suppress(ValueError):
            ops[op] += int(float(value))
    return ops


def is_write(op: str) -> bool:
    return op.startswith(_WRITE_PREFIXES)


class ServerWrites:
    """The dev server's persistence operations over the run (its ``/metrics``): the total
    by operation, and the write rate per progress interval (the peak is its ceiling)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.first: Counter[str] | None = None
        self.last: Counter[str] | None = None
        self._last_at = 0.0
        self.rates: list[float] = []

    async def read(self) -> None:
        try:
            async with httpx.AsyncClient(timeout=10.0) as http:
                text = (await http.get(self.url)).text
        except httpx.HTTPError as exc:
            log(f"server metrics not read: {type(exc).__name__}")
            return
        now, ops = time.monotonic(), persistence_ops(text)
        if self.last is not None and now > self._last_at:
            written = sum(v for k, v in (ops - self.last).items() if is_write(k))
            self.rates.append(written / (now - self._last_at))
        if self.first is None:
            self.first = ops
        self.last, self._last_at = ops, now

    def report(self, seconds: float) -> dict[str, Any]:
        if self.first is None or self.last is None:
            return {"read": False}
        done = self.last - self.first
        writes = sum(v for k, v in done.items() if is_write(k))
        return {
            "writes": writes,
            "writes_per_s": round(writes / seconds, 1) if seconds > 0 else None,
            "writes_per_s_peak": round(max(self.rates), 1) if self.rates else None,
            "reads": sum(v for k, v in done.items() if not is_write(k)),
            "top_writes": dict(
                Counter({k: v for k, v in done.items() if is_write(k)}).most_common(8)
            ),
            "top_reads": dict(
                Counter({k: v for k, v in done.items() if not is_write(k)}).most_common(8)
            ),
        }


# -------------------------------------------------------------------------- the run


def job_spec(name: str, args: argparse.Namespace) -> JobSpec:
    settings = supervised_settings(steps=STEPS, batch_size=args.batch_size)
    return supervised_spec(name, settings, args.step_ms, {"every_steps": EVERY})


def job_name(i: int) -> str:
    return f"scale-{i:05d}"


def owners(histories: Iterable[History]) -> dict[str, History | None]:
    """Trainer job id -> the history of the workflow that owns it: the trainer ids each
    workflow recorded in its search attributes (whatever scheme shepherd.trainer_ids uses).
    :func:`owner_by_prefix` is the fallback for a trainer no workflow recorded."""
    out: dict[str, History | None] = {}
    for h in histories:
        for trainer in h.trainers:
            out[trainer] = h
    return out


def owner_by_prefix(
    trainer_job_id: str, histories: dict[str, History], names: dict[str, str]
) -> History | None:
    """The workflow whose id (or job name) is the longest prefix of the trainer id."""
    best: tuple[int, History] | None = None
    for wid, h in histories.items():
        for prefix in (wid, names.get(wid)):
            longer = best is None or len(prefix or "") > best[0]
            if prefix and longer and trainer_job_id.startswith(prefix + "-"):
                best = (len(prefix), h)
    return None if best is None else best[1]


async def submit_all(
    client: Client, specs: list[JobSpec], task_queue: str, concurrency: int
) -> tuple[dict[str, str], list[str]]:
    """Start every job at once (``concurrency`` start calls in flight): name -> workflow id,
    and the errors of starts that failed."""
    gate = asyncio.Semaphore(concurrency)

    async def one(spec: JobSpec) -> tuple[str, str]:
        async with gate:
            handle = await start_job(client, spec, task_queue=task_queue)
            return spec.name, handle.id

    results = await asyncio.gather(*(one(s) for s in specs), return_exceptions=True)
    started = dict(r for r in results if isinstance(r, tuple))
    errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return started, errors


async def closed_count(client: Client) -> int:
    query = f"WorkflowType = '{WORKFLOW_TYPE}' AND ExecutionStatus != 'Running'"
    return (await client.count_workflows(query)).count


async def kill_later(workers: list[WorkerProcess], after_s: float, t0: float) -> None:
    await asyncio.sleep(max(0.0, after_s - (time.monotonic() - t0)))
    victim = workers[0]
    victim.cpu_at_kill = sum(cpu_s(victim.pid))
    os.kill(victim.pid, signal.SIGKILL)
    victim.killed_at_s = time.monotonic() - t0
    log(f"SIGKILLed worker 0 (pid {victim.pid}) at {victim.killed_at_s:.1f} s")


def progress_line(
    n: int,
    elapsed: float,
    closed: int,
    events: EventLog,
    rss_kib: int,
    server: ServerWrites,
    steal: float | None = None,
) -> str:
    states = Counter(s.short for s in events.states().values())
    plane = ", ".join(f"{k} {v}" for k, v in sorted(states.items()))
    rate = f"{server.rates[-1]:.0f}/s" if server.rates else "?"
    stolen = "" if steal is None else f"; CPU stolen {steal:.0f} %"
    return (
        f"N={n} t={elapsed:.0f}s: {closed}/{n} closed; trainers: {plane or 'none yet'}; "
        f"workers RSS {rss_kib / 1024:.0f} MiB; server writes {rate}{stolen}"
    )


async def run_one(n: int, timeout_s: float, args: argparse.Namespace) -> dict[str, Any]:
    """One N on a fresh stack; every process started here is stopped before returning."""
    plane_config = {
        "capacity": args.slots,
        "bootDelaySeconds": BOOT_DELAY_S,
        "routeLagSeconds": ROUTE_LAG_S,
    }
    log(f"=== N={n}: {args.workers} worker(s), {args.slots} slots, timeout {timeout_s:g} s")
    with tempfile.TemporaryDirectory(prefix=f"shepherd-scale-{n}-") as tmp:
        run_dir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            metrics_port = free_port()
            if args.split_cores:
                # Everything the stack starts inherits this, the plane's trainers included;
                # the server and this process move to Shepherd's CPU once it is up.
                everything = os.sched_getaffinity(0)
                stack.callback(pin, os.getpid(), everything)
                pin(os.getpid(), {PLATFORM_CPU})
            st = await stack.enter_async_context(
                shepherd_stack(
                    plane_config,
                    db_filename=run_dir / "temporal.db",
                    server_args=["--metrics-port", str(metrics_port)],
                )
            )
            if args.split_cores:
                server_pid = temporal_pid()
                if server_pid is None:
                    raise RuntimeError("--split-cores: the Temporal server's process not found")
                pin(server_pid, {SHEPHERD_CPU})
                pin(os.getpid(), {SHEPHERD_CPU})  # the workers start below and inherit it
            server = ServerWrites(f"http://127.0.0.1:{metrics_port}/metrics")
            if args.logs:
                stack.callback(keep_logs, run_dir, st, args.logs / f"n{n}")
            events = EventLog()
            follower = asyncio.create_task(events.follow(st.platform))
            stack.push_async_callback(cancel, follower)
            task_queue = f"scale-{uuid.uuid4().hex[:8]}"
            workers: list[WorkerProcess] = []
            stack.callback(stop_workers, workers)  # the list fills below
            await start_workers(workers, st, args.workers, task_queue, run_dir, args)
            sampler = ResourceSampler(workers)
            stack.push_async_callback(cancel, asyncio.create_task(sampler.run()))
            cpu = CpuMeter(st, workers)
            specs = [job_spec(job_name(i), args) for i in range(n)]
            load_before = [round(x, 2) for x in os.getloadavg()]
            pace_before = pace_ms()
            ticks_before = cpu_times()

            cpu.start()
            await server.read()
            t0_wall = datetime.now(UTC)
            t0 = time.monotonic()
            started, submit_errors = await submit_all(
                st.client, specs, task_queue, args.submit_concurrency
            )
            submitted_s = time.monotonic() - t0
            log(f"N={n}: {len(started)} workflows started in {submitted_s:.1f} s")
            killer = None
            if args.kill_worker_after is not None:
                killer = asyncio.create_task(kill_later(workers, args.kill_worker_after, t0))
                stack.push_async_callback(cancel, killer)

            drained = False
            next_progress = PROGRESS_S
            ticks = ticks_before
            while True:
                # Closed, not "none running": visibility may not list a just-started one yet.
                closed = await closed_count(st.client)
                elapsed = time.monotonic() - t0
                if closed >= len(started):
                    drained = True
                    break
                if elapsed >= timeout_s:
                    break
                if elapsed >= next_progress:
                    await server.read()
                    ticks, last_ticks = cpu_times(), ticks
                    stolen = steal_pct(last_ticks, ticks)
                    log(progress_line(n, elapsed, closed, events, sampler.sample(), server, stolen))
                    next_progress += PROGRESS_S
                for w in workers:
                    if not w.alive() and w.killed_at_s is None:
                        raise RuntimeError(
                            f"worker {w.index} exited with {w.proc.returncode}:\n{tail(w.log_path)}"
                        )
                await asyncio.sleep(DRAIN_POLL_S)
            end_s = time.monotonic() - t0
            cpu_used = cpu.stop()
            await server.read()
            load_after = [round(x, 2) for x in os.getloadavg()]
            steal = steal_pct(ticks_before, cpu_times())
            pace_after = pace_ms()
            log(f"N={n}: {'drained' if drained else 'NOT drained'} after {end_s:.1f} s")
            if killer is not None and not killer.done():
                killer.cancel()

            live, settle_s = await live_trainers(st, wait=drained)
            plane_stats = await st.admin.stats()
            executions = await list_executions(st.client)
            log(f"N={n}: reading {len(executions)} workflow histories")
            histories = await read_histories(st.client, [e["id"] for e in executions])
            faults = await st.admin.faults()

            report = analyse(
                n=n,
                t0=t0_wall,
                end_s=end_s,
                drained=drained,
                timeout_s=timeout_s,
                started=started,
                executions=executions,
                histories=histories,
                events=list(events.events),
                plane_stats=plane_stats,
                capacity=args.slots,
            )
            report.update(
                submitted_s=r3(submitted_s),
                submit_errors=submit_errors[:10],
                submit_error_count=len(submit_errors),
                live_trainers_end=live,
                live_trainers_settle_s=settle_s,
                workers=[
                    {
                        "index": w.index,
                        "pid": w.pid,
                        "max_rss_mib": round(sampler.max_kib[w.index] / 1024, 1),
                        "killed_at_s": None if w.killed_at_s is None else r3(w.killed_at_s),
                        "exit_code": w.proc.poll(),
                    }
                    for w in workers
                ],
                worker_rss_max_mib=round(max(sampler.max_kib) / 1024, 1),
                workers_rss_total_max_mib=round(sampler.max_total_kib / 1024, 1),
                rss_samples=sampler.samples,
                kill=kill_record(args, workers),
                cpu_s=cpu_used,
                temporal_persistence=server.report(end_s),
                load_average_before_after=[load_before, load_after],
                cpu_steal_pct=steal,
                machine_pace_ms=[pace_before, pace_after],
                plane_config=faults,
                task_queue=task_queue,
                # Names only: the key's value stays out of the report.
                worker_env=sorted(
                    [*worker_settings(st, task_queue, args.log_level, args.worker_env), KEY_ENV]
                ),
            )
            report["row"]["worker_rss_mib"] = report["worker_rss_max_mib"]
            report["ok"] = {
                "all_completed": report["completed"] == n,
                "none_failed": report["failed"] == 0,
                "each_trainer_created_once": report["trainers_created"] == n
                and report["jobs_with_several_trainers"] == 0,
                "no_live_trainer_left": live == 0,
            }
            log(f"N={n}: {json.dumps(report['row'])}")
            return report


def kill_record(args: argparse.Namespace, workers: list[WorkerProcess]) -> dict[str, Any] | None:
    if args.kill_worker_after is None:
        return None
    victim = workers[0]
    return {
        "requested_after_s": args.kill_worker_after,
        "worker_index": 0,
        "pid": victim.pid,
        "killed_at_s": None if victim.killed_at_s is None else r3(victim.killed_at_s),
        "note": None if victim.killed_at_s is not None else "the run ended before the kill",
    }


async def cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def keep_logs(run_dir: Path, st: Stack, dest: Path) -> None:
    """Copy the workers', the plane's and the trainers' logs out of the temp dir."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in run_dir.glob("worker-*.log"):
        shutil.copy(f, dest / f.name)
    with contextlib.suppress(OSError):
        shutil.copy(st.plane.log_path, dest / "plane.log")
    log(f"logs kept in {dest}")


async def live_trainers(st: Stack, *, wait: bool) -> tuple[int, float]:
    """Trainers alive now; after a drain, given up to ``LIVE_SETTLE_S`` to finish exiting
    (a workflow completes once its delete is accepted, the process exits just after)."""
    start = time.monotonic()
    while True:
        live = int((await st.admin.stats())["liveTrainers"])
        waited = time.monotonic() - start
        if live == 0 or not wait or waited >= LIVE_SETTLE_S:
            return live, r3(waited)
        await asyncio.sleep(0.2)


async def list_executions(client: Client) -> list[dict[str, Any]]:
    out = []
    async for ex in client.list_workflows(f"WorkflowType = '{WORKFLOW_TYPE}'"):
        out.append(
            {
                "id": ex.id,
                "status": ex.status.name if ex.status else None,
                "start_time": ex.start_time,
                "close_time": ex.close_time,
            }
        )
    return out


# ------------------------------------------------------------------------ histories


@dataclass
class History:
    """What one workflow's history says about the figures."""

    workflow_id: str
    first_task_wait_s: float | None = None
    #: When its first workflow task started (the worker took the job in).
    first_task_at: datetime | None = None
    #: Start times of every recorded ``TRAINING_ACTIVITY`` attempt, ascending.
    training_starts: list[datetime] = field(default_factory=list)
    #: (started, completed) of every ``OPEN_ACTIVITY`` attempt that completed.
    opens: list[tuple[datetime, datetime]] = field(default_factory=list)
    #: Activity type -> scheduled→started of first attempts (queue wait), seconds.
    queue_waits: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    #: Bridge deliveries: (trainer id, platform event id, state, lag seconds).
    deliveries: list[tuple[str, int, str, float]] = field(default_factory=list)
    #: Every trainer job id the workflow upserted (its ShepherdTrainerJobId attribute).
    trainers: set[str] = field(default_factory=set)
    result: dict[str, Any] | None = None
    failure: str | None = None
    events: int = 0


def _t(e: Any) -> datetime:
    return e.event_time.ToDatetime(tzinfo=UTC)


async def read_history(client: Client, workflow_id: str) -> History:
    h = History(workflow_id)
    wft_scheduled: dict[int, datetime] = {}
    scheduled: dict[int, tuple[str, datetime]] = {}
    opening: dict[int, datetime] = {}  # OPEN_ACTIVITY's start, by its scheduled event
    async for e in client.get_workflow_handle(workflow_id).fetch_history_events():
        h.events += 1
        kind = e.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED and not wft_scheduled:
            wft_scheduled[e.event_id] = _t(e)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and h.first_task_wait_s is None:
            at = wft_scheduled.get(e.workflow_task_started_event_attributes.scheduled_event_id)
            if at is not None:
                h.first_task_wait_s = (_t(e) - at).total_seconds()
                h.first_task_at = _t(e)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[e.event_id] = (name, _t(e))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = e.activity_task_started_event_attributes
            name, at = scheduled.get(attrs.scheduled_event_id, ("?", _t(e)))
            if attrs.attempt == 1:  # a retry's start is its backoff after the scheduled time
                h.queue_waits[name].append((_t(e) - at).total_seconds())
            if name == TRAINING_ACTIVITY:
                h.training_starts.append(_t(e))
            elif name == OPEN_ACTIVITY:
                opening[attrs.scheduled_event_id] = _t(e)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            began = opening.get(e.activity_task_completed_event_attributes.scheduled_event_id)
            if began is not None:
                h.opens.append((began, _t(e)))
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            sig = e.workflow_execution_signaled_event_attributes
            if sig.signal_name == EVENT_SIGNAL and sig.input.payloads:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    data = json.loads(sig.input.payloads[0].data)
                    happened = datetime.fromisoformat(data["event_time"])
                    h.deliveries.append(
                        (
                            data["trainer_job_id"],
                            int(data.get("event_id", 0)),
                            str(data["state"]),
                            (_t(e) - happened).total_seconds(),
                        )
                    )
        elif kind == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes
            payload = fields.indexed_fields.get(sa.TRAINER_JOB_ID.name)
            if payload is not None and payload.data:
                with contextlib.suppress(ValueError):
                    value = json.loads(payload.data)
                    if isinstance(value, str) and value:
                        h.trainers.add(value)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            payloads = e.workflow_execution_completed_event_attributes.result.payloads
            with contextlib.suppress(ValueError, IndexError):
                h.result = json.loads(payloads[0].data)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            h.failure = e.workflow_execution_failed_event_attributes.failure.message[:300]
    h.training_starts.sort()
    return h


async def read_histories(client: Client, ids: list[str]) -> dict[str, History]:
    gate = asyncio.Semaphore(HISTORY_CONCURRENCY)

    async def one(wid: str) -> History:
        async with gate:
            return await read_history(client, wid)

    return {h.workflow_id: h for h in await asyncio.gather(*(one(w) for w in ids))}


# ------------------------------------------------------------------------- analysis


@dataclass
class Slot:
    """One trainer's tenure of a capacity slot, in seconds since t0."""

    trainer_job_id: str
    placed: float
    running: float | None = None
    freed: float | None = None


@dataclass
class Handover:
    """A freed slot and the trainer the plane placed in it next."""

    freed: float
    slot: Slot


def slot_timeline(events: Iterable[JobEvent], t0: datetime) -> tuple[list[Slot], list[Handover]]:
    """Every slot tenure, and each freed slot paired with the next placement.

    The plane grants free slots first come first served, so the k-th placement that finds
    no slot free of an earlier grant fills the oldest slot freed and not yet refilled: frees
    and placements are paired in time order. A free with no later placement (the last ones
    of a run) pairs with nothing; the first placements (into never-used slots) neither."""
    holding: dict[str, Slot] = {}
    slots: list[Slot] = []
    handovers: list[Handover] = []
    freed: deque[float] = deque()
    for e in sorted(events, key=lambda e: e.id):
        t = secs(e.event_time, t0)
        slot = holding.get(e.job_id)
        if slot is None:
            if e.state is JobState.CREATING:  # the plane granted a slot
                slot = holding[e.job_id] = Slot(e.job_id, placed=t)
                slots.append(slot)
                if freed:
                    handovers.append(Handover(freed.popleft(), slot))
        elif e.state is JobState.RUNNING and slot.running is None:
            slot.running = t
        elif e.state not in HOLDING:  # DELETED, FAILED, ...: the trainer process has exited
            slot.freed = t
            del holding[e.job_id]
            freed.append(t)
    return slots, handovers


def first_training(slot: Slot, owner: History | None, t0: datetime) -> float | None:
    """The trainer's first training call: the first ``TRAINING_ACTIVITY`` start of its
    workflow at or after the trainer was placed (seconds since t0)."""
    if owner is None:
        return None
    for start in owner.training_starts:
        t = secs(start, t0)
        if t >= slot.placed:
            return t
    return None


def model_open(slot: Slot, owner: History | None, first: float, t0: datetime) -> float | None:
    """How long the trainer took to open its model after it was RUNNING, before its first
    training call (the last ``OPEN_ACTIVITY`` run between its placement and that call, from
    its start or from RUNNING, whichever came later: the open starts at the placement and
    waits out the boot), seconds."""
    if owner is None or slot.running is None:
        return None
    running = slot.running
    runs = [
        (secs(end, t0), max(0.0, secs(end, t0) - max(secs(began, t0), running)))
        for began, end in owner.opens
        if secs(began, t0) >= slot.placed and secs(end, t0) <= first
    ]
    return max(runs)[1] if runs else None


def jobs_per_minute(closes: list[float], end_s: float, slots: int) -> dict[str, float | None]:
    """Completions per minute, three ways.

    ``steady`` (the table's figure): completions after the ``slots``-th per minute, from the
    ``slots``-th completion to the last. All slots start together at t0, so the first
    ``slots`` completions close one cycle of every slot at once; from there each completion
    is one more cycle of some slot, and the window holds whole cycles at any N.
    ``first_to_last``: completions after the first, first to last completion. It counts
    the first wave's other ``slots - 1`` completions without their cycle, which overstates
    small runs (N = 20 on 4 slots: 19 completions in the time of 16, +19 %) and barely
    touches large ones (N = 1,000: +0.3 %).
    ``full_pipeline``: as ``steady``, but to the ``N - slots``-th completion, after which
    no job is left to start and the last ``slots`` run as the machine empties.
    ``overall``: completions per minute from t0 to the end of the run (adds one job's
    latency at the start). None where the window holds no completion."""
    closes = sorted(closes)

    def rate(lo: int, hi: int) -> float | None:
        """Completions after the ``lo``-th up to the ``hi``-th (0-based), per minute."""
        if hi <= lo or closes[hi] <= closes[lo]:
            return None
        return round((hi - lo) / ((closes[hi] - closes[lo]) / 60), 1)

    last, first_wave = len(closes) - 1, max(0, slots - 1)
    return {
        "steady": rate(first_wave, last),
        # The last wave: after the (N - slots)-th completion no job is left to start, and
        # the last jobs run on a machine with fewer and fewer others (a quarter of N = 20's
        # window).
        "full_pipeline": rate(first_wave, len(closes) - slots - 1),
        "first_to_last": rate(0, last),
        "overall": round(len(closes) / (end_s / 60), 1) if end_s > 0 else None,
    }


def window_rate(closes: list[float], start: float | None, end: float | None) -> float | None:
    """Completions per minute from ``start`` to ``end`` (None: the last completion)."""
    if start is None:
        return None
    inside = [c for c in closes if c >= start and (end is None or c <= end)]
    stop = end if end is not None else max(inside, default=None)
    if stop is None or stop <= start:
        return None
    return round(len(inside) / ((stop - start) / 60), 1)


def by_minute(closes: list[float]) -> list[int]:
    """Completions in each minute from t0."""
    if not closes:
        return []
    counts = [0] * (int(max(closes) // 60) + 1)
    for c in closes:
        counts[int(c // 60)] += 1
    return counts


def analyse(
    *,
    n: int,
    t0: datetime,
    end_s: float,
    drained: bool,
    timeout_s: float,
    started: dict[str, str],
    executions: list[dict[str, Any]],
    histories: dict[str, History],
    events: list[JobEvent],
    plane_stats: dict[str, Any],
    capacity: int,
) -> dict[str, Any]:
    wid_to_name = {wid: name for name, wid in started.items()}
    owner_of = owners(histories.values())

    def owner(trainer_job_id: str) -> History | None:
        if trainer_job_id not in owner_of:
            owner_of[trainer_job_id] = owner_by_prefix(trainer_job_id, histories, wid_to_name)
        return owner_of[trainer_job_id]

    # Outcomes: the workflow's status and, for a completed one, the job's own phase.
    completed, failed, other = 0, 0, 0
    closes: list[float] = []
    failures: Counter[str] = Counter()
    for ex in executions:
        h = histories.get(ex["id"])
        phase = (h.result or {}).get("phase") if h else None
        if ex["status"] == "COMPLETED" and phase == "COMPLETED":
            completed += 1
            if ex["close_time"] is not None:
                closes.append(secs(ex["close_time"], t0))
        elif ex["status"] == "RUNNING":
            other += 1
        else:
            failed += 1
            failures[(h.failure if h and h.failure else f"{ex['status']} / phase {phase}")] += 1
    last_close = max(closes) if closes else None
    drained_s = last_close if drained and last_close is not None else None

    slots, handovers = slot_timeline(events, t0)
    held = [s.freed - s.placed for s in slots if s.freed is not None]
    gaps, plane_part, boot_part, shepherd_part = [], [], [], []
    opening_part, orchestration_part = [], []
    not_yet = 0
    for ho in handovers:
        trainer_owner = owner(ho.slot.trainer_job_id)
        first = first_training(ho.slot, trainer_owner, t0)
        if first is None:
            not_yet += 1
            continue
        gaps.append(first - ho.freed)
        plane_part.append(ho.slot.placed - ho.freed)
        if ho.slot.running is not None:
            boot_part.append(ho.slot.running - ho.slot.placed)
            shepherd_part.append(first - ho.slot.running)
            opened = model_open(ho.slot, trainer_owner, first, t0)
            if opened is not None:
                opening_part.append(opened)
                orchestration_part.append(first - ho.slot.running - opened)

    trainers_by_job: defaultdict[str, set[str]] = defaultdict(set)
    final_state: dict[str, JobState] = {}
    unowned = 0
    for e in events:
        h = owner(e.job_id)
        if h is None:
            unowned += 1
        trainers_by_job[h.workflow_id if h else e.job_id].add(e.job_id)
        final_state[e.job_id] = e.state

    first_waits = [
        h.first_task_wait_s for h in histories.values() if h.first_task_wait_s is not None
    ]
    queue_waits: defaultdict[str, list[float]] = defaultdict(list)
    lags: defaultdict[str, list[float]] = defaultdict(list)
    delivered: Counter[tuple[str, int]] = Counter()
    for h in histories.values():
        for name, waits in h.queue_waits.items():
            queue_waits[name] += waits
        for trainer, event_id, state, lag in h.deliveries:
            lags[state].append(lag)
            delivered[(trainer, event_id)] += 1

    rates = jobs_per_minute(closes, drained_s if drained_s is not None else end_s, capacity)
    # The intake: until the worker has run every job's first workflow task. Throughput
    # during it and after it tells a burst's cost from a steady loss.
    taken_in = [secs(h.first_task_at, t0) for h in histories.values() if h.first_task_at]
    intake_s = max(taken_in) if taken_in else None
    freed = stats_of(gaps)
    row = {
        "jobs": n,
        "drained_s": None if drained_s is None else round(drained_s, 1),
        "drained": f"{drained_s:.0f} s" if drained_s is not None else f"not in {timeout_s:g} s",
        "jobs_per_min": rates["steady"],
        "slot_held_p50_s": stats_of(held)["p50"],
        "slot_held_p95_s": stats_of(held)["p95"],
        "freed_to_training_p50_s": freed["p50"],
        "freed_to_training_p95_s": freed["p95"],
        # Shepherd's share of it (the rest: the plane placing and booting the trainer).
        "running_to_training_p95_s": stats_of(shepherd_part)["p95"],
        "first_task_wait_p50_s": stats_of(first_waits)["p50"],
        "worker_rss_mib": None,  # filled in by the caller
        "completed": completed,
        "failed": failed,
        "trainers_created": plane_stats.get("creates"),
    }
    return {
        "n": n,
        "drained": drained,
        "drained_s": row["drained_s"],
        "ran_s": r3(end_s),
        "timeout_s": timeout_s,
        "completed": completed,
        "failed": failed,
        "still_running": other,
        "failures": dict(failures.most_common(5)),
        "jobs_per_min": {
            **rates,
            "during_intake": window_rate(closes, 0.0, intake_s),
            "after_intake": window_rate(closes, intake_s, None),
            "by_minute": by_minute(closes),
        },
        # Every completion, seconds from t0 (the rates above are windows of these).
        "closes_s": [round(c, 2) for c in sorted(closes)],
        "intake_s": r3(intake_s) if intake_s is not None else None,
        "slot_held_s": stats_of(held),
        "freed_to_training_s": {
            **freed,
            "handovers": len(handovers),
            "not_trained_yet": not_yet,
            "parts": {
                "freed_to_placed_s": stats_of(plane_part),
                "placed_to_running_s": stats_of(boot_part),
                "running_to_training_s": stats_of(shepherd_part),
                # ... of which the trainer opening its model (the open activity's run: the
                # trainer's model creation, the route reaching the gateway) and the rest
                # (event delivery, workflow tasks, activity dispatch: orchestration).
                "model_open_s": stats_of(opening_part),
                "orchestration_s": stats_of(orchestration_part),
            },
        },
        "first_task_wait_s": stats_of(first_waits),
        "activity_queue_wait_s": {k: stats_of(v) for k, v in sorted(queue_waits.items())},
        "event_delivery_lag_s": {k: stats_of(v) for k, v in sorted(lags.items())},
        "event_deliveries": {
            "signals": sum(delivered.values()),
            "distinct_events": len(delivered),
            "duplicates": sum(c - 1 for c in delivered.values()),
        },
        "trainers_created": plane_stats.get("creates"),
        "jobs_with_several_trainers": sum(len(t) > 1 for t in trainers_by_job.values()),
        "trainer_events_without_a_workflow": unowned,
        "trainers_not_deleted": sum(s is not JobState.DELETED for s in final_state.values()),
        # The plane's totals as its stats name them (creates, deletes, route404s, ...).
        "plane_totals": {
            k: v for k, v in plane_stats.items() if isinstance(v, int) and k != "capacity"
        },
        "histories": {
            "read": len(histories),
            "events_mean": r3(sum(h.events for h in histories.values()) / max(1, len(histories))),
        },
        "row": row,
    }


# ---------------------------------------------------------------------------- report


METHOD = {
    "setup": (
        "Per N a fresh stack: the Temporal dev server (shepherd.binaries.temporal()) with its "
        "state in a SQLite FILE in a temp dir (--db-filename, as `shepherd dev` runs it; "
        "every history write goes to that file, and the dev server's SQLite write rate is "
        "the ceiling issue 8's figures hit), localplane with the capacity given and its "
        "default boot delay and route lag stated explicitly, and the workers as separate "
        "processes (`shepherd worker`, configured by env as in production; event bridge on). "
        "Jobs are started with shepherd.jobs.start_job, all at t0, a bounded number of start "
        "calls in flight. Timestamps of the benchmark, the plane and the Temporal server all "
        "read this machine's clock."
    ),
    "drained": "last workflow close time (visibility) - t0, when every workflow closed "
    "before the timeout; else 'not in T s'",
    "repeat": "with --repeat R (or one R per N) each N runs R times, each on a fresh stack; "
    "the table, the targets and runs[] use the run with the median steady jobs/min (the "
    "lower middle of an even R; one that did not drain counts as 0), and its `repeats` lists "
    "every run's throughput and checks. With --sandwich the smallest N's runs are split, the "
    "odd one before the other Ns and the rest after (settings.order), and small_n_drift gives "
    "the median of each side",
    "jobs_per_min": "steady throughput: (completed - slots) / (last completion - the "
    "slots-th completion) x 60, completed = workflow COMPLETED with the job's phase "
    "COMPLETED (every slot starts at t0, so the slots-th completion ends the first wave and "
    "the window holds whole slot cycles); beside it 'first_to_last': (completed - 1) / (last "
    "- first completion) x 60, which counts the first wave's other completions without their "
    "cycle (+19 % at N = 20 on 4 slots), 'full_pipeline': as steady but to the "
    "(completed - slots)-th completion (after it no job is left to start and the last slots' "
    "jobs run on an emptying machine), and 'overall': completed / (drained or run time) x 60; "
    "'during_intake' and 'after_intake': completions per minute before and after intake_s, "
    "'by_minute': completions in each minute from t0",
    "intake_s": "when the worker had run every job's first workflow task (the last first "
    "WorkflowTaskStarted), seconds from t0: the burst taken in",
    "slot_held": "per trainer, from the plane's placement (its PENDING -> CREATING event: "
    "slot granted) to the event that it left CREATING/RUNNING/DELETING (DELETED when the "
    "process has exited; the plane frees the slot then), from the plane's event stream "
    "(PlatformClient.watch_jobs, replayed from event 0)",
    "freed_to_training": (
        "for each slot freed (as in slot_held) the time until the first training call of "
        "the trainer the plane placed next: frees and placements are paired in time order "
        "(the plane grants slots first come first served), placements into never-used slots "
        "and frees with no later placement are left out. A trainer's first training call = "
        f"the ActivityTaskStarted time of the first '{TRAINING_ACTIVITY}' activity of its "
        "workflow at or after the placement (that activity sends the first forward_backward "
        "without another trip through Temporal). 'parts' splits it: freed -> placed (the "
        "plane, ~0 when a job is waiting), placed -> RUNNING (the trainer's boot), RUNNING "
        "-> first training (Shepherd: event delivery, warm-up, model open, task queues), "
        f"and that last one again as model_open (the '{OPEN_ACTIVITY}' activity's run after "
        "RUNNING: it starts at the placement and waits out the boot; the trainer creating or "
        "loading its model while the route reaches the gateway) and orchestration (the rest: "
        "workflow tasks, activity dispatch)"
    ),
    "first_task_wait": "per workflow, its first WorkflowTaskScheduled -> the matching "
    "WorkflowTaskStarted (all histories, read after the run)",
    "worker_rss": "max over the run of VmRSS (/proc/<pid>/status) of each worker process "
    f"with its child processes, sampled every {RSS_SAMPLE_S:g} s; the table's figure is the "
    "largest worker's",
    "trainers_created": "the plane's 'creates' counter (admin stats): N when no trainer was "
    "created twice; jobs_with_several_trainers counts jobs with more than one trainer id",
    "live_trainers_end": f"the plane's liveTrainers once the run ended (after a drain, "
    f"given up to {LIVE_SETTLE_S:g} s for the last trainers to exit)",
    "activity_queue_wait": "per activity type, ActivityTaskScheduled -> ActivityTaskStarted of "
    "first attempts (a retry's start includes its backoff)",
    "event_delivery_lag": f"per platform state, the '{EVENT_SIGNAL}' signal's history time - "
    "the platform event's eventTime; duplicates = signals of an event beyond its first",
    "temporal_persistence": "the dev server's persistence operations from t0 to the end of "
    "the run, from its Prometheus metrics (persistence_latency_count by operation; writes = "
    "Create*/Update*/Append*/Complete*/... operations); writes_per_s_peak = the highest rate "
    f"over one {PROGRESS_S:g} s progress interval",
    "cpu_s": "CPU seconds each part used from t0 to the end of the run (trainers: those the "
    "plane has reaped)",
    "cpu_steal_pct": "the share of the machine's CPU time taken by its hypervisor for others "
    "from t0 to the end of the run (/proc/stat's steal counter): on a virtual machine a run "
    "with much of it stolen is slower for reasons outside the stack",
    "closes_s": "every completion's close time, seconds from t0, ascending",
    "machine_pace_ms": "before and after the run (the stack up and idle), the milliseconds "
    "this machine took for a fixed piece of pure-Python work (common.pace_ms, the best of "
    "5): its pace then, to compare runs made at different times on a machine whose pace "
    "drifts",
}


def markdown_table(rows: list[dict[str, Any]]) -> str:
    def num(x: Any, unit: str = "") -> str:
        return "–" if x is None else f"{x:g}{unit}"

    lines = [
        "| jobs | drained | jobs/min | slot held per job (p50) | slot freed → next job "
        "training (p50 / p95) | new workflow's first task waits (p50) | worker RSS |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['jobs']} | {r['drained']} | {num(r['jobs_per_min'])} | "
            f"{num(r['slot_held_p50_s'], ' s')} | {num(r['freed_to_training_p50_s'])} / "
            f"{num(r['freed_to_training_p95_s'], ' s')} | {num(r['first_task_wait_p50_s'], ' s')} "
            f"| {num(r['worker_rss_mib'], ' MiB')} |"
        )
    return "\n".join(lines)


def targets(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    def absent(n: int) -> dict[str, Any]:
        return {"met": None, "note": f"N={n} was not run"}

    out: dict[str, Any] = {}
    big = runs.get(TARGET_N_ALL_COMPLETE)
    out[f"n{TARGET_N_ALL_COMPLETE}_all_complete_none_failed_each_created_once"] = (
        absent(TARGET_N_ALL_COMPLETE)
        if big is None
        else {
            "completed": big["completed"],
            "failed": big["failed"],
            "trainers_created": big["trainers_created"],
            "jobs_with_several_trainers": big["jobs_with_several_trainers"],
            "live_trainers_end": big["live_trainers_end"],
            "met": all(big["ok"].values()),
        }
    )
    p95 = {n: r["freed_to_training_s"]["p95"] for n, r in sorted(runs.items())}
    out[f"freed_to_training_p95_le_{TARGET_FREED_P95_S:g}s_every_n"] = {
        "p95_by_n": p95,
        "met": bool(p95) and all(v is not None and v <= TARGET_FREED_P95_S for v in p95.values()),
    }
    hi, lo = runs.get(TARGET_JPM_N), runs.get(TARGET_JPM_BASE_N)
    if hi is None or lo is None:
        out["jobs_per_min_n1000_ge_90pct_of_n20"] = absent(
            TARGET_JPM_N if hi is None else TARGET_JPM_BASE_N
        )
    else:
        a, b = hi["jobs_per_min"]["steady"], lo["jobs_per_min"]["steady"]

        def ratio(kind: str) -> float | None:
            x, y = hi["jobs_per_min"].get(kind), lo["jobs_per_min"].get(kind)
            return None if not x or not y else round(x / y, 3)

        out["jobs_per_min_n1000_ge_90pct_of_n20"] = {
            "n1000": a,
            "n20": b,
            "ratio": ratio("steady"),
            "met": bool(a and b) and a >= TARGET_JPM_RATIO * b,
            # The same ratio by the other two measures (see method.jobs_per_min).
            "ratio_full_pipeline": ratio("full_pipeline"),
            "ratio_first_to_last": ratio("first_to_last"),
            "ratio_overall": ratio("overall"),
        }
    rss = runs.get(TARGET_RSS_N)
    out[f"worker_rss_lt_{TARGET_RSS_MIB:g}mib_at_n{TARGET_RSS_N}"] = (
        absent(TARGET_RSS_N)
        if rss is None
        else {
            "worker_rss_max_mib": rss["worker_rss_max_mib"],
            "met": rss["worker_rss_max_mib"] < TARGET_RSS_MIB,
        }
    )
    return out


def steady_of(run: dict[str, Any]) -> float:
    """A run's steady jobs/min (0 for one that did not drain)."""
    return float((run["jobs_per_min"] or {}).get("steady") or 0.0)


def median_run(tries: list[dict[str, Any]]) -> dict[str, Any]:
    """Of several runs of one N, the one with the median steady jobs/min (the lower middle
    of an even count; a run that did not drain counts as 0), carrying every run's
    throughput and checks under ``repeats``. How much of two cores the emulated GPUs get
    moves a small N by a fifth from run to run: one run is a coin toss for the ratio."""

    middle = sorted(tries, key=steady_of)[(len(tries) - 1) // 2]
    chosen = dict(middle)
    if len(tries) > 1:
        chosen["repeats"] = [
            {
                "jobs_per_min": t["jobs_per_min"],
                "drained": t["drained"],
                "drained_s": t["drained_s"],
                "ok": t["ok"],
                "machine_pace_ms": t.get("machine_pace_ms"),
                "cpu_steal_pct": t.get("cpu_steal_pct"),
                "chosen": t is middle,
            }
            for t in tries
        ]
    return chosen


def run_order(ns: list[int], repeats: list[int], sandwich: bool) -> list[int]:
    """The N of each run, in the order they run: each N's repeats in a row; with
    ``sandwich``, the smallest N's split around the rest, the odd one before (a ratio of
    two Ns measured a quarter of an hour apart moves with the machine's pace: the small N
    measured on both sides of the large one takes a steady drift out of it)."""
    if not sandwich or len(ns) < 2:
        return [n for n, r in zip(ns, repeats, strict=True) for _ in range(r)]
    base = min(ns)
    r = repeats[ns.index(base)]
    rest = [n for n, k in zip(ns, repeats, strict=True) if n != base for _ in range(k)]
    before = (r + 1) // 2
    return [base] * before + rest + [base] * (r - before)


def drift(tries: list[dict[str, Any]], ns: list[int], order: list[int]) -> dict[str, Any] | None:
    """For a sandwich: the small N's median steady jobs/min before and after the rest."""
    base = min(ns)
    if len(ns) < 2 or order[0] != base or order[-1] != base:
        return None
    first_other = next(i for i, n in enumerate(order) if n != base)
    split = [(i < first_other, t) for i, t in enumerate(tries) if order[i] == base]

    def med(side: bool) -> float | None:
        vals = sorted(steady_of(t) for s, t in split if s is side)
        return vals[(len(vals) - 1) // 2] if vals else None  # (median_run's middle)

    return {"n": base, "steady_before": med(True), "steady_after": med(False)}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    order = run_order(args.n, args.repeat, args.sandwich)
    timeouts = dict(zip(args.n, args.timeout, strict=True))
    tries: list[dict[str, Any]] = []
    for n in order:
        tries.append(await run_one(n, timeouts[n], args))
    runs = {n: median_run([t for t, m in zip(tries, order, strict=True) if m == n]) for n in args.n}
    rows = [r["row"] for r in runs.values()]
    return {
        "benchmark": "scale",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "command": "bench/scale.py " + " ".join(sys.argv[1:]),
        "settings": {
            "n": args.n,
            "slots": args.slots,
            "workers": args.workers,
            "timeout_s": args.timeout,
            "kill_worker_after_s": args.kill_worker_after,
            "split_cores": (
                {"platform_cpu": PLATFORM_CPU, "shepherd_cpu": SHEPHERD_CPU}
                if args.split_cores
                else None
            ),
            "submit_concurrency": args.submit_concurrency,
            "repeat": dict(zip(args.n, args.repeat, strict=True)),
            "order": order,
            "job": (
                f"supervised loop on synthetic:text, {STEPS} steps, batch {args.batch_size}, "
                f"{args.step_ms:g} ms emulated GPU time per step, checkpoint every {EVERY} "
                "(default evaluation and keep_last), promote none, default policies"
            ),
            "plane": {"bootDelaySeconds": BOOT_DELAY_S, "routeLagSeconds": ROUTE_LAG_S},
            "worker": {
                "command": " ".join(["python", *worker_command(Path("READY"))[1:]]),
                "log_level": args.log_level,
                "extra_env": args.worker_env,
                "sizing": worker_sizing(args.worker_env),
            },
            "temporal": "dev server, SQLite file (--db-filename) in a temp dir, fresh per N",
        },
        "method": METHOD,
        "table": rows,
        "table_markdown": markdown_table(rows),
        "targets": targets(runs),
        "small_n_drift": drift(tries, args.n, order) if args.sandwich else None,
        "runs": [runs[n] for n in args.n],
    }


# ------------------------------------------------------------------------------ plot


def plot(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Never loses the report: a plot that cannot be drawn is said so in it."""
    try:
        return draw(out, report)
    except Exception as exc:  # noqa: BLE001 - the JSON of a long run matters more
        log(f"plot not drawn: {type(exc).__name__}: {exc}")
        return {"written": False, "path": None, "note": f"{type(exc).__name__}: {exc}"}


def draw(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    plt = pyplot()
    if plt is None:
        return no_plot()
    rows = report["table"]
    ns = [r["jobs"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))

    for key, label, style in (
        ("freed_to_training_p50_s", "p50", "o-"),
        ("freed_to_training_p95_s", "p95", "s--"),
        ("running_to_training_p95_s", "p95 of it after RUNNING (Shepherd's part)", "^:"),
    ):
        left.plot(
            ns, [r[key] if r[key] is not None else float("nan") for r in rows], style, label=label
        )
    left.axhline(TARGET_FREED_P95_S, color="red", linestyle=":", linewidth=1, label="target p95")
    left.set(
        title="slot freed → next job training",
        xlabel="jobs submitted at once (N)",
        ylabel="seconds",
        xscale="log",
    )
    left.set_ylim(bottom=0)

    jpm = [r["jobs_per_min"] if r["jobs_per_min"] is not None else float("nan") for r in rows]
    right.plot(ns, jpm, "o-", label="jobs/min (steady)")
    base = next((r["jobs_per_min"] for r in rows if r["jobs"] == TARGET_JPM_BASE_N), None)
    if base:
        right.axhline(
            TARGET_JPM_RATIO * base,
            color="red",
            linestyle=":",
            linewidth=1,
            label=f"{TARGET_JPM_RATIO:.0%} of N={TARGET_JPM_BASE_N}",
        )
    right.set(
        title="throughput", xlabel="jobs submitted at once (N)", ylabel="jobs/min", xscale="log"
    )
    right.set_ylim(bottom=0)

    for ax in (left, right):
        # A run that did not drain in its timeout: marked, its figures cover what happened.
        for r in rows:
            if r["drained_s"] is None:
                ax.axvline(r["jobs"], color="grey", alpha=0.3, linewidth=6)
        ax.set_xlim(min(ns) / 1.5, max(ns) * 1.5)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    slots, workers = report["settings"]["slots"], report["settings"]["workers"]
    fig.suptitle(
        f"{slots} trainer slots, {workers} worker(s), Temporal dev server on SQLite "
        "(grey: not drained in the timeout)",
        fontsize=10,
    )
    fig.tight_layout()
    return save_plot(plt, fig, out)


# ------------------------------------------------------------------------------- main


def add_worker_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an env setting for every worker (repeatable), e.g. "
        "SHEPHERD_WORKER_MAX_CACHED_WORKFLOWS=500",
    )


def parse_worker_env(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    extra: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--worker-env: KEY=VALUE, got {item!r}")
        extra[key.strip()] = value
    return extra


def per_n(
    parser: argparse.ArgumentParser,
    flag: str,
    text: str,
    count: int,
    kind: Callable[[str], T],
) -> list[T]:
    """``text``: one positive value for every N, or one per N (comma-separated)."""
    try:
        given = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        parser.error(f"{flag}: one positive value, or one per --n value; got {text!r}")
    if len(given) == 1:
        given *= count
    if len(given) != count or any(v <= 0 for v in given):
        parser.error(f"{flag}: one positive value, or one per --n value; got {text!r}")
    return given


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n",
        default=",".join(map(str, DEFAULT_NS)),
        help="comma-separated job counts, one fresh stack each (default: %(default)s)",
    )
    parser.add_argument("--slots", type=positive(int), default=4, help="trainer slots (capacity)")
    parser.add_argument(
        "--repeat",
        default="1",
        help="runs per N, one value or one per --n value (each on a fresh stack); the table "
        "shows the run with the median jobs/min, the JSON every run's",
    )
    parser.add_argument(
        "--sandwich",
        action="store_true",
        help="run the smallest N's repeats half before the other Ns and half after (the "
        "machine's drift over the large run taken out of their ratio)",
    )
    parser.add_argument("--workers", type=positive(int), default=1, help="worker processes")
    parser.add_argument(
        "--timeout",
        default=None,
        help="seconds per N: one value, or one per --n value (default: 120 + 4 s x N x 4/slots)",
    )
    parser.add_argument(
        "--kill-worker-after",
        type=positive(float),
        default=None,
        help="SIGKILL worker 0 this many seconds into each run (needs --workers >= 2)",
    )
    parser.add_argument(
        "--split-cores",
        action="store_true",
        help=f"run the platform (localplane and its trainers) on CPU {PLATFORM_CPU} and "
        f"Shepherd (Temporal server, workers, this benchmark) on CPU {SHEPHERD_CPU}, as "
        "trainers on GPU nodes never take the orchestrator's CPU (needs 2 CPUs)",
    )
    parser.add_argument(
        "--submit-concurrency", type=positive(int), default=32, help="start calls in flight"
    )
    parser.add_argument("--batch-size", type=positive(int), default=4, help="records per step")
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="emulated GPU time per step (ms)"
    )
    parser.add_argument(
        "--log-level", default="INFO", help="the workers' SHEPHERD_LOG_LEVEL (production: INFO)"
    )
    add_worker_env(parser)
    parser.add_argument("--logs", type=Path, default=None, help="keep the run logs in this dir")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG plot path")
    args = parser.parse_args(argv)
    try:
        args.n = [int(x) for x in args.n.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--n: comma-separated integers, got {args.n!r}")
    if not args.n or any(n < 1 for n in args.n) or len(set(args.n)) != len(args.n):
        parser.error("--n: distinct job counts >= 1")
    args.repeat = per_n(parser, "--repeat", args.repeat, len(args.n), int)
    if args.timeout is None:
        args.timeout = [120.0 + 4.0 * n * 4 / args.slots for n in args.n]
    else:
        args.timeout = per_n(parser, "--timeout", args.timeout, len(args.n), float)
    if args.kill_worker_after is not None and args.workers < 2:
        parser.error("--kill-worker-after needs --workers >= 2 (someone must finish the jobs)")
    args.worker_env = parse_worker_env(parser, args.worker_env)
    if args.step_ms < 0:
        parser.error("--step-ms must be >= 0")
    if args.split_cores and not {PLATFORM_CPU, SHEPHERD_CPU} <= os.sched_getaffinity(0):
        parser.error(f"--split-cores needs CPUs {SHEPHERD_CPU} and {PLATFORM_CPU}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = run_main(lambda: bench(args), lambda report: plot(args.out, report))
    tries = [t for r in report["runs"] for t in r.get("repeats", [r])]
    if not all(all(t["ok"].values()) for t in tries if t["drained"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
