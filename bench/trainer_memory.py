"""Benchmark: does a trainer's memory stay bounded over a long RL run?

An RL loop the way tinker-cookbook writes one, driven by the unmodified ``tinker`` SDK against
one localplane trainer (its own address, no gateway, every fault off), for ``--steps`` steps
(10,000 by default). Each step:

1. ``save_weights_and_get_sampling_client(record_stability_info=True)``: a new sampler per
   step (a sampling session and a weights snapshot on the trainer, as the cookbook's
   ``rl/train.py`` takes one per batch);
2. ``sample``: ``--groups`` requests, each ``--group-size`` completions of its own short
   arithmetic prompt, submitted together as the cookbook submits a batch of GRPO groups (no
   seed: the trainer's default seed and its per-sampler occurrence table; the sequences are
   recorded for provenance);
3. ``forward_backward`` with ``stable_reinforce`` over datums whose spans name the sampled
   sequences (so the trainer resolves them against its recorded-sequence table), advantages
   from a toy reward (how many digits were sampled, centred per group);
4. ``optim_step`` (Adam);
5. every ``--save-every`` steps, ``save_state`` with ``ttl_seconds=--ttl`` (rolling
   checkpoints, expired ones swept by the plane).

Every per-session and per-call table of the trainer is bounded by count and age
(``localplane/limits.py``), so once the count-bounded ones are full (with the defaults, by
step ~1,000: 32 samplers, 1,024 operations per model, 4,096 loose futures at 4 sample
requests a step, 16,384 recorded sequences at 16 a step) its resident memory should be flat.
Warm-up (``--warmup``, 2,000 steps) covers that. The trainer's RSS (``VmRSS`` of
``/proc/<pid>/status``, pid from the plane's admin API) and its table sizes (its healthz
``tables``) are read every ``--sample-every`` steps; the report gives the least-squares slope
of RSS against the step number over the samples after warm-up (KiB per 1,000 steps), the RSS
at the end of warm-up and at the end, the step at which each table stopped growing, and the
table sizes at the end next to their limits.

Prints one JSON document on stdout (progress goes to stderr); writes a PNG plot of RSS against
step to ``--out`` when matplotlib is importable.

Run: ``PYTHONPATH=. .venv/bin/python bench/trainer_memory.py [--steps 10000] [--warmup 2000]
[--groups 4] [--group-size 4] [--max-tokens 8] [--lora-rank 4] [--sample-every 50]
[--save-every 500] [--ttl 60] [--out bench/out/trainer_memory.png]``; a smoke run:
``--steps 200 --warmup 50 --sample-every 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import httpx

from localplane import limits
from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import PlatformClient
from shepherd.platform.models import CreateTrainerJobRequest, TrainingConfig

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from common import BASE_MODEL, log, machine, no_plot, positive, pyplot, save_plot, wait_running

#: Every fault off: the trainer's own memory is measured, nothing injected.
PLANE_CONFIG = {
    "routeLagSeconds": {"min": 0, "max": 0},
    "gateway404Rate": 0,
    "controlPlane5xxRate": 0,
    "capacity": 1,
}
JOB_ID = "bench-trainer-memory"
STARTUP_TIMEOUT_S = 60.0
#: Per SDK call: the stand-in LM answers in milliseconds; a stuck trainer fails the run.
CALL_TIMEOUT_S = 60.0
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "trainer_memory.png"
LEARNING_RATE = 1e-3


def rss_kib(pid: int) -> int:
    """Resident set size of a process in KiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def slope_per_1000(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of RSS (KiB) against step, in KiB per 1,000 steps."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(s for s, _ in points) / n
    my = sum(r for _, r in points) / n
    sxx = sum((s - mx) ** 2 for s, _ in points)
    sxy = sum((s - mx) * (r - my) for s, r in points)
    return 1000.0 * sxy / sxx if sxx else 0.0


def reward(tokens: list[int]) -> float:
    """A toy reward: the digits among the sampled bytes."""
    return float(sum(48 <= t <= 57 for t in tokens))


def rl_datums(types: Any, prompt: list[int], sequences: list[Any]) -> list[Any]:
    """One group's policy-gradient datums over prompt + sample, with spans naming the sampled
    sequence (the trainer resolves prompt and sampled tokens and the behaviour logprobs from
    its record)."""
    rewards = [reward(list(s.tokens)) for s in sequences]
    mean = sum(rewards) / len(rewards)
    datums = []
    for seq, r in zip(sequences, rewards, strict=True):
        tokens = list(seq.tokens)
        full = prompt + tokens
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(full[:-1]),
            loss_fn_inputs={
                "target_tokens": full[1:],
                "logprobs": [0.0] * (len(prompt) - 1) + list(seq.logprobs or [0.0] * len(tokens)),
                "advantages": [0.0] * (len(prompt) - 1) + [r - mean] * len(tokens),
            },
        )
        sid = seq.sequence_id
        datums.append(
            datum.with_provenance(
                model_input=[
                    types.PromptProvenanceSpan(sequence_id=sid, length=len(prompt)),
                    types.SampledProvenanceSpan(sequence_id=sid, length=len(tokens) - 1),
                ],
                loss_fn_inputs=[
                    types.PromptProvenanceSpan(sequence_id=sid, offset=1, length=len(prompt) - 1),
                    types.SampledProvenanceSpan(sequence_id=sid, length=len(tokens)),
                ],
            )
        )
    return datums


