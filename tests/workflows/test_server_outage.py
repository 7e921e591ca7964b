"""The Temporal server SIGKILLed under training jobs and started again on its database
(issue 32): the workers are left alone (they reconnect by themselves), and the outage costs
time, never a job. Jobs training through it and one RECOVERING from a preemption when the
server goes: each COMPLETES with the weights of an uninterrupted run, one trainer each (no
second one created, none left), and every history replays.

The worker's client retries its calls as production's does (``SERVER_CALL_RETRY``): a
completion or a heartbeat sent while the server is down lands when it is back. How long the
jobs stall is measured by ``bench/outage.py`` (never timed here)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.states import JobState
from shepherd.temporal import SERVER_CALL_RETRY, TemporalSettings, connect
from tests.helpers import Account
from tests.replay import replay_since
from tests.workflows.conftest import Stack, open_stack
from tests.workflows.test_recovery import model_digest
from workers.devstack import TemporalServer, free_port, tcp_open
from workers.main import WORKFLOWS

#: Emulated GPU time per step: the jobs are mid-training when the server goes.
SLOW = {"extra_args": ["--compute-delay-ms=150"]}
STEPS = 40
#: How long the server is down: past the 10 s after which the SDK's default retries gave up.
DOWN_S = 12.0


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[TemporalServer]:
    """A dev server of this test's own, on its SQLite file (the session's is never killed)."""
    server = TemporalServer(tmp_path / "temporal", port=free_port(), headless=True)
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


@pytest.fixture
async def outage_stack(
    server: TemporalServer, plane: PlaneProcess, admin: PlaneAdmin, account: Account
) -> AsyncIterator[Stack]:
    client = await connect(TemporalSettings(address=server.address), retry=SERVER_CALL_RETRY)
    async with open_stack(client, plane, admin, account) as st:
        yield st


async def kill_and_restart(server: TemporalServer) -> None:
    """SIGKILL, ``DOWN_S`` down, started again on the same port and database."""
    assert server.proc is not None
    server.proc.kill()
    await asyncio.to_thread(server.proc.wait)
    await asyncio.sleep(DOWN_S)
    await asyncio.to_thread(server.start)
    assert tcp_open(server.ip, server.port)


def spec(stack: Stack, name: str) -> Any:
    return stack.spec(
        name,
        trainer=SLOW,
        training={"total_steps": STEPS},
        checkpoint={"every_steps": 10, "keep_last": 2},
    )


async def jobs_through(
    fault: Callable[[], Awaitable[None]],
    stack: Stack,
    reference_stack: Stack,
    request: pytest.FixtureRequest,
    *,
    recovering: bool = True,
) -> None:
    """Three jobs mid-training when ``fault`` strikes (and with ``recovering`` the last one's
    trainer preempted just before, so it recovers through the fault): each COMPLETES with the
    weights of an uninterrupted run (on ``reference_stack``, never faulted), one trainer each,
    created once, none left, no recovery but the preemption's; every history replays."""
    reference = await reference_stack.start(spec(reference_stack, "ref"))
    since = datetime.now(UTC)
    names = ["through-0", "through-1", "recovering" if recovering else "through-2"]
    jobs = [await stack.start(spec(stack, name)) for name in names]
    for handle in jobs:
        await stack.until(handle, lambda s: s.step >= 5 and s.phase is Phase.TRAINING)
    if recovering:
        victim = (await stack.status(jobs[-1])).trainer_job_id or ""
        await stack.admin.preempt(victim, account=stack.account.id)
    await fault()

    async with asyncio.timeout(240):
        finals: list[JobStatus] = [await h.result() for h in jobs]
        await reference.result()
    expected = await model_digest(reference_stack, "ref-model")
    stats = (await stack.admin.stats())["jobs"]
    for handle, final, name in zip(jobs, finals, names, strict=True):
        assert final.phase is Phase.COMPLETED and final.step == STEPS, (handle.id, final.error)
        assert final.failures == 0, (handle.id, final.recoveries)
        assert await model_digest(stack, f"{name}-model") == expected, handle.id
        trainer = stats[stack.job_name(final.trainer_job_id or "")]
        # One trainer job per workflow, created once, started once; none left running.
        assert trainer["creates"] == 1 and trainer["liveTrainer"] is False, trainer
        assert trainer["trainersStarted"] == 1 + (name == "recovering"), trainer
        assert trainer["state"] == JobState.DELETED.value
        # A trainer that never stopped is never recovered.
        expected_recoveries = ["preemption"] if name == "recovering" else []
        assert [r.reason for r in final.recoveries] == expected_recoveries, handle.id
    await replay_since(stack.client, since, request.node.nodeid, list(WORKFLOWS))


@pytest.mark.slow
async def test_a_server_outage_mid_training_and_mid_recovery_costs_no_job(
    outage_stack: Stack, stack: Stack, server: TemporalServer, request: pytest.FixtureRequest
) -> None:
    async def outage() -> None:
        started = time.monotonic()
        await kill_and_restart(server)
        assert time.monotonic() - started >= DOWN_S

    await jobs_through(outage, outage_stack, stack, request)
