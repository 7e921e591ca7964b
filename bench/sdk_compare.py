"""Benchmark: per-step time of one training loop driven through Shepherd, against the same
loop driven directly by the Fireworks SDK, on the same kind of trainer.

The loop is Shepherd's built-in ``supervised`` loop (``shepherd.loops.Supervised``, the same
code in every run): each step ``forward_backward`` of ``--batch-size`` tokenized records of
the ``synthetic:text`` corpus (``cross_entropy`` on the completion tokens) then one Adam
``optim_step``, both submitted before either is awaited. Each ``forward_backward`` also
sleeps ``--step-ms`` on the trainer to emulate a GPU step. Every driver gets its own fresh
trainer job of one config (base model, full-parameter, learning rate, seed, compute delay)
on the same plane, one after the other:

1. **fireworks**: the unmodified ``fireworks-ai`` SDK (``FiretitanServiceClient`` with a
   Fireworks-style key on the job's gateway URL, ``create_training_client``). The loop gets
   the SDK's training client behind a thin adapter that turns the loop's JSON-dialect
   datums and Adam settings into the SDK's own types (what a loop written for it builds).
2. **shepherd_client**: Shepherd's Tinker ``TrainingClient`` in a bare loop (no Temporal):
   the client a loop gets inside the training activity, without the workflow around it.
3. **shepherd**: a Shepherd job (``TrainingJob`` workflow on a Temporal dev server, an
   in-process worker with the event bridge, the spec naming ``training.loop: supervised``),
   one checkpoint at the last step, promote none.

Per-step time: for (1) and (2) ``perf_counter`` around each ``loop.step`` (which awaits
everything it submitted); for (3) the TRAINING phase of the final ``JobStatus.timings``
divided by the steps (the training activities, plus the workflow's chunk boundaries), and,
from the history, the ``train_chunk`` activities' start-to-completion time per step. The
ratio shepherd / fireworks of mean step time is the figure (target ≤ 1.05). The steps'
losses are compared too: the same data and the same weights must give the same losses.

The stack (Temporal dev server, localplane, worker) is started before and stopped after;
its start-up is not timed, and a short unmeasured Shepherd job pays first-workflow costs.

Prints one JSON document on stdout (progress goes to stderr) and writes a PNG plot to
``--out`` when matplotlib is importable.

Run: ``.venv/bin/python bench/sdk_compare.py [--steps 100] [--step-ms 100] [--batch-size 32]
[--rounds 1] [--out bench/out/sdk_compare.png]``; a smoke run: ``--steps 3 --step-ms 1
--batch-size 4``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from fireworks.training.sdk import FiretitanServiceClient
from fireworks.training.sdk import types as fw_types
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from activities.training import loop_context
from localplane.trainer.tokenizer import write_tokenizer_dir
from shepherd import loops
from shepherd.models import JobStatus, LoopSettings
from shepherd.spec import JobSpec
from shepherd.tinker_client import load_tokenizer

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from common import (
    BASE_MODEL,
    STEP_TIMEOUT_S,
    Runner,
    Stack,
    log,
    machine,
    no_plot,
    open_training_client,
    positive,
    pyplot,
    r3,
    run_main,
    save_plot,
    shepherd_stack,
    shepherd_worker,
    summary,
    supervised_create_request,
    supervised_settings,
    supervised_spec,
    supervised_trainer,
    wait_running,
    warm,
)

PLANE_CONFIG: dict[str, Any] = {"capacity": 4}
TARGET_RATIO = 1.05
#: Job creation to a warm route, and one whole driver run, are bounded by these.
STARTUP_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 1800.0
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "sdk_compare.png"


# ------------------------------------------------------------ the Fireworks SDK's client


def _fw_datum(datum: Any) -> Any:
    """A JSON-dialect datum (what the supervised loop builds) as the SDK's ``Datum``."""
    if not isinstance(datum, Mapping):
        return datum
    tokens = [int(t) for chunk in datum["model_input"]["chunks"] for t in chunk["tokens"]]
    return fw_types.Datum(
        model_input=fw_types.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            name: fw_types.TensorData(data=t["data"], dtype=t["dtype"], shape=t.get("shape"))
            for name, t in datum["loss_fn_inputs"].items()
        },
    )


