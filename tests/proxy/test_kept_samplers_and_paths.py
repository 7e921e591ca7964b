"""Samplers a program keeps, and checkpoint paths it hands on (issue 26, classes 3 and 5).

* A frozen reference — a snapshot of a new model's first weights, as DPO's reference
  sampler is — works across Shepherd's checkpoints (no recovery, no trainer loss counted)
  and after a trainer loss (made again from the base model: the same log-probabilities).
* A ``tinker://`` path a program saved under one job's proxy is the platform's own: another
  job's program loads it and samples from it, after the first job's trainer is gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.proxy.rig import BASE_MODEL, RANK, Rig
from tests.tinker_http import TinkerHTTP, batch

pytestmark = [pytest.mark.slow]

PROMPT = {"chunks": [{"type": "encoded_text", "tokens": list(b"hello world")}]}


async def _prompt_logprobs(api: TinkerHTTP, sampler: str, seq_id: int) -> list[Any]:
    """The sampler's log-probabilities of the prompt (what compute_logprobs asks for)."""
    answer = await api.result(
        await api.call(
            "asample",
            {
                "sampling_session_id": sampler,
                "seq_id": seq_id,
                "prompt": PROMPT,
                "num_samples": 1,
                "prompt_logprobs": True,
                "sampling_params": {"max_tokens": 1, "temperature": 1.0},
            },
        )
    )
    return list(answer["prompt_logprobs"])


async def test_a_frozen_reference_survives_checkpoints_and_a_trainer_loss(
    rigs: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await rigs(checkpoint_every=2)
    await rig.new_trainer()
    await rig.attach()
    async with TinkerHTTP(rig.proxy.url, rig.proxy.api_key) as api:
        model = await api.create_model(await api.session(), 0, BASE_MODEL, lora_rank=RANK)
        reference = (await model.run("save_weights_for_sampler", {"sampling_session_seq_id": 0}))[
            "sampling_session_id"
        ]
        before = await _prompt_logprobs(api, reference, 1)
        await model.train(1, 5)  # Shepherd's checkpoints at steps 2 and 4
        assert sum(e.kind == "checkpoint" for e in rig.events) >= 2
        # Live on its trainer: still answered, the same, with no loss seen.
        assert await _prompt_logprobs(api, reference, 2) == before
        assert not any(e.kind == "trainer_lost" for e in rig.events)
        await rig.preempt()
        # Made again on the new trainer from the base model: the same log-probabilities.
        assert await _prompt_logprobs(api, reference, 3) == before
        # And the model trains on from where it was.
        loss = await model.train(6, 6)
        assert len(loss) == 1
    assert not any(e.kind == "trainer_lost" for e in rig.events)


async def test_a_checkpoint_path_saved_under_one_job_works_in_another(
    rigs: Callable[..., Awaitable[Rig]],
) -> None:
    first = await rigs(checkpoint_every=4)
    await first.new_trainer()
    await first.attach()
    async with TinkerHTTP(first.proxy.url, first.proxy.api_key) as api:
        model = await api.create_model(await api.session(), 0, BASE_MODEL, lora_rank=RANK)
        await model.train(1, 2)
        state = await model.save("teacher")
        sampler_path = await model.save_for_sampler("teacher")
        loss_there = await model.forward_loss(batch(9))
    assert state.startswith("tinker://") and not state.startswith("tinker://ps-")
    # The first job ends: its trainer is deleted, its proxy closed.
    await first.proxy.close()
    await first.client.delete_job(first.job_id)

    second = await rigs(checkpoint_every=4)
    await second.new_trainer()
    await second.attach()
    async with TinkerHTTP(second.proxy.url, second.proxy.api_key) as api:
        session = await api.session()
        loaded = await api.load_new_model(session, 0, state, optimizer=False)
        assert await loaded.forward_loss(batch(9)) == loss_there
        answer = await api.call(
            "create_sampling_session",
            {"session_id": session, "sampling_session_seq_id": 0, "model_path": sampler_path},
        )
        sample = await api.result(
            await api.call(
                "asample",
                {
                    "sampling_session_id": answer["sampling_session_id"],
                    "seq_id": 1,
                    "prompt": PROMPT,
                    "num_samples": 1,
                    "sampling_params": {"max_tokens": 4, "temperature": 1.0},
                },
            )
        )
        assert len(sample["sequences"]) == 1
