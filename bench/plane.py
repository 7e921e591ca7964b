"""Benchmark of localplane: how fast its control plane answers, and what its gateway costs.

Measured, against a fresh plane started here (temp dir, ephemeral port, every fault off):

1. Control-plane ``GET`` of one job (``PlatformClient.get_job``) under ``--concurrency``
   asyncio tasks for ``--duration`` seconds after a short warm-up: latency p50/p90/p99 (ms)
   and throughput (requests/s). This is the call a fleet of workflow activities makes most
   (status polls), so it bounds how many jobs one plane can supervise. By default each task
   has its own client (``--client-mode per-task``): one shared httpx pool under 50 concurrent
   requests queues on the client side and would measure the pool rather than the plane.
2. One optimizer step of a default job on the Tinker API (JSON dialect, Shepherd's
   ``TrainerClient``): ``forward_backward`` (``--batch`` datums of ``--tokens`` tokens,
   ``cross_entropy``) then ``optim_step``, each a submission plus its ``retrieve_future``
   (4 HTTP requests per step), over ``--steps`` steps, both **direct** to the trainer
   process and **through the gateway**, interleaved step by step on the same model (one
   ``seq_id`` sequence across both paths) so both see the same machine load. The p50
   difference is the gateway's overhead per step: the price every training call pays for
   routing, on top of the model math (the byte-level stand-in LM; ``computeDelayMs`` = 0).
   ``healthz`` on both paths gives the round-trip floor (no model work) the steps sit on.

The client and the plane share this machine's CPUs, so the figures are for the pair, not for
the server alone; the JSON records the machine and the CPU each side used in the load phase.

Prints one JSON document on stdout (progress goes to stderr) and writes a PNG plot to
``--out`` when matplotlib is importable.

Run: ``.venv/bin/python bench/plane.py [--duration 10] [--steps 300] [--concurrency 50]
[--client-mode per-task|shared] [--batch 8] [--tokens 64] [--out bench/out/plane.png]``;
a smoke run: ``--duration 1 --steps 3 --concurrency 4``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import PlatformClient, TrainerClient
from shepherd.platform.models import CreateTrainerJobRequest, TrainingConfig

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from common import (
    BASE_MODEL,
    direct_trainer,
    log,
    machine,
    no_plot,
    positive,
    pyplot,
    save_plot,
    summary,
    wait_running,
    warm,
)

#: Every fault off, so only the plane's own cost is measured.
PLANE_CONFIG = {
    "routeLagSeconds": {"min": 0, "max": 0},
    "gateway404Rate": 0,
    "controlPlane5xxRate": 0,
    "capacity": 4,
}
JOB_ID = "bench-plane"
#: HTTP requests per measured step: (submit + retrieve_future) x (forward_backward, optim_step).
REQUESTS_PER_STEP = 4
#: Load before measuring: connection pools fill, the server's code paths get hot.
WARMUP_SECONDS = 1.0
#: Steps per path before measuring, for the same reason.
WARMUP_STEPS = 5
#: healthz calls per path for the round-trip floor.
FLOOR_CALLS = 100
#: Latency percentiles reported (with mean, min and max; no raw values: there are thousands).
PERCENTILES = (50, 90, 99)
#: Job creation to a warm route; a trainer boots in about a second.
STARTUP_TIMEOUT_S = 60.0
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "plane.png"
LEARNING_RATE = 3e-3
#: Per training call (submission + its future): the stand-in LM answers in milliseconds.
CALL_TIMEOUT_S = 60.0
#: The text the step's datums are cut from; the stand-in LM's token ids are byte values.
TEXT = (
    "Shepherd drives trainers through the Tinker API: forward_backward, optim_step, "
    "save_weights, each with its seq_id, every operation applied exactly once. "
)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # utime and stime are fields 14 and 15 of stat(5); index 11 and 12 after the comm field.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------ the job


def default_job_request() -> CreateTrainerJobRequest:
    """The same body as ``tests.helpers.job_request()``: the default model, full fine-tune."""
    return CreateTrainerJobRequest(
        training_config=TrainingConfig(base_model=BASE_MODEL, lora_rank=0, learning_rate=3e-3)
    )


# ------------------------------------------------------------------- control plane load


async def get_job_loop(
    client: PlatformClient, job_id: str, until: float, samples: list[float], errors: Counter[str]
) -> None:
    while time.perf_counter() < until:
        start = time.perf_counter()
        try:
            await client.get_job(job_id)
        except Exception as exc:  # a benchmark counts failures instead of stopping on them
            errors[type(exc).__name__] += 1
            continue
        samples.append((time.perf_counter() - start) * 1000)


async def run_load(
    clients: list[PlatformClient], job_id: str, seconds: float
) -> tuple[list[float], Counter[str], float]:
    """One task per entry of ``clients`` doing get_job for ``seconds``; returns samples,
    errors and the wall time."""
    samples: list[float] = []
    errors: Counter[str] = Counter()
    start = time.perf_counter()
    until = start + seconds
    async with asyncio.TaskGroup() as tg:
        for client in clients:
            tg.create_task(get_job_loop(client, job_id, until, samples, errors))
    return samples, errors, time.perf_counter() - start


async def load_clients(
    stack: AsyncExitStack, plane: PlaneProcess, shared: PlatformClient, mode: str, concurrency: int
) -> tuple[list[PlatformClient], str]:
    """The client each load task uses, and a description of the choice for the report."""
    if mode == "shared":
        return [shared] * concurrency, (
            f"one shared PlatformClient (max_connections={concurrency}) for all tasks"
        )
    account = await shared.account_id()  # resolved once, not by every client
    clients = [
        await stack.enter_async_context(
            PlatformClient(plane.url, plane.api_key, account_id=account, max_connections=1)
        )
        for _ in range(concurrency)
    ]
    return clients, "one PlatformClient per task (max_connections=1 each)"


async def control_plane_bench(
    plane: PlaneProcess, shared: PlatformClient, job_id: str, args: argparse.Namespace
) -> tuple[dict[str, Any], list[float]]:
    assert plane.proc is not None
    concurrency, duration = args.concurrency, args.duration
    async with AsyncExitStack() as stack:
        clients, client_mode = await load_clients(
            stack, plane, shared, args.client_mode, concurrency
        )
        log(
            f"control plane: warm-up {WARMUP_SECONDS:g} s, then {duration:g} s x {concurrency} tasks"
        )
        await run_load(clients, job_id, WARMUP_SECONDS)
        plane_cpu0, client_cpu0 = process_cpu_seconds(plane.proc.pid), time.process_time()
        samples, errors, wall = await run_load(clients, job_id, duration)
        plane_cpu1, client_cpu1 = process_cpu_seconds(plane.proc.pid), time.process_time()
    plane_cpu = None if plane_cpu0 is None or plane_cpu1 is None else plane_cpu1 - plane_cpu0
    result = {
        "call": "PlatformClient.get_job (GET /v1/accounts/{a}/rlorTrainerJobs/{j})",
        "concurrency": concurrency,
        "client_mode": client_mode,
        "warmup_seconds": WARMUP_SECONDS,
        "duration_seconds": round(wall, 3),
        "requests": len(samples),
        "errors": dict(errors),
        "throughput_rps": round(len(samples) / wall, 1),
        "latency_ms": summary(samples, PERCENTILES, raw=False),
        # Both sides on one machine: how busy each was tells who limited the throughput.
        "cpu_utilisation": {
            "client": round((client_cpu1 - client_cpu0) / wall, 3),
            "plane": None if plane_cpu is None else round(plane_cpu / wall, 3),
            "note": "CPU-seconds per wall-second (1.0 = one core busy)",
        },
    }
    return result, samples


# -------------------------------------------------------------------------- trainer steps


def batch_of(size: int, tokens: int) -> list[dict[str, Any]]:
    """``size`` next-token datums of ``tokens`` input tokens each (JSON dialect), cut from
    TEXT at different offsets: a fixed batch, so every step does the same model work."""
    text = (TEXT * (tokens // len(TEXT) + 2)).encode()
    datums = []
    for i in range(size):
        ids = list(text[i * 7 : i * 7 + tokens + 1])
        datums.append(
            {
                "model_input": {"chunks": [{"type": "encoded_text", "tokens": ids[:-1]}]},
                "loss_fn_inputs": {
                    "target_tokens": {"data": ids[1:], "dtype": "int64", "shape": [tokens]},
                    "weights": {"data": [1.0] * tokens, "dtype": "float32", "shape": [tokens]},
                },
            }
        )
    return datums


@dataclass
class Model:
    """The one model both paths train; ``seq`` is its next ``seq_id`` (shared by both)."""

    model_id: str
    batch: list[dict[str, Any]]
    seq: int = 1

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq - 1


async def timed_step(trainer: TrainerClient, model: Model) -> tuple[float, float]:
    """One optimizer step, each operation awaited before the next is sent (so the times
    split cleanly); returns (forward_backward ms, optim_step ms)."""
    t0 = time.perf_counter()
    await trainer.call(
        "forward_backward",
        {
            "forward_backward_input": {"data": model.batch, "loss_fn": "cross_entropy"},
            "model_id": model.model_id,
            "seq_id": model.next_seq(),
        },
        timeout=CALL_TIMEOUT_S,
    )
    t1 = time.perf_counter()
    await trainer.call(
        "optim_step",
        {
            "adam_params": {"learning_rate": LEARNING_RATE},
            "model_id": model.model_id,
            "seq_id": model.next_seq(),
        },
        timeout=CALL_TIMEOUT_S,
    )
    t2 = time.perf_counter()
    return (t1 - t0) * 1000, (t2 - t1) * 1000


async def trainer_bench(
    paths: dict[str, TrainerClient], model: Model, steps: int
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """``steps`` measured steps per path, alternating paths step by step on one model
    (its ``seq_id`` runs on across both paths: it is one model)."""
    fb: dict[str, list[float]] = {name: [] for name in paths}
    opt: dict[str, list[float]] = {name: [] for name in paths}
    log(f"trainer: {WARMUP_STEPS} warm-up + {steps} measured steps per path ({', '.join(paths)})")
    for i in range(WARMUP_STEPS + steps):
        for name, trainer in paths.items():
            fb_ms, opt_ms = await timed_step(trainer, model)
            if i >= WARMUP_STEPS:
                fb[name].append(fb_ms)
                opt[name].append(opt_ms)
    totals = {name: [a + b for a, b in zip(fb[name], opt[name], strict=True)] for name in paths}
    result = {
        name: {
            "step_ms": summary(totals[name], PERCENTILES, raw=False),
            "forward_backward_ms": summary(fb[name], PERCENTILES, raw=False),
            "optim_step_ms": summary(opt[name], PERCENTILES, raw=False),
        }
        for name in paths
    }
    return result, totals


async def round_trip_floor(paths: dict[str, TrainerClient]) -> dict[str, Any]:
    """``healthz`` (no model work) on each path, interleaved: the fixed cost of one call."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(FLOOR_CALLS):
        for name, trainer in paths.items():
            start = time.perf_counter()
            await trainer.healthz()
            samples[name].append((time.perf_counter() - start) * 1000)
    return {name: summary(values, PERCENTILES, raw=False) for name, values in samples.items()}