class FireworksLoopClient:
    """The Fireworks SDK's training client as a loop's ``ctx.training_client``: the same
    calls, with the loop's datums and Adam settings turned into the SDK's types."""

    def __init__(self, tc: Any, tokenizer_dir: Path) -> None:
        self.tc = tc
        self.tokenizer_dir = tokenizer_dir

    def forward_backward(
        self, data: list[Any], loss_fn: str, loss_fn_config: Any = None
    ) -> Awaitable[Any]:
        return self.tc.forward_backward([_fw_datum(d) for d in data], loss_fn, loss_fn_config)

    def forward(self, data: list[Any], loss_fn: str, loss_fn_config: Any = None) -> Awaitable[Any]:
        return self.tc.forward([_fw_datum(d) for d in data], loss_fn, loss_fn_config)

    def optim_step(self, params: Any) -> Awaitable[Any]:
        if isinstance(params, Mapping):
            params = fw_types.AdamParams(**params)
        return self.tc.optim_step(params)

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer_dir)

    def get_tokenizer(self) -> Any:
        # The SDK does not ask the trainer for a tokenizer (its get_tokenizer needs a
        # tokenizer_model): the stand-in LM's byte-level tokenizer, written locally.
        return load_tokenizer(str(self.tokenizer_dir))


# ---------------------------------------------------------------------- the bare drivers


async def drive(
    tc: Any, drain: Callable[[], Awaitable[None]], args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """The supervised loop over ``tc`` for ``--steps`` steps: (step ms, loss) per step."""
    ctx = loop_context(tc, _settings(args))
    loop = loops.Supervised()
    times, losses = [], []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        loss = await loop.step(ctx, step)
        await drain()
        times.append((time.perf_counter() - start) * 1000)
        losses.append(float(loss))
    return times, losses


async def _nothing() -> None:
    return None


async def run_bare(
    st: Stack, driver: str, args: argparse.Namespace, tokenizer_dir: Path
) -> dict[str, Any]:
    job_id = f"sdk-{driver.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    log(f"{driver}: {job_id}: {args.steps} steps x {args.step_ms:g} ms")
    client = st.platform
    await client.create_job(
        job_id, supervised_create_request(job_id, _settings(args), args.step_ms)
    )
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT_S):
            await wait_running(client, job_id, last_event_id=0)
            gateway = await client.trainer(job_id)
            await warm(gateway)
        async with asyncio.timeout(RUN_TIMEOUT_S):
            if driver == "fireworks":
                key = await st.admin.create_api_key(st.account_id, key_style="fireworks")
                # The SDK is synchronous at its edges (its own event loop in a thread).
                service = await asyncio.to_thread(
                    FiretitanServiceClient, base_url=gateway.base_url, api_key=key
                )
                try:
                    sdk_tc = await asyncio.to_thread(
                        service.create_training_client, base_model=BASE_MODEL, lora_rank=0
                    )
                    times, losses = await drive(
                        FireworksLoopClient(sdk_tc, tokenizer_dir), _nothing, args
                    )
                finally:
                    await asyncio.to_thread(service.close)
            else:
                tc = await open_training_client(
                    gateway, BASE_MODEL, seed=_settings(args).seed, timeout=STEP_TIMEOUT_S
                )
                times, losses = await drive(tc, tc.drain, args)
    finally:
        await client.delete_job(job_id)
    stats = await st.admin.job_stats(st.job_name(job_id))
    return {
        "trainer_job_id": job_id,
        "step_ms": summary(times, (50, 90)),
        "mean_step_ms": r3(np.mean(times)),
        "mean_step_ms_after_first": r3(np.mean(times[1:])) if len(times) > 1 else None,
        "losses": [round(x, 6) for x in losses],
        "data_plane_requests": stats.get("dataPlane", {}),
    }


# ---------------------------------------------------------------------- through Shepherd


def _settings(args: argparse.Namespace) -> LoopSettings:
    return supervised_settings(steps=args.steps, batch_size=args.batch_size)


def shepherd_spec(name: str, args: argparse.Namespace) -> JobSpec:
    # One checkpoint, at the end: the training steps run uninterrupted.
    checkpoint = {"every_steps": args.steps, "keep_last": 1}
    return supervised_spec(name, _settings(args), args.step_ms, checkpoint)


def _time(e: Any) -> datetime:
    return e.event_time.ToDatetime()


