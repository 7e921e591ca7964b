"""One error base for localplane, rendered by one handler as the contract's error body:
``{"error": {"code": <http>, "status": "<GRPC_CODE>", "message": "..."}}``."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse

from localplane import limits

if TYPE_CHECKING:
    # Only the plane's app needs FastAPI and pydantic; every trainer process imports this
    # module too, and importing FastAPI costs it ~0.3 s of CPU per start (bench/scale.py).
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError


def shorten(value: object, limit: int = limits.ECHO_CHARS) -> str:
    """``repr``-free text of a value a client sent, cut for an error message: an id is
    recognisable, a 25 MB string is not echoed back."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def bounded_message(message: str) -> str:
    """An error message no longer than the declared maximum (a backstop: fields are cut with
    :func:`shorten` where they are echoed)."""
    return shorten(message, limits.MAX_ERROR_MESSAGE_CHARS)


class PlaneError(Exception):
    code: int = 500
    status: str = "INTERNAL"

    def __init__(self, message: str, *, code: int | None = None) -> None:
        message = bounded_message(message)
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "status": self.status, "message": self.message}}


class InvalidArgument(PlaneError):
    code, status = 400, "INVALID_ARGUMENT"


class FailedPrecondition(PlaneError):
    code, status = 400, "FAILED_PRECONDITION"


class Unauthenticated(PlaneError):
    code, status = 401, "UNAUTHENTICATED"


class PermissionDenied(PlaneError):
    code, status = 403, "PERMISSION_DENIED"


class NotFound(PlaneError):
    code, status = 404, "NOT_FOUND"


class MissingResource(PlaneError):
    """A REST resource a *trainer* does not have (a training run, a checkpoint, a session).
    The hosted REST API says 404; on the data plane a 404 means "no route to this job"
    (trainer-api.md §5), so trainers answer 400 with status NOT_FOUND instead."""

    code, status = 400, "NOT_FOUND"


class UnknownEndpoint(PlaneError):
    """A path the server does not serve. Deliberately not a 404: on the data plane a 404
    means "no route to this job" (the gateway's route race, trainer-api.md §5), and not a
    5xx either, which the SDKs retry for minutes. A 400 whose status says UNIMPLEMENTED is
    final and cannot be mistaken for either."""

    code, status = 400, "UNIMPLEMENTED"


class MethodNotAllowed(PlaneError):
    code, status = 405, "UNIMPLEMENTED"


class Gone(PlaneError):
    code, status = 410, "NOT_FOUND"


class PayloadTooLarge(PlaneError):
    code, status = 413, "INVALID_ARGUMENT"


class ResourceExhausted(PlaneError):
    code, status = 429, "RESOURCE_EXHAUSTED"


class AlreadyExists(PlaneError):
    code, status = 409, "ALREADY_EXISTS"


class Internal(PlaneError):
    code, status = 500, "INTERNAL"


class Unavailable(PlaneError):
    code, status = 503, "UNAVAILABLE"


def disk_full(exc: BaseException, where: Path) -> PlaneError | None:
    """A write that failed for want of space, as an error a client can act on — 503: wait and
    try again, space may be freed — naming the directory and the cause; None for anything
    else (a bare 500 said neither)."""
    full = (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc)
    )
    if not full:
        return None
    return Unavailable(f"no space left on the platform's disk under {where}: {exc}")


_HTTP_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ALREADY_EXISTS",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_response(code: int, status: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "status": status, "message": bounded_message(message)}},
        status_code=code,
    )


def describe_validation_error(
    exc: ValidationError | RequestValidationError, prefix: str = ""
) -> str:
    """``trainingConfig.loraRank: Input should be a valid integer; ...`` — names every field."""
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        field = ".".join(loc) or "body"
        if prefix:
            field = f"{prefix}.{field}" if field != "body" else prefix
        parts.append(f"{field}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(PlaneError)
    async def _plane_error(_: Request, exc: PlaneError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, "INVALID_ARGUMENT", describe_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = _HTTP_STATUS.get(exc.status_code, "UNKNOWN")
        if exc.status_code == 404:
            # A path nothing serves: not a 404, which clients read as "that resource does not
            # exist" (or, on the data plane, as the route race): see UnknownEndpoint.
            unknown = UnknownEndpoint(
                f"no such endpoint: {request.method} {shorten(request.url.path)} "
                "(trainer-api.md lists what localplane serves)"
            )
            return JSONResponse(unknown.body(), status_code=unknown.code)
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {shorten(request.url.path)}"
        else:
            message = str(exc.detail)
        response = error_response(exc.status_code, status, message)
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value  # e.g. Allow on a 405
        return response
