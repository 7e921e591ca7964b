"""A user training loop, written against the Tinker API as a Tinker user writes one
(``tinker.types``, futures submitted before they are awaited), registered with the test
workers as ``inline-examples`` (``SHEPHERD_LOOPS=inline-examples=tests.workflows.user_loops:
InlineExamples``). It sends its own examples and warms the learning rate up."""

from __future__ import annotations

from tinker import types

from shepherd.loops import LoopContext

TEXTS = [
    "shepherd keeps the job alive",
    "checkpoints survive preemption",
    "the route warms up first",
]

REF = "inline-examples=tests.workflows.user_loops:InlineExamples"


def _datum(tokenizer: object, text: str) -> types.Datum:
    tokens = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


class InlineExamples:
    metrics = ("eval_loss",)

    async def step(self, ctx: LoopContext, step: int) -> float:
        tc = ctx.training_client
        futures = []
        for mb in range(ctx.micro_batches):
            batch = [_datum(ctx.tokenizer, TEXTS[(step + mb + i) % len(TEXTS)]) for i in range(2)]
            futures.append(tc.forward_backward(batch, "cross_entropy"))
        warmup = min(1.0, step / 5)
        optim = tc.optim_step(types.AdamParams(learning_rate=ctx.learning_rate * warmup))
        results = [await f for f in futures]
        await optim
        return sum(r.metrics["loss:sum"] for r in results)

    async def evaluate(self, ctx: LoopContext) -> dict[str, float]:
        result = await ctx.training_client.forward(
            [_datum(ctx.tokenizer, t) for t in TEXTS], "cross_entropy"
        )
        return {"eval_loss": result.metrics["loss:sum"]}