async def chunk_times(handle: WorkflowHandle[Any, Any]) -> list[float]:
    """Seconds from start to completion of each ``train_chunk`` activity (last attempt)."""
    chunks: dict[int, datetime | None] = {}
    out = []
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if e.activity_task_scheduled_event_attributes.activity_type.name == "train_chunk":
                chunks[e.event_id] = None
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            scheduled = e.activity_task_started_event_attributes.scheduled_event_id
            if scheduled in chunks:
                chunks[scheduled] = _time(e)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            started = chunks.get(e.activity_task_completed_event_attributes.scheduled_event_id)
            if started is not None:
                out.append((_time(e) - started).total_seconds())
    return out


async def run_shepherd(
    st: Stack, runner: Runner, name: str, args: argparse.Namespace
) -> dict[str, Any]:
    log(f"shepherd: {name}: {args.steps} steps x {args.step_ms:g} ms")
    start = time.perf_counter()
    handle = await runner.start(shepherd_spec(name, args))
    async with asyncio.timeout(RUN_TIMEOUT_S):
        status: JobStatus = await handle.result()
    wall = time.perf_counter() - start
    if status.phase.value != "COMPLETED" or status.step != args.steps:
        raise RuntimeError(
            f"shepherd job ended {status.phase.value} at step {status.step}: {status.error}"
        )
    chunks = await chunk_times(handle)
    training = status.timings.get("TRAINING", 0.0)
    stats = await st.admin.job_stats(st.job_name(status.trainer_job_id or ""))
    return {
        "workflow_id": handle.id,
        "trainer_job_id": status.trainer_job_id,
        "wall_s": r3(wall),
        "timings_s": {k: r3(v) for k, v in status.timings.items()},
        "mean_step_ms": r3(training / args.steps * 1000),
        "in_activity_mean_step_ms": r3(sum(chunks) / args.steps * 1000) if chunks else None,
        "train_chunks_s": [r3(c) for c in chunks],
        "last_loss": None if status.last_loss is None else round(status.last_loss, 6),
        "data_plane_requests": stats.get("dataPlane", {}),
    }


# ---------------------------------------------------------------------------- report


