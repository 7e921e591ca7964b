"""Fixtures of the proxy's tests: JSON-only trainers (``trainerProtobuf: false``, as hosted
trainers are, so every request a tinker-SDK program makes must have been translated), a rig
per test, and one reference run of the plain script straight against a (protobuf-speaking)
trainer, without Shepherd and without faults."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import PlatformClient
from shepherd.states import JobState
from tests.helpers import Account, delete_all_jobs, gateway_api, job_request, wait_state, warm
from tests.proxy.rig import (
    COMPUTE_DELAY,
    RANK,
    SFT_SCRIPT,
    WARM_PROBES,
    Rig,
    Run,
    finish,
    open_rig,
    program_env,
    start_program,
    stop,
)


@pytest.fixture
async def json_trainers(faults: PlaneAdmin) -> PlaneAdmin:
    """Trainers started during the test speak JSON only (the faults fixture restores)."""
    await faults.set_faults(trainerProtobuf=False)
    return faults


@pytest.fixture
async def rigs(
    account: Account, json_trainers: PlaneAdmin
) -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    """Opens rigs (proxies with these settings' overrides); closes them all afterwards."""
    opened: list[Rig] = []

    async def open_one(**overrides: Any) -> Rig:
        opened.append(await open_rig(account, json_trainers, **overrides))
        return opened[-1]

    try:
        yield open_one
    finally:
        for one in opened:
            await one.proxy.close()


@pytest.fixture
async def rig(rigs: Callable[..., Awaitable[Rig]]) -> Rig:
    return await rigs()


@pytest.fixture(scope="module")
async def reference(plane: PlaneProcess) -> AsyncIterator[tuple[Run, dict[str, int]]]:
    """The plain script run straight against a trainer that speaks both dialects: its
    output, and the data-plane requests that trainer served by ``dialect:op``."""
    async with PlaneAdmin(plane.url, plane.admin_key) as admin:
        await admin.set_faults(trainerProtobuf=True)
        account_id, key = await admin.create_account()
        async with PlatformClient(plane.url, key) as client:
            account = Account(account_id, key, client)
            job_id = f"direct-{uuid.uuid4().hex[:8]}"
            training = {"lora_rank": RANK, "extra_args": [COMPUTE_DELAY]}
            await client.create_job(job_id, job_request(training_config=training))
            await wait_state(client, job_id, JobState.RUNNING)
            api = gateway_api(account, job_id)
            try:
                await warm(api, probes=WARM_PROBES)
            finally:
                await api.http.aclose()
            proc = await start_program(SFT_SCRIPT, program_env(api.base_url, key))
            try:
                run = await finish(proc)
            finally:
                await stop(proc)
            served = await admin.data_plane(f"accounts/{account_id}/rlorTrainerJobs/{job_id}")
            yield run, served
            await delete_all_jobs(client)
