"""The Fireworks fork samples through deployments (fireworks-ai 1.2.28, unmodified): a trainer
hot-loads its sampler snapshots onto a deployment and the RL loop samples there, with the
newest weights after every hot-load, and the deployment says which weights served a sample.

Two ways the fork drives it: an RL loop with ``DeploymentManager`` + ``WeightSyncer`` +
the deployment's ``FiretitanSamplingClient`` (full-parameter: a base snapshot, then deltas),
and the SDK-managed path where ``FiretitanServiceClient.create_sampling_client(model_path)``
provisions the trainer and the deployment itself and hot-loads before sampling (LoRA)."""

from __future__ import annotations

import uuid

import httpx
import numpy as np
import pytest
from fireworks.training import sdk
from fireworks.training.sdk import FiretitanServiceClient, TrainerJobConfig, TrainerJobManager
from fireworks.training.sdk.deployment import DeploymentConfig, DeploymentManager
from fireworks.training.sdk.weight_syncer import WeightSyncer

from tests.plane.sdk_support import BASE_MODEL, RESULT_TIMEOUT, PlaneHttp, SdkAccount

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("hub_offline")]

SHAPE = "accounts/fireworks/deploymentShapes/rft-qwen3-8b/versions/v1"
ADAM = sdk.AdamParams(learning_rate=5e-2)
PROMPT = list(b"hello ")
#: A fixed seed: the same weights sample the same sequence, other weights (almost surely) not.
PROBE = sdk.SamplingParams(max_tokens=6, temperature=1.0, seed=11)


def _managers(
    sdk_http: PlaneHttp, account: SdkAccount
) -> tuple[TrainerJobManager, DeploymentManager]:
    # Control plane, inference and hot-load all live at the plane's one address.
    trainers = TrainerJobManager(api_key=account.api_key, base_url=sdk_http.url)
    deployments = DeploymentManager(
        api_key=account.api_key,
        base_url=sdk_http.url,
        inference_url=sdk_http.url,
        hotload_api_url=sdk_http.url,
    )
    return trainers, deployments


def _rl_datums(group: sdk.SampleResponse) -> list[sdk.Datum]:
    """Reward: a completion's mean byte value (continuous, so a group's rewards differ),
    centered in the group (GRPO-style)."""
    rewards = np.array([np.mean(seq.tokens or [0]) for seq in group.sequences], dtype=float)
    advantages = rewards - rewards.mean()
    datums = []
    for seq, adv in zip(group.sequences, advantages, strict=True):
        full = PROMPT + seq.tokens
        n_prompt = len(PROMPT) - 1
        datums.append(
            sdk.Datum(
                model_input=sdk.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={
                    "target_tokens": full[1:],
                    "logprobs": [0.0] * n_prompt + list(seq.logprobs or []),
                    "advantages": [0.0] * n_prompt + [float(adv)] * len(seq.tokens),
                },
            )
        )
    return datums


def _served_by(sdk_http: PlaneHttp, account: SdkAccount, deployment: str) -> tuple[str | None, str]:
    """Which snapshot serves a completion: the answer's ``snapshot`` and its header."""
    answer = httpx.post(
        f"{sdk_http.url}/inference/v1/completions",
        headers={"Authorization": f"Bearer {account.api_key}"},
        json={"model": deployment, "prompt": PROMPT, "max_tokens": 2, "raw_output": True},
        timeout=30,
    )
    answer.raise_for_status()
    return answer.json()["snapshot"]["identity"], answer.headers["x-localplane-snapshot-identity"]