def run_loop(
    base_url: str, api_key: str, pid: int, args: argparse.Namespace
) -> tuple[list[tuple[int, int]], list[tuple[int, dict[str, Any]]], dict[str, Any]]:
    """The RL loop (blocking: the SDK runs its own event loop in a thread). Returns the RSS
    samples as (step, KiB), the trainer's table sizes at the same steps, and what the loop
    counted."""
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=base_url, api_key=api_key)
    counts = {"samples": 0, "datums": 0, "checkpoints": 0, "skipped_batches": 0}
    points: list[tuple[int, int]] = [(0, rss_kib(pid))]
    table_sizes: list[tuple[int, dict[str, Any]]] = []
    adam = types.AdamParams(learning_rate=LEARNING_RATE)
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    rng = random.Random(0)
    started = time.monotonic()
    try:
        training = service.create_lora_training_client(
            base_model=BASE_MODEL, rank=args.lora_rank
        ).result(CALL_TIMEOUT_S)
        for step in range(1, args.steps + 1):
            sampler = training.save_weights_and_get_sampling_client(
                record_stability_info=True
            ).result(CALL_TIMEOUT_S)
            prompts = [
                list(f"{rng.randrange(100)}+{rng.randrange(100)}=".encode())
                for _ in range(args.groups)
            ]
            pending = [
                sampler.sample(types.ModelInput.from_ints(p), args.group_size, params)
                for p in prompts
            ]
            datums = []
            for p, fut in zip(prompts, pending, strict=True):
                sampled = fut.result(CALL_TIMEOUT_S)
                counts["samples"] += len(sampled.sequences)
                sequences = [s for s in sampled.sequences if len(s.tokens) >= 2]
                if sequences:
                    datums += rl_datums(types, p, sequences)
            if datums:
                counts["datums"] += len(datums)
                training.forward_backward(datums, "stable_reinforce").result(CALL_TIMEOUT_S)
            else:
                counts["skipped_batches"] += 1
            training.optim_step(adam).result(CALL_TIMEOUT_S)
            if args.save_every and step % args.save_every == 0:
                training.save_state(f"rolling-{step}", ttl_seconds=args.ttl).result(CALL_TIMEOUT_S)
                counts["checkpoints"] += 1
            if step % args.sample_every == 0:
                points.append((step, rss_kib(pid)))
                table_sizes.append((step, tables(base_url, api_key)))
            if step % max(args.steps // 20, 1) == 0:
                rate = step / (time.monotonic() - started)
                log(
                    f"step {step}/{args.steps}: RSS {points[-1][1] / 1024:.1f} MiB, {rate:.1f} steps/s"
                )
    finally:
        service.close("success").result(CALL_TIMEOUT_S)
    counts["wall_seconds"] = round(time.monotonic() - started, 1)
    return points, table_sizes, counts


def tables(base_url: str, api_key: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{base_url}/api/v1/healthz", headers={"X-Api-Key": api_key}, timeout=CALL_TIMEOUT_S
    )
    answer.raise_for_status()
    return answer.json().get("tables", {})


async def setup(plane: PlaneProcess) -> tuple[str, str, int]:
    """A tinker-style account, one LoRA job RUNNING; its trainer's direct URL, key and pid."""
    async with PlaneAdmin(plane.url, plane.admin_key) as admin:
        account, api_key = await admin.create_account(key_style="tinker")
        async with PlatformClient(plane.url, api_key, account_id=account) as client:
            request = CreateTrainerJobRequest(
                training_config=TrainingConfig(base_model=BASE_MODEL, lora_rank=4)
            )
            await client.create_job(JOB_ID, request)
            async with asyncio.timeout(STARTUP_TIMEOUT_S):
                await wait_running(client, JOB_ID)
        internals = await admin.job(JOB_ID, account=account)
    trainer = internals["trainer"]
    return str(trainer["url"]).rstrip("/"), api_key, int(trainer["pid"])


def plot(out: Path, points: list[tuple[int, int]], warmup: int) -> dict[str, Any]:
    plt = pyplot()
    if plt is None:
        return no_plot()
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([s for s, _ in points], [r / 1024 for _, r in points], lw=1)
    ax.axvline(warmup, color="grey", ls="--", lw=0.8, label="end of warm-up")
    ax.set_xlabel("step")
    ax.set_ylabel("trainer RSS (MiB)")
    ax.set_title("localplane trainer memory over an RL loop (sampler per step)")
    ax.legend()
    return save_plot(plt, fig, out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=positive(int), default=10_000)
    p.add_argument("--warmup", type=int, default=2_000, help="steps before the slope is fitted")
    p.add_argument("--groups", type=positive(int), default=4, help="sample requests per step")
    p.add_argument("--group-size", type=positive(int), default=4, help="samples per request")
    p.add_argument("--max-tokens", type=positive(int), default=8)
    p.add_argument("--lora-rank", type=int, default=4)
    p.add_argument("--sample-every", type=positive(int), default=50, help="steps per RSS read")
    p.add_argument("--save-every", type=int, default=500, help="0: no rolling checkpoints")
    p.add_argument("--ttl", type=positive(int), default=60, help="rolling checkpoints' TTL (s)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.warmup >= args.steps:
        p.error("--warmup must be below --steps")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    log(f"starting localplane with {json.dumps(PLANE_CONFIG)}")
    with PlaneProcess(config=PLANE_CONFIG) as plane:
        base_url, api_key, pid = asyncio.run(setup(plane))
        log(f"trainer pid {pid} at {base_url}; {args.steps} steps")
        points, table_sizes, counts = run_loop(base_url, api_key, pid, args)
        end_tables = tables(base_url, api_key)
    after = [p for p in points if p[0] >= args.warmup]
    filled = {
        name: next(
            (step for step, sizes in table_sizes if sizes.get(name) == value),
            None,
        )
        for name, value in end_tables.items()
        if isinstance(value, int)
    }
    slope = slope_per_1000(after)
    report = {
        "benchmark": "trainer_memory",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(implementation=True, load_average=False),
        "loop": {
            "sdk": "tinker (unmodified), direct to the trainer",
            "steps": args.steps,
            "step": (
                f"save_weights_and_get_sampling_client(record_stability_info) -> {args.groups} "
                f"sample requests x {args.group_size} samples x {args.max_tokens} tokens "
                "(default seed) -> forward_backward "
                "stable_reinforce with provenance spans -> optim_step Adam"
                + (
                    f"; save_state ttl {args.ttl}s every {args.save_every}"
                    if args.save_every
                    else ""
                )
            ),
            "lora_rank": args.lora_rank,
            **counts,
        },
        "rss": {
            "warmup_steps": args.warmup,
            "samples_after_warmup": len(after),
            "slope_kib_per_1000_steps": round(slope, 1),
            "slope_kib_per_step": round(slope / 1000, 3),
            "start_mib": round(points[0][1] / 1024, 1),
            "end_of_warmup_mib": round(after[0][1] / 1024, 1),
            "end_mib": round(points[-1][1] / 1024, 1),
            "max_mib": round(max(r for _, r in points) / 1024, 1),
            "method": (
                "VmRSS of the trainer process every sample-every steps; least-squares slope "
                "over the samples at or after the warm-up step"
            ),
        },
        "tables_at_end": end_tables,
        "tables_reached_final_size_at_step": filled,
        "limits": {
            "MAX_SAMPLERS": limits.MAX_SAMPLERS,
            "MAX_RECORDED_SEQUENCES": limits.MAX_RECORDED_SEQUENCES,
            "MAX_SAMPLE_OCCURRENCES": limits.MAX_SAMPLE_OCCURRENCES,
            "MAX_SESSIONS": limits.MAX_SESSIONS,
            "MAX_LOOSE_FUTURES": limits.MAX_LOOSE_FUTURES,
            "SEQUENCE_WINDOW": limits.SEQUENCE_WINDOW,
        },
        "rss_points": points,
    }
    report["plot"] = plot(args.out, points, args.warmup)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
