"""Helpers shared by the benchmarks in bench/ (plane.py, overhead.py, recovery.py,
sdk_compare.py, scale.py).

The scripts run as ``python bench/<name>.py``: this directory is then ``sys.path[0]`` and
they import this file as the top-level module ``common`` (bench/ is not a package).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

import httpx
import numpy as np
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd import binaries
from shepherd import search_attributes as sa
from shepherd.logging import configure_logging
from shepherd.models import JobInput, JobStatus, LoopSettings
from shepherd.platform import PlatformClient, RouteNotFound, TrainerClient
from shepherd.platform.client import JsonTransport
from shepherd.platform.models import CreateTrainerJobRequest, JobEvent, TrainingConfig
from shepherd.spec import JobSpec, validate_spec
from shepherd.states import JobState
from shepherd.tinker_client import TrainingClient
from workers.config import BackendProfile, BackendRegistry
from workers.devstack import SQLITE_FLAGS, TIMER_FLAGS
from workers.events import EventBridge
from workers.main import workers_for
from workflows.job import TrainingJobWorkflow
from workflows.policies import WARMUP_PROBE_SPACING

T = TypeVar("T")

#: The worker's key lives in an env mapping handed to the registry, never in os.environ.
KEY_ENV = "SHEPHERD_BENCH_PLANE_KEY"


# -------------------------------------------------------------------------- output


def log(message: str) -> None:
    """Progress goes to stderr: stdout is for the JSON document alone."""
    print(message, file=sys.stderr, flush=True)


def reserve_stdout() -> TextIO:
    """The real stdout, kept for the JSON document; from now on anything else written to
    file descriptor 1 (the Temporal dev server prints its banner there) goes to stderr."""
    sys.stdout.flush()
    report = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return report


def machine(*, implementation: bool = False, load_average: bool = True) -> dict[str, Any]:
    """The machine the figures were taken on; the flags add the Python implementation and the
    load average (each script keeps the fields it has always reported)."""
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
    }
    if implementation:
        info["implementation"] = platform.python_implementation()
    info["platform"] = platform.platform()
    info["processor"] = platform.machine()
    if load_average:
        # Other processes compete for the same CPUs: a high load average taints the timings.
        info["load_average_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    return info


def cpu_times() -> list[int] | None:
    """The machine's CPU time counters (``/proc/stat``'s ``cpu`` line, in ticks), or None
    off Linux."""
    try:
        with open("/proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return None
    return [int(x) for x in first[1:]] if first and first[0] == "cpu" else None


def steal_pct(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of the machine's CPU time its hypervisor gave to others between two
    :func:`cpu_times` readings (the eighth counter): a virtual machine's cores are only
    partly its own, and on this one that share moved from 1 % to 45 % within an hour,
    slowing every figure of a run as much as any change of code did."""
    if before is None or after is None or len(before) < 8 or len(after) < 8:
        return None
    spent = sum(after[:8]) - sum(before[:8])
    return round(100.0 * (after[7] - before[7]) / spent, 1) if spent > 0 else None


def pace_ms(rounds: int = 5) -> float:
    """Milliseconds this machine takes for a fixed piece of pure-Python work (the best of
    ``rounds``): its pace at the moment. Runs of the same code on this virtual machine moved
    by a quarter within an hour with nothing stolen (the plane's CPU per job, for the same
    work, 0.26 s and 0.35 s): comparing two runs means comparing their paces too."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        total = 0
        for i in range(200_000):
            total += (i * i) % 7
        best = min(best, time.perf_counter() - t)
    return round(1000 * best, 1)


def pyplot() -> Any | None:
    """matplotlib's pyplot for headless drawing, or None: plots are an optional extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def no_plot() -> dict[str, Any]:
    note = "matplotlib is not installed: no plot written"
    log(note)
    return {"written": False, "path": None, "note": note}


