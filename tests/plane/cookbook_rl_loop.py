"""The tinker-cookbook's ``recipes/rl_loop.py`` (its ``main`` and ``Config``, unmodified) with a
reward the stand-in model can earn: ``python -m tests.plane.cookbook_rl_loop key=value ...``.

rl_loop rewards a response only when it holds ``\\boxed{<the GSM8K answer>}``. localplane's
stand-in LM samples near-uniform bytes and never writes ``\\boxed{``, so every group's rewards
are 0, every advantage is 0, and rl_loop skips every optimizer step ("all advantages zero,
skipping training step"): the run would train nothing. This driver keeps the cookbook's reward
and, where it is 0, gives the parity of the response's bytes instead, so groups differ and
rl_loop takes its training steps — its loop, its sampler per step, its ``importance_sampling``
``forward_backward`` and ``optim_step``, its checkpoints, all as the cookbook wrote them. The
GSM8K rows come from the local datasets cache (tests/plane/cookbook_datasets.py)."""

from __future__ import annotations

import chz
from tinker_cookbook.recipes import rl_loop

_cookbook_reward = rl_loop.get_reward


def stand_in_reward(response: str, answer: str) -> float:
    return _cookbook_reward(response, answer) or float(sum(response.encode()) % 2)


rl_loop.get_reward = stand_in_reward

if __name__ == "__main__":
    chz.nested_entrypoint(rl_loop.main)
