"""The proxy's wire contract, request by request (raw HTTP, JSON-only trainers): only the
job's token gets in; a resent request gets the same future and a different body at a used
``seq_id`` is refused; what the trainer refuses reaches the program as the trainer said it,
without taking a ``seq_id``; a model for another base model or rank is refused naming both;
an unknown endpoint is never a 404; with no trainer attached, submissions get their future
at once and are answered after the next attach, futures answer ``try_again``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from localplane.admin import PlaneAdmin
from tests.helpers import Account
from tests.proxy.rig import BASE_MODEL, RANK, Rig, open_rig
from tests.tinker_http import Model, TinkerHTTP, TrainerHTTPError, batch


@pytest.fixture
async def wired(account: Account, json_trainers: PlaneAdmin) -> AsyncIterator[Rig]:
    # Short holds: a pending future answers try_again within half a second.
    rig = await open_rig(account, json_trainers, retrieve_hold_s=0.5, direct_hold_s=1.0)
    try:
        await rig.new_trainer()
        await rig.attach()
        yield rig
    finally:
        await rig.proxy.close()


@pytest.fixture
async def api(wired: Rig) -> AsyncIterator[TinkerHTTP]:
    async with TinkerHTTP(wired.proxy.url, wired.proxy.api_key) as client:
        yield client


async def _model(api: TinkerHTTP) -> Model:
    return await api.create_model(await api.session(), 0, BASE_MODEL, lora_rank=RANK)


async def test_only_the_jobs_token_gets_in(wired: Rig, account: Account) -> None:
    assert wired.proxy.api_key.startswith("tml-") and wired.proxy.api_key != account.api_key
    assert wired.proxy.api_key not in repr(wired.proxy)
    for key, auth in ((None, "x-api-key"), (account.api_key, "x-api-key"), ("tml-x", "bearer")):
        async with TinkerHTTP(wired.proxy.url, key, auth=auth) as other:
            answer = await other.raw("create_session", {})
            assert answer.status_code == 401, answer.text
    async with TinkerHTTP(wired.proxy.url, wired.proxy.api_key, auth="bearer") as bearer:
        assert (await bearer.raw("create_session", {})).status_code == 200


async def test_a_resent_request_gets_the_same_future_a_different_body_is_refused(
    wired: Rig, api: TinkerHTTP
) -> None:
    model = await _model(api)
    body = model.fwdbwd_body(batch(1))
    first = await model.submit("forward_backward", body, seq_id=1)
    again = await model.submit("forward_backward", body, seq_id=1)
    assert again["request_id"] == first["request_id"]
    with pytest.raises(TrainerHTTPError) as refused:
        await model.submit("forward_backward", model.fwdbwd_body(batch(2)), seq_id=1)
    assert refused.value.status == 400 and "seq_id 1" in refused.value.message
    with pytest.raises(TrainerHTTPError) as other_op:
        await model.submit("optim_step", model.optim_body(), seq_id=1)
    assert other_op.value.status == 400 and "forward_backward" in other_op.value.message
    result = await api.result(first)
    assert result["metrics"]["loss:sum"] > 0
    served = await wired.admin.data_plane(wired.job_name())
    assert served.get("json:forward_backward") == 1, served


async def test_a_trainer_refusal_reaches_the_program_and_takes_no_seq_id(
    wired: Rig, api: TinkerHTTP
) -> None:
    model = await _model(api)
    with pytest.raises(TrainerHTTPError) as refused:
        await model.submit(
            "forward_backward", model.fwdbwd_body(batch(1), "no_such_loss"), seq_id=1
        )
    assert refused.value.status == 400 and "no_such_loss" in refused.value.message
    # seq_id 1 is still free: the program's next request takes it and is applied.
    ticket = await model.submit("forward_backward", model.fwdbwd_body(batch(1)), seq_id=1)
    assert (await api.result(ticket))["metrics"]["loss:sum"] > 0
    await model.run("optim_step", model.optim_body())


async def test_a_model_for_another_base_model_or_rank_is_refused_naming_both(
    api: TinkerHTTP,
) -> None:
    session = await api.session()
    for body, field, named in (
        (
            {"base_model": "accounts/fireworks/models/qwen3-1p7b", "lora_config": {"rank": RANK}},
            "base_model",
            BASE_MODEL,
        ),
        ({"base_model": BASE_MODEL, "lora_config": {"rank": 8}}, "lora_config.rank", str(RANK)),
    ):
        answer = await api.raw("create_model", {"session_id": session, "model_seq_id": 0, **body})
        assert answer.status_code == 400, answer.text
        message = answer.json()["error"]["message"]
        assert message.startswith(f"{field}:") and named in message, message


async def test_an_unknown_endpoint_is_not_a_404(api: TinkerHTTP) -> None:
    answer = await api.raw("no_such_thing", {})
    assert answer.status_code == 400
    assert answer.json()["error"]["status"] == "UNIMPLEMENTED"


async def test_without_a_trainer_submissions_wait_and_are_answered_after_attach(
    wired: Rig, api: TinkerHTTP
) -> None:
    model = await _model(api)
    await model.train(1, 2)
    wired.proxy.detach("the test takes the trainer away")
    # Submissions get their futures at once; their results wait for a trainer.
    fb = await model.submit("forward_backward", model.fwdbwd_body(batch(3)))
    optim = await model.submit("optim_step", model.optim_body())
    pending = await api.call("retrieve_future", {"request_id": fb["request_id"]})
    assert pending["type"] == "try_again" and pending["queue_state"] == "paused_capacity"
    # A direct call is held, then answered 503 (retryable) when no trainer comes.
    held = await api.raw("get_info", {"model_id": model.model_id})
    assert held.status_code == 503, held.text
    attached = await wired.attach()  # the same trainer: still RUNNING
    assert attached.ops_redone == 4 and attached.optimizer_steps_redone == 2
    assert (await api.result(fb))["metrics"]["loss:sum"] > 0
    await api.result(optim)
    info = await model.info()
    assert info["model_id"] == model.model_id and info["optim_steps"] == 3


async def test_a_sample_pending_at_a_loss_gets_the_answer_it_would_have_had(
    wired: Rig, api: TinkerHTTP, account: Account
) -> None:
    """Sampled from a snapshot of the model; the second request is submitted while no
    trainer is attached, so it is answered on the next trainer, from the snapshot made again
    by the redo: the trainer's default seed is a function of the weights and the request,
    so both answers are those of the same calls straight to a trainer."""

    async def calls(client: TinkerHTTP, wait_before_second: Any = None) -> list[Any]:
        model = (
            await _model(client)
            if client is api
            else await client.create_model(await client.session(), 0, BASE_MODEL, lora_rank=RANK)
        )
        await model.train(1, 2)
        snapshot = await model.run("save_weights_for_sampler", {"sampling_session_seq_id": 0})
        sampler = snapshot["sampling_session_id"]
        request = {
            "sampling_session_id": sampler,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": list(b"hello")}]},
            "num_samples": 2,
            "sampling_params": {"max_tokens": 6, "temperature": 1.0},
        }
        first = await client.result(await client.call("asample", {**request, "seq_id": 1}))
        if wait_before_second is not None:
            await wait_before_second()
        ticket = await client.call("asample", {**request, "seq_id": 2})
        if wait_before_second is not None:
            pending = await client.call("retrieve_future", {"request_id": ticket["request_id"]})
            assert pending["type"] == "try_again"
            attached = await wired.attach()
            assert attached.samples_redone == 1
        second = await client.result(ticket)
        assert ticket["sample_sequence_ids"] == [f"{ticket['request_id']}:{i}" for i in range(2)]
        return [[s["tokens"] for s in answer["sequences"]] for answer in (first, second)]

    async def lose_the_trainer() -> None:
        wired.proxy.detach("the test takes the trainer away")

    proxied = await calls(api, lose_the_trainer)
    async with TinkerHTTP(
        f"{account.client.gateway_url}/training/v1/rlorTrainerJobs/{account.id}/{wired.job_id}",
        account.api_key,
    ) as direct:
        assert proxied == await calls(direct)