def gateway_overhead(steps: dict[str, Any]) -> dict[str, float]:
    def p50_diff(key: str) -> float:
        return round(steps["gateway"][key]["p50"] - steps["direct"][key]["p50"], 3)

    per_step = p50_diff("step_ms")
    return {
        "step_p50_ms": per_step,
        # A step is two operations, each a submission and a retrieve_future.
        "per_request_p50_ms": round(per_step / REQUESTS_PER_STEP, 3),
        "forward_backward_p50_ms": p50_diff("forward_backward_ms"),
        "optim_step_p50_ms": p50_diff("optim_step_ms"),
        "step_p50_ratio": round(
            steps["gateway"]["step_ms"]["p50"] / steps["direct"]["step_ms"]["p50"], 3
        ),
    }


# ----------------------------------------------------------------------------------- plot


def plot(
    out: Path, get_samples: list[float], step_samples: dict[str, list[float]]
) -> dict[str, Any]:
    """Latency CDFs: control-plane GET, and a step direct vs through the gateway."""
    plt = pyplot()
    if plt is None:
        return no_plot()

    def cdf(ax: Any, samples: list[float], label: str) -> None:
        xs = np.sort(samples)
        ax.plot(xs, np.arange(1, xs.size + 1) / xs.size, label=label)

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    cdf(left, get_samples, "get_job")
    left.set(title="Control-plane GET under load", xlabel="latency (ms)", ylabel="fraction")
    for name, samples in step_samples.items():
        cdf(right, samples, name)
    right.set(title="forward_backward + optim_step", xlabel="latency (ms)")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return save_plot(plt, fig, out)


