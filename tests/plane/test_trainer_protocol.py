"""The trainer's protocol edges, spoken raw: what it refuses (a 400 naming the field and
what is supported, never a silent fallback), its declared routes (unknown endpoints, wrong
methods), bounded bodies and echoes, and the exactly-once edges of issue 16 (a replay whose
body differs, the default sampling seed across a restore)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from localplane import limits
from localplane.admin import PlaneAdmin
from shepherd.states import JobState
from tests.helpers import Account, running_trainer, wait_state, warm
from tests.tinker_http import Model, TinkerHTTP, TrainerHTTPError, batch, datum


def _prompt(text: str) -> dict[str, Any]:
    return {"chunks": [{"type": "encoded_text", "tokens": list(text.encode())}]}


#: (operation, body, the field the refusal names, a word of what is supported)
REFUSED: list[Any] = [
    pytest.param(
        "optim_step",
        {"optimizer_params": {"type": "dimuon", "learning_rate": 0.1}},
        "optimizer_params.type",
        "AdamW",
        id="dimuon-optimizer",
    ),
    pytest.param(
        "optim_step",
        {"adam_params": {"learning_rate": 0.1, "momentum": 0.9}},
        "adam_params.momentum",
        "beta1",
        id="adam-unknown-field",
    ),
    pytest.param(
        "forward_backward",
        {"forward_backward_input": {"data": [datum("ab")], "loss_fn": "custom"}},
        "loss_fn",
        "client-side",
        id="server-side-custom-loss",
    ),
    pytest.param(
        "forward_backward",
        {
            "forward_backward_input": {
                "data": [datum("ab")],
                "loss_fn": "ppo",
                "loss_fn_config": {"clip_ratio": 0.2},
            }
        },
        "loss_fn_config.clip_ratio",
        "clip_low_threshold",
        id="loss-config-unknown-option",
    ),
    pytest.param(
        "forward_backward",
        {
            "forward_backward_input": {
                "data": [datum("ab")],
                "loss_fn": "cispo",
                "loss_fn_config": {"clip_low_threshold": 1.5, "clip_high_threshold": 1.2},
            }
        },
        "clip_low_threshold",
        "clip_high_threshold",
        id="loss-config-inverted-clip",
    ),
    pytest.param(
        "save_weights_for_sampler",
        {"path": "merged", "checkpoint_type": "merged_base"},
        "checkpoint_type",
        "base, delta",
        id="merged-base-export",
    ),
    pytest.param(
        "save_weights",
        {"path": "ttl", "ttl_seconds": 0},
        "ttl_seconds",
        "never expires",
        id="ttl-zero",
    ),
]


async def test_unsupported_settings_are_refused_naming_the_field(account: Account) -> None:
    trainer = await running_trainer(account, "refuse-ops")
    model = trainer.model
    try:
        for case in REFUSED:
            op, body, field, supported = case.values
            before = await model.info()
            with pytest.raises(TrainerHTTPError) as refused:
                await model.submit(op, body)
            assert refused.value.status == 400, (case.id, refused.value)
            message = refused.value.message
            assert field in message and supported in message, (case.id, message)
            # Refused before it took a seq_id: the same seq_id serves the next operation,
            # and nothing was applied.
            model.seq_id -= 1
            await model.run("forward_backward", model.fwdbwd_body(batch(1)))
            after = await model.info()
            assert after["seq_id"] == before["seq_id"] + 1, case.id
            assert after["optim_steps"] == before["optim_steps"], case.id
    finally:
        await trainer.api.aclose()
        await account.client.delete_job(trainer.job_id)


CREATE_REFUSED: list[Any] = [
    pytest.param({"lora_config": {"rank": 10**9}}, "lora_config.rank", "at most", id="rank-1e9"),
    pytest.param(
        {"lora_config": {"rank": 4, "train_mlp": False, "train_unembed": False}},
        "lora_config",
        "nothing to adapt",
        id="lora-targets-none",
    ),
    pytest.param(
        {"lora_config": {"rank": 4, "init_method": "nora"}},
        "lora_config.init_method",
        "kaiming",
        id="lora-init-nora",
    ),
    pytest.param(
        {"optimizer_config": {"type": "dimuon", "version": 1}},
        "optimizer_config.type",
        "adamw",
        id="dimuon-at-create",
    ),
    pytest.param(
        {"projection_head_dim": 8}, "projection_head_dim", "not supported", id="projection"
    ),
    pytest.param(
        {"base_model": "accounts/fireworks/models/other"}, "base_model", "serves", id="other-base"
    ),
]


async def test_create_model_refuses_what_it_cannot_build(account: Account) -> None:
    trainer = await running_trainer(account, "refuse-create")
    try:
        tables = (await trainer.api.healthz())["tables"]
        for case in CREATE_REFUSED:
            extra, field, supported = case.values
            body = {
                "session_id": trainer.session_id,
                "model_seq_id": 7,
                "base_model": "accounts/fireworks/models/qwen3-8b",
                **extra,
            }
            answer = await trainer.api.raw("create_model", body)
            assert answer.status_code == 400, (case.id, answer.text)
            message = answer.json()["error"]["message"]
            assert field in message and supported in message, (case.id, message)
        assert (await trainer.api.healthz())["tables"]["models"] == tables["models"]
    finally:
        await trainer.api.aclose()
        await account.client.delete_job(trainer.job_id)


SAMPLE_REFUSED: list[Any] = [
    pytest.param({"topk_sample_logprobs": 5}, "topk_sample_logprobs", id="topk-sample"),
    pytest.param({"topk_prompt_logprobs": 65}, "topk_prompt_logprobs", id="topk-prompt-over"),
    pytest.param({"topk_prompt_logprobs": -1}, "topk_prompt_logprobs", id="topk-prompt-neg"),
    pytest.param(
        {"target_prompt_logprobs": {"data": [1], "dtype": "int64", "shape": [1, 1]}},
        "target_prompt_logprobs",
        id="target-prompt",
    ),
    pytest.param({"prompt_alt_tokens_k": 2}, "prompt_alt_tokens_k", id="alt-tokens"),
    pytest.param({"prompt_logprobs_last_n": 2}, "prompt_logprobs_last_n", id="last-n-alone"),
    pytest.param(
        {"sampling_params": {"max_tokens": 4, "top_p": 0.0}}, "sampling_params.top_p", id="top-p-0"
    ),
]


async def test_sampling_refuses_what_it_cannot_compute(account: Account) -> None:
    trainer = await running_trainer(account, "refuse-sample")
    api = trainer.api
    try:
        created = await api.call(
            "create_sampling_session",
            {"session_id": trainer.session_id, "sampling_session_seq_id": 0},
        )
        for param in SAMPLE_REFUSED:
            extra, field = param.values
            body = {
                "sampling_session_id": created["sampling_session_id"],
                "seq_id": 1,
                "num_samples": 1,
                "prompt": _prompt("hello"),
                "sampling_params": {"max_tokens": 4},
                **extra,
            }
            answer = await api.raw("asample", body)
            assert answer.status_code == 400, (param.id, answer.text)
            assert field in answer.json()["error"]["message"], param.id
        # What is supported works: prompt logprobs (and their top 3) of the last 2 positions.
        ok = await api.call(
            "asample",
            {
                "sampling_session_id": created["sampling_session_id"],
                "seq_id": 1,
                "num_samples": 1,
                "prompt": _prompt("hello"),
                "sampling_params": {"max_tokens": 2, "top_k": 3},
                "prompt_logprobs": True,
                "prompt_logprobs_last_n": 2,
                "topk_prompt_logprobs": 3,
            },
        )
        result = await api.result(ok)
        scored = [lp is not None for lp in result["prompt_logprobs"]]
        assert scored == [False, False, False, True, True]
        # JSON: per position null or [[token id, logprob], ...], most likely first.
        topk = result["topk_prompt_logprobs"]
        assert [row is not None for row in topk] == scored
        for row, target, lp in zip(topk[3:], b"lo", result["prompt_logprobs"][3:], strict=True):
            assert len(row) == 3 and all(len(pair) == 2 for pair in row)
            assert [p[1] for p in row] == sorted((p[1] for p in row), reverse=True)
            assert lp <= row[0][1] and (target not in [p[0] for p in row] or lp >= row[2][1])
    finally:
        await api.aclose()
        await account.client.delete_job(trainer.job_id)


async def test_routes_are_declared_unknown_is_not_404_and_wrong_methods_apply_nothing(
    account: Account,
) -> None:
    trainer = await running_trainer(account, "routes")
    api, model = trainer.api, trainer.model
    try:
        await model.run("forward_backward", model.fwdbwd_body(batch(1)))
        before = await model.info()
        sessions = (await api.healthz())["tables"]["sessions"]

        unknown = await api.http.post(api.url("no_such_endpoint"), json={})
        assert unknown.status_code == 400, unknown.text  # never the route race's 404
        error = unknown.json()["error"]
        assert error["status"] == "UNIMPLEMENTED" and "no such endpoint" in error["message"]

        # A DELETE on optim_step applies no step; a DELETE on create_session makes no session.
        body = {"model_id": model.model_id, "seq_id": model.seq_id + 1, **model.optim_body()}
        for method, op, payload in (
            ("DELETE", "optim_step", body),
            ("PUT", "optim_step", body),
            ("DELETE", "create_session", {}),
            ("GET", "create_model", None),
            ("POST", "healthz", {}),
        ):
            answer = await api.http.request(method, api.url(op), json=payload)
            assert answer.status_code == 405, (method, op, answer.text)
            assert "allow" in answer.headers
        assert (await api.healthz())["tables"]["sessions"] == sessions
        after = await model.info()
        assert (after["optim_steps"], after["seq_id"]) == (before["optim_steps"], before["seq_id"])
        assert after["weights_digest"] == before["weights_digest"]
    finally:
        await api.aclose()
        await account.client.delete_job(trainer.job_id)


async def _declared_only(url: str, path: str, headers: dict[str, str], length: int) -> int:
    """Status of a POST whose Content-Length declares ``length`` bytes, sending none: a
    server that reads before refusing would wait for the body (and time out here)."""
    host, _, port = url.removeprefix("http://").partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n".encode()
    )
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    return int(status_line.split()[1])


async def test_bodies_over_the_limit_are_413_before_they_are_read(
    account: Account, admin: PlaneAdmin
) -> None:
    trainer = await running_trainer(account, "big-bodies")
    try:
        key = {"X-Api-Key": account.api_key}
        gateway = account.client.gateway_url
        route = (
            f"/training/v1/rlorTrainerJobs/{account.id}/{trainer.job_id}/api/v1/forward_backward"
        )
        big = limits.DATA_PLANE_MAX_BODY_BYTES + 1
        assert await _declared_only(gateway, route, key, big) == 413  # the gateway
        internals = await admin.job(trainer.job_id, account=account.id)
        direct = internals["trainer"]["url"]
        assert (
            await _declared_only(direct, "/api/v1/forward_backward", key, big) == 413
        )  # the trainer
        jobs = f"/v1/accounts/{account.id}/rlorTrainerJobs"
        assert (
            await _declared_only(gateway, jobs, key, limits.CONTROL_PLANE_MAX_BODY_BYTES + 1) == 413
        )

        # Streamed without a length: cut off once past the limit, still 413.
        async def chunks():
            for _ in range(3):
                yield b" " * limits.CONTROL_PLANE_MAX_BODY_BYTES

        async with httpx.AsyncClient(base_url=gateway, headers=key) as http:
            streamed = await http.post(jobs, content=chunks())
            assert streamed.status_code == 413, streamed.text
            assert (await http.get(jobs)).status_code == 200  # the plane serves on
    finally:
        await trainer.api.aclose()
        await account.client.delete_job(trainer.job_id)


async def test_long_fields_are_not_echoed_back(account: Account) -> None:
    trainer = await running_trainer(account, "long-fields")
    try:
        huge = "m" * (25 * 2**20)  # 25 MB: within the data plane's body limit
        answer = await trainer.api.raw("get_info", {"model_id": huge})
        assert answer.status_code == 400, answer.text[:300]
        assert len(answer.content) < 4096
        assert "more characters" in answer.json()["error"]["message"]
        control = await trainer.api.http.post(
            f"{account.client.gateway_url}/v1/accounts/{account.id}/rlorTrainerJobs",
            params={"rlorTrainerJobId": "x" * 5000},
            json={"trainingConfig": {"baseModel": "q" * 500_000}},
        )
        assert control.status_code == 400 and len(control.content) < 8192, control.text[:300]
    finally:
        await trainer.api.aclose()
        await account.client.delete_job(trainer.job_id)


async def test_a_replay_whose_body_differs_is_refused_naming_its_seq_id(account: Account) -> None:
    trainer = await running_trainer(account, "replay-diff")
    api, model = trainer.api, trainer.model
    try:
        first = await model.submit("forward_backward", model.fwdbwd_body(batch(1)))
        seq = model.seq_id
        # The same request again (a retry) is the same future...
        again = await model.submit("forward_backward", model.fwdbwd_body(batch(1)), seq_id=seq)
        assert again["request_id"] == first["request_id"]
        # ...another request under that seq_id is refused, not answered with the first's result.
        with pytest.raises(TrainerHTTPError) as diverged:
            await model.submit("forward_backward", model.fwdbwd_body(batch(2)), seq_id=seq)
        assert diverged.value.status == 400
        assert f"seq_id {seq}" in diverged.value.message and "differs" in diverged.value.message
        await api.result(first)

        # The same for samples (keyed by sampling session and seq_id) and model creation.
        created = await api.call(
            "create_sampling_session",
            {"session_id": trainer.session_id, "sampling_session_seq_id": 3},
        )
        sample = {
            "sampling_session_id": created["sampling_session_id"],
            "seq_id": 9,
            "num_samples": 1,
            "prompt": _prompt("ab"),
            "sampling_params": {"max_tokens": 3},
        }
        ticket = await api.call("asample", sample)
        assert (await api.call("asample", sample))["request_id"] == ticket["request_id"]
        other = await api.raw("asample", {**sample, "prompt": _prompt("xy")})
        assert other.status_code == 400 and "seq_id 9" in other.json()["error"]["message"]
        create = {
            "session_id": trainer.session_id,
            "model_seq_id": 5,
            "base_model": "accounts/fireworks/models/qwen3-8b",
        }
        made = await api.call("create_model", create)
        assert (await api.call("create_model", create))["request_id"] == made["request_id"]
        clash = await api.raw("create_model", {**create, "lora_config": {"rank": 2}})
        assert clash.status_code == 400 and "model_seq_id 5" in clash.json()["error"]["message"]
    finally:
        await api.aclose()
        await account.client.delete_job(trainer.job_id)


async def _sample_run(api: TinkerHTTP, session: str, sampler_path: str) -> list[list[int]]:
    """A fixed sequence of unseeded sample requests, as a loop without seeds makes them:
    the same prompt four times (a GRPO group), then two others."""
    created = await api.call(
        "create_sampling_session",
        {"session_id": session, "sampling_session_seq_id": 0, "model_path": sampler_path},
    )
    sid = created["sampling_session_id"]
    out = []
    for seq, text in enumerate(["2+2=", "2+2=", "2+2=", "2+2=", "3+5=", "hello"]):
        ticket = await api.call(
            "asample",
            {
                "sampling_session_id": sid,
                "seq_id": seq,
                "num_samples": 2,
                "prompt": _prompt(text),
                "sampling_params": {"max_tokens": 8, "temperature": 1.0},
            },
        )
        out.extend(s["tokens"] for s in (await api.result(ticket))["sequences"])
    return out


async def test_unseeded_samples_replay_identically_on_a_restored_trainer(
    account: Account, admin: PlaneAdmin
) -> None:
    """Issue 16: the default seed is a function of the weights, the request and its place
    in the sequence — not of a random request id — so a step replayed after a preemption
    on a new trainer (new session and model ids) samples exactly what it sampled before."""
    trainer = await running_trainer(account, "replay-seed")
    model = trainer.model
    await model.train(1, 2)
    await model.save("step-2")
    sampler = await model.save_for_sampler("sampler-2")
    first = await _sample_run(trainer.api, trainer.session_id, sampler)
    # A GRPO group (the same prompt) still gets different samples.
    assert len({tuple(t) for t in first[:8]}) > 1

    await admin.preempt(trainer.job_id, account=account.id)
    await wait_state(account.client, trainer.job_id, JobState.FAILED)
    await account.client.resume_job(trainer.job_id)
    await wait_state(account.client, trainer.job_id, JobState.RUNNING)
    await warm(trainer.api)
    session = await trainer.api.session()
    restored = await trainer.api.load_new_model(session, 0, "step-2")
    again = Model(trainer.api, restored.model_id)
    replayed_sampler = (await again.run("save_weights_for_sampler", {"path": "sampler-2"}))["path"]
    assert await _sample_run(trainer.api, session, replayed_sampler) == first
    await trainer.api.aclose()
    await account.client.delete_job(trainer.job_id)


async def test_a_json_only_trainer_refuses_protobuf_and_answers_json(
    account: Account, faults: PlaneAdmin
) -> None:
    """``trainerProtobuf: false`` makes trainers speak JSON only, as hosted Fireworks
    trainers do: a protobuf body is a final 415 naming the dialect, and a client that asks
    for protobuf results gets JSON — so a test can prove that whatever sits between a
    tinker-SDK program and the trainer really translates."""
    await faults.set_faults(trainerProtobuf=False)
    trainer = await running_trainer(account, "json-only")
    api, model = trainer.api, trainer.model
    try:
        refused = await api.http.post(
            api.url("forward_backward"),
            content=b"\x0a\x00",
            headers={"content-type": "application/x-protobuf"},
        )
        assert refused.status_code == 415, refused.text
        assert "JSON dialect" in refused.json()["error"]["message"]
        ticket = await model.submit("forward_backward", model.fwdbwd_body(batch(1)))
        answer = await api.http.post(
            api.url("retrieve_future"),
            json={"request_id": ticket["request_id"]},
            headers={"accept": "application/x-protobuf"},
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("application/json")
        assert answer.json()["metrics"]["loss:sum"] > 0
    finally:
        await api.aclose()
        await account.client.delete_job(trainer.job_id)
