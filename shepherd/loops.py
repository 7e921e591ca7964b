"""Training loops: what one optimizer step sends to the trainer.

A loop is an async callable ``(ctx, step) -> loss``. Shepherd ships ``supervised``; a user
loop is given in the spec as ``package.module:function`` with the same signature and runs
inside the training activity, so it gets every guarantee of the lifecycle: the step it is
asked for is never applied twice (the trainer's ``optim_step`` is exactly-once and
``forward_backward`` idempotent per micro-batch), and after a preemption it is called again
from the step after the last checkpoint.

Loops must be deterministic functions of ``(ctx, step)`` — that is what makes a resumed run
end with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shepherd.platform import TrainerClient
from shepherd.platform.models import AdamParams, ForwardBackwardRequest, OptimStepRequest


@dataclass
class LoopContext:
    trainer: TrainerClient
    dataset: str
    batch_size: int
    micro_batches: int
    seed: int
    learning_rate: float
    #: Per-call timeout for training calls, seconds (a step may be slow on a real GPU).
    step_timeout: float
    #: Loop-private cache (e.g. a loaded dataset), kept for the activity attempt.
    cache: dict[str, Any] = field(default_factory=dict)


TrainingLoop = Callable[[LoopContext, int], Awaitable[float]]


def _local_records(ctx: LoopContext) -> list[dict[str, Any]] | None:
    """The dataset's records when it is a JSONL file this worker can read, else None (the
    trainer samples from a dataset it knows by name)."""
    if "records" not in ctx.cache:
        name = ctx.dataset.removeprefix("file://")
        path = Path(name)
        records = None
        if name.endswith(".jsonl") and path.is_absolute() and path.is_file():
            with open(path, encoding="utf-8") as f:
                records = [json.loads(line) for line in f if line.strip()]
        ctx.cache["records"] = records
    return ctx.cache["records"]


def batch_for(ctx: LoopContext, step: int, micro_batch: int) -> dict[str, Any]:
    records = _local_records(ctx)
    if records is None:
        return {"size": ctx.batch_size}
    # A pure function of (seed, step, micro_batch), like the trainer's own sampling.
    rng = np.random.default_rng([ctx.seed, step, micro_batch])
    picks = rng.integers(0, len(records), size=min(ctx.batch_size, len(records)))
    return {"examples": [records[int(i)] for i in picks]}


async def supervised(ctx: LoopContext, step: int) -> float:
    """The built-in loop: micro-batches of the dataset, then one Adam step."""
    for mb in range(ctx.micro_batches):
        await ctx.trainer.forward_backward(
            ForwardBackwardRequest(step=step, micro_batch=mb, batch=batch_for(ctx, step, mb)),
            timeout=ctx.step_timeout,
        )
    answer = await ctx.trainer.optim_step(
        OptimStepRequest(step=step, adam_params=AdamParams(learning_rate=ctx.learning_rate)),
        timeout=ctx.step_timeout,
    )
    return float(answer.metrics.get("loss", float("nan")))


BUILTIN: dict[str, TrainingLoop] = {"supervised": supervised}


class LoopLoadError(ValueError):
    pass


def load_loop(ref: str) -> TrainingLoop:
    """``supervised`` or ``package.module:function``."""
    if ref in BUILTIN:
        return BUILTIN[ref]
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise LoopLoadError(
            f"training.loop: cannot import {module_name!r} on this worker ({exc})"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise LoopLoadError(f"training.loop: {module_name!r} has no callable {attr!r}")
    return fn