def one_round(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    fw, client, job = runs["fireworks"], runs["shepherd_client"], runs["shepherd"]
    base = fw["mean_step_ms"]
    in_activity = job["in_activity_mean_step_ms"]
    return {
        **runs,
        "ratio": round(job["mean_step_ms"] / base, 4),
        "ratio_in_activity": None if in_activity is None else round(in_activity / base, 4),
        "ratio_shepherd_client": round(client["mean_step_ms"] / base, 4),
        # Same data, same starting weights, same operations: the same losses, step by step.
        "losses_identical": fw["losses"] == client["losses"]
        and job["last_loss"] == (client["losses"][-1] if client["losses"] else None),
    }


def median(values: list[float]) -> float:
    return float(np.median(np.asarray(values)))


def plot(out: Path, chosen: dict[str, Any]) -> dict[str, Any]:
    """Left: mean step time per driver. Right: each bare driver's step times over the run."""
    plt = pyplot()
    if plt is None:
        return no_plot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    bars = [
        ("Fireworks SDK", chosen["fireworks"]["mean_step_ms"]),
        ("Shepherd client\n(no workflow)", chosen["shepherd_client"]["mean_step_ms"]),
        ("Shepherd job\n(in activity)", chosen["shepherd"]["in_activity_mean_step_ms"] or 0.0),
        ("Shepherd job\n(TRAINING phase)", chosen["shepherd"]["mean_step_ms"]),
    ]
    left.bar(range(len(bars)), [v for _, v in bars], color=plt.get_cmap("tab10").colors[:4])
    for x, (_, v) in enumerate(bars):
        left.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    left.set_xticks(range(len(bars)), [k for k, _ in bars], fontsize=8)
    left.set(
        ylabel="mean time per step (ms)", title=f"Shepherd / Fireworks = {chosen['ratio']:.3f}"
    )
    left.grid(True, axis="y", alpha=0.3)
    for key, label in (("fireworks", "Fireworks SDK"), ("shepherd_client", "Shepherd client")):
        values = chosen[key]["step_ms"]["values"]
        right.plot(range(1, len(values) + 1), values, label=label, linewidth=1)
    right.axhline(
        chosen["shepherd"]["mean_step_ms"], color="red", linestyle="--", label="Shepherd job (mean)"
    )
    right.set(xlabel="step", ylabel="ms", title="Time per step")
    right.grid(True, alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    return save_plot(plt, fig, out)


# ------------------------------------------------------------------------------- run


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    tokenizer_dir = write_tokenizer_dir(Path(tempfile.mkdtemp(prefix="bench-tok-")) / "bytes")
    async with (
        shepherd_stack(PLANE_CONFIG) as st,
        shepherd_worker(st, "sdk-compare", events=True) as runner,
    ):
        # Not measured: pays the first workflow's sandbox imports and the plane's first trainer.
        warmup_args = argparse.Namespace(**{**vars(args), "steps": 2})
        await run_shepherd(st, runner, "sdk-compare-warmup", warmup_args)
        rounds = []
        for r in range(args.rounds):
            runs = {
                "fireworks": await run_bare(st, "fireworks", args, tokenizer_dir),
                "shepherd_client": await run_bare(st, "shepherd_client", args, tokenizer_dir),
                "shepherd": await run_shepherd(st, runner, f"sdk-compare-{r}", args),
            }
            rounds.append(one_round(runs))
            log(
                f"round {r + 1}: fireworks {runs['fireworks']['mean_step_ms']:.1f} ms/step, "
                f"shepherd {runs['shepherd']['mean_step_ms']:.1f} ms/step, "
                f"ratio {rounds[-1]['ratio']:.4f}"
            )
    ratios = [x["ratio"] for x in rounds]
    ratio = median(ratios)
    chosen = min(rounds, key=lambda x: abs(x["ratio"] - ratio))
    return {
        "benchmark": "sdk_compare",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "settings": {
            "steps": args.steps,
            "step_ms": args.step_ms,
            "rounds": args.rounds,
            "order": "each round: fireworks, shepherd_client, shepherd; one fresh trainer each",
            "trainer": supervised_trainer(_settings(args), args.step_ms),
            "loop": {
                "name": "supervised (shepherd.loops.Supervised)",
                **_settings(args).model_dump(exclude={"loop", "total_steps"}),
            },
            "fireworks_sdk": "fireworks-ai FiretitanServiceClient.create_training_client "
            "(Fireworks-style key, the job's gateway URL)",
            "shepherd": "one checkpoint at the last step, promote none, policies default; "
            "in-process Worker + EventBridge",
        },
        "method": {
            "bare_step": "perf_counter around each loop.step (all its futures awaited)",
            "shepherd_step": "JobStatus.timings TRAINING / steps",
            "shepherd_in_activity_step": "sum of train_chunk start→completion (history) / steps",
            "ratio": "shepherd mean step / fireworks mean step (median over rounds)",
            "excluded": "stack start-up, job creation and warm-up, one unmeasured Shepherd job",
        },
        "fireworks_mean_step_ms": median([x["fireworks"]["mean_step_ms"] for x in rounds]),
        "shepherd_client_mean_step_ms": median(
            [x["shepherd_client"]["mean_step_ms"] for x in rounds]
        ),
        "shepherd_mean_step_ms": median([x["shepherd"]["mean_step_ms"] for x in rounds]),
        "ratio": round(ratio, 4),
        "ratio_max": round(max(ratios), 4),
        "ratio_in_activity": chosen["ratio_in_activity"],
        "target_ratio": TARGET_RATIO,
        "target_met": ratio <= TARGET_RATIO,
        "target_note": "met when the median ratio over rounds is <= the target",
        "losses_identical": all(x["losses_identical"] for x in rounds),
        "rounds": rounds,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive(int), default=100, help="optimizer steps per run")
    parser.add_argument(
        "--step-ms", type=positive(float), default=100.0, help="emulated GPU time per step (ms)"
    )
    parser.add_argument(
        "--batch-size", type=positive(int), default=32, help="records per forward_backward"
    )
    parser.add_argument("--rounds", type=positive(int), default=1, help="rounds of all drivers")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG plot path")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    def plot_report(report: dict[str, Any]) -> dict[str, Any]:
        chosen = min(report["rounds"], key=lambda x: abs(x["ratio"] - report["ratio"]))
        return plot(args.out, chosen)

    run_main(lambda: bench(args), plot_report)


if __name__ == "__main__":
    main()
