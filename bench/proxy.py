"""Benchmark: what Shepherd's data-plane proxy costs a Tinker program.

The program is a plain ``tinker``-SDK loop (this file run as ``python bench/proxy.py
program``): each step submits a ``forward_backward`` (cross-entropy over ``--batch`` lines)
and an ``optim_step``, then waits for both, and prints the step's wall time. Each
``forward_backward`` sleeps ``--step-ms`` on the trainer to emulate a GPU step. Every run gets
a fresh trainer job of one config, one after the other, on one localplane:

1. **direct**: the program against the job's gateway URL, the trainer speaking both dialects
   (the tinker SDK sends ``forward_backward`` as protobuf) — a program without Shepherd;
2. **proxy**: the same program through a :class:`~shepherd.proxy.ProgramProxy` (in this
   process) to a JSON-only trainer (``trainerProtobuf: false``, as hosted trainers are), with
   Shepherd's checkpoints every ``--checkpoint-every`` steps and the per-step weights digest
   (a ``get_info`` after every step; ``--no-digests`` leaves it out, as the proxy does by
   itself on a trainer that reports no digest, e.g. a hosted one).

``rounds`` alternate the two. Figures:

* ``step_ratio``: mean step time proxy / direct (target ≤ 1.05), with each run's mean,
  median and p90, and whether the losses were equal (they must be: same data, same weights);
* per preemption of a proxied run (``--preemptions`` of them, evenly spread): the lifecycle's
  steps as this harness plays them (preempt → FAILED seen, resume → RUNNING, warm-up), then
  ``attach`` — and the proxy's own share of the time to the program's next answered request:
  ``attach start → first answer`` minus the redo (target ≤ 1 s); the redo's length
  (operations and optimizer steps: at most a checkpoint interval plus what the program had
  in flight).

Prints one JSON document on stdout (progress on stderr). Run:
``.venv/bin/python bench/proxy.py [--steps 60] [--step-ms 100] [--rounds 4]
[--preemptions 3] [--checkpoint-every 10]``; a smoke run: ``--steps 6 --step-ms 5
--rounds 1 --preemptions 1 --checkpoint-every 2``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parents[1]
BASE_MODEL = "accounts/fireworks/models/qwen3-8b"
RANK = 8
LINES = [
    "the cat sat on the mat. ",
    "the dog sat on the log. ",
    "a cat and a dog. ",
    "hello world, hello there. ",
]


# ------------------------------------------------------------------- the program


def program(steps: int, batch: int) -> None:
    """The measured program: a tinker loop, as a user writes one."""
    import tinker  # noqa: PLC0415 - only the program process needs the SDK
    from tinker import types  # noqa: PLC0415

    def datum(text: str) -> types.Datum:
        tokens = list(text.encode())
        n = len(tokens) - 1
        return types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": types.TensorData(data=tokens[1:], dtype="int64", shape=[n]),
                "weights": types.TensorData(data=[1.0] * n, dtype="float32", shape=[n]),
            },
        )

    with tinker.ServiceClient() as service:
        training = service.create_lora_training_client(
            base_model=BASE_MODEL, rank=RANK, seed=0
        ).result()
        data = [datum(LINES[i % len(LINES)]) for i in range(batch)]
        adam = types.AdamParams(learning_rate=1e-3)
        for step in range(1, steps + 1):
            started = time.perf_counter()
            fb = training.forward_backward(data, "cross_entropy")
            optim = training.optim_step(adam)
            loss = fb.result().metrics["loss:sum"]
            optim.result()
            seconds = time.perf_counter() - started
            print(json.dumps({"step": step, "seconds": seconds, "loss": loss}), flush=True)  # noqa: T201


# --------------------------------------------------------------------- the harness


async def harness(args: argparse.Namespace) -> dict[str, Any]:
    from common import log, machine, r3, tree_cpu_s, warm  # noqa: PLC0415 - bench/ is sys.path[0]

    from localplane.admin import PlaneAdmin  # noqa: PLC0415
    from localplane.process import PlaneProcess  # noqa: PLC0415
    from shepherd.platform import PlatformClient  # noqa: PLC0415
    from shepherd.platform.models import CreateTrainerJobRequest, TrainingConfig  # noqa: PLC0415
    from shepherd.proxy import ProgramProxy, ProxySettings  # noqa: PLC0415
    from shepherd.states import JobState  # noqa: PLC0415

    plane = PlaneProcess(
        config={"capacity": 4, "routeLagSeconds": {"min": 0.0, "max": 0.3}}
    ).start()
    # As a worker does once it has started (workers/main.py): what the imports made is out of
    # the collector's sight, so a full collection does not pause a proxied step.
    gc.freeze()
    out: dict[str, Any] = {
        "bench": "proxy",
        "machine": machine(),
        "config": {
            "steps": args.steps,
            "step_ms": args.step_ms,
            "batch": args.batch,
            "rounds": args.rounds,
            "checkpoint_every": args.checkpoint_every,
            "preemptions": args.preemptions,
            "lora_rank": RANK,
            "digests": not args.no_digests,
        },
    }
    try:
        async with PlaneAdmin(plane.url, plane.admin_key) as admin:
            account, key = await admin.create_account()
            async with PlatformClient(plane.url, key) as client:

                async def wait(job_id: str, state: JobState) -> None:
                    # Polled, as the lifecycle's wait activities poll (every 20 ms here).
                    async with asyncio.timeout(60):
                        while (await client.get_job(job_id)).state != state:  # noqa: ASYNC110
                            await asyncio.sleep(0.02)

                async def warm_up(job_id: str) -> None:
                    """Twice the gateway's replicas of consecutive healthz over the route."""
                    await warm(await client.trainer(job_id), probes=6)

                async def new_job(protobuf: bool) -> str:
                    await admin.set_faults(trainerProtobuf=protobuf)
                    job_id = f"bp-{uuid.uuid4().hex[:8]}"
                    request = CreateTrainerJobRequest(
                        training_config=TrainingConfig(
                            base_model=BASE_MODEL,
                            lora_rank=RANK,
                            learning_rate=1e-3,
                            extra_args=[f"--compute-delay-ms={args.step_ms}"],
                        )
                    )
                    await client.create_job(job_id, request)
                    await wait(job_id, JobState.RUNNING)
                    await warm_up(job_id)
                    return job_id

                def env(url: str, api_key: str) -> dict[str, str]:
                    clean = {k: v for k, v in os.environ.items() if not k.startswith("TINKER_")}
                    return {
                        **clean,
                        "TINKER_BASE_URL": url,
                        "TINKER_API_KEY": api_key,
                        "TINKER_TELEMETRY": "0",
                        "PYTHONPATH": str(ROOT),
                    }

                async def launch(url: str, api_key: str) -> asyncio.subprocess.Process:
                    return await asyncio.create_subprocess_exec(
                        sys.executable,
                        str(SCRIPT),
                        "program",
                        "--steps",
                        str(args.steps),
                        "--batch",
                        str(args.batch),
                        env=env(url, api_key),
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                    )

                async def collect(proc: asyncio.subprocess.Process) -> list[dict[str, Any]]:
                    stdout, stderr = await asyncio.wait_for(proc.communicate(), 900)
                    if proc.returncode != 0:
                        raise RuntimeError(f"program failed:\n{stderr.decode()[-4000:]}")
                    return [
                        json.loads(x) for x in stdout.decode().splitlines() if x.startswith("{")
                    ]

                def proxy_settings() -> ProxySettings:
                    return ProxySettings(
                        trainer_base_model=BASE_MODEL,
                        lora_rank=RANK,
                        checkpoint_every=args.checkpoint_every,
                        record_digests=not args.no_digests,
                    )

                def cpu_now() -> dict[str, float]:
                    """CPU seconds so far of the three parties a step keeps busy: this
                    process (the proxy, in a proxied run), the program (a child, counted once
                    it exited), and the plane (gateway and trainers)."""
                    children = resource.getrusage(resource.RUSAGE_CHILDREN)
                    assert plane.proc is not None
                    return {
                        "proxy": time.process_time(),
                        "program": children.ru_utime + children.ru_stime,
                        "plane": tree_cpu_s(plane.proc.pid),
                    }

                def stats(lines: list[dict[str, Any]]) -> dict[str, Any]:
                    times = [x["seconds"] for x in lines[1:]]  # step 1 pays first-call costs
                    times.sort()
                    # To 10 µs: the ratios are read in tenths of a percent.
                    return {
                        "mean_s": round(statistics.fmean(times), 5),
                        "median_s": round(statistics.median(times), 5),
                        "p90_s": round(times[int(0.9 * (len(times) - 1))], 5),
                    }

                # -------- 1. per-step time, direct vs through the proxy
                runs: dict[str, list[dict[str, Any]]] = {"direct": [], "proxy": []}
                losses: dict[str, list[float]] = {}
                for round_ in range(args.rounds):
                    for kind in ("direct", "proxy"):
                        log(f"round {round_ + 1}: {kind}")
                        job_id = await new_job(protobuf=kind == "direct")
                        cpu = cpu_now()
                        if kind == "direct":
                            base = f"{plane.url}/training/v1/rlorTrainerJobs/{account}/{job_id}"
                            lines = await collect(await launch(base, key))
                        else:
                            proxy = ProgramProxy(client, proxy_settings())
                            await proxy.start()
                            try:
                                await proxy.attach(job_id)
                                lines = await collect(await launch(proxy.url, proxy.api_key))
                            finally:
                                await proxy.close()
                        spent = {k: (v - cpu[k]) * 1000 / args.steps for k, v in cpu_now().items()}
                        await client.delete_job(job_id)
                        runs[kind].append(
                            stats(lines) | {f"cpu_ms_per_step_{k}": r3(v) for k, v in spent.items()}
                        )
                        losses.setdefault(kind, [x["loss"] for x in lines])
                mean = {k: statistics.fmean(r["mean_s"] for r in v) for k, v in runs.items()}
                median = {k: statistics.fmean(r["median_s"] for r in v) for k, v in runs.items()}
                out["per_step"] = {
                    "runs": runs,
                    "step_ratio": r3(mean["proxy"] / mean["direct"]),
                    # Each proxied run against the direct run just before it: the machine's
                    # slow drifts (a shared VM's) cancel within a pair.
                    "paired_ratios": [
                        r3(p["mean_s"] / d["mean_s"])
                        for d, p in zip(runs["direct"], runs["proxy"], strict=True)
                    ],
                    "median_step_ratio": r3(median["proxy"] / median["direct"]),
                    # One run disturbed by the machine moves the mean ratio; not this.
                    "median_paired_ratio": r3(
                        statistics.median(
                            p["mean_s"] / d["mean_s"]
                            for d, p in zip(runs["direct"], runs["proxy"], strict=True)
                        )
                    ),
                    "target_ratio": 1.05,
                    "losses_equal": losses["proxy"] == losses["direct"],
                }

                # -------- 2. preemptions of a proxied run
                if args.preemptions < 1:
                    return out
                job_id = await new_job(protobuf=False)
                stepped = asyncio.Event()

                async def on_event(event: Any) -> None:
                    stepped.set()

                proxy = ProgramProxy(client, proxy_settings(), on_event)
                await proxy.start()
                recoveries: list[dict[str, Any]] = []
                try:
                    await proxy.attach(job_id)
                    proc = await launch(proxy.url, proxy.api_key)
                    spacing = args.steps // (args.preemptions + 1)
                    for n in range(1, args.preemptions + 1):
                        at = n * spacing
                        async with asyncio.timeout(600):
                            while proxy.progress.step < at:
                                stepped.clear()
                                await stepped.wait()
                        t0 = time.monotonic()
                        await admin.preempt(job_id, account=account)
                        await wait(job_id, JobState.FAILED)
                        t_failed = time.monotonic()
                        proxy.detach("preempted")
                        await client.resume_job(job_id)
                        await wait(job_id, JobState.RUNNING)
                        t_running = time.monotonic()
                        await warm_up(job_id)
                        t_warm = time.monotonic()
                        attached = await proxy.attach(job_id)
                        t_attached = time.monotonic()
                        async with asyncio.timeout(120):
                            # Polled finely: the figure is in milliseconds.
                            while (proxy.progress.answered_at or 0) < t_warm:  # noqa: ASYNC110
                                await asyncio.sleep(0.001)
                        first_answer = (proxy.progress.answered_at or 0) - t_warm
                        recoveries.append(
                            {
                                "at_step": at,
                                "preempt_to_failed_s": r3(t_failed - t0),
                                "resume_to_running_s": r3(t_running - t_failed),
                                "warm_up_s": r3(t_warm - t_running),
                                "attach_s": r3(t_attached - t_warm),
                                "attach_to_first_answer_s": r3(first_answer),
                                "redo_s": r3(attached.redo_seconds),
                                "proxy_share_s": r3(max(0.0, first_answer - attached.redo_seconds)),
                                "ops_redone": attached.ops_redone,
                                "optimizer_steps_redone": attached.optimizer_steps_redone,
                                "restored_from_step": (
                                    attached.restored_from.step if attached.restored_from else None
                                ),
                                "digests_match": attached.digests_match,
                            }
                        )
                        log(f"preemption at step {at}: {recoveries[-1]}")
                    await collect(proc)
                    served = await admin.data_plane(f"accounts/{account}/rlorTrainerJobs/{job_id}")
                finally:
                    await proxy.close()
                    await client.delete_job(job_id)
                redone = sum(r["optimizer_steps_redone"] for r in recoveries)
                out["preemption"] = {
                    "recoveries": recoveries,
                    "max_proxy_share_s": max(r["proxy_share_s"] for r in recoveries),
                    "target_proxy_share_s": 1.0,
                    "max_optimizer_steps_redone": max(
                        r["optimizer_steps_redone"] for r in recoveries
                    ),
                    "checkpoint_every": args.checkpoint_every,
                    "optim_steps_served": sum(
                        n for k, n in served.items() if k.endswith(":optim_step")
                    ),
                    "optim_steps_expected": args.steps + redone,
                    "dialects_served": sorted({k.split(":", 1)[0] for k in served}),
                }
    finally:
        plane.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode")
    prog = sub.add_parser("program")
    prog.add_argument("--steps", type=int, default=60)
    prog.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-ms", type=float, default=100.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--preemptions", type=int, default=3)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument(
        "--no-digests",
        action="store_true",
        help="the proxy does not ask for the weights digest after every step",
    )
    args = parser.parse_args()
    if args.mode == "program":
        program(args.steps, args.batch)
        return
    from common import reserve_stdout  # noqa: PLC0415 - bench/ is sys.path[0]

    report = reserve_stdout()  # the proxy's log lines go to stderr
    report.write(json.dumps(asyncio.run(harness(args)), indent=2) + "\n")
    report.flush()


if __name__ == "__main__":
    main()
