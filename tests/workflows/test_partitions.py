"""Partitions (issue 32): the trainer platform on a test host of its own (localplane/hosts.py), cut
from the worker — packets dropped, nothing refused — while the Temporal server sees both, then
healed. The jobs training through it complete with the weights of an uninterrupted run, one
trainer each, and no recovery is started for a trainer that never stopped: a data-plane
request that went unanswered is sent again after ``DATA_PLANE_SILENCE_S`` (the trainer dedupes
it), not left to TCP's backed-off retransmissions. How long jobs stall after the heal is
measured by ``bench/outage.py --fault platform`` (never timed here)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client

from localplane import hosts
from localplane.process import PlaneProcess
from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.states import JobState
from tests.conftest import BASELINE
from tests.workflows.conftest import Stack, stack_on
from tests.workflows.test_recovery import model_digest
from tests.workflows.test_server_outage import STEPS, spec

#: The suite's short cut (bench/outage.py --fault platform cuts for 30 s and 3 minutes).
CUT_S = 8.0


@pytest.fixture
async def far_plane(client: Client, tmp_path: Path) -> AsyncIterator[tuple[Stack, hosts.Host]]:
    """A stack whose plane (and its trainers) runs on a host of its own."""
    if why := hosts.unavailable():
        pytest.skip(why)
    with hosts.host() as host:
        plane = PlaneProcess(
            tmp_path / "plane",
            config=BASELINE,
            env={"SHEPHERD_PLANE_HOST": host.far_ip},
            prefix=host.prefix(),
        )
        await asyncio.to_thread(plane.start)
        try:
            async with stack_on(client, plane) as st:
                yield st, host
        finally:
            host.heal()  # (a failed test may leave it cut: the plane must stop cleanly)
            await asyncio.to_thread(plane.stop)


@pytest.mark.slow
async def test_jobs_training_through_a_cut_from_the_platform_lose_nothing(
    far_plane: tuple[Stack, hosts.Host], stack: Stack
) -> None:
    near, host = far_plane
    # The uninterrupted run: the session's plane, never cut.
    reference = await stack.start(spec(stack, "ref"))
    jobs = [await near.start(spec(near, f"cut-{i}")) for i in range(3)]
    for handle in jobs:
        await near.until(handle, lambda s: s.step >= 5 and s.phase is Phase.TRAINING)
    host.cut()
    await asyncio.sleep(CUT_S)
    host.heal()
    async with asyncio.timeout(240):
        finals: list[JobStatus] = [await h.result() for h in jobs]
        await reference.result()
    expected = await model_digest(stack, "ref-model")
    stats = (await near.admin.stats())["jobs"]
    for i, final in enumerate(finals):
        assert final.phase is Phase.COMPLETED and final.step == STEPS, final.error
        # The trainer never stopped: no recovery, no second trainer.
        assert not final.recoveries, final.recoveries
        assert await model_digest(near, f"cut-{i}-model") == expected
        trainer = stats[near.job_name(final.trainer_job_id or "")]
        assert trainer["creates"] == 1 and trainer["trainersStarted"] == 1, trainer
        assert trainer["liveTrainer"] is False and trainer["state"] == JobState.DELETED.value
