"""Restart safety: stopping (or killing) localplane mid-training loses no job, checkpoint,
model or event; trainers never outlive it; running jobs come back FAILED with a message
saying the platform restarted, and resume to the exact same weights."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import PlatformClient
from shepherd.states import JobState
from tests.helpers import (
    Account,
    gateway_api,
    job_request,
    running_trainer,
    trainer_pids,
    wait_state,
    warm,
)

CONFIG = {"routeLagSeconds": {"min": 0.0, "max": 0.2}, "capacity": 2}


async def _wait_no_trainers(data_dir: Path, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while trainer_pids(data_dir):
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
async def test_restart_mid_training_loses_nothing(tmp_path: Path, kill: bool) -> None:
    plane = PlaneProcess(tmp_path / "plane", config=CONFIG).start()
    try:
        async with PlatformClient(plane.url, plane.api_key) as client:
            account = Account("dev", plane.api_key, client)
            # A reference run that is never interrupted.
            ref = await running_trainer(account, "reference")
            await ref.model.train(1, 8)
            expected = (await ref.info())["weights_digest"]
            await ref.api.aclose()
            await client.delete_job("reference")

            trainer = await running_trainer(account, "victim")
            await trainer.model.train(1, 4)
            await trainer.model.save("step-4")
            await trainer.model.save_for_sampler("step-4")  # promotable too
            await trainer.api.aclose()
            saved_name = "accounts/dev/rlorTrainerJobs/victim/checkpoints/step-4"
            await client.promote_checkpoint("step-4", job_id="victim", output_model_id="victim-4")
            # Capacity 2, one slot taken: this one runs, the next waits in the queue.
            await client.create_job("bystander", job_request())
            await wait_state(client, "bystander", JobState.RUNNING)
            await client.create_job("queued", job_request())
            assert (await client.get_job("queued")).state is JobState.PENDING
            events_before = [e async for e in _events(client)]

        plane.stop(kill=kill)
        # With the plane gone (even by SIGKILL) no trainer may be left burning "GPUs".
        await _wait_no_trainers(plane.data_dir)
        plane.start()

        async with PlatformClient(plane.url, plane.api_key) as client:
            for job_id in ("victim", "bystander"):
                job = await client.get_job(job_id)
                assert job.state is JobState.FAILED
                assert "platform restarted" in job.status.message
            # Waiting jobs keep their place in the queue.
            queued = await wait_state(client, "queued", JobState.RUNNING)
            assert queued.state is JobState.RUNNING

            assert [c.name for c in (await client.list_checkpoints("victim")).checkpoints] == [
                saved_name
            ]
            model = await client.get_model("victim-4")
            assert model.state == "READY" and model.checkpoint == saved_name
            # Events persist: a watcher resuming from an old id sees the restart transitions.
            after = [e async for e in _events(client, last=events_before[-1].id)]
            assert any(e.job_id == "victim" and e.state is JobState.FAILED for e in after)

            await client.resume_job("victim")
            await wait_state(client, "victim", JobState.RUNNING)
            async with gateway_api(Account("dev", plane.api_key, client), "victim") as api:
                await warm(api)
                resumed = await api.load_new_model(await api.session(), 0, "step-4")
                assert (await resumed.info())["optim_steps"] == 4
                await resumed.train(5, 8)
                assert (await resumed.info())["weights_digest"] == expected

            async with PlaneAdmin(plane.url, plane.admin_key) as admin:
                stats = await admin.stats()
                assert stats["jobs"]["accounts/dev/rlorTrainerJobs/victim"]["creates"] == 1
            for job_id in ("victim", "bystander", "queued"):
                await client.delete_job(job_id)
    finally:
        assert plane.stop() in (0, None)
        assert trainer_pids(plane.data_dir) == []
        plane.cleanup()


async def _events(client: PlatformClient, last: int = 0):  # type: ignore[no-untyped-def]
    """Every event stored so far (the stream is live; stop once it goes quiet)."""
    stream = client.watch_jobs(last_event_id=last).__aiter__()
    while True:
        try:
            yield await asyncio.wait_for(stream.__anext__(), timeout=0.5)
        except TimeoutError:
            await stream.aclose()
            return


def test_keys_stay_in_owner_only_files_across_restarts(tmp_path: Path) -> None:
    plane = PlaneProcess(tmp_path / "plane").start()
    try:
        keys = {plane.api_key, plane.admin_key}
        files = [plane.data_dir / "dev-api-key", plane.data_dir / "admin-api-key"]
        for path in files:
            path.chmod(0o644)  # as a copy or a hand-made file might be
        plane.restart()
        assert {plane.api_key, plane.admin_key} == keys  # the same keys, read back
        assert [stat.S_IMODE(path.stat().st_mode) for path in files] == [0o600, 0o600]
    finally:
        plane.stop()
    log = plane.log_path.read_text()
    assert "plane.ready" in log and not any(key in log for key in keys)
