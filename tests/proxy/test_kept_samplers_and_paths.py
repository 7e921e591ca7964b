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


async def test_a_sampler_the_trainer_let_go_is_made_again_not_taken_for_a_loss(
    rigs: Callable[..., Awaitable[Rig]],
) -> None:
    """The trainer keeps its most recently used samplers (localplane: 32): one it evicted is
    "not on this trainer". The control plane says RUNNING and the trainer still holds the
    job's model, so that is no loss: the proxy makes the sampler again and answers."""
    rig = await rigs(checkpoint_every=4)
    await rig.new_trainer()
    await rig.attach()
    async with TinkerHTTP(rig.proxy.url, rig.proxy.api_key) as api:
        session = await api.session()
        model = await api.create_model(session, 0, BASE_MODEL, lora_rank=RANK)
        await model.train(1, 1)

        async def base_sampler(number: int) -> str:
            answer = await api.call(
                "create_sampling_session",
                {
                    "session_id": session,
                    "sampling_session_seq_id": number,
                    "base_model": BASE_MODEL,
                },
            )
            return str(answer["sampling_session_id"])

        kept = await base_sampler(0)
        before = await _prompt_logprobs(api, kept, 1)
        for number in range(1, 40):  # more than the trainer keeps
            await _prompt_logprobs(api, await base_sampler(number), 1)
        assert await _prompt_logprobs(api, kept, 2) == before
    assert not any(e.kind == "trainer_lost" for e in rig.events)


def _rl_datum(prompt: list[int], sequence: str, sampled: list[int]) -> dict[str, Any]:
    """A policy-gradient datum that names its sampled sequence (provenance spans) instead of
    carrying the sampler's log-probabilities, as math_rl's default stable_reinforce sends."""
    inputs = prompt + sampled[:-1]
    targets = prompt[1:] + sampled
    advantages = [0.0] * (len(prompt) - 1) + [1.0] * len(sampled)
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": inputs}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": targets, "dtype": "int64", "shape": [len(targets)]},
            "advantages": {"data": advantages, "dtype": "float32", "shape": [len(targets)]},
        },
        "model_input_spans": [
            {"prompt_tokens": {"sequence_id": sequence, "offset": 0, "length": len(prompt)}},
            {"sampled_tokens": {"sequence_id": sequence, "offset": 0, "length": len(sampled) - 1}},
        ],
        "loss_fn_input_spans": [
            {"prompt_tokens": {"sequence_id": sequence, "offset": 1, "length": len(prompt) - 1}},
            {"sampled_tokens": {"sequence_id": sequence, "offset": 0, "length": len(sampled)}},
        ],
    }


async def test_recorded_sequences_train_on_a_new_trainer_with_the_same_weights(
    rigs: Callable[..., Awaitable[Rig]],
) -> None:
    """stable_reinforce with provenance: sequences sampled on a trainer that is then lost
    still train (the new trainer never sampled them), the redo included, and the weights
    come back as they were (digests verified)."""
    rig = await rigs(checkpoint_every=2)
    await rig.new_trainer()
    await rig.attach()
    prompt = list(b"hello ")
    async with TinkerHTTP(rig.proxy.url, rig.proxy.api_key) as api:
        model = await api.create_model(await api.session(), 0, BASE_MODEL, lora_rank=RANK)
        for step in range(1, 6):
            sampler = (
                await model.run("save_weights_for_sampler", {"sampling_session_seq_id": step})
            )["sampling_session_id"]
            ticket = await api.call(
                "asample",
                {
                    "sampling_session_id": sampler,
                    "seq_id": 1,
                    "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
                    "num_samples": 2,
                    "record_stability_info": True,
                    "sampling_params": {"max_tokens": 4, "temperature": 1.0},
                },
            )
            answer = await api.result(ticket)
            if step == 3:
                await rig.preempt()  # sampled on the lost trainer, trained on the next
            data = [
                _rl_datum(prompt, sequence, list(seq["tokens"]))
                for sequence, seq in zip(
                    ticket["sample_sequence_ids"], answer["sequences"], strict=True
                )
                if len(seq["tokens"]) > 1
            ]
            await model.run(
                "forward_backward",
                {"forward_backward_input": {"data": data, "loss_fn": "stable_reinforce"}},
            )
            await model.run("optim_step", model.optim_body())
    restored = rig.attaches[-1]
    assert restored.models_restored == 1 and restored.digests_match is True


async def test_a_snapshot_kept_across_checkpoints_is_made_again_after_a_trainer_loss(
    rigs: Callable[..., Awaitable[Rig]],
) -> None:
    """A snapshot of weights between two checkpoints (step 1's), kept while the model trains
    on past two of Shepherd's checkpoints, still samples the same after the trainer is lost:
    made again from the model as made and step 1's operations, sent again to a scratch model."""
    rig = await rigs(checkpoint_every=2)
    await rig.new_trainer()
    await rig.attach()
    async with TinkerHTTP(rig.proxy.url, rig.proxy.api_key) as api:
        model = await api.create_model(await api.session(), 0, BASE_MODEL, lora_rank=RANK)
        await model.train(1, 1)
        kept = (await model.run("save_weights_for_sampler", {"sampling_session_seq_id": 0}))[
            "sampling_session_id"
        ]
        before = await _prompt_logprobs(api, kept, 1)
        await model.train(2, 5)  # Shepherd's checkpoints at steps 2 and 4
        assert await _prompt_logprobs(api, kept, 2) == before
        await rig.preempt()
        assert await _prompt_logprobs(api, kept, 3) == before
        # The model itself trains on from where it was.
        assert len(await model.train(6, 6)) == 1
    assert not any(e.kind == "trainer_lost" for e in rig.events)
