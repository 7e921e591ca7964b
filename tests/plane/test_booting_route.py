"""A trainer's work is made ready while it boots (``RouteWait(booting=True)``, which the
open_model and warm_up activities get when the workflow starts them at the placement,
workflows/trainer.py ``come_up``): against a real localplane, the boot's 404s are waited out
and are not route races; without the flag the same 404 is a loss; a trainer that fails or is
deleted while it boots is a loss, noticed within the boot's probe spacing."""

from __future__ import annotations

import asyncio
import time

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.base import RouteWait, warm_route
from localplane.admin import PlaneAdmin
from shepherd.states import JobState
from tests.helpers import Account, job_request, wait_state
from workflows import policies

BOOT_S = 1.5
PROBES = 3


async def _ready(account: Account, job: str, *, booting: bool) -> RouteWait:
    """The warm-up as the activity runs it (inside an activity's context: it heartbeats)."""
    trainer = await account.client.trainer(job)
    route = RouteWait(account.client, job, booting=booting)

    async def probe() -> None:
        await warm_route(trainer, route, PROBES)

    await ActivityEnvironment().run(probe)
    return route


def _job_name(account: Account, job: str) -> str:
    return f"accounts/{account.id}/rlorTrainerJobs/{job}"


async def test_a_booting_trainers_404s_are_waited_out_and_are_no_route_race(
    account: Account, faults: PlaneAdmin
) -> None:
    await faults.set_faults(bootDelaySeconds=BOOT_S, routeLagSeconds={"min": 0.0, "max": 0.0})
    job = "boots-slowly"
    began = time.monotonic()
    await account.client.create_job(job, job_request())
    route = await _ready(account, job, booting=True)
    waited = time.monotonic() - began
    assert (await account.client.get_job(job)).state is JobState.RUNNING
    assert waited >= BOOT_S * 0.9, waited  # it did wait for the boot
    # Seen within the spacing for a boot this long (a quarter of it), not a doubling's.
    assert waited <= BOOT_S + policies.boot_probe_spacing(BOOT_S) + 1.0, waited
    assert route.races == 0  # the boot's 404s are not the route race
    stats = await faults.job_stats(_job_name(account, job))
    assert stats.get("route404s", 0) >= 2  # they did happen: the probes met the boot


async def test_without_the_flag_a_booting_trainers_404_is_a_loss(
    account: Account, faults: PlaneAdmin
) -> None:
    await faults.set_faults(bootDelaySeconds=30.0)
    job = "not-up-yet"
    await account.client.create_job(job, job_request())
    with pytest.raises(ApplicationError) as caught:
        await _ready(account, job, booting=False)
    assert caught.value.type == policies.TRAINER_LOST
    assert "JOB_STATE_CREATING" in caught.value.message


@pytest.mark.parametrize("ending", ["failed", "deleted"])
async def test_a_trainer_that_ends_while_it_boots_is_a_loss(
    account: Account, faults: PlaneAdmin, ending: str
) -> None:
    await faults.set_faults(bootDelaySeconds=30.0)
    job = f"ends-booting-{ending}"
    await account.client.create_job(job, job_request())
    await wait_state(account.client, job, JobState.CREATING)
    ready = asyncio.create_task(_ready(account, job, booting=True))
    await asyncio.sleep(1.0)
    assert not ready.done()  # still waiting for the boot
    if ending == "failed":
        await faults.stop(job, JobState.FAILED.value, "node lost while booting", account=account.id)
        expected = policies.TRAINER_LOST
    else:
        await account.client.delete_job(job)
        expected = policies.TRAINER_GONE
    ended = time.monotonic()
    with pytest.raises(ApplicationError) as caught:
        await asyncio.wait_for(ready, timeout=10)
    assert caught.value.type == expected
    # Noticed at the next look: the spacing after a second or two of boot, plus slack.
    assert time.monotonic() - ended <= policies.BOOT_PROBE_CAP.total_seconds() + 2.0


@pytest.mark.parametrize(
    ("booted_s", "spacing_s"), [(0.0, 0.02), (0.05, 0.02), (0.4, 0.1), (2.0, 0.5), (600.0, 1.0)]
)
def test_the_boot_probe_spacing_is_a_quarter_of_the_boot_so_far_within_bounds(
    booted_s: float, spacing_s: float
) -> None:
    assert policies.boot_probe_spacing(booted_s) == pytest.approx(spacing_s)
