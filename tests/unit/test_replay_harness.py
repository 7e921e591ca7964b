"""The teardown replay (tests/replay.py) skips workflow types it does not know, so every
workflow Shepherd defines must be registered with the workers: a forgotten one would go
unreplayed (and unrun)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import workflows
from workers.main import WORKFLOWS


def test_every_workflow_shepherd_defines_is_registered() -> None:
    defined = set()
    for module in pkgutil.iter_modules(workflows.__path__):
        loaded = importlib.import_module(f"workflows.{module.name}")
        for _, cls in inspect.getmembers(loaded, inspect.isclass):
            if hasattr(cls, "__temporal_workflow_definition") and cls.__module__ == loaded.__name__:
                defined.add(cls)
    assert defined and defined <= set(WORKFLOWS), defined - set(WORKFLOWS)
