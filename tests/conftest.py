"""Fixtures: one real localplane subprocess per session (fresh account per test, so tests
never see each other's jobs), and a way to restore its faults after a test changes them."""

from __future__ import annotations

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
