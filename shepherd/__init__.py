"""Shepherd: each GPU training job's whole life is one durable Temporal workflow.

``from shepherd import Shepherd`` gives the Python API (see :mod:`shepherd.client`).
"""

from typing import Any

__version__ = "0.1.0"

_API = {
    "Shepherd",
    "JobHandle",
    "JobEnded",
    "JobFailed",
    "JobNotFound",
    "JobSummary",
    "SpecError",
    "SubmissionRefused",
    "SweepHandle",
    "TemporalUnreachable",
}


def __getattr__(name: str) -> Any:
    # Lazy: localplane's trainer processes import shepherd.* and must not pay for Temporal.
    if name in _API:
        from shepherd import client

        return getattr(client, name)
    raise AttributeError(name)
