"""The HTTP face of one trainer process: the Tinker API (trainer-api.md §4, §7).

One process per running job, like a pod: it binds its own port on loopback, announces it on
stdout, serves until it is killed — or exits by itself with :data:`EXIT_IDLE` once nobody
has called it for the job's inactivity timeout.

Whatever prefix the gateway or a client puts before ``api/v1/``, the rest of the path is
looked up in :mod:`localplane.trainer.routes` (one table, method and path). Bodies are
bounded before they are read (413), decoded and results encoded by
:mod:`shepherd.tinker_wire.dialects`, so JSON and protobuf clients share one service. Every
answer names the operation and dialect in ``x-localplane-op`` / ``x-localplane-dialect``
for the plane's request counters.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as StarletteRoute

from localplane import limits, serving
from localplane.auth import api_key
from localplane.errors import (
    PayloadTooLarge,
    PlaneError,
    UnknownEndpoint,
    disk_full,
    error_response,
)
from localplane.serving import ReadyServer, bind
from localplane.trainer import routes
from localplane.trainer.config import TrainerConfig
from localplane.trainer.service import TrainerService
from shepherd.tinker_wire import dialects
from shepherd.tinker_wire.dialects import DIALECT_HEADER, OP_HEADER
from shepherd.tinker_wire.errors import WireError

#: Exit code of a trainer that stopped itself after the inactivity timeout.
EXIT_IDLE = 75
#: The line prefix a trainer prints on stdout once it serves; the plane waits for it.
READY_PREFIX = "LOCALPLANE_TRAINER_READY "
API_MARKER = "api/v1/"
#: Methods the route table may declare (anything else is 405 on any known path).
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]

log = structlog.stdlib.get_logger("localplane.trainer")


class _KeyRing:
    """The account's API keys, as sha256 hashes in a file the plane rewrites on change."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime = -1.0
        self._hashes: frozenset[str] = frozenset()

    def allows(self, key: str | None) -> bool:
        if self.path is None:
            return True
        if not key:
            return False
        digest = hashlib.sha256(key.encode()).hexdigest()
        if digest not in self._hashes:
            self._reload()
        return digest in self._hashes

    def _reload(self) -> None:
        assert self.path is not None
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime != self._mtime:
            self._mtime = mtime
            self._hashes = frozenset(self.path.read_text().split())


async def read_bounded(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it exceeds ``limit`` bytes — from its
    Content-Length before reading anything, else while it streams in."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"request body of {int(declared)} bytes exceeds this server's limit of {limit} bytes"
        )
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds this server's limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _path_of(url_path: str) -> str | None:
    at = url_path.rfind(API_MARKER)
    return None if at < 0 else url_path[at + len(API_MARKER) :].strip("/")


def create_app(service: TrainerService) -> Starlette:
    keys = _KeyRing(service.cfg.keys_file)
    state: dict[str, Any] = {"last_activity": time.monotonic()}

    def answer(response: Response, op: str, dialect: str) -> Response:
        response.headers[OP_HEADER] = op
        response.headers[DIALECT_HEADER] = dialect
        return response

    async def dispatch(request: Request) -> Response:
        op, dialect = "unknown", "json"
        path = _path_of(request.url.path)
        try:
            if path is None:
                raise UnknownEndpoint(
                    f"no such endpoint: {request.method} {request.url.path[:120]} (the Tinker API "
                    "lives under .../api/v1/)"
                )
            route, params = routes.match(request.method, path)
            op = route.op
            if not keys.allows(api_key(request.headers)):
                return error_response(401, "UNAUTHENTICATED", "missing or unknown API key")
            if op != "healthz":  # health probes do not keep a trainer alive; any real call does
                state["last_activity"] = time.monotonic()
            raw = await read_bounded(request, limits.DATA_PLANE_MAX_BODY_BYTES)
            body, dialect = dialects.decode_request(
                op, request.headers.get("content-type"), raw, protobuf=service.cfg.protobuf
            )
            if op == "forward_backward" and body.get("forward_only"):
                op = "forward"  # tinker's forward(): the same endpoint, forward_only set
                route, params = routes.match("POST", "forward")
            call = routes.Call(service, body, params, dict(request.query_params))
            if op == "retrieve_future":
                result_op, result = await service.retrieve(body)
                if result.get("type") == "try_again" or "error" in result:
                    return answer(JSONResponse(result), op, dialect)
            else:
                result_op, answered = op, route.handler(call)
                result = await answered if isinstance(answered, Awaitable) else answered
            payload, media = dialects.encode_result(
                result_op, result, request.headers.get("accept"), protobuf=service.cfg.protobuf
            )
            if media == dialects.PROTOBUF:
                dialect = "protobuf"
            return answer(Response(payload, media_type=media), op, dialect)
        except PlaneError as exc:
            response = JSONResponse(exc.body(), status_code=exc.code)
            if exc.code == 405 and path is not None:
                response.headers["allow"] = ", ".join(routes.allowed(path))
            return answer(response, op, dialect)
        except WireError as exc:
            return answer(error_response(exc.code, exc.status, exc.message), op, dialect)
        except Exception as exc:
            log.exception("trainer.error", op=op)
            if full := disk_full(exc, service.cfg.data_dir):
                return answer(JSONResponse(full.body(), status_code=full.code), op, dialect)
            return answer(
                error_response(500, "INTERNAL", f"trainer error: {type(exc).__name__}: {exc}"),
                op,
                dialect,
            )
        finally:
            if op not in ("healthz", "unknown"):
                state["last_activity"] = time.monotonic()

    app = Starlette(routes=[StarletteRoute("/{path:path}", dispatch, methods=METHODS)])
    app.state.activity = state
    app.state.service = service
    return app


async def _watch_inactivity(app: Starlette, service: TrainerService, timeout_s: float) -> None:
    """Exit with EXIT_IDLE after ``timeout_s`` without a (non-health) call and no work."""
    interval = min(1.0, max(0.05, timeout_s / 5))
    while True:
        await asyncio.sleep(interval)
        idle_for = time.monotonic() - app.state.activity["last_activity"]
        if idle_for > timeout_s and not service.busy():
            log.info("trainer.idle", timeout_s=timeout_s)
            sys.stdout.flush()
            os._exit(EXIT_IDLE)


def serve(cfg: TrainerConfig, host: str = "127.0.0.1") -> None:
    service = TrainerService(cfg)
    app = create_app(service)
    sock = bind(host, 0)
    port = sock.getsockname()[1]

    def announce() -> None:
        loop = asyncio.get_running_loop()
        service.start()
        if cfg.inactivity_timeout_s > 0:
            app.state.idle_task = loop.create_task(
                _watch_inactivity(app, service, cfg.inactivity_timeout_s)
            )
        log.info(
            "trainer.ready",
            port=port,
            job=cfg.job_name,
            generation=cfg.generation,
            tokenizer=str(service.tokenizer_dir),
        )
        # The plane reads this line from our stdout: the trainer's "I serve on this port".
        print(READY_PREFIX + json.dumps({"port": port, "pid": os.getpid()}), flush=True)  # noqa: T201

    server = serving.config(
        app, log_level="warning", access_log=False, lifespan="off", log_config=None
    )
    ReadyServer(server, announce).run(sockets=[sock])
