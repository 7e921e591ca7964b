"""The trainer's Tinker API, JSON dialect, end to end through the gateway (trainer-api.md §4):
pipelined futures, strict seq_id order, exactly-once, real and reproducible training,
checkpoints on both planes, sampling, auth (§1) and the plane's data-plane counters.

Driven with raw HTTP (tests/tinker_http.py): what is checked is the wire contract."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from localplane.admin import PlaneAdmin
from localplane.trainer import lm
from shepherd.platform import FailedPrecondition
from shepherd.states import JobState
from tests.helpers import (
    BASE_MODEL,
    Account,
    gateway_api,
    running_trainer,
    wait_state,
    warm,
)
from tests.tinker_http import FutureFailed, Model, TinkerHTTP, TrainerHTTPError, batch, datum

N, K = 8, 4
#: Short waits so try_again and sequence gaps show within a test.
QUICK = {"extra_args": ["--retrieve-hold-seconds=0.3", "--seq-gap-timeout-seconds=1.5"]}


async def test_pipelined_calls_apply_in_order_and_the_loss_falls(account: Account) -> None:
    trainer = await running_trainer(account, "pipelined")
    model = trainer.model
    started = time.monotonic()
    tickets = []
    for step in range(1, 6):  # 10 submissions before any result is awaited
        tickets.append(await model.submit("forward_backward", model.fwdbwd_body(batch(step))))
        tickets.append(await model.submit("optim_step", model.optim_body()))
    submitted = time.monotonic() - started
    assert len({t["request_id"] for t in tickets}) == 10
    assert all(t["model_id"] == model.model_id for t in tickets)
    results = [await trainer.api.result(t) for t in tickets]
    losses = [r["metrics"]["loss:sum"] for r in results[::2]]
    assert all(
        set(r) >= {"loss_fn_output_type", "loss_fn_outputs", "metrics"} for r in results[::2]
    )
    out = results[0]["loss_fn_outputs"][0]["logprobs"]
    first_tokens = batch(1)[0]["model_input"]["chunks"][0]["tokens"]
    assert out["dtype"] == "float32" and out["shape"] == [len(first_tokens)]
    assert all(":" in k for r in results[::2] for k in r["metrics"])
    assert losses[-1] < losses[0]
    info = await model.info()
    assert (info["optim_steps"], info["seq_id"]) == (5, 10)
    assert info["model_data"]["tokenizer_id"].endswith("tokenizers/bytes")
    assert submitted < 5.0  # accepted without waiting for the work
    await trainer.api.aclose()


async def test_order_dedupe_and_future_outcomes(account: Account) -> None:
    trainer = await running_trainer(account, "ordered", training_config=QUICK)
    api = trainer.api
    reference = trainer.model  # model 0: the same operations, sent plainly in order
    await reference.train(1, 2)

    shuffled = await api.create_model(trainer.session_id, 1, BASE_MODEL)
    body = {
        1: ("forward_backward", shuffled.fwdbwd_body(batch(1))),
        2: ("optim_step", shuffled.optim_body()),
        3: ("forward_backward", shuffled.fwdbwd_body(batch(2))),
        4: ("optim_step", shuffled.optim_body()),
    }
    # Sent out of order: 4 and 3 wait for 1 and 2 (the poll on 4 comes back try_again).
    t4 = await shuffled.submit(*body[4], seq_id=4)
    t3 = await shuffled.submit(*body[3], seq_id=3)
    pending = await api.call("retrieve_future", {"request_id": t4["request_id"]})
    assert pending["type"] == "try_again" and pending["queue_state"] == "active"
    t2 = await shuffled.submit(*body[2], seq_id=2)
    t1 = await shuffled.submit(*body[1], seq_id=1)
    # A repeat (a client's retry) returns the same future and applies nothing.
    assert (await shuffled.submit(*body[3], seq_id=3))["request_id"] == t3["request_id"]
    for t in (t1, t2, t3, t4):
        await api.result(t)
    assert (await shuffled.submit(*body[2], seq_id=2))["request_id"] == t2["request_id"]
    # The future stays retrievable after it finished, with the same result.
    assert await api.result(t3) == await api.result(t3)

    ref_info, info = await reference.info(), await shuffled.info()
    assert info["optim_steps"] == 2 and info["seq_id"] == 4
    assert info["weights_digest"] == ref_info["weights_digest"]

    # A seq_id used by another operation is refused at once, and not with a 404 (§5).
    with pytest.raises(TrainerHTTPError) as clash:
        await shuffled.submit("forward", shuffled.forward_body(batch(1)), seq_id=4)
    assert clash.value.status == 400 and "already used" in clash.value.message
    # tinker numbers an anonymous sampler afresh on every attempt of the same save: a retry
    # with another sampling_session_seq_id is the same save (the first one's sampler), while
    # a named save with another path is not.
    save = await shuffled.submit("save_weights_for_sampler", {"sampling_session_seq_id": 7})
    retry = await shuffled.submit(
        "save_weights_for_sampler", {"sampling_session_seq_id": 8}, seq_id=shuffled.seq_id
    )
    assert retry["request_id"] == save["request_id"]
    assert (await api.result(retry))["sampling_session_id"].endswith(":sample:7")
    named = {"path": "kept"}
    await api.result(await shuffled.submit("save_weights_for_sampler", named))
    with pytest.raises(TrainerHTTPError) as renamed:
        await shuffled.submit("save_weights_for_sampler", {"path": "other"}, seq_id=shuffled.seq_id)
    assert renamed.value.status == 400 and "body differs" in renamed.value.message

    # What the trainer does not support is refused at once, naming the field and what is
    # supported; the seq_id stays free.
    with pytest.raises(TrainerHTTPError) as unsupported:
        await shuffled.submit(
            "forward_backward",
            {"forward_backward_input": {"data": [datum("ab")], "loss_fn": "nope"}},
            seq_id=shuffled.seq_id + 1,
        )
    shuffled.seq_id -= 1  # refused: the next operation takes that seq_id
    assert unsupported.value.status == 400
    assert "loss_fn" in unsupported.value.message and "cross_entropy" in unsupported.value.message
    # Bad work fails its future (category user), consumes its seq_id, changes nothing.
    broken_datum = datum("ab")
    broken_datum["loss_fn_inputs"]["target_tokens"]["data"] = [999]
    bad = await shuffled.submit(
        "forward_backward",
        {"forward_backward_input": {"data": [broken_datum], "loss_fn": "cross_entropy"}},
    )
    failed = await api.call("retrieve_future", {"request_id": bad["request_id"]})
    while failed.get("type") == "try_again":
        failed = await api.call("retrieve_future", {"request_id": bad["request_id"]})
    assert failed["category"] == "user" and "target_tokens" in failed["error"]
    assert (await shuffled.info())["weights_digest"] == info["weights_digest"]

    # Unknown futures are gone (410): the SDKs then re-submit the original request.
    gone = await api.raw("retrieve_future", {"request_id": "req-never-made"})
    assert gone.status_code == 410 and gone.json()["error"]["code"] == 410

    # A gap that never closes fails the waiting work and breaks the model, clearly.
    orphan = await shuffled.submit("optim_step", shuffled.optim_body(), seq_id=shuffled.seq_id + 2)
    with pytest.raises(FutureFailed) as broken:
        await api.result(orphan, timeout=20)
    assert broken.value.category == "user" and "never arrived" in broken.value.error
    await api.aclose()


async def test_save_load_and_checkpoint_references(account: Account, admin: PlaneAdmin) -> None:
    trainer = await running_trainer(account, "saver")
    api, model = trainer.api, trainer.model
    await model.train(1, 3)
    path = await model.save("step-3")
    # Scoped by training run (the model), as the hosted Tinker service names them.
    assert path == f"tinker://{model.model_id}/weights/step-3"
    assert await model.save("step-3") == path  # a retried save: same answer
    sampler_path = await model.save_for_sampler("step-3")  # same weights: becomes "both"
    assert sampler_path == f"tinker://{model.model_id}/sampler_weights/step-3"
    probe = [datum("the cat and the log. ")]
    loss_at_3 = await model.forward_loss(probe)
    digest_at_3 = (await model.info())["weights_digest"]
    await model.train(4, 4)
    with pytest.raises(FutureFailed, match="already exists"):
        await model.save("step-3")  # other weights under a taken name

    # Restored into a new model: the same weights, the same forward loss, any path form.
    refs = ["step-3", path, "tinker://saver/weights/step-3", "cross_job://saver/step-3"]
    for seq, ref in enumerate(refs, start=1):
        restored = await api.load_new_model(trainer.session_id, seq, ref)
        info = await restored.info()
        assert (info["weights_digest"], info["optim_steps"]) == (digest_at_3, 3)
        assert await restored.forward_loss(probe) == loss_at_3
    # Into an existing model too; and a missing checkpoint fails the future, not the HTTP call.
    await model.load("step-3")
    assert (await model.info())["weights_digest"] == digest_at_3
    with pytest.raises(FutureFailed, match="does not exist"):
        await model.load("nope")
    assert [c async for c in account.client.iter_checkpoints("saver")][0].promotable

    # A deleted job's checkpoints still load, from another job of the same account...
    await api.aclose()
    await account.client.delete_job("saver")
    await wait_state(account.client, "saver", JobState.DELETED)
    other = await running_trainer(account, "loader")
    loaded = await other.api.load_new_model(other.session_id, 1, "cross_job://saver/step-3")
    assert (await loaded.info())["weights_digest"] == digest_at_3
    # ...but not another account's.
    stranger, _ = await admin.create_account()
    with pytest.raises(FutureFailed, match="another account"):
        await other.model.load(f"accounts/{stranger}/rlorTrainerJobs/saver/checkpoints/step-3")
    await other.api.aclose()


async def test_preemption_then_load_by_name_gives_identical_weights(
    account: Account, admin: PlaneAdmin
) -> None:
    straight = await running_trainer(account, "straight")
    await straight.model.train(1, N)
    expected = (await straight.info())["weights_digest"]
    await straight.api.aclose()

    victim = await running_trainer(account, "victim")
    await victim.model.train(1, K)
    await victim.model.save(f"step-{K}")
    await admin.preempt("victim", account=account.id)
    await wait_state(account.client, "victim", JobState.FAILED)
    old_future = victim.model.tickets[-1]
    with pytest.raises(TrainerHTTPError) as no_route:  # the dead trainer has no route
        await victim.api.result(old_future, timeout=5)
    assert no_route.value.status == 404
    await account.client.resume_job("victim")
    await wait_state(account.client, "victim", JobState.RUNNING)
    await warm(victim.api)
    # The new trainer never heard of the old one's futures: 410, so clients re-submit.
    assert (await victim.api.raw("retrieve_future", old_future)).status_code == 410

    # A new trainer generation: new session, the checkpoint by its logical name, with Adam.
    session = await victim.api.session()
    resumed = await victim.api.load_new_model(session, 0, f"step-{K}", optimizer=True)
    assert (await resumed.info())["optim_steps"] == K
    await resumed.train(K + 1, N)
    info = await resumed.info()
    assert info["optim_steps"] == N
    assert info["weights_digest"] == expected
    await victim.api.aclose()


async def test_sampling(account: Account) -> None:
    trainer = await running_trainer(account, "sampler", training_config={"lora_rank": 4})
    api, model = trainer.api, trainer.model
    info = await model.info()
    assert info["is_lora"] and info["lora_rank"] == 4
    await model.train(1, 3)
    path = await model.save_for_sampler("policy-3")
    sampler_id = (
        await api.call(
            "create_sampling_session",
            {"session_id": trainer.session_id, "sampling_session_seq_id": 0, "model_path": path},
        )
    )["sampling_session_id"]
    described = await api.call(f"samplers/{sampler_id}", method="GET")
    assert described == {"sampler_id": sampler_id, "base_model": BASE_MODEL, "model_path": path}

    prompt = {"chunks": [{"type": "encoded_text", "tokens": lm.encode("the cat")}]}
    request = {
        "sampling_session_id": sampler_id,
        "seq_id": 0,
        "num_samples": 3,
        "prompt": prompt,
        "prompt_logprobs": True,
        "sampling_params": {"max_tokens": 12, "temperature": 1.0, "seed": 7, "stop": [" "]},
    }
    ticket = await api.call("asample", request)
    assert len(ticket["sample_sequence_ids"]) == 3
    assert (await api.call("asample", request))["request_id"] == ticket["request_id"]  # dedupe
    result = await api.result(ticket)
    assert len(result["sequences"]) == 3
    for seq in result["sequences"]:
        assert seq["stop_reason"] in ("stop", "length")
        assert 0 < len(seq["tokens"]) <= 12 and len(seq["logprobs"]) == len(seq["tokens"])
        assert all(lp <= 0 for lp in seq["logprobs"])
        if seq["stop_reason"] == "stop":
            assert seq["tokens"][-1] in (lm.encode(" ")[0], lm.EOS)
    assert result["prompt_logprobs"][0] is None and len(result["prompt_logprobs"]) == 7
    again = await api.result(await api.call("asample", {**request, "seq_id": 1}))
    assert again["sequences"] == result["sequences"]  # same seed, same weights: same tokens
    # Anonymous sampler weights: a sampling session straight from the model.
    anon = await model.run("save_weights_for_sampler", {"sampling_session_seq_id": 1})
    greedy = {**request, "sampling_session_id": anon["sampling_session_id"], "num_samples": 1}
    greedy["sampling_params"] = {"max_tokens": 4, "temperature": 0.0, "stop": []}
    out = await api.result(await api.call("asample", greedy))
    assert out["sequences"][0]["stop_reason"] == "length"
    await api.aclose()


async def test_auth_headers_and_stats_by_dialect(account: Account, admin: PlaneAdmin) -> None:
    trainer = await running_trainer(account, "authed")
    job_name = f"accounts/{account.id}/rlorTrainerJobs/authed"
    assert account.api_key.startswith("tml-")  # minted keys pass the Tinker SDK's check
    fireworks_key = await admin.create_api_key(account.id, key_style="fireworks")
    assert not fireworks_key.startswith("tml-")

    bearer = gateway_api(account, "authed", auth="bearer")
    assert (await bearer.healthz())["status"] == "ok"
    assert (await trainer.model.info())["model_id"] == trainer.model.model_id  # X-Api-Key
    async with TinkerHTTP(trainer.api.base_url, fireworks_key) as fw:
        assert (await fw.healthz())["status"] == "ok"
    for key in (None, "tml-not-a-key"):
        async with TinkerHTTP(trainer.api.base_url, key) as anonymous:
            assert (await anonymous.raw("healthz", method="GET")).status_code == 401
    # The trainer checks keys itself, for calls that bypass the gateway.
    direct_url = (await admin.job("authed", account=account.id))["trainer"]["url"]
    async with TinkerHTTP(direct_url, None) as direct:
        assert (await direct.raw("healthz", method="GET")).status_code == 401
    async with TinkerHTTP(direct_url, account.api_key, auth="bearer") as direct:
        assert (await direct.healthz())["status"] == "ok"
    # The control plane takes both headers as well.
    async with httpx.AsyncClient(base_url=account.client.base_url) as http:
        for headers in (
            {"X-Api-Key": account.api_key},
            {"Authorization": f"Bearer {account.api_key}"},
        ):
            r = await http.get("/v1/accounts", headers=headers)
            assert r.json()["accounts"] == [{"name": f"accounts/{account.id}"}]
        assert (await http.get("/v1/accounts")).status_code == 401

    before = await admin.data_plane(job_name)
    await trainer.model.train(1, 2)
    after = await admin.data_plane(job_name)
    assert after.get("json:forward_backward", 0) - before.get("json:forward_backward", 0) == 2
    assert after.get("json:optim_step", 0) - before.get("json:optim_step", 0) == 2
    assert after["json:retrieve_future"] > before.get("json:retrieve_future", 0)
    assert not [k for k in after if k.startswith("protobuf:")]  # this client spoke JSON only
    assert (await admin.data_plane())["json:create_model"] >= 1
    await bearer.aclose()
    await trainer.api.aclose()


async def test_checkpoints_on_the_control_plane_and_promotion(account: Account) -> None:
    trainer = await running_trainer(account, "promo", training_config={"lora_rank": 2})
    await trainer.model.train(1, 2)
    await trainer.model.save("state-2")
    await trainer.model.save_for_sampler("step-2-sampler")
    listed = {c.checkpoint_id: c async for c in account.client.iter_checkpoints("promo")}
    assert set(listed) == {"state-2", "step-2-sampler"}
    assert listed["state-2"].checkpoint_type == "CHECKPOINT_TYPE_TRAINING_LORA"
    assert not listed["state-2"].promotable and listed["state-2"].step == 2
    assert listed["step-2-sampler"].checkpoint_type == "CHECKPOINT_TYPE_INFERENCE_LORA"
    assert listed["step-2-sampler"].promotable
    names = await trainer.api.call("list_checkpoints", method="GET")
    assert names == {"checkpoints": ["state-2"]}  # the trainer lists what it can resume from

    with pytest.raises(FailedPrecondition, match="not promotable"):
        await account.client.promote_checkpoint("state-2", job_id="promo", output_model_id="nope")
    answer = await account.client.promote_checkpoint(
        "step-2-sampler", job_id="promo", output_model_id="promoted", async_promotion=True
    )
    assert answer.operation is not None
    async with asyncio.timeout(10):
        while not (op := await account.client.get_operation(answer.operation.name)).done:
            await asyncio.sleep(0.05)
    assert op.response is not None and op.response.kind == "HF_PEFT_ADDON"
    await trainer.api.aclose()


async def test_forward_only_shape(account: Account) -> None:
    from tests.helpers import job_request

    await account.client.create_job(
        "fwd",
        # Trainers load no datasets (clients send tokens): a name is kept and never read.
        job_request(dataset=f"accounts/{account.id}/datasets/nowhere"),
        training_shape="accounts/localplane/trainingShapes/tiny-cpu-forward-only",
    )
    await wait_state(account.client, "fwd", JobState.RUNNING)
    api = gateway_api(account, "fwd")
    await warm(api)
    model: Model = await api.create_model(await api.session(), 0, BASE_MODEL)
    assert await model.forward_loss(batch(1)) > 0
    for op, body in (
        ("forward_backward", model.fwdbwd_body(batch(1))),
        ("optim_step", model.optim_body()),
    ):
        # Refused at submission (a 400 naming why), before it takes a seq_id.
        with pytest.raises(TrainerHTTPError, match="forward-only") as refused:
            await model.run(op, body)
        assert refused.value.status == 400
        model.seq_id -= 1
    assert await model.forward_loss(batch(1)) > 0  # the sequence goes on
    await api.aclose()


async def test_bodies_python_cannot_parse_are_400_on_the_trainer(account: Account) -> None:
    trainer = await running_trainer(account, "unparsable")
    try:
        for body, why in [
            (b'{"a":' * 10_000 + b"1" + b"}" * 10_000, "nested too deeply"),
            (b'{"model_id": ' + b"9" * 5000 + b"}", "too many digits"),
        ]:
            answer = await trainer.api.http.post(
                trainer.api.url("forward_backward"),
                content=body,
                headers={"content-type": "application/json"},
            )
            assert answer.status_code == 400 and why in answer.text, answer.text[:200]
    finally:
        await trainer.api.aclose()
        await account.client.delete_job("unparsable")
