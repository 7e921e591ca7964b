"""``output.hot_load_deployment`` does what it says: at the end the job hot-loads its promoted
checkpoint onto the deployment, which then serves it (its completions name those weights);
a deployment that does not exist fails the job before any trainer exists, naming the field."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowFailureError

from shepherd.phases import Phase
from tests.workflows.conftest import Stack

BASE = "accounts/fireworks/models/qwen3-8b"


async def create_deployment(stack: Stack, deployment_id: str) -> None:
    account = await stack.account.client.account_id()
    body = {"baseModel": BASE, "minReplicaCount": 1, "maxReplicaCount": 1, "enableHotLoad": True}
    await stack.account.client._t.request(  # noqa: SLF001 - the platform's own API, raw
        "POST",
        f"{stack.plane.url}/v1/accounts/{account}/deployments",
        params={"deploymentId": deployment_id},
        json_body=body,
    )


async def test_the_promoted_checkpoint_is_served_by_the_deployment(stack: Stack) -> None:
    await create_deployment(stack, "serving")
    handle = await stack.start(stack.spec("published", output={"hot_load_deployment": "serving"}))
    final = await handle.result()
    assert final.phase is Phase.COMPLETED and final.model is not None
    promoted = final.last_checkpoint
    assert promoted is not None and final.deployment is not None
    assert final.deployment.identity == (promoted.sampler or promoted.name)
    deployment = await stack.account.client.get_deployment("serving")
    assert deployment["currentSnapshot"]["identity"] == final.deployment.identity
    account = await stack.account.client.account_id()
    answer = await stack.account.client._t.request(  # noqa: SLF001
        "POST",
        f"{stack.plane.url}/inference/v1/completions",
        json_body={
            "model": f"accounts/{account}/deployments/serving",
            "prompt": "the cat",
            "max_tokens": 4,
        },
    )
    assert answer["snapshot"]["identity"] == final.deployment.identity


async def test_a_missing_deployment_fails_before_any_trainer(stack: Stack) -> None:
    handle = await stack.start(stack.spec("unserved", output={"hot_load_deployment": "nowhere"}))
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    status = await stack.status(handle)
    assert status.phase is Phase.FAILED and status.error is not None
    assert "output.hot_load_deployment: deployment nowhere does not exist" in status.error.message
    assert (await stack.account.client.list_jobs()).rlor_trainer_jobs == []  # no trainer
