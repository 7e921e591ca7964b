"""The trainer platform: wire models, typed errors and the async client."""

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