def save_plot(plt: Any, fig: Any, out: Path) -> dict[str, Any]:
    """Write ``fig`` to ``out`` and say so in the report's terms."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    log(f"plot written to {out}")
    return {"written": True, "path": str(out), "note": None}


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and its live descendants, read
    from /proc (0 where it cannot be read: another OS, a process gone)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


def r3(x: float) -> float:
    return round(float(x), 3)


def summary(
    samples: Sequence[float], percentiles: Sequence[int] = (50,), *, raw: bool = True
) -> dict[str, Any]:
    """``n``, the ``percentiles`` (as ``p50``, ...), mean, min and max, rounded to 3 places;
    with ``raw`` the samples too (worth it for a few runs, not for thousands of requests).
    Without samples every statistic is None."""
    stats: dict[str, Any] = {"n": len(samples)}
    names = [f"p{p}" for p in percentiles]
    if not samples:
        stats.update(dict.fromkeys([*names, "mean", "min", "max"]))
    else:
        a = np.asarray(samples, dtype=float)
        stats.update(zip(names, (r3(p) for p in np.percentile(a, percentiles)), strict=True))
        stats.update(mean=r3(a.mean()), min=r3(a.min()), max=r3(a.max()))
    if raw:
        stats["values"] = [r3(v) for v in samples]
    return stats


# ---------------------------------------------------------------------- arguments


def positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    """An argparse type: a number of ``kind`` above zero."""

    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


# ------------------------------------------------------------------------ the job


async def wait_running(
    client: PlatformClient, job_id: str, *, last_event_id: int | None = None
) -> None:
    """Wait on the job's event stream until it is RUNNING (callers bound it with a timeout).

    With ``last_event_id`` the stream replays from there (``0``: from the start, so nothing
    is missed); without it only new events come, so the current state is checked first."""
    waiting = {JobState.PENDING, JobState.CREATING, JobState.UNSPECIFIED}
    if last_event_id is None and (await client.get_job(job_id)).state is JobState.RUNNING:
        return
    async for event in client.watch_jobs(job_id=job_id, last_event_id=last_event_id):
        if event.state is JobState.RUNNING:
            return
        if event.state not in waiting:
            raise RuntimeError(f"job {job_id} went {event.state.value}: {event.job.status.message}")


async def warm(
    trainer: TrainerClient,
    probes: int = 3,
    spacing_s: float = WARMUP_PROBE_SPACING.total_seconds(),
) -> int:
    """Consecutive successful ``healthz`` calls over the training route, spaced like
    Shepherd's ``warm_up`` activity spaces them: the gateway knows the route (trainer-api.md
    §5). Returns the 404s seen on the way."""
    ok = seen = 0
    while ok < probes:
        try:
            await trainer.healthz()
            ok += 1
            if ok < probes:
                await asyncio.sleep(spacing_s)
        except RouteNotFound:
            ok, seen = 0, seen + 1
            await asyncio.sleep(spacing_s)
    return seen


class EventLog:
    """Every state change of one plane account, in the order the platform numbered them
    (its SSE stream, replayed from the first event and resumed after a drop), so the
    platform's own times (placed, RUNNING, DELETED ...) are known without asking per job."""

    def __init__(self) -> None:
        self.events: list[JobEvent] = []
        self._changed = asyncio.Event()

    async def follow(self, client: PlatformClient) -> None:
        """Run until cancelled; a fresh account replayed from 0 misses nothing."""
        last = 0
        while True:
            try:
                async for event in client.watch_jobs(last_event_id=last):
                    last = event.id
                    self.events.append(event)
                    self._changed.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect; the replay fills the gap
                log(f"event log: reconnecting after {type(exc).__name__}")
                await asyncio.sleep(0.2)

    def of(self, job_id: str) -> list[JobEvent]:
        return [e for e in self.events if e.job_id == job_id]

    def states(self) -> dict[str, JobState]:
        """Each job's latest state."""
        return {e.job_id: e.state for e in self.events}

    async def wait(self, check: Callable[[JobEvent], bool]) -> JobEvent:
        """The first event (seen or to come) for which ``check`` holds; callers bound it."""
        seen = 0
        while True:
            for event in self.events[seen:]:
                if check(event):
                    return event
            seen = len(self.events)
            self._changed.clear()
            await self._changed.wait()


