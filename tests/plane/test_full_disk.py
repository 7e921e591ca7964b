"""The platform's disk fills under a running trainer (issue 32): a plane whose data directory
is a small tmpfs, filled to the last byte while a model trains.

Training goes on (a data-plane request the trainer served is answered even when the plane
cannot count it), a checkpoint save fails with an error naming the directory and the cause
(no space left) instead of a bare 500, the trainer's output is still read (unread, its pipe
would fill and stall the trainer). Once space is freed the failed save, sent again with its
seq_id as a retry does, is done again — at the weights it failed to save; refused if the model
trained since — and the job deletes cleanly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import PlatformClient
from shepherd.states import JobState
from tests.conftest import BASELINE
from tests.helpers import Account, fill, running_trainer, trainer_pids, wait_state
from tests.tinker_http import FutureFailed, batch


@pytest.fixture
async def small_plane(small_disk: Path) -> AsyncIterator[tuple[Account, Path]]:
    plane = PlaneProcess(small_disk / "plane", config=BASELINE)
    await asyncio.to_thread(plane.start)
    try:
        async with PlaneAdmin(plane.url, plane.admin_key) as admin:
            account_id, key = await admin.create_account()
            async with PlatformClient(plane.url, key) as client:
                yield Account(account_id, key, client), plane.data_dir
    finally:
        await asyncio.to_thread(plane.stop)
    assert trainer_pids(plane.data_dir) == []


async def test_a_full_disk_stops_saves_with_its_cause_not_training_and_passes(
    small_plane: tuple[Account, Path], small_disk: Path
) -> None:
    account, data_dir = small_plane
    trainer = await running_trainer(account, "full-disk")
    model = trainer.model
    await model.train(1, 2)
    await model.save("before")
    filler = fill(small_disk)

    # Training goes on: the data plane needs no disk.
    losses = await model.train(3, 4)
    assert len(losses) == 2
    probe = batch(99)
    at_4 = await model.forward_loss(probe)
    # A save says why it failed, and where.
    with pytest.raises(FutureFailed) as failed:
        await model.save("while-full")
    failed_at = model.seq_id
    assert "no space left" in failed.value.error.lower(), failed.value.error
    assert str(data_dir) in failed.value.error, failed.value.error
    # The trainer still talks (its output is read although the plane cannot log it).
    for step in range(5, 25):
        await model.run("forward_backward", model.fwdbwd_body(batch(step)))
    # Another save fails; it is sent again only after the model trained: too late.
    with pytest.raises(FutureFailed):
        await model.save("stale")
    stale_at = model.seq_id

    filler.unlink()
    # The failed save sent again — the same seq_id, as a retry does — is done again (its
    # first failure wrote nothing), at the weights it failed to save.
    redone = await model.submit("save_weights", {"path": "while-full"}, seq_id=failed_at)
    assert (await trainer.api.result(redone))["path"].endswith("while-full")
    await model.train(5, 5)
    with pytest.raises(FutureFailed) as refused:
        stale = await model.submit("save_weights", {"path": "stale"}, seq_id=stale_at)
        await trainer.api.result(stale)
    assert "trained since" in refused.value.error, refused.value.error
    assert (await model.save("after")).endswith("after")
    info = await model.info()
    assert info["optim_steps"] == 5
    # What was redone holds the weights of step 4 (not 5): loaded, it scores as they did.
    redone_path = (await trainer.api.result(redone))["path"]
    await model.load(redone_path)
    assert await model.forward_loss(probe) == at_4
    await trainer.api.aclose()
    await account.client.delete_job("full-disk")
    await wait_state(account.client, "full-disk", JobState.DELETED)
