"""A client written only from trainer-api.md — raw httpx, none of Shepherd's code — does the
whole life of a job against localplane: create, wait for RUNNING and a healthy route, train,
checkpoint, survive a preemption through resume + load, promote, delete. The data plane is
the Tinker API's JSON dialect: futures, seq_ids, retrieve_future.

This is what "third-party clients of the hosted service work against localplane unchanged"
means in practice: if this test needs a localplane-specific call other than the admin
preemption that stands in for a spot reclaim, the plane has drifted from the contract."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess


class ThirdPartyClient:
    """What a careful user of the hosted service would write from the contract."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, headers={"X-Api-Key": api_key}, timeout=30)
        self.account = ""

    async def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return await self.http.request(method, path, **kw)

    async def ok(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        response = await self.call(method, path, **kw)
        assert response.status_code == 200, response.text
        return response.json()

    async def resolve_account(self) -> str:
        body = await self.ok("GET", "/v1/accounts", params={"pageSize": 2})
        self.account = body["accounts"][0]["name"].split("/")[1]
        return self.account

    def jobs(self, job: str = "") -> str:
        return f"/v1/accounts/{self.account}/rlorTrainerJobs" + (f"/{job}" if job else "")

    def data(self, job: str, call: str) -> str:
        return f"/training/v1/rlorTrainerJobs/{self.account}/{job}/api/v1/{call}"

    async def poll_state(self, job: str, wanted: set[str], timeout: float = 30) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                body = await self.ok("GET", self.jobs(job))
                if body["state"] in wanted:
                    return body
                await asyncio.sleep(0.1)

    async def train_call(self, job: str, call: str, body: dict[str, Any]) -> dict[str, Any]:
        """A data-plane call with the contract's 404 rule: ask the control plane what a 404 means."""
        for _ in range(50):
            response = await self.call("POST", self.data(job, call), json=body)
            if response.status_code != 404:
                assert response.status_code == 200, response.text
                return response.json()
            state = (await self.ok("GET", self.jobs(job)))["state"]
            if state != "JOB_STATE_RUNNING":
                raise JobGone(state)
            await asyncio.sleep(0.1)  # the route race: bounded retries
        raise AssertionError("route never became reachable")

    async def future(self, job: str, call: str, body: dict[str, Any]) -> dict[str, Any]:
        """Submit an operation, then wait for its future's result."""
        ticket = await self.train_call(job, call, body)
        async with asyncio.timeout(30):
            while True:
                result = await self.train_call(
                    job, "retrieve_future", {"request_id": ticket["request_id"]}
                )
                if result.get("type") != "try_again":
                    assert "error" not in result, result
                    return result

    async def step(self, job: str, model_id: str, seq_id: int) -> float:
        """One training step: forward_backward on a fixed text, then optim_step."""
        tokens = list(b"the contract is the client. ")
        datum = {
            "model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens[:-1]}]},
            "loss_fn_inputs": {
                "target_tokens": {"data": tokens[1:], "dtype": "int64", "shape": [len(tokens) - 1]}
            },
        }
        fwd = await self.future(
            job,
            "forward_backward",
            {
                "model_id": model_id,
                "seq_id": seq_id,
                "forward_backward_input": {"data": [datum], "loss_fn": "cross_entropy"},
            },
        )
        await self.future(
            job,
            "optim_step",
            {"model_id": model_id, "seq_id": seq_id + 1, "adam_params": {"learning_rate": 3e-3}},
        )
        return float(fwd["metrics"]["loss:sum"])

    async def warm_up(self, job: str, probes: int = 3) -> None:
        good = 0
        async with asyncio.timeout(30):
            while good < probes:
                response = await self.call("GET", self.data(job, "healthz"))
                if response.status_code == 404:
                    good = 0
                    await asyncio.sleep(0.05)
                    continue
                assert response.status_code == 200, response.text
                good += 1


class JobGone(Exception):
    pass


async def test_whole_life_from_the_contract_alone(tmp_path: Any) -> None:
    with PlaneProcess(
        tmp_path / "plane", config={"routeLagSeconds": {"min": 0.2, "max": 1.0}}
    ) as plane:
        c = ThirdPartyClient(plane.url, plane.api_key)
        try:
            await c.resolve_account()
            shape = await c.ok(
                "GET",
                "/v1/accounts/fireworks/trainingShapes/qwen3-8b-128k-h200/versions",
                params={"filter": "latest_validated=true", "pageSize": 1},
            )
            version = shape["trainingShapeVersions"][0]["name"]
            body = {
                "displayName": "third party",
                "serviceMode": True,
                "trainingConfig": {
                    "baseModel": "accounts/fireworks/models/qwen3-8b",
                    "loraRank": 0,
                    "learningRate": 3e-3,
                },
            }
            created = await c.ok(
                "POST",
                c.jobs(),
                params={"rlorTrainerJobId": "tp-1", "trainingShape": version},
                json=body,
            )
            assert created["trainingShapeRef"] == version
            assert created["trainingConfig"]["acceleratorType"] == "NVIDIA_H200_141GB"
            # Idempotent create: the same id again is 409, and a GET finds the job.
            again = await c.call(
                "POST",
                c.jobs(),
                params={"rlorTrainerJobId": "tp-1", "trainingShape": version},
                json=body,
            )
            assert again.status_code == 409 and again.json()["error"]["status"] == "ALREADY_EXISTS"

            await c.poll_state("tp-1", {"JOB_STATE_RUNNING"})
            await c.warm_up("tp-1")
            session = (await c.train_call("tp-1", "create_session", {"tags": []}))["session_id"]
            model_id = (
                await c.future(
                    "tp-1",
                    "create_model",
                    {
                        "session_id": session,
                        "model_seq_id": 0,
                        "base_model": body["trainingConfig"]["baseModel"],
                        "lora_config": {"rank": 0},
                    },
                )
            )["model_id"]
            losses = [await c.step("tp-1", model_id, 2 * s - 1) for s in range(1, 4)]
            assert losses[-1] < losses[0]
            saved = await c.future(
                "tp-1", "save_weights", {"model_id": model_id, "seq_id": 7, "path": "step-3"}
            )
            assert saved["path"].startswith("tinker://")

            async with PlaneAdmin(plane.url, plane.admin_key) as admin:
                await admin.preempt("tp-1")
            # The next call finds the trainer gone; the control plane says why.
            with pytest.raises(JobGone):
                await c.step("tp-1", model_id, 8)
            failed = await c.poll_state("tp-1", {"JOB_STATE_FAILED"})
            assert "preempt" in failed["status"]["message"]

            resumed = await c.ok("POST", f"{c.jobs('tp-1')}:resume")
            assert resumed["state"] in ("JOB_STATE_PENDING", "JOB_STATE_CREATING")
            await c.poll_state("tp-1", {"JOB_STATE_RUNNING"})
            await c.warm_up("tp-1")
            # A new trainer: a new session, and the checkpoint by name into a new model.
            session = (await c.train_call("tp-1", "create_session", {"tags": []}))["session_id"]
            loaded = await c.future(
                "tp-1",
                "load_weights",
                {"session_id": session, "model_seq_id": 0, "path": "step-3", "optimizer": True},
            )
            model_id = loaded["model_id"]
            await c.step("tp-1", model_id, 1)
            await c.future(
                "tp-1",
                "save_weights_for_sampler",
                {"model_id": model_id, "seq_id": 3, "path": "step-4"},
            )

            listed = await c.ok("GET", f"{c.jobs('tp-1')}/checkpoints")
            names = [
                f"accounts/{c.account}/rlorTrainerJobs/tp-1/checkpoints/{n}"
                for n in ("step-3", "step-4")
            ]
            assert [ck["name"] for ck in listed["checkpoints"]] == names
            assert [ck["promotable"] for ck in listed["checkpoints"]] == [False, True]

            promoted = await c.ok(
                "POST",
                f"/v1/accounts/{c.account}/checkpoints/step-4:promote",
                json={
                    "output_model": f"accounts/{c.account}/models/tp-model",
                    "trainer_job_id": f"accounts/{c.account}/rlorTrainerJobs/tp-1",
                    "base_model": "accounts/fireworks/models/qwen3-8b",
                    "async_promotion": True,
                },
            )
            operation = promoted["operation"]
            async with asyncio.timeout(10):
                while not operation["done"]:
                    await asyncio.sleep(0.1)
                    operation = await c.ok("GET", f"/v1/{operation['name']}")
            assert operation["response"]["name"] == f"accounts/{c.account}/models/tp-model"
            model = await c.ok("GET", f"/v1/accounts/{c.account}/models/tp-model")
            assert model["state"] == "READY" and model["checkpoint"] == names[1]

            await c.ok("DELETE", c.jobs("tp-1"))
            tombstone = await c.poll_state("tp-1", {"JOB_STATE_DELETED"})
            assert tombstone["name"].endswith("/tp-1")
        finally:
            await c.http.aclose()
