"""Trainer job ids, and finding a trainer's workflow from its id alone.

The event bridge turns the platform's state changes into signals; it must find the
workflow that owns a trainer quickly, without a visibility query (visibility lags the
workflow by up to a second or so, and one query per event does not scale). Shepherd
chooses its trainers' ids, so where the workflow id fits the platform's id rule the id
carries it: ``<workflow id>--<4 hex>-g<generation>`` (the hex, from the workflow run, keeps
two runs under one workflow id apart). Other workflow ids (schedule runs, long or
upper-case ids) keep ``<name[:40]>-<6 hex>-g<generation>`` and are found through visibility.

Deterministic: imported by the workflow.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from shepherd.platform import rules

#: Separates the owner from the run digest; never produced by the older scheme.
OWNER_SEPARATOR: Final = "--"
_OWNED = re.compile(r"\A(?P<owner>[a-z0-9-]+)--(?P<run>[0-9a-f]{4})-g[0-9]+\Z")
#: Any trainer id Shepherd makes ends in its generation.
_GENERATION = re.compile(r"-g[0-9]+\Z")


def trainer_prefix(name: str, workflow_id: str, run_id: str, *, owner_in_id: bool = True) -> str:
    """The part of every trainer id of one workflow run before ``-g<generation>``."""
    digest = hashlib.sha256(f"{workflow_id}/{run_id}".encode()).hexdigest()
    if owner_in_id:
        prefix = f"{workflow_id}{OWNER_SEPARATOR}{digest[:4]}"
        if rules.check_resource_id(prefix + "-g9999") is None:  # also bounds the length
            return prefix
    return f"{name[:40]}-{digest[:6]}"


def owner_of(trainer_job_id: str) -> str | None:
    """The workflow id a trainer id carries, or None (then ask visibility)."""
    m = _OWNED.match(trainer_job_id)
    return m["owner"] if m else None


def made_by_run(trainer_job_id: str, workflow_id: str, run_id: str) -> bool:
    """Whether the trainer id is one that run ``run_id`` of ``workflow_id`` makes."""
    m = _OWNED.match(trainer_job_id)
    digest = hashlib.sha256(f"{workflow_id}/{run_id}".encode()).hexdigest()
    return bool(m and m["owner"] == workflow_id and m["run"] == digest[:4])


def prefix_of(trainer_job_id: str) -> str | None:
    """What every generation of the trainer's job shares (its id without ``-g<n>``)."""
    m = _GENERATION.search(trainer_job_id)
    return trainer_job_id[: m.start()] if m else None
