"""Partitions (issue 32), with test hosts of our own (localplane/hosts.py: a cut drops packets,
refuses nothing): the trainer platform on one, cut from the worker while the Temporal server
sees both (loop jobs and a program job behind Shepherd's proxy); and the Temporal server on
one, cut from the worker (and the plane) while jobs train and one recovers. The jobs complete
with the weights of an uninterrupted run, one trainer each, and no recovery is started for a
trainer that never stopped: a data-plane request that went unanswered is sent again after
``DATA_PLANE_SILENCE_S`` (the trainer dedupes it), not left to TCP's backed-off
retransmissions. How long jobs stall after the heal is measured by ``bench/outage.py --fault
platform|server-link [--kind program]`` (never timed here)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.client import Client

from localplane import hosts
from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.platform import PlatformClient
from shepherd.states import JobState
from shepherd.temporal import SERVER_CALL_RETRY, TemporalSettings, connect
from tests.conftest import BASELINE
from tests.helpers import Account, optimizer_steps
from tests.replay import replay_since
from tests.workflows.conftest import Stack, make_registry, open_stack, stack_on, worker_for
from tests.workflows.test_programs import per_step, printed, program_starts, sft_spec, until_printed
from tests.workflows.test_recovery import model_digest
from tests.workflows.test_server_outage import SLOW, jobs_through
from workers.devstack import TemporalServer, free_port
from workers.main import WORKFLOWS

#: The suite's short cut (bench/outage.py --fault platform cuts for 30 s and 3 minutes).
CUT_S = 8.0
#: The program's steps (~0.1 s each): it is still training when the loops are past step 5
#: and the link is cut.
PROGRAM_STEPS = 80


@pytest.fixture
async def far_plane(
    client: Client, tmp_path: Path, programs_env: Path
) -> AsyncIterator[tuple[Stack, hosts.Host]]:
    """A stack whose plane (and its trainers) runs on a host of its own; its trainers speak
    JSON only (as ``programs_env`` makes the session's): loop and program jobs train on it."""
    if why := hosts.unavailable():
        pytest.skip(why)
    with hosts.host() as host:
        plane = PlaneProcess(
            tmp_path / "plane",
            config={**BASELINE, "trainerProtobuf": False},
            env={"SHEPHERD_PLANE_HOST": host.far_ip},
            prefix=host.prefix(),
        )
        async with stack_on(client, plane) as st:
            try:
                yield st, host
            finally:
                host.heal()  # (a failed test may leave it cut: the stack must stop cleanly)


@pytest.fixture
async def far_server(
    plane: PlaneProcess, admin: PlaneAdmin, account: Account, tmp_path: Path
) -> AsyncIterator[tuple[Stack, hosts.Host]]:
    """A stack whose Temporal server runs on a host of its own (the worker and the plane
    here), its worker's client retrying as production's does."""
    if why := hosts.unavailable():
        pytest.skip(why)
    with hosts.host() as host:
        server = TemporalServer.on_host(
            host, tmp_path / "temporal", port=free_port(), headless=True
        )
        await asyncio.to_thread(server.start)
        try:
            client = await connect(
                TemporalSettings(address=server.address), retry=SERVER_CALL_RETRY
            )
            async with open_stack(client, plane, admin, account) as st:
                yield st, host
        finally:
            host.heal()
            await asyncio.to_thread(server.stop)


def cut_for(host: hosts.Host) -> Callable[[], Awaitable[None]]:
    async def cut() -> None:
        host.cut()
        await asyncio.sleep(CUT_S)
        host.heal()

    return cut


@pytest.mark.slow
async def test_jobs_and_a_program_training_through_a_cut_from_the_platform_lose_nothing(
    far_plane: tuple[Stack, hosts.Host],
    stack: Stack,
    programs_env: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Three loop jobs and a program job (behind Shepherd's proxy, whose submissions and held
    polls are bounded by ``DATA_PLANE_SILENCE_S`` too) cut from their trainers mid-training.
    The program is never started again, and every step of it is applied once: its per-step
    losses and weight digests are an uninterrupted run's, on the session's plane."""
    near, host = far_plane
    clean = await stack.start(sft_spec(stack, "clean", steps=PROGRAM_STEPS))
    program = await near.start(sft_spec(near, "cut", steps=PROGRAM_STEPS))
    steps_at_cut: list[int] = []

    async def cut() -> None:
        await until_printed(programs_env, program, 5)
        steps_at_cut.append(len(per_step(printed(programs_env, program))))
        await cut_for(host)()

    # No preemption: a recovery here would be one for a trainer that never stopped.
    await jobs_through(cut, near, stack, request, recovering=False)
    async with asyncio.timeout(240):
        final: JobStatus = await program.result()
        await clean.result()

    assert steps_at_cut[0] < PROGRAM_STEPS  # the cut found the program training
    assert final.phase is Phase.COMPLETED and final.step == PROGRAM_STEPS, final.error
    assert not final.recoveries and final.failures == 0, final.recoveries
    assert await program_starts(program) == 1
    assert per_step(printed(programs_env, program)) == per_step(printed(programs_env, clean))
    trainer = (await near.admin.stats())["jobs"][near.job_name(final.trainer_job_id or "")]
    assert trainer["creates"] == 1 and trainer["trainersStarted"] == 1, trainer
    assert trainer["state"] == JobState.DELETED.value


@pytest.mark.slow
async def test_jobs_training_and_recovering_through_a_cut_from_the_server_lose_nothing(
    far_server: tuple[Stack, hosts.Host], stack: Stack, request: pytest.FixtureRequest
) -> None:
    """The worker cut from a server that stays up (a regression test: it costs little)."""
    near, host = far_server
    await jobs_through(cut_for(host), near, stack, request)


#: Long enough that the heal finds the job still training (the stale worker wakes up to a
#: live trainer): 100 steps of 150 ms.
LONG_STEPS = 100
#: How long the server keeps a worker's poll waiting for a task. A task it hands to a cut
#: worker's poll (the server cannot tell) is lost, the activity retried after its heartbeat
#: timeout, until those polls expire: production's 1 min, time-compressed here.
POLL_EXPIRY = ["--dynamic-config-value", 'matching.longPollExpirationInterval="5s"']
#: The second worker takes over within the train chunk's heartbeat timeout (4 s) plus the cut
#: worker's polls' expiry (above) and the retries' backoff; a busy machine's margin.
TAKEOVER_WITHIN_S = 60.0


@pytest.mark.slow
async def test_a_worker_cut_from_both_is_replaced_and_its_stale_calls_change_nothing(
    client: Client, stack: Stack, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The server and the plane on a host of their own, seen by two workers over two links:
    the first worker's link is cut while its jobs train (it sees neither), the second one
    (over the link never cut) takes them over during the cut; after the heal the first one's
    stale calls change nothing. The jobs complete with a clean run's weights on the trainer
    they started on (the second worker adopts it: no recovery, no second trainer)."""
    if why := hosts.unavailable():
        pytest.skip(why)
    long = {"trainer": SLOW, "training": {"total_steps": LONG_STEPS}}
    reference = await stack.start(stack.spec("ref", **long))
    with hosts.host(watch=True) as host:
        assert host.watch_ip is not None
        server = TemporalServer.on_host(
            host, tmp_path / "temporal", port=free_port(), headless=True, flags=POLL_EXPIRY
        )
        plane = PlaneProcess(
            tmp_path / "plane",
            config=BASELINE,
            env={"SHEPHERD_PLANE_HOST": "0.0.0.0"},  # noqa: S104 - reached over two links
            prefix=host.prefix(),
        )
        await asyncio.to_thread(server.start)
        try:
            await asyncio.to_thread(plane.start)
            first, second = [
                await connect(
                    TemporalSettings(address=f"{ip}:{server.port}"), retry=SERVER_CALL_RETRY
                )
                for ip in (host.far_ip, host.watch_ip)
            ]
            at = {ip: f"http://{ip}:{plane.port}" for ip in (host.far_ip, host.watch_ip)}
            async with (
                PlaneAdmin(at[host.watch_ip], plane.admin_key) as admin,
                PlatformClient(at[host.watch_ip], plane.api_key) as platform,
                open_stack(
                    first,
                    plane,
                    admin,
                    Account("dev", plane.api_key, platform),
                    registry=make_registry(plane, plane.api_key, at[host.far_ip]),
                ) as near,
            ):
                since = datetime.now(UTC)
                jobs = [await near.start(near.spec(f"cut-{i}", **long)) for i in range(2)]
                for handle in jobs:
                    await near.until(handle, lambda s: s.step >= 5 and s.phase is Phase.TRAINING)
                takeover = make_registry(plane, plane.api_key, at[host.watch_ip])
                async with worker_for(second, near.task_queue, takeover):
                    host.cut()
                    try:
                        before = await optimizer_steps(admin)
                        # The second worker takes the jobs over while the first sees
                        # nothing: each trains again during the cut.
                        async with asyncio.timeout(TAKEOVER_WITHIN_S):
                            while True:
                                now = await optimizer_steps(admin)
                                if all(now.get(n, 0) > c for n, c in before.items()):
                                    break
                                await asyncio.sleep(0.2)
                    finally:
                        host.heal()  # (never leave the stack while cut: its worker's calls hang)
                    async with asyncio.timeout(240):
                        finals: list[JobStatus] = [await h.result() for h in jobs]
                        await reference.result()
                    await takeover.aclose()
                expected = await model_digest(stack, "ref-model")
                stats = (await admin.stats())["jobs"]
                for i, final in enumerate(finals):
                    assert final.phase is Phase.COMPLETED and final.step == LONG_STEPS, final.error
                    assert not final.recoveries and final.failures == 0, final.recoveries
                    assert await model_digest(near, f"cut-{i}-model") == expected
                    trainer = stats[near.job_name(final.trainer_job_id or "")]
                    assert trainer["creates"] == 1 and trainer["trainersStarted"] == 1, trainer
                    assert trainer["state"] == JobState.DELETED.value
                await replay_since(second, since, request.node.nodeid, list(WORKFLOWS))
        finally:
            host.heal()  # (a failed test may leave it cut: both must stop cleanly)
            await asyncio.to_thread(plane.stop)
            await asyncio.to_thread(server.stop)
