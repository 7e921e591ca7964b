"""Benchmark: what running a job through Shepherd costs, against a bare loop on the same trainer.

One job of ``--steps`` optimizer steps of the built-in ``supervised`` loop (the stand-in
byte-level LM, ``cross_entropy`` on ``--batch-size`` tokenized records of the
``synthetic:text`` corpus; each ``forward_backward`` also sleeps ``--step-ms`` on the trainer
to emulate a GPU step), a checkpoint every ``--every`` steps and an evaluation at each
checkpoint, run twice on the same plane with the same trainer config, one after the other:

1. **bare**: a plain Python loop on the Tinker API — create the trainer job
   (``PlatformClient``), wait for RUNNING on the event stream, warm the route up (3
   consecutive ``healthz``, spaced like Shepherd's), open a session and a model, then run
   the very same ``shepherd.loops.Supervised`` loop object over Shepherd's Tinker
   ``TrainingClient`` (the same requests, the same ``seq_id``s); every ``--every`` steps
   ``save_state`` + ``save_weights_for_sampler`` and the loop's evaluation (a ``forward``),
   then delete the job.
2. **shepherd**: the ``TrainingJob`` workflow (start → result) on a real Temporal dev server
   with an in-process worker and the event bridge running (Shepherd's default set-up), doing
   the same work: ``output.promote: none`` and ``checkpoint.keep_last`` large enough that no
   checkpoint is pruned, so neither run does work the other does not.

Reported: both wall times, their ratio (target ≤ 1.05), Shepherd's time per phase (the final
``JobStatus.timings``) next to the bare loop's time in the matching stretch, the workflow's
history size and its activities. The stack (Temporal dev server, localplane, worker) is
started before and stopped after; its start-up is not timed. One short Shepherd job runs first
and is not measured, so first-workflow costs (sandbox imports, caches) do not land on it.

Prints one JSON document on stdout (progress goes to stderr) and writes a PNG plot to
``--out`` when matplotlib is importable.

Run: ``.venv/bin/python bench/overhead.py [--steps 500] [--step-ms 200] [--every 50]
[--rounds 1] [--batch-size 32] [--out bench/out/overhead.png]``; a quick run:
``--steps 100 --step-ms 50``; a smoke run: ``--steps 4 --every 2 --step-ms 1 --batch-size 4``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from activities.checkpoints import SAMPLER_SUFFIX
from activities.training import loop_context
from shepherd import loops
from shepherd.models import JobStatus

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
    supervised_create_request,
    supervised_settings,
    supervised_spec,
    supervised_trainer,
    wait_running,
    warm,
)

#: The plane's defaults (route lag 0-0.3 s per gateway replica, no injected faults), with
#: room for the warm-up job's trainer next to the measured one.
PLANE_CONFIG: dict[str, Any] = {"capacity": 4}
TARGET_RATIO = 1.05
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "overhead.png"

#: How Shepherd's phases and the bare loop's stretches line up, for the side-by-side view.
#: ``outside`` is Shepherd's wall time not inside any phase (start RPC, first workflow task,
#: result delivery); ``other`` is the bare loop's own bookkeeping between timed calls.
CATEGORIES: list[tuple[str, list[str], list[str]]] = [
    ("workflow start/result", ["PENDING", "outside"], ["other"]),
    ("create → RUNNING", ["QUEUED", "SCHEDULING"], ["create", "until_running"]),
    ("route warm-up + open model", ["PREPARING"], ["warm_up", "open_model"]),
    ("training steps", ["TRAINING"], ["training"]),
    ("checkpoint + evaluate", ["CHECKPOINTING"], ["checkpointing"]),
    ("final evaluation + delete", ["EVALUATING", "EXPORTING"], ["delete"]),
]


# ---------------------------------------------------------------------- the bare loop


async def run_bare(st: Stack, job_id: str, args: argparse.Namespace) -> dict[str, Any]:
    client = st.platform
    phases: defaultdict[str, float] = defaultdict(float)
    clock = time.perf_counter

    def since(mark: float, phase: str) -> float:
        now = clock()
        phases[phase] += now - mark
        return now

    log(f"bare: {job_id}: {args.steps} steps x {args.step_ms:g} ms, checkpoint every {args.every}")
    start = mark = clock()
    settings = supervised_settings(steps=args.steps, batch_size=args.batch_size)
    await client.create_job(job_id, supervised_create_request(job_id, settings, args.step_ms))
    try:
        mark = since(mark, "create")
        async with asyncio.timeout(300):
            await wait_running(client, job_id, last_event_id=0)  # replayed: no race
        mark = since(mark, "until_running")
        trainer = await client.trainer(job_id)
        async with asyncio.timeout(120):
            route_404s = await warm(trainer)
        mark = since(mark, "warm_up")
        tc = await open_training_client(
            trainer, BASE_MODEL, seed=settings.seed, timeout=STEP_TIMEOUT_S
        )
        ctx = loop_context(tc, settings)
        loop = loops.Supervised()
        mark = since(mark, "open_model")
        for step in range(1, args.steps + 1):
            await loop.step(ctx, step)
            await tc.drain()
            mark = since(mark, "training")
            if step % args.every == 0 or step == args.steps:
                name = f"step-{step:08d}"
                state = tc.save_state(name)
                sampler = tc.save_weights_for_sampler(name + SAMPLER_SUFFIX)
                await state
                await sampler
                await loop.evaluate(ctx)
                mark = since(mark, "checkpointing")
            if step % 100 == 0:
                log(f"bare: step {step}/{args.steps}")
    finally:
        mark = clock()
        await client.delete_job(job_id)
    since(mark, "delete")
    wall = clock() - start
    phases["other"] = wall - sum(phases.values())
    stats = await st.admin.job_stats(st.job_name(job_id))
    return {
        "job_id": job_id,
        "wall_s": r3(wall),
        "phases_s": {k: r3(v) for k, v in phases.items()},
        "warm_up_404s_seen": route_404s,
        "plane_job_stats": stats,
    }


# ---------------------------------------------------------------------- through Shepherd


async def history_summary(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    events = 0
    scheduled: Counter[str] = Counter()
    kinds: dict[int, str] = {}
    retries: Counter[str] = Counter()
    async for e in handle.fetch_history_events():
        events += 1
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            kinds[e.event_id] = name
            scheduled[name] += 1
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = e.activity_task_started_event_attributes
            if started.attempt > 1:
                retries[kinds.get(started.scheduled_event_id, "?")] += started.attempt - 1
    return {
        "history_events": events,
        "activities_scheduled": dict(scheduled),
        "activity_retries": dict(retries),
    }


async def run_shepherd(
    st: Stack, runner: Runner, name: str, steps: int, every: int, step_ms: float, batch_size: int
) -> dict[str, Any]:
    spec = supervised_spec(
        name,
        supervised_settings(steps=steps, batch_size=batch_size),
        step_ms,
        # Keep every checkpoint: the bare loop prunes none either.
        {"every_steps": every, "keep_last": min(1000, steps // every + 1)},
    )
    log(f"shepherd: {name}: {steps} steps x {step_ms:g} ms, checkpoint every {every}")
    start = time.perf_counter()
    handle = await runner.start(spec)
    status: JobStatus = await handle.result()
    wall = time.perf_counter() - start
    if status.phase.value != "COMPLETED" or status.step != steps:
        raise RuntimeError(
            f"shepherd job ended {status.phase.value} at step {status.step}: {status.error}"
        )
    phases = dict(status.timings)
    phases["outside"] = wall - sum(phases.values())
    stats = await st.admin.job_stats(st.job_name(status.trainer_job_id or ""))
    return {
        "workflow_id": handle.id,
        "trainer_job_id": status.trainer_job_id,
        "wall_s": r3(wall),
        "phases_s": {k: r3(v) for k, v in phases.items()},
        **await history_summary(handle),
        "continued_as_new": status.continued_as_new,
        "checkpoints": len(status.checkpoints),
        "route_races": status.route_races,
        "recoveries": len(status.recoveries),
        "plane_job_stats": stats,
    }


# ---------------------------------------------------------------------------- report


def by_category(bare: dict[str, Any], shepherd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for label, shepherd_keys, bare_keys in CATEGORIES:
        s = sum(shepherd["phases_s"].get(k, 0.0) for k in shepherd_keys)
        b = sum(bare["phases_s"].get(k, 0.0) for k in bare_keys)
        out[label] = {
            "shepherd_s": r3(s),
            "bare_s": r3(b),
            "extra_s": r3(s - b),
            "shepherd_phases": "+".join(shepherd_keys),
            "bare_stretches": "+".join(bare_keys),
        }
    return out


def one_round(
    bare: dict[str, Any], shepherd: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    ratio = shepherd["wall_s"] / bare["wall_s"]
    extra = shepherd["wall_s"] - bare["wall_s"]
    chunks = shepherd["activities_scheduled"].get("train_chunk", 0)
    train_extra = shepherd["phases_s"].get("TRAINING", 0.0) - bare["phases_s"].get("training", 0.0)
    return {
        "bare": bare,
        "shepherd": shepherd,
        "ratio": round(ratio, 4),
        "extra_s": r3(extra),
        "extra_per_step_ms": r3(extra / args.steps * 1000),
        "training_extra_per_chunk_ms": r3(train_extra / chunks * 1000) if chunks else None,
        "by_phase": by_category(bare, shepherd),
    }


def median(values: list[float]) -> float:
    return float(np.median(np.asarray(values)))


# ------------------------------------------------------------------------------ plot


def plot(out: Path, chosen: dict[str, Any]) -> dict[str, Any]:
    """Left: the two wall times as bars stacked by phase. Right: every phase but training,
    side by side, where Shepherd's extra time shows."""
    plt = pyplot()
    if plt is None:
        return no_plot()

    phases = chosen["by_phase"]
    labels = list(phases)
    colors = plt.get_cmap("tab10").colors
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1, 1.6]}
    )
    runs = [
        ("bare loop", "bare_s", chosen["bare"]["wall_s"]),
        ("Shepherd", "shepherd_s", chosen["shepherd"]["wall_s"]),
    ]
    for x, (_name, key, wall) in enumerate(runs):
        bottom = 0.0
        for i, label in enumerate(labels):
            height = max(phases[label][key], 0.0)
            left.bar(
                x,
                height,
                bottom=bottom,
                color=colors[i % len(colors)],
                label=label if x == 0 else None,
            )
            bottom += height
        left.text(x, wall, f"{wall:.1f} s", ha="center", va="bottom")
    left.set_xticks(range(len(runs)), [name for name, _, _ in runs])
    left.set(ylabel="wall time (s)", title=f"Wall time (Shepherd / bare = {chosen['ratio']:.3f})")
    # Room above the bars for the legend (the training bar fills everything below).
    left.set_ylim(0, max(wall for _, _, wall in runs) * 1.45)
    left.legend(fontsize=8, loc="upper center", ncol=2)

    rest = [label for label in labels if label != "training steps"]
    xs = np.arange(len(rest))
    width = 0.38
    right.bar(xs - width / 2, [phases[label]["bare_s"] for label in rest], width, label="bare loop")
    right.bar(
        xs + width / 2, [phases[label]["shepherd_s"] for label in rest], width, label="Shepherd"
    )
    right.set_xticks(
        xs, [label.replace(" + ", " +\n").replace(" → ", " →\n") for label in rest], fontsize=8
    )
    training = phases["training steps"]
    right.set(
        ylabel="seconds",
        title=f"Everything but the training steps (those: {training['extra_s']:+.2f} s for Shepherd)",
    )
    right.legend()
    right.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return save_plot(plt, fig, out)


