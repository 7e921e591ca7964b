"""localplane forks its trainers from a process that has already imported what a trainer needs
(localplane/forks.py, localplane/trainer/zygote.py): a forked trainer carries its job's tag
(how a restarted plane reaps orphans), has its own session, serves like one started from
scratch, is reaped when it exits, and dies with the fork server, which the plane replaces."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from localplane.process import PlaneProcess
from shepherd.platform import PlatformClient
from shepherd.states import JobState
from tests.helpers import Account, running_trainer, trainer_pids, wait_state


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _parent(pid: int) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces, so after the ")".
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _zygotes(plane: PlaneProcess) -> list[int]:
    return [p for p in trainer_pids(plane.data_dir) if "--zygote=" in _cmdline(p)]


def _trainer_of(plane: PlaneProcess, job_id: str) -> int:
    (pid,) = [p for p in trainer_pids(plane.data_dir) if f"--tag=dev-{job_id}-" in _cmdline(p)]
    return pid


async def _until(check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)


async def test_trainers_are_forked_reaped_and_die_with_their_fork_server(tmp_path: Path) -> None:
    plane = PlaneProcess(tmp_path / "plane", config={"capacity": 2}).start()
    try:
        async with PlatformClient(plane.url, plane.api_key) as client:
            account = Account("dev", plane.api_key, client)
            first = await running_trainer(account, "first")
            second = await running_trainer(account, "second")
            await first.model.train(1, 2)
            await second.model.train(1, 2)  # each serves like any trainer
            (zygote,) = _zygotes(plane)
            pids = {job: _trainer_of(plane, job) for job in ("first", "second")}
            assert len(set(pids.values())) == 2
            for pid in pids.values():
                assert _parent(pid) == zygote
                assert os.getsid(pid) == pid  # its own session, as a started trainer's
                assert "--config" in _cmdline(pid) and "--zygote" not in _cmdline(pid)

            # Deleted: the fork server reaps it (no zombie), the plane hears of its exit.
            await first.api.aclose()
            await client.delete_job("first")
            await wait_state(client, "first", JobState.DELETED)
            await _until(lambda: not _alive(pids["first"]))

            # The fork server killed: its trainer dies with it, the job says its trainer is
            # gone, and the next job's trainer is forked by a new one.
            os.kill(zygote, signal.SIGKILL)
            await _until(lambda: not _alive(pids["second"]))
            lost = await wait_state(client, "second", JobState.FAILED)
            assert "exit code -9" in (lost.status.message if lost.status else ""), lost
            await second.api.aclose()
            third = await running_trainer(account, "third")
            await third.model.train(1, 2)
            (new_zygote,) = _zygotes(plane)
            assert new_zygote != zygote and _parent(_trainer_of(plane, "third")) == new_zygote
            await third.api.aclose()
            await client.delete_job("third")
            await wait_state(client, "third", JobState.DELETED)
    finally:
        assert plane.stop() == 0
        assert trainer_pids(plane.data_dir) == []  # the fork server included
        plane.cleanup()


async def test_without_forking_trainers_are_started_from_scratch(tmp_path: Path) -> None:
    plane = PlaneProcess(tmp_path / "plane", config={"capacity": 1, "forkTrainers": False})
    plane.start()
    try:
        async with PlatformClient(plane.url, plane.api_key) as client:
            account = Account("dev", plane.api_key, client)
            trainer = await running_trainer(account, "solo")
            await trainer.model.train(1, 2)
            assert _zygotes(plane) == []
            assert plane.proc is not None and _parent(_trainer_of(plane, "solo")) == plane.proc.pid
            await trainer.api.aclose()
            await client.delete_job("solo")
            await wait_state(client, "solo", JobState.DELETED)
    finally:
        assert plane.stop() == 0
        assert trainer_pids(plane.data_dir) == []
        plane.cleanup()
