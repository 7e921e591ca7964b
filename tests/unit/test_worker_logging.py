"""A worker's log starts with what the worker says, not with a page of a library's noise."""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys

import pytest
from temporalio.worker import _worker

from workers.main import quiet_library_noise


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_log() -> _Records:
    importlib.import_module("transformers")
    records = _Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(records)
    try:
        yield records
    finally:
        logger.removeHandler(records)


def test_the_build_id_of_a_worker_logs_no_alias_warnings(transformers_log: _Records) -> None:
    """temporalio's Worker hashes every loaded module's ``__cached__`` for its default build
    id, and each read of a transformers ``*_fast`` alias module logged "Accessing
    `__cached__` ..." (about 190 lines at every worker start)."""
    quiet_library_noise()
    _worker.load_default_build_id(memoize=False)  # as a worker's start computes it
    assert not [m for m in transformers_log.messages if "Accessing" in m]


def test_a_real_use_of_a_deprecated_alias_still_warns(transformers_log: _Records) -> None:
    quiet_library_noise()
    alias = next(
        name
        for name in sys.modules
        if name.startswith("transformers.models.") and name.endswith("_fast")
    )
    # The alias imports its target, which may fail (no torchvision here): the warning is
    # logged before that.
    with contextlib.suppress(Exception):
        sys.modules[alias].__cached__  # noqa: B018
    assert not transformers_log.messages
    with contextlib.suppress(Exception):
        sys.modules[alias].NoSuchProcessorFast  # noqa: B018 - the lookup is the test
    assert any("Accessing `NoSuchProcessorFast`" in m for m in transformers_log.messages)
