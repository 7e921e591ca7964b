"""A user training loop (``training.loop: tests.workflows.user_loops:inline_examples``):
sends its own examples instead of letting the trainer sample, and clips the learning rate
warm-up — the kind of loop users bring."""

from __future__ import annotations

from shepherd.loops import LoopContext
from shepherd.platform.models import AdamParams, ForwardBackwardRequest, OptimStepRequest

TEXTS = [
    "shepherd keeps the job alive",
    "checkpoints survive preemption",
    "the route warms up first",
]


async def inline_examples(ctx: LoopContext, step: int) -> float:
    for mb in range(ctx.micro_batches):
        examples = [{"text": TEXTS[(step + mb + i) % len(TEXTS)]} for i in range(2)]
        await ctx.trainer.forward_backward(
            ForwardBackwardRequest(step=step, micro_batch=mb, batch={"examples": examples})
        )
    warmup = min(1.0, step / 5)
    answer = await ctx.trainer.optim_step(
        OptimStepRequest(
            step=step, adam_params=AdamParams(learning_rate=ctx.learning_rate * warmup)
        )
    )
    return float(answer.metrics["loss"])
