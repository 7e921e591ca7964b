"""The platform's disk fills under a running trainer (issue 32): a plane whose data directory
is a small tmpfs, filled to the last byte while a model trains.

Training goes on (a data-plane request the trainer served is answered even when the plane
cannot count it), a checkpoint save fails with an error naming the directory and the cause
(no space left) instead of a bare 500, the trainer's output is still read (unread, its pipe
would fill and stall the trainer), and once space is freed a save succeeds and the job
deletes cleanly."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import PlatformClient
from shepherd.states import JobState
from tests.conftest import BASELINE
from tests.helpers import Account, running_trainer, trainer_pids, wait_state
from tests.tinker_http import FutureFailed, batch

#: Room for the plane's database, its tokenizers and a few checkpoints of the tiny model.
DISK = "64m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


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


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last byte; the filler file."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        block = b"\0" * (1 << 20)
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass
    # The last partial block, byte pages at a time, until nothing at all fits.
    with open(filler, "ab", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                continue
    return filler


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
    # A save says why it failed, and where.
    with pytest.raises(FutureFailed) as failed:
        await model.save("while-full")
    assert "no space left" in failed.value.error.lower(), failed.value.error
    assert str(data_dir) in failed.value.error, failed.value.error
    # The trainer still talks (its output is read although the plane cannot log it).
    for step in range(5, 25):
        await model.run("forward_backward", model.fwdbwd_body(batch(step)))

    filler.unlink()
    assert (await model.save("after")).endswith("after")
    info = await model.info()
    assert info["optim_steps"] == 4
    await trainer.api.aclose()
    await account.client.delete_job("full-disk")
    await wait_state(account.client, "full-disk", JobState.DELETED)
