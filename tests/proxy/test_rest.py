"""The Tinker REST surface the cookbook uses, through the proxy, with the tinker SDK's own
``RestClient``, across a trainer loss: the program's training run and its checkpoints read
as the program saved them whichever trainer generation saved them (Shepherd's own
checkpoints are not the program's and do not show), a checkpoint saved before the loss is
found, given a TTL and deleted by its ``tinker://`` path, sessions and samplers list under
the program's ids."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
import tinker

from tests.proxy.rig import BASE_MODEL, RANK, Rig
from tests.tinker_http import Model, TinkerHTTP

pytestmark = [pytest.mark.slow]

T = TypeVar("T")


@pytest.fixture
async def wired(rigs: Callable[..., Awaitable[Rig]]) -> AsyncIterator[Rig]:
    rig = await rigs(checkpoint_every=2)
    await rig.new_trainer()
    await rig.attach()
    yield rig


async def _blocking(call: Callable[[], T]) -> T:
    """A blocking SDK call, off the event loop the proxy serves on."""
    return await asyncio.to_thread(call)


async def test_the_rest_surface_reads_the_programs_view_across_a_loss(wired: Rig) -> None:
    async with TinkerHTTP(wired.proxy.url, wired.proxy.api_key) as api:
        session = await api.session()
        ticket = await api.call(
            "create_model",
            {
                "session_id": session,
                "model_seq_id": 0,
                "base_model": BASE_MODEL,
                "lora_config": {"rank": RANK},
                "user_metadata": {"renderer_name": "role_colon"},
            },
        )
        model_id = (await api.result(ticket))["model_id"]
        model = Model(api, model_id)
        await model.train(1, 2)
        before = await model.save("before")
        await model.save_for_sampler("before")
        await wired.preempt()
        await model.train(3, 4)
        after = await model.save("after")

    # The platform's paths, each of the trainer run that saved it (they outlive the proxy).
    assert before.startswith("tinker://") and before.endswith("/weights/before")
    assert after.startswith("tinker://") and after.endswith("/weights/after")
    assert model_id not in before and before.split("/")[2] != after.split("/")[2]
    # Its construction asks the endpoint for its client config: off the loop too.
    rest = await _blocking(
        lambda: tinker.RestClient(base_url=wired.proxy.url, api_key=wired.proxy.api_key)
    )

    run = await _blocking(lambda: rest.get_training_run_by_tinker_path(before).result(60))
    assert run.training_run_id == model_id
    assert run.user_metadata == {"renderer_name": "role_colon"}
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == after

    listed = await _blocking(lambda: rest.list_checkpoints(model_id).result(60))
    ids = sorted(c.checkpoint_id for c in listed.checkpoints)
    assert ids == ["sampler_weights/before", "weights/after", "weights/before"], ids
    paths = {c.checkpoint_id: c.tinker_path for c in listed.checkpoints}
    assert paths["weights/before"] == before and paths["weights/after"] == after

    info: Any = await _blocking(lambda: rest.get_weights_info_by_tinker_path(before).result(60))
    assert info.lora_rank == RANK

    # Saved by the lost trainer's model: a TTL, then deleted, by the path the program holds.
    await _blocking(lambda: rest.set_checkpoint_ttl_from_tinker_path(before, 3600).result(60))
    await _blocking(lambda: rest.delete_checkpoint_from_tinker_path(before).result(60))
    listed = await _blocking(lambda: rest.list_checkpoints(model_id).result(60))
    assert sorted(c.checkpoint_id for c in listed.checkpoints) == [
        "sampler_weights/before",
        "weights/after",
    ]

    runs = await _blocking(lambda: rest.list_training_runs().result(60))
    assert model_id in [r.training_run_id for r in runs.training_runs]
    sessions = await _blocking(lambda: rest.list_sessions().result(60))
    assert session in sessions.sessions
    described = await _blocking(lambda: rest.get_session(session).result(60))
    assert described.training_run_ids == [model_id]
    capabilities = await _blocking(lambda: rest.get_server_capabilities().result(60))
    assert [m.model_name for m in capabilities.supported_models] == [BASE_MODEL]
