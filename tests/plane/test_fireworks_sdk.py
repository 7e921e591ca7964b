"""The unmodified Fireworks training SDK (`fireworks-ai` 1.2.28) drives localplane end to end:
`TrainerJobManager` creates the job and waits for readiness, `FiretitanServiceClient` trains
with pipelined calls, saves, restores, saves for the sampler and promotes; after a preemption
`reconnect_and_wait` brings the trainer back and a new session reloads the checkpoint by its
logical name, optimizer included. The plane's stats show the SDK spoke only JSON."""

from __future__ import annotations

import uuid

import pytest
from fireworks.training import sdk
from fireworks.training.sdk import (
    FiretitanServiceClient,
    TrainerJobConfig,
    TrainerJobManager,
)
from transformers import AutoTokenizer

from tests.plane.sdk_support import (
    BASE_MODEL,
    CORPUS,
    RESULT_TIMEOUT,
    PlaneHttp,
    byte_datums,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("hub_offline")]

ADAM = sdk.AdamParams(learning_rate=1e-2)
#: The SDK's readiness poll defaults to 5 s; the plane is up in well under a second.
POLL = 0.1


def _loss(result: sdk.ForwardBackwardOutput) -> float:
    return result.metrics["loss:sum"]


def test_fireworks_sdk_end_to_end(sdk_http: PlaneHttp) -> None:
    account = sdk_http.new_account("fireworks")
    assert not account.api_key.startswith("tml-")  # what Fireworks users hold
    manager = TrainerJobManager(api_key=account.api_key, base_url=sdk_http.url)
    assert manager.account_id == account.id
    job_id = f"fw-{uuid.uuid4().hex[:8]}"
    config = TrainerJobConfig(
        base_model=BASE_MODEL, lora_rank=4, learning_rate=1e-2, requested_job_id=job_id
    )
    sdk_http.adopt_job(account, job_id)
    endpoint = manager.create_and_wait(config, poll_interval_s=POLL, timeout_s=60)
    assert endpoint.job_id == job_id
    assert endpoint.base_url == sdk_http.trainer_base_url(account, job_id)
    # FiretitanServiceClient opens its session on construction: warm the route first (§5).
    sdk_http.warm(account, endpoint.base_url)
    data = byte_datums(sdk, CORPUS)

    service = FiretitanServiceClient(base_url=endpoint.base_url, api_key=account.api_key)
    try:
        training = service.create_training_client(base_model=BASE_MODEL, lora_rank=4, seed=0)
        # The Fireworks client has no server-side tokenizer lookup of its own; the trainer's
        # get_info names a local tokenizer directory that loads offline.
        tokenizer_dir = training.get_info().model_data.tokenizer_id
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        assert tokenizer.encode("hello", add_special_tokens=False) == list(b"hello")

        before = _loss(training.forward(data, "cross_entropy").result(RESULT_TIMEOUT))
        futures = []
        for _ in range(3):
            futures.append(training.forward_backward(data, "cross_entropy"))
            futures.append(training.optim_step(ADAM))
        results = [f.result(RESULT_TIMEOUT) for f in futures]
        step_losses = [_loss(r) for r in results[0::2]]
        assert step_losses[0] == pytest.approx(before)
        assert all(a > b for a, b in zip(step_losses, step_losses[1:], strict=False)), step_losses

        training.save_state("step-3").result(RESULT_TIMEOUT)
        after = _loss(training.forward(data, "cross_entropy").result(RESULT_TIMEOUT))
        assert after < before
        assert "step-3" in training.list_checkpoints()

        # Restore into a new model (another seed: the SDK refuses a duplicate configuration).
        other = service.create_training_client(base_model=BASE_MODEL, lora_rank=4, seed=1)
        assert _loss(other.forward(data, "cross_entropy").result(RESULT_TIMEOUT)) != after
        other.load_state_with_optimizer("step-3").result(RESULT_TIMEOUT)
        assert _loss(other.forward(data, "cross_entropy").result(RESULT_TIMEOUT)) == after

        # Sampler checkpoint (suffixed name) -> control plane -> promotion.
        saved = training.save_weights_for_sampler_ext("sampler-3")
        assert saved.snapshot_name.startswith("sampler-3-")
        listed = {c["name"].rsplit("/", 1)[-1]: c for c in manager.list_checkpoints(job_id)}
        assert listed[saved.snapshot_name]["promotable"]
        # An operation not done in the answer makes the SDK sleep 10 s before polling it;
        # an instant promotion keeps the test short (the async path has its own tests).
        with sdk_http.faults(promotionSeconds=0.0):
            model = manager.promote_checkpoint(
                name=listed[saved.snapshot_name]["name"],
                output_model_id=f"m-{job_id}",
                base_model=BASE_MODEL,
            )
        assert model["state"] == "READY"
    finally:
        service.close()

    served = sdk_http.data_plane(account, job_id)
    assert served.get("json:forward_backward", 0) >= 3
    assert served.get("json:forward", 0) >= 3
    assert not [op for op in served if op.startswith("protobuf:")], served

    # Preemption: reconnect_and_wait resumes the job; a new session reloads by logical name.
    sdk_http.preempt(account, job_id)
    sdk_http.wait_state(account, job_id, "JOB_STATE_FAILED")
    endpoint = manager.reconnect_and_wait(job_id, poll_interval_s=POLL, timeout_s=60)
    sdk_http.warm(account, endpoint.base_url)
    service = FiretitanServiceClient(base_url=endpoint.base_url, api_key=account.api_key)
    try:
        resumed = service.create_training_client(base_model=BASE_MODEL, lora_rank=4, seed=0)
        resumed.load_state_with_optimizer("step-3").result(RESULT_TIMEOUT)
        assert _loss(resumed.forward(data, "cross_entropy").result(RESULT_TIMEOUT)) == after
        futures = [resumed.forward_backward(data, "cross_entropy"), resumed.optim_step(ADAM)]
        futures += [resumed.forward_backward(data, "cross_entropy"), resumed.optim_step(ADAM)]
        results = [f.result(RESULT_TIMEOUT) for f in futures]
        assert _loss(results[0]) == pytest.approx(after)
        assert _loss(results[2]) < _loss(results[0])
    finally:
        service.close()
    manager.delete(job_id)
    sdk_http.wait_state(account, job_id, "JOB_STATE_DELETED")
