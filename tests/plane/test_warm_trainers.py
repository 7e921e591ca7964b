"""localplane keeps trainer processes started ahead of need: a granted slot is handed to a
process that has already paid Python's start-up, which then carries its job's tag (how a
restarted plane reaps orphans) and serves like a freshly started one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from localplane.jobs import warm_pool_size
from localplane.process import PlaneProcess
from shepherd.platform import PlatformClient
from shepherd.states import JobState
from tests.helpers import Account, running_trainer, trainer_pids, wait_state


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


async def _until(check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)


async def test_a_granted_slot_gets_a_warm_trainer(tmp_path: Path) -> None:
    plane = PlaneProcess(tmp_path / "plane", config={"capacity": 2}).start()
    pool = warm_pool_size(2)  # one per slot
    try:
        async with PlatformClient(plane.url, plane.api_key) as client:
            account = Account("dev", plane.api_key, client)
            first = await running_trainer(account, "first")  # cold start; warming begins
            await first.model.train(1, 2)

            def warm() -> list[int]:
                return [p for p in trainer_pids(plane.data_dir) if "--warm=" in _cmdline(p)]

            await _until(lambda: len(warm()) == pool)
            idle = set(warm())

            second = await running_trainer(account, "second")
            await second.model.train(1, 2)  # it serves like any trainer
            mine = [p for p in trainer_pids(plane.data_dir) if "--tag=dev-second-" in _cmdline(p)]
            assert len(mine) == 1 and mine[0] in idle  # one of the warm ones, now tagged
            assert "--config" in _cmdline(mine[0]) and "--warm=" not in _cmdline(mine[0])
            await _until(lambda: len(warm()) == pool)  # and the pool is refilled

            await first.api.aclose()
            await second.api.aclose()
            for job_id in ("first", "second"):
                await client.delete_job(job_id)
                await wait_state(client, job_id, JobState.DELETED)
    finally:
        plane.stop()
        assert trainer_pids(plane.data_dir) == []  # warm ones included
        plane.cleanup()
