"""Typed errors of the trainer platform client.

One exception class per kind of answer, chosen in one place (:func:`error_from_response`)
from the platform's error body and HTTP status. Every error carries the platform's own
message and says whether a client may retry it (trainer-api.md §1). The client itself
never retries: retrying is the caller's declared policy (a Temporal ``RetryPolicy``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import httpx


class PlatformError(Exception):
    """Base of every error raised by :class:`~shepherd.platform.client.PlatformClient`."""

    #: gRPC code name the platform uses for this class of error.
    grpc_status: ClassVar[str] = "UNKNOWN"
    #: Whether a client may retry the same request.
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        status: str | None = None,
        method: str | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.status = status or self.grpc_status
        self.method = method
        # Only path and query are kept: never credentials, which live in headers anyway.
        self.url = url

    def __str__(self) -> str:
        where = f" ({self.method} {self.url})" if self.method and self.url else ""
        code = f"{self.status_code} " if self.status_code else ""
        return f"{code}{self.status}: {self.message}{where}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep keyword-only arguments when pickled (e.g. across processes).
        return (
            _rebuild,
            (type(self), self.message, self.status_code, self.status, self.method, self.url),
        )


def _rebuild(cls: type[PlatformError], *args: Any) -> PlatformError:
    message, status_code, status, method, url = args
    return cls(message, status_code=status_code, status=status, method=method, url=url)


class InvalidArgument(PlatformError):
    """400: the request is malformed or a field breaks a rule; the message names it."""

    grpc_status = "INVALID_ARGUMENT"


class FailedPrecondition(PlatformError):
    """400/409: the request is valid but the resource is in the wrong state for it."""

    grpc_status = "FAILED_PRECONDITION"


class Unauthenticated(PlatformError):
    """401: the API key is missing or unknown."""

    grpc_status = "UNAUTHENTICATED"


class PermissionDenied(PlatformError):
    """403: the key is valid but not for this account or this API."""

    grpc_status = "PERMISSION_DENIED"


class NotFound(PlatformError):
    """404 from the control plane: the resource does not exist (or never did)."""

    grpc_status = "NOT_FOUND"


class RouteNotFound(NotFound):
    """404 from the data plane (gateway). Ambiguous by design (trainer-api.md §5): either
    the route has not reached this gateway replica yet (a race: retry) or the job is gone
    (do not retry). Only the control plane can tell; callers must ask it."""


class AlreadyExists(PlatformError):
    """409: a resource with this id exists (a repeated create, an existing model id)."""

    grpc_status = "ALREADY_EXISTS"


class RateLimited(PlatformError):
    """429: too many requests."""

    grpc_status = "RESOURCE_EXHAUSTED"
    retryable = True


class InternalError(PlatformError):
    """500: the platform failed; a retry may succeed."""

    grpc_status = "INTERNAL"
    retryable = True


class Unavailable(PlatformError):
    """502/503/504 or no connection: the platform is (temporarily) not answering."""

    grpc_status = "UNAVAILABLE"
    retryable = True


class Unreachable(Unavailable):
    """No connection at all (refused, reset, no route to the host): nothing was answered."""


class RequestTimeout(PlatformError):
    """408 or a client-side timeout."""

    grpc_status = "DEADLINE_EXCEEDED"
    retryable = True


class FutureExpired(PlatformError):
    """410 on ``retrieve_future``: the trainer no longer holds that result."""

    grpc_status = "NOT_FOUND"


class FutureFailed(PlatformError):
    """A future that finished with a *user* error (200 ``{"error", "category": "user"}``,
    §4): the request itself is wrong, so sending it again cannot help."""

    grpc_status = "INVALID_ARGUMENT"


class FutureServerError(FutureFailed):
    """A future that finished with a *server* error: the same request may succeed later."""

    grpc_status = "INTERNAL"
    retryable = True


def future_failed(request_id: str, body: dict[str, Any]) -> FutureFailed:
    category = str(body.get("category") or "server")
    cls = FutureFailed if category == "user" else FutureServerError
    return cls(
        f"the trainer failed request {request_id}: {body.get('error')}"[:2000],
        method="POST",
        url="retrieve_future",
    )


_BY_STATUS_NAME: dict[str, type[PlatformError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "FAILED_PRECONDITION": FailedPrecondition,
    "OUT_OF_RANGE": InvalidArgument,
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied,
    "NOT_FOUND": NotFound,
    "ALREADY_EXISTS": AlreadyExists,
    "ABORTED": AlreadyExists,
    "RESOURCE_EXHAUSTED": RateLimited,
    "INTERNAL": InternalError,
    "UNKNOWN": InternalError,
    "UNAVAILABLE": Unavailable,
    "DEADLINE_EXCEEDED": RequestTimeout,
}

_BY_HTTP_CODE: dict[int, type[PlatformError]] = {
    400: InvalidArgument,
    401: Unauthenticated,
    403: PermissionDenied,
    404: NotFound,
    408: RequestTimeout,
    409: AlreadyExists,
    429: RateLimited,
    500: InternalError,
    502: Unavailable,
    503: Unavailable,
    504: RequestTimeout,
}

#: Errors every caller may retry (trainer-api.md §1), for use in retry policies.
RETRYABLE_ERRORS: tuple[type[PlatformError], ...] = (
    RateLimited,
    InternalError,
    Unavailable,
    RequestTimeout,
)


def _parse_body(content: bytes, reason: str) -> tuple[str | None, str]:
    try:
        body = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        text = content.decode("utf-8", "replace").strip()
        return None, text[:500] or reason or "no message"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        status = error.get("status")
        message = error.get("message") or reason
        return (status if isinstance(status, str) else None), str(message)
    if isinstance(body, dict) and "detail" in body:  # a generic FastAPI-style server
        return None, str(body["detail"])
    return None, str(body)[:500]


def error_from_status(
    code: int,
    content: bytes,
    *,
    reason: str = "",
    method: str = "",
    url: str = "",
    data_plane: bool = False,
) -> PlatformError:
    """Map a non-2xx answer (its HTTP code and body) to the right :class:`PlatformError`
    subclass, whichever HTTP client received it.

    The body's ``status`` wins over the HTTP code where both are present (409 may be
    ``ALREADY_EXISTS`` or ``FAILED_PRECONDITION``); 5xx and 404 on the data plane are
    decided by the HTTP code, because a gateway's answers need not have our body.
    """
    status_name, message = _parse_body(content, reason)
    cls: type[PlatformError]
    if data_plane and code == 404:
        cls = RouteNotFound
    elif code >= 500 or code in (408, 429):
        cls = _BY_HTTP_CODE.get(code, InternalError if code < 502 else Unavailable)
    elif status_name in _BY_STATUS_NAME:
        cls = _BY_STATUS_NAME[status_name]
    else:
        cls = _BY_HTTP_CODE.get(code, InvalidArgument if code < 500 else InternalError)
    return cls(message, status_code=code, status=status_name, method=method, url=url)


def error_from_response(response: httpx.Response, *, data_plane: bool = False) -> PlatformError:
    """:func:`error_from_status` of an httpx response."""
    request = response.request
    return error_from_status(
        response.status_code,
        response.content,
        reason=response.reason_phrase,
        method=request.method,
        url=request.url.raw_path.decode("ascii", "replace"),
        data_plane=data_plane,
    )


def error_from_transport(exc: httpx.TransportError, request: httpx.Request) -> PlatformError:
    """A connection failure or timeout: retryable by definition."""
    return transport_failure(
        exc,
        timed_out=isinstance(exc, httpx.TimeoutException),
        method=request.method,
        url=request.url.raw_path.decode("ascii", "replace"),
    )


def transport_failure(
    exc: BaseException, *, timed_out: bool, method: str, url: str
) -> PlatformError:
    """What a request that got no answer raises: :class:`RequestTimeout` when it ran out of
    time, else :class:`Unreachable` (both retryable)."""
    if timed_out:
        return RequestTimeout(f"request timed out ({type(exc).__name__})", method=method, url=url)
    return Unreachable(
        f"could not reach the platform ({type(exc).__name__}: {exc})", method=method, url=url
    )
