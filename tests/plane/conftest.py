"""Fixtures of the tests that drive localplane with the real SDKs (blocking clients)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localplane.process import PlaneProcess
from tests.plane.sdk_support import PlaneHttp, plane_http


@pytest.fixture
def sdk_http(plane: PlaneProcess) -> Iterator[PlaneHttp]:
    """The plane's control and admin APIs, blocking (the SDKs are synchronous at their edges)."""
    with plane_http(plane) as client:
        yield client


@pytest.fixture
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """``get_tokenizer()`` must work from the trainer's local tokenizer directory, never the hub."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