# ------------------------------------------------------------------- the data plane


@contextlib.asynccontextmanager
async def direct_trainer(
    admin: PlaneAdmin, job_id: str, api_key: str, *, account: str | None = None
) -> AsyncIterator[TrainerClient]:
    """The Tinker API of a job's trainer process at its own address (no gateway), from the
    plane's admin API; its own connection pool, the same headers Shepherd's client sends."""
    internals = await admin.job(job_id, account=account)
    trainer = internals.get("trainer") or {}
    if not trainer.get("url"):
        raise RuntimeError(f"{job_id}: no live trainer ({internals.get('job', {}).get('state')})")
    async with httpx.AsyncClient(
        headers={"Authorization": f"Bearer {api_key}", "X-Api-Key": api_key},
        timeout=httpx.Timeout(30.0, connect=5.0),
    ) as http:
        yield TrainerClient(JsonTransport(http), str(trainer["url"]).rstrip("/"))


async def open_training_client(
    trainer: TrainerClient,
    base_model: str,
    *,
    lora_rank: int = 0,
    seed: int = 0,
    timeout: float = 600.0,
) -> TrainingClient:
    """A session and a new model on the trainer, driven through Shepherd's Tinker
    ``TrainingClient`` (what a loop gets inside the training activity), as ``open_model``
    opens it: model_seq_id 1, the first sequenced operation gets seq_id 1."""
    session_id = await trainer.create_session(tags=["shepherd-bench"])
    model_id = await trainer.create_model(
        session_id, 1, base_model, lora_rank, seed=seed, timeout=timeout
    )
    info = await trainer.get_info(model_id)
    return TrainingClient(
        trainer,
        session_id=session_id,
        model_id=model_id,
        base_model=base_model,
        next_seq=1,
        timeout=timeout,
        info=info,
        tokenizer_id=info.model_data.tokenizer_id,
    )


# ------------------------------------------------------------------- a program job
# history.py and outage.py run examples/programs/tinker_sft.py, unmodified, as a program job.

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = "tinker-sft"
PROGRAM_SCRIPT = ROOT / "examples" / "programs" / "tinker_sft.py"
#: The program's LoRA rank (the script's default).
PROGRAM_RANK = 4


