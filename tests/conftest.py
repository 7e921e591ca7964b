"""Fixtures: one real localplane subprocess per session (fresh account per test, so tests
never see each other's jobs), and a way to restore its faults after a test changes them."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import PlatformClient
from tests.helpers import Account, delete_all_jobs, trainer_pids

#: The session plane's operating config: a real route race, but short enough for tests.
BASELINE = {
    "capacity": 16,
    "bootDelaySeconds": 0.0,
    "routeLagSeconds": {"min": 0.0, "max": 0.3},
    "gateway404Rate": 0.0,
    "controlPlane5xxRate": 0.0,
    "promotionSeconds": 0.2,
}


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlaneProcess]:
    data_dir = tmp_path_factory.mktemp("plane")
    proc = PlaneProcess(data_dir, config=BASELINE).start()
    try:
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"localplane exited with {code}; see {proc.log_path}"
        assert trainer_pids(data_dir) == [], "trainer processes outlived the plane"


@pytest.fixture
async def admin(plane: PlaneProcess) -> AsyncIterator[PlaneAdmin]:
    async with PlaneAdmin(plane.url, plane.admin_key) as client:
        yield client


@pytest.fixture
async def faults(admin: PlaneAdmin) -> AsyncIterator[PlaneAdmin]:
    """The admin client, with the plane's faults restored to the baseline afterwards."""
    try:
        yield admin
    finally:
        await admin.reset_faults()
        await admin.set_faults(BASELINE)


@pytest.fixture
async def account(plane: PlaneProcess, admin: PlaneAdmin) -> AsyncIterator[Account]:
    """A fresh account; whatever jobs a test leaves in it are deleted afterwards."""
    account_id, key = await admin.create_account()
    async with PlatformClient(plane.url, key) as client:
        yield Account(account_id, key, client)
        await delete_all_jobs(client)


@pytest.fixture
async def http(plane: PlaneProcess) -> AsyncIterator[httpx.AsyncClient]:
    """Raw HTTP to the plane, for requests the typed client cannot express."""
    async with httpx.AsyncClient(base_url=plane.url, timeout=30.0) as client:
        yield client


@pytest.fixture
def data_dir(plane: PlaneProcess) -> Path:
    return plane.data_dir


#: The longest modules, longest first (minutes on this 2-core machine, 2026-11-28). ``make
#: test`` hands whole modules to its pytest processes in collection order, so a long module
#: collected last keeps one process busy alone at the end: these go first, the short rest
#: fills in behind them (longest-first keeps the tail short).
LONGEST_FIRST = (
    # By their total time in a full run (2026-11-28, `--durations=0`), longest first.
    "tests/workflows/test_programs.py",
    "tests/workflows/test_await_points.py",
    "tests/workflows/test_cookbook_recipes.py",
    "tests/workflows/test_scheduling.py",
    "tests/workflows/test_long_runs.py",
    "tests/workflows/test_worker_crash.py",
    "tests/test_dev_stack.py",
    "tests/workflows/test_examples_run.py",
    "tests/workflows/test_determinism.py",
    "tests/workflows/test_cli.py",
    "tests/workflows/test_recovery.py",
    "tests/workflows/test_admission_ops.py",
    "tests/workflows/test_submission_guards.py",
    "tests/workflows/test_controls.py",
    "tests/workflows/test_platform_restart.py",
    "tests/workflows/test_long_timers.py",
    "tests/workflows/test_server_outage.py",
    "tests/workflows/test_program_pipelines.py",
    "tests/workflows/test_partitions.py",
    "tests/workflows/test_full_disk.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    if missing := [p for p in LONGEST_FIRST if not (root / p).is_file()]:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names no such module: {missing}")
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        path = Path(str(item.path)).relative_to(root).as_posix()
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: each module's own order is kept


#: Room for a dev stack (a plane's database, its tokenizers, a few checkpoints of the tiny
#: model, the Temporal database) with more than diskroom.LOW_BYTES to spare.
SMALL_DISK = "160m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of ``SMALL_DISK`` for the test (unmounted after): a disk to fill."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