# ------------------------------------------------------------------------------------ run


async def bench(
    plane: PlaneProcess, args: argparse.Namespace
) -> tuple[dict[str, Any], list[float], dict[str, list[float]]]:
    """Both measurements on one job; returns the report and the raw samples for the plot."""
    assert plane.proc is not None
    async with (
        PlatformClient(
            plane.url, plane.api_key, max_connections=max(args.concurrency, 1)
        ) as client,
        PlaneAdmin(plane.url, plane.admin_key) as admin,
    ):
        log(f"creating job {JOB_ID} ({BASE_MODEL}, loraRank 0)")
        await client.create_job(JOB_ID, default_job_request())
        gateway = await client.trainer(JOB_ID)
        async with asyncio.timeout(STARTUP_TIMEOUT_S):
            await wait_running(client, JOB_ID)
            await warm(gateway)
            session_id = await gateway.create_session(tags=["shepherd-bench"])
            model_id = await gateway.create_model(
                session_id, 1, BASE_MODEL, 0, timeout=CALL_TIMEOUT_S
            )
        model = Model(model_id, batch_of(args.batch, args.tokens))

        cp, get_samples = await control_plane_bench(plane, client, JOB_ID, args)
        async with direct_trainer(admin, JOB_ID, plane.api_key) as direct:
            paths = {"direct": direct, "gateway": gateway}
            steps, step_samples = await trainer_bench(paths, model, args.steps)
            floor = await round_trip_floor(paths)
            info = await direct.get_info(model_id)
        effective_config = await admin.faults()
        stats = await admin.stats()

    report = {
        "benchmark": "localplane",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(implementation=True, load_average=False),
        "plane": {"requested_config": PLANE_CONFIG, "effective_config": effective_config},
        "control_plane_get": cp,
        "trainer_step": {
            "job": {"id": JOB_ID, "base_model": BASE_MODEL, "lora_rank": 0},
            "model": {
                "arch": info.model_data.arch,
                "trainable_parameters": getattr(info, "trainable_parameters", None),
            },
            "step": (
                f"forward_backward ({args.batch} datums x {args.tokens} tokens, cross_entropy) "
                "then optim_step (Adam), each submitted and its future retrieved before the "
                f"next: {REQUESTS_PER_STEP} HTTP requests, JSON dialect"
            ),
            "steps_per_path": args.steps,
            "warmup_steps_per_path": WARMUP_STEPS,
            "order": "interleaved step by step (direct, gateway, direct, ...) on the same trainer",
            "route_warmup": "3 consecutive healthz through the gateway",
            **steps,
            "gateway_overhead": gateway_overhead(steps),
            "healthz_round_trip_ms": floor,
        },
        # Cross-check that no fault fired: both must be 0.
        "plane_stats": {k: stats.get(k) for k in ("route404s", "injected5xx")},
    }
    return report, get_samples, step_samples


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration", type=positive(float), default=10.0, help="control-plane load, seconds"
    )
    parser.add_argument(
        "--steps", type=positive(int), default=300, help="measured optimizer steps per path"
    )
    parser.add_argument(
        "--concurrency", type=positive(int), default=50, help="concurrent get_job tasks"
    )
    parser.add_argument(
        "--client-mode",
        choices=("shared", "per-task"),
        default="per-task",
        help="each load task has its own PlatformClient, or all share one",
    )
    parser.add_argument(
        "--batch", type=positive(int), default=8, help="datums per forward_backward"
    )
    parser.add_argument("--tokens", type=positive(int), default=64, help="input tokens per datum")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG plot path")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    log(f"starting localplane with {json.dumps(PLANE_CONFIG)}")
    with PlaneProcess(config=PLANE_CONFIG) as plane:
        report, get_samples, step_samples = asyncio.run(bench(plane, args))
    report["plot"] = plot(args.out, get_samples, step_samples)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