def program_env(root: Path) -> dict[str, str]:
    """The worker's environment for the program (tests/workflows/test_programs.py's
    ``programs_env``): the script registered, its log directories under ``root``, offline
    (the plane's trainers must speak JSON only: ``trainerProtobuf: false``)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # tests/ (the offline cache)
    from tests.plane import cookbook_support as cb  # noqa: PLC0415 - bench/ is not a package

    registration = {
        PROGRAM: {
            "script": str(PROGRAM_SCRIPT),
            "total_steps_arg": "steps",
            "log_dir_arg": "log_dir",
        }
    }
    return {
        "SHEPHERD_PROGRAMS": json.dumps(registration),
        "SHEPHERD_PROGRAM_DIR": str(root / "programs"),
        **cb.offline_env(cb.hf_home(root)),
    }


def tinker_sft_spec(
    name: str, *, steps: int, step_ms: float, checkpoint: dict[str, Any] | None = None
) -> JobSpec:
    """The program job (examples/programs/tinker_sft.py): ``steps`` optimizer steps, ``step_ms`` of emulated GPU time each,
    nothing promoted (``checkpoint``: the spec's section; None: its default)."""
    return validate_spec(
        {
            "name": name,
            "trainer": {
                "base_model": BASE_MODEL,
                "lora_rank": PROGRAM_RANK,
                "extra_args": [f"--compute-delay-ms={step_ms:g}"],
            },
            "training": {"program": PROGRAM, "args": {"steps": steps}},
            **({"checkpoint": checkpoint} if checkpoint is not None else {}),
            "output": {"promote": "none"},
        }
    )


# ------------------------------------------------------ one supervised job, two ways
# overhead.py and sdk_compare.py run the same job bare (a client, no workflow) and through
# Shepherd: these are its settings, its trainer, its spec and its loop context, once.

BASE_MODEL = "accounts/fireworks/models/qwen3-8b"
#: The trainer's and the loop's token budget per record.
MAX_CONTEXT_LENGTH = 512
#: Per training call, like Shepherd's default step_timeout (a slow emulated step is fine).
STEP_TIMEOUT_S = 600.0


def supervised_settings(*, steps: int, batch_size: int) -> LoopSettings:
    return LoopSettings(
        loop="supervised",
        dataset="synthetic:text",
        batch_size=batch_size,
        micro_batches=1,
        seed=0,
        learning_rate=3e-3,
        max_context_length=MAX_CONTEXT_LENGTH,
        validation_split=0.1,
        total_steps=steps,
    )


def supervised_trainer(settings: LoopSettings, step_ms: float) -> dict[str, Any]:
    """The trainer section of the job (a spec's ``trainer``), ``step_ms`` of emulated GPU time."""
    return {
        "base_model": BASE_MODEL,
        "lora_rank": 0,
        "learning_rate": settings.learning_rate,
        "max_context_length": settings.max_context_length,
        "extra_args": [f"--compute-delay-ms={step_ms:g}"],
    }


def supervised_create_request(
    job_id: str, settings: LoopSettings, step_ms: float
) -> CreateTrainerJobRequest:
    """The body Shepherd's ``create_trainer`` activity sends for :func:`supervised_spec`."""
    t = supervised_trainer(settings, step_ms)
    return CreateTrainerJobRequest(
        display_name=job_id,
        dataset="",
        training_config=TrainingConfig(
            base_model=t["base_model"],
            lora_rank=t["lora_rank"],
            learning_rate=t["learning_rate"],
            max_context_length=t["max_context_length"],
            extra_args=[*t["extra_args"], f"--seed={settings.seed}"],
        ),
        preemptible=False,
        inactivity_timeout="3600s",
    )


def supervised_spec(
    name: str, settings: LoopSettings, step_ms: float, checkpoint: dict[str, Any]
) -> JobSpec:
    return validate_spec(
        {
            "name": name,
            "trainer": supervised_trainer(settings, step_ms),
            "training": {
                "loop": settings.loop,
                "total_steps": settings.total_steps,
                "seed": settings.seed,
                "batch_size": settings.batch_size,
                "dataset": settings.dataset,
            },
            "checkpoint": checkpoint,
            "output": {"promote": "none"},
        }
    )


# ------------------------------------------------------------------------ the stack


@dataclass
class Stack:
    """Temporal and the plane, as one fresh account."""

    client: Client
    plane: PlaneProcess
    admin: PlaneAdmin
    account_id: str
    api_key: str
    platform: PlatformClient

    def job_name(self, job_id: str) -> str:
        return f"accounts/{self.account_id}/rlorTrainerJobs/{job_id}"


@contextlib.asynccontextmanager
async def shepherd_stack(
    plane_config: dict[str, Any],
    *,
    db_filename: Path | None = None,
    server_args: Sequence[str] = (),
) -> AsyncIterator[Stack]:
    """Start everything; stop everything this started, also on errors and cancellation.

    The dev server keeps its state in memory, or with ``db_filename`` in that SQLite file,
    in WAL mode (what ``shepherd dev`` does: every write then goes to disk, which bounds its
    throughput);
    ``server_args`` go to ``temporal server start-dev`` as they are."""
    async with contextlib.AsyncExitStack() as stack:
        log(f"starting the Temporal dev server ({db_filename or 'in memory'})")
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=binaries.temporal(),
            dev_server_database_filename=str(db_filename) if db_filename else None,
            data_converter=pydantic_data_converter,
            search_attributes=list(sa.ALL),
            dev_server_log_level="error",
            # As `shepherd dev` runs it.
            dev_server_extra_args=[
                *TIMER_FLAGS,
                *(SQLITE_FLAGS if db_filename else ()),
                *server_args,
            ],
            ui=False,
        )
        await stack.enter_async_context(env)
        log(f"starting localplane with {json.dumps(plane_config)}")
        plane = PlaneProcess(config=plane_config)
        stack.callback(plane.cleanup)  # registered first: a failed start is cleaned up too
        await asyncio.to_thread(plane.start)
        admin = await stack.enter_async_context(PlaneAdmin(plane.url, plane.admin_key))
        account_id, api_key = await admin.create_account()
        client = await stack.enter_async_context(
            PlatformClient(plane.url, api_key, account_id=account_id)
        )
        yield Stack(env.client, plane, admin, account_id, api_key, client)