# ------------------------------------------------------------------------------- run


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    async with (
        shepherd_stack(PLANE_CONFIG) as st,
        # Shepherd's default set-up: one worker with the event bridge, for every job.
        shepherd_worker(st, "overhead", events=True) as runner,
    ):
        # Not measured: pays the first workflow's sandbox imports and the plane's first trainer.
        warmup = await run_shepherd(st, runner, "overhead-warmup", 2, 2, 0, args.batch_size)
        rounds = []
        for r in range(args.rounds):
            bare = await run_bare(st, f"overhead-bare-{r}-{uuid.uuid4().hex[:6]}", args)
            shepherd = await run_shepherd(
                st,
                runner,
                f"overhead-shepherd-{r}",
                args.steps,
                args.every,
                args.step_ms,
                args.batch_size,
            )
            rounds.append(one_round(bare, shepherd, args))
            log(
                f"round {r + 1}: bare {bare['wall_s']:.2f} s, shepherd {shepherd['wall_s']:.2f} s, "
                f"ratio {rounds[-1]['ratio']:.4f}"
            )
        effective = await st.admin.faults()

    ratios = [x["ratio"] for x in rounds]
    ratio = median(ratios)
    chosen = min(rounds, key=lambda x: abs(x["ratio"] - ratio))
    floor = args.steps * args.step_ms / 1000
    settings = supervised_settings(steps=args.steps, batch_size=args.batch_size)
    return {
        "benchmark": "overhead",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "settings": {
            "steps": args.steps,
            "step_ms": args.step_ms,
            "checkpoint_every": args.every,
            "checkpoints": args.steps // args.every + (args.steps % args.every != 0),
            "rounds": args.rounds,
            "order": "each round: bare loop first, then Shepherd, sequentially on the same plane",
            "trainer": supervised_trainer(settings, args.step_ms),
            "loop": {
                "name": "supervised (shepherd.loops.Supervised, the same object in both runs)",
                **settings.model_dump(exclude={"loop", "total_steps"}),
                "checkpoint": "save_state + save_weights_for_sampler, then the loop's evaluate",
            },
            "shepherd": {
                "output.promote": "none (the bare loop promotes nothing either)",
                "checkpoint.keep_last": "all (no pruning, like the bare loop)",
                "checkpoint.evaluate": True,
                "steps_per_chunk": min(args.every, 50),
                "policies": "spec defaults (poll_interval 5s, warmup_probes 3)",
                "worker": "in-process Worker (SDK defaults) + EventBridge on the account's SSE stream",
            },
        },
        "plane": {"requested_config": PLANE_CONFIG, "effective_config": effective},
        "method": {
            "bare_wall": "perf_counter from before create_job to after delete_job returns",
            "shepherd_wall": "perf_counter from before start_workflow to handle.result() returning",
            "excluded": "stack start-up and one unmeasured 2-step warm-up job through Shepherd",
            "shepherd_phases": "the final JobStatus.timings; 'outside' = wall - sum(timings)",
            "bare_phases": "the loop's own perf_counter around each kind of call",
        },
        "compute_floor_s": r3(floor),
        "bare_wall_s": median([x["bare"]["wall_s"] for x in rounds]),
        "shepherd_wall_s": median([x["shepherd"]["wall_s"] for x in rounds]),
        "ratio": round(ratio, 4),
        "ratio_max": round(max(ratios), 4),
        "target_ratio": TARGET_RATIO,
        "target_met": ratio <= TARGET_RATIO,
        "target_note": "met when the median ratio over rounds is <= the target",
        "history_events": chosen["shepherd"]["history_events"],
        "shepherd_timings_s": chosen["shepherd"]["phases_s"],
        "by_phase": chosen["by_phase"],
        "rounds": rounds,
        "warmup_job": {"wall_s": warmup["wall_s"], "phases_s": warmup["phases_s"]},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive(int), default=500, help="optimizer steps per job")
    parser.add_argument(
        "--step-ms", type=positive(float), default=200.0, help="emulated GPU time per step (ms)"
    )
    parser.add_argument("--every", type=positive(int), default=50, help="checkpoint every N steps")
    parser.add_argument(
        "--rounds", type=positive(int), default=1, help="bare+Shepherd pairs to run"
    )
    parser.add_argument(
        "--batch-size", type=positive(int), default=32, help="records per forward_backward"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG plot path")
    args = parser.parse_args(argv)
    if args.every > args.steps:
        parser.error("--every must be <= --steps")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    def plot_report(report: dict[str, Any]) -> dict[str, Any]:
        # The round closest to the median ratio, the one the report's summary fields describe.
        chosen = min(report["rounds"], key=lambda x: abs(x["ratio"] - report["ratio"]))
        return plot(args.out, chosen)

    run_main(lambda: bench(args), plot_report)


if __name__ == "__main__":
    main()
