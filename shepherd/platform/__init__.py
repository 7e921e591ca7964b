"""The trainer platform: wire models, typed errors and the async client.

The names below load on first use (PEP 562): localplane's trainer processes import only
``shepherd.platform.rules``, and every trainer start pays for what it imports (httpx and the
client cost it ~0.1 s of CPU; bench/scale.py counts CPU per job).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shepherd.platform.client import PlatformClient, TrainerClient
    from shepherd.platform.errors import (
        RETRYABLE_ERRORS,
        AlreadyExists,
        FailedPrecondition,
        FutureExpired,
        FutureFailed,
        FutureServerError,
        InternalError,
        InvalidArgument,
        NotFound,
        PermissionDenied,
        PlatformError,
        RateLimited,
        RequestTimeout,
        RouteNotFound,
        Unauthenticated,
        Unavailable,
    )

__all__ = [
    "RETRYABLE_ERRORS",
    "AlreadyExists",
    "FailedPrecondition",
    "FutureExpired",
    "FutureFailed",
    "FutureServerError",
    "InternalError",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "PlatformClient",
    "PlatformError",
    "RateLimited",
    "RequestTimeout",
    "RouteNotFound",
    "TrainerClient",
    "Unauthenticated",
    "Unavailable",
]

_CLIENT_NAMES = frozenset({"PlatformClient", "TrainerClient"})


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = "client" if name in _CLIENT_NAMES else "errors"
    value = getattr(importlib.import_module(f"shepherd.platform.{module}"), name)
    globals()[name] = value
    return value