@dataclass
class Runner:
    """Starts jobs on one worker's task queue and remembers them, for the clean-up."""

    stack: Stack
    task_queue: str
    handles: list[WorkflowHandle[Any, Any]] = field(default_factory=list)

    async def start(self, spec: JobSpec) -> WorkflowHandle[Any, JobStatus]:
        handle = await self.stack.client.start_workflow(
            TrainingJobWorkflow.run,
            JobInput(spec=spec),
            id=f"bench-{spec.name}-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
        )
        self.handles.append(handle)
        return handle


@contextlib.asynccontextmanager
async def shepherd_worker(
    st: Stack, bench: str, *, events: bool, plane_url: str | None = None
) -> AsyncIterator[Runner]:
    """A worker like production's on its own task queue (``bench-<bench>-...``), with the event
    bridge; ``events`` is the backend profile's switch (off: the workflow polls);
    ``plane_url``: where the worker reaches the plane (default: ``st.plane.url``)."""
    task_queue = f"bench-{bench}-{uuid.uuid4().hex[:8]}"
    url = plane_url or st.plane.url
    profile = BackendProfile(name="local", url=url, api_key_env=KEY_ENV, events=events)
    registry = BackendRegistry({"local": profile}, env={KEY_ENV: st.api_key})
    runner = Runner(st, task_queue)
    try:
        async with contextlib.AsyncExitStack() as workers:
            for worker in workers_for(st.client, task_queue, registry):
                await workers.enter_async_context(worker)
            # Without events the profile says so and the bridge has nothing to follow.
            bridge = asyncio.create_task(EventBridge(st.client, registry).run())
            try:
                yield runner
            finally:
                # Before the worker stops: an interrupted run leaves no workflow behind.
                for handle in runner.handles:
                    with contextlib.suppress(Exception):
                        desc = await handle.describe()
                        if desc.status is not None and desc.status.name == "RUNNING":
                            await handle.terminate(reason="benchmark stopped")
                bridge.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await bridge
    finally:
        await registry.aclose()


# -------------------------------------------------------------------------- main


async def cancel_on_sigterm(run: Callable[[], Awaitable[T]]) -> T:
    # SIGTERM unwinds like Ctrl-C, so the stack is stopped either way.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run()


def run_main(
    bench: Callable[[], Awaitable[dict[str, Any]]],
    plot: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Run ``bench``, set the report's ``plot`` to what ``plot(report)`` returns, print the
    report as the one JSON document on stdout and return it. Interrupted (Ctrl-C, SIGTERM):
    no report, exit status 130."""
    out = reserve_stdout()
    # Worker, activity and SDK logs go to stderr (stdout is the JSON document), warnings only.
    configure_logging(json=True, level="WARNING")
    try:
        report = asyncio.run(cancel_on_sigterm(bench))
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: everything this run started has been stopped; no report")
        sys.exit(130)
    report["plot"] = plot(report)
    print(json.dumps(report, indent=2, default=str), file=out, flush=True)
    return report
