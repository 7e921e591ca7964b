"""An RL loop written against the Tinker API: the policy learns to answer with vowels.

Each step saves the current weights for sampling, samples a group of completions for a few
fixed prompts, scores each completion with a programmatic reward (its vowels, per token of
the completion budget: ``"aeiouaeiou..."`` scores 1, ``"xyz"`` scores 0), turns the rewards
into group-relative advantages (reward minus the group's mean) and takes one policy-gradient
step with the ``importance_sampling`` loss. On localplane's byte-level stand-in model the
mean reward climbs from about 0.04 to 1.0 within ~30 steps at ``learning_rate: 0.02``.

Nothing here is Shepherd-specific except the first line of ``step``, ``ctx.training_client``:
the calls and types are the tinker SDK's, so the loop moves between Tinker and Shepherd by
changing only how it obtains its client.

Register it with the worker that runs the job, by name, then submit ``examples/rl.yaml``
(``training.loop: rl-example``)::

    SHEPHERD_LOOPS=rl-example=/abs/path/examples/rl_loop.py:loop shepherd worker

(``shepherd dev`` registers it with its own worker.)

What Shepherd asks of a loop, and how this one keeps it:

* A step is a deterministic function of ``(ctx, step)``: sampler checkpoints are named after
  the step and every sampling seed derives from ``ctx.seed`` and the step, so a step replayed
  after a crash re-sends the same operations and gets the same samples.
* A step awaits everything it submitted before it returns.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tinker import types

#: Fixed prompts (bytes on localplane's tokenizer); each gets a group of completions.
PROMPTS = ("Vowels: ", "Sing! ", "Q: ", "hello ")
#: Completions per prompt: the group whose mean reward is each completion's baseline.
GROUP_SIZE = 8
#: Completion budget in tokens; the reward is measured against it.
MAX_TOKENS = 16
#: Completions per prompt when evaluating (fixed seeds: the same draws at every checkpoint).
EVAL_SAMPLES = 8
VOWELS = frozenset("aeiouAEIOU")


def seed_for(*parts: Any) -> int:
    """A sampling seed from the job's seed and the step (stable across processes, unlike
    ``hash``), so that a replayed step samples exactly what it sampled the first time."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def reward(tokenizer: Any, tokens: list[int]) -> float:
    """Vowels in the completion per token of the budget, at most 1."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    return min(1.0, sum(ch in VOWELS for ch in text) / MAX_TOKENS)


def rl_datum(prompt: list[int], completion: list[int], logprobs: list[float], advantage: float):
    """An ``importance_sampling`` datum: position i predicts token i+1; prompt positions
    carry no advantage (they were not sampled), completion tokens carry the sequence's."""
    tokens = prompt + completion
    n_prompt = len(prompt) - 1  # targets that are prompt tokens
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=tokens[1:], dtype="int64"),
            "logprobs": types.TensorData(data=[0.0] * n_prompt + list(logprobs), dtype="float32"),
            "advantages": types.TensorData(
                data=[0.0] * n_prompt + [advantage] * len(completion), dtype="float32"
            ),
        },
    )


class VowelRL:
    """The loop object: ``step`` trains, ``evaluate`` measures (``checkpoint.metric: reward``)."""

    #: What ``evaluate`` reports: a spec tracking anything else is refused before it starts.
    metrics = ("reward",)

    def _prompts(self, ctx: Any) -> list[list[int]]:
        if "rl_prompts" not in ctx.cache:
            tok = ctx.tokenizer
            ctx.cache["rl_prompts"] = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
        return ctx.cache["rl_prompts"]

    async def _sample(
        self, sampler: Any, prompts: list[list[int]], n: int, seeds: list[int]
    ) -> list[types.SampleResponse]:
        # Every prompt's request is submitted before any is awaited: they run together.
        futures = [
            sampler.sample(
                types.ModelInput.from_ints(prompt),
                n,
                types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=seed),
            )
            for prompt, seed in zip(prompts, seeds, strict=True)
        ]
        return [await f for f in futures]

    async def step(self, ctx: Any, step: int) -> float:
        tc = ctx.training_client
        prompts = self._prompts(ctx)
        # Sample from the weights as they are now; the name is the step's, so a replay of
        # this step re-sends the same save (deduplicated) rather than making another.
        sampler = await tc.save_weights_and_get_sampling_client_async(f"rl-step-{step:06d}")
        seeds = [seed_for(ctx.seed, "train", step, i) for i in range(len(prompts))]
        responses = await self._sample(sampler, prompts, GROUP_SIZE, seeds)

        datums, rewards = [], []
        for prompt, response in zip(prompts, responses, strict=True):
            group = [reward(ctx.tokenizer, seq.tokens) for seq in response.sequences]
            baseline = sum(group) / len(group)
            for seq, r in zip(response.sequences, group, strict=True):
                if seq.logprobs is None:
                    raise ValueError(
                        "the sampler returned no logprobs; importance sampling needs them"
                    )
                datums.append(rl_datum(prompt, seq.tokens, seq.logprobs, r - baseline))
            rewards.extend(group)

        # A group with equal rewards has zero advantages and adds no gradient; its datums
        # are sent anyway, so that every step is one forward_backward and one optim_step.
        fwd_bwd = tc.forward_backward(datums, "importance_sampling")
        optim = tc.optim_step(types.AdamParams(learning_rate=ctx.learning_rate))
        await fwd_bwd
        await optim
        mean_reward = sum(rewards) / len(rewards)
        ctx.cache["rl_last_reward"] = mean_reward
        # Shepherd reports a step's return value as its loss: lower is better.
        return -mean_reward

    async def evaluate(self, ctx: Any) -> dict[str, float]:
        """Mean reward of a fixed, seeded sample from the current weights."""
        tc = ctx.training_client
        prompts = self._prompts(ctx)
        # An ephemeral sampler (no name): nothing to keep on the control plane, and nothing
        # to collide with after a preemption, when the evaluation of a reloaded model runs again.
        sampler = await tc.save_weights_and_get_sampling_client_async()
        seeds = [seed_for(ctx.seed, "eval", i) for i in range(len(prompts))]
        responses = await self._sample(sampler, prompts, EVAL_SAMPLES, seeds)
        rewards = [
            reward(ctx.tokenizer, seq.tokens)
            for response in responses
            for seq in response.sequences
        ]
        return {"reward": sum(rewards) / len(rewards)}


#: What ``SHEPHERD_LOOPS=rl-example=/abs/path/examples/rl_loop.py:loop`` names.
loop = VowelRL()