def test_rl_loop_samples_through_a_deployment_the_trainer_hot_loads(sdk_http: PlaneHttp) -> None:
    account = sdk_http.new_account("fireworks")
    trainers, deployments = _managers(sdk_http, account)
    job_id = f"fw-rl-{uuid.uuid4().hex[:8]}"
    deployment_id = f"dep-{uuid.uuid4().hex[:8]}"
    sdk_http.adopt_job(account, job_id)
    endpoint = trainers.create_and_wait(
        TrainerJobConfig(
            base_model=BASE_MODEL, lora_rank=0, learning_rate=1e-2, requested_job_id=job_id
        ),
        poll_interval_s=0.1,
        timeout_s=60,
    )
    # The recommended wiring: the trainer first, then a deployment on its bucket.
    info = deployments.create_or_get(
        DeploymentConfig(
            deployment_id=deployment_id,
            base_model=BASE_MODEL,
            deployment_shape=SHAPE,
            hot_load_trainer_job=endpoint.job_name,
            min_replica_count=1,
        )
    )
    assert info.state == "READY" and info.hot_load_trainer_job == endpoint.job_name
    model = f"accounts/{account.id}/deployments/{deployment_id}"
    sdk_http.warm(account, endpoint.base_url)
    service = FiretitanServiceClient(base_url=endpoint.base_url, api_key=account.api_key)
    try:
        training = service.create_training_client(base_model=BASE_MODEL, lora_rank=0)
        syncer = WeightSyncer(
            policy_client=training,
            deploy_mgr=deployments,
            deployment_id=deployment_id,
            base_model=BASE_MODEL,
            hotload_timeout=30,
            warmup_max_retries=1,
        )
        sampler = syncer.get_sampling_client()

        def probe() -> list[float]:
            seq = sampler.sample(sdk.ModelInput.from_ints(PROMPT), 1, PROBE).result(RESULT_TIMEOUT)
            return list(seq.sequences[0].logprobs or [])

        served = [probe()]  # the base model, before any hot-load
        assert _served_by(sdk_http, account, model) == (None, "")
        snapshots = []
        for step in range(3):
            group = sampler.sample(
                sdk.ModelInput.from_ints(PROMPT),
                4,
                sdk.SamplingParams(max_tokens=6, temperature=1.0),
            ).result(RESULT_TIMEOUT)
            training.forward_backward(_rl_datums(group), "importance_sampling").result(
                RESULT_TIMEOUT
            )
            training.optim_step(ADAM).result(RESULT_TIMEOUT)
            # Full-parameter: a base snapshot first, deltas on it after (the delta chain).
            snapshot = syncer.save_and_hotload(f"step-{step}")
            assert snapshot is not None
            snapshots.append(snapshot)
            served.append(probe())
            assert _served_by(sdk_http, account, model) == (snapshot, snapshot)
        # Every hot-load changed what the deployment samples; the same weights sample the same.
        assert all(a != b for a, b in zip(served, served[1:], strict=False))
        assert probe() == served[-1]
        status = deployments.hotload_check_status(deployment_id, BASE_MODEL)
        assert status["replicas"][0]["current_snapshot_identity"] == snapshots[-1]
        # A delta against a snapshot the deployment does not serve is refused.
        with pytest.raises(httpx.HTTPStatusError):
            deployments.hotload(
                deployment_id,
                BASE_MODEL,
                snapshots[-1],
                incremental_snapshot_metadata={
                    "previous_snapshot_identity": snapshots[0],
                    "compression_format": "arc_v2",
                    "checksum_format": "alder32",
                },
            )
    finally:
        service.close()
        deployments.delete(deployment_id)
    assert deployments.get(deployment_id) is None
    sdk_http.delete_job(account, job_id)


def test_managed_service_hot_loads_before_it_samples(sdk_http: PlaneHttp) -> None:
    """FiretitanServiceClient.from_firetitan_config provisions a trainer and a deployment;
    create_sampling_client(model_path) hot-loads the saved snapshot and samples there."""
    account = sdk_http.new_account("fireworks")
    deployment_id = f"dep-{uuid.uuid4().hex[:8]}"
    with sdk_http.faults(
        routeLagSeconds={"min": 0.0, "max": 0.0}
    ):  # the SDK opens its session at once
        service = FiretitanServiceClient.from_firetitan_config(
            api_key=account.api_key,
            base_url=sdk_http.url,
            inference_url=sdk_http.url,
            hotload_api_url=sdk_http.url,
            base_model=BASE_MODEL,
            lora_rank=4,
            learning_rate=1e-2,
            deployment_id=deployment_id,
            deployment_shape=SHAPE,
            trainer_timeout_s=60,
            deployment_timeout_s=30,
            hotload_timeout_s=30,
            cleanup_trainer_on_close=True,
            cleanup_deployment_on_close="delete",
        )
        try:
            training = service.create_training_client(lora_rank=4)
            sdk_http.adopt_job(account, service.managed_trainer_job_id or "")
            before = service.create_sampling_client(
                model_path=training.save_weights_for_sampler("s0").result(RESULT_TIMEOUT).path
            )
            first = before.sample(sdk.ModelInput.from_ints(PROMPT), 1, PROBE).result(RESULT_TIMEOUT)
            group = before.sample(
                sdk.ModelInput.from_ints(PROMPT),
                4,
                sdk.SamplingParams(max_tokens=6, temperature=1.0),
            ).result(RESULT_TIMEOUT)
            training.forward_backward(_rl_datums(group), "importance_sampling").result(
                RESULT_TIMEOUT
            )
            training.optim_step(ADAM).result(RESULT_TIMEOUT)
            path = training.save_weights_for_sampler("s1").result(RESULT_TIMEOUT).path
            after = service.create_sampling_client(model_path=path)
            second = after.sample(sdk.ModelInput.from_ints(PROMPT), 1, PROBE).result(RESULT_TIMEOUT)
            assert first.sequences[0].logprobs != second.sequences[0].logprobs
            model = f"accounts/{account.id}/deployments/{deployment_id}"
            assert _served_by(sdk_http, account, model) == (path, path)
        finally:
            service.close()
    # close() cleaned up what the SDK provisioned: the deployment and the trainer.
    gone = httpx.get(
        f"{sdk_http.url}/v1/accounts/{account.id}/deployments/{deployment_id}",
        headers={"X-Api-Key": account.api_key},
    )
    assert gone.status_code == 404
